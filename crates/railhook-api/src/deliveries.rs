//! `/v1/deliveries` and `/v1/failed-messages`: reading Deliveries and their Attempts, the
//! Failed Messages (DLQ), and putting Failed Messages back on the Retry Ladder, one at a
//! time or in bulk.
//!
//! A retry adds Attempts (`extra_attempts`, 1 to 20, default 1) beyond those already made,
//! restarts the ladder window the hard cap is measured from, and announces the Delivery
//! through the Outbox in the same statement (`railhook_store::deliveries`).

use std::ops::RangeInclusive;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use chrono::{DateTime, Utc};
use railhook_core::pattern::EventType;
use railhook_core::{AttemptId, DeliveryId, DeliveryStatus, EndpointId, EventId};
use railhook_store::deliveries::{
    self, Attempt, BulkSelection, Delivery, DeliveryFilter, FailedFilter, FailedMessage, RetryOutcome, SkippedDelivery,
};
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ApiResult};
use crate::extract::{parse_id, ApiJson, Project};
use crate::pagination::{page, List, PageParams};
use crate::AppState;
#[allow(unused_imports)] // The shared error responses of the OpenAPI attributes below.
use crate::error::responses::*;

/// Attempts a retry adds; 1 when not given.
pub const EXTRA_ATTEMPTS: RangeInclusive<i64> = 1..=20;
pub const DEFAULT_EXTRA_ATTEMPTS: i64 = 1;
/// Ids one bulk retry may list, and Deliveries one bulk retry by filter may touch: each call
/// is one statement, and this bounds how long it holds its row locks.
pub const MAX_BULK_RETRY: usize = 1000;

// ---- Input checks ----------------------------------------------------------------------

fn bad_query(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_query", message).with_field(field)
}

/// A query string that does not deserialize: an unknown or repeated parameter. The field is
/// named when serde names it.
fn query_rejection(e: QueryRejection) -> ApiError {
    let text = e.body_text();
    let field = text.split_once("field `").and_then(|(_, rest)| rest.split('`').next()).map(str::to_string);
    let error = ApiError::bad_request("invalid_query", text);
    match field {
        Some(f) => error.with_field(f),
        None => error,
    }
}

fn parse_time(raw: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(raw).ok().map(|t| t.with_timezone(&Utc))
}

const TIME_HINT: &str = "an RFC 3339 time such as 2026-01-31T12:00:00Z";

fn query_time(field: &'static str, raw: Option<&str>) -> Result<Option<DateTime<Utc>>, ApiError> {
    raw.map(|s| parse_time(s).ok_or_else(|| bad_query(field, format!("{field} must be {TIME_HINT}")))).transpose()
}

fn query_id<T: std::str::FromStr>(field: &'static str, raw: Option<&str>) -> Result<Option<T>, ApiError>
where
    T::Err: std::fmt::Display,
{
    raw.map(|s| s.parse::<T>().map_err(|e| bad_query(field, format!("{field}: {e}")))).transpose()
}

/// Whether the time range `[after, before)` can hold nothing.
fn is_empty_range(after: Option<DateTime<Utc>>, before: Option<DateTime<Utc>>) -> bool {
    matches!((after, before), (Some(a), Some(b)) if b <= a)
}

/// `invalid_range` naming `before_field` (400 in a query, 422 in a body): a rule between two
/// fields, which the OpenAPI document cannot state.
fn empty_range(status: StatusCode, before_field: &str, after_field: &str) -> ApiError {
    ApiError::new(status, "invalid_range", format!("{before_field} must be later than {after_field}: the range is empty")).with_field(before_field)
}

fn check_extra_attempts(value: Option<i64>) -> Result<i32, ApiError> {
    let n = value.unwrap_or(DEFAULT_EXTRA_ATTEMPTS);
    if !EXTRA_ATTEMPTS.contains(&n) {
        return Err(ApiError::invalid(
            "extra_attempts",
            format!("extra_attempts must be from {} to {}", EXTRA_ATTEMPTS.start(), EXTRA_ATTEMPTS.end()),
        ));
    }
    // At most 20: fits.
    Ok(n as i32)
}


// ---- Deliveries ------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub status: Option<String>,
    pub endpoint_id: Option<String>,
    pub event_id: Option<String>,
    pub created_after: Option<String>,
    pub created_before: Option<String>,
    pub limit: Option<String>,
    pub cursor: Option<String>,
}

/// The project's Deliveries in id (= creation) order, filtered.
#[utoipa::path(get, path = "/v1/deliveries", tag = "deliveries",
    params(("status" = Option<crate::schema::DeliveryStatus>, Query, description = "PENDING, PROCESSING, SUCCESS or FAILED"),
           ("endpoint_id" = Option<crate::schema::EndpointId>, Query, description = "ep_..."), ("event_id" = Option<crate::schema::EventId>, Query, description = "evt_..."),
           ("created_after" = Option<crate::schema::Time>, Query, description = "RFC 3339, inclusive"), ("created_before" = Option<crate::schema::Time>, Query, description = "RFC 3339, exclusive"),
           ("limit" = Option<crate::schema::Limit>, Query, description = "1-200, default 50"), ("cursor" = Option<crate::schema::DeliveryId>, Query, description = "next_cursor of the previous page")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = crate::pagination::List<Delivery>), ListErrors))]
pub async fn list(
    Project(principal): Project,
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> ApiResult<Json<List<Delivery>>> {
    let Query(q) = query.map_err(query_rejection)?;
    let paging = PageParams { limit: q.limit, cursor: q.cursor };
    let limit = paging.limit()?;
    let status = q
        .status
        .as_deref()
        .map(|s| s.parse::<DeliveryStatus>().map_err(|_| bad_query("status", "status must be PENDING, PROCESSING, SUCCESS or FAILED")))
        .transpose()?;
    let created_after = query_time("created_after", q.created_after.as_deref())?;
    let created_before = query_time("created_before", q.created_before.as_deref())?;
    if is_empty_range(created_after, created_before) {
        return Err(empty_range(StatusCode::BAD_REQUEST, "created_before", "created_after"));
    }
    let filter = DeliveryFilter {
        status,
        endpoint_id: query_id::<EndpointId>("endpoint_id", q.endpoint_id.as_deref())?,
        event_id: query_id::<EventId>("event_id", q.event_id.as_deref())?,
        created_after,
        created_before,
        after: paging.cursor::<DeliveryId>()?,
        limit: limit + 1,
    };
    let client = state.pool.get().await?;
    let rows = deliveries::list_deliveries(&**client, principal.project_id, &filter).await?;
    Ok(Json(page(rows, limit, |d| d.id.to_string())))
}

#[utoipa::path(get, path = "/v1/deliveries/{id}", tag = "deliveries",
    params(("id" = crate::schema::DeliveryId, Path, description = "Delivery id (dlv_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = Delivery), ByIdErrors))]
pub async fn get(Project(principal): Project, State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<Delivery>> {
    let id: DeliveryId = parse_id("id", &id)?;
    let client = state.pool.get().await?;
    let delivery = deliveries::get_delivery(&**client, principal.project_id, id).await?.ok_or_else(|| ApiError::not_found("delivery"))?;
    Ok(Json(delivery))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    pub limit: Option<String>,
    pub cursor: Option<String>,
}

/// The Delivery's Attempts in attempt order, with what the receiver answered.
#[utoipa::path(get, path = "/v1/deliveries/{id}/attempts", tag = "deliveries",
    params(("id" = crate::schema::DeliveryId, Path, description = "Delivery id (dlv_...)"),
           ("limit" = Option<crate::schema::Limit>, Query, description = "1-200, default 50"), ("cursor" = Option<crate::schema::AttemptId>, Query, description = "next_cursor of the previous page")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = crate::pagination::List<Attempt>), ByIdErrors))]
pub async fn attempts(
    Project(principal): Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> ApiResult<Json<List<Attempt>>> {
    let id: DeliveryId = parse_id("id", &id)?;
    let Query(q) = query.map_err(query_rejection)?;
    let paging = PageParams { limit: q.limit, cursor: q.cursor };
    let limit = paging.limit()?;
    let after = paging.cursor::<AttemptId>()?;
    let client = state.pool.get().await?;
    let rows = deliveries::list_attempts(&**client, principal.project_id, id, after, limit + 1)
        .await?
        .ok_or_else(|| ApiError::not_found("delivery"))?;
    Ok(Json(page(rows, limit, |a| a.id.to_string())))
}

#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryDelivery {
    /// Attempts to add beyond those made: 1 to 20, default 1.
    #[schema(schema_with = extra_attempts_schema)]
    #[serde(default, deserialize_with = "crate::extract::int")]
    pub extra_attempts: Option<i64>,
}

/// Put a FAILED Delivery back on its Retry Ladder: PENDING, due now, with `extra_attempts`
/// more Attempts and a fresh hard-cap window, announced through the Outbox in the same
/// statement. The body is optional.
#[utoipa::path(post, path = "/v1/deliveries/{id}/retry", tag = "deliveries",
    request_body(content = RetryDelivery, description = "Optional; may be left out entirely"),
    params(("id" = crate::schema::DeliveryId, Path, description = "Delivery id (dlv_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 202, description = "Back on the ladder", body = Delivery),
        (status = 409, description = "Not FAILED (code not_failed; the message gives the status)", body = crate::error::ErrorBody),
        BodyByIdErrors))]
pub async fn retry(
    Project(principal): Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<(StatusCode, Json<Delivery>)> {
    let id: DeliveryId = parse_id("id", &id)?;
    let body: RetryDelivery = crate::extract::optional_json(&headers, body).await?;
    let extra = check_extra_attempts(body.extra_attempts)?;
    let client = state.pool.get().await?;
    match deliveries::retry(&**client, principal.project_id, id, extra).await? {
        RetryOutcome::Retried(delivery) => Ok((StatusCode::ACCEPTED, Json(*delivery))),
        RetryOutcome::NotFailed(status) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_failed",
            format!("only a FAILED delivery can be retried; this one is {status}"),
        )),
        RetryOutcome::NotFound => Err(ApiError::not_found("delivery")),
    }
}

// ---- Failed Messages -------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailedQuery {
    pub endpoint_id: Option<String>,
    pub event_type: Option<String>,
    pub completed_after: Option<String>,
    pub completed_before: Option<String>,
    pub limit: Option<String>,
    pub cursor: Option<String>,
}

/// Failed Messages: the project's FAILED Deliveries in id (= creation) order, filtered by
/// Endpoint, event type and when they failed.
#[utoipa::path(get, path = "/v1/failed-messages", tag = "failed-messages",
    params(("endpoint_id" = Option<crate::schema::EndpointId>, Query, description = "ep_..."), ("event_type" = Option<crate::schema::EventType>, Query, description = "An exact event type"),
           ("completed_after" = Option<crate::schema::Time>, Query, description = "RFC 3339, inclusive: failed at or after"), ("completed_before" = Option<crate::schema::Time>, Query, description = "RFC 3339, exclusive"),
           ("limit" = Option<crate::schema::Limit>, Query, description = "1-200, default 50"), ("cursor" = Option<crate::schema::DeliveryId>, Query, description = "next_cursor of the previous page")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = crate::pagination::List<FailedMessage>), ListErrors))]
pub async fn failed(
    Project(principal): Project,
    State(state): State<AppState>,
    query: Result<Query<FailedQuery>, QueryRejection>,
) -> ApiResult<Json<List<FailedMessage>>> {
    let Query(q) = query.map_err(query_rejection)?;
    let paging = PageParams { limit: q.limit, cursor: q.cursor };
    let limit = paging.limit()?;
    if let Some(t) = &q.event_type {
        EventType::parse(t).map_err(|e| bad_query("event_type", format!("event_type: {e}")))?;
    }
    let completed_after = query_time("completed_after", q.completed_after.as_deref())?;
    let completed_before = query_time("completed_before", q.completed_before.as_deref())?;
    if is_empty_range(completed_after, completed_before) {
        return Err(empty_range(StatusCode::BAD_REQUEST, "completed_before", "completed_after"));
    }
    let filter = FailedFilter {
        endpoint_id: query_id::<EndpointId>("endpoint_id", q.endpoint_id.as_deref())?,
        event_type: q.event_type,
        completed_after,
        completed_before,
    };
    let after = paging.cursor::<DeliveryId>()?;
    let client = state.pool.get().await?;
    let rows = deliveries::list_failed(&**client, principal.project_id, &filter, after, limit + 1).await?;
    Ok(Json(page(rows, limit, |f| f.delivery_id.to_string())))
}

/// Which Failed Messages a bulk retry by filter takes; every field is optional and `{}`
/// takes them all (up to `limit`).
#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailedMessageFilter {
    #[schema(value_type = Option<crate::schema::EndpointId>)]
    pub endpoint_id: Option<EndpointId>,
    /// An exact event type.
    #[schema(value_type = Option<crate::schema::EventType>)]
    pub event_type: Option<String>,
    /// RFC 3339, inclusive.
    #[schema(value_type = Option<crate::schema::Time>)]
    pub completed_after: Option<String>,
    /// RFC 3339, exclusive; later than `completed_after` (422 `invalid_range` otherwise).
    #[schema(value_type = Option<crate::schema::Time>)]
    pub completed_before: Option<String>,
}

pub(crate) fn extra_attempts_schema() -> utoipa::openapi::Object {
    crate::schema::nullable_integer(EXTRA_ATTEMPTS).build()
}

/// Exactly one of `ids` and `filter`: the schema is a `oneOf` of the two shapes (see the
/// `PartialSchema` below; the fields' docs are there).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkRetry {
    /// Up to 1000 Delivery ids. Unknown ones, other projects' and those not FAILED are
    /// reported in `skipped`, not refused.
    pub ids: Option<Vec<DeliveryId>>,
    pub filter: Option<FailedMessageFilter>,
    /// Attempts to add to each: 1 to 20, default 1.
    #[serde(default, deserialize_with = "crate::extract::int")]
    pub extra_attempts: Option<i64>,
    /// With `filter` only: how many to retry at most, 1 to 1000, default 1000 (oldest
    /// first). Call again until `retried` is 0 to drain a larger backlog.
    #[serde(default, deserialize_with = "crate::extract::int")]
    pub limit: Option<i64>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BulkRetried {
    /// How many were put back on the ladder.
    pub retried: usize,
    /// Their ids, in id order.
    #[schema(value_type = Vec<String>)]
    pub ids: Vec<DeliveryId>,
    /// For a retry by ids: those not retried, and why.
    pub skipped: Vec<SkippedDelivery>,
}

impl utoipa::PartialSchema for BulkRetry {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        bulk_retry_schema::<crate::schema::DeliveryId>("Delivery", "FailedMessageFilter", MAX_BULK_RETRY, EXTRA_ATTEMPTS)
    }
}

impl utoipa::ToSchema for BulkRetry {}

/// The two shapes of a bulk retry: `{ids, extra_attempts?}` or `{filter, limit?,
/// extra_attempts?}`, each closed; shared with `/v1/failed-forwards/retry`.
pub(crate) fn bulk_retry_schema<Id: utoipa::ToSchema>(
    what: &str,
    filter: &str,
    max: usize,
    extra_attempts: RangeInclusive<i64>,
) -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    use utoipa::openapi::schema::{OneOfBuilder, Ref};
    let by_ids = crate::schema::closed_object()
        .property(
            "ids",
            crate::schema::array(Ref::from_schema_name(Id::name()), 1, max)
                .description(Some(format!("1 to {max} {what} ids. Unknown ones, other projects' and those not FAILED are reported in `skipped`, not refused."))),
        )
        .required("ids")
        .property("extra_attempts", crate::schema::nullable_integer(extra_attempts.clone()));
    let by_filter = crate::schema::closed_object()
        .property("filter", Ref::from_schema_name(filter))
        .required("filter")
        .property("extra_attempts", crate::schema::nullable_integer(extra_attempts.clone()))
        .property(
            "limit",
            crate::schema::nullable_integer(1..=max as i64)
                .description(Some(format!("How many to retry at most, default {max} (oldest first). Call again until `retried` is 0 to drain a larger backlog."))),
        );
    OneOfBuilder::new()
        .item(by_ids)
        .item(by_filter)
        .description(Some(format!(
            "Exactly one of `ids` and `filter`; `extra_attempts` ({} to {}, default 1) are added to each.",
            extra_attempts.start(),
            extra_attempts.end()
        )))
        .into()
}

fn body_time(field: &str, raw: Option<&str>) -> Result<Option<DateTime<Utc>>, ApiError> {
    raw.map(|s| parse_time(s).ok_or_else(|| ApiError::invalid(field, format!("{field} must be {TIME_HINT}")))).transpose()
}

fn failed_filter(f: FailedMessageFilter) -> Result<FailedFilter, ApiError> {
    if let Some(t) = &f.event_type {
        EventType::parse(t).map_err(|e| ApiError::invalid("filter.event_type", format!("filter.event_type: {e}")))?;
    }
    let completed_after = body_time("filter.completed_after", f.completed_after.as_deref())?;
    let completed_before = body_time("filter.completed_before", f.completed_before.as_deref())?;
    if is_empty_range(completed_after, completed_before) {
        return Err(empty_range(StatusCode::UNPROCESSABLE_ENTITY, "filter.completed_before", "filter.completed_after"));
    }
    Ok(FailedFilter { endpoint_id: f.endpoint_id, event_type: f.event_type, completed_after, completed_before })
}

fn ids_or_filter(field: &str, message: &str) -> ApiError {
    ApiError::bad_request("ids_or_filter", message).with_field(field)
}

/// Retry many Failed Messages in one statement: the listed `ids`, or those matching
/// `filter` (at most `limit`). Deliveries another request is changing at that moment are
/// skipped rather than waited for.
#[utoipa::path(post, path = "/v1/failed-messages/retry", tag = "failed-messages", request_body = BulkRetry,
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 202, description = "Those retried, and (by ids) those skipped", body = BulkRetried),
        (status = 400, description = "Malformed JSON, or not exactly one of ids and filter (code ids_or_filter)", body = crate::error::ErrorBody), AuthErrors, BodyChecks))]
pub async fn retry_failed(
    Project(principal): Project,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<BulkRetry>,
) -> ApiResult<(StatusCode, Json<BulkRetried>)> {
    let filter;
    let selection = match (body.ids.as_deref(), body.filter) {
        (Some(_), Some(_)) => return Err(ids_or_filter("filter", "give either ids or filter, not both")),
        (None, None) => return Err(ids_or_filter("ids", "give ids (a list of delivery ids) or filter (which Failed Messages to retry)")),
        (Some(ids), None) => {
            if body.limit.is_some() {
                return Err(ApiError::invalid("limit", "limit goes with filter; with ids, every listed delivery is retried"));
            }
            if ids.is_empty() || ids.len() > MAX_BULK_RETRY {
                return Err(ApiError::invalid("ids", format!("ids must list 1 to {MAX_BULK_RETRY} delivery ids")));
            }
            BulkSelection::Ids(ids)
        }
        (None, Some(f)) => {
            let limit = body.limit.unwrap_or(MAX_BULK_RETRY as i64);
            if !(1..=MAX_BULK_RETRY as i64).contains(&limit) {
                return Err(ApiError::invalid("limit", format!("limit must be from 1 to {MAX_BULK_RETRY}")));
            }
            filter = failed_filter(f)?;
            BulkSelection::Filter(&filter, limit)
        }
    };
    let extra = check_extra_attempts(body.extra_attempts)?;
    let client = state.pool.get().await?;
    let outcome = deliveries::retry_many(&**client, principal.project_id, selection, extra).await?;
    Ok((StatusCode::ACCEPTED, Json(BulkRetried { retried: outcome.retried.len(), ids: outcome.retried, skipped: outcome.skipped })))
}
