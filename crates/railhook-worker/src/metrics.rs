//! The worker's Prometheus metrics. Labels are low-cardinality: results, status classes and
//! deferral reasons, never ids.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use crate::http::AttemptOutcome;

#[derive(Clone)]
pub struct WorkerMetrics {
    /// Attempts by `result` (success, http_status, timeout, ...) and status class (2xx..5xx, none).
    pub attempts: IntCounterVec,
    /// From the Event's creation to a successful Attempt, seconds.
    pub delivery_latency: Histogram,
    pub claims_won: IntCounter,
    /// Hints that claimed nothing (already done, not due, or owned elsewhere).
    pub claims_lost: IntCounter,
    /// Claims that found no Delivery yet (its commit not visible) and were made again.
    pub claims_unseen: IntCounter,
    pub fence_lost: IntCounter,
    pub deferrals: IntCounterVec,
    /// Claims in the waiting mode that found a limit taken and went back to their Endpoint's
    /// queue, by the limit.
    pub claims_busy: IntCounterVec,
    /// Ordered Deliveries that went without their predecessor after the gap timeout.
    pub ordering_gap_timeouts: IntCounter,
    /// Ordered Deliveries that ended (SUCCESS or Failed Messages), advancing their cursor.
    pub ordering_cursor_advances: IntCounter,
    /// Parked Deliveries released at once by their predecessor's finalise.
    pub ordering_released: IntCounter,
    /// Ordered Deliveries claimed behind a predecessor this worker held, and sent on its
    /// verdict without a round trip through Postgres (the Ordering Buffer, crate::ordering).
    pub ordering_held: IntCounter,
    /// From a Delivery's first park to its claim, seconds.
    pub ordering_parked_seconds: Histogram,
    /// Deliveries parked in the Ordering Buffer now (sampled with the queue gauges).
    pub ordering_parked: IntGauge,
    /// Hints waiting in the per-Endpoint queues, and the bound.
    pub queue_waiting: IntGauge,
    pub queue_waiting_max: IntGauge,
    /// 1 once the Deliveries consumer received its first assignment (its group's join is
    /// over, possibly with no partition): `railhook worker`'s `/readyz` waits for it.
    pub consumer_joined: IntGauge,
    /// Circuit breaker state changes by change (opened, closed, reopened).
    pub circuit_changes: IntCounterVec,
    /// Announcements the consumer could not parse (counted and skipped).
    pub bad_messages: IntCounter,
    pub scheduled: IntCounter,
    pub swept: IntCounterVec,
    pub in_flight: IntGauge,
    /// Attempt tasks that ended in a panic (their slot and permit were given back).
    pub task_panics: IntCounter,
    /// Claims of such tasks given back to PENDING (`Runner::give_back`).
    pub claims_given_back: IntCounter,
    /// Claims per `railhook_claim_batch` call.
    pub claim_batch_size: Histogram,
    pub finalise_batch_size: Histogram,
    pub queue_depth: IntGauge,
    pub oldest_pending_age: prometheus::Gauge,
    /// Ingest pacing's signal (`queues::EndpointQueues::delivery_wait`).
    pub delivery_wait: prometheus::Gauge,
    /// The incoming direction's Attempts (`crate::forwards`).
    pub forwards: crate::forwards::ForwardMetrics,
    /// The retention job's (`crate::retention`).
    pub retention: crate::retention::RetentionMetrics,
    /// The latency stages the worker sees (`railhook_telemetry::stages`): from the relay's
    /// read to the finalise. Registered by whoever owns the registry (the binary), since in
    /// `railhook all` the relay shares it.
    pub stages: railhook_telemetry::stages::Stages,
}

impl Default for WorkerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl WorkerMetrics {
    pub fn new() -> WorkerMetrics {
        let counter = |name: &str, help: &str| IntCounter::new(name, help).expect("valid metric");
        WorkerMetrics {
            attempts: IntCounterVec::new(Opts::new("railhook_worker_attempts_total", "Attempts by result and status class."), &["result", "status_class"]).expect("valid metric"),
            delivery_latency: Histogram::with_opts(
                HistogramOpts::new("railhook_worker_delivery_latency_seconds", "From an Event's creation to its Delivery's successful Attempt.")
                    .buckets(vec![0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0, 86400.0]),
            )
            .expect("valid metric"),
            claims_won: counter("railhook_worker_claims_won_total", "Announcements that claimed their Delivery."),
            claims_lost: counter("railhook_worker_claims_lost_total", "Announcements that claimed nothing (a duplicate, not due, or owned elsewhere)."),
            claims_unseen: counter("railhook_worker_claims_unseen_total", "Claims that did not see their Delivery yet (announced before its commit was visible) and were made again."),
            fence_lost: counter("railhook_worker_fence_lost_total", "Finalises that found their Claim gone (the Delivery was swept)."),
            deferrals: IntCounterVec::new(Opts::new("railhook_worker_deferrals_total", "Claims released without spending an Attempt, by reason."), &["reason"]).expect("valid metric"),
            ordering_gap_timeouts: counter("railhook_ordering_gap_timeout_total", "Ordered Deliveries sent without their predecessor once the gap timeout was over."),
            ordering_cursor_advances: counter("railhook_ordering_cursor_advances_total", "Ordered Deliveries that ended (delivered or Failed Messages), advancing their Endpoint's cursor."),
            ordering_released: counter("railhook_ordering_released_total", "Parked Deliveries released at once by the finalise of their predecessor."),
            ordering_held: counter("railhook_ordering_held_total", "Ordered Deliveries claimed behind a predecessor the worker held, and sent on its verdict."),
            ordering_parked_seconds: Histogram::with_opts(
                HistogramOpts::new("railhook_ordering_parked_seconds", "From an ordered Delivery's first park to its claim.")
                    .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0]),
            )
            .expect("valid metric"),
            ordering_parked: IntGauge::new("railhook_ordering_parked", "Deliveries parked in the Ordering Buffer (PENDING behind an unresolved predecessor).").expect("valid metric"),
            claims_busy: IntCounterVec::new(Opts::new("railhook_worker_claims_busy_total", "Claims that found a concurrency or rate limit taken and waited in their Endpoint's queue, by limit."), &["reason"]).expect("valid metric"),
            queue_waiting: IntGauge::new("railhook_worker_queue_waiting", "Hints waiting in the worker's per-Endpoint queues for a free slot.").expect("valid metric"),
            queue_waiting_max: IntGauge::new("railhook_worker_queue_waiting_max", "The bound of hints waiting in all the per-Endpoint queues (worker.queue_max).").expect("valid metric"),
            consumer_joined: IntGauge::new("railhook_worker_consumer_joined", "1 once the Deliveries consumer received its first partition assignment (its consumer group's join is over).").expect("valid metric"),
            circuit_changes: IntCounterVec::new(Opts::new("railhook_worker_circuit_changes_total", "Endpoint circuit state changes, by change."), &["change"]).expect("valid metric"),
            bad_messages: counter("railhook_worker_bad_messages_total", "Announcements that did not parse (skipped)."),
            scheduled: counter("railhook_worker_retries_scheduled_total", "Due retries claimed and announced by the scheduler."),
            swept: IntCounterVec::new(Opts::new("railhook_worker_swept_total", "Deliveries moved by the sweeps, by sweep."), &["sweep"]).expect("valid metric"),
            claim_batch_size: Histogram::with_opts(
                HistogramOpts::new("railhook_worker_claim_batch_size", "Claims decided per claim round trip.").buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]),
            )
            .expect("valid metric"),
            finalise_batch_size: Histogram::with_opts(
                HistogramOpts::new("railhook_worker_finalise_batch_size", "Attempts finalised per finalise round trip.").buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]),
            )
            .expect("valid metric"),
            in_flight: IntGauge::new("railhook_worker_attempts_in_flight", "Attempts running in this process.").expect("valid metric"),
            task_panics: counter("railhook_worker_task_panics_total", "Attempt tasks that panicked (their Endpoint slot was given back, and their Claim if they held one)."),
            claims_given_back: counter("railhook_worker_panicked_claims_given_back_total", "Claims of attempt tasks that panicked, given back to PENDING (due now) instead of waiting for the stuck sweep."),
            queue_depth: IntGauge::new("railhook_worker_pending_deliveries", "PENDING Deliveries (sampled by the sweeper).").expect("valid metric"),
            delivery_wait: prometheus::Gauge::new("railhook_worker_delivery_wait_seconds", "How long a new Delivery would wait for its claim in this worker's queues that wait on the worker itself (ingest pacing's signal).").expect("valid metric"),
            oldest_pending_age: prometheus::Gauge::new("railhook_worker_oldest_pending_age_seconds", "Age of the oldest due PENDING Delivery (sampled by the sweeper).").expect("valid metric"),
            forwards: crate::forwards::ForwardMetrics::new(),
            retention: crate::retention::RetentionMetrics::new(),
            stages: Default::default(),
        }
    }

    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.attempts.clone()))?;
        registry.register(Box::new(self.delivery_latency.clone()))?;
        registry.register(Box::new(self.claims_won.clone()))?;
        registry.register(Box::new(self.claims_lost.clone()))?;
        registry.register(Box::new(self.claims_unseen.clone()))?;
        registry.register(Box::new(self.fence_lost.clone()))?;
        registry.register(Box::new(self.deferrals.clone()))?;
        registry.register(Box::new(self.claims_busy.clone()))?;
        registry.register(Box::new(self.ordering_gap_timeouts.clone()))?;
        registry.register(Box::new(self.ordering_cursor_advances.clone()))?;
        registry.register(Box::new(self.ordering_released.clone()))?;
        registry.register(Box::new(self.ordering_held.clone()))?;
        registry.register(Box::new(self.ordering_parked_seconds.clone()))?;
        registry.register(Box::new(self.ordering_parked.clone()))?;
        registry.register(Box::new(self.queue_waiting.clone()))?;
        registry.register(Box::new(self.queue_waiting_max.clone()))?;
        registry.register(Box::new(self.consumer_joined.clone()))?;
        registry.register(Box::new(self.circuit_changes.clone()))?;
        registry.register(Box::new(self.bad_messages.clone()))?;
        registry.register(Box::new(self.scheduled.clone()))?;
        registry.register(Box::new(self.swept.clone()))?;
        registry.register(Box::new(self.in_flight.clone()))?;
        registry.register(Box::new(self.task_panics.clone()))?;
        registry.register(Box::new(self.claims_given_back.clone()))?;
        registry.register(Box::new(self.claim_batch_size.clone()))?;
        registry.register(Box::new(self.finalise_batch_size.clone()))?;
        registry.register(Box::new(self.queue_depth.clone()))?;
        registry.register(Box::new(self.oldest_pending_age.clone()))?;
        registry.register(Box::new(self.delivery_wait.clone()))?;
        self.forwards.register(registry)?;
        self.retention.register(registry)?;
        Ok(())
    }

    pub fn attempt(&self, outcome: &AttemptOutcome) {
        let class = match outcome.status_code {
            Some(c) if (100..600).contains(&c) => ["1xx", "2xx", "3xx", "4xx", "5xx"][(c / 100 - 1) as usize],
            _ => "none",
        };
        self.attempts.with_label_values(&[outcome.result.as_str(), class]).inc();
    }
}
