//! `/v1/events`: ingest (with `Idempotency-Key`) and reading.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use railhook_core::pattern::{candidate_patterns, EventType};
use railhook_core::{EventId, TraceContext};
use railhook_telemetry::traces;
use tracing::Instrument as _;
use railhook_store::events::{self, EventFilter, IngestOutcome};

use crate::ingest::Pending;
use serde::Deserialize;

use crate::error::{ApiError, ApiResult};
use crate::extract::{invalid_key, parse_id, ApiJson, ApiKey, Project};
use crate::pagination::{page, PageParams};
use crate::AppState;
#[allow(unused_imports)] // The shared error responses of the OpenAPI attributes below.
use crate::error::responses::*;

pub use railhook_store::events::IDEMPOTENCY_KEY_MAX;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEvent {
    #[serde(rename = "type")]
    #[schema(value_type = crate::schema::EventType)]
    pub event_type: String,
    #[schema(schema_with = crate::schema::payload)]
    pub payload: serde_json::Value,
}

/// `Idempotency-Key`: 1 to [`IDEMPOTENCY_KEY_MAX`] visible ASCII characters.
pub struct IdempotencyKey;

impl utoipa::PartialSchema for IdempotencyKey {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .pattern(Some("^[!-~]+$"))
            .min_length(Some(1))
            .max_length(Some(IDEMPOTENCY_KEY_MAX))
            .into()
    }
}

impl utoipa::ToSchema for IdempotencyKey {}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else { return Ok(None) };
    let bad = || {
        ApiError::bad_request(
            "invalid_idempotency_key",
            format!("Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_MAX} visible ASCII characters"),
        )
        .with_field("idempotency-key")
    };
    let text = value.to_str().map_err(|_| bad())?;
    if !events::valid_idempotency_key(text) {
        return Err(bad());
    }
    Ok(Some(text))
}

/// Ingest an Event: one transaction writes the Event, a Delivery per matching enabled
/// Subscription and an Outbox row per Delivery.
#[utoipa::path(post, path = "/v1/events", tag = "events", request_body = CreateEvent,
    params(("Idempotency-Key" = Option<IdempotencyKey>, Header, description = "Unique per project; a retry returns the same Event")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses(
        (status = 201, description = "Created", body = railhook_store::events::Event),
        (status = 200, description = "Replayed: the Event this Idempotency-Key created (header Idempotent-Replayed: true)", body = railhook_store::events::Event),
        (status = 409, description = "Idempotency-Key used with another type or payload", body = crate::error::ErrorBody),
        BodyErrors))]
pub async fn create(
    key: ApiKey,
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<ApiJson<CreateEvent>, ApiError>,
) -> ApiResult<Response> {
    let new = match validate(&key, &headers, body) {
        Ok(new) => new,
        // Any refusal of the request waits for the key's lookup: 401 comes first.
        Err(refusal) => {
            key.authenticate(&state).await?;
            return Err(refusal);
        }
    };
    // Issue 33: the ingest span continues the caller's trace (a malformed traceparent is
    // ignored: a new trace). What the Event keeps, and its announcements carry, is this span's
    // context, or with export off the caller's unchanged.
    let remote = traces::incoming(&headers);
    let span = tracing::info_span!(target: traces::TARGET, parent: None, traces::span::INGEST,
        otel.kind = "server", http.request.method = "POST", http.route = "/v1/events", railhook.event_type = %new.body.event_type);
    traces::continue_from(&span, remote.as_ref());
    let trace = traces::context_of(&span, remote.as_ref());
    let outcome = async {
        // Backpressure: while the workers are behind, wait here (no connection held).
        state.pacer.hold().await;
        // In a batch with the POSTs beside it ([`crate::ingest`]).
        state.ingest.ingest(new.into_pending(trace)).await
    }
    .instrument(span.clone())
    .await;
    if let Err(e) = &outcome {
        traces::fail(&span, e.code);
    }
    match outcome? {
        IngestOutcome::Created(event) => Ok((StatusCode::CREATED, Json(event)).into_response()),
        IngestOutcome::Replayed(event) => {
            let mut resp = (StatusCode::OK, Json(event)).into_response();
            resp.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
            Ok(resp)
        }
        IngestOutcome::KeyReused => Err(ApiError::new(
            StatusCode::CONFLICT,
            "idempotency_key_reused",
            "this Idempotency-Key was used with a different type or payload",
        )
        .with_field("idempotency-key")),
        IngestOutcome::Unauthenticated => Err(invalid_key()),
    }
}

/// A POST checked before it reaches Postgres.
struct Valid<'a> {
    key: &'a str,
    idempotency_key: Option<&'a str>,
    body: CreateEvent,
    candidate_patterns: Vec<String>,
}

impl Valid<'_> {
    fn into_pending(self, trace: Option<TraceContext>) -> Pending {
        Pending {
            api_key: self.key.to_string(),
            event_type: self.body.event_type,
            payload: self.body.payload,
            idempotency_key: self.idempotency_key.map(str::to_string),
            candidate_patterns: self.candidate_patterns,
            trace,
        }
    }
}

fn validate<'a>(key: &'a ApiKey, headers: &'a HeaderMap, body: Result<ApiJson<CreateEvent>, ApiError>) -> Result<Valid<'a>, ApiError> {
    let idempotency_key = idempotency_key(headers)?;
    let ApiJson(body) = body?;
    let event_type = EventType::parse(&body.event_type).map_err(|e| ApiError::invalid("type", e.to_string()))?;
    if !body.payload.is_object() {
        return Err(ApiError::invalid("payload", "payload must be a JSON object"));
    }
    Ok(Valid { key: &key.0, idempotency_key, candidate_patterns: candidate_patterns(&event_type), body })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
    pub limit: Option<String>,
    pub cursor: Option<String>,
}

fn time_param(field: &'static str, raw: &Option<String>) -> Result<Option<DateTime<Utc>>, ApiError> {
    raw.as_deref()
        .map(|s| {
            DateTime::parse_from_rfc3339(s).map(|t| t.with_timezone(&Utc)).map_err(|_| {
                ApiError::bad_request("invalid_query", format!("{field} must be an RFC 3339 time such as 2026-01-31T12:00:00Z")).with_field(field)
            })
        })
        .transpose()
}

/// List Events, oldest first, filtered by type and time range.
#[utoipa::path(get, path = "/v1/events", tag = "events",
    params(("type" = Option<crate::schema::EventType>, Query, description = "An exact event type"), ("from" = Option<crate::schema::Time>, Query, description = "RFC 3339, inclusive"),
           ("to" = Option<crate::schema::Time>, Query, description = "RFC 3339, exclusive"), ("limit" = Option<crate::schema::Limit>, Query, description = "1-200, default 50"),
           ("cursor" = Option<crate::schema::EventId>, Query, description = "next_cursor of the previous page")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = crate::pagination::List<railhook_store::events::Event>), ListErrors))]
pub async fn list(
    Project(principal): Project,
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Response> {
    let Query(q) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let paging = PageParams { limit: q.limit.clone(), cursor: q.cursor.clone() };
    let limit = paging.limit()?;
    if let Some(t) = &q.event_type {
        EventType::parse(t).map_err(|e| ApiError::bad_request("invalid_query", e.to_string()).with_field("type"))?;
    }
    let filter = EventFilter {
        event_type: q.event_type.clone(),
        from: time_param("from", &q.from)?,
        to: time_param("to", &q.to)?,
        after: paging.cursor::<EventId>()?,
        limit: limit + 1,
    };
    let client = state.pool.get().await?;
    let rows = events::list_events(&client, principal.project_id, &filter).await?;
    Ok(Json(page(rows, limit, |e| e.id.to_string())).into_response())
}

/// An Event with its Deliveries and their statuses.
#[utoipa::path(get, path = "/v1/events/{id}", tag = "events",
    params(("id" = crate::schema::EventId, Path, description = "Event id (evt_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = railhook_store::events::Event), ByIdErrors))]
pub async fn get(Project(principal): Project, State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    let id: EventId = parse_id("id", &id)?;
    let client = state.pool.get().await?;
    let event = events::get_event(&client, principal.project_id, id).await?.ok_or_else(|| ApiError::not_found("event"))?;
    Ok(Json(event).into_response())
}
