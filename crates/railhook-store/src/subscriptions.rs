//! Subscriptions: an Endpoint wants the Events whose type matches a pattern, delivered with
//! its own Retry Ladder, timeout and (opt-in) ordering.
//!
//! Every statement filters by `project_id`; a Subscription is created only on an Endpoint of
//! the same project, checked by the INSERT itself.

use chrono::{DateTime, Utc};
use railhook_core::{EndpointId, ProjectId, SubscriptionId};
use serde::Serialize;
use tokio_postgres::{GenericClient, Row};

use crate::StoreError;

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Subscription {
    #[schema(value_type = String)]
    pub id: SubscriptionId,
    #[schema(value_type = String)]
    pub endpoint_id: EndpointId,
    /// The event type pattern (`order.paid`, `order.*`, `order.**`, `**`); stored in
    /// `event_type_pattern`.
    pub event_type: String,
    /// Deliveries to the Endpoint get sequence numbers and go out in commit order.
    pub ordering: bool,
    /// Attempts per Delivery before it becomes a Failed Message.
    pub max_attempts: i16,
    /// How long one Attempt may take.
    pub timeout_seconds: i16,
    /// Seconds to wait after the 1st, 2nd, ... failed Attempt. When the list is shorter than
    /// `max_attempts - 1`, its last delay repeats; `None` means the default outgoing ladder
    /// (`events::DEFAULT_OUTGOING_DELAYS`).
    pub retry_delays: Option<Vec<i32>>,
    /// A disabled Subscription matches no new Events.
    pub enabled: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// The columns [`subscription_from`] reads, in its order.
const SUBSCRIPTION_COLUMNS: &str =
    "id, endpoint_id, event_type_pattern, ordering, max_attempts, timeout_seconds, retry_delays, enabled, created_at, updated_at";

fn subscription_from(r: &Row) -> Result<Subscription, StoreError> {
    Ok(Subscription {
        id: SubscriptionId(r.try_get(0)?),
        endpoint_id: EndpointId(r.try_get(1)?),
        event_type: r.try_get(2)?,
        ordering: r.try_get(3)?,
        max_attempts: r.try_get(4)?,
        timeout_seconds: r.try_get(5)?,
        retry_delays: r.try_get(6)?,
        enabled: r.try_get(7)?,
        created_at: r.try_get(8)?,
        updated_at: r.try_get(9)?,
    })
}

/// A validated Subscription to create.
pub struct NewSubscription<'a> {
    pub endpoint_id: EndpointId,
    pub event_type_pattern: &'a str,
    pub ordering: bool,
    pub max_attempts: i16,
    pub timeout_seconds: i16,
    pub retry_delays: Option<&'a [i32]>,
    pub enabled: bool,
}

/// `None` when `endpoint_id` is not one of the project's Endpoints: the INSERT selects the
/// Endpoint row, so the check and the write are one statement.
pub async fn create_subscription(
    db: &impl GenericClient,
    project: ProjectId,
    new: NewSubscription<'_>,
) -> Result<Option<Subscription>, StoreError> {
    let id = SubscriptionId::new();
    let row = db
        .query_opt(
            &format!(
                "INSERT INTO subscriptions (id, project_id, endpoint_id, event_type_pattern, ordering,
                                            max_attempts, timeout_seconds, retry_delays, enabled)
                 SELECT $1, e.project_id, e.id, $4, $5, $6, $7, $8, $9
                 FROM endpoints e WHERE e.id = $3 AND e.project_id = $2
                 RETURNING {SUBSCRIPTION_COLUMNS}"
            ),
            &[
                &id.0,
                &project.0,
                &new.endpoint_id.0,
                &new.event_type_pattern,
                &new.ordering,
                &new.max_attempts,
                &new.timeout_seconds,
                &new.retry_delays,
                &new.enabled,
            ],
        )
        .await?;
    row.as_ref().map(subscription_from).transpose()
}

pub async fn get_subscription(db: &impl GenericClient, project: ProjectId, id: SubscriptionId) -> Result<Option<Subscription>, StoreError> {
    let row = db
        .query_opt(
            &format!("SELECT {SUBSCRIPTION_COLUMNS} FROM subscriptions WHERE id = $1 AND project_id = $2"),
            &[&id.0, &project.0],
        )
        .await?;
    row.as_ref().map(subscription_from).transpose()
}

/// The project's Subscriptions (of one Endpoint, if given) in id order after `after`;
/// `limit` rows at most.
pub async fn list_subscriptions(
    db: &impl GenericClient,
    project: ProjectId,
    endpoint: Option<EndpointId>,
    after: Option<SubscriptionId>,
    limit: i64,
) -> Result<Vec<Subscription>, StoreError> {
    let rows = db
        .query(
            &format!(
                "SELECT {SUBSCRIPTION_COLUMNS} FROM subscriptions
                 WHERE project_id = $1
                   AND ($2::uuid IS NULL OR endpoint_id = $2)
                   AND ($3::uuid IS NULL OR id > $3)
                 ORDER BY id LIMIT $4"
            ),
            &[&project.0, &endpoint.map(|e| e.0), &after.map(|a| a.0), &limit],
        )
        .await?;
    rows.iter().map(subscription_from).collect()
}

/// A partial update: `None` leaves a column as it is.
#[derive(Debug, Default)]
pub struct SubscriptionChanges<'a> {
    pub event_type_pattern: Option<&'a str>,
    pub ordering: Option<bool>,
    pub max_attempts: Option<i16>,
    pub timeout_seconds: Option<i16>,
    /// `Some(None)` goes back to the default ladder.
    pub retry_delays: Option<Option<&'a [i32]>>,
    pub enabled: Option<bool>,
}

/// `None` when the Subscription is not one of the project's. Changes apply to Deliveries
/// created afterwards: a Delivery copies its ladder and timeout when it is created.
pub async fn update_subscription(
    db: &impl GenericClient,
    project: ProjectId,
    id: SubscriptionId,
    changes: SubscriptionChanges<'_>,
) -> Result<Option<Subscription>, StoreError> {
    let set_delays = changes.retry_delays.is_some();
    let delays = changes.retry_delays.flatten();
    let row = db
        .query_opt(
            &format!(
                "UPDATE subscriptions SET
                     event_type_pattern = COALESCE($3, event_type_pattern),
                     ordering = COALESCE($4, ordering),
                     max_attempts = COALESCE($5, max_attempts),
                     timeout_seconds = COALESCE($6, timeout_seconds),
                     retry_delays = CASE WHEN $7 THEN $8 ELSE retry_delays END,
                     enabled = COALESCE($9, enabled),
                     updated_at = now()
                 WHERE id = $1 AND project_id = $2
                 RETURNING {SUBSCRIPTION_COLUMNS}"
            ),
            &[
                &id.0,
                &project.0,
                &changes.event_type_pattern,
                &changes.ordering,
                &changes.max_attempts,
                &changes.timeout_seconds,
                &set_delays,
                &delays,
                &changes.enabled,
            ],
        )
        .await?;
    row.as_ref().map(subscription_from).transpose()
}

/// `false` when the Subscription is not one of the project's. Its Deliveries stay, and keep
/// its id as their `subscription_id` (no foreign key since migration 0027: the delete
/// touches none of them).
pub async fn delete_subscription(db: &impl GenericClient, project: ProjectId, id: SubscriptionId) -> Result<bool, StoreError> {
    let n = db.execute("DELETE FROM subscriptions WHERE id = $1 AND project_id = $2", &[&id.0, &project.0]).await?;
    Ok(n == 1)
}
