//! Organizations, projects and API keys.
//!
//! API keys are `rhk_` + 32 random bytes (base64url). Only their SHA-256 is stored, so a
//! leaked database yields no usable key; the key is shown once, when it is created. Keys are
//! high-entropy, so a fast hash is enough (no password hashing needed).

use base64::Engine;
use chrono::{DateTime, Utc};
use rand::RngCore;
use railhook_core::{ApiKeyId, OrganizationId, ProjectId};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio_postgres::GenericClient;

use crate::StoreError;

pub const API_KEY_PREFIX: &str = "rhk_";

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Organization {
    #[schema(value_type = String)]
    pub id: OrganizationId,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Project {
    #[schema(value_type = String)]
    pub id: ProjectId,
    #[schema(value_type = String)]
    pub organization_id: OrganizationId,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

/// An API key as listed: never its secret.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ApiKey {
    #[schema(value_type = String)]
    pub id: ApiKeyId,
    #[schema(value_type = String)]
    pub project_id: ProjectId,
    pub name: String,
    /// The first characters of the key, to recognise it in a list.
    pub prefix: String,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// A key just created: the only time its secret exists outside the client.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct NewApiKey {
    #[serde(flatten)]
    pub key: ApiKey,
    pub secret: String,
}

/// Who a request is, once its key checked out.
#[derive(Debug, Clone, Copy)]
pub struct Principal {
    pub key_id: ApiKeyId,
    pub project_id: ProjectId,
}

pub fn hash_key(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

fn generate_key() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{API_KEY_PREFIX}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

pub async fn create_organization(db: &impl GenericClient, name: &str) -> Result<Organization, StoreError> {
    let id = OrganizationId::new();
    let row = db
        .query_one("INSERT INTO organizations (id, name) VALUES ($1, $2) RETURNING created_at", &[&id.0, &name])
        .await?;
    Ok(Organization { id, name: name.to_string(), created_at: row.try_get(0)? })
}

/// `None` when the organization does not exist.
pub async fn create_project(db: &impl GenericClient, org: OrganizationId, name: &str) -> Result<Option<Project>, StoreError> {
    let id = ProjectId::new();
    let row = db
        .query_opt(
            "INSERT INTO projects (id, organization_id, name)
             SELECT $1, o.id, $3 FROM organizations o WHERE o.id = $2
             RETURNING created_at",
            &[&id.0, &org.0, &name],
        )
        .await?;
    row.map(|r| Ok(Project { id, organization_id: org, name: name.to_string(), created_at: r.try_get(0)? })).transpose()
}

/// `None` when there is no such project.
pub async fn get_project(db: &impl GenericClient, id: ProjectId) -> Result<Option<Project>, StoreError> {
    let row = db.query_opt("SELECT organization_id, name, created_at FROM projects WHERE id = $1", &[&id.0]).await?;
    row.map(|r| Ok(Project { id, organization_id: OrganizationId(r.try_get(0)?), name: r.try_get(1)?, created_at: r.try_get(2)? })).transpose()
}

/// `None` when the project does not exist.
pub async fn create_api_key(db: &impl GenericClient, project: ProjectId, name: &str) -> Result<Option<NewApiKey>, StoreError> {
    let id = ApiKeyId::new();
    let secret = generate_key();
    let prefix: String = secret.chars().take(API_KEY_PREFIX.len() + 6).collect();
    let row = db
        .query_opt(
            "INSERT INTO api_keys (id, project_id, name, display_prefix, secret_sha256)
             SELECT $1, p.id, $3, $4, $5 FROM projects p WHERE p.id = $2
             RETURNING created_at",
            &[&id.0, &project.0, &name, &prefix, &hash_key(&secret)],
        )
        .await?;
    row.map(|r| Ok(NewApiKey {
        key: ApiKey { id, project_id: project, name: name.to_string(), prefix, created_at: r.try_get(0)?, revoked_at: None },
        secret,
    })).transpose()
}

/// The key's project, if the key exists and is not revoked. One indexed lookup; revocation
/// therefore takes effect on the next request.
/// On every authenticated request: the statement is prepared once per pooled connection (one
/// round trip per request, not a parse and an execute).
pub async fn authenticate<C: deadpool_postgres::GenericClient + Sync>(db: &C, secret: &str) -> Result<Option<Principal>, StoreError> {
    if !secret.starts_with(API_KEY_PREFIX) {
        return Ok(None);
    }
    let statement = db.prepare_cached("SELECT id, project_id FROM api_keys WHERE secret_sha256 = $1 AND revoked_at IS NULL").await?;
    let row = db.query_opt(&statement, &[&hash_key(secret)]).await?;
    row.map(|r| Ok(Principal { key_id: ApiKeyId(r.try_get(0)?), project_id: ProjectId(r.try_get(1)?) })).transpose()
}

pub async fn list_api_keys(db: &impl GenericClient, project: ProjectId) -> Result<Vec<ApiKey>, StoreError> {
    let rows = db
        .query(
            "SELECT id, name, display_prefix, created_at, revoked_at FROM api_keys
             WHERE project_id = $1 ORDER BY id",
            &[&project.0],
        )
        .await?;
    rows.iter().map(|r| Ok(ApiKey {
            id: ApiKeyId(r.try_get(0)?),
            project_id: project,
            name: r.try_get(1)?,
            prefix: r.try_get(2)?,
            created_at: r.try_get(3)?,
            revoked_at: r.try_get(4)?,
        })).collect()
}

/// `false` when the key is not one of the project's (or already revoked).
pub async fn revoke_api_key(db: &impl GenericClient, project: ProjectId, key: ApiKeyId) -> Result<bool, StoreError> {
    let n = db
        .execute(
            "UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND project_id = $2 AND revoked_at IS NULL",
            &[&key.0, &project.0],
        )
        .await?;
    Ok(n == 1)
}
