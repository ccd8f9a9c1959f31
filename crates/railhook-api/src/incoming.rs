//! `/v1/incoming-events`: what providers sent, as it arrived, with the Forwards to each
//! Destination and their Attempts.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::Json;
use base64::Engine;
use chrono::{DateTime, Utc};
use railhook_core::{AttemptId, DestinationId, DeliveryStatus, ForwardId, IncomingEventId, SourceId};
use railhook_store::incoming::{self, IncomingEventFilter, IncomingEventSummary, StoredHeader};
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ApiResult};
use crate::extract::{parse_id, Project};
use crate::pagination::{page, List, PageParams};
use crate::AppState;
#[allow(unused_imports)] // The shared error responses of the OpenAPI attributes below.
use crate::error::responses::*;

/// One request header as it arrived; a value that is not UTF-8 comes as `value_base64`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct IncomingHeader {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_base64: Option<String>,
}

impl From<StoredHeader> for IncomingHeader {
    fn from(h: StoredHeader) -> IncomingHeader {
        IncomingHeader { name: h.name, value: h.value, value_base64: h.value_base64 }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ForwardAttempt {
    #[schema(value_type = String)]
    pub id: AttemptId,
    pub attempt_number: i32,
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    pub status_code: Option<i32>,
    pub result: String,
    pub error_message: Option<String>,
    /// The request's headers as sent, lower-case name to value; the Destination's auth (and
    /// any header named like a credential) shown as `<redacted>`. Null for Attempts recorded
    /// before request headers were.
    #[schema(value_type = Option<Object>)]
    pub request_headers: Option<serde_json::Value>,
    /// The response's headers, lower-case name to value; `{}` when no response arrived.
    #[schema(value_type = Option<Object>)]
    pub response_headers: Option<serde_json::Value>,
    /// The start of the response body (up to 64 KiB, as UTF-8).
    pub response_body: Option<String>,
    /// The body was longer than what is stored (or reading it stalled or failed).
    pub response_truncated: bool,
}

/// The obligation to get the Incoming Event to one Destination.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Forward {
    #[schema(value_type = String)]
    pub id: ForwardId,
    #[schema(value_type = String)]
    pub destination_id: DestinationId,
    /// PENDING, PROCESSING, SUCCESS or FAILED.
    #[schema(value_type = String)]
    pub status: DeliveryStatus,
    pub attempt_count: i32,
    pub max_attempts: i32,
    pub next_retry_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
    /// In attempt order.
    pub attempts: Vec<ForwardAttempt>,
}

impl From<incoming::Forward> for Forward {
    fn from(f: incoming::Forward) -> Forward {
        Forward {
            id: f.id,
            destination_id: f.destination_id,
            status: f.status,
            attempt_count: f.attempt_count,
            max_attempts: f.max_attempts,
            next_retry_at: f.next_retry_at,
            last_error: f.last_error,
            created_at: f.created_at,
            completed_at: f.completed_at,
            attempts: f
                .attempts
                .into_iter()
                .map(|a| ForwardAttempt {
                    id: a.id,
                    attempt_number: a.attempt_number,
                    started_at: a.started_at,
                    duration_ms: a.duration_ms,
                    status_code: a.status_code,
                    result: a.result,
                    error_message: a.error_message,
                    request_headers: a.request_headers,
                    response_headers: a.response_headers,
                    response_body: a.response_body,
                    response_truncated: a.response_truncated,
                })
                .collect(),
        }
    }
}

/// An Incoming Event. Lists carry what arrived without the request itself; `GET
/// /v1/incoming-events/{id}` adds the headers, the body and the Forwards.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct IncomingEvent {
    #[schema(value_type = String)]
    pub id: IncomingEventId,
    #[schema(value_type = String)]
    pub source_id: SourceId,
    /// The provider's id it was deduped on; null when the provider gave none.
    pub provider_event_id: Option<String>,
    pub method: String,
    pub content_type: Option<String>,
    /// SHA-256 of the body as received, hex.
    pub body_sha256: String,
    pub body_size: i32,
    pub received_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<Vec<IncomingHeader>>,
    /// The body as text, when it is UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// The body's exact bytes, base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_base64: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forwards: Option<Vec<Forward>>,
}

impl From<IncomingEventSummary> for IncomingEvent {
    fn from(s: IncomingEventSummary) -> IncomingEvent {
        IncomingEvent {
            id: s.id,
            source_id: s.source_id,
            provider_event_id: s.provider_event_id,
            method: s.method,
            content_type: s.content_type,
            body_sha256: hex::encode(s.body_sha256),
            body_size: s.body_size,
            received_at: s.received_at,
            headers: None,
            body: None,
            body_base64: None,
            forwards: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub source_id: Option<String>,
    pub provider_event_id: Option<String>,
    pub received_after: Option<String>,
    pub received_before: Option<String>,
    pub limit: Option<String>,
    pub cursor: Option<String>,
}

fn time(field: &'static str, raw: Option<String>) -> Result<Option<DateTime<Utc>>, ApiError> {
    raw.map(|r| {
        DateTime::parse_from_rfc3339(&r)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|_| ApiError::bad_request("invalid_query", format!("{field} must be an RFC 3339 time")).with_field(field))
    })
    .transpose()
}

/// The project's Incoming Events in arrival order, a page at a time.
#[utoipa::path(get, path = "/v1/incoming-events", tag = "incoming-events",
    params(("source_id" = Option<crate::schema::SourceId>, Query, description = "src_..."), ("provider_event_id" = Option<String>, Query, description = "The provider's event id"),
           ("received_after" = Option<crate::schema::Time>, Query, description = "RFC 3339, inclusive"), ("received_before" = Option<crate::schema::Time>, Query, description = "RFC 3339, exclusive"),
           ("limit" = Option<crate::schema::Limit>, Query, description = "1-200, default 50"), ("cursor" = Option<crate::schema::IncomingEventId>, Query, description = "next_cursor of the previous page")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = crate::pagination::List<IncomingEvent>), ListErrors))]
pub async fn list(
    Project(principal): Project,
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> ApiResult<Json<List<IncomingEvent>>> {
    let Query(q) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let paging = PageParams { limit: q.limit, cursor: q.cursor };
    let source_id = q
        .source_id
        .map(|s| s.parse::<SourceId>().map_err(|e| ApiError::bad_request("invalid_query", format!("source_id: {e}")).with_field("source_id")))
        .transpose()?;
    let filter = IncomingEventFilter {
        source_id,
        provider_event_id: q.provider_event_id,
        received_after: time("received_after", q.received_after)?,
        received_before: time("received_before", q.received_before)?,
        after: paging.cursor::<IncomingEventId>()?,
        limit: paging.limit()? + 1,
    };
    let limit = paging.limit()?;
    // No stored id holds a NUL (Postgres text cannot), and Postgres refuses one as a parameter.
    if filter.provider_event_id.as_deref().is_some_and(|id| id.contains('\0')) {
        return Ok(Json(List { data: Vec::new(), next_cursor: None }));
    }
    let client = state.pool.get().await?;
    let rows = incoming::list_incoming_events(&**client, principal.project_id, &filter).await?;
    let views = rows.into_iter().map(IncomingEvent::from).collect();
    Ok(Json(page(views, limit, |e: &IncomingEvent| e.id.to_string())))
}

/// The Incoming Event as it arrived, with its Forwards and their Attempts.
#[utoipa::path(get, path = "/v1/incoming-events/{id}", tag = "incoming-events",
    params(("id" = crate::schema::IncomingEventId, Path, description = "Incoming Event id (ine_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = IncomingEvent), ByIdErrors))]
pub async fn get(Project(principal): Project, State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<IncomingEvent>> {
    let id: IncomingEventId = parse_id("id", &id)?;
    let client = state.pool.get().await?;
    let found = incoming::get_incoming_event(&**client, principal.project_id, id).await?.ok_or_else(|| ApiError::not_found("incoming event"))?;
    let mut view = IncomingEvent::from(found.summary);
    view.headers = Some(found.headers.into_iter().map(IncomingHeader::from).collect());
    view.body = String::from_utf8(found.body.clone()).ok();
    view.body_base64 = Some(base64::engine::general_purpose::STANDARD.encode(&found.body));
    view.forwards = Some(found.forwards.into_iter().map(Forward::from).collect());
    Ok(Json(view))
}
