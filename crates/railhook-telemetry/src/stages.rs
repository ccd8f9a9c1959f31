//! Where a Delivery's time goes: one histogram, `railhook_delivery_stage_seconds{stage}`,
//! with one series per stage of an announcement's path from the commit that made it to the
//! commit that recorded its Attempt. The relay observes the first two stages and the worker
//! the rest; each stage is observed by the process that sees both of its ends, except
//! `read_to_poll`, whose start the relay stamps on the Kafka message (the
//! `relay_read_us` header, Unix microseconds) and whose end the worker sees: the two clocks
//! must agree (the same host, or hosts kept in sync by NTP) for that one stage to mean
//! anything. `commit_to_read` likewise compares Postgres' commit timestamp with the relay's
//! clock.
//!
//! The chain, in order (each stage starts where the one before ended):
//!
//! | stage | from | to | observed by |
//! | --- | --- | --- | --- |
//! | `commit_to_read` | the commit of the announcement (Postgres' commit timestamp) | the relay decoded it from the slot | relay |
//! | `read_to_poll` | the relay decoded it (and handed it to the producer) | the worker's consumer returned the Kafka message | worker |
//! | `poll_to_claim` | the worker received the message | its claim statement answered (committed) | worker |
//! | `claim_to_send` | the claim answered | the HTTP request starts | worker |
//! | `request` | the HTTP request starts | its response (status line and capped body) or failure | worker |
//! | `response_to_finalise` | the response | the finalise statement answered (committed) | worker |
//!
//! Beside the chain, `read_to_ack` (relay): from the relay decoding an announcement to
//! Kafka's acknowledgement of it, the part of `read_to_poll` spent producing; the rest of
//! `read_to_poll` is the broker making it visible and the consumer fetching it.
//!
//! A Delivery released by its ordered predecessor's finalise is claimed without a Kafka
//! message: it has no `read_to_poll` and no `poll_to_claim`.

use std::time::{Duration, Instant};

use prometheus::{Histogram, HistogramOpts, HistogramVec, Registry};

/// The metric's name.
pub const METRIC: &str = "railhook_delivery_stage_seconds";

/// Bucket bounds, seconds: fine below 10 ms, where the light rate's stages live, coarse up
/// to the minutes a backlog can take.
pub const BUCKETS: [f64; 28] = [
    0.0001, 0.0002, 0.0003, 0.0004, 0.0005, 0.00075, 0.001, 0.00125, 0.0015, 0.002, 0.0025, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1,
    0.25, 0.5, 1.0, 2.5, 10.0, 60.0,
];

/// One stage of the chain (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    CommitToRead,
    ReadToAck,
    ReadToPoll,
    PollToClaim,
    ClaimToSend,
    Request,
    ResponseToFinalise,
}

impl Stage {
    /// Every stage, in the chain's order (`read_to_ack` beside the chain, after its start).
    pub const ALL: [Stage; 7] = [Stage::CommitToRead, Stage::ReadToAck, Stage::ReadToPoll, Stage::PollToClaim, Stage::ClaimToSend, Stage::Request, Stage::ResponseToFinalise];

    /// The `stage` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::CommitToRead => "commit_to_read",
            Stage::ReadToAck => "read_to_ack",
            Stage::ReadToPoll => "read_to_poll",
            Stage::PollToClaim => "poll_to_claim",
            Stage::ClaimToSend => "claim_to_send",
            Stage::Request => "request",
            Stage::ResponseToFinalise => "response_to_finalise",
        }
    }

    fn index(self) -> usize {
        Stage::ALL.iter().position(|s| *s == self).unwrap_or(0)
    }
}

/// The histogram with a handle per stage resolved once (observing is then a few atomic adds,
/// no label lookup). Cloning shares the series.
#[derive(Clone)]
pub struct Stages {
    vec: HistogramVec,
    by_stage: [Histogram; 7],
}

impl std::fmt::Debug for Stages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(Stage::ALL.iter().map(|s| (s.as_str(), self.count(*s)))).finish()
    }
}

impl Default for Stages {
    fn default() -> Self {
        Stages::new()
    }
}

impl Stages {
    pub fn new() -> Stages {
        let vec = HistogramVec::new(
            HistogramOpts::new(METRIC, "Time a Delivery's announcement spends in each stage from its commit to its Attempt's finalise (docs/ARCHITECTURE.md, \"Latency stages\").")
                .buckets(BUCKETS.to_vec()),
            &["stage"],
        )
        .expect("valid metric");
        let by_stage = Stage::ALL.map(|s| vec.with_label_values(&[s.as_str()]));
        Stages { vec, by_stage }
    }

    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.vec.clone()))
    }

    pub fn observe(&self, stage: Stage, took: Duration) {
        self.by_stage[stage.index()].observe(took.as_secs_f64());
    }

    pub fn observe_since(&self, stage: Stage, since: Instant) {
        self.observe(stage, since.elapsed());
    }

    /// A stage whose start is a wall-clock stamp from another process (Unix microseconds):
    /// observed when the stamp is not in the future (clocks that disagree are not counted).
    pub fn observe_since_unix_micros(&self, stage: Stage, since_us: i64) {
        if let Some(took) = unix_micros_now().checked_sub(since_us).filter(|d| *d >= 0) {
            self.observe(stage, Duration::from_micros(took as u64));
        }
    }

    /// How many observations a stage has (tests).
    pub fn count(&self, stage: Stage) -> u64 {
        self.by_stage[stage.index()].get_sample_count()
    }
}

/// Now, as microseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_micros_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stage_has_its_own_series() {
        let stages = Stages::new();
        stages.observe(Stage::Request, Duration::from_millis(2));
        stages.observe(Stage::Request, Duration::from_millis(3));
        stages.observe(Stage::CommitToRead, Duration::from_micros(300));
        assert_eq!(stages.count(Stage::Request), 2);
        assert_eq!(stages.count(Stage::CommitToRead), 1);
        assert_eq!(stages.count(Stage::ReadToPoll), 0);
        let registry = Registry::new();
        stages.register(&registry).unwrap();
        let text = prometheus::TextEncoder::new().encode_to_string(&registry.gather()).unwrap();
        assert!(text.contains(r#"railhook_delivery_stage_seconds_bucket{stage="request",le="0.0025"} 1"#), "{text}");
        assert!(text.contains(r#"railhook_delivery_stage_seconds_count{stage="commit_to_read"} 1"#), "{text}");
    }

    #[test]
    fn a_stamp_from_the_future_is_not_counted() {
        let stages = Stages::new();
        stages.observe_since_unix_micros(Stage::ReadToPoll, unix_micros_now() + 5_000_000);
        assert_eq!(stages.count(Stage::ReadToPoll), 0);
        stages.observe_since_unix_micros(Stage::ReadToPoll, unix_micros_now() - 1_500);
        assert_eq!(stages.count(Stage::ReadToPoll), 1);
    }

    #[test]
    fn buckets_increase() {
        assert!(BUCKETS.windows(2).all(|w| w[0] < w[1]));
    }
}
