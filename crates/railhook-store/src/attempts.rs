//! The attempt log's partitions (migration 0017): `attempts` is partitioned by range on
//! `started_at`, one partition per UTC day named `attempts_pYYYYMMDD`, plus `attempts_default`
//! for an Attempt whose day has no partition (so a finalise never fails for want of one).
//!
//! - [`ensure_partitions`] makes the partitions of the days from `now` to `days_ahead` days
//!   later, and of any day the default partition holds rows of (moving those rows into their
//!   day's new partition). The worker calls it at start and every hour
//!   (`railhook_worker::partitions`); it is idempotent and safe to run from several workers at
//!   once (`railhook_attempt_partition` serialises callers with an advisory lock).
//! - [`drop_partitions_before`] drops every daily partition whose whole range ends at or
//!   before the cutoff: retention by `DROP TABLE`, no row deleted, no bloat left. The
//!   retention job calls it (`railhook_worker::retention`).
//!
//! Each takes a `tokio_postgres` client or transaction (from a pooled connection: `&**pooled`).
//!
//! Locks: making a partition attaches it (SHARE UPDATE EXCLUSIVE on `attempts`: inserts and
//! reads go on); dropping one takes ACCESS EXCLUSIVE on `attempts` for the moment of the drop,
//! so each drop runs with a short `lock_timeout` ([`DROP_LOCK_TIMEOUT`]): behind a long read
//! it gives up (an error for this run; the next run drops it) rather than queue the finalise's
//! inserts behind itself.

use chrono::{DateTime, Duration, NaiveDate, Utc};
use tokio_postgres::GenericClient;

use crate::StoreError;

/// How long one partition's `DROP TABLE` waits for its lock before giving up.
pub const DROP_LOCK_TIMEOUT: &str = "2s";

/// Days of partitions [`ensure_partitions`] keeps ahead of now, by default.
pub const DAYS_AHEAD: u32 = 7;

/// One daily partition and the range it holds, `[from, to)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub name: String,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
}

/// The daily partition's name for `day`.
pub fn partition_name(day: NaiveDate) -> String {
    format!("attempts_p{}", day.format("%Y%m%d"))
}

/// The daily partitions, oldest first (the default partition is not one of them).
pub async fn partitions(db: &impl GenericClient) -> Result<Vec<Partition>, StoreError> {
    let rows = db
        .query(
            "SELECT c.relname::text,
                    substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \\(''([^'']+)''\\)')::timestamptz,
                    substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \\(''([^'']+)''\\)')::timestamptz
             FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'attempts'::regclass AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'
             ORDER BY 2",
            &[],
        )
        .await?;
    rows.iter().map(|r| Ok(Partition { name: r.try_get(0)?, from: r.try_get(1)?, to: r.try_get(2)? })).collect()
}

/// Makes the partitions of the UTC days from `now`'s to `days_ahead` days later, and of each
/// day the default partition holds Attempts of (moving them there: a day far off, from a
/// worker's clock gone wrong, gets its partition too, and retention drops it in time); returns
/// the names made, in day order. One statement, one transaction. The default partition is
/// normally empty, so reading it costs nothing.
pub async fn ensure_partitions(db: &impl GenericClient, now: DateTime<Utc>, days_ahead: u32) -> Result<Vec<String>, StoreError> {
    let first = now.date_naive();
    let last = first + Duration::days(i64::from(days_ahead));
    let rows = db
        .query(
            "SELECT made FROM (
                 SELECT railhook_attempt_partition(day) AS made
                 FROM (SELECT generate_series($1::date, $2::date, interval '1 day')::date AS day
                       UNION
                       SELECT DISTINCT (started_at AT TIME ZONE 'UTC')::date FROM attempts_default) days
                 ORDER BY day
             ) m WHERE made IS NOT NULL",
            &[&first, &last],
        )
        .await?;
    rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
}

/// Drops every daily partition whose range ends at or before `cutoff` (so no Attempt at or
/// after the cutoff goes); returns their names, oldest first. Each drop is its own statement
/// with [`DROP_LOCK_TIMEOUT`]; one that times out ends the call with its error, after the
/// older ones went.
pub async fn drop_partitions_before(db: &impl GenericClient, cutoff: DateTime<Utc>) -> Result<Vec<String>, StoreError> {
    let mut dropped = Vec::new();
    for p in partitions(db).await?.into_iter().filter(|p| p.to <= cutoff) {
        db.execute(
            "SELECT railhook_attempt_partition_drop($1, $2)",
            &[&p.name, &DROP_LOCK_TIMEOUT],
        )
        .await?;
        tracing::info!(partition = %p.name, from = %p.from, to = %p.to, "dropped an attempts partition");
        dropped.push(p.name);
    }
    Ok(dropped)
}
