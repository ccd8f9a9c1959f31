//! Sources (a provider's webhooks arriving at one ingress URL) and their Destinations.
//!
//! A Source has one current secret (`sources.secret`) and, after rotations, retired ones in
//! `source_retired_secrets` that still verify until their `expires_at`. The ingress reads the
//! Source, its provider configuration and every unexpired secret in one statement
//! ([`source_for_ingress`]).
//!
//! The ingress token is stored as it is, not hashed: it is an address, not a credential. What
//! makes a request genuine is the provider's signature, whose secret must be stored in clear
//! anyway (an HMAC cannot be checked against a hash), so a hashed token would protect nothing
//! a leaked table does not already give away; in clear, the Sources API can show the ingress
//! URL at any time, as operators expect.
//!
//! Every statement filters by `project_id`, so another project's id behaves exactly like an
//! id that does not exist.

use base64::Engine;
use chrono::{DateTime, Utc};
use railhook_core::{DestinationId, ProjectId, SourceId};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use tokio_postgres::types::Json;
use tokio_postgres::{GenericClient, Row};

use crate::StoreError;

/// Random bytes in an ingress token: 256 bits, well above the 128 the design asks for.
pub const INGRESS_TOKEN_BYTES: usize = 32;

/// A new ingress token: [`INGRESS_TOKEN_BYTES`] random bytes, base64url without padding
/// (43 characters, safe in a URL path).
pub fn new_ingress_token() -> String {
    let mut bytes = [0u8; INGRESS_TOKEN_BYTES];
    rand::rng().fill_bytes(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A Source as stored: never its secrets.
#[derive(Debug, Clone)]
pub struct Source {
    pub id: SourceId,
    pub name: String,
    /// The provider's snake_case name (`stripe`, `github`, ..., `generic_hmac`).
    pub provider: String,
    /// The provider's configuration (`generic_hmac` only), as the ingress crate serialises it.
    pub config: Option<serde_json::Value>,
    pub ingress_token: String,
    /// A disabled Source answers 410 at its ingress URL and stores nothing.
    pub enabled: bool,
    /// Requests per second accepted at the ingress; `None`: unlimited.
    pub rate_limit_per_second: Option<i32>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

const SOURCE_COLUMNS: &str = "id, name, provider, config, ingress_token, enabled, rate_limit_per_second, created_at, updated_at";

fn source_from(r: &Row) -> Result<Source, StoreError> {
    Ok(Source {
        id: SourceId(r.try_get(0)?),
        name: r.try_get(1)?,
        provider: r.try_get(2)?,
        config: r.try_get::<_, Option<Json<serde_json::Value>>>(3)?.map(|j| j.0),
        ingress_token: r.try_get(4)?,
        enabled: r.try_get(5)?,
        rate_limit_per_second: r.try_get(6)?,
        created_at: r.try_get(7)?,
        updated_at: r.try_get(8)?,
    })
}

/// A validated Source to create.
pub struct NewSource<'a> {
    pub name: &'a str,
    pub provider: &'a str,
    pub config: Option<&'a serde_json::Value>,
    pub secret: &'a str,
    pub enabled: bool,
    pub rate_limit_per_second: Option<i32>,
}

/// Inserts the Source with a fresh ingress token.
pub async fn create_source(db: &impl GenericClient, project: ProjectId, new: NewSource<'_>) -> Result<Source, StoreError> {
    let id = SourceId::new();
    let token = new_ingress_token();
    let row = db
        .query_one(
            &format!(
                "INSERT INTO sources (id, project_id, name, provider, config, secret, ingress_token, enabled, rate_limit_per_second)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                 RETURNING {SOURCE_COLUMNS}"
            ),
            &[&id.0, &project.0, &new.name, &new.provider, &new.config.map(Json), &new.secret, &token, &new.enabled, &new.rate_limit_per_second],
        )
        .await?;
    source_from(&row)
}

pub async fn get_source(db: &impl GenericClient, project: ProjectId, id: SourceId) -> Result<Option<Source>, StoreError> {
    let row = db
        .query_opt(&format!("SELECT {SOURCE_COLUMNS} FROM sources WHERE id = $1 AND project_id = $2"), &[&id.0, &project.0])
        .await?;
    row.as_ref().map(source_from).transpose()
}

/// The project's Sources in id (= creation) order after `after`; `limit` rows at most.
pub async fn list_sources(db: &impl GenericClient, project: ProjectId, after: Option<SourceId>, limit: i64) -> Result<Vec<Source>, StoreError> {
    let rows = db
        .query(
            &format!(
                "SELECT {SOURCE_COLUMNS} FROM sources
                 WHERE project_id = $1 AND ($2::uuid IS NULL OR id > $2)
                 ORDER BY id LIMIT $3"
            ),
            &[&project.0, &after.map(|a| a.0), &limit],
        )
        .await?;
    rows.iter().map(source_from).collect()
}

/// A partial update: `None` leaves a column as it is. The provider never changes (its
/// secret would not fit another).
#[derive(Debug, Default)]
pub struct SourceChanges<'a> {
    pub name: Option<&'a str>,
    /// Only for `generic_hmac`, validated by the caller.
    pub config: Option<&'a serde_json::Value>,
    pub enabled: Option<bool>,
    /// `Some(None)` removes the limit.
    pub rate_limit_per_second: Option<Option<i32>>,
}

/// `None` when the Source is not one of the project's.
pub async fn update_source(db: &impl GenericClient, project: ProjectId, id: SourceId, changes: SourceChanges<'_>) -> Result<Option<Source>, StoreError> {
    let set_rate = changes.rate_limit_per_second.is_some();
    let rate = changes.rate_limit_per_second.flatten();
    let row = db
        .query_opt(
            &format!(
                "UPDATE sources SET
                     name = COALESCE($3, name),
                     config = COALESCE($4, config),
                     enabled = COALESCE($5, enabled),
                     rate_limit_per_second = CASE WHEN $6 THEN $7 ELSE rate_limit_per_second END,
                     updated_at = now()
                 WHERE id = $1 AND project_id = $2
                 RETURNING {SOURCE_COLUMNS}"
            ),
            &[&id.0, &project.0, &changes.name, &changes.config.map(Json), &changes.enabled, &set_rate, &rate],
        )
        .await?;
    row.as_ref().map(source_from).transpose()
}

/// Deletes the Source with its secrets, Destinations, Incoming Events and Forwards: disabled
/// first (the ingress refuses it), then its Forwards and Incoming Events in short batches,
/// then the row (the foreign keys cascade to the rest); see [`crate::deletion`]. `false` when
/// it is not one of the project's.
pub async fn delete_source(db: &impl GenericClient, project: ProjectId, id: SourceId) -> Result<bool, StoreError> {
    let found = db.execute("UPDATE sources SET enabled = false, updated_at = now() WHERE id = $1 AND project_id = $2", &[&id.0, &project.0]).await?;
    if found == 0 {
        return Ok(false);
    }
    crate::deletion::in_batches(db, crate::deletion::SOURCE_FORWARDS, &id.0).await?;
    crate::deletion::in_batches(db, crate::deletion::SOURCE_INCOMING_EVENTS, &id.0).await?;
    let n = db.execute("DELETE FROM sources WHERE id = $1 AND project_id = $2", &[&id.0, &project.0]).await?;
    Ok(n == 1)
}

/// The Source's current secret with its provider (to validate a new secret against).
/// `None` when the Source is not one of the project's.
pub async fn provider_of(db: &impl GenericClient, project: ProjectId, id: SourceId) -> Result<Option<(String, Option<serde_json::Value>)>, StoreError> {
    let row = db.query_opt("SELECT provider, config FROM sources WHERE id = $1 AND project_id = $2", &[&id.0, &project.0]).await?;
    row.map(|r| Ok((r.try_get(0)?, r.try_get::<_, Option<Json<serde_json::Value>>>(1)?.map(|j| j.0)))).transpose()
}

/// Makes `new_secret` current; the previous one keeps verifying for `overlap_seconds`.
/// Returns when it stops (`None` if the Source is not one of the project's). One statement:
/// the UPDATE's row lock orders concurrent rotations of one Source, and each retires the
/// secret its predecessor made current. Retired secrets already expired are deleted here.
pub async fn rotate_source_secret(
    db: &impl GenericClient,
    project: ProjectId,
    id: SourceId,
    new_secret: &str,
    overlap_seconds: u64,
) -> Result<Option<DateTime<Utc>>, StoreError> {
    let overlap = i64::try_from(overlap_seconds).unwrap_or(i64::MAX).min(100 * 365 * 24 * 3600);
    let row = db
        .query_opt(
            "WITH old AS (
                 SELECT id, secret FROM sources WHERE id = $1 AND project_id = $2 FOR UPDATE
             ),
             rotated AS (
                 UPDATE sources s SET secret = $3, updated_at = now() FROM old WHERE s.id = old.id
                 RETURNING s.id
             ),
             retired AS (
                 INSERT INTO source_retired_secrets (id, source_id, secret, expires_at)
                 SELECT railhook_uuid_v7(), old.id, old.secret, now() + make_interval(secs => $4::bigint)
                 FROM old JOIN rotated ON rotated.id = old.id
                 WHERE $4::bigint > 0
                 RETURNING expires_at
             ),
             cleaned AS (
                 DELETE FROM source_retired_secrets r USING old WHERE r.source_id = old.id AND r.expires_at <= now()
             )
             SELECT COALESCE((SELECT expires_at FROM retired), now()) FROM rotated",
            &[&id.0, &project.0, &new_secret, &overlap],
        )
        .await?;
    row.map(|r| Ok(r.try_get(0)?)).transpose()
}

/// What the ingress needs of a Source, found by its token.
#[derive(Debug, Clone)]
pub struct IngressSource {
    pub id: SourceId,
    pub project_id: ProjectId,
    pub provider: String,
    pub config: Option<serde_json::Value>,
    pub enabled: bool,
    pub rate_limit_per_second: Option<i32>,
    /// The current secret first, then the unexpired retired ones, newest first.
    pub secrets: Vec<String>,
}

/// The Source behind an ingress token, with every secret that verifies right now; one
/// statement.
pub async fn source_for_ingress<C: deadpool_postgres::GenericClient + Sync>(db: &C, token: &str) -> Result<Option<IngressSource>, StoreError> {
    let statement = db
        .prepare_cached(
            "SELECT s.id, s.project_id, s.provider, s.config, s.enabled, s.rate_limit_per_second,
                    array_prepend(s.secret, ARRAY(SELECT r.secret FROM source_retired_secrets r
                                                  WHERE r.source_id = s.id AND r.expires_at > now()
                                                  ORDER BY r.expires_at DESC))
             FROM sources s WHERE s.ingress_token = $1",
        )
        .await?;
    let row = db.query_opt(&statement, &[&token]).await?;
    row.map(|r| Ok(IngressSource {
        id: SourceId(r.try_get(0)?),
        project_id: ProjectId(r.try_get(1)?),
        provider: r.try_get(2)?,
        config: r.try_get::<_, Option<Json<serde_json::Value>>>(3)?.map(|j| j.0),
        enabled: r.try_get(4)?,
        rate_limit_per_second: r.try_get(5)?,
        secrets: r.try_get(6)?,
    })).transpose()
}

/// How Railhook authenticates to a Destination, stored as `destinations.auth`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum DestinationAuth {
    None,
    /// `Authorization: Basic base64(username:password)`.
    Basic { username: String, password: String },
    /// `Authorization: Bearer <token>`.
    Bearer { token: String },
    /// One custom header, e.g. `X-Api-Key: ...`.
    Header { name: String, value: String },
    /// Re-signed with Standard Webhooks headers (`webhook-id`, `webhook-timestamp`,
    /// `webhook-signature`) using this Destination's own `whsec_` secret.
    StandardWebhooks { secret: String },
}

/// A Destination, with its credentials (the API decides what it shows of them).
#[derive(Debug, Clone)]
pub struct Destination {
    pub id: DestinationId,
    pub source_id: SourceId,
    pub url: String,
    pub auth: DestinationAuth,
    /// A disabled Destination gets no new Forwards.
    pub enabled: bool,
    /// Forwards per second at most; `None`: unlimited.
    pub rate_limit_per_second: Option<i32>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

pub(crate) const DESTINATION_COLUMNS: &str = "d.id, d.source_id, d.url, d.auth, d.enabled, d.rate_limit_per_second, d.created_at, d.updated_at";

/// Reads [`DESTINATION_COLUMNS`] starting at column `at`.
pub(crate) fn destination_from(r: &Row, at: usize) -> Result<Destination, StoreError> {
    let auth: Json<serde_json::Value> = r.try_get(at + 3)?;
    let auth = serde_json::from_value(auth.0).map_err(|e| StoreError::Misconfigured(format!("destinations.auth does not parse: {e}")))?;
    Ok(Destination {
        id: DestinationId(r.try_get(at)?),
        source_id: SourceId(r.try_get(at + 1)?),
        url: r.try_get(at + 2)?,
        auth,
        enabled: r.try_get(at + 4)?,
        rate_limit_per_second: r.try_get(at + 5)?,
        created_at: r.try_get(at + 6)?,
        updated_at: r.try_get(at + 7)?,
    })
}

pub struct NewDestination<'a> {
    pub url: &'a str,
    pub auth: &'a DestinationAuth,
    pub enabled: bool,
    pub rate_limit_per_second: Option<i32>,
}

/// `None` when the Source is not one of the project's.
pub async fn create_destination(
    db: &impl GenericClient,
    project: ProjectId,
    source: SourceId,
    new: NewDestination<'_>,
) -> Result<Option<Destination>, StoreError> {
    let id = DestinationId::new();
    let row = db
        .query_opt(
            &format!(
                "INSERT INTO destinations AS d (id, project_id, source_id, url, auth, enabled, rate_limit_per_second)
                 SELECT $1, s.project_id, s.id, $4, $5, $6, $7 FROM sources s WHERE s.id = $3 AND s.project_id = $2
                 RETURNING {DESTINATION_COLUMNS}"
            ),
            &[&id.0, &project.0, &source.0, &new.url, &Json(new.auth), &new.enabled, &new.rate_limit_per_second],
        )
        .await?;
    row.map(|r| destination_from(&r, 0)).transpose()
}

pub async fn get_destination(db: &impl GenericClient, project: ProjectId, source: SourceId, id: DestinationId) -> Result<Option<Destination>, StoreError> {
    let row = db
        .query_opt(
            &format!("SELECT {DESTINATION_COLUMNS} FROM destinations d WHERE d.id = $1 AND d.source_id = $2 AND d.project_id = $3"),
            &[&id.0, &source.0, &project.0],
        )
        .await?;
    row.map(|r| destination_from(&r, 0)).transpose()
}

/// The Source's Destinations in id order after `after`; `None` when the Source is not one
/// of the project's (so an empty page and an unknown Source stay apart).
pub async fn list_destinations(
    db: &impl GenericClient,
    project: ProjectId,
    source: SourceId,
    after: Option<DestinationId>,
    limit: i64,
) -> Result<Option<Vec<Destination>>, StoreError> {
    let rows = db
        .query(
            &format!(
                "SELECT {DESTINATION_COLUMNS} FROM sources s
                 LEFT JOIN LATERAL (
                     SELECT * FROM destinations d
                     WHERE d.source_id = s.id AND d.project_id = s.project_id AND ($3::uuid IS NULL OR d.id > $3)
                     ORDER BY d.id LIMIT $4
                 ) d ON true
                 WHERE s.id = $1 AND s.project_id = $2
                 ORDER BY d.id"
            ),
            &[&source.0, &project.0, &after.map(|a| a.0), &limit],
        )
        .await?;
    if rows.is_empty() {
        return Ok(None);
    }
    let mut found = Vec::with_capacity(rows.len());
    for r in &rows {
        // The Source's row without a Destination (LEFT JOIN): none on this page.
        if r.try_get::<_, Option<uuid::Uuid>>(0)?.is_some() {
            found.push(destination_from(r, 0)?);
        }
    }
    Ok(Some(found))
}

#[derive(Debug, Default)]
pub struct DestinationChanges<'a> {
    pub url: Option<&'a str>,
    pub auth: Option<&'a DestinationAuth>,
    pub enabled: Option<bool>,
    /// `Some(None)` removes the limit.
    pub rate_limit_per_second: Option<Option<i32>>,
}

pub async fn update_destination(
    db: &impl GenericClient,
    project: ProjectId,
    source: SourceId,
    id: DestinationId,
    changes: DestinationChanges<'_>,
) -> Result<Option<Destination>, StoreError> {
    let set_rate = changes.rate_limit_per_second.is_some();
    let rate = changes.rate_limit_per_second.flatten();
    let row = db
        .query_opt(
            &format!(
                "UPDATE destinations d SET
                     url = COALESCE($4, d.url),
                     auth = COALESCE($5, d.auth),
                     enabled = COALESCE($6, d.enabled),
                     rate_limit_per_second = CASE WHEN $7 THEN $8 ELSE d.rate_limit_per_second END,
                     updated_at = now()
                 WHERE d.id = $1 AND d.source_id = $2 AND d.project_id = $3
                 RETURNING {DESTINATION_COLUMNS}"
            ),
            &[&id.0, &source.0, &project.0, &changes.url, &changes.auth.map(Json), &changes.enabled, &set_rate, &rate],
        )
        .await?;
    row.map(|r| destination_from(&r, 0)).transpose()
}

/// Deletes the Destination with its circuit and Forwards: disabled first, then its Forwards
/// in short batches, then the row; see [`crate::deletion`]. `false` when it is not the
/// Source's (or the Source not the project's).
pub async fn delete_destination(db: &impl GenericClient, project: ProjectId, source: SourceId, id: DestinationId) -> Result<bool, StoreError> {
    let found = db
        .execute(
            "UPDATE destinations SET enabled = false, updated_at = now() WHERE id = $1 AND source_id = $2 AND project_id = $3",
            &[&id.0, &source.0, &project.0],
        )
        .await?;
    if found == 0 {
        return Ok(false);
    }
    crate::deletion::in_batches(db, crate::deletion::DESTINATION_FORWARDS, &id.0).await?;
    let n = db
        .execute("DELETE FROM destinations WHERE id = $1 AND source_id = $2 AND project_id = $3", &[&id.0, &source.0, &project.0])
        .await?;
    Ok(n == 1)
}
