//! A Replay's Deliveries (the Time Machine): (none) -> PENDING, announced.
//!
//! One statement per batch makes a *new* Delivery for each (Event, Endpoint, Subscription)
//! the runner chose (`crate::replays`): a new id (the `webhook-id`, so the receiver's dedupe
//! lets it through), the same Event (`X-Event-Id`), the Subscription's ladder as it is now,
//! `ordered` where that Subscription is ordered (its new Sequence Number comes with its first
//! claim, in the order of the announcements: the batch's Event order), `replay_id` (unique per
//! (replay, event, endpoint): `deliveries_replay_once_idx`), `replay_of` the original
//! Delivery of that Event and Endpoint when there is one, and its Outbox row (reason
//! `replay`) in the same statement. The caller moves the Replay's cursor in the same
//! transaction.

use deadpool_postgres::GenericClient;
use railhook_core::{AnnouncementReason, EndpointId, EventId, ProjectId, ReplayId, SubscriptionId};

use crate::events::DEFAULT_OUTGOING_DELAYS;
use crate::StoreError;

/// One Delivery a batch makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayTarget {
    pub event: EventId,
    pub endpoint: EndpointId,
    pub subscription: SubscriptionId,
}

const INSERT_SQL: &str = concat!(
    "
WITH pick AS (
    SELECT p.ord, p.event_id, p.endpoint_id, s.id AS subscription_id, s.ordering,
           s.max_attempts, s.timeout_seconds, COALESCE(s.retry_delays, $6::int[]) AS retry_delays
    FROM unnest($3::uuid[], $4::uuid[], $5::uuid[]) WITH ORDINALITY AS p(event_id, endpoint_id, subscription_id, ord)
    JOIN subscriptions s ON s.id = p.subscription_id AND s.project_id = $2
),
dl AS (
    INSERT INTO deliveries (id, project_id, event_id, endpoint_id, subscription_id, max_attempts,
                            retry_delays, timeout_seconds, ordered, replay_id, replay_of)
    SELECT railhook_uuid_v7(), $2, pick.event_id, pick.endpoint_id, pick.subscription_id, pick.max_attempts,
           pick.retry_delays, pick.timeout_seconds, pick.ordering, $1,
           (SELECT o.id FROM deliveries o
            WHERE o.event_id = pick.event_id AND o.endpoint_id = pick.endpoint_id
              AND o.replay_of IS NULL AND o.replay_id IS NULL
            ORDER BY o.id LIMIT 1)
    FROM pick
    ORDER BY pick.ord
    RETURNING id, endpoint_id, event_id
),
ob AS (
    -- Each new Delivery in its Event's trace (issue 33), as the Event's retries are: the
    -- Event's kept context, read here because the announcement's own lookup cannot see the
    -- Deliveries this statement makes (NULL elements: an Event without one). In the batch's
    -- Event order (one Delivery per Event and Endpoint), which an ordered Endpoint's new
    -- Sequence Numbers follow.
    SELECT railhook_announce('d', array_agg($2::uuid ORDER BY pick.ord), array_agg(dl.id ORDER BY pick.ord), array_agg(dl.endpoint_id ORDER BY pick.ord), $7,
                             NULL, coalesce(array_agg(e.traceparent ORDER BY pick.ord), '{}'), coalesce(array_agg(e.tracestate ORDER BY pick.ord), '{}')) AS n
    FROM dl JOIN pick ON pick.event_id = dl.event_id AND pick.endpoint_id = dl.endpoint_id
    LEFT JOIN events e ON e.id = dl.event_id
)
SELECT count(*) FROM dl CROSS JOIN ob"
);

/// Makes the batch's Deliveries and their announcements; returns how many were made (a
/// target whose Subscription was deleted since it was chosen makes none). Run it inside the
/// transaction that moves the Replay's cursor: a duplicate (replay, event, endpoint) is a
/// unique violation, never a second Delivery.
pub async fn insert_batch<C: GenericClient + Sync>(db: &C, replay: ReplayId, project: ProjectId, targets: &[ReplayTarget]) -> Result<u64, StoreError> {
    if targets.is_empty() {
        return Ok(0);
    }
    let events: Vec<EventId> = targets.iter().map(|t| t.event).collect();
    let endpoints: Vec<EndpointId> = targets.iter().map(|t| t.endpoint).collect();
    let subscriptions: Vec<SubscriptionId> = targets.iter().map(|t| t.subscription).collect();
    let delays = DEFAULT_OUTGOING_DELAYS.to_vec();
    let statement = db.prepare_cached(INSERT_SQL).await?;
    let row = db
        .query_one(&statement, &[&replay, &project, &events, &endpoints, &subscriptions, &delays, &AnnouncementReason::Replay.as_str()])
        .await?;
    Ok(row.try_get::<_, i64>(0)? as u64)
}
