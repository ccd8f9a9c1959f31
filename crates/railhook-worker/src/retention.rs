//! The retention job (issue 17): keeps every table bounded. Its SQL is
//! `railhook_store::retention`'s; docs/CONFIGURATION.md "Retention" and docs/RELIABILITY.md
//! "Retention soak" say what is kept how long and what was measured.
//!
//! - Singleton: every worker runs the loop; a run takes `railhook_store::locks::RETENTION`
//!   (session level, try-lock) on one pooled connection and holds it for the whole run, so
//!   across all worker processes one run goes at a time. A process that dies drops its
//!   connection and with it the lock. A run that finds the lock taken does nothing.
//! - Bounded batches: each statement reads at most `batch` Events (Incoming Events) of one
//!   Project and deletes the ones that may go with their Deliveries (Forwards) and Attempts.
//!   The batch size adapts to the measured duration of the previous batch so that each one
//!   takes about `retention.batch_target_ms` (10 ms by default, so the slowest stay well under 100 ms),
//!   between [`MIN_BATCH`] and `retention.batch_rows`. After each batch the job rests
//!   ([`rest_after`]) at least `retention.pause_ms`, long enough to be busy at most
//!   `retention.max_busy_percent` (10 %) of the time, and long enough to delete at most
//!   `retention.max_rows_per_second` (3,000) on average, so live traffic goes first: while
//!   the job deletes, live announcements wait longer in the relay's walsender, which decodes
//!   the job's WAL ahead of the live commits after it (docs/BENCHMARKS.md "retention").
//! - Order of a run: Attempts' daily partitions older than `retention.attempts_days` first
//!   (dropped whole, `railhook_store::attempts`), then per Project its Events and its
//!   Incoming Events (with their Attempts only where no partition drop takes them within
//!   about a day: `railhook_store::retention::attempts_with_parents`), then finished Replays
//!   with nothing left.
//! - Published outbox rows are not this job's: the relay trims them
//!   (`relay.outbox_retention_seconds`), as before.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry};
use railhook_config::RetentionConfig;
use railhook_store::retention::{self as store, Cutoffs, Deleted, Periods};
use railhook_store::StoreError;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The smallest batch the size adapts down to.
pub const MIN_BATCH: i64 = 10;
/// The first batch's size (or `retention.batch_rows` if smaller): the size grows from here
/// rather than shrinking from a first batch that may be far too long.
pub const START_BATCH: i64 = 100;
/// Finished Replays deleted per statement.
pub const REPLAY_BATCH: i64 = 100;

/// The job's metrics (registered with the worker's).
#[derive(Clone)]
pub struct RetentionMetrics {
    /// Rows deleted, by table.
    pub deleted: IntCounterVec,
    /// Attempt partitions dropped.
    pub partitions_dropped: IntCounter,
    /// Duration of each delete statement (batch).
    pub batch_seconds: Histogram,
    /// Runs by result: ran, skipped (another process held the lock), failed.
    pub runs: IntCounterVec,
}

impl Default for RetentionMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl RetentionMetrics {
    pub fn new() -> RetentionMetrics {
        RetentionMetrics {
            deleted: IntCounterVec::new(Opts::new("railhook_retention_deleted_rows_total", "Rows deleted by the retention job, by table."), &["table"]).expect("valid metric"),
            partitions_dropped: IntCounter::new("railhook_retention_partitions_dropped_total", "Attempt partitions dropped by the retention job.").expect("valid metric"),
            batch_seconds: Histogram::with_opts(
                HistogramOpts::new("railhook_retention_batch_seconds", "Duration of each retention batch (one delete statement).")
                    .buckets(vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0]),
            )
            .expect("valid metric"),
            runs: IntCounterVec::new(Opts::new("railhook_retention_runs_total", "Retention runs, by result (ran, skipped: another process held the lock, failed)."), &["result"]).expect("valid metric"),
        }
    }

    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.deleted.clone()))?;
        registry.register(Box::new(self.partitions_dropped.clone()))?;
        registry.register(Box::new(self.batch_seconds.clone()))?;
        registry.register(Box::new(self.runs.clone()))?;
        Ok(())
    }
}

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub events: u64,
    pub deliveries: u64,
    pub incoming_events: u64,
    pub forwards: u64,
    /// Attempts deleted with their Delivery or Forward.
    pub attempts: u64,
    pub replays: u64,
    pub partitions_dropped: u64,
    /// Delete statements run.
    pub batches: u64,
    /// The most parent rows one batch read, and the longest batch.
    pub max_batch_rows: u64,
    pub max_batch: Duration,
    /// The run stopped early for shutdown.
    pub interrupted: bool,
}

impl Report {
    fn add(&mut self, d: Deleted, incoming: bool) {
        if incoming {
            self.incoming_events += d.parents;
            self.forwards += d.children;
        } else {
            self.events += d.parents;
            self.deliveries += d.children;
        }
        self.attempts += d.attempts;
        self.max_batch_rows = self.max_batch_rows.max(d.examined);
    }

    fn deleted_anything(&self) -> bool {
        self.events + self.deliveries + self.incoming_events + self.forwards + self.attempts + self.replays + self.partitions_dropped > 0
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ran(Report),
    /// Another process holds the lock: nothing done.
    Skipped,
}

/// The batch size: each batch aims at `target`. It grows by at most half per batch (so a
/// batch takes at most about 1.5 times the target while the cost per row holds) and shrinks
/// by at most half.
#[derive(Debug, Clone, Copy)]
pub struct Sizer {
    pub rows: i64,
    pub max: i64,
    pub target: Duration,
}

impl Sizer {
    pub fn new(config: &RetentionConfig) -> Sizer {
        Sizer { rows: config.batch_rows.min(START_BATCH), max: config.batch_rows, target: Duration::from_millis(config.batch_target_ms) }
    }

    /// Adapts to a batch that read `examined` rows in `took`. Short batches (the end of a
    /// walk) say little about the time per row and only ever shrink the size.
    pub fn observe(&mut self, examined: u64, took: Duration) {
        if examined == 0 {
            return;
        }
        let per_row = took.as_secs_f64() / examined as f64;
        let ideal = (self.target.as_secs_f64() / per_row.max(1e-7)) as i64;
        let ideal = if (examined as i64) < self.rows { ideal.min(self.rows) } else { ideal };
        self.rows = ideal.clamp(self.rows / 2, self.rows.saturating_add(self.rows / 2)).clamp(MIN_BATCH, self.max);
    }
}

/// Runs the job every `retention.interval_seconds` until `shutdown`.
pub async fn run(pool: railhook_store::Pool, config: RetentionConfig, metrics: RetentionMetrics, shutdown: CancellationToken) {
    if !config.enabled {
        tracing::info!("retention job disabled (retention.enabled = false)");
        return;
    }
    let every = Duration::from_secs_f64(config.interval_seconds);
    let mut sizer = Sizer::new(&config);
    loop {
        match run_once(&pool, &config, &metrics, &mut sizer, &shutdown).await {
            Ok(Outcome::Ran(r)) if r.deleted_anything() => tracing::info!(
                events = r.events,
                deliveries = r.deliveries,
                incoming_events = r.incoming_events,
                forwards = r.forwards,
                attempts = r.attempts,
                replays = r.replays,
                partitions_dropped = r.partitions_dropped,
                batches = r.batches,
                longest_batch_ms = r.max_batch.as_millis() as u64,
                "retention run"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "retention run failed (tried again next interval)"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// One run, if this process gets the lock. `sizer` carries the adapted batch size from run
/// to run.
pub async fn run_once(pool: &railhook_store::Pool, config: &RetentionConfig, metrics: &RetentionMetrics, sizer: &mut Sizer, shutdown: &CancellationToken) -> Result<Outcome, StoreError> {
    let client = pool.get().await.map_err(|e| StoreError::Pool(e.to_string()))?;
    if !store::try_lock(&client).await? {
        metrics.runs.with_label_values(&["skipped"]).inc();
        return Ok(Outcome::Skipped);
    }
    let mut job = Job { db: &client, config, metrics, sizer, shutdown, report: Report::default(), last_batch: Duration::ZERO, last_rows: 0 };
    let result = job.run().await;
    let report = job.report;
    match store::unlock(&client).await {
        Ok(true) => {}
        // The lock must not outlive the run: a connection that cannot say it released it is
        // closed instead of going back to the pool.
        _ => drop(deadpool_postgres::Object::take(client)),
    }
    match result {
        Ok(()) => {
            metrics.runs.with_label_values(&["ran"]).inc();
            Ok(Outcome::Ran(report))
        }
        Err(e) => {
            metrics.runs.with_label_values(&["failed"]).inc();
            Err(e)
        }
    }
}

struct Job<'a> {
    db: &'a deadpool_postgres::Object,
    config: &'a RetentionConfig,
    metrics: &'a RetentionMetrics,
    sizer: &'a mut Sizer,
    shutdown: &'a CancellationToken,
    report: Report,
    /// How long the last batch took (the rest after it follows from it).
    last_batch: Duration,
    /// Rows the last batch deleted (all tables).
    last_rows: u64,
}

impl Job<'_> {
    async fn run(&mut self) -> Result<(), StoreError> {
        let now = store::now(self.db).await?;
        self.drop_attempt_partitions(now).await?;
        let defaults = Periods { events_days: self.config.events_days, failed_days: self.config.failed_days };
        for (project, periods) in store::projects(self.db, defaults).await? {
            let cutoffs = Cutoffs::at(now, periods);
            let attempts = store::attempts_with_parents(periods, self.config.attempts_days);
            if !self.events(project, cutoffs, attempts).await? || !self.incoming(project, cutoffs, attempts).await? {
                self.report.interrupted = true;
                return Ok(());
            }
        }
        let replays = store::delete_replays(self.db, now - store::days(self.config.events_days), REPLAY_BATCH).await?;
        self.report.replays += replays;
        self.metrics.deleted.with_label_values(&["replays"]).inc_by(replays);
        Ok(())
    }

    /// Attempts older than `retention.attempts_days`, a daily partition at a time
    /// (`railhook_store::attempts::drop_partitions_before`, migration 0017: each drop waits
    /// at most `attempts::DROP_LOCK_TIMEOUT` for its lock). A partition goes once its whole day
    /// is older than the cutoff, so Attempts are kept between `attempts_days` and a day more.
    /// Making partitions ahead is `crate::partitions`'.
    async fn drop_attempt_partitions(&mut self, now: DateTime<Utc>) -> Result<(), StoreError> {
        let cutoff = now - store::days(self.config.attempts_days);
        let dropped = railhook_store::attempts::drop_partitions_before(&***self.db, cutoff).await?.len() as u64;
        self.report.partitions_dropped += dropped;
        self.metrics.partitions_dropped.inc_by(dropped);
        Ok(())
    }

    /// One Project's Events, batch by batch (with their Attempts if `attempts`); false if shut
    /// down on the way.
    async fn events(&mut self, project: railhook_core::ProjectId, cutoffs: Cutoffs, attempts: bool) -> Result<bool, StoreError> {
        let mut after = store::EVENTS_START;
        loop {
            let limit = self.sizer.rows;
            let started = Instant::now();
            let (d, next) = store::delete_events_batch(self.db, project, cutoffs, after, limit, attempts).await?;
            self.batch_done(d, started.elapsed(), false);
            match next {
                Some(n) if d.examined as i64 >= limit => after = n,
                _ => return Ok(true),
            }
            if !self.rest().await {
                return Ok(false);
            }
        }
    }

    /// One Project's Incoming Events, batch by batch (with their Attempts if `attempts`);
    /// false if shut down on the way.
    async fn incoming(&mut self, project: railhook_core::ProjectId, cutoffs: Cutoffs, attempts: bool) -> Result<bool, StoreError> {
        let mut after = Uuid::nil();
        loop {
            let limit = self.sizer.rows;
            let started = Instant::now();
            let (d, next) = store::delete_incoming_batch(self.db, project, cutoffs, after, limit, attempts).await?;
            self.batch_done(d, started.elapsed(), true);
            match next {
                Some(n) if d.examined as i64 >= limit => after = n,
                _ => return Ok(true),
            }
            if !self.rest().await {
                return Ok(false);
            }
        }
    }

    fn batch_done(&mut self, d: Deleted, took: Duration, incoming: bool) {
        self.metrics.batch_seconds.observe(took.as_secs_f64());
        let (parent, child) = if incoming { ("incoming_events", "forwards") } else { ("events", "deliveries") };
        self.metrics.deleted.with_label_values(&[parent]).inc_by(d.parents);
        self.metrics.deleted.with_label_values(&[child]).inc_by(d.children);
        self.metrics.deleted.with_label_values(&["attempts"]).inc_by(d.attempts);
        self.report.add(d, incoming);
        self.report.batches += 1;
        self.report.max_batch = self.report.max_batch.max(took);
        self.sizer.observe(d.examined, took);
        self.last_batch = took;
        self.last_rows = d.parents + d.children + d.attempts;
    }

    /// The pause after a batch ([`rest_after`]); false when shutting down.
    async fn rest(&self) -> bool {
        tokio::select! {
            _ = self.shutdown.cancelled() => false,
            _ = tokio::time::sleep(rest_after(self.config, self.last_batch, self.last_rows)) => true,
        }
    }
}

/// The rest after a batch that took `took` and deleted `rows`: at least `retention.pause_ms`,
/// long enough that the job is busy at most `retention.max_busy_percent` of the time, and
/// long enough that it deletes at most `retention.max_rows_per_second` on average.
pub fn rest_after(config: &RetentionConfig, took: Duration, rows: u64) -> Duration {
    let busy = config.max_busy_percent.clamp(1, 100) as f64 / 100.0;
    let duty = took.mul_f64(1.0 / busy - 1.0);
    let rate = match config.max_rows_per_second {
        0 => Duration::ZERO,
        max => Duration::from_secs_f64(rows as f64 / max as f64).saturating_sub(took),
    };
    Duration::from_millis(config.pause_ms).max(duty).max(rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizer(rows: i64) -> Sizer {
        Sizer { rows, max: 1_000, target: Duration::from_millis(50) }
    }

    #[test]
    fn a_slow_batch_halves_the_size_at_most() {
        let mut s = sizer(1_000);
        s.observe(1_000, Duration::from_millis(500));
        assert_eq!(s.rows, 500);
        s.observe(500, Duration::from_millis(100));
        assert_eq!(s.rows, 250);
    }

    #[test]
    fn a_fast_batch_grows_to_the_target_within_the_bound() {
        let mut s = sizer(100);
        s.observe(100, Duration::from_millis(40));
        assert_eq!(s.rows, 125);
        s.observe(125, Duration::from_millis(1));
        assert_eq!(s.rows, 187, "half again at most");
        for _ in 0..10 {
            let rows = s.rows as u64;
            s.observe(rows, Duration::from_millis(1));
        }
        assert_eq!(s.rows, 1_000, "never above retention.batch_rows");
    }

    #[test]
    fn the_rest_keeps_the_job_busy_at_most_its_share() {
        let config = RetentionConfig { pause_ms: 10, max_busy_percent: 10, max_rows_per_second: 0, ..RetentionConfig::default() };
        assert_eq!(rest_after(&config, Duration::from_millis(20), 1_000), Duration::from_millis(180));
        assert_eq!(rest_after(&config, Duration::from_micros(500), 1_000), Duration::from_millis(10), "never below pause_ms");
        let all = RetentionConfig { pause_ms: 0, max_busy_percent: 100, max_rows_per_second: 0, ..RetentionConfig::default() };
        assert_eq!(rest_after(&all, Duration::from_millis(20), 1_000), Duration::ZERO);
    }

    #[test]
    fn the_rest_keeps_the_job_under_its_rows_per_second() {
        let config = RetentionConfig { pause_ms: 10, max_busy_percent: 10, max_rows_per_second: 3_000, ..RetentionConfig::default() };
        // 900 rows in 10 ms: 300 ms per batch at 3,000 rows/s, so 290 ms of rest (the duty
        // alone would give 90 ms).
        assert_eq!(rest_after(&config, Duration::from_millis(10), 900), Duration::from_millis(290));
        // Few rows: the duty cap rules.
        assert_eq!(rest_after(&config, Duration::from_millis(10), 30), Duration::from_millis(90));
        // A slow batch never rests less than its duty share.
        assert_eq!(rest_after(&config, Duration::from_millis(400), 900), Duration::from_millis(3_600));
    }

    #[test]
    fn the_first_batch_is_small() {
        let config = RetentionConfig::default();
        assert_eq!(Sizer::new(&config).rows, START_BATCH);
        assert_eq!(Sizer::new(&RetentionConfig { batch_rows: 20, ..config }).rows, 20);
    }

    #[test]
    fn a_short_batch_never_grows_the_size() {
        let mut s = sizer(100);
        s.observe(3, Duration::from_micros(10));
        assert_eq!(s.rows, 100);
        s.observe(0, Duration::from_secs(1));
        assert_eq!(s.rows, 100);
        let mut s = sizer(16);
        s.observe(16, Duration::from_secs(1));
        assert_eq!(s.rows, MIN_BATCH);
    }
}
