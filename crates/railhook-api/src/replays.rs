//! Replays (the Time Machine, issue 17): `POST /v1/replays` starts a background job that
//! makes a *new* Delivery of each stored Event in `[from, to)` to each chosen Endpoint whose
//! Subscription matches now (new `webhook-id`, same `X-Event-Id`); `dry_run` only counts.
//! The worker runs it in bounded batches (`railhook_worker::replays`); this module starts,
//! shows and cancels it (`railhook_store::replays`).
//!
//! Limits per Project: one running Replay (409 `replay_running`), a range of at most
//! `replay.max_range_days` (422 naming `to`). `to` later than now is taken as now: a Replay
//! replays what was stored when it started.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use railhook_core::{EndpointId, EventTypePattern, ProjectId, ReplayId};
use railhook_store::replays::{self, CancelOutcome, CreateOutcome, Replay, ReplayCount, ReplayFilter};
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ApiResult};
use crate::extract::{parse_id, ApiJson, Project};
use crate::pagination::{page, List, PageParams};
use crate::AppState;
#[allow(unused_imports)] // The shared error responses of the OpenAPI attributes below.
use crate::error::responses::*;

/// Event type patterns and Endpoints one Replay may name.
pub const MAX_EVENT_TYPES: usize = 50;
pub const MAX_ENDPOINTS: usize = 100;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateReplay {
    /// RFC 3339, inclusive: Events stored at or after; in the past (422 `invalid_range`
    /// otherwise).
    #[schema(value_type = crate::schema::Time)]
    pub from: Option<String>,
    /// RFC 3339, exclusive; later than `from`, at most `replay.max_range_days` after it (422
    /// `invalid_range` otherwise); later than now is taken as now.
    #[schema(value_type = crate::schema::Time)]
    pub to: Option<String>,
    /// Subscription-style patterns (`order.paid`, `order.*`, `**`); left out: every type.
    #[schema(schema_with = event_types_schema)]
    pub event_types: Option<Vec<String>>,
    /// `ep_...` ids of this project (404 for one that is not); left out: every Endpoint.
    #[schema(schema_with = endpoint_ids_schema)]
    pub endpoint_ids: Option<Vec<String>>,
    /// Only count the Deliveries it would make.
    #[serde(default)]
    pub dry_run: bool,
}

fn event_types_schema() -> utoipa::openapi::schema::Schema {
    let items = utoipa::openapi::schema::Ref::from_schema_name("EventTypePattern");
    crate::schema::or_null(crate::schema::array(items, 1, MAX_EVENT_TYPES).build())
}

fn endpoint_ids_schema() -> utoipa::openapi::schema::Schema {
    let items = utoipa::openapi::schema::Ref::from_schema_name("EndpointId");
    crate::schema::or_null(crate::schema::array(items, 1, MAX_ENDPOINTS).build())
}

/// 422 `invalid_range` naming `field`: a rule between `from`, `to` and the clock, which the
/// OpenAPI document cannot state.
fn invalid_range(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_range", message).with_field(field)
}

/// The answer to a dry run.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DryRun {
    pub dry_run: bool,
    #[serde(flatten)]
    pub count: ReplayCount,
}

fn time(field: &'static str, raw: Option<&str>) -> Result<DateTime<Utc>, ApiError> {
    let raw = raw.ok_or_else(|| ApiError::invalid(field, format!("{field} is required (an RFC 3339 time such as 2026-01-31T12:00:00Z)")))?;
    DateTime::parse_from_rfc3339(raw)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| ApiError::invalid(field, format!("{field} must be an RFC 3339 time such as 2026-01-31T12:00:00Z")))
}

/// `[from, to)`, `to` clamped to now, at most `max_days` long.
fn time_range(body: &CreateReplay, max_days: i64, now: DateTime<Utc>) -> Result<(DateTime<Utc>, DateTime<Utc>), ApiError> {
    let (from, to) = (time("from", body.from.as_deref())?, time("to", body.to.as_deref())?);
    if to <= from {
        return Err(invalid_range("to", "to must be later than from: the range is empty"));
    }
    if from >= now {
        return Err(invalid_range("from", "from must be in the past: nothing is stored after now"));
    }
    let to = to.min(now);
    if to - from > chrono::Duration::days(max_days) {
        return Err(invalid_range("to", format!("the range from `from` to `to` may span at most {max_days} days (replay.max_range_days)")));
    }
    Ok((from, to))
}

fn event_types(raw: Option<&[String]>) -> Result<Option<Vec<EventTypePattern>>, ApiError> {
    let Some(raw) = raw else { return Ok(None) };
    if raw.is_empty() || raw.len() > MAX_EVENT_TYPES {
        return Err(ApiError::invalid("event_types", format!("event_types must list 1 to {MAX_EVENT_TYPES} patterns (leave it out for every type)")));
    }
    let parsed = raw.iter().map(|p| EventTypePattern::parse(p).map_err(|e| ApiError::invalid("event_types", e.to_string())));
    parsed.collect::<Result<_, _>>().map(Some)
}

fn endpoint_ids(raw: Option<&[String]>) -> Result<Option<Vec<EndpointId>>, ApiError> {
    let Some(raw) = raw else { return Ok(None) };
    if raw.is_empty() || raw.len() > MAX_ENDPOINTS {
        return Err(ApiError::invalid("endpoint_ids", format!("endpoint_ids must list 1 to {MAX_ENDPOINTS} ids (leave it out for every Endpoint)")));
    }
    let parsed = raw.iter().map(|id| id.parse::<EndpointId>().map_err(|e| ApiError::invalid("endpoint_ids", format!("endpoint_ids: {e}"))));
    parsed.collect::<Result<_, _>>().map(Some)
}

/// The checked filter; Endpoints of another project are as unknown as missing ones.
async fn filter(db: &impl railhook_store::lifecycle::Prepared, project: ProjectId, body: &CreateReplay, max_days: i64) -> ApiResult<ReplayFilter> {
    let (from, to) = time_range(body, max_days, Utc::now())?;
    let filter = ReplayFilter { from, to, event_types: event_types(body.event_types.as_deref())?, endpoint_ids: endpoint_ids(body.endpoint_ids.as_deref())? };
    if let Some(ids) = &filter.endpoint_ids {
        if let Some(unknown) = replays::unknown_endpoints(db, project, ids).await?.first() {
            return Err(ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("{unknown} is not an Endpoint of this project")).with_field("endpoint_ids"));
        }
    }
    Ok(filter)
}

/// Start a Replay (or, with `dry_run`, count the Deliveries it would make). It runs in the
/// background in small batches below live traffic; follow it at `GET /v1/replays/{id}`.
#[utoipa::path(post, path = "/v1/replays", tag = "replays", request_body = CreateReplay,
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 202, description = "Started", body = Replay),
        (status = 200, description = "dry_run: the Deliveries it would make", body = DryRun),
        (status = 404, description = "An `endpoint_ids` entry is not an Endpoint of this project", body = crate::error::ErrorBody),
        (status = 409, description = "The project has a running Replay (code replay_running)", body = crate::error::ErrorBody),
        BodyErrors))]
pub async fn create(Project(principal): Project, State(state): State<AppState>, ApiJson(body): ApiJson<CreateReplay>) -> ApiResult<Response> {
    let client = state.pool.get().await?;
    let project = principal.project_id;
    let filter = filter(&client, project, &body, state.config.replay.max_range_days).await?;
    if !body.dry_run {
        if let Some(id) = replays::running(&client, project).await? {
            return Err(already_running(id));
        }
    }
    let count = replays::count(&client, project, &filter).await?;
    if body.dry_run {
        return Ok(Json(DryRun { dry_run: true, count }).into_response());
    }
    // The unique index decides a race between two requests that both passed the check.
    match replays::create(&client, project, &filter, count).await? {
        CreateOutcome::Created(r) => Ok((StatusCode::ACCEPTED, Json(r)).into_response()),
        CreateOutcome::AlreadyRunning(id) => Err(already_running(id)),
    }
}

fn already_running(id: ReplayId) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, "replay_running", format!("replay {id} is running in this project; cancel it or wait for it to complete"))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub limit: Option<String>,
    pub cursor: Option<String>,
}

/// The project's Replays in id (= creation) order, a page at a time.
#[utoipa::path(get, path = "/v1/replays", tag = "replays",
    params(("limit" = Option<crate::schema::Limit>, Query, description = "1-200, default 50"), ("cursor" = Option<crate::schema::ReplayId>, Query, description = "next_cursor of the previous page")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = crate::pagination::List<Replay>), ListErrors))]
pub async fn list(Project(principal): Project, State(state): State<AppState>, query: Result<Query<ListQuery>, QueryRejection>) -> ApiResult<Json<List<Replay>>> {
    let Query(q) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let paging = PageParams { limit: q.limit, cursor: q.cursor };
    let limit = paging.limit()?;
    let after = paging.cursor::<ReplayId>()?;
    let client = state.pool.get().await?;
    let rows = replays::list(&client, principal.project_id, after, limit + 1).await?;
    Ok(Json(page(rows, limit, |r| r.id.to_string())))
}

/// One Replay and its progress: `made` of `total` Deliveries, `state`.
#[utoipa::path(get, path = "/v1/replays/{id}", tag = "replays",
    params(("id" = crate::schema::ReplayId, Path, description = "Replay id (rpl_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = Replay), ByIdErrors))]
pub async fn get(Project(principal): Project, State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<Replay>> {
    let id: ReplayId = parse_id("id", &id)?;
    let client = state.pool.get().await?;
    replays::get(&client, principal.project_id, id).await?.map(Json).ok_or_else(|| ApiError::not_found("replay"))
}

/// Cancel a running Replay: no Delivery is made after this answers; those made stay.
#[utoipa::path(post, path = "/v1/replays/{id}/cancel", tag = "replays",
    params(("id" = crate::schema::ReplayId, Path, description = "Replay id (rpl_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, description = "Cancelled", body = Replay),
        (status = 409, description = "Not running (code not_running; the message gives the state)", body = crate::error::ErrorBody),
        ByIdErrors))]
pub async fn cancel(Project(principal): Project, State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<Replay>> {
    let id: ReplayId = parse_id("id", &id)?;
    let client = state.pool.get().await?;
    match replays::cancel(&client, principal.project_id, id).await? {
        CancelOutcome::Cancelled(r) => Ok(Json(r)),
        CancelOutcome::NotRunning(s) => Err(ApiError::new(StatusCode::CONFLICT, "not_running", format!("only a running replay can be cancelled; this one is {s:?}").to_lowercase())),
        CancelOutcome::NotFound => Err(ApiError::not_found("replay")),
    }
}
