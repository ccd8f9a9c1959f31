//! `/v1/subscriptions`: which Events an Endpoint wants, and how each Delivery is retried.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use railhook_core::pattern::EventTypePattern;
use railhook_core::{EndpointId, SubscriptionId};
use railhook_store::subscriptions::{self, NewSubscription, Subscription, SubscriptionChanges};
use serde::Deserialize;

use crate::extract::{not_null, present};
use crate::error::{ApiError, ApiResult};
use crate::extract::{parse_id, ApiJson, Project};
use crate::pagination::{page, List, PageParams};
use crate::AppState;
#[allow(unused_imports)] // The shared error responses of the OpenAPI attributes below.
use crate::error::responses::*;

pub const MAX_ATTEMPTS: std::ops::RangeInclusive<i64> = 1..=20;
pub const DEFAULT_MAX_ATTEMPTS: i16 = 7;
pub const TIMEOUT_SECONDS: std::ops::RangeInclusive<i64> = 1..=60;
pub const DEFAULT_TIMEOUT_SECONDS: i16 = 30;
/// How many delays a custom Retry Ladder may list.
pub const RETRY_DELAYS_LEN: std::ops::RangeInclusive<usize> = 1..=20;
/// One delay: one second to one week.
pub const RETRY_DELAY_SECONDS: std::ops::RangeInclusive<i64> = 1..=604_800;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSubscription {
    /// One of the project's Endpoints (404 otherwise).
    #[schema(value_type = crate::schema::EndpointId)]
    pub endpoint_id: EndpointId,
    /// A pattern: `order.paid`, `order.*`, `order.**` or `**`.
    #[schema(value_type = crate::schema::EventTypePattern)]
    pub event_type: String,
    #[serde(default)]
    pub ordering: bool,
    /// 1 to 20, default 7.
    #[schema(schema_with = max_attempts_or_null)]
    #[serde(default, deserialize_with = "crate::extract::int")]
    pub max_attempts: Option<i64>,
    /// 1 to 60, default 30.
    #[schema(schema_with = timeout_or_null)]
    #[serde(default, deserialize_with = "crate::extract::int")]
    pub timeout_seconds: Option<i64>,
    /// Seconds between Attempts: the n-th entry is the wait after the n-th failed Attempt.
    /// It may be shorter than `max_attempts - 1`: the last delay then repeats. Absent or
    /// null: the default outgoing ladder (60, 300, 900, 3600, 21600, 86400 s).
    #[schema(schema_with = delays_or_null)]
    #[serde(default, deserialize_with = "crate::extract::ints")]
    pub retry_delays: Option<Vec<i64>>,
    pub enabled: Option<bool>,
}

/// Any subset of the fields; `retry_delays: null` goes back to the default ladder. The
/// Endpoint of a Subscription cannot change: create another Subscription instead.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSubscription {
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = crate::schema::EventTypePattern)]
    pub event_type: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = bool)]
    pub ordering: Option<Option<bool>>,
    #[serde(default, deserialize_with = "crate::extract::present_int")]
    #[schema(schema_with = max_attempts_schema)]
    pub max_attempts: Option<Option<i64>>,
    #[serde(default, deserialize_with = "crate::extract::present_int")]
    #[schema(schema_with = timeout_schema)]
    pub timeout_seconds: Option<Option<i64>>,
    #[serde(default, deserialize_with = "crate::extract::present_ints")]
    #[schema(schema_with = delays_or_null)]
    pub retry_delays: Option<Option<Vec<i64>>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = bool)]
    pub enabled: Option<Option<bool>>,
}

fn max_attempts_schema() -> utoipa::openapi::Object {
    crate::schema::integer(MAX_ATTEMPTS).build()
}

fn max_attempts_or_null() -> utoipa::openapi::Object {
    crate::schema::nullable_integer(MAX_ATTEMPTS).build()
}

fn timeout_schema() -> utoipa::openapi::Object {
    crate::schema::integer(TIMEOUT_SECONDS).build()
}

fn timeout_or_null() -> utoipa::openapi::Object {
    crate::schema::nullable_integer(TIMEOUT_SECONDS).build()
}

fn delays_or_null() -> utoipa::openapi::schema::Schema {
    let delays = crate::schema::array(crate::schema::integer(RETRY_DELAY_SECONDS).build(), *RETRY_DELAYS_LEN.start(), *RETRY_DELAYS_LEN.end());
    crate::schema::or_null(delays.build())
}

fn check_pattern(raw: &str) -> Result<EventTypePattern, ApiError> {
    EventTypePattern::parse(raw).map_err(|e| ApiError::invalid("event_type", format!("event_type is not a valid pattern: {e}")))
}

fn check_small(field: &'static str, value: i64, range: std::ops::RangeInclusive<i64>) -> Result<i16, ApiError> {
    if !range.contains(&value) {
        return Err(ApiError::invalid(field, format!("{field} must be from {} to {}", range.start(), range.end())));
    }
    i16::try_from(value).map_err(|_| ApiError::invalid(field, format!("{field} is out of range")))
}

fn check_delays(delays: &[i64]) -> Result<Vec<i32>, ApiError> {
    if !RETRY_DELAYS_LEN.contains(&delays.len()) {
        return Err(ApiError::invalid(
            "retry_delays",
            format!("retry_delays must list {} to {} delays (omit it for the default ladder)", RETRY_DELAYS_LEN.start(), RETRY_DELAYS_LEN.end()),
        ));
    }
    delays
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            if RETRY_DELAY_SECONDS.contains(&d) {
                // At most 604 800: fits.
                Ok(d as i32)
            } else {
                Err(ApiError::invalid(
                    format!("retry_delays[{i}]"),
                    format!("each retry delay must be from {} to {} seconds", RETRY_DELAY_SECONDS.start(), RETRY_DELAY_SECONDS.end()),
                ))
            }
        })
        .collect()
}

/// 404 naming the field: a well-formed id of no Endpoint of this project.
fn no_such_endpoint() -> ApiError {
    ApiError::not_found("endpoint").with_field("endpoint_id")
}

/// Subscribe one of the project's Endpoints to an event type pattern.
#[utoipa::path(post, path = "/v1/subscriptions", tag = "subscriptions", request_body = CreateSubscription,
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 201, body = Subscription), BodyByIdErrors))]
pub async fn create(
    Project(principal): Project,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateSubscription>,
) -> ApiResult<(StatusCode, Json<Subscription>)> {
    let pattern = check_pattern(&body.event_type)?;
    let max_attempts = body.max_attempts.map(|v| check_small("max_attempts", v, MAX_ATTEMPTS)).transpose()?;
    let timeout_seconds = body.timeout_seconds.map(|v| check_small("timeout_seconds", v, TIMEOUT_SECONDS)).transpose()?;
    let delays = body.retry_delays.as_deref().map(check_delays).transpose()?;
    let new = NewSubscription {
        endpoint_id: body.endpoint_id,
        event_type_pattern: pattern.as_str(),
        ordering: body.ordering,
        max_attempts: max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS),
        timeout_seconds: timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS),
        retry_delays: delays.as_deref(),
        enabled: body.enabled.unwrap_or(true),
    };
    let client = state.pool.get().await?;
    let created = subscriptions::create_subscription(&**client, principal.project_id, new)
        .await?
        .ok_or_else(no_such_endpoint)?;
    Ok((StatusCode::CREATED, Json(created)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub endpoint_id: Option<String>,
    pub limit: Option<String>,
    pub cursor: Option<String>,
}

/// The project's Subscriptions (of one Endpoint with `endpoint_id`) in id order.
#[utoipa::path(get, path = "/v1/subscriptions", tag = "subscriptions",
    params(("endpoint_id" = Option<crate::schema::EndpointId>, Query, description = "Only this Endpoint's (ep_...)"), ("limit" = Option<crate::schema::Limit>, Query, description = "1-200, default 50"), ("cursor" = Option<crate::schema::SubscriptionId>, Query, description = "next_cursor of the previous page")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = crate::pagination::List<Subscription>), ListErrors))]
pub async fn list(
    Project(principal): Project,
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> ApiResult<Json<List<Subscription>>> {
    let Query(q) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let endpoint = q
        .endpoint_id
        .as_deref()
        .map(|raw| {
            raw.parse::<EndpointId>()
                .map_err(|e| ApiError::bad_request("invalid_query", format!("endpoint_id: {e}")).with_field("endpoint_id"))
        })
        .transpose()?;
    let paging = PageParams { limit: q.limit, cursor: q.cursor };
    let limit = paging.limit()?;
    let after = paging.cursor::<SubscriptionId>()?;
    let client = state.pool.get().await?;
    let rows = subscriptions::list_subscriptions(&**client, principal.project_id, endpoint, after, limit + 1).await?;
    Ok(Json(page(rows, limit, |s| s.id.to_string())))
}

#[utoipa::path(get, path = "/v1/subscriptions/{id}", tag = "subscriptions",
    params(("id" = crate::schema::SubscriptionId, Path, description = "Subscription id (sub_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = Subscription), ByIdErrors))]
pub async fn get(Project(principal): Project, State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<Subscription>> {
    let id: SubscriptionId = parse_id("id", &id)?;
    let client = state.pool.get().await?;
    let found = subscriptions::get_subscription(&**client, principal.project_id, id)
        .await?
        .ok_or_else(|| ApiError::not_found("subscription"))?;
    Ok(Json(found))
}

/// Change any subset of the fields; `retry_delays: null` returns to the default ladder.
#[utoipa::path(patch, path = "/v1/subscriptions/{id}", tag = "subscriptions", request_body = UpdateSubscription,
    params(("id" = crate::schema::SubscriptionId, Path, description = "Subscription id (sub_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = Subscription), BodyByIdErrors))]
pub async fn update(
    Project(principal): Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<UpdateSubscription>,
) -> ApiResult<Json<Subscription>> {
    let id: SubscriptionId = parse_id("id", &id)?;
    let pattern = not_null("event_type", body.event_type)?.map(|p| check_pattern(&p)).transpose()?;
    let max_attempts = not_null("max_attempts", body.max_attempts)?.map(|v| check_small("max_attempts", v, MAX_ATTEMPTS)).transpose()?;
    let timeout_seconds =
        not_null("timeout_seconds", body.timeout_seconds)?.map(|v| check_small("timeout_seconds", v, TIMEOUT_SECONDS)).transpose()?;
    let delays = body.retry_delays.map(|d| d.as_deref().map(check_delays).transpose()).transpose()?;
    let changes = SubscriptionChanges {
        event_type_pattern: pattern.as_ref().map(EventTypePattern::as_str),
        ordering: not_null("ordering", body.ordering)?,
        max_attempts,
        timeout_seconds,
        retry_delays: delays.as_ref().map(|d| d.as_deref()),
        enabled: not_null("enabled", body.enabled)?,
    };
    let client = state.pool.get().await?;
    let updated = subscriptions::update_subscription(&**client, principal.project_id, id, changes)
        .await?
        .ok_or_else(|| ApiError::not_found("subscription"))?;
    Ok(Json(updated))
}

/// Delete the Subscription; its Deliveries stay.
#[utoipa::path(delete, path = "/v1/subscriptions/{id}", tag = "subscriptions",
    params(("id" = crate::schema::SubscriptionId, Path, description = "Subscription id (sub_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 204, description = "Deleted"), ByIdErrors))]
pub async fn delete(Project(principal): Project, State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<StatusCode> {
    let id: SubscriptionId = parse_id("id", &id)?;
    let client = state.pool.get().await?;
    if subscriptions::delete_subscription(&**client, principal.project_id, id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("subscription"))
    }
}
