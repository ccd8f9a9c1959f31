//! Operator routes: organizations and projects (`Authorization: Bearer $RAILHOOK_ADMIN_TOKEN`).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use railhook_core::{OrganizationId, ProjectId};
use railhook_store::retention;
use railhook_store::tenancy::{self, NewApiKey, Organization, Project};
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ApiResult};
use crate::extract::{not_null, parse_id, present, ApiJson, Operator};
use crate::AppState;
#[allow(unused_imports)] // The shared error responses of the OpenAPI attributes below.
use crate::error::responses::*;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateNamed {
    /// 1 to 200 characters once trimmed.
    #[schema(schema_with = name_schema)]
    pub name: String,
}

/// The longest name of an Organization or Project.
pub const MAX_NAME_CHARS: usize = 200;

fn name_schema() -> utoipa::openapi::Object {
    crate::schema::trimmed_name(MAX_NAME_CHARS).build()
}

pub fn check_name(name: &str) -> Result<&str, ApiError> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(ApiError::invalid("name", format!("name must be 1 to {MAX_NAME_CHARS} characters")));
    }
    Ok(name)
}

/// Create an organization.
#[utoipa::path(post, path = "/v1/admin/organizations", tag = "admin", request_body = CreateNamed,
    security(("admin_token" = [])),
    responses((status = 201, body = Organization), (status = 403, description = "Admin routes disabled", body = crate::error::ErrorBody), BodyErrors))]
pub async fn create_organization(
    _: Operator,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateNamed>,
) -> ApiResult<(StatusCode, Json<Organization>)> {
    let name = check_name(&body.name)?;
    let client = state.pool.get().await?;
    let org = tenancy::create_organization(&**client, name).await?;
    Ok((StatusCode::CREATED, Json(org)))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ProjectCreated {
    #[serde(flatten)]
    pub project: Project,
    /// The project's first API key. Its secret is shown only in this response.
    pub api_key: NewApiKey,
}

/// Create a project and its first API key (its secret is shown only in this response).
#[utoipa::path(post, path = "/v1/admin/organizations/{org_id}/projects", tag = "admin", request_body = CreateNamed,
    params(("org_id" = crate::schema::OrganizationId, Path, description = "Organization id (org_...)")),
    security(("admin_token" = [])),
    responses((status = 201, body = ProjectCreated), BodyByIdErrors))]
pub async fn create_project(
    _: Operator,
    State(state): State<AppState>,
    Path(org_id): Path<String>,
    ApiJson(body): ApiJson<CreateNamed>,
) -> ApiResult<(StatusCode, Json<ProjectCreated>)> {
    let org: OrganizationId = parse_id("org_id", &org_id)?;
    let name = check_name(&body.name)?;
    let mut client = state.pool.get().await?;
    let tx = client.transaction().await?;
    let project = tenancy::create_project(&*tx, org, name).await?.ok_or_else(|| ApiError::not_found("organization"))?;
    let api_key = tenancy::create_api_key(&*tx, project.id, "default")
        .await?
        .ok_or_else(ApiError::internal)?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(ProjectCreated { project, api_key })))
}

// ---- A Project and its retention (issue 17) ----------------------------------------------

/// The longest per-Project retention period, as `retention.*_days` of the configuration: 100
/// years. The shortest is anything above 0 (days, fractions allowed).
pub const MAX_RETENTION_DAYS: f64 = 36_500.0;

/// The schema of a Project id (`railhook_core::ProjectId`), as `crate::schema`'s id schemas.
pub struct ProjectIdSchema;

impl utoipa::PartialSchema for ProjectIdSchema {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        let prefix = ProjectId::PREFIX;
        let len = prefix.len() + 1 + 26;
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .pattern(Some(crate::schema::id_pattern(prefix)))
            .min_length(Some(len))
            .max_length(Some(len))
            .description(Some(format!("a Project id: `{prefix}_` and 26 base32 characters")))
            .examples([serde_json::json!(format!("{prefix}_0123456789abcdefghjkmnpqrs"))])
            .into()
    }
}

impl utoipa::ToSchema for ProjectIdSchema {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("ProjectId")
    }
}

/// A retention period in days: above 0, at most [`MAX_RETENTION_DAYS`], fractions allowed.
fn days_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::Number)
        .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::Double)))
        .exclusive_minimum(Some(0.0))
        .maximum(Some(MAX_RETENTION_DAYS))
        .examples([serde_json::json!(7)])
        .build()
}

fn days_or_null() -> utoipa::openapi::schema::Schema {
    crate::schema::or_null(days_schema())
}

/// A Project's retention: its own periods (null: the configured default) and the ones the
/// worker's retention job applies.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ProjectRetention {
    /// Days an Event (Incoming Event) whose every Delivery (Forward) is final is kept; null:
    /// `retention.events_days` of the configuration.
    pub events_days: Option<f64>,
    /// Days a FAILED Delivery or Forward (a Failed Message) is kept; null:
    /// `retention.failed_days` of the configuration.
    pub failed_days: Option<f64>,
    /// `events_days`, or the configured default when it is null.
    pub effective_events_days: f64,
    /// `failed_days`, or the configured default when it is null.
    pub effective_failed_days: f64,
}

impl ProjectRetention {
    fn new(overrides: retention::Overrides, config: &railhook_config::RetentionConfig) -> ProjectRetention {
        ProjectRetention {
            events_days: overrides.events_days,
            failed_days: overrides.failed_days,
            effective_events_days: overrides.events_days.unwrap_or(config.events_days),
            effective_failed_days: overrides.failed_days.unwrap_or(config.failed_days),
        }
    }
}

/// A Project as created, with its retention.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ProjectDetails {
    #[serde(flatten)]
    pub project: Project,
    pub retention: ProjectRetention,
}

/// Any subset of a Project's settings; a field left out keeps its value.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateProject {
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = RetentionChanges)]
    pub retention: Option<Option<RetentionChanges>>,
}

/// The Project's own retention periods, in days (above 0, at most 36500, fractions allowed):
/// a field left out keeps its value, null goes back to the configured default.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetentionChanges {
    #[serde(default, deserialize_with = "present")]
    #[schema(schema_with = days_or_null)]
    pub events_days: Option<Option<f64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(schema_with = days_or_null)]
    pub failed_days: Option<Option<f64>>,
}

/// A period the retention job can use: above 0 and at most [`MAX_RETENTION_DAYS`], finite.
pub fn check_days(field: &'static str, days: f64) -> Result<f64, ApiError> {
    if days.is_finite() && days > 0.0 && days <= MAX_RETENTION_DAYS {
        Ok(days)
    } else {
        Err(ApiError::invalid(
            field,
            format!("{field} must be above 0 and at most {MAX_RETENTION_DAYS} (days, fractions allowed), or null for the configured default"),
        ))
    }
}

/// Read a Project with its retention: its own periods and the effective ones.
#[utoipa::path(get, path = "/v1/admin/projects/{project_id}", tag = "admin",
    params(("project_id" = ProjectIdSchema, Path, description = "Project id (proj_...)")),
    security(("admin_token" = [])),
    responses((status = 200, body = ProjectDetails), (status = 403, description = "Admin routes disabled", body = crate::error::ErrorBody), ByIdErrors))]
pub async fn get_project(_: Operator, State(state): State<AppState>, Path(project_id): Path<String>) -> ApiResult<Json<ProjectDetails>> {
    let id: ProjectId = parse_id("project_id", &project_id)?;
    let client = state.pool.get().await?;
    let project = tenancy::get_project(&**client, id).await?.ok_or_else(|| ApiError::not_found("project"))?;
    let overrides = retention::overrides(&client, id, false).await?.ok_or_else(|| ApiError::not_found("project"))?;
    Ok(Json(ProjectDetails { project, retention: ProjectRetention::new(overrides, &state.config.retention) }))
}

/// Change a Project's retention periods (`{"retention": {"events_days": 7, "failed_days":
/// null}}`): a field left out keeps its value, null goes back to the configured default.
/// The worker's retention job applies them from its next run.
#[utoipa::path(patch, path = "/v1/admin/projects/{project_id}", tag = "admin", request_body = UpdateProject,
    params(("project_id" = ProjectIdSchema, Path, description = "Project id (proj_...)")),
    security(("admin_token" = [])),
    responses((status = 200, body = ProjectDetails), (status = 403, description = "Admin routes disabled", body = crate::error::ErrorBody), BodyByIdErrors))]
pub async fn update_project(
    _: Operator,
    State(state): State<AppState>,
    Path(project_id): Path<String>,
    ApiJson(body): ApiJson<UpdateProject>,
) -> ApiResult<Json<ProjectDetails>> {
    let id: ProjectId = parse_id("project_id", &project_id)?;
    let changes = not_null("retention", body.retention)?;
    let (events_days, failed_days) = match changes {
        Some(c) => (
            c.events_days.map(|d| d.map(|d| check_days("retention.events_days", d)).transpose()).transpose()?,
            c.failed_days.map(|d| d.map(|d| check_days("retention.failed_days", d)).transpose()).transpose()?,
        ),
        None => (None, None),
    };
    let mut client = state.pool.get().await?;
    let tx = client.transaction().await?;
    // The row stays locked to the commit: a concurrent update of the other period is kept.
    let mut overrides = retention::overrides(&tx, id, true).await?.ok_or_else(|| ApiError::not_found("project"))?;
    if events_days.is_some() || failed_days.is_some() {
        if let Some(d) = events_days {
            overrides.events_days = d;
        }
        if let Some(d) = failed_days {
            overrides.failed_days = d;
        }
        if !retention::set_overrides(&tx, id, overrides.events_days, overrides.failed_days).await? {
            return Err(ApiError::not_found("project"));
        }
    }
    let project = tenancy::get_project(&*tx, id).await?.ok_or_else(|| ApiError::not_found("project"))?;
    tx.commit().await?;
    Ok(Json(ProjectDetails { project, retention: ProjectRetention::new(overrides, &state.config.retention) }))
}
