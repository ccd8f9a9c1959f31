//! The database's clock as this worker reads it. Retry times are compared with Postgres'
//! `now()` (the claim's `next_retry_at <= now()`, the retry scheduler), so they are computed
//! on that clock too: a worker whose own clock runs ahead or behind would otherwise schedule
//! every retry late or early by its error (a clock 30 s behind fires a 1 s retry at once).
//!
//! [`DbClock`] keeps the offset between Postgres' `clock_timestamp()` and this host's clock,
//! measured at start and again every [`SAMPLE_EVERY`] (half the round trip is the error:
//! a millisecond or so). Until the first sample it reads the host's clock.
//!
//! The worker reads this host's wall clock only through [`host_now`], which the chaos
//! suite's `clock_skew` sets ahead with `RAILHOOK_FAILPOINT_CLOCK_AHEAD_MS` (a failpoint: a
//! host whose clock runs ahead, without faking the clock of the whole process; Debian's
//! libfaketime 0.9.10 does that, but mis-times the condition-variable waits of the Kafka
//! client, whose consumer then loses its group session).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

/// This host's wall clock: `Utc::now()`, set ahead by `RAILHOOK_FAILPOINT_CLOCK_AHEAD_MS`
/// when a test sets it (`crate::failpoint::clock_ahead`).
pub fn host_now() -> DateTime<Utc> {
    Utc::now() + crate::failpoint::clock_ahead()
}

/// How often the offset is measured again (a host clock stepped by NTP is followed within it).
pub const SAMPLE_EVERY: Duration = Duration::from_secs(10);

/// This host's clock corrected to the database's. Cheap to clone (one shared offset).
#[derive(Debug, Clone, Default)]
pub struct DbClock {
    /// The database's clock minus this host's, in microseconds.
    offset_us: Arc<AtomicI64>,
}

impl DbClock {
    /// The database's `now`, as well as this host can tell.
    pub fn now(&self) -> DateTime<Utc> {
        host_now() + chrono::Duration::microseconds(self.offset_us.load(Ordering::Relaxed))
    }

    /// The database's clock minus this host's.
    pub fn offset(&self) -> chrono::Duration {
        chrono::Duration::microseconds(self.offset_us.load(Ordering::Relaxed))
    }

    /// Measures the offset once: the database's `clock_timestamp()` against the middle of the
    /// round trip on this host's clock.
    pub async fn sample(&self, db: &impl tokio_postgres::GenericClient) -> Result<chrono::Duration, tokio_postgres::Error> {
        let before = host_now();
        let db_now: DateTime<Utc> = db.query_one("SELECT clock_timestamp()", &[]).await?.get(0);
        let after = host_now();
        let offset = db_now - (before + (after - before) / 2);
        self.offset_us.store(offset.num_microseconds().unwrap_or(0), Ordering::Relaxed);
        Ok(offset)
    }

    /// Samples every [`SAMPLE_EVERY`] until `shutdown`; says so when the offset is large.
    pub async fn sample_loop(self, pool: railhook_store::Pool, shutdown: CancellationToken) {
        let mut warned = false;
        loop {
            if let Ok(client) = pool.get().await {
                match self.sample(&**client).await {
                    Ok(offset) if offset.num_seconds().abs() >= 2 && !warned => {
                        tracing::warn!(offset_ms = offset.num_milliseconds(), "this host's clock differs from the database's; retries are timed on the database's clock");
                        warned = true;
                    }
                    Ok(_) => {}
                    Err(e) => tracing::debug!(error = %e, "database clock sample"),
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(SAMPLE_EVERY) => {}
            }
        }
    }
}
