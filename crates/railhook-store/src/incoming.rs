//! Incoming Events (a provider's request as it arrived at an ingress URL) and their Forwards.
//!
//! Storing is one SQL statement ([`INGRESS_SQL`]), hence one round trip and one commit
//! whatever the number of Destinations: it inserts the Incoming Event, one Forward per enabled
//! Destination of the Source and one Outbox row per Forward (`routing_id` = the destination
//! id, reason `created`). A failure anywhere leaves none of it.
//!
//! Duplicate window 2 (a provider resending) is closed by the unique key
//! `(source_id, provider_event_id)`: the insert uses `ON CONFLICT DO NOTHING`, which waits for a
//! concurrent inserter of the same id to commit; the loser then inserts no Forward either (they
//! hang off the inserted row) and reads the winner's Incoming Event. A request without a
//! provider event id (NULL) is never a duplicate.
//!
//! For the worker, [`forward_to_send`] reads a Forward with its Destination and Incoming Event:
//! everything an Attempt needs, in one statement.

use base64::Engine;
use chrono::{DateTime, Utc};
use railhook_core::{AttemptId, DestinationId, DeliveryStatus, ForwardId, IncomingEventId, ProjectId, SourceId};
use serde::{Deserialize, Serialize};
use tokio_postgres::types::Json;
use tokio_postgres::Row;

use crate::sources::{destination_from, Destination, DESTINATION_COLUMNS};
use crate::StoreError;

/// The incoming Retry Ladder (issue 16): waits between the 5 Attempts of a Forward, copied
/// into each Forward; jittered by the worker. The 24 h cap is `worker.incoming_max_age_seconds`.
pub const INCOMING_DELAYS: [i32; 4] = [60, 300, 900, 3600];
pub const INCOMING_MAX_ATTEMPTS: i32 = 5;
/// How long one Attempt of a Forward may take.
pub const FORWARD_TIMEOUT_SECONDS: i32 = 30;

/// One request header as it arrived, in arrival order (repeats kept). A value that is not
/// UTF-8 (HTTP allows obs-text) is kept as base64 in `value_base64` instead of `value`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredHeader {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_base64: Option<String>,
}

impl StoredHeader {
    pub fn new(name: &str, value: &[u8]) -> StoredHeader {
        match std::str::from_utf8(value) {
            Ok(text) => StoredHeader { name: name.to_string(), value: Some(text.to_string()), value_base64: None },
            Err(_) => StoredHeader {
                name: name.to_string(),
                value: None,
                value_base64: Some(base64::engine::general_purpose::STANDARD.encode(value)),
            },
        }
    }

    /// The value's bytes, exactly as they arrived.
    pub fn value_bytes(&self) -> Vec<u8> {
        match (&self.value, &self.value_base64) {
            (Some(text), _) => text.as_bytes().to_vec(),
            (None, Some(b64)) => base64::engine::general_purpose::STANDARD.decode(b64).unwrap_or_default(),
            (None, None) => Vec::new(),
        }
    }
}

/// A verified request to store.
pub struct NewIncomingEvent<'a> {
    pub project: ProjectId,
    pub source: SourceId,
    /// The provider's id for dedupe; `None`: stored without dedupe.
    pub provider_event_id: Option<&'a str>,
    pub method: &'a str,
    pub headers: &'a [StoredHeader],
    /// The raw bytes, never re-serialised.
    pub body: &'a [u8],
    pub content_type: Option<&'a str>,
    /// The W3C trace context the ingress request continued (issue 33), carried by the
    /// Forwards' announcements. (The request's own `traceparent` is among `headers`.)
    pub trace: Option<railhook_core::TraceContext>,
}

/// What storing a request did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// A new Incoming Event with one Forward per enabled Destination.
    Stored { id: IncomingEventId, received_at: DateTime<Utc>, forwards: Vec<(ForwardId, DestinationId)> },
    /// The provider resent an event already stored: nothing was written.
    Duplicate { id: IncomingEventId, received_at: DateTime<Utc> },
}

/// Public so a benchmark can run the very same statement.
pub const INGRESS_SQL: &str = "
WITH ev AS (
    INSERT INTO incoming_events (id, project_id, source_id, provider_event_id, method, headers, body, content_type, traceparent, tracestate)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $12, $13)
    ON CONFLICT (source_id, provider_event_id) DO NOTHING
    RETURNING id, received_at
),
fw AS (
    INSERT INTO forwards (id, project_id, incoming_event_id, destination_id, max_attempts, retry_delays, timeout_seconds)
    SELECT railhook_uuid_v7(), $2, ev.id, d.id, $9, $10, $11
    FROM ev JOIN destinations d ON d.source_id = $3 AND d.enabled
    RETURNING id, destination_id
),
ob AS (
    SELECT railhook_announce('f', array_agg($2::uuid), array_agg(fw.id), array_agg(fw.destination_id), 'created',
                             NULL, CASE WHEN $12::text IS NOT NULL THEN array_agg($12::text) END,
                             CASE WHEN $13::text IS NOT NULL THEN array_agg($13::text) END) AS n FROM fw
)
SELECT ev.received_at, fw.id, fw.destination_id
FROM ev CROSS JOIN ob LEFT JOIN fw ON true
ORDER BY fw.id";

/// Stores a verified request (see the module doc). `db` is a pooled client: the statement is
/// prepared once per connection.
pub async fn receive<C: deadpool_postgres::GenericClient + Sync>(db: &C, new: NewIncomingEvent<'_>) -> Result<Received, StoreError> {
    let id = IncomingEventId::new();
    let delays = INCOMING_DELAYS.to_vec();
    let statement = db.prepare_cached(INGRESS_SQL).await?;
    let rows = db
        .query(
            &statement,
            &[
                &id.0,
                &new.project.0,
                &new.source.0,
                &new.provider_event_id,
                &new.method,
                &Json(new.headers),
                &new.body,
                &new.content_type,
                &INCOMING_MAX_ATTEMPTS,
                &delays,
                &FORWARD_TIMEOUT_SECONDS,
                &new.trace.as_ref().map(railhook_core::TraceContext::traceparent),
                &new.trace.as_ref().and_then(|t| t.state.as_deref()),
            ],
        )
        .await?;
    if let Some(first) = rows.first() {
        let mut forwards = Vec::with_capacity(rows.len());
        for r in &rows {
            // The Incoming Event's row without a Forward (LEFT JOIN): no enabled Destination.
            if let Some(f) = r.try_get::<_, Option<uuid::Uuid>>(1)? {
                forwards.push((ForwardId(f), DestinationId(r.try_get(2)?)));
            }
        }
        return Ok(Received::Stored { id, received_at: first.try_get(0)?, forwards });
    }
    // No row: the provider event id exists (the insert waited for its writer to commit).
    let row = db
        .query_opt(
            "SELECT id, received_at FROM incoming_events WHERE source_id = $1 AND provider_event_id = $2",
            &[&new.source.0, &new.provider_event_id],
        )
        .await?
        .ok_or_else(|| StoreError::Misconfigured("the ingress inserted nothing and found no incoming event for its provider event id".into()))?;
    Ok(Received::Duplicate { id: IncomingEventId(row.try_get(0)?), received_at: row.try_get(1)? })
}

/// An Incoming Event as listed: what arrived, without the body.
#[derive(Debug, Clone)]
pub struct IncomingEventSummary {
    pub id: IncomingEventId,
    pub source_id: SourceId,
    pub provider_event_id: Option<String>,
    pub method: String,
    pub content_type: Option<String>,
    pub body_sha256: Vec<u8>,
    pub body_size: i32,
    pub received_at: DateTime<Utc>,
}

const SUMMARY_COLUMNS: &str = "i.id, i.source_id, i.provider_event_id, i.method, i.content_type, i.body_sha256, octet_length(i.body), i.received_at";

fn summary_from(r: &Row) -> Result<IncomingEventSummary, StoreError> {
    Ok(IncomingEventSummary {
        id: IncomingEventId(r.try_get(0)?),
        source_id: SourceId(r.try_get(1)?),
        provider_event_id: r.try_get(2)?,
        method: r.try_get(3)?,
        content_type: r.try_get(4)?,
        body_sha256: r.try_get(5)?,
        body_size: r.try_get(6)?,
        received_at: r.try_get(7)?,
    })
}

/// An Incoming Event with the request as it arrived and its Forwards.
#[derive(Debug, Clone)]
pub struct IncomingEvent {
    pub summary: IncomingEventSummary,
    pub headers: Vec<StoredHeader>,
    pub body: Vec<u8>,
    pub forwards: Vec<Forward>,
}

/// One Forward of an Incoming Event, with its Attempts in attempt order.
#[derive(Debug, Clone)]
pub struct Forward {
    pub id: ForwardId,
    pub destination_id: DestinationId,
    pub status: DeliveryStatus,
    pub attempt_count: i32,
    pub max_attempts: i32,
    pub next_retry_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
    pub attempts: Vec<ForwardAttempt>,
}

/// One HTTP request towards a Forward.
#[derive(Debug, Clone)]
pub struct ForwardAttempt {
    pub id: AttemptId,
    pub attempt_number: i32,
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    pub status_code: Option<i32>,
    pub result: String,
    pub error_message: Option<String>,
    /// As sent, the Destination's auth redacted (see `deliveries::Attempt::request_headers`).
    pub request_headers: Option<serde_json::Value>,
    pub response_headers: Option<serde_json::Value>,
    pub response_body: Option<String>,
    pub response_truncated: bool,
}

fn status_from(text: &str) -> Result<DeliveryStatus, StoreError> {
    text.parse().map_err(|e: railhook_core::status::UnknownStatus| StoreError::Misconfigured(e.to_string()))
}

/// The Incoming Event with its Forwards and their Attempts; `None` when it is not one of the
/// project's. Two statements: the event, then its Forwards joined with their Attempts (no
/// Attempt starts a day before its Forward was made: the partitions of earlier days are
/// skipped, as for a Delivery's Attempts).
pub async fn get_incoming_event(db: &impl tokio_postgres::GenericClient, project: ProjectId, id: IncomingEventId) -> Result<Option<IncomingEvent>, StoreError> {
    let Some(row) = db
        .query_opt(
            &format!("SELECT {SUMMARY_COLUMNS}, i.headers, i.body FROM incoming_events i WHERE i.id = $1 AND i.project_id = $2"),
            &[&id.0, &project.0],
        )
        .await?
    else {
        return Ok(None);
    };
    // A row written around the ingress (e.g. `{}`) has no header list: shown as none.
    let headers = serde_json::from_value(row.try_get::<_, Json<serde_json::Value>>(8)?.0).unwrap_or_default();
    let body = row.try_get(9)?;
    let rows = db
        .query(
            "SELECT f.id, f.destination_id, f.status::text, f.attempt_count, f.max_attempts, f.next_retry_at, f.last_error,
                    f.created_at, f.completed_at,
                    a.id, a.attempt_number, a.started_at, a.duration_ms, a.status_code, a.result, a.error_message,
                    a.response_body, a.response_truncated, a.request_headers, a.response_headers
             FROM forwards f LEFT JOIN attempts a ON a.forward_id = f.id AND a.started_at >= f.created_at - interval '1 day'
             WHERE f.incoming_event_id = $1 AND f.project_id = $2
             ORDER BY f.id, a.attempt_number, a.id",
            &[&id.0, &project.0],
        )
        .await?;
    let mut forwards: Vec<Forward> = Vec::new();
    for r in &rows {
        let forward_id = ForwardId(r.try_get(0)?);
        if forwards.last().is_none_or(|f| f.id != forward_id) {
            forwards.push(Forward {
                id: forward_id,
                destination_id: DestinationId(r.try_get(1)?),
                status: status_from(r.try_get(2)?)?,
                attempt_count: r.try_get(3)?,
                max_attempts: r.try_get(4)?,
                next_retry_at: r.try_get(5)?,
                last_error: r.try_get(6)?,
                created_at: r.try_get(7)?,
                completed_at: r.try_get(8)?,
                attempts: Vec::new(),
            });
        }
        if let (Some(attempt), Some(forward)) = (r.try_get::<_, Option<uuid::Uuid>>(9)?, forwards.last_mut()) {
            forward.attempts.push(ForwardAttempt {
                id: AttemptId(attempt),
                attempt_number: r.try_get(10)?,
                started_at: r.try_get(11)?,
                duration_ms: r.try_get(12)?,
                status_code: r.try_get(13)?,
                result: r.try_get(14)?,
                error_message: r.try_get(15)?,
                response_body: r.try_get(16)?,
                response_truncated: r.try_get(17)?,
                request_headers: r.try_get::<_, Option<Json<serde_json::Value>>>(18)?.map(|j| j.0),
                response_headers: r.try_get::<_, Option<Json<serde_json::Value>>>(19)?.map(|j| j.0),
            });
        }
    }
    Ok(Some(IncomingEvent { summary: summary_from(&row)?, headers, body, forwards }))
}

#[derive(Debug, Default)]
pub struct IncomingEventFilter {
    pub source_id: Option<SourceId>,
    pub provider_event_id: Option<String>,
    pub received_after: Option<DateTime<Utc>>,
    pub received_before: Option<DateTime<Utc>>,
    pub after: Option<IncomingEventId>,
    pub limit: i64,
}

/// The project's Incoming Events in id (= arrival) order after the cursor.
pub async fn list_incoming_events(
    db: &impl tokio_postgres::GenericClient,
    project: ProjectId,
    f: &IncomingEventFilter,
) -> Result<Vec<IncomingEventSummary>, StoreError> {
    let rows = db
        .query(
            &format!(
                "SELECT {SUMMARY_COLUMNS} FROM incoming_events i
                 WHERE i.project_id = $1
                   AND ($2::uuid IS NULL OR i.source_id = $2)
                   AND ($3::text IS NULL OR i.provider_event_id = $3)
                   AND ($4::timestamptz IS NULL OR i.received_at >= $4)
                   AND ($5::timestamptz IS NULL OR i.received_at < $5)
                   AND ($6::uuid IS NULL OR i.id > $6)
                 ORDER BY i.id LIMIT $7"
            ),
            &[
                &project.0,
                &f.source_id.map(|s| s.0),
                &f.provider_event_id,
                &f.received_after,
                &f.received_before,
                &f.after.map(|a| a.0),
                &f.limit,
            ],
        )
        .await?;
    rows.iter().map(summary_from).collect()
}

/// Everything an Attempt of a Forward needs: the Forward's ladder state, where and how to send
/// (the Destination, with its credentials) and what (the Incoming Event as it arrived).
#[derive(Debug, Clone)]
pub struct ForwardToSend {
    pub id: ForwardId,
    pub project_id: ProjectId,
    pub status: DeliveryStatus,
    pub attempt_count: i32,
    pub max_attempts: i32,
    pub retry_delays: Vec<i32>,
    pub timeout_seconds: i32,
    pub ladder_started_at: DateTime<Utc>,
    pub destination: Destination,
    pub incoming_event_id: IncomingEventId,
    pub provider_event_id: Option<String>,
    pub method: String,
    pub headers: Vec<StoredHeader>,
    pub body: Vec<u8>,
    pub content_type: Option<String>,
    pub received_at: DateTime<Utc>,
}

/// Reads a Forward with its Destination and Incoming Event, in one statement; `None` when it
/// does not exist (deleted with its Source or Destination). It does not claim: the worker
/// claims first (the row is the truth), then reads this to build the request.
pub async fn forward_to_send<C: deadpool_postgres::GenericClient + Sync>(db: &C, id: ForwardId) -> Result<Option<ForwardToSend>, StoreError> {
    let statement = db
        .prepare_cached(&format!(
            "SELECT {DESTINATION_COLUMNS},
                    f.id, f.project_id, f.status::text, f.attempt_count, f.max_attempts, f.retry_delays, f.timeout_seconds,
                    f.ladder_started_at, i.id, i.provider_event_id, i.method, i.headers, i.body, i.content_type, i.received_at
             FROM forwards f
             JOIN destinations d ON d.id = f.destination_id
             JOIN incoming_events i ON i.id = f.incoming_event_id
             WHERE f.id = $1"
        ))
        .await?;
    let Some(r) = db.query_opt(&statement, &[&id.0]).await? else {
        return Ok(None);
    };
    let destination = destination_from(&r, 0)?;
    let at = 8;
    Ok(Some(ForwardToSend {
        id: ForwardId(r.try_get(at)?),
        project_id: ProjectId(r.try_get(at + 1)?),
        status: status_from(r.try_get(at + 2)?)?,
        attempt_count: r.try_get(at + 3)?,
        max_attempts: r.try_get(at + 4)?,
        retry_delays: r.try_get(at + 5)?,
        timeout_seconds: r.try_get(at + 6)?,
        ladder_started_at: r.try_get(at + 7)?,
        destination,
        incoming_event_id: IncomingEventId(r.try_get(at + 8)?),
        provider_event_id: r.try_get(at + 9)?,
        method: r.try_get(at + 10)?,
        headers: serde_json::from_value(r.try_get::<_, Json<serde_json::Value>>(at + 11)?.0).unwrap_or_default(),
        body: r.try_get(at + 12)?,
        content_type: r.try_get(at + 13)?,
        received_at: r.try_get(at + 14)?,
    }))
}
