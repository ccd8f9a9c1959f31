//! The Kafka source's Prometheus metrics. Labels are low-cardinality: outcomes and
//! dead-letter reasons, never topics' records or ids.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry};

use crate::record::Reason;

#[derive(Clone)]
pub struct SourceMetrics {
    /// Records by outcome: `created` (a new Event), `replayed` (its idempotency key had made
    /// its Event already: a second read, or a resend), `dead_letter`.
    pub records: IntCounterVec,
    /// Records sent to the dead-letter topic, by reason (`record::Reason`).
    pub dead_letters: IntCounterVec,
    /// Records per ingest transaction.
    pub batch_records: Histogram,
    /// One batch's ingest transaction, from BEGIN to COMMIT, seconds.
    pub batch_seconds: Histogram,
    /// Batches made again after Postgres or Kafka failed them (nothing of them was kept).
    pub batch_retries: IntCounter,
}

impl Default for SourceMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl SourceMetrics {
    pub fn new() -> SourceMetrics {
        let records = IntCounterVec::new(Opts::new("railhook_kafka_source_records_total", "Kafka source records by outcome: created, replayed, dead_letter."), &["outcome"]).expect("valid metric");
        let dead_letters = IntCounterVec::new(Opts::new("railhook_kafka_source_dead_letters_total", "Kafka source records sent to the dead-letter topic, by reason."), &["reason"]).expect("valid metric");
        // Every series exists from the start, so an alert on a rate sees 0 rather than nothing.
        for outcome in ["created", "replayed", "dead_letter"] {
            records.with_label_values(&[outcome]);
        }
        for reason in Reason::ALL {
            dead_letters.with_label_values(&[reason.as_str()]);
        }
        SourceMetrics {
            records,
            dead_letters,
            batch_records: Histogram::with_opts(
                HistogramOpts::new("railhook_kafka_source_batch_records", "Records per Kafka source ingest transaction.").buckets(vec![1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 10000.0]),
            )
            .expect("valid metric"),
            batch_seconds: Histogram::with_opts(
                HistogramOpts::new("railhook_kafka_source_batch_seconds", "One Kafka source batch's ingest transaction.").buckets(vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0]),
            )
            .expect("valid metric"),
            batch_retries: IntCounter::new("railhook_kafka_source_batch_retries_total", "Kafka source batches made again after Postgres or Kafka failed them.").expect("valid metric"),
        }
    }

    pub fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.records.clone()))?;
        registry.register(Box::new(self.dead_letters.clone()))?;
        registry.register(Box::new(self.batch_records.clone()))?;
        registry.register(Box::new(self.batch_seconds.clone()))?;
        registry.register(Box::new(self.batch_retries.clone()))?;
        Ok(())
    }
}
