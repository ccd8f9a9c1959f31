//! Endpoints and their signing secrets.
//!
//! An Endpoint has exactly one current secret (`expires_at IS NULL`, enforced by the partial
//! unique index `endpoint_secrets_one_current`) and, after rotations, older secrets that keep
//! signing until their `expires_at`. The secret never appears in [`Endpoint`]: it is read
//! only through [`secrets`].
//!
//! Every statement filters by `project_id`, so an id of another project behaves exactly like
//! an id that does not exist.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use railhook_core::{EndpointId, ProjectId};
use serde::Serialize;
use tokio_postgres::types::Json;
use tokio_postgres::{GenericClient, Row};

use crate::StoreError;

/// Custom headers sent with every request to an Endpoint, name to value.
pub type EndpointHeaders = BTreeMap<String, String>;

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Endpoint {
    #[schema(value_type = String)]
    pub id: EndpointId,
    pub url: String,
    pub description: String,
    /// A disabled Endpoint gets no new Deliveries.
    pub enabled: bool,
    /// Deliveries per second at most; null: unlimited.
    pub rate_limit_per_second: Option<i32>,
    /// Custom headers sent with every request.
    #[schema(value_type = BTreeMap<String, String>)]
    pub headers: EndpointHeaders,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Ordered Subscriptions: the last Sequence Number handed out to this Endpoint.
    pub last_sequence: i64,
    /// Ordered Subscriptions: the cursor, the highest Sequence Number that ended (delivered or
    /// in Failed Messages); it only moves forward.
    pub ordering_cursor: i64,
}

/// The columns [`endpoint_from`] reads, in its order.
const ENDPOINT_COLUMNS: &str = "id, url, description, enabled, rate_limit_per_second, headers, created_at, updated_at, last_sequence,
    coalesce((SELECT o.cursor FROM endpoint_ordering o WHERE o.endpoint_id = id), 0)";

fn endpoint_from(r: &Row) -> Result<Endpoint, StoreError> {
    Ok(Endpoint {
        id: EndpointId(r.try_get(0)?),
        url: r.try_get(1)?,
        description: r.try_get(2)?,
        enabled: r.try_get(3)?,
        rate_limit_per_second: r.try_get(4)?,
        headers: r.try_get::<_, Json<EndpointHeaders>>(5)?.0,
        created_at: r.try_get(6)?,
        updated_at: r.try_get(7)?,
        last_sequence: r.try_get(8)?,
        ordering_cursor: r.try_get(9)?,
    })
}

/// A validated Endpoint to create, with its first secret.
pub struct NewEndpoint<'a> {
    pub url: &'a str,
    pub description: &'a str,
    pub enabled: bool,
    pub rate_limit_per_second: Option<i32>,
    pub headers: &'a EndpointHeaders,
    pub secret: &'a str,
}

/// Inserts the Endpoint and its current secret in one statement (so one round trip and no
/// Endpoint without a secret).
pub async fn create_endpoint(db: &impl GenericClient, project: ProjectId, new: NewEndpoint<'_>) -> Result<Endpoint, StoreError> {
    let id = EndpointId::new();
    let row = db
        .query_one(
            &format!(
                "WITH ep AS (
                     INSERT INTO endpoints (id, project_id, url, description, enabled, rate_limit_per_second, headers)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)
                     RETURNING {ENDPOINT_COLUMNS}
                 ),
                 secret AS (
                     INSERT INTO endpoint_secrets (id, endpoint_id, secret)
                     SELECT railhook_uuid_v7(), ep.id, $8 FROM ep
                 )
                 SELECT {ENDPOINT_COLUMNS} FROM ep"
            ),
            &[
                &id.0,
                &project.0,
                &new.url,
                &new.description,
                &new.enabled,
                &new.rate_limit_per_second,
                &Json(new.headers),
                &new.secret,
            ],
        )
        .await?;
    endpoint_from(&row)
}

pub async fn get_endpoint(db: &impl GenericClient, project: ProjectId, id: EndpointId) -> Result<Option<Endpoint>, StoreError> {
    let row = db
        .query_opt(&format!("SELECT {ENDPOINT_COLUMNS} FROM endpoints WHERE id = $1 AND project_id = $2"), &[&id.0, &project.0])
        .await?;
    row.as_ref().map(endpoint_from).transpose()
}

/// The project's Endpoints in id (= creation) order after `after`; `limit` rows at most.
pub async fn list_endpoints(
    db: &impl GenericClient,
    project: ProjectId,
    after: Option<EndpointId>,
    limit: i64,
) -> Result<Vec<Endpoint>, StoreError> {
    let rows = db
        .query(
            &format!(
                "SELECT {ENDPOINT_COLUMNS} FROM endpoints
                 WHERE project_id = $1 AND ($2::uuid IS NULL OR id > $2)
                 ORDER BY id LIMIT $3"
            ),
            &[&project.0, &after.map(|a| a.0), &limit],
        )
        .await?;
    rows.iter().map(endpoint_from).collect()
}

/// A partial update: `None` leaves a column as it is.
#[derive(Debug, Default)]
pub struct EndpointChanges<'a> {
    pub url: Option<&'a str>,
    pub description: Option<&'a str>,
    pub enabled: Option<bool>,
    /// `Some(None)` clears the limit.
    pub rate_limit_per_second: Option<Option<i32>>,
    pub headers: Option<&'a EndpointHeaders>,
}

/// `None` when the Endpoint is not one of the project's.
pub async fn update_endpoint(
    db: &impl GenericClient,
    project: ProjectId,
    id: EndpointId,
    changes: EndpointChanges<'_>,
) -> Result<Option<Endpoint>, StoreError> {
    let set_rate = changes.rate_limit_per_second.is_some();
    let rate = changes.rate_limit_per_second.flatten();
    let row = db
        .query_opt(
            &format!(
                "UPDATE endpoints SET
                     url = COALESCE($3, url),
                     description = COALESCE($4, description),
                     enabled = COALESCE($5, enabled),
                     rate_limit_per_second = CASE WHEN $6 THEN $7 ELSE rate_limit_per_second END,
                     headers = COALESCE($8, headers),
                     updated_at = now()
                 WHERE id = $1 AND project_id = $2
                 RETURNING {ENDPOINT_COLUMNS}"
            ),
            &[&id.0, &project.0, &changes.url, &changes.description, &changes.enabled, &set_rate, &rate, &changes.headers.map(Json)],
        )
        .await?;
    row.as_ref().map(endpoint_from).transpose()
}

/// Deletes the Endpoint with its secrets, Subscriptions, circuit and Deliveries: disabled
/// first, then its Deliveries in short batches, then the row (the foreign keys cascade to the
/// rest); see [`crate::deletion`]. `false` when it is not one of the project's.
pub async fn delete_endpoint(db: &impl GenericClient, project: ProjectId, id: EndpointId) -> Result<bool, StoreError> {
    let found = db.execute("UPDATE endpoints SET enabled = false, updated_at = now() WHERE id = $1 AND project_id = $2", &[&id.0, &project.0]).await?;
    if found == 0 {
        return Ok(false);
    }
    crate::deletion::in_batches(db, crate::deletion::ENDPOINT_DELIVERIES, &id.0).await?;
    let n = db.execute("DELETE FROM endpoints WHERE id = $1 AND project_id = $2", &[&id.0, &project.0]).await?;
    Ok(n == 1)
}

/// A secret that was rotated out and still signs until `expires_at`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct PreviousSecret {
    pub secret: String,
    pub expires_at: DateTime<Utc>,
}

/// The secrets that sign an Endpoint's deliveries right now.
#[derive(Debug, Clone)]
pub struct EndpointSecrets {
    /// `None` only for an Endpoint written around this module (every Endpoint created here
    /// has one).
    pub current: Option<String>,
    /// Unexpired rotated-out secrets, newest first.
    pub previous: Vec<PreviousSecret>,
}

/// `None` when the Endpoint is not one of the project's. One statement: the Endpoint row
/// is joined so that "no such Endpoint" and "no secret" stay distinguishable.
pub async fn secrets(db: &impl GenericClient, project: ProjectId, id: EndpointId) -> Result<Option<EndpointSecrets>, StoreError> {
    let rows = db
        .query(
            "SELECT s.secret, s.expires_at
             FROM endpoints e
             LEFT JOIN endpoint_secrets s
                    ON s.endpoint_id = e.id AND (s.expires_at IS NULL OR s.expires_at > now())
             WHERE e.id = $1 AND e.project_id = $2
             ORDER BY s.created_at DESC",
            &[&id.0, &project.0],
        )
        .await?;
    if rows.is_empty() {
        return Ok(None);
    }
    let mut found = EndpointSecrets { current: None, previous: Vec::new() };
    for r in &rows {
        let secret: Option<String> = r.try_get(0)?;
        let expires_at: Option<DateTime<Utc>> = r.try_get(1)?;
        match (secret, expires_at) {
            (Some(secret), None) => found.current = Some(secret),
            (Some(secret), Some(expires_at)) => found.previous.push(PreviousSecret { secret, expires_at }),
            (None, _) => {}
        }
    }
    Ok(Some(found))
}

/// What a rotation did.
#[derive(Debug, Clone)]
pub struct Rotation {
    /// When the secret that was current until now stops signing; `None` if there was none.
    pub previous_expires_at: Option<DateTime<Utc>>,
}

/// Makes `new_secret` the current secret and lets the previous one sign for `grace_seconds`
/// more. `None` when the Endpoint is not one of the project's.
///
/// Run it inside a transaction: the first statement locks the Endpoint row, so concurrent
/// rotations of one Endpoint queue up and each sees the secret its predecessor inserted
/// (under READ COMMITTED every later statement takes a fresh snapshot). Without the lock
/// two rotations would both insert a current secret and the loser would hit the
/// one-current-secret index.
pub async fn rotate_secret(
    db: &impl GenericClient,
    project: ProjectId,
    id: EndpointId,
    new_secret: &str,
    grace_seconds: u64,
) -> Result<Option<Rotation>, StoreError> {
    let locked = db
        .query_opt("SELECT 1 FROM endpoints WHERE id = $1 AND project_id = $2 FOR UPDATE", &[&id.0, &project.0])
        .await?;
    if locked.is_none() {
        return Ok(None);
    }
    let grace = i64::try_from(grace_seconds).unwrap_or(i64::MAX).min(100 * 365 * 24 * 3600);
    // The INSERT reads the aggregate over `retired`, so the UPDATE has finished before the new
    // row is inserted: the unique index never sees two current secrets. (The order of
    // independent data-modifying CTEs is not defined; this dependency defines it.)
    let row = db
        .query_one(
            "WITH retired AS (
                 UPDATE endpoint_secrets
                 SET expires_at = now() + make_interval(secs => $3::bigint)
                 WHERE endpoint_id = $1 AND expires_at IS NULL
                 RETURNING expires_at
             ),
             previous AS (SELECT max(expires_at) AS expires_at FROM retired),
             inserted AS (
                 INSERT INTO endpoint_secrets (id, endpoint_id, secret)
                 SELECT railhook_uuid_v7(), $1, $2 FROM previous
             )
             SELECT expires_at FROM previous",
            &[&id.0, &new_secret, &grace],
        )
        .await?;
    Ok(Some(Rotation { previous_expires_at: row.try_get(0)? }))
}
