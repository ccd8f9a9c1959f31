//! Ingest and reading of Events.
//!
//! Ingest is one SQL statement, hence one round trip and one commit whatever the number of
//! matching Subscriptions: it inserts the Event, finds the matching enabled Subscriptions by
//! index (`event_type_pattern = ANY(candidates)`, the few patterns that can match the type),
//! hands out ordering sequence numbers, inserts one Delivery per (endpoint, subscription) and
//! announces them (`railhook_announce`: an outbox row each, or in CDC mode one logical
//! decoding message for all). A failure anywhere leaves none of it.
//!
//! Duplicate window 1 (a client retrying its POST) is closed by the unique index on
//! `(project_id, idempotency_key)`: the insert uses `ON CONFLICT DO NOTHING`, which waits for
//! a concurrent inserter of the same key to commit; the loser then reads the winner's Event.

use chrono::{DateTime, Utc};
use railhook_core::{DeliveryId, DeliveryStatus, EndpointId, EventId, ProjectId, SubscriptionId, TraceContext, TraceParent};
use serde::Serialize;
use tokio_postgres::types::Json;
use deadpool_postgres::GenericClient;

use crate::StoreError;

pub mod batch;

/// The longest idempotency key, from any ingest path (`Idempotency-Key`, a Kafka record).
pub const IDEMPOTENCY_KEY_MAX: usize = 255;

/// An idempotency key is 1 to [`IDEMPOTENCY_KEY_MAX`] visible ASCII characters, whichever
/// path it came by, so a key means the same on every path.
pub fn valid_idempotency_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= IDEMPOTENCY_KEY_MAX && key.bytes().all(|b| b.is_ascii_graphic())
}

/// SHA-256 over the type and the payload's canonical JSON (serde_json sorts object keys), so
/// a replay with reordered keys or other whitespace is still the same request. Every ingest
/// path hashes the same way, so a key sent by REST and again by Kafka is one Event.
pub fn request_sha256(event_type: &str, payload: &serde_json::Value) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(event_type.as_bytes());
    h.update([0u8]);
    h.update(serde_json::to_vec(payload).unwrap_or_default());
    h.finalize().to_vec()
}

/// The outgoing ladder of DESIGN.md 6.3, used when a Subscription has no `retry_delays`.
pub const DEFAULT_OUTGOING_DELAYS: [i32; 6] = [60, 300, 900, 3600, 21600, 86400];

/// Public so the ingest benchmark's pgbench baseline runs the very same statement.
///
/// The caller is `$2` (a Project id) or `$9` (the SHA-256 of an API key, looked up here so the
/// API's POST is one round trip, not an authentication and then an ingest); the other is
/// NULL. No row comes back when the key is unknown or revoked.
pub const INGEST_SQL: &str = concat!(
    "
WITH who AS (
    SELECT project_id FROM api_keys WHERE secret_sha256 = $9::bytea AND revoked_at IS NULL
    UNION ALL
    SELECT $2::uuid WHERE $2::uuid IS NOT NULL
),
ev AS (
    INSERT INTO events (id, project_id, event_type, payload, idempotency_key, request_sha256, traceparent, tracestate)
    SELECT $1, who.project_id, $3, $4, $5, $6, $10, $11 FROM who
    ON CONFLICT (project_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, project_id, created_at
),
subs AS (
    SELECT s.id, s.project_id, s.endpoint_id, s.ordering, s.max_attempts, s.timeout_seconds,
           COALESCE(s.retry_delays, $8::int[]) AS retry_delays
    FROM ev
    JOIN subscriptions s ON s.project_id = ev.project_id
    JOIN endpoints e ON e.id = s.endpoint_id AND e.enabled
    WHERE s.enabled AND s.event_type_pattern = ANY($7)
),
dl AS (
    -- An ordered Delivery gets its Sequence Number at its first claim (migration 0035), so
    -- ordered ingests to one Endpoint do not wait for each other's commits.
    INSERT INTO deliveries (id, project_id, event_id, endpoint_id, subscription_id,
                            max_attempts, retry_delays, timeout_seconds, ordered)
    SELECT railhook_uuid_v7(), subs.project_id, $1, subs.endpoint_id, subs.id,
           subs.max_attempts, subs.retry_delays, subs.timeout_seconds, subs.ordering
    FROM subs
    RETURNING id, project_id, endpoint_id, subscription_id, sequence_number
),
ob AS (
    SELECT railhook_announce('d', array_agg(dl.project_id), array_agg(dl.id), array_agg(dl.endpoint_id), 'created',
                             -- The trace context, or empty arrays (none), so the function does not
                             -- look the Event's up (it is not visible to it yet anyway).
                             NULL, CASE WHEN $10::text IS NOT NULL THEN array_agg($10::text) ELSE '{}'::text[] END,
                             CASE WHEN $11::text IS NOT NULL THEN array_agg($11::text) ELSE '{}'::text[] END) AS n FROM dl
)
SELECT who.project_id, ev.created_at, dl.id, dl.endpoint_id, dl.subscription_id, dl.sequence_number
FROM who CROSS JOIN ob LEFT JOIN ev ON true LEFT JOIN dl ON true
ORDER BY dl.id"
);

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct DeliverySummary {
    #[schema(value_type = String)]
    pub id: DeliveryId,
    #[schema(value_type = String)]
    pub endpoint_id: EndpointId,
    #[schema(value_type = Option<String>)]
    pub subscription_id: Option<SubscriptionId>,
    /// PENDING, PROCESSING, SUCCESS or FAILED.
    #[schema(value_type = String)]
    pub status: DeliveryStatus,
    pub attempt_count: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence_number: Option<i64>,
    pub next_retry_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Event {
    #[schema(value_type = String)]
    pub id: EventId,
    #[serde(rename = "type")]
    pub event_type: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub payload: Option<serde_json::Value>,
    pub created_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliveries: Option<Vec<DeliverySummary>>,
    /// The OpenTelemetry trace the Event belongs to (32 hex digits; issue 33): the caller's
    /// `traceparent`'s, or the ingest span's when tracing is on. Absent without either.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

/// Who ingests: a Project the caller already knows, or an API key that the ingest statement
/// itself looks up.
#[derive(Debug, Clone, Copy)]
pub enum Caller<'a> {
    Project(ProjectId),
    /// The key's secret as the client sent it.
    ApiKey(&'a str),
}

#[derive(Clone)]
pub struct NewEvent<'a> {
    pub caller: Caller<'a>,
    pub event_type: &'a str,
    pub payload: &'a serde_json::Value,
    pub idempotency_key: Option<&'a str>,
    /// SHA-256 of type and payload, to tell a replay from a reuse of the key.
    pub request_sha256: Vec<u8>,
    /// The patterns that can match `event_type` (from `railhook_core::pattern`).
    pub candidate_patterns: Vec<String>,
    /// The W3C trace context the ingest continued (issue 33): kept on the Event and carried
    /// by its Deliveries' announcements. `None` when the caller sent none and tracing is off.
    pub trace: Option<TraceContext>,
}

pub enum IngestOutcome {
    Created(Event),
    /// The key was used before with the same request: the Event it created.
    Replayed(Event),
    /// The key was used before with a different type or payload.
    KeyReused,
    /// `Caller::ApiKey` with a key that is unknown or revoked: nothing was written.
    Unauthenticated,
}

/// `db` is a pooled client or transaction: the statement is prepared once per connection.
pub async fn ingest<C: GenericClient + Sync>(db: &C, new: NewEvent<'_>) -> Result<IngestOutcome, StoreError> {
    let id = EventId::new();
    let delays: Vec<i32> = DEFAULT_OUTGOING_DELAYS.to_vec();
    let (project, key_hash) = match new.caller {
        Caller::Project(p) => (Some(p.0), None),
        Caller::ApiKey(secret) if secret.starts_with(crate::tenancy::API_KEY_PREFIX) => (None, Some(crate::tenancy::hash_key(secret))),
        Caller::ApiKey(_) => return Ok(IngestOutcome::Unauthenticated),
    };
    let traceparent = new.trace.as_ref().map(TraceContext::traceparent);
    let statement = db.prepare_cached(INGEST_SQL).await?;
    let rows = db
        .query(
            &statement,
            &[&id.0, &project, &new.event_type, &Json(new.payload), &new.idempotency_key, &new.request_sha256, &new.candidate_patterns, &delays, &key_hash, &traceparent, &new.trace.as_ref().and_then(|t| t.state.as_deref())],
        )
        .await?;
    let Some(first) = rows.first() else { return Ok(IngestOutcome::Unauthenticated) };
    let project = ProjectId(first.try_get(0)?);
    if let Some(now) = first.try_get::<_, Option<DateTime<Utc>>>(1)? {
        let mut deliveries = Vec::with_capacity(rows.len());
        for r in &rows {
            // The Event's row without a Delivery (LEFT JOIN): no Subscription matched.
            let Some(id) = r.try_get::<_, Option<uuid::Uuid>>(2)? else { continue };
            deliveries.push(DeliverySummary {
                id: DeliveryId(id),
                endpoint_id: EndpointId(r.try_get(3)?),
                subscription_id: r.try_get::<_, Option<uuid::Uuid>>(4)?.map(SubscriptionId),
                status: DeliveryStatus::Pending,
                attempt_count: 0,
                sequence_number: r.try_get(5)?,
                next_retry_at: None,
                created_at: now,
            });
        }
        return Ok(IngestOutcome::Created(Event {
            id,
            event_type: new.event_type.to_string(),
            payload: None,
            created_at: now,
            deliveries: Some(deliveries),
            trace_id: new.trace.as_ref().map(|t| t.parent.trace_id_hex()),
        }));
    }
    // No Event inserted: the idempotency key exists (the insert waited for its writer to commit).
    let key = new.idempotency_key.unwrap_or_default();
    let row = db
        .query_opt(
            "SELECT id, event_type, created_at, request_sha256 FROM events WHERE project_id = $1 AND idempotency_key = $2",
            &[&project.0, &key],
        )
        .await?
        .ok_or_else(|| StoreError::Misconfigured("ingest inserted nothing and found no event for its key".into()))?;
    let hash: Option<Vec<u8>> = row.try_get(3)?;
    if hash.as_deref() != Some(new.request_sha256.as_slice()) {
        return Ok(IngestOutcome::KeyReused);
    }
    let event_id = EventId(row.try_get(0)?);
    let deliveries = deliveries_of(db, project, event_id).await?;
    Ok(IngestOutcome::Replayed(Event {
        id: event_id,
        event_type: row.try_get(1)?,
        payload: None,
        created_at: row.try_get(2)?,
        deliveries: Some(deliveries),
        trace_id: None,
    }))
}

/// Several Events in ONE transaction, then one commit: a batch costs about one round trip
/// and one WAL flush instead of one each per Event, and ONE statement for the whole batch
/// ([`batch::INGEST_BATCH_SQL`], the set form of [`INGEST_SQL`]).
///
/// The outcomes are in the order of `events`. An error of any statement rolls the whole batch
/// back (nothing of it is written); the caller decides whether to retry it or to ingest its
/// Events one by one to find the one the database refuses.
pub async fn ingest_batch(client: &mut deadpool_postgres::Client, events: &[NewEvent<'_>]) -> Result<Vec<IngestOutcome>, StoreError> {
    let tx = client.transaction().await?;
    let outcomes = batch::ingest_set(&tx, events).await?;
    tx.commit().await?;
    Ok(outcomes)
}

/// The Projects among `ids` that exist: the Kafka source asks once per batch, since the
/// ingest statement trusts a `Caller::Project`.
pub async fn existing_projects<C: GenericClient + Sync>(db: &C, ids: &[ProjectId]) -> Result<Vec<ProjectId>, StoreError> {
    let ids: Vec<uuid::Uuid> = ids.iter().map(|p| p.0).collect();
    let rows = db.query("SELECT id FROM projects WHERE id = ANY($1)", &[&ids]).await?;
    rows.iter().map(|r| Ok(ProjectId(r.try_get(0)?))).collect()
}

pub async fn deliveries_of<C: GenericClient + Sync>(db: &C, project: ProjectId, event: EventId) -> Result<Vec<DeliverySummary>, StoreError> {
    let rows = db
        .query(
            "SELECT id, endpoint_id, subscription_id, status::text, attempt_count, sequence_number, next_retry_at, created_at
             FROM deliveries WHERE event_id = $1 AND project_id = $2 ORDER BY id",
            &[&event.0, &project.0],
        )
        .await?;
    rows.iter().map(|r| delivery_summary(r, 0)).collect()
}

/// A Delivery's summary from the columns `id, endpoint_id, subscription_id, status::text,
/// attempt_count, sequence_number, next_retry_at, created_at`, the first at `at`.
pub(crate) fn delivery_summary(r: &tokio_postgres::Row, at: usize) -> Result<DeliverySummary, StoreError> {
    let status: String = r.try_get(at + 3)?;
    Ok(DeliverySummary {
        id: DeliveryId(r.try_get(at)?),
        endpoint_id: EndpointId(r.try_get(at + 1)?),
        subscription_id: r.try_get::<_, Option<uuid::Uuid>>(at + 2)?.map(SubscriptionId),
        status: status.parse().map_err(|e: railhook_core::status::UnknownStatus| StoreError::Misconfigured(e.to_string()))?,
        attempt_count: r.try_get(at + 4)?,
        sequence_number: r.try_get(at + 5)?,
        next_retry_at: r.try_get(at + 6)?,
        created_at: r.try_get(at + 7)?,
    })
}

pub async fn get_event<C: GenericClient + Sync>(db: &C, project: ProjectId, id: EventId) -> Result<Option<Event>, StoreError> {
    let Some(row) = db
        .query_opt(
            "SELECT event_type, payload, created_at, traceparent FROM events WHERE id = $1 AND project_id = $2",
            &[&id.0, &project.0],
        )
        .await?
    else {
        return Ok(None);
    };
    let deliveries = deliveries_of(db, project, id).await?;
    Ok(Some(Event {
        id,
        event_type: row.try_get(0)?,
        payload: Some(row.try_get::<_, Json<serde_json::Value>>(1)?.0),
        created_at: row.try_get(2)?,
        deliveries: Some(deliveries),
        trace_id: trace_id(row.try_get(3)?),
    }))
}

/// The trace id of a stored `traceparent` (written normalised by the ingest; anything else
/// is shown as no trace).
fn trace_id(traceparent: Option<String>) -> Option<String> {
    TraceParent::parse(traceparent?.as_bytes()).map(|p| p.trace_id_hex())
}

pub struct EventFilter {
    pub event_type: Option<String>,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    pub after: Option<EventId>,
    pub limit: i64,
}

/// Events in id (= creation time) order, after the cursor; `limit` rows at most.
pub async fn list_events<C: GenericClient + Sync>(db: &C, project: ProjectId, f: &EventFilter) -> Result<Vec<Event>, StoreError> {
    let rows = db
        .query(
            "SELECT id, event_type, payload, created_at, traceparent FROM events
             WHERE project_id = $1
               AND ($2::text IS NULL OR event_type = $2)
               AND ($3::timestamptz IS NULL OR created_at >= $3)
               AND ($4::timestamptz IS NULL OR created_at < $4)
               AND ($5::uuid IS NULL OR id > $5)
             ORDER BY id LIMIT $6",
            &[&project.0, &f.event_type, &f.from, &f.to, &f.after.map(|a| a.0), &f.limit],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(Event {
                id: EventId(r.try_get(0)?),
                event_type: r.try_get(1)?,
                payload: Some(r.try_get::<_, Json<serde_json::Value>>(2)?.0),
                created_at: r.try_get(3)?,
                deliveries: None,
                trace_id: trace_id(r.try_get(4)?),
            })
        })
        .collect()
}
