//! A person's retry of Failed Messages (FAILED -> PENDING): one Delivery, or many in one
//! statement. Each puts the Delivery back on its Retry Ladder and inserts its announcement
//! (reason `manual_retry`) in the same statement.

use railhook_core::{AnnouncementReason, DeliveryId, DeliveryStatus, ProjectId};
use serde::Serialize;
use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::deliveries::{delivery_columns, delivery_from, status_from, Delivery, FailedFilter};
use crate::StoreError;

/// The SET list that puts a Delivery back on its Retry Ladder, `$extra` Attempts beyond those
/// it made: PENDING, due at once, no Claim, not completed, a new ladder window. It also
/// counts as announced now (the Outbox row goes in with it), so the stranded sweep does not
/// announce it a second time. Its row in `open_deliveries` comes back with it (the trigger
/// `deliveries_reopened`, migration 0032).
macro_rules! back_on_the_ladder {
    ($extra:literal) => {
        concat!(
            "status = 'PENDING', max_attempts = attempt_count + ",
            $extra,
            ", next_retry_at = NULL,
             claim_token = NULL, claimed_at = NULL, completed_at = NULL, failed_at = NULL,
             ladder_started_at = now(), last_announced_at = now(), updated_at = now()"
        )
    };
}

/// One Delivery. `target` locks the row and, after waiting for a concurrent writer, sees
/// its committed status, so the answer (retried, or the status that prevented it) is
/// never stale. It is announced in the same statement as the update (`railhook_announce`).
pub const RETRY_SQL: &str = concat!(
    "
WITH target AS (
    SELECT id, status FROM deliveries WHERE id = $1 AND project_id = $2 FOR UPDATE
), d AS (
    UPDATE deliveries SET ",
    back_on_the_ladder!("$3"),
    "
    FROM target WHERE deliveries.id = target.id AND target.status = 'FAILED'
    RETURNING deliveries.*
), announced AS (
    SELECT railhook_announce('d', array_agg(project_id), array_agg(id), array_agg(endpoint_id), $4) AS n FROM d
)
SELECT target.status::text, ",
    delivery_columns!(),
    "
FROM target CROSS JOIN announced LEFT JOIN d ON true LEFT JOIN events e ON e.id = d.event_id"
);

pub enum RetryOutcome {
    /// Back on the ladder and announced; the Delivery as it is now.
    Retried(Box<Delivery>),
    /// Only a FAILED Delivery can be retried; this is its status.
    NotFailed(DeliveryStatus),
    NotFound,
}

/// Retries one FAILED Delivery with `extra_attempts` more Attempts (the caller checks the
/// range).
pub async fn retry(db: &impl GenericClient, project: ProjectId, id: DeliveryId, extra_attempts: i32) -> Result<RetryOutcome, StoreError> {
    let Some(row) = db.query_opt(RETRY_SQL, &[&id, &project, &extra_attempts, &AnnouncementReason::ManualRetry.as_str()]).await? else {
        return Ok(RetryOutcome::NotFound);
    };
    if row.try_get::<_, Option<Uuid>>(1)?.is_some() {
        return Ok(RetryOutcome::Retried(Box::new(delivery_from(&row, 1)?)));
    }
    Ok(RetryOutcome::NotFailed(status_from(row.try_get(0)?)?))
}

/// Why a Delivery named in a bulk retry was not retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// No such Delivery in this project.
    NotFound,
    /// It is not FAILED (its status is given).
    NotFailed,
    /// Another request was changing it at that moment (e.g. a concurrent retry); read it
    /// again.
    Busy,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct SkippedDelivery {
    #[schema(value_type = String)]
    pub id: DeliveryId,
    pub reason: SkipReason,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub status: Option<DeliveryStatus>,
}

#[derive(Debug, Clone, Default)]
pub struct BulkRetry {
    /// In id order.
    pub retried: Vec<DeliveryId>,
    /// For a retry by ids: the ids not retried, in the order they were given.
    pub skipped: Vec<SkippedDelivery>,
}

/// Many Deliveries in one statement: either the listed ids ($2) or those matching the
/// filter ($4-$7), FAILED ones only, at most $8, in id order. `FOR UPDATE SKIP LOCKED` lets
/// two bulk retries run side by side without waiting on each other or retrying a row twice.
/// `requested` is the listed ids as the statement's snapshot sees them, to say why one was
/// skipped.
pub const BULK_RETRY_SQL: &str = concat!(
    "
WITH requested AS (
    SELECT id, status FROM deliveries WHERE project_id = $1 AND id = ANY($2::uuid[])
), picked AS (
    SELECT d.id FROM deliveries d
    WHERE d.project_id = $1 AND d.failed_at IS NOT NULL AND d.status = 'FAILED'
      AND ($2::uuid[] IS NULL OR d.id = ANY($2::uuid[]))
      AND ($4::uuid IS NULL OR d.endpoint_id = $4)
      AND ($5::text IS NULL OR EXISTS (SELECT 1 FROM events e WHERE e.id = d.event_id AND e.event_type = $5))
      AND ($6::timestamptz IS NULL OR d.failed_at >= $6)
      AND ($7::timestamptz IS NULL OR d.failed_at < $7)
    ORDER BY d.id
    LIMIT $8
    FOR UPDATE SKIP LOCKED
), retried AS (
    UPDATE deliveries d SET ",
    back_on_the_ladder!("$3"),
    "
    FROM picked WHERE d.id = picked.id
    RETURNING d.id, d.project_id, d.endpoint_id
), announced AS (
    SELECT railhook_announce('d', array_agg(project_id ORDER BY id), array_agg(id ORDER BY id), array_agg(endpoint_id ORDER BY id), $9) AS n FROM retried
)
SELECT coalesce(r.id, q.id), q.status::text, r.id IS NOT NULL
FROM retried r FULL JOIN requested q ON q.id = r.id CROSS JOIN announced"
);

/// Which Deliveries a bulk retry is about.
#[derive(Clone, Copy)]
pub enum BulkSelection<'a> {
    /// These ids (at most a few thousand; the caller bounds them).
    Ids(&'a [DeliveryId]),
    /// The FAILED Deliveries that match, at most `limit`.
    Filter(&'a FailedFilter, i64),
}

/// Retries FAILED Deliveries in bulk with `extra_attempts` more Attempts each, in one
/// statement.
pub async fn retry_many(db: &impl GenericClient, project: ProjectId, selection: BulkSelection<'_>, extra_attempts: i32) -> Result<BulkRetry, StoreError> {
    let none = FailedFilter::default();
    let (ids, filter, limit) = match selection {
        BulkSelection::Ids(ids) => {
            let mut unique: Vec<Uuid> = ids.iter().map(|i| i.0).collect();
            unique.sort();
            unique.dedup();
            let n = unique.len() as i64;
            (Some(unique), &none, n)
        }
        BulkSelection::Filter(filter, limit) => (None, filter, limit),
    };
    let rows = db
        .query(
            BULK_RETRY_SQL,
            &[
                &project.0,
                &ids,
                &extra_attempts,
                &filter.endpoint_id.map(|e| e.0),
                &filter.event_type,
                &filter.completed_after,
                &filter.completed_before,
                &limit,
                &AnnouncementReason::ManualRetry.as_str(),
            ],
        )
        .await?;
    let mut out = BulkRetry::default();
    let mut seen = std::collections::HashMap::new();
    for r in &rows {
        let id = DeliveryId(r.try_get(0)?);
        if r.try_get::<_, bool>(2)? {
            out.retried.push(id);
        } else {
            let status = status_from(r.try_get(1)?)?;
            let reason = if status == DeliveryStatus::Failed { SkipReason::Busy } else { SkipReason::NotFailed };
            seen.insert(id, (reason, status));
        }
    }
    out.retried.sort();
    if let BulkSelection::Ids(given) = selection {
        let retried: std::collections::HashSet<DeliveryId> = out.retried.iter().copied().collect();
        let mut reported = std::collections::HashSet::new();
        for id in given {
            if retried.contains(id) || !reported.insert(*id) {
                continue;
            }
            out.skipped.push(match seen.get(id) {
                Some((SkipReason::NotFailed, status)) => SkippedDelivery { id: *id, reason: SkipReason::NotFailed, status: Some(*status) },
                Some((reason, _)) => SkippedDelivery { id: *id, reason: *reason, status: None },
                None => SkippedDelivery { id: *id, reason: SkipReason::NotFound, status: None },
            });
        }
    }
    Ok(out)
}
