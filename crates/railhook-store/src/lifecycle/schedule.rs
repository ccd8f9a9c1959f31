//! The jobs that move Deliveries nobody holds: the retry scheduler (due retries and
//! Deferrals announced with a scheduler token) and the sweeps of DESIGN.md 6.4 (stuck
//! PROCESSING, stranded PENDING, the hard caps), a singleton across processes under
//! `crate::locks::SWEEP`.

use railhook_core::AnnouncementReason;
use tokio_postgres::GenericClient;
use uuid::Uuid;

/// The retry scheduler's batch: due PENDING Deliveries, claimed under a scheduler token with
/// SKIP LOCKED, at most `per_endpoint` per endpoint and `limit` in all, oldest due first, and
/// announced in the same statement through the outbox (reason `retry`, with the token), so
/// ownership passes with the announcement and cannot be lost between the two. A row still
/// carrying a scheduler token `$4` seconds after its announcement was not claimed (the hint
/// was lost, or is late): it is announced again under the same token, so whichever of its
/// hints comes first claims it. (A new token per re-announcement made every hint older than
/// the last one claim nothing: a worker further behind than `$4` never caught up; the
/// 50,000-event chaos run of the tenth session.) The next round, after a finalise or a
/// Deferral cleared the token, gets a new one, so an earlier round's hint claims nothing.
pub const SCHEDULE_SQL: &str = "
WITH due AS (
    SELECT id, project_id, endpoint_id, next_retry_at FROM deliveries
    WHERE status = 'PENDING' AND next_retry_at <= now()
      AND (claim_token IS NULL OR last_announced_at < now() - make_interval(secs => $4))
    ORDER BY next_retry_at
    LIMIT $1::bigint * 4
    FOR UPDATE SKIP LOCKED
), fair AS (
    SELECT id, project_id, endpoint_id, next_retry_at,
           row_number() OVER (PARTITION BY endpoint_id ORDER BY next_retry_at) AS n_endpoint,
           row_number() OVER (PARTITION BY project_id ORDER BY next_retry_at) AS n_project
    FROM due
), picked AS (
    SELECT id, project_id, endpoint_id FROM fair
    WHERE n_endpoint <= $2::bigint AND n_project <= $3::bigint
    ORDER BY n_endpoint, next_retry_at
    LIMIT $1
), tokened AS (
    UPDATE deliveries d SET claim_token = coalesce(d.claim_token, gen_random_uuid()), last_announced_at = now(), updated_at = now()
    FROM picked WHERE d.id = picked.id
    RETURNING d.id, d.project_id, d.endpoint_id, d.claim_token
), announced AS (
    SELECT railhook_announce('d', array_agg(project_id ORDER BY id), array_agg(id ORDER BY id), array_agg(endpoint_id ORDER BY id), $5, array_agg(claim_token ORDER BY id)) AS n FROM tokened
)
SELECT tokened.id FROM tokened CROSS JOIN announced";

/// Claims and announces one batch of due retries; how many.
pub async fn schedule_due(db: &impl GenericClient, limit: i64, per_endpoint: i64, per_project: i64, reannounce_after_s: f64) -> Result<usize, tokio_postgres::Error> {
    Ok(db.query(SCHEDULE_SQL, &[&limit, &per_endpoint, &per_project, &reannounce_after_s, &AnnouncementReason::Retry.as_str()]).await?.len())
}

/// Sweep 6.4 (a): PROCESSING for longer than `older_than_s` goes back to PENDING with the
/// token cleared and is announced again (reason `reannounce`); bounded by `limit`.
///
/// Found through `delivery_claims` (migration 0032: the claim writes a Claim's row in the
/// statement that makes the Delivery PROCESSING). A Claim's row that is as old and whose
/// Delivery is not PROCESSING under its token any more (or is gone) was left behind by a
/// writer that did not take it along (the counts already ignore it, checking the Delivery);
/// it goes too, so the table stays the size of the Claims. A Delivery another transaction
/// holds (its finalise, right now) is skipped with its row.
pub const SWEEP_STUCK_SQL: &str = "
WITH old AS (
    SELECT c.project_id, c.endpoint_id, c.delivery_id, c.claim_token FROM delivery_claims c
    WHERE c.claimed_at < now() - make_interval(secs => $1)
    ORDER BY c.claimed_at LIMIT $2 FOR UPDATE SKIP LOCKED
), stuck AS (
    SELECT d.id FROM old JOIN deliveries d ON d.id = old.delivery_id
    WHERE d.status = 'PROCESSING' AND d.claim_token = old.claim_token
    FOR UPDATE OF d SKIP LOCKED
), reset AS (
    UPDATE deliveries d SET status = 'PENDING', claim_token = NULL, claimed_at = NULL, next_retry_at = NULL,
                            last_announced_at = now(), updated_at = now()
    FROM stuck WHERE d.id = stuck.id
    RETURNING d.id, d.project_id, d.endpoint_id
), unclaimed AS (
    DELETE FROM delivery_claims c USING old
    WHERE c.project_id = old.project_id AND c.endpoint_id = old.endpoint_id AND c.delivery_id = old.delivery_id
      AND (old.delivery_id IN (SELECT id FROM reset)
           OR NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.id = old.delivery_id
                          AND d.status = 'PROCESSING' AND d.claim_token = old.claim_token))
), announced AS (
    SELECT railhook_announce('d', array_agg(project_id ORDER BY id), array_agg(id ORDER BY id), array_agg(endpoint_id ORDER BY id), $3) AS n FROM reset
)
SELECT reset.id FROM reset CROSS JOIN announced";

/// Sweep 6.4 (b): PENDING and not announced for `older_than_s` (its announcement was lost):
/// announced again, the scheduler's token (if any) cleared; bounded by `limit`. Read through
/// `open_deliveries` (every PENDING Delivery has its row there; migration 0032).
///
/// The readers of the open set name their rows as `= ANY (ARRAY(SELECT ... FROM
/// open_deliveries))`, looked up by primary key: with a join, a planner that takes the
/// filter on `status` for very selective (PROCESSING is rare) reads `deliveries` whole
/// instead (tests/plans.rs).
pub const SWEEP_STRANDED_SQL: &str = "
WITH stranded AS (
    SELECT d.id FROM deliveries d
    WHERE d.id = ANY (ARRAY(SELECT delivery_id FROM open_deliveries))
      AND d.status = 'PENDING' AND d.last_announced_at < now() - make_interval(secs => $1)
      AND (d.next_retry_at IS NULL OR d.next_retry_at <= now())
    ORDER BY d.last_announced_at LIMIT $2 FOR UPDATE OF d SKIP LOCKED
), reset AS (
    UPDATE deliveries d SET claim_token = NULL, last_announced_at = now(), updated_at = now()
    FROM stranded WHERE d.id = stranded.id
    RETURNING d.id, d.project_id, d.endpoint_id
), announced AS (
    SELECT railhook_announce('d', array_agg(project_id ORDER BY id), array_agg(id ORDER BY id), array_agg(endpoint_id ORDER BY id), $3) AS n FROM reset
)
SELECT reset.id FROM reset CROSS JOIN announced";

/// Sweep 6.4 (c): the hard cap. PENDING Deliveries whose ladder started more than
/// `max_age_s` ago go to Failed Messages (and out of `open_deliveries`).
pub const SWEEP_CAPPED_SQL: &str = "
WITH capped AS (
    SELECT d.id FROM deliveries d
    WHERE d.id = ANY (ARRAY(SELECT delivery_id FROM open_deliveries))
      AND d.status = 'PENDING' AND d.ladder_started_at < now() - make_interval(secs => $1)
    ORDER BY d.ladder_started_at LIMIT $2 FOR UPDATE OF d SKIP LOCKED
), failed AS (
    UPDATE deliveries d SET status = 'FAILED', claim_token = NULL, next_retry_at = NULL, completed_at = now(),
                            last_error = coalesce(d.last_error || '; ', '') || 'hard cap reached', updated_at = now()
    FROM capped WHERE d.id = capped.id
    RETURNING d.id
), closed AS (
    DELETE FROM open_deliveries o USING failed WHERE o.delivery_id = failed.id
)
SELECT count(*) FROM failed";

/// Rows of `open_deliveries` whose Delivery ended (or is gone) without taking its row along:
/// a writer of the previous build, a cascade from a deleted Event or Endpoint. Harmless to
/// the readers, which filter on the Delivery; deleted here so the table stays the size of
/// the open set. The ended Delivery's row is locked (SKIP LOCKED), so a person's retry
/// that reopens it meanwhile keeps its row.
pub const SWEEP_CLOSED_SQL: &str = "
WITH ended AS (
    SELECT o.delivery_id FROM open_deliveries o JOIN deliveries d ON d.id = o.delivery_id
    WHERE d.status IN ('SUCCESS', 'FAILED')
    LIMIT $1 FOR UPDATE OF d SKIP LOCKED
), gone AS (
    SELECT o.delivery_id FROM open_deliveries o
    WHERE NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.id = o.delivery_id)
    LIMIT $1
), closed AS (
    DELETE FROM open_deliveries o
    WHERE o.delivery_id IN (SELECT delivery_id FROM ended UNION ALL SELECT delivery_id FROM gone)
    RETURNING 1
)
SELECT count(*) FROM closed";

/// The incoming hard cap: PENDING Forwards whose ladder started more than `max_age_s` ago
/// (24 h by default) go to Failed Messages.
const SWEEP_CAPPED_FORWARDS_SQL: &str = "
WITH capped AS (
    SELECT id FROM forwards
    WHERE status = 'PENDING' AND ladder_started_at < now() - make_interval(secs => $1)
    ORDER BY ladder_started_at LIMIT $2 FOR UPDATE SKIP LOCKED
)
UPDATE forwards f SET status = 'FAILED', claim_token = NULL, next_retry_at = NULL, completed_at = now(),
                      last_error = coalesce(f.last_error || '; ', '') || 'hard cap reached', updated_at = now()
FROM capped WHERE f.id = capped.id";

/// After a Postgres restart: PENDING Deliveries, due, unclaimed and last announced before
/// the server started, are announced again (reason `reannounce`); bounded by `$1`.
///
/// Why: a claim commits with `synchronous_commit = off` (`worker.claim_synchronous_commit`),
/// so a crash can forget the claims of its last WAL-writer rounds while their requests were
/// already sent. Such a Delivery is PENDING again with no claim and its hint consumed: no
/// hint would come before the stranded sweep (`worker.stranded_after_seconds`, an hour by
/// default). Every such row was last announced before the crash, hence before the server's
/// start; a row announced since (by the ingest, a sweep, or this statement) is not touched,
/// so the statement finds nothing once it has run, and a clean restart costs at most one
/// extra hint per waiting Delivery, which the Claim absorbs. Rows with a scheduler token
/// are the retry scheduler's (`worker.retry_reannounce_after_seconds`).
pub const REANNOUNCE_AFTER_RESTART_SQL: &str = "
WITH forgotten AS (
    SELECT d.id FROM deliveries d
    WHERE d.id = ANY (ARRAY(SELECT delivery_id FROM open_deliveries))
      AND d.status = 'PENDING' AND d.claim_token IS NULL
      AND (d.next_retry_at IS NULL OR d.next_retry_at <= now())
      AND d.last_announced_at < pg_postmaster_start_time()
    ORDER BY d.last_announced_at LIMIT $1 FOR UPDATE OF d SKIP LOCKED
), marked AS (
    UPDATE deliveries d SET last_announced_at = now(), updated_at = now()
    FROM forgotten WHERE d.id = forgotten.id
    RETURNING d.id, d.project_id, d.endpoint_id
), announced AS (
    SELECT railhook_announce('d', array_agg(project_id ORDER BY id), array_agg(id ORDER BY id), array_agg(endpoint_id ORDER BY id), $2) AS n FROM marked
)
SELECT marked.id FROM marked CROSS JOIN announced";

/// Every PROCESSING Delivery gets its Claim's row in `delivery_claims` if it has none (a
/// claim of the previous build's `railhook_claim_batch`, in the moment between migration
/// 0032 and the rules that write the row, made none); how many. Without its row the stuck
/// sweep would never find such a Delivery. The worker runs it with
/// [`reannounce_after_restart`], once per server start it sees (so at its own start too).
pub const RESTORE_CLAIMS_SQL: &str = "
INSERT INTO delivery_claims (project_id, endpoint_id, delivery_id, claim_token, claimed_at)
SELECT d.project_id, d.endpoint_id, d.id, d.claim_token, coalesce(d.claimed_at, now())
FROM deliveries d
WHERE d.id = ANY (ARRAY(SELECT delivery_id FROM open_deliveries))
  AND d.status = 'PROCESSING' AND d.claim_token IS NOT NULL
ON CONFLICT (project_id, endpoint_id, delivery_id) DO NOTHING";

pub async fn restore_claims(db: &impl GenericClient) -> Result<u64, tokio_postgres::Error> {
    db.execute(RESTORE_CLAIMS_SQL, &[]).await
}

/// The vacuum of the two tables every Delivery passes through (a row added at its claim, or
/// its ingest, and removed at its finalise): `delivery_claims` and `open_deliveries`. Their
/// live rows are the Deliveries in flight (hundreds), their dead ones every Delivery since the
/// last vacuum, and every claim counts its Project's and Endpoint's Claims by the index, which
/// reads the dead entries too until a vacuum removes them: with autovacuum's default pace
/// (one look a minute) a claim's count read 120,000 dead entries at 2,000 Deliveries a second
/// (12-20 ms a count by a bitmap scan, 1 ms once an index scan has marked them; 0.06 ms
/// after a vacuum; issue 30). `INDEX_CLEANUP ON`: the index is what the counts read, and
/// Postgres skips it when few heap pages have dead rows. `SKIP_LOCKED`: a table another
/// vacuum holds is left to it. A role that may not vacuum them gets a warning, not an error.
pub async fn vacuum_claims(db: &impl GenericClient) -> Result<(), tokio_postgres::Error> {
    db.batch_execute("VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) delivery_claims, open_deliveries").await
}

/// When the Postgres server (its postmaster) started: a change means it restarted.
pub async fn server_started_at(db: &impl GenericClient) -> Result<chrono::DateTime<chrono::Utc>, tokio_postgres::Error> {
    Ok(db.query_one("SELECT pg_postmaster_start_time()", &[]).await?.get(0))
}

/// Announces again, in batches of `batch`, the Deliveries whose claim a Postgres crash may
/// have forgotten (see [`REANNOUNCE_AFTER_RESTART_SQL`]); how many. The worker runs it once
/// per server start it sees (`railhook_worker`'s sweep loop).
pub async fn reannounce_after_restart(db: &impl GenericClient, batch: i64) -> Result<u64, tokio_postgres::Error> {
    let reason = AnnouncementReason::Reannounce.as_str();
    let mut total = 0u64;
    loop {
        let n = db.query(REANNOUNCE_AFTER_RESTART_SQL, &[&batch, &reason]).await?.len() as u64;
        total += n;
        if (n as i64) < batch {
            return Ok(total);
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    pub stuck: u64,
    pub stranded: u64,
    pub capped: u64,
    pub capped_forwards: u64,
}

/// The sweeps' limits.
#[derive(Debug, Clone, Copy)]
pub struct SweepLimits {
    pub processing_timeout_s: f64,
    pub stranded_s: f64,
    pub outgoing_max_age_s: f64,
    pub incoming_max_age_s: f64,
    pub batch: i64,
}


/// Runs every sweep in bounded batches, if this process gets the sweep lock (a
/// transaction-level advisory lock, so a crash cannot leave it held). `None` when another
/// process holds it.
pub async fn sweep(client: &mut deadpool_postgres::Object, l: &SweepLimits) -> Result<Option<Swept>, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let locked: bool = tx.query_one("SELECT pg_try_advisory_xact_lock($1)", &[&crate::locks::SWEEP.key]).await?.try_get(0)?;
    if !locked {
        return Ok(None);
    }
    let stuck = tx.query(SWEEP_STUCK_SQL, &[&l.processing_timeout_s, &l.batch, &AnnouncementReason::Reannounce.as_str()]).await?.len() as u64;
    let stranded = tx.query(SWEEP_STRANDED_SQL, &[&l.stranded_s, &l.batch, &AnnouncementReason::Reannounce.as_str()]).await?.len() as u64;
    let capped = tx.query_one(SWEEP_CAPPED_SQL, &[&l.outgoing_max_age_s, &l.batch]).await?.try_get::<_, i64>(0)? as u64;
    tx.query_one(SWEEP_CLOSED_SQL, &[&l.batch]).await?;
    let capped_forwards = tx.execute(SWEEP_CAPPED_FORWARDS_SQL, &[&l.incoming_max_age_s, &l.batch]).await?;
    tx.commit().await?;
    Ok(Some(Swept { stuck, stranded, capped, capped_forwards }))
}

/// The worker's queue gauges: Deliveries PENDING and due, and the age of the oldest.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueGauges {
    pub due: i64,
    pub oldest_due_age_s: f64,
    /// Parked in the Ordering Buffer (PENDING behind an unresolved predecessor).
    pub parked: i64,
}

/// The gauges' statement: the PENDING Deliveries among the open ones (`open_deliveries`).
pub const QUEUE_GAUGES_SQL: &str = "SELECT count(*) FILTER (WHERE due),
                    coalesce(EXTRACT(EPOCH FROM now() - min(coalesce(next_retry_at, created_at)) FILTER (WHERE due))::float8, 0),
                    count(*) FILTER (WHERE parked_at IS NOT NULL AND NOT due)
             FROM (SELECT d.next_retry_at, d.created_at, d.parked_at, (d.next_retry_at IS NULL OR d.next_retry_at <= now()) AS due
                   FROM deliveries d WHERE d.id = ANY (ARRAY(SELECT delivery_id FROM open_deliveries)) AND d.status = 'PENDING') pending";

pub async fn queue_gauges(db: &impl GenericClient) -> Result<QueueGauges, tokio_postgres::Error> {
    let row = db.query_one(QUEUE_GAUGES_SQL, &[]).await?;
    Ok(QueueGauges { due: row.try_get(0)?, oldest_due_age_s: row.try_get(1)?, parked: row.try_get(2)? })
}

/// Rows per re-announcement statement.
pub const REANNOUNCE_BATCH: i64 = 5_000;

/// The relay's re-announcement after it created a slot: the Deliveries and Forwards that are
/// still PENDING, unclaimed and not scheduled for a retry get a fresh outbox row (reason
/// `reannounce`), in bounded batches, each batch one statement.
///
/// Why: an outbox row committed before the slot existed (first start after the API already
/// took events, or a slot that was lost or dropped and recreated) is not in any stream the
/// new slot will decode. The obligation never lived in Kafka; it lives in the row's status,
/// so Postgres is asked again. Rows with `next_retry_at` set belong to the retry scheduler.
/// Duplicates (a row announced twice) are absorbed by the Claim.
pub const REANNOUNCE_DELIVERIES_SQL: &str = "
WITH batch AS (
    -- The open Deliveries in id order, each looked up by primary key (OFFSET 0 keeps the
    -- planner from turning the lookup into a read of `deliveries` whole).
    SELECT d.id, d.project_id, d.endpoint_id FROM open_deliveries o
    CROSS JOIN LATERAL (SELECT dl.id, dl.project_id, dl.endpoint_id, dl.status, dl.claim_token, dl.next_retry_at
                        FROM deliveries dl WHERE dl.id = o.delivery_id OFFSET 0) d
    WHERE o.delivery_id > $1 AND d.status = 'PENDING' AND d.claim_token IS NULL AND d.next_retry_at IS NULL
    ORDER BY o.delivery_id LIMIT $2
), marked AS (
    UPDATE deliveries d SET last_announced_at = now() FROM batch WHERE d.id = batch.id
), announced AS (
    SELECT railhook_announce('d', array_agg(project_id ORDER BY id), array_agg(id ORDER BY id), array_agg(endpoint_id ORDER BY id), $3) AS n FROM batch
)
SELECT batch.id FROM batch CROSS JOIN announced";

const REANNOUNCE_FORWARDS_SQL: &str = "
WITH batch AS (
    SELECT id, project_id, destination_id FROM forwards
    WHERE status = 'PENDING' AND claim_token IS NULL AND next_retry_at IS NULL AND id > $1
    ORDER BY id LIMIT $2
), marked AS (
    UPDATE forwards f SET last_announced_at = now() FROM batch WHERE f.id = batch.id
), announced AS (
    SELECT railhook_announce('f', array_agg(project_id ORDER BY id), array_agg(id ORDER BY id), array_agg(destination_id ORDER BY id), $3) AS n FROM batch
)
SELECT batch.id FROM batch CROSS JOIN announced";

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reannounced {
    pub deliveries: u64,
    pub forwards: u64,
}

/// Re-announces everything eligible; returns how many rows of each kind.
pub async fn reannounce_pending(db: &impl GenericClient) -> Result<Reannounced, tokio_postgres::Error> {
    Ok(Reannounced {
        deliveries: reannounce_batches(db, REANNOUNCE_DELIVERIES_SQL).await?,
        forwards: reannounce_batches(db, REANNOUNCE_FORWARDS_SQL).await?,
    })
}

async fn reannounce_batches(db: &impl GenericClient, sql: &str) -> Result<u64, tokio_postgres::Error> {
    let statement = db.prepare(sql).await?;
    let reason = AnnouncementReason::Reannounce.as_str();
    let mut after = Uuid::nil();
    let mut total = 0u64;
    loop {
        let rows = db.query(&statement, &[&after, &REANNOUNCE_BATCH, &reason]).await?;
        total += rows.len() as u64;
        match rows.iter().map(|r| r.try_get::<_, Uuid>(0)).collect::<Result<Vec<_>, _>>()?.into_iter().max() {
            Some(last) if rows.len() as i64 == REANNOUNCE_BATCH => after = last,
            _ => return Ok(total),
        }
    }
}
