//! The dashboard's own SQL: only what `railhook-store` has no function for (the overview's
//! aggregates, Endpoint health, Destinations' circuits, the Deliveries list by event type,
//! the operator's project list). Each statement is bounded (a LIMIT on the rows it reads, and the overview runs
//! under a statement timeout) and follows an index named beside it.

use chrono::{DateTime, Utc};
use railhook_core::{DeliveryId, DeliveryStatus, DestinationId, EndpointId, ProjectId};
use tokio_postgres::GenericClient;

use crate::error::{UiError, UiResult};

/// How many of the newest rows of the last hour the overview reads at most; beyond that a
/// rate is measured over the time those rows span.
pub const SAMPLE: i64 = 100_000;

/// What the overview shows, over the last hour.
#[derive(Debug, Default)]
pub struct Overview {
    /// Events per second.
    pub ingest_per_second: Option<f64>,
    pub events_counted: i64,
    /// Of the Deliveries created in the last hour that ended, the share delivered.
    pub success_rate: Option<f64>,
    pub ended: i64,
    /// Event created to delivered, of those delivered: median and 99th percentile, ms.
    pub e2e_p50_ms: Option<f64>,
    pub e2e_p99_ms: Option<f64>,
    /// The oldest PENDING Delivery's creation (inner `None`: none is pending); outer `None`
    /// when the query took longer than its timeout.
    pub oldest_pending: Option<Option<DateTime<Utc>>>,
    /// `None` when the count took longer than its timeout.
    pub failed_last_hour: Option<i64>,
}

/// Events of the last hour, newest first (`events_project_created_idx`).
const INGEST_SQL: &str = "
SELECT count(*), min(created_at) FROM (
    SELECT created_at FROM events
    WHERE project_id = $1 AND created_at >= now() - interval '1 hour'
    ORDER BY created_at DESC LIMIT $2
) newest";

/// Deliveries created in the last hour, newest first (`deliveries_project_idx`).
const OUTCOME_SQL: &str = "
SELECT count(*) FILTER (WHERE status = 'SUCCESS'), count(*) FILTER (WHERE status = 'FAILED'),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY e2e_ms) FILTER (WHERE status = 'SUCCESS'),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY e2e_ms) FILTER (WHERE status = 'SUCCESS')
FROM (
    SELECT status, extract(epoch FROM completed_at - created_at)::float8 * 1000 AS e2e_ms FROM deliveries
    WHERE project_id = $1 AND created_at >= now() - interval '1 hour'
    ORDER BY created_at DESC LIMIT $2
) newest";

/// The PENDING set is among the open Deliveries (`open_deliveries`, migration 0032; its key
/// is the Delivery's id, a UUIDv7, so its order is creation order): the first of the
/// project's open Deliveries that is PENDING, in id order, reading the PENDING and
/// PROCESSING ones before it, each by primary key (`OFFSET 0`: not a read of `deliveries`
/// whole when the planner takes PENDING for rare). Walking `deliveries_project_idx` in creation order until the
/// first PENDING row instead read 980,000 rows of a 1,000,000-Delivery project with a recent
/// backlog (450 ms; tests/ui/bigdb).
const OLDEST_PENDING_SQL: &str = "
SELECT (SELECT d.created_at FROM open_deliveries o
        CROSS JOIN LATERAL (SELECT dl.created_at, dl.status FROM deliveries dl WHERE dl.id = o.delivery_id OFFSET 0) d
        WHERE o.project_id = $1 AND d.status = 'PENDING' ORDER BY o.delivery_id LIMIT 1)";

/// The oldest PROCESSING Delivery's creation, from its Claims (`delivery_claims`, whose key
/// leads with the project).
const OLDEST_PROCESSING_SQL: &str = "
SELECT min(d.created_at) FROM deliveries d
WHERE d.id = ANY (ARRAY(SELECT c.delivery_id FROM delivery_claims c WHERE c.project_id = $1)) AND d.status = 'PROCESSING'";

/// How long the list waits for [`oldest_of`]; past it the list goes without the bound.
const OLDEST_TIMEOUT: &str = "SET LOCAL statement_timeout = '150ms'";

/// When the Deliveries list is filtered by PENDING or PROCESSING (small sets, each in a
/// partial index), the creation time of the oldest one, so the list's id-order scan can start
/// there ([`crate::deliveries::ids_from`]) instead of reading every older Delivery of other
/// statuses. `Ok(None)`: not such a status, or the set was too large to read in time (the
/// list then runs unbounded); `Ok(Some(None))`: there is none.
pub async fn oldest_of(client: &mut deadpool_postgres::Client, project: ProjectId, status: DeliveryStatus) -> UiResult<Option<Option<DateTime<Utc>>>> {
    let sql = match status {
        DeliveryStatus::Pending => OLDEST_PENDING_SQL,
        DeliveryStatus::Processing => OLDEST_PROCESSING_SQL,
        _ => return Ok(None),
    };
    let mut tx = client.build_transaction().read_only(true).start().await?;
    tx.batch_execute(OLDEST_TIMEOUT).await?;
    let row = bounded(&mut tx, sql, &[&project.0]).await?;
    tx.commit().await?;
    Ok(row.map(|r| r.try_get(0)).transpose()?)
}

/// `deliveries_failed_idx (project_id, failed_at) WHERE failed_at IS NOT NULL` (migration
/// 0032: set exactly while FAILED).
const FAILED_SQL: &str = "
SELECT count(*) FROM (
    SELECT 1 FROM deliveries
    WHERE project_id = $1 AND failed_at >= now() - interval '1 hour' AND status = 'FAILED'
    LIMIT $2
) f";

/// Reads the overview in one read-only transaction, each figure under a 3 s statement
/// timeout: a large project slows the page, never the database, and a figure that took
/// too long is shown as unknown while the others still are.
pub async fn overview(client: &mut deadpool_postgres::Client, project: ProjectId) -> UiResult<Overview> {
    let mut tx = client.build_transaction().read_only(true).start().await?;
    tx.batch_execute("SET LOCAL statement_timeout = '3s'").await?;
    let ingest = bounded(&mut tx, INGEST_SQL, &[&project.0, &SAMPLE]).await?;
    let outcome = bounded(&mut tx, OUTCOME_SQL, &[&project.0, &SAMPLE]).await?;
    let oldest = bounded(&mut tx, OLDEST_PENDING_SQL, &[&project.0]).await?;
    let failed = bounded(&mut tx, FAILED_SQL, &[&project.0, &SAMPLE]).await?;
    tx.commit().await?;
    let mut o = Overview::default();
    if let Some(r) = ingest {
        o.events_counted = r.try_get(0)?;
        o.ingest_per_second = rate(o.events_counted, r.try_get(1)?);
    }
    if let Some(r) = outcome {
        let (success, failures): (i64, i64) = (r.try_get(0)?, r.try_get(1)?);
        o.ended = success + failures;
        o.success_rate = (o.ended > 0).then(|| success as f64 / o.ended as f64);
        o.e2e_p50_ms = r.try_get(2)?;
        o.e2e_p99_ms = r.try_get(3)?;
    }
    o.oldest_pending = oldest.map(|r| r.try_get(0)).transpose()?;
    o.failed_last_hour = failed.map(|r| r.try_get(0)).transpose()?;
    Ok(o)
}

/// One figure's statement inside a savepoint: `None` when it hit the statement timeout
/// (SQLSTATE 57014), which rolls back only the savepoint; any other error is an error.
async fn bounded(
    tx: &mut deadpool_postgres::Transaction<'_>,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> UiResult<Option<tokio_postgres::Row>> {
    let savepoint = tx.savepoint("figure").await?;
    match savepoint.query_one(sql, params).await {
        Ok(row) => {
            savepoint.commit().await?;
            Ok(Some(row))
        }
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) => {
            tracing::warn!(error = %e, "ui: an overview figure took longer than its statement timeout");
            savepoint.rollback().await?;
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// Per second over the hour, or over the span of the sample when the sample was full.
fn rate(count: i64, oldest: Option<DateTime<Utc>>) -> Option<f64> {
    if count < SAMPLE {
        return Some(count as f64 / 3600.0);
    }
    let span = (Utc::now() - oldest?).num_milliseconds() as f64 / 1000.0;
    (span > 0.0).then(|| count as f64 / span)
}

/// The circuit breaker of an Endpoint or a Destination (`circuits`, migration 0026).
#[derive(Debug, Clone, PartialEq)]
pub struct Circuit {
    /// `closed`, `open` or `half_open`; `closed` when it never had an Attempt.
    pub state: String,
    pub opened_at: Option<DateTime<Utc>>,
    /// The circuit's current window.
    pub window_successes: i32,
    pub window_failures: i32,
}

/// An Endpoint's health, beside what `railhook_store::endpoints` says about it.
#[derive(Debug, Clone)]
pub struct EndpointHealth {
    pub circuit: Circuit,
    /// Deliveries being attempted right now (its concurrency in use).
    pub in_flight: i64,
    pub failed_last_hour: i64,
}

/// Health of the listed Endpoints of the project: the circuit row (primary key), PROCESSING
/// count (its Claims, `delivery_claims`: project, endpoint), FAILED in the last hour
/// (`deliveries_failed_idx`, bounded).
const HEALTH_SQL: &str = "
SELECT e.id, coalesce(c.state, 'closed'), c.opened_at, coalesce(c.successes, 0), coalesce(c.failures, 0),
       (SELECT count(*) FROM delivery_claims dc JOIN deliveries d ON d.id = dc.delivery_id AND d.claim_token = dc.claim_token
        WHERE dc.project_id = $1 AND dc.endpoint_id = e.id AND d.status = 'PROCESSING'),
       (SELECT count(*) FROM (SELECT 1 FROM deliveries d
            WHERE d.project_id = $1 AND d.failed_at >= now() - interval '1 hour' AND d.status = 'FAILED'
              AND d.endpoint_id = e.id LIMIT 10000) f)
FROM endpoints e LEFT JOIN circuits c ON c.target_id = e.id
WHERE e.project_id = $1 AND e.id = ANY($2::uuid[])";

pub async fn endpoint_health(
    db: &impl GenericClient,
    project: ProjectId,
    ids: &[EndpointId],
) -> UiResult<std::collections::HashMap<EndpointId, EndpointHealth>> {
    let ids: Vec<uuid::Uuid> = ids.iter().map(|i| i.0).collect();
    let rows = db.query(HEALTH_SQL, &[&project.0, &ids]).await?;
    rows.iter().map(|r| Ok({
            let health = EndpointHealth {
                circuit: Circuit { state: r.try_get(1)?, opened_at: r.try_get(2)?, window_successes: r.try_get(3)?, window_failures: r.try_get(4)? },
                in_flight: r.try_get(5)?,
                failed_last_hour: r.try_get(6)?,
            };
            (EndpointId(r.try_get(0)?), health)
        })).collect()
}

/// The circuits of the listed Destinations of the project (the circuit's primary key); a
/// Destination without a row has never had an Attempt (closed).
const DESTINATION_CIRCUITS_SQL: &str = "
SELECT d.id, c.state, c.opened_at, c.successes, c.failures
FROM destinations d JOIN circuits c ON c.target_id = d.id
WHERE d.project_id = $1 AND d.id = ANY($2::uuid[])";

pub async fn destination_circuits(
    db: &impl GenericClient,
    project: ProjectId,
    ids: &[DestinationId],
) -> UiResult<std::collections::HashMap<DestinationId, Circuit>> {
    let ids: Vec<uuid::Uuid> = ids.iter().map(|i| i.0).collect();
    let rows = db.query(DESTINATION_CIRCUITS_SQL, &[&project.0, &ids]).await?;
    rows.iter().map(|r| Ok((DestinationId(r.try_get(0)?), Circuit { state: r.try_get(1)?, opened_at: r.try_get(2)?, window_successes: r.try_get(3)?, window_failures: r.try_get(4)? }))).collect()
}

/// A Delivery as the list shows it.
#[derive(Debug, Clone)]
pub struct DeliveryRow {
    pub id: DeliveryId,
    pub event_type: String,
    pub endpoint_id: EndpointId,
    pub status: DeliveryStatus,
    pub attempt_count: i32,
    pub max_attempts: i32,
    pub created_at: DateTime<Utc>,
    pub next_retry_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
}

impl From<railhook_store::deliveries::Delivery> for DeliveryRow {
    fn from(d: railhook_store::deliveries::Delivery) -> DeliveryRow {
        DeliveryRow {
            id: d.id,
            event_type: d.event_type,
            endpoint_id: d.endpoint_id,
            status: d.status,
            attempt_count: d.attempt_count,
            max_attempts: d.max_attempts,
            created_at: d.created_at,
            next_retry_at: d.next_retry_at,
            last_error: d.last_error,
        }
    }
}

/// The Deliveries list filtered by an exact event type, which the store's list has no
/// parameter for: the project's Events of that type (`events_project_type_idx`), their
/// Deliveries (`deliveries_event_idx`), in id order after the cursor, `limit` at most.
const BY_TYPE_SQL: &str = "
SELECT d.id, e.event_type, d.endpoint_id, d.status::text, d.attempt_count, d.max_attempts, d.created_at,
       d.next_retry_at, d.last_error
FROM events e JOIN deliveries d ON d.event_id = e.id
WHERE e.project_id = $1 AND e.event_type = $2 AND d.project_id = $1
  AND ($3::text IS NULL OR d.status = $3::text::delivery_status)
  AND ($4::uuid IS NULL OR d.endpoint_id = $4)
  AND ($5::timestamptz IS NULL OR d.created_at >= $5)
  AND ($6::timestamptz IS NULL OR d.created_at < $6)
  AND ($7::uuid IS NULL OR d.id > $7)
ORDER BY d.id LIMIT $8";

pub struct ByType<'a> {
    pub event_type: &'a str,
    pub filter: &'a railhook_store::deliveries::DeliveryFilter,
}

pub async fn deliveries_by_type(db: &impl GenericClient, project: ProjectId, q: ByType<'_>) -> UiResult<Vec<DeliveryRow>> {
    let f = q.filter;
    let rows = db
        .query(
            BY_TYPE_SQL,
            &[
                &project.0,
                &q.event_type,
                &f.status.map(DeliveryStatus::as_sql),
                &f.endpoint_id.map(|e| e.0),
                &f.created_after,
                &f.created_before,
                &f.after.map(|a| a.0),
                &f.limit,
            ],
        )
        .await?;
    rows.iter()
        .map(|r| {
            let status: &str = r.try_get(3)?;
            Ok(DeliveryRow {
                id: DeliveryId(r.try_get(0)?),
                event_type: r.try_get(1)?,
                endpoint_id: EndpointId(r.try_get(2)?),
                status: status.parse().map_err(|_| UiError::Internal)?,
                attempt_count: r.try_get(4)?,
                max_attempts: r.try_get(5)?,
                created_at: r.try_get(6)?,
                next_retry_at: r.try_get(7)?,
                last_error: r.try_get(8)?,
            })
        })
        .collect()
}

/// A project, as the operator's list shows it.
pub struct ProjectRow {
    pub id: ProjectId,
    pub name: String,
    pub organization: String,
    pub created_at: DateTime<Utc>,
}

/// Every project in id order after the cursor (primary key), with its organization's name.
const PROJECTS_SQL: &str = "
SELECT p.id, p.name, o.name, p.created_at
FROM projects p JOIN organizations o ON o.id = p.organization_id
WHERE ($1::uuid IS NULL OR p.id > $1)
ORDER BY p.id LIMIT $2";

pub async fn projects(db: &impl GenericClient, after: Option<ProjectId>, limit: i64) -> UiResult<Vec<ProjectRow>> {
    let rows = db.query(PROJECTS_SQL, &[&after.map(|a| a.0), &limit]).await?;
    rows.iter().map(|r| Ok(ProjectRow { id: ProjectId(r.try_get(0)?), name: r.try_get(1)?, organization: r.try_get(2)?, created_at: r.try_get(3)? })).collect()
}

pub async fn project_exists(db: &impl GenericClient, id: ProjectId) -> UiResult<bool> {
    Ok(db.query_opt("SELECT 1 FROM projects WHERE id = $1", &[&id.0]).await?.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_figure_over_its_timeout_is_unknown_and_the_others_still_run() {
        let db = railhook_testkit::TestDb::new().await;
        let config = railhook_testkit::test_config(&db);
        let pool = railhook_store::build_pool(&config.database).expect("pool");
        let mut client = pool.get().await.expect("connection");
        let mut tx = client.build_transaction().read_only(true).start().await.expect("begin");
        tx.batch_execute("SET LOCAL statement_timeout = '100ms'").await.expect("timeout");
        assert!(bounded(&mut tx, "SELECT pg_sleep(2)", &[]).await.expect("no error").is_none());
        let row = bounded(&mut tx, "SELECT 41 + 1", &[]).await.expect("no error").expect("a row");
        assert_eq!(row.get::<_, i32>(0), 42);
        assert!(bounded(&mut tx, "SELECT no_such_column", &[]).await.is_err(), "other errors stay errors");
    }

    /// The dashboard's own readers of `deliveries` keep an index plan on a big database after
    /// migration 0032 (the PENDING, PROCESSING and FAILED sets out of the partial indexes on
    /// `status`): custom and generic plans, neither reading `deliveries` or `events` whole.
    #[tokio::test]
    async fn every_reader_keeps_an_index_plan_on_a_big_database() {
        use railhook_testkit::bigdb::{assert_index_plans, BigDb};
        let big = BigDb::new().await;
        let c = big.db.client().await;
        let project = format!("'{}'::uuid", big.project);
        let endpoints = format!("ARRAY['{}', '{}']::uuid[]", big.endpoints[0], big.endpoints[1]);
        for (what, sql, args, uses) in [
            ("oldest PENDING", OLDEST_PENDING_SQL, project.clone(), vec!["open_deliveries_pkey", "deliveries_pkey"]),
            ("oldest PROCESSING", OLDEST_PROCESSING_SQL, project.clone(), vec!["delivery_claims", "deliveries_pkey"]),
            ("failed in the last hour", FAILED_SQL, format!("{project}, {SAMPLE}"), vec!["deliveries_failed_idx"]),
            ("outcomes of the last hour", OUTCOME_SQL, format!("{project}, {SAMPLE}"), vec!["deliveries_project_idx"]),
            ("Endpoint health", HEALTH_SQL, format!("{project}, {endpoints}"), vec!["delivery_claims", "deliveries_failed_idx"]),
            ("by event type", BY_TYPE_SQL, format!("{project}, 'order.paid', NULL, NULL, NULL, NULL, NULL, 51"), vec![]),
            ("by event type, FAILED", BY_TYPE_SQL, format!("{project}, 'order.paid', 'FAILED', NULL, NULL, NULL, NULL, 51"), vec![]),
        ] {
            assert_index_plans(&c, what, sql, &args, &uses).await;
        }
    }

    #[test]
    fn rates_over_the_hour_or_over_a_full_sample() {
        assert_eq!(rate(36, None), Some(0.01));
        let r = rate(SAMPLE, Some(Utc::now() - chrono::Duration::seconds(100))).expect("a rate");
        assert!((900.0..=1000.0).contains(&r), "{r}");
    }
}

/// A walsender of this server (`pg_stat_replication`): the relay's stream or a standby.
#[derive(Debug)]
pub struct Walsender {
    pub pid: i32,
    pub application_name: String,
    pub client: Option<String>,
    pub state: Option<String>,
    /// `pg_current_wal_lsn() - replay_lsn`; `None` for a logical walsender that reports none.
    pub replay_lag_bytes: Option<i64>,
}

/// Every walsender, a handful of rows (one per replication connection).
const WALSENDERS_SQL: &str = "
SELECT pid, application_name, client_addr::text, state,
       pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::bigint
FROM pg_stat_replication ORDER BY backend_start LIMIT 100";

pub async fn walsenders(client: &impl GenericClient) -> UiResult<Vec<Walsender>> {
    let rows = client.query(WALSENDERS_SQL, &[]).await?;
    rows.iter().map(|r| Ok(Walsender { pid: r.try_get(0)?, application_name: r.try_get(1)?, client: r.try_get(2)?, state: r.try_get(3)?, replay_lag_bytes: r.try_get(4)? })).collect()
}
