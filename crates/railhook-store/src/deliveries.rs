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
    /// Ordered Subscriptions: the Endpoint-scoped Sequence Number (`X-Sequence-Number`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence_number: Option<i64>,
    /// Ordered Subscriptions: whether the Delivery waits in the Ordering Buffer for the
    /// Delivery with the previous Sequence Number.
    pub parked: bool,
    /// Since when it is parked (its first park; the gap timeout counts from it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parked_since: Option<DateTime<Utc>>,
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
         d.last_error, d.ladder_started_at, d.created_at, d.updated_at, d.completed_at,
         CASE WHEN d.status = 'PENDING' THEN d.parked_at END"
    };
}
pub(crate) use delivery_columns;

pub(crate) fn status_from(text: &str) -> Result<DeliveryStatus, StoreError> {
    text.parse().map_err(|e: railhook_core::status::UnknownStatus| StoreError::Misconfigured(e.to_string()))
}

/// Reads [`delivery_columns!`] starting at column `at`.
pub(crate) fn delivery_from(r: &Row, at: usize) -> Result<Delivery, StoreError> {
    Ok(Delivery {
        id: DeliveryId(r.try_get(at)?),
        event_id: EventId(r.try_get(at + 1)?),
        event_type: r.try_get(at + 2)?,
        endpoint_id: EndpointId(r.try_get(at + 3)?),
        subscription_id: r.try_get::<_, Option<Uuid>>(at + 4)?.map(SubscriptionId),
        status: status_from(r.try_get(at + 5)?)?,
        attempt_count: r.try_get(at + 6)?,
        max_attempts: r.try_get(at + 7)?,
        retry_delays: r.try_get(at + 8)?,
        timeout_seconds: r.try_get(at + 9)?,
        next_retry_at: r.try_get(at + 10)?,
        sequence_number: r.try_get(at + 11)?,
        replay_of: r.try_get::<_, Option<Uuid>>(at + 12)?.map(DeliveryId),
        last_error: r.try_get(at + 13)?,
        ladder_started_at: r.try_get(at + 14)?,
        created_at: r.try_get(at + 15)?,
        updated_at: r.try_get(at + 16)?,
        completed_at: r.try_get(at + 17)?,
        parked: r.try_get::<_, Option<DateTime<Utc>>>(at + 18)?.is_some(),
        parked_since: r.try_get(at + 18)?,
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

pub const LIST_SQL: &str = concat!(
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

pub const GET_SQL: &str = concat!(
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
    /// The request's headers as sent, lower-case name to value: `webhook-id`,
    /// `webhook-timestamp`, `webhook-signature`, `x-event-id`, ..., and the Endpoint's custom
    /// headers, the value of a credential (`authorization`, a name with `key`, `token`,
    /// `secret`, `auth`, `password`, ...) shown as `<redacted>`. Null for Attempts recorded
    /// before request headers were.
    #[schema(value_type = Option<Object>)]
    pub request_headers: Option<serde_json::Value>,
    /// The response's headers, lower-case name to value; `{}` when no response arrived.
    #[schema(value_type = Option<Object>)]
    pub response_headers: Option<serde_json::Value>,
    /// The start of the response body (the worker stores up to 64 KiB, as UTF-8).
    pub response_body: Option<String>,
    /// The body was longer than what is stored (or reading it stalled or failed).
    pub response_truncated: bool,
}

/// The Delivery row decides between "no such Delivery" (no row) and "no Attempts yet" (one
/// row of NULLs), so a foreign id is a 404 and not an empty list. The cursor is an Attempt
/// id; the keyset is (attempt_number, id), because a stale worker whose Claim was swept
/// still records its Attempt, under a number another Attempt may carry too.
///
/// `attempts` is partitioned by day on `started_at` (migration 0017): no Attempt starts
/// before its Delivery was made, so `started_at >= created_at - 1 day` (a day of slack for a
/// worker's clock behind the database's) lets the executor skip the partitions of earlier
/// days instead of probing each one's index.
pub const ATTEMPTS_SQL: &str = "
SELECT a.id, a.attempt_number, a.started_at, a.duration_ms, a.status_code, a.result, a.error_message,
       a.response_headers, a.response_body, a.response_truncated, a.request_headers
FROM deliveries d
LEFT JOIN LATERAL (
    SELECT * FROM attempts att
    WHERE att.delivery_id = d.id AND att.started_at >= d.created_at - interval '1 day'
      AND ($3::uuid IS NULL OR (att.attempt_number, att.id) >
           (SELECT c.attempt_number, c.id FROM attempts c
            WHERE c.id = $3 AND c.delivery_id = d.id AND c.started_at >= d.created_at - interval '1 day'))
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
    let mut attempts = Vec::with_capacity(rows.len());
    for r in &rows {
        // The Delivery's row without an Attempt (LEFT JOIN): none yet.
        let Some(id) = r.try_get::<_, Option<Uuid>>(0)? else { continue };
        attempts.push(Attempt {
            id: AttemptId(id),
            delivery_id: delivery,
            attempt_number: r.try_get(1)?,
            started_at: r.try_get(2)?,
            duration_ms: r.try_get(3)?,
            status_code: r.try_get(4)?,
            result: r.try_get(5)?,
            error_message: r.try_get(6)?,
            request_headers: r.try_get::<_, Option<Json<serde_json::Value>>>(10)?.map(|j| j.0),
            response_headers: r.try_get::<_, Option<Json<serde_json::Value>>>(7)?.map(|j| j.0),
            response_body: r.try_get(8)?,
            response_truncated: r.try_get(9)?,
        });
    }
    Ok(Some(attempts))
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

/// By `deliveries_failed_id_idx (project_id, id) WHERE failed_at IS NOT NULL` (migration
/// 0032: `failed_at` is set exactly while the Delivery is FAILED, and is its `completed_at`).
pub const FAILED_SQL: &str = "
SELECT d.id, d.event_id, e.event_type, d.endpoint_id, d.attempt_count, d.last_error, d.completed_at
FROM deliveries d JOIN events e ON e.id = d.event_id
WHERE d.project_id = $1 AND d.failed_at IS NOT NULL AND d.status = 'FAILED'
  AND ($2::uuid IS NULL OR d.endpoint_id = $2)
  AND ($3::text IS NULL OR e.event_type = $3)
  AND ($4::timestamptz IS NULL OR d.failed_at >= $4)
  AND ($5::timestamptz IS NULL OR d.failed_at < $5)
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
    rows.iter()
        .map(|r| {
            Ok(FailedMessage {
                delivery_id: DeliveryId(r.try_get(0)?),
                event_id: EventId(r.try_get(1)?),
                event_type: r.try_get(2)?,
                endpoint_id: EndpointId(r.try_get(3)?),
                attempt_count: r.try_get(4)?,
                last_error: r.try_get(5)?,
                completed_at: r.try_get(6)?,
            })
        })
        .collect()
}


// Manual and bulk retry are lifecycle writes (FAILED -> PENDING): `crate::lifecycle::manual`.
pub use crate::lifecycle::manual::{retry, retry_many, BulkRetry, BulkSelection, RetryOutcome, SkipReason, SkippedDelivery};
