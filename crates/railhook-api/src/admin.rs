//! Operator routes: organizations and projects (`Authorization: Bearer $RAILHOOK_ADMIN_TOKEN`).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use railhook_core::OrganizationId;
use railhook_store::tenancy::{self, NewApiKey, Organization, Project};
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ApiResult};
use crate::extract::{parse_id, ApiJson, Operator};
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
