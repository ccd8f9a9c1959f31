//! Forwards a person acts on: the failed Forwards (the incoming direction's Failed Messages,
//! listed and retried as `/v1/failed-messages` does for Deliveries), the retry of one failed
//! Forward, and the replay of an Incoming Event (a *new* Forward per Destination).
//!
//! A retry adds Attempts (`extra_attempts`, 1 to 20, default 1) beyond those made, restarts
//! the 24 h window of the hard cap and announces the Forward through the Outbox in the same
//! statement; its `Idempotency-Key` (the Forward id) stays. A replay makes new Forwards with
//! new ids (so a new `Idempotency-Key`) and the incoming ladder
//! (`railhook_store::lifecycle::forward`).

use std::ops::RangeInclusive;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use chrono::{DateTime, Utc};
use railhook_core::{DestinationId, ForwardId, IncomingEventId, SourceId};
use railhook_store::lifecycle::forward::{self, FailedForwardFilter, ForwardRetryOutcome, ForwardSelection, ForwardSummary, ReplayOutcome, SkippedForward};
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ApiResult};
use crate::extract::{optional_json, parse_id, ApiJson, Project};
use crate::pagination::{page, List, PageParams};
use crate::AppState;
#[allow(unused_imports)] // The shared error responses of the OpenAPI attributes below.
use crate::error::responses::*;

/// Attempts a retry adds; 1 when not given.
pub const EXTRA_ATTEMPTS: RangeInclusive<i64> = 1..=20;
/// Ids one bulk retry may list, and Forwards one bulk retry by filter may touch.
pub const MAX_BULK_RETRY: usize = 1000;

const TIME_HINT: &str = "an RFC 3339 time such as 2026-01-31T12:00:00Z";

fn extra_attempts(value: Option<i64>) -> Result<i32, ApiError> {
    let n = value.unwrap_or(1);
    if !EXTRA_ATTEMPTS.contains(&n) {
        return Err(ApiError::invalid("extra_attempts", format!("extra_attempts must be from {} to {}", EXTRA_ATTEMPTS.start(), EXTRA_ATTEMPTS.end())));
    }
    Ok(n as i32)
}

fn parse_time(raw: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(raw).ok().map(|t| t.with_timezone(&Utc))
}

/// A query parameter: 400 `invalid_query` naming it.
fn bad_query(field: &str, message: String) -> ApiError {
    ApiError::bad_request("invalid_query", message).with_field(field)
}

fn query_rejection(e: QueryRejection) -> ApiError {
    let text = e.body_text();
    let field = text.split_once("field `").and_then(|(_, rest)| rest.split('`').next()).map(str::to_string);
    let error = ApiError::bad_request("invalid_query", text);
    match field {
        Some(f) => error.with_field(f),
        None => error,
    }
}

fn query_id<T: std::str::FromStr>(field: &'static str, raw: Option<&str>) -> Result<Option<T>, ApiError>
where
    T::Err: std::fmt::Display,
{
    raw.map(|s| s.parse::<T>().map_err(|e| bad_query(field, format!("{field}: {e}")))).transpose()
}

/// A checked time range `[after, before)`.
type Range = (Option<DateTime<Utc>>, Option<DateTime<Utc>>);

/// A time range `[after, before)`, each checked; `error` makes the 4xx of the named field.
fn range(after: (&str, Option<&str>), before: (&str, Option<&str>), error: fn(&str, String) -> ApiError) -> Result<Range, ApiError> {
    let time = |(field, raw): (&str, Option<&str>)| raw.map(|s| parse_time(s).ok_or_else(|| error(field, format!("{field} must be {TIME_HINT}")))).transpose();
    let (a, b) = (time(after)?, time(before)?);
    if matches!((a, b), (Some(a), Some(b)) if b <= a) {
        // A rule between two fields the OpenAPI document cannot state: its own code.
        let mut e = error(before.0, format!("{} must be later than {}: the range is empty", before.0, after.0));
        e.code = "invalid_range";
        return Err(e);
    }
    Ok((a, b))
}

// ---- One Forward -------------------------------------------------------------------------

#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryForward {
    /// Attempts to add beyond those made: 1 to 20, default 1.
    #[schema(schema_with = extra_attempts_schema)]
    #[serde(default, deserialize_with = "crate::extract::int")]
    pub extra_attempts: Option<i64>,
}

/// Put a failed Forward back on its Retry Ladder: PENDING, due now, with `extra_attempts`
/// more Attempts and a fresh 24 h window, announced in the same statement. Its
/// `Idempotency-Key` stays the Forward id. The body is optional.
#[utoipa::path(post, path = "/v1/forwards/{id}/retry", tag = "forwards",
    request_body(content = RetryForward, description = "Optional; may be left out entirely"),
    params(("id" = crate::schema::ForwardId, Path, description = "Forward id (fwd_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 202, description = "Back on the ladder", body = ForwardSummary),
        (status = 409, description = "Not FAILED (code not_failed; the message gives the status)", body = crate::error::ErrorBody),
        BodyByIdErrors))]
pub async fn retry(
    Project(principal): Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<(StatusCode, Json<ForwardSummary>)> {
    let id: ForwardId = parse_id("id", &id)?;
    let body: RetryForward = optional_json(&headers, body).await?;
    let extra = extra_attempts(body.extra_attempts)?;
    let client = state.pool.get().await?;
    match forward::retry(&**client, principal.project_id, id, extra).await? {
        ForwardRetryOutcome::Retried(f) => Ok((StatusCode::ACCEPTED, Json(*f))),
        ForwardRetryOutcome::NotFailed(status) => {
            Err(ApiError::new(StatusCode::CONFLICT, "not_failed", format!("only a FAILED forward can be retried; this one is {status}")))
        }
        ForwardRetryOutcome::NotFound => Err(ApiError::not_found("forward")),
    }
}

// ---- Failed Forwards ---------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailedQuery {
    pub source_id: Option<String>,
    pub destination_id: Option<String>,
    pub completed_after: Option<String>,
    pub completed_before: Option<String>,
    pub limit: Option<String>,
    pub cursor: Option<String>,
}

/// The failed Forwards: the project's FAILED Forwards in id (= creation) order, filtered by
/// Source, Destination and when they failed.
#[utoipa::path(get, path = "/v1/failed-forwards", tag = "forwards",
    params(("source_id" = Option<crate::schema::SourceId>, Query, description = "src_..."), ("destination_id" = Option<crate::schema::DestinationId>, Query, description = "dst_..."),
           ("completed_after" = Option<crate::schema::Time>, Query, description = "RFC 3339, inclusive: failed at or after"), ("completed_before" = Option<crate::schema::Time>, Query, description = "RFC 3339, exclusive"),
           ("limit" = Option<crate::schema::Limit>, Query, description = "1-200, default 50"), ("cursor" = Option<crate::schema::ForwardId>, Query, description = "next_cursor of the previous page")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = crate::pagination::List<ForwardSummary>), ListErrors))]
pub async fn failed(
    Project(principal): Project,
    State(state): State<AppState>,
    query: Result<Query<FailedQuery>, QueryRejection>,
) -> ApiResult<Json<List<ForwardSummary>>> {
    let Query(q) = query.map_err(query_rejection)?;
    let paging = PageParams { limit: q.limit, cursor: q.cursor };
    let limit = paging.limit()?;
    let (completed_after, completed_before) =
        range(("completed_after", q.completed_after.as_deref()), ("completed_before", q.completed_before.as_deref()), bad_query)?;
    let filter = FailedForwardFilter {
        source_id: query_id::<SourceId>("source_id", q.source_id.as_deref())?,
        destination_id: query_id::<DestinationId>("destination_id", q.destination_id.as_deref())?,
        completed_after,
        completed_before,
    };
    let after = paging.cursor::<ForwardId>()?;
    let client = state.pool.get().await?;
    let rows = forward::list_failed(&**client, principal.project_id, &filter, after, limit + 1).await?;
    Ok(Json(page(rows, limit, |f| f.id.to_string())))
}

/// Which failed Forwards a bulk retry by filter takes; every field is optional and `{}`
/// takes them all (up to `limit`).
#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailedForwardsFilter {
    #[schema(value_type = Option<crate::schema::SourceId>)]
    pub source_id: Option<SourceId>,
    #[schema(value_type = Option<crate::schema::DestinationId>)]
    pub destination_id: Option<DestinationId>,
    /// RFC 3339, inclusive.
    #[schema(value_type = Option<crate::schema::Time>)]
    pub completed_after: Option<String>,
    /// RFC 3339, exclusive; later than `completed_after` (422 `invalid_range` otherwise).
    #[schema(value_type = Option<crate::schema::Time>)]
    pub completed_before: Option<String>,
}

fn extra_attempts_schema() -> utoipa::openapi::Object {
    crate::schema::nullable_integer(EXTRA_ATTEMPTS).build()
}

/// Exactly one of `ids` and `filter` (a `oneOf` of the two shapes in the document).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkForwardRetry {
    /// Up to 1000 Forward ids. Unknown ones, other projects' and those not FAILED are
    /// reported in `skipped`, not refused.
    pub ids: Option<Vec<ForwardId>>,
    pub filter: Option<FailedForwardsFilter>,
    /// Attempts to add to each: 1 to 20, default 1.
    #[serde(default, deserialize_with = "crate::extract::int")]
    pub extra_attempts: Option<i64>,
    /// With `filter` only: how many at most, 1 to 1000, default 1000 (oldest first). Call
    /// again until `retried` is 0 to drain a larger backlog.
    #[serde(default, deserialize_with = "crate::extract::int")]
    pub limit: Option<i64>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BulkForwardRetried {
    /// How many were put back on the ladder.
    pub retried: usize,
    /// Their ids, in id order.
    #[schema(value_type = Vec<String>)]
    pub ids: Vec<ForwardId>,
    /// For a retry by ids: those not retried, and why.
    pub skipped: Vec<SkippedForward>,
}

impl utoipa::PartialSchema for BulkForwardRetry {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        crate::deliveries::bulk_retry_schema::<crate::schema::ForwardId>("Forward", "FailedForwardsFilter", MAX_BULK_RETRY, EXTRA_ATTEMPTS)
    }
}

impl utoipa::ToSchema for BulkForwardRetry {}

fn ids_or_filter(field: &str, message: &str) -> ApiError {
    ApiError::bad_request("ids_or_filter", message).with_field(field)
}

fn selection_ids(ids: &[ForwardId], limit: Option<i64>) -> Result<(), ApiError> {
    if limit.is_some() {
        return Err(ApiError::invalid("limit", "limit goes with filter; with ids, every listed forward is retried"));
    }
    if ids.is_empty() || ids.len() > MAX_BULK_RETRY {
        return Err(ApiError::invalid("ids", format!("ids must list 1 to {MAX_BULK_RETRY} forward ids")));
    }
    Ok(())
}

fn selection_filter(f: FailedForwardsFilter, limit: Option<i64>) -> Result<(FailedForwardFilter, i64), ApiError> {
    let limit = limit.unwrap_or(MAX_BULK_RETRY as i64);
    if !(1..=MAX_BULK_RETRY as i64).contains(&limit) {
        return Err(ApiError::invalid("limit", format!("limit must be from 1 to {MAX_BULK_RETRY}")));
    }
    let (completed_after, completed_before) = range(
        ("filter.completed_after", f.completed_after.as_deref()),
        ("filter.completed_before", f.completed_before.as_deref()),
        |field, m| ApiError::invalid(field, m),
    )?;
    Ok((FailedForwardFilter { source_id: f.source_id, destination_id: f.destination_id, completed_after, completed_before }, limit))
}

/// Retry many failed Forwards in one statement: the listed `ids`, or those matching
/// `filter` (at most `limit`). Forwards another request is changing at that moment are
/// skipped rather than waited for.
#[utoipa::path(post, path = "/v1/failed-forwards/retry", tag = "forwards", request_body = BulkForwardRetry,
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 202, description = "Those retried, and (by ids) those skipped", body = BulkForwardRetried),
        (status = 400, description = "Malformed JSON, or not exactly one of ids and filter (code ids_or_filter)", body = crate::error::ErrorBody), AuthErrors, BodyChecks))]
pub async fn retry_failed(
    Project(principal): Project,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<BulkForwardRetry>,
) -> ApiResult<(StatusCode, Json<BulkForwardRetried>)> {
    let extra = extra_attempts(body.extra_attempts)?;
    let filter;
    let selection = match (body.ids.as_deref(), body.filter) {
        (Some(_), Some(_)) => return Err(ids_or_filter("filter", "give either ids or filter, not both")),
        (None, None) => return Err(ids_or_filter("ids", "give ids (a list of forward ids) or filter (which failed Forwards to retry)")),
        (Some(ids), None) => {
            selection_ids(ids, body.limit)?;
            ForwardSelection::Ids(ids)
        }
        (None, Some(f)) => {
            let limit;
            (filter, limit) = selection_filter(f, body.limit)?;
            ForwardSelection::Filter(&filter, limit)
        }
    };
    let client = state.pool.get().await?;
    let outcome = forward::retry_many(&**client, principal.project_id, selection, extra).await?;
    Ok((StatusCode::ACCEPTED, Json(BulkForwardRetried { retried: outcome.retried.len(), ids: outcome.retried, skipped: outcome.skipped })))
}

// ---- Replay ------------------------------------------------------------------------------

#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayIncomingEvent {
    /// One Destination of the Incoming Event's Source (enabled); left out: every enabled
    /// Destination of the Source.
    #[schema(value_type = Option<crate::schema::DestinationId>)]
    pub destination_id: Option<DestinationId>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Replayed {
    /// The new Forwards, announced; empty when the Source has no enabled Destination.
    pub forwards: Vec<ForwardSummary>,
}

/// Replay an Incoming Event: a new Forward (new id, so a new `Idempotency-Key`, and a fresh
/// ladder) to every enabled Destination of its Source, or to the one named, even if a Forward
/// to it exists already. The body is optional.
#[utoipa::path(post, path = "/v1/incoming-events/{id}/replay", tag = "incoming-events",
    request_body(content = ReplayIncomingEvent, description = "Optional; may be left out entirely"),
    params(("id" = crate::schema::IncomingEventId, Path, description = "Incoming Event id (ine_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 202, description = "New Forwards, announced", body = Replayed),
        (status = 409, description = "The Destination named is disabled (code destination_disabled)", body = crate::error::ErrorBody),
        BodyByIdErrors))]
pub async fn replay(
    Project(principal): Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<(StatusCode, Json<Replayed>)> {
    let id: IncomingEventId = parse_id("id", &id)?;
    let body: ReplayIncomingEvent = optional_json(&headers, body).await?;
    let client = state.pool.get().await?;
    match forward::replay(&**client, principal.project_id, id, body.destination_id).await? {
        ReplayOutcome::Replayed(forwards) => Ok((StatusCode::ACCEPTED, Json(Replayed { forwards }))),
        ReplayOutcome::NotFound => Err(ApiError::not_found("incoming event")),
        ReplayOutcome::DestinationNotFound => Err(ApiError::new(StatusCode::NOT_FOUND, "not_found", "destination_id is not a Destination of this Incoming Event's Source").with_field("destination_id")),
        ReplayOutcome::DestinationDisabled => Err(ApiError::new(StatusCode::CONFLICT, "destination_disabled", "the Destination is disabled: enable it, then replay").with_field("destination_id")),
    }
}
