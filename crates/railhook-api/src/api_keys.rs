//! `/v1/api-keys`: a project's keys. Secrets are shown once, at creation.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use railhook_core::ApiKeyId;
use railhook_store::tenancy::{self, ApiKey, NewApiKey};
use serde::Deserialize;

use crate::error::{ApiError, ApiResult};
use crate::extract::{parse_id, ApiJson, Project};
use crate::pagination::List;
use crate::AppState;
#[allow(unused_imports)] // The shared error responses of the OpenAPI attributes below.
use crate::error::responses::*;

#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateApiKey {
    /// At most 200 characters.
    #[serde(default)]
    #[schema(schema_with = name_schema)]
    pub name: String,
}

/// The longest API key name.
pub const MAX_NAME_CHARS: usize = 200;

fn name_schema() -> utoipa::openapi::Object {
    crate::schema::text(MAX_NAME_CHARS).build()
}

/// Create an API key for the caller's project; the secret is shown only in this response.
#[utoipa::path(post, path = "/v1/api-keys", tag = "api-keys", request_body = CreateApiKey,
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 201, body = NewApiKey), BodyErrors))]
pub async fn create(
    Project(principal): Project,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateApiKey>,
) -> ApiResult<(StatusCode, Json<NewApiKey>)> {
    if body.name.chars().count() > MAX_NAME_CHARS {
        return Err(ApiError::invalid("name", format!("name must be at most {MAX_NAME_CHARS} characters")));
    }
    let client = state.pool.get().await?;
    let key = tenancy::create_api_key(&**client, principal.project_id, body.name.trim())
        .await?
        .ok_or_else(|| ApiError::not_found("project"))?;
    Ok((StatusCode::CREATED, Json(key)))
}

/// List the project's API keys, without their secrets.
#[utoipa::path(get, path = "/v1/api-keys", tag = "api-keys",
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 200, body = crate::pagination::List<ApiKey>), AuthErrors))]
pub async fn list(Project(principal): Project, State(state): State<AppState>) -> ApiResult<Json<List<ApiKey>>> {
    let client = state.pool.get().await?;
    let keys = tenancy::list_api_keys(&**client, principal.project_id).await?;
    Ok(Json(List { data: keys, next_cursor: None }))
}

/// Revoke an API key; it stops working at once.
#[utoipa::path(delete, path = "/v1/api-keys/{id}", tag = "api-keys",
    params(("id" = crate::schema::ApiKeyId, Path, description = "API key id (key_...)")),
    security(("api_key" = []), ("api_key_header" = [])),
    responses((status = 204, description = "Revoked"), ByIdErrors))]
pub async fn revoke(
    Project(principal): Project,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let id: ApiKeyId = parse_id("id", &id)?;
    let client = state.pool.get().await?;
    if tenancy::revoke_api_key(&**client, principal.project_id, id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("api key"))
    }
}
