//! Reading Deliveries and their Attempts, Failed Messages, and manual retry.
//!
//! A manual retry puts a FAILED Delivery back on its Retry Ladder with extra Attempts and
//! announces it through the Outbox in the same statement, so a retry that committed is
//! always announced and one that did not leaves nothing behind (DESIGN.md 4, window 3).
//! The ladder restarts: `ladder_started_at` moves to now, and the worker measures the hard
//! caps from it, so the retried Delivery gets a fresh window.
//!
//! Every statement filters by `project_id`, so an id of another project behaves exactly like
//! an id that does not exist. Lists are in id (= creation time) order after a cursor, like
//! every other list.

use chrono::{DateTime, Utc};
use railhook_core::{AttemptId, DeliveryId, DeliveryStatus, EndpointId, EventId, ProjectId, SubscriptionId};
use serde::Serialize;
use tokio_postgres::types::Json;
use tokio_postgres::{GenericClient, Row};
use uuid::Uuid;

use crate::StoreError;

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Delivery {
    /// Also the `webhook-id` the receiver sees, stable across Attempts and retries.
    #[schema(value_type = String)]
    pub id: DeliveryId,
    #[schema(value_type = String)]
    pub event_id: EventId,
    pub event_type: String,
    #[schema(value_type = String)]
    pub endpoint_id: EndpointId,
    /// Null once the Subscription is deleted.
    #[schema(value_type = Option<String>)]
    pub subscription_id: Option<SubscriptionId>,
    /// PENDING, PROCESSING, SUCCESS or FAILED.
    #[schema(value_type = String)]
    pub status: DeliveryStatus,
    /// Attempts made so far.
    pub attempt_count: i32,
    /// Attempts allowed; a manual retry raises it to `attempt_count + extra_attempts`.
    pub max_attempts: i32,
    /// Seconds to wait after the 1st, 2nd, ... failed Attempt (the last one repeats).
    pub retry_delays: Vec<i32>,
    pub timeout_seconds: i32,
    /// When the next Attempt is due; null: as soon as announced.
    pub next_retry_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence_number: Option<i64>,
    /// The Delivery this one replays, for a Replay.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub replay_of: Option<DeliveryId>,
    pub last_error: Option<String>,
    /// When the current Retry Ladder started (creation or the last manual retry); the hard
    /// cap counts from here.
    pub ladder_started_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// When it reached SUCCESS or FAILED; null while it is in flight.
    pub completed_at: Option<DateTime<Utc>>,
}

/// The columns [`delivery_from`] reads, in its order; `d` is the delivery, `e` its event.
macro_rules! delivery_columns {
    () => {
        "d.id, d.event_id, e.event_type, d.endpoint_id, d.subscription_id, d.status::text, d.attempt_count,
         d.max_attempts, d.retry_delays, d.timeout_seconds, d.next_retry_at, d.sequence_number, d.replay_of,
         d.last_error, d.ladder_started_at, d.created_at, d.updated_at, d.completed_at"
    };
}

fn status_from(text: &str) -> Result<DeliveryStatus, StoreError> {
    text.parse().map_err(|e: railhook_core::status::UnknownStatus| StoreError::Misconfigured(e.to_string()))
}

/// Reads [`delivery_columns!`] starting at column `at`.
fn delivery_from(r: &Row, at: usize) -> Result<Delivery, StoreError> {
    Ok(Delivery {
        id: DeliveryId(r.get(at)),
        event_id: EventId(r.get(at + 1)),
        event_type: r.get(at + 2),
        endpoint_id: EndpointId(r.get(at + 3)),
        subscription_id: r.get::<_, Option<Uuid>>(at + 4).map(SubscriptionId),
        status: status_from(r.get(at + 5))?,
        attempt_count: r.get(at + 6),
        max_attempts: r.get(at + 7),
        retry_delays: r.get(at + 8),
        timeout_seconds: r.get(at + 9),
        next_retry_at: r.get(at + 10),
        sequence_number: r.get(at + 11),
        replay_of: r.get::<_, Option<Uuid>>(at + 12).map(DeliveryId),
        last_error: r.get(at + 13),
        ladder_started_at: r.get(at + 14),
        created_at: r.get(at + 15),
        updated_at: r.get(at + 16),
        completed_at: r.get(at + 17),
    })
}

pub struct DeliveryFilter {
    pub status: Option<DeliveryStatus>,
    pub endpoint_id: Option<EndpointId>,
    pub event_id: Option<EventId>,
    /// Inclusive.
    pub created_after: Option<DateTime<Utc>>,
    /// Exclusive.
    pub created_before: Option<DateTime<Utc>>,
    /// The cursor: rows with a greater id.
    pub after: Option<DeliveryId>,
    pub limit: i64,
}

const LIST_SQL: &str = concat!(
    "SELECT ",
    delivery_columns!(),
    "
FROM deliveries d JOIN events e ON e.id = d.event_id
WHERE d.project_id = $1
  AND ($2::text IS NULL OR d.status = $2::text::delivery_status)
  AND ($3::uuid IS NULL OR d.endpoint_id = $3)
  AND ($4::uuid IS NULL OR d.event_id = $4)
  AND ($5::timestamptz IS NULL OR d.created_at >= $5)
  AND ($6::timestamptz IS NULL OR d.created_at < $6)
  AND ($7::uuid IS NULL OR d.id > $7)
ORDER BY d.id LIMIT $8"
);

/// Deliveries in id order after the cursor; `limit` rows at most.
pub async fn list_deliveries(db: &impl GenericClient, project: ProjectId, f: &DeliveryFilter) -> Result<Vec<Delivery>, StoreError> {
    let rows = db
        .query(
            LIST_SQL,
            &[
                &project.0,
                &f.status.map(DeliveryStatus::as_sql),
                &f.endpoint_id.map(|e| e.0),
                &f.event_id.map(|e| e.0),
                &f.created_after,
                &f.created_before,
                &f.after.map(|a| a.0),
                &f.limit,
            ],
        )
        .await?;
    rows.iter().map(|r| delivery_from(r, 0)).collect()
}

const GET_SQL: &str = concat!(
    "SELECT ",
    delivery_columns!(),
    "
FROM deliveries d JOIN events e ON e.id = d.event_id
WHERE d.id = $1 AND d.project_id = $2"
);

pub async fn get_delivery(db: &impl GenericClient, project: ProjectId, id: DeliveryId) -> Result<Option<Delivery>, StoreError> {
    db.query_opt(GET_SQL, &[&id.0, &project.0]).await?.map(|r| delivery_from(&r, 0)).transpose()
}

/// One HTTP request towards a Delivery, as the worker recorded it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Attempt {
    #[schema(value_type = String)]
    pub id: AttemptId,
    #[schema(value_type = String)]
    pub delivery_id: DeliveryId,
    /// 1 for the first Attempt; counts on across manual retries.
    pub attempt_number: i32,
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    /// The receiver's HTTP status; null when no response arrived.
    pub status_code: Option<i32>,
    /// `success`, `http_status`, `timeout`, `connect`, `dns`, `tls`, `refused_address`, ...
    pub result: String,
    pub error_message: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub response_headers: Option<serde_json::Value>,
    /// The start of the response body (the worker stores up to a cap).
    pub response_body: Option<String>,
    /// The body was longer than what is stored.
    pub response_truncated: bool,
}

/// The Delivery row decides between "no such Delivery" (no row) and "no Attempts yet" (one
/// row of NULLs), so a foreign id is a 404 and not an empty list. The cursor is an Attempt
/// id; the keyset is (attempt_number, id), because a stale worker whose Claim was swept
/// still records its Attempt, under a number another Attempt may carry too.
const ATTEMPTS_SQL: &str = "
SELECT a.id, a.attempt_number, a.started_at, a.duration_ms, a.status_code, a.result, a.error_message,
       a.response_headers, a.response_body, a.response_truncated
FROM deliveries d
LEFT JOIN LATERAL (
    SELECT * FROM attempts att
    WHERE att.delivery_id = d.id
      AND ($3::uuid IS NULL OR (att.attempt_number, att.id) >
           (SELECT c.attempt_number, c.id FROM attempts c WHERE c.id = $3 AND c.delivery_id = d.id))
    ORDER BY att.attempt_number, att.id
    LIMIT $4
) a ON true
WHERE d.id = $1 AND d.project_id = $2
ORDER BY a.attempt_number, a.id";

/// The Delivery's Attempts in attempt order after the cursor; `None` when the Delivery is
/// not the project's.
pub async fn list_attempts(
    db: &impl GenericClient,
    project: ProjectId,
    delivery: DeliveryId,
    after: Option<AttemptId>,
    limit: i64,
) -> Result<Option<Vec<Attempt>>, StoreError> {
    let rows = db.query(ATTEMPTS_SQL, &[&delivery.0, &project.0, &after.map(|a| a.0), &limit]).await?;
    if rows.is_empty() {
        return Ok(None);
    }
    Ok(Some(
        rows.iter()
            .filter_map(|r| {
                let id: Option<Uuid> = r.get(0);
                id.map(|id| Attempt {
                    id: AttemptId(id),
                    delivery_id: delivery,
                    attempt_number: r.get(1),
                    started_at: r.get(2),
                    duration_ms: r.get(3),
                    status_code: r.get(4),
                    result: r.get(5),
                    error_message: r.get(6),
                    response_headers: r.get::<_, Option<Json<serde_json::Value>>>(7).map(|j| j.0),
                    response_body: r.get(8),
                    response_truncated: r.get(9),
                })
            })
            .collect(),
    ))
}

/// A FAILED Delivery, as Failed Messages lists it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct FailedMessage {
    #[schema(value_type = String)]
    pub delivery_id: DeliveryId,
    #[schema(value_type = String)]
    pub event_id: EventId,
    pub event_type: String,
    #[schema(value_type = String)]
    pub endpoint_id: EndpointId,
    pub attempt_count: i32,
    pub last_error: Option<String>,
    /// When it was abandoned.
    pub completed_at: Option<DateTime<Utc>>,
}

/// Which Failed Messages to list or retry.
#[derive(Debug, Clone, Default)]
pub struct FailedFilter {
    pub endpoint_id: Option<EndpointId>,
    /// An exact event type.
    pub event_type: Option<String>,
    /// Inclusive.
    pub completed_after: Option<DateTime<Utc>>,
    /// Exclusive.
    pub completed_before: Option<DateTime<Utc>>,
}

const FAILED_SQL: &str = "
SELECT d.id, d.event_id, e.event_type, d.endpoint_id, d.attempt_count, d.last_error, d.completed_at
FROM deliveries d JOIN events e ON e.id = d.event_id
WHERE d.project_id = $1 AND d.status = 'FAILED'
  AND ($2::uuid IS NULL OR d.endpoint_id = $2)
  AND ($3::text IS NULL OR e.event_type = $3)
  AND ($4::timestamptz IS NULL OR d.completed_at >= $4)
  AND ($5::timestamptz IS NULL OR d.completed_at < $5)
  AND ($6::uuid IS NULL OR d.id > $6)
ORDER BY d.id LIMIT $7";

/// Failed Messages in id order after the cursor; `limit` rows at most.
pub async fn list_failed(
    db: &impl GenericClient,
    project: ProjectId,
    f: &FailedFilter,
    after: Option<DeliveryId>,
    limit: i64,
) -> Result<Vec<FailedMessage>, StoreError> {
    let rows = db
        .query(
            FAILED_SQL,
            &[&project.0, &f.endpoint_id.map(|e| e.0), &f.event_type, &f.completed_after, &f.completed_before, &after.map(|a| a.0), &limit],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| FailedMessage {
            delivery_id: DeliveryId(r.get(0)),
            event_id: EventId(r.get(1)),
            event_type: r.get(2),
            endpoint_id: EndpointId(r.get(3)),
            attempt_count: r.get(4),
            last_error: r.get(5),
            completed_at: r.get(6),
        })
        .collect())
}

/// The SET list that puts a Delivery back on its Retry Ladder, `$extra` Attempts beyond those
/// it made: PENDING, due at once, no Claim, not completed, a new ladder window. It also
/// counts as announced now (the Outbox row goes in with it), so the stranded sweep does not
/// announce it a second time.
macro_rules! back_on_the_ladder {
    ($extra:literal) => {
        concat!(
            "status = 'PENDING', max_attempts = attempt_count + ",
            $extra,
            ", next_retry_at = NULL,
             claim_token = NULL, claimed_at = NULL, completed_at = NULL,
             ladder_started_at = now(), last_announced_at = now(), updated_at = now()"
        )
    };
}

/// One Delivery. `target` locks the row and, after waiting for a concurrent writer, sees
/// its committed status, so the answer (retried, or the status that prevented it) is
/// never stale. The Outbox row is inserted in the same statement as the update.
const RETRY_SQL: &str = concat!(
    "
WITH target AS (
    SELECT id, status FROM deliveries WHERE id = $1 AND project_id = $2 FOR UPDATE
), d AS (
    UPDATE deliveries SET ",
    back_on_the_ladder!("$3"),
    "
    FROM target WHERE deliveries.id = target.id AND target.status = 'FAILED'
    RETURNING deliveries.*
), announced AS (
    INSERT INTO outbox (project_id, delivery_id, routing_id, reason)
    SELECT project_id, id, endpoint_id, 'manual_retry' FROM d
)
SELECT target.status::text, ",
    delivery_columns!(),
    "
FROM target LEFT JOIN d ON true LEFT JOIN events e ON e.id = d.event_id"
);

pub enum RetryOutcome {
    /// Back on the ladder and announced; the Delivery as it is now.
    Retried(Box<Delivery>),
    /// Only a FAILED Delivery can be retried; this is its status.
    NotFailed(DeliveryStatus),
    NotFound,
}

/// Retries one FAILED Delivery with `extra_attempts` more Attempts (the caller checks the
/// range).
pub async fn retry(db: &impl GenericClient, project: ProjectId, id: DeliveryId, extra_attempts: i32) -> Result<RetryOutcome, StoreError> {
    let Some(row) = db.query_opt(RETRY_SQL, &[&id.0, &project.0, &extra_attempts]).await? else {
        return Ok(RetryOutcome::NotFound);
    };
    if row.get::<_, Option<Uuid>>(1).is_some() {
        return Ok(RetryOutcome::Retried(Box::new(delivery_from(&row, 1)?)));
    }
    Ok(RetryOutcome::NotFailed(status_from(row.get(0))?))
}

/// Why a Delivery named in a bulk retry was not retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// No such Delivery in this project.
    NotFound,
    /// It is not FAILED (its status is given).
    NotFailed,
    /// Another request was changing it at that moment (e.g. a concurrent retry); read it
    /// again.
    Busy,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct SkippedDelivery {
    #[schema(value_type = String)]
    pub id: DeliveryId,
    pub reason: SkipReason,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub status: Option<DeliveryStatus>,
}

#[derive(Debug, Clone, Default)]
pub struct BulkRetry {
    /// In id order.
    pub retried: Vec<DeliveryId>,
    /// For a retry by ids: the ids not retried, in the order they were given.
    pub skipped: Vec<SkippedDelivery>,
}

/// Many Deliveries in one statement: either the listed ids ($2) or those matching the
/// filter ($4-$7), FAILED ones only, at most $8, in id order. `FOR UPDATE SKIP LOCKED` lets
/// two bulk retries run side by side without waiting on each other or retrying a row twice.
/// `requested` is the listed ids as the statement's snapshot sees them, to say why one was
/// skipped.
const BULK_RETRY_SQL: &str = concat!(
    "
WITH requested AS (
    SELECT id, status FROM deliveries WHERE project_id = $1 AND id = ANY($2::uuid[])
), picked AS (
    SELECT d.id FROM deliveries d
    WHERE d.project_id = $1 AND d.status = 'FAILED'
      AND ($2::uuid[] IS NULL OR d.id = ANY($2::uuid[]))
      AND ($4::uuid IS NULL OR d.endpoint_id = $4)
      AND ($5::text IS NULL OR EXISTS (SELECT 1 FROM events e WHERE e.id = d.event_id AND e.event_type = $5))
      AND ($6::timestamptz IS NULL OR d.completed_at >= $6)
      AND ($7::timestamptz IS NULL OR d.completed_at < $7)
    ORDER BY d.id
    LIMIT $8
    FOR UPDATE SKIP LOCKED
), retried AS (
    UPDATE deliveries d SET ",
    back_on_the_ladder!("$3"),
    "
    FROM picked WHERE d.id = picked.id
    RETURNING d.id, d.project_id, d.endpoint_id
), announced AS (
    INSERT INTO outbox (project_id, delivery_id, routing_id, reason)
    SELECT project_id, id, endpoint_id, 'manual_retry' FROM retried
)
SELECT coalesce(r.id, q.id), q.status::text, r.id IS NOT NULL
FROM retried r FULL JOIN requested q ON q.id = r.id"
);

/// Which Deliveries a bulk retry is about.
#[derive(Clone, Copy)]
pub enum BulkSelection<'a> {
    /// These ids (at most a few thousand; the caller bounds them).
    Ids(&'a [DeliveryId]),
    /// The FAILED Deliveries that match, at most `limit`.
    Filter(&'a FailedFilter, i64),
}

/// Retries FAILED Deliveries in bulk with `extra_attempts` more Attempts each, in one
/// statement.
pub async fn retry_many(db: &impl GenericClient, project: ProjectId, selection: BulkSelection<'_>, extra_attempts: i32) -> Result<BulkRetry, StoreError> {
    let none = FailedFilter::default();
    let (ids, filter, limit) = match selection {
        BulkSelection::Ids(ids) => {
            let mut unique: Vec<Uuid> = ids.iter().map(|i| i.0).collect();
            unique.sort();
            unique.dedup();
            let n = unique.len() as i64;
            (Some(unique), &none, n)
        }
        BulkSelection::Filter(filter, limit) => (None, filter, limit),
    };
    let rows = db
        .query(
            BULK_RETRY_SQL,
            &[
                &project.0,
                &ids,
                &extra_attempts,
                &filter.endpoint_id.map(|e| e.0),
                &filter.event_type,
                &filter.completed_after,
                &filter.completed_before,
                &limit,
            ],
        )
        .await?;
    let mut out = BulkRetry::default();
    let mut seen = std::collections::HashMap::new();
    for r in &rows {
        let id = DeliveryId(r.get(0));
        if r.get::<_, bool>(2) {
            out.retried.push(id);
        } else {
            let status = status_from(r.get(1))?;
            let reason = if status == DeliveryStatus::Failed { SkipReason::Busy } else { SkipReason::NotFailed };
            seen.insert(id, (reason, status));
        }
    }
    out.retried.sort();
    if let BulkSelection::Ids(given) = selection {
        let retried: std::collections::HashSet<DeliveryId> = out.retried.iter().copied().collect();
        let mut reported = std::collections::HashSet::new();
        for id in given {
            if retried.contains(id) || !reported.insert(*id) {
                continue;
            }
            out.skipped.push(match seen.get(id) {
                Some((SkipReason::NotFailed, status)) => SkippedDelivery { id: *id, reason: SkipReason::NotFailed, status: Some(*status) },
                Some((reason, _)) => SkippedDelivery { id: *id, reason: *reason, status: None },
                None => SkippedDelivery { id: *id, reason: SkipReason::NotFound, status: None },
            });
        }
    }
    Ok(out)
}
