//! `railhook relay`: streams committed outbox inserts from a logical replication slot
//! (pgoutput) to Kafka. This crate holds, so far, the pgoutput decoder and the mapping of an
//! outbox insert to its announcement; the replication loop arrives with the CDC relay issue.

pub mod outbox;
pub mod pgoutput;
pub mod progress;
