//! Retention (issue 17): the SQL of the worker's retention job
//! (`railhook_worker::retention`), which keeps every table bounded.
//!
//! - **Events**: an Event goes, with its Deliveries and their Attempts, once it is older than
//!   its Project's events cutoff and every one of its Deliveries is final and finished before
//!   that cutoff, a FAILED one (a Failed Message) before the failed cutoff instead. An Event
//!   with no Delivery goes by age alone. [`delete_events_batch`] walks one Project's Events
//!   in `(created_at, id)` order over `events_project_created_idx`, at most `limit` of them
//!   per statement, from a cursor the caller carries (so Events kept for a FAILED or an
//!   unfinished Delivery are read once per run, not once per batch).
//! - **Incoming Events** likewise with their Forwards ([`delete_incoming_batch`]), walked
//!   over `incoming_events_project_idx (project_id, id)` up to the first id the cutoff can
//!   have (ids are UUIDv7, time first), and checked against `received_at` exactly.
//! - **Replays**: finished ones whose Deliveries are all gone ([`delete_replays`]).
//! - Attempts are partitioned by day (migration 0017) and dropped a partition at a time by
//!   `crate::attempts`. Where that drop comes within about a day of their Delivery's (or
//!   Forward's) deletion, that is, when `attempts_days` is at least a day and at most the
//!   Project's events period ([`attempts_with_parents`] false: the defaults, 30 and 30), they
//!   are left to it: each deleted row is WAL the relay's walsender decodes before the live
//!   commits behind it, and this saves a third of them per Event. Otherwise (a Project that
//!   keeps Events for less time than Attempts, or Attempts kept for less than a day, which no
//!   daily partition can honour) they go with their Delivery or Forward here, looked up
//!   only in the partitions of the days between the batch's first Delivery's creation and its
//!   last one's update, an hour either side for the worker's clock (`started_at`); Postgres
//!   prunes the other partitions when the statement starts. `attempts` has no foreign key to
//!   `deliveries` or `forwards` (migration 0020: their cascade, which cannot prune, probed
//!   every partition per deleted Delivery), so this delete is the only one.
//! - Published outbox rows are trimmed by the relay (`railhook_relay::retention`).
//!
//! One statement deletes the children explicitly (to count them) and then the parent; the
//! cascade of `deliveries.event_id` (`forwards.incoming_event_id`) finds nothing left. Each
//! delete names its rows as `= ANY(ARRAY(..))` so that it is an index scan whatever the planner
//! guesses of a CTE's size (as `IN (SELECT ..)` it hash-joined a sequential scan of `events`).
//! Every foreign key a delete here triggers has an index (`deliveries_event_idx`,
//! `forwards_incoming_event_idx`, and `deliveries_replay_of_idx` of migration 0018), so no
//! cascade scans a table per row.
//!
//! Races, accepted: a person retrying (or replaying) a Failed Message in the same
//! millisecond as its retention expires may see it deleted. The job runs under
//! [`crate::locks::RETENTION`] ([`try_lock`]).

use chrono::{DateTime, Duration, Utc};
use deadpool_postgres::GenericClient;
use railhook_core::ProjectId;
use uuid::Uuid;

use crate::StoreError;

/// How long a Project keeps its data: the configured defaults, or its overrides
/// (`projects.retention_events_days`, `projects.retention_failed_days`, migration 0018).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Periods {
    pub events_days: f64,
    pub failed_days: f64,
}

/// One Project's cutoffs for one run, from the database's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cutoffs {
    /// Events (Incoming Events) created before this, and Deliveries (Forwards) that finished
    /// before it, may go.
    pub events: DateTime<Utc>,
    /// FAILED Deliveries (Forwards) that failed before this may go.
    pub failed: DateTime<Utc>,
}

impl Cutoffs {
    pub fn at(now: DateTime<Utc>, periods: Periods) -> Cutoffs {
        Cutoffs { events: now - days(periods.events_days), failed: now - days(periods.failed_days) }
    }
}

/// A period in days (fractions allowed) as a duration, to the microsecond.
pub fn days(d: f64) -> Duration {
    Duration::microseconds((d * 86_400_000_000.0).round() as i64)
}

/// The database's `now()`: every cutoff of a run is taken from it, not from this host.
pub async fn now<C: GenericClient + Sync>(db: &C) -> Result<DateTime<Utc>, StoreError> {
    Ok(db.query_one("SELECT now()", &[]).await?.try_get(0)?)
}

/// Every Project with its periods: an override where set, else `defaults`.
pub async fn projects<C: GenericClient + Sync>(db: &C, defaults: Periods) -> Result<Vec<(ProjectId, Periods)>, StoreError> {
    let rows = db.query("SELECT id, retention_events_days, retention_failed_days FROM projects ORDER BY id", &[]).await?;
    rows.iter()
        .map(|r| {
            let periods = Periods {
                events_days: r.try_get::<_, Option<f64>>(1)?.unwrap_or(defaults.events_days),
                failed_days: r.try_get::<_, Option<f64>>(2)?.unwrap_or(defaults.failed_days),
            };
            Ok((ProjectId(r.try_get(0)?), periods))
        })
        .collect()
}

/// A Project's own periods (`projects.retention_events_days`, `projects.retention_failed_days`,
/// migration 0018): `None` is the configured default.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Overrides {
    pub events_days: Option<f64>,
    pub failed_days: Option<f64>,
}

/// A Project's overrides; `None` when there is no such Project. With `for_update` the row stays
/// locked until the caller's transaction ends, so that a read-modify-write (a partial update
/// through [`set_overrides`]) loses no concurrent one.
pub async fn overrides<C: GenericClient + Sync>(db: &C, project: ProjectId, for_update: bool) -> Result<Option<Overrides>, StoreError> {
    let sql = if for_update {
        "SELECT retention_events_days, retention_failed_days FROM projects WHERE id = $1 FOR UPDATE"
    } else {
        "SELECT retention_events_days, retention_failed_days FROM projects WHERE id = $1"
    };
    let row = db.query_opt(sql, &[&project]).await?;
    row.map(|r| Ok(Overrides { events_days: r.try_get(0)?, failed_days: r.try_get(1)? })).transpose()
}

/// Sets (or with `None` clears) a Project's overrides; false when there is no such Project.
pub async fn set_overrides<C: GenericClient + Sync>(db: &C, project: ProjectId, events_days: Option<f64>, failed_days: Option<f64>) -> Result<bool, StoreError> {
    let n = db
        .execute("UPDATE projects SET retention_events_days = $2, retention_failed_days = $3 WHERE id = $1", &[&project, &events_days, &failed_days])
        .await?;
    Ok(n == 1)
}

/// Whether a Project's Attempts go with their Delivery (or Forward) in the Events batches, or
/// are left to the drop of their daily partition: with it when the Project keeps Events for
/// less time than Attempts (`events_days < attempts_days`; the partition would keep them
/// longer than the Project asked) or when `attempts_days` is under a day (a daily partition
/// cannot honour it). Otherwise the partition goes within about a day of the Delivery.
pub fn attempts_with_parents(periods: Periods, attempts_days: f64) -> bool {
    periods.events_days < attempts_days || attempts_days < 1.0
}

/// What one batch did. `examined < limit` means the walk reached the cutoff.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deleted {
    /// Parents read (Events or Incoming Events), deleted or kept.
    pub examined: u64,
    /// Events or Incoming Events deleted.
    pub parents: u64,
    /// Deliveries or Forwards deleted.
    pub children: u64,
    pub attempts: u64,
}

/// Where an Event walk goes on: after this `(created_at, id)`.
pub type EventCursor = (DateTime<Utc>, Uuid);

/// Before every Event (a plain row comparison, so the walk is an index range scan).
pub const EVENTS_START: EventCursor = (DateTime::<Utc>::UNIX_EPOCH, Uuid::nil());

pub const EVENTS_SQL: &str = "
WITH c AS (
    SELECT e.id, e.created_at FROM events e
    WHERE e.project_id = $1 AND e.created_at < $2
      AND (e.created_at, e.id) > ($4, $5)
    ORDER BY e.created_at, e.id
    LIMIT $6
), gone AS (
    SELECT c.id FROM c
    WHERE NOT EXISTS (
        SELECT 1 FROM deliveries d
        WHERE d.event_id = c.id
          AND (d.status NOT IN ('SUCCESS', 'FAILED')
               OR coalesce(d.completed_at, d.updated_at) >= CASE WHEN d.status = 'FAILED' THEN $3 ELSE $2 END))
), d AS (
    DELETE FROM deliveries WHERE event_id = ANY(ARRAY(SELECT id FROM gone)) RETURNING id, created_at, updated_at
), a AS (
    DELETE FROM attempts WHERE $7 AND delivery_id = ANY(ARRAY(SELECT id FROM d))
      AND started_at >= (SELECT min(created_at) FROM d) - interval '1 hour'
      AND started_at <= (SELECT max(updated_at) FROM d) + interval '1 hour'
    RETURNING 1
), e AS (
    DELETE FROM events WHERE id = ANY(ARRAY(SELECT id FROM gone)) RETURNING 1
), last AS (
    SELECT created_at, id FROM c ORDER BY created_at DESC, id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM c), (SELECT count(*) FROM e), (SELECT count(*) FROM d), (SELECT count(*) FROM a),
       (SELECT created_at FROM last), (SELECT id FROM last)";

/// One batch of one Project's Events: reads at most `limit` Events created before
/// `cutoffs.events`, after `after`, and deletes those whose Deliveries all may go (see the
/// module doc), with their Attempts if `attempts` ([`attempts_with_parents`]). Returns what it
/// did and the cursor to go on from (None: nothing read). Start at [`EVENTS_START`].
pub async fn delete_events_batch<C: GenericClient + Sync>(
    db: &C,
    project: ProjectId,
    cutoffs: Cutoffs,
    after: EventCursor,
    limit: i64,
    attempts: bool,
) -> Result<(Deleted, Option<EventCursor>), StoreError> {
    let r = db.query_one(EVENTS_SQL, &[&project, &cutoffs.events, &cutoffs.failed, &after.0, &after.1, &limit, &attempts]).await?;
    let deleted = Deleted { examined: r.try_get::<_, i64>(0)? as u64, parents: r.try_get::<_, i64>(1)? as u64, children: r.try_get::<_, i64>(2)? as u64, attempts: r.try_get::<_, i64>(3)? as u64 };
    let next = match (r.try_get::<_, Option<DateTime<Utc>>>(4)?, r.try_get::<_, Option<Uuid>>(5)?) {
        (Some(t), Some(id)) => Some((t, id)),
        _ => None,
    };
    Ok((deleted, next))
}

const INCOMING_SQL: &str = "
WITH c AS (
    SELECT i.id, i.received_at FROM incoming_events i
    WHERE i.project_id = $1 AND i.id > $4 AND i.id < $5
    ORDER BY i.id
    LIMIT $6
), gone AS (
    SELECT c.id FROM c
    WHERE c.received_at < $2 AND NOT EXISTS (
        SELECT 1 FROM forwards f
        WHERE f.incoming_event_id = c.id
          AND (f.status NOT IN ('SUCCESS', 'FAILED')
               OR coalesce(f.completed_at, f.updated_at) >= CASE WHEN f.status = 'FAILED' THEN $3 ELSE $2 END))
), f AS (
    DELETE FROM forwards WHERE incoming_event_id = ANY(ARRAY(SELECT id FROM gone)) RETURNING id, created_at, updated_at
), a AS (
    DELETE FROM attempts WHERE $7 AND forward_id = ANY(ARRAY(SELECT id FROM f))
      AND started_at >= (SELECT min(created_at) FROM f) - interval '1 hour'
      AND started_at <= (SELECT max(updated_at) FROM f) + interval '1 hour'
    RETURNING 1
), i AS (
    DELETE FROM incoming_events WHERE id = ANY(ARRAY(SELECT id FROM gone)) RETURNING 1
)
SELECT (SELECT count(*) FROM c), (SELECT count(*) FROM i), (SELECT count(*) FROM f), (SELECT count(*) FROM a), (SELECT id FROM c ORDER BY id DESC LIMIT 1)";

/// The first UUIDv7 a row made at `t` or later can have, less a millisecond for rounding.
pub fn first_id_at(t: DateTime<Utc>) -> Uuid {
    let ms = (t.timestamp_millis() - 1).max(0) as u128;
    Uuid::from_u128(ms << 80)
}

/// One batch of one Project's Incoming Events, in id order after `after` (`Uuid::nil()` to
/// start), up to the first id `cutoffs.events` can have: deletes those received before the
/// cutoff whose Forwards all may go, with their Attempts if `attempts`
/// ([`attempts_with_parents`]). Returns what it did and the cursor to go on from.
pub async fn delete_incoming_batch<C: GenericClient + Sync>(
    db: &C,
    project: ProjectId,
    cutoffs: Cutoffs,
    after: Uuid,
    limit: i64,
    attempts: bool,
) -> Result<(Deleted, Option<Uuid>), StoreError> {
    let bound = first_id_at(cutoffs.events);
    let r = db.query_one(INCOMING_SQL, &[&project, &cutoffs.events, &cutoffs.failed, &after, &bound, &limit, &attempts]).await?;
    let deleted = Deleted { examined: r.try_get::<_, i64>(0)? as u64, parents: r.try_get::<_, i64>(1)? as u64, children: r.try_get::<_, i64>(2)? as u64, attempts: r.try_get::<_, i64>(3)? as u64 };
    Ok((deleted, r.try_get(4)?))
}

/// Finished Replays (completed or cancelled before `cutoff`) none of whose Deliveries is
/// left, at most `limit`; the number deleted.
pub async fn delete_replays<C: GenericClient + Sync>(db: &C, cutoff: DateTime<Utc>, limit: i64) -> Result<u64, StoreError> {
    Ok(db
        .execute(
            "DELETE FROM replays WHERE id IN (
                 SELECT r.id FROM replays r
                 WHERE r.state <> 'running' AND r.finished_at < $1
                   AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.replay_id = r.id)
                 ORDER BY r.finished_at LIMIT $2)",
            &[&cutoff, &limit],
        )
        .await?)
}

/// Takes [`crate::locks::RETENTION`] at session level without waiting: true if this
/// connection now holds it. Release it with [`unlock`] (or by closing the connection).
pub async fn try_lock<C: GenericClient + Sync>(db: &C) -> Result<bool, StoreError> {
    Ok(db.query_one("SELECT pg_try_advisory_lock($1)", &[&crate::locks::RETENTION.key]).await?.try_get(0)?)
}

/// Releases what [`try_lock`] took; false if this connection did not hold it.
pub async fn unlock<C: GenericClient + Sync>(db: &C) -> Result<bool, StoreError> {
    Ok(db.query_one("SELECT pg_advisory_unlock($1)", &[&crate::locks::RETENTION.key]).await?.try_get(0)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_go_with_their_parents_only_where_no_partition_drop_takes_them_soon() {
        let p = |events_days| Periods { events_days, failed_days: 90.0 };
        assert!(!attempts_with_parents(p(30.0), 30.0), "the defaults: the partition goes within a day");
        assert!(!attempts_with_parents(p(60.0), 30.0), "the partition went first");
        assert!(attempts_with_parents(p(7.0), 30.0), "the Project keeps Events for less time");
        assert!(attempts_with_parents(p(1.0 / 24.0), 1.0 / 24.0), "under a day: no daily partition can");
    }
}
