//! `railhook relay --mode poll`: the polling relay the CDC design replaces, kept as the
//! benchmark baseline. It is meant to be a fair baseline, not a strawman: batches are claimed
//! with `FOR UPDATE SKIP LOCKED` (several pollers can run), fair across endpoints and
//! projects, produced concurrently, and finalised in one statement per batch.
//!
//! # State machine (`outbox.poll_status`)
//!
//! ```text
//! PENDING --claim--> SENDING --Kafka acked, finalise--> PUBLISHED
//!                      |  ^
//!                      |  +-- recovered: SENDING with poll_claimed_at older than 300 s
//!                      +----- produce failed: released back to PENDING
//! ```
//!
//! Every transition out of SENDING is guarded by the claim it was made under
//! (`WHERE poll_status = 'SENDING' AND poll_claimed_at = $claimed_at`). `poll_claimed_at` is
//! the fence: a poller that stalled for more than [`RECOVER_AFTER`] and whose rows were
//! recovered (re-claimed by another poller, with a new `poll_claimed_at`) finalises nothing.
//! All times are the database's (`now()`), never the relay host's clock, so clock skew between
//! hosts cannot make a live claim look stale.
//!
//! # One turn of the loop
//!
//! 1. **Claim** ([`claim_batch`]), one statement, committed on its own:
//!    - `head`: the oldest [`SCAN_ROWS`] claimable rows by id (PENDING, or SENDING under a claim
//!      older than [`RECOVER_AFTER`]), read through the partial index `outbox_poll_idx` (made by [`ensure_index`] at start);
//!    - fairness by window functions over `head`: at most [`MAX_PER_ENDPOINT`] rows per
//!      routing id (endpoint or destination, the oldest ones), then at most
//!      [`MAX_PER_PROJECT`] per project taken round-robin over its endpoints (rank within the
//!      endpoint first, then id), then at most [`MAX_BATCH`] in all, round-robin over projects;
//!    - the chosen rows are locked `FOR UPDATE SKIP LOCKED`, re-checking that they are still
//!      claimable (a row another poller claimed meanwhile fails the re-check, one it is
//!      claiming right now is skipped), and set to SENDING with `poll_claimed_at = now()`.
//!
//!    Only the chosen rows are locked, not the whole scan window, so a large backlog costs one
//!    read of the partial index per batch, not thousands of row locks (on Postgres 15, a
//!    1000-row claim over a 50 000-row backlog took 37 ms). Two pollers whose claims overlap
//!    in time can choose the same rows; the loser gets fewer (at once again if it got some,
//!    after the interval if none).
//! 2. **Produce** the batch concurrently, in id order: every message is handed to the
//!    producer first, then all delivery futures are awaited together. The producer (idempotent,
//!    `acks=all`, `message.timeout.ms=0`) keeps per-partition order, so rows of one endpoint
//!    reach Kafka in the order they were handed over. Topic, key and value are
//!    [`crate::stream::announcement`]'s, exactly as the CDC relay sends them.
//! 3. **Finalise** ([`mark_published`]) the acknowledged rows in one UPDATE
//!    (`WHERE id = ANY($1) AND poll_status = 'SENDING' AND poll_claimed_at = $2`). Rows whose
//!    delivery failed are released to PENDING ([`release`]) and the relay returns the error,
//!    like the CDC relay does (librdkafka has already retried; with `message.timeout.ms=0`
//!    only permanent errors get here).
//! 4. **Wait** [`POLL_INTERVAL`] (1 s), *unless the batch was capped*: when the claim took rows
//!    and left claimable rows behind (because of the total, per-endpoint or per-project cap,
//!    or the scan window), the next claim starts at once. "Capped" rather than only "the
//!    batch hit [`MAX_BATCH`]": otherwise a backlog on one endpoint would drain at 10 rows a
//!    second, which would make the baseline a strawman. An empty claim always waits (rows
//!    left behind then are locked by someone else, and waiting avoids spinning on them).
//!
//! # Guarantees and their limits
//!
//! - At-least-once. A row is PUBLISHED only after Kafka acknowledged it. A relay that dies
//!   after the claim leaves its rows SENDING; they become claimable again after
//!   [`RECOVER_AFTER`] and are produced again (a duplicate absorbed by the Claim downstream,
//!   as after a CDC relay crash, duplicate window 4).
//! - Postgres going away (restart, failover, a killed backend) is retried on a new connection
//!   with backoff; a batch Kafka already acknowledged is finalised under its claim once the
//!   connection is back, before anything new is claimed. The connection's
//!   `application_name` is `railhook-relay-poll` unless `database.url` sets one.
//! - Per-key order: with one poller, an endpoint's rows are produced in id order, and a batch
//!   is finalised before the next is claimed. Ids are assigned at insert, not at commit, so a
//!   transaction that commits after a later-numbered one is announced after it (inherent to
//!   polling; the CDC relay announces in commit order). Recovered rows, and batches of several
//!   pollers running at once, can interleave an endpoint's rows out of order. Ordering that
//!   matters is carried by sequence numbers assigned at ingest (design 6.5), not by Kafka.
//! - Starvation is bounded by the scan window: an endpoint whose oldest row lies behind
//!   [`SCAN_ROWS`] claimable rows of other endpoints waits until the window reaches it;
//!   capped batches follow each other without waiting, so the window keeps moving.
//! - Headers: `outbox_id` as in CDC mode. There is no commit LSN when polling, so the
//!   `commit_lsn` header is omitted rather than filled with a made-up value; consumers must
//!   treat it as optional.
//! - Shutdown: the batch in flight is produced, awaited and finalised, then `run` returns
//!   `Ok`. With Kafka unreachable that waits until Kafka is back (`message.timeout.ms=0`);
//!   a relay killed meanwhile leaves SENDING rows that are recovered after [`RECOVER_AFTER`],
//!   and so does a shutdown while Postgres is unreachable for the finalise.
//! - Switching a database from CDC to poll mode: the CDC relay never updates `poll_status`,
//!   so every retained outbox row is still PENDING and the poller announces them all again
//!   (duplicates absorbed by the Claim, but a burst). Mark them PUBLISHED first if that matters.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use railhook_config::Config;
use railhook_kafka::Announcer;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::outbox::OutboxRow;
use crate::{RelayError, RelayStats};

/// Wait between polls when the last one found nothing left behind.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Rows of one endpoint (routing id) in one batch, at most.
pub const MAX_PER_ENDPOINT: i64 = 10;
/// Rows of one project in one batch, at most.
pub const MAX_PER_PROJECT: i64 = 30;
/// Rows in one batch, at most.
pub const MAX_BATCH: i64 = 1000;
/// Oldest claimable rows the fairness caps are computed over.
pub const SCAN_ROWS: i64 = 10 * MAX_BATCH;
/// A SENDING row claimed longer ago than this is claimable again (its poller is presumed dead).
pub const RECOVER_AFTER: Duration = Duration::from_secs(300);

/// The caps of one claim; [`Limits::default`] is what `run` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub per_endpoint: i64,
    pub per_project: i64,
    pub batch: i64,
    pub scan: i64,
    pub recover_after: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            per_endpoint: MAX_PER_ENDPOINT,
            per_project: MAX_PER_PROJECT,
            batch: MAX_BATCH,
            scan: SCAN_ROWS,
            recover_after: RECOVER_AFTER,
        }
    }
}

/// Rows claimed by one [`claim_batch`].
#[derive(Debug, Clone)]
pub struct Claim {
    /// The database's `now()` of the claim: every claimed row's `poll_claimed_at`, and the
    /// fence of [`mark_published`] and [`release`].
    pub claimed_at: DateTime<Utc>,
    /// Claimed rows in id order.
    pub rows: Vec<OutboxRow>,
    /// Claimable rows that were seen but not claimed (caps, the scan window, or locked by
    /// another poller). Positive means: poll again at once.
    pub left_behind: i64,
}

impl Claim {
    pub fn ids(&self) -> Vec<i64> {
        self.rows.iter().map(|r| r.id).collect()
    }
}

/// `$1`: recover_after in seconds, `$2`: scan, `$3`: per endpoint, `$4`: per project,
/// `$5`: batch. See the module docs.
const CLAIM_SQL: &str = "
WITH head AS (
    SELECT id, project_id, routing_id
    FROM outbox
    WHERE poll_status <> 'PUBLISHED'
      AND (poll_status = 'PENDING' OR poll_claimed_at < now() - make_interval(secs => $1))
    ORDER BY id
    LIMIT $2
),
by_endpoint AS (
    SELECT id, project_id, row_number() OVER (PARTITION BY routing_id ORDER BY id) AS endpoint_rank
    FROM head
),
by_project AS (
    SELECT id, row_number() OVER (PARTITION BY project_id ORDER BY endpoint_rank, id) AS project_rank
    FROM by_endpoint
    WHERE endpoint_rank <= $3
),
chosen AS (
    SELECT id FROM by_project
    WHERE project_rank <= $4
    ORDER BY project_rank, id
    LIMIT $5
),
locked AS (
    SELECT o.id FROM outbox o
    WHERE o.id IN (SELECT id FROM chosen)
      AND (o.poll_status = 'PENDING'
           OR (o.poll_status = 'SENDING' AND o.poll_claimed_at < now() - make_interval(secs => $1)))
    FOR UPDATE OF o SKIP LOCKED
),
claimed AS (
    UPDATE outbox o SET poll_status = 'SENDING', poll_claimed_at = now()
    FROM locked
    WHERE o.id = locked.id
    RETURNING o.id, o.project_id, o.delivery_id, o.forward_id, o.routing_id, o.reason, o.claim_token,
              o.created_at::text AS created_at, o.traceparent, o.tracestate
)
SELECT now() AS claimed_at, (SELECT count(*) FROM head) AS seen,
       c.id, c.project_id, c.delivery_id, c.forward_id, c.routing_id, c.reason, c.claim_token, c.created_at,
       c.traceparent, c.tracestate
FROM (SELECT 1) AS one
LEFT JOIN claimed c ON true
ORDER BY c.id";

/// Claims one batch: PENDING (or recoverable SENDING) rows become SENDING under
/// `poll_claimed_at = now()`, at most `limits.per_endpoint` per routing id,
/// `limits.per_project` per project and `limits.batch` in all. One statement; committed when
/// it returns (the client must not be inside a transaction).
pub async fn claim_batch(client: &Client, limits: &Limits) -> Result<Claim, RelayError> {
    let recover_after = limits.recover_after.as_secs_f64();
    let result = client
        .query(CLAIM_SQL, &[&recover_after, &limits.scan, &limits.per_endpoint, &limits.per_project, &limits.batch])
        .await?;
    let mut claimed_at = None;
    let mut seen = 0i64;
    let mut rows = Vec::with_capacity(result.len());
    for r in &result {
        claimed_at = Some(r.try_get::<_, DateTime<Utc>>("claimed_at")?);
        seen = r.try_get("seen")?;
        let Some(id) = r.try_get::<_, Option<i64>>("id")? else { continue };
        rows.push(OutboxRow {
            id,
            project_id: r.try_get("project_id")?,
            delivery_id: r.try_get("delivery_id")?,
            forward_id: r.try_get("forward_id")?,
            routing_id: r.try_get("routing_id")?,
            reason: r.try_get("reason")?,
            claim_token: r.try_get("claim_token")?,
            created_at: r.try_get("created_at")?,
            traceparent: r.try_get("traceparent")?,
            tracestate: r.try_get("tracestate")?,
        });
    }
    rows.sort_by_key(|r| r.id);
    let claimed_at = claimed_at.ok_or_else(|| RelayError::Misconfigured("the claim query returned no row".into()))?;
    let left_behind = seen - rows.len() as i64;
    Ok(Claim { claimed_at, rows, left_behind })
}

/// SENDING -> PUBLISHED for `ids` still held under `claimed_at`; returns how many rows changed.
/// Rows recovered by another poller meanwhile (new `poll_claimed_at`) are not touched.
pub async fn mark_published(client: &Client, ids: &[i64], claimed_at: DateTime<Utc>) -> Result<u64, RelayError> {
    if ids.is_empty() {
        return Ok(0);
    }
    Ok(client
        .execute(
            "UPDATE outbox SET poll_status = 'PUBLISHED'
             WHERE id = ANY($1) AND poll_status = 'SENDING' AND poll_claimed_at = $2",
            &[&ids, &claimed_at],
        )
        .await?)
}

/// SENDING -> PENDING for `ids` still held under `claimed_at` (their produce failed), so the
/// next claim takes them at once instead of after [`RECOVER_AFTER`].
pub async fn release(client: &Client, ids: &[i64], claimed_at: DateTime<Utc>) -> Result<u64, RelayError> {
    if ids.is_empty() {
        return Ok(0);
    }
    Ok(client
        .execute(
            "UPDATE outbox SET poll_status = 'PENDING', poll_claimed_at = NULL
             WHERE id = ANY($1) AND poll_status = 'SENDING' AND poll_claimed_at = $2",
            &[&ids, &claimed_at],
        )
        .await?)
}

/// What became of a produced batch.
#[derive(Debug, Default)]
struct Produced {
    /// Acknowledged by Kafka, in id order.
    acked: Vec<i64>,
    /// Not handed over or not acknowledged, in id order.
    failed: Vec<i64>,
    /// The first produce error.
    error: Option<RelayError>,
}

/// Produces the claimed rows concurrently and waits for every acknowledgement.
async fn produce_batch(announcer: &Announcer, rows: &[OutboxRow], stats: &RelayStats) -> Produced {
    let mut out = Produced::default();
    let mut pending = Vec::with_capacity(rows.len());
    // Hand everything to the producer first (in id order, so each key keeps its order), then
    // await the acknowledgements together: one round trip's latency per batch, not per row.
    for (i, row) in rows.iter().enumerate() {
        stats.read.fetch_add(1, Ordering::Relaxed);
        // No commit LSN or time in poll mode, only when the row was read; the Announcer waits
        // while the producer's queue is full. (An outbox row always has exactly one target:
        // the table's CHECK.)
        let stamp = railhook_kafka::Stamp { relay_read_us: Some(railhook_telemetry::stages::unix_micros_now()), ..Default::default() };
        let sent = match row.announcement() {
            Ok(announcement) => announcer.send(&announcement, &stamp).await.map_err(RelayError::Produce),
            Err(e) => Err(RelayError::Row(e)),
        };
        match sent {
            Ok(delivery) => pending.push((row.id, delivery)),
            Err(e) => {
                // Nothing after this row is handed over; what was is still awaited below.
                stats.produce_errors.fetch_add(1, Ordering::Relaxed);
                out.failed.extend(rows[i..].iter().map(|r| r.id));
                out.error = Some(e);
                break;
            }
        }
    }
    let (ids, deliveries): (Vec<i64>, Vec<_>) = pending.into_iter().unzip();
    let results = futures::future::join_all(deliveries).await;
    for (id, result) in ids.into_iter().zip(results) {
        match result.err() {
            None => {
                stats.produced.fetch_add(1, Ordering::Relaxed);
                out.acked.push(id);
            }
            Some(e) => {
                stats.produce_errors.fetch_add(1, Ordering::Relaxed);
                out.failed.push(id);
                out.error.get_or_insert(RelayError::Produce(e));
            }
        }
    }
    out.failed.sort_unstable();
    out
}

/// A batch Kafka acknowledged whose finalise has not succeeded yet (Postgres went away).
/// It is retried, under the same claim, before anything new is claimed.
struct Unfinished {
    acked: Vec<i64>,
    claimed_at: DateTime<Utc>,
}

/// Polls the outbox until `shutdown`, then finishes the batch in flight and returns `Ok`.
/// Waits [`POLL_INTERVAL`] between polls, except right after a capped batch (see the module
/// docs), when it claims again at once.
///
/// Postgres errors are retried on a new connection with backoff (250 ms doubling to 10 s);
/// a batch Kafka acknowledged is then finalised under its claim before anything new is
/// claimed. A produce error returns [`RelayError::Produce`] after the bookkeeping: the
/// producer may be in a fatal state, so the caller decides whether to start over with a new one.
///
/// The topics must exist (`railhook_relay::run` ensures them before building the producer).
/// The poller's partial index, `outbox_poll_idx`: made here, not by a migration, because in
/// CDC mode it would cost an index entry per announcement for nothing (migration 0015 drops
/// it). Built `CONCURRENTLY`, so the ingest is not blocked while a large outbox is indexed; an
/// invalid index left by an interrupted build is dropped and built again.
pub async fn ensure_index(client: &Client) -> Result<(), tokio_postgres::Error> {
    let valid: Option<bool> = client
        .query_opt(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
             WHERE c.relname = 'outbox_poll_idx' AND c.relnamespace = current_schema()::regnamespace",
            &[],
        )
        .await?
        .map(|r| r.try_get(0))
        .transpose()?;
    match valid {
        Some(true) => return Ok(()),
        Some(false) => client.batch_execute("DROP INDEX CONCURRENTLY IF EXISTS outbox_poll_idx").await?,
        None => {}
    }
    tracing::info!("poll relay: creating the outbox_poll_idx index");
    client
        .batch_execute("CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_poll_idx ON outbox (id) WHERE poll_status <> 'PUBLISHED'")
        .await
}

/// The poller reads the outbox table: announcements must be rows
/// (`railhook_store::lifecycle::announce`). When they were logical decoding messages (a CDC
/// relay ran before), what was announced that way since the CDC relay last read is announced
/// again, as rows: the PENDING work that is not scheduled for a retry (duplicates are
/// absorbed by the Claim), so nothing waits for the stranded sweep.
pub async fn announce_by_outbox(client: &Client) -> Result<(), RelayError> {
    use railhook_store::lifecycle::announce::{set_via, Via};
    if set_via(client, Via::Outbox).await? == Some(Via::Message) {
        let n = railhook_store::lifecycle::reannounce_pending(client).await?;
        tracing::warn!(deliveries = n.deliveries, forwards = n.forwards, "poll relay: announcements were logical decoding messages (a CDC relay ran); now outbox rows, and the PENDING work was announced again");
    }
    Ok(())
}

pub async fn run(config: Arc<Config>, announcer: Announcer, stats: Arc<RelayStats>, shutdown: CancellationToken) -> Result<(), RelayError> {
    let url = railhook_store::DatabaseUrl::parse(&config.database.url).map_err(|e| RelayError::Misconfigured(e.to_string()))?;
    let tls = url.tls_connector().map_err(|e| RelayError::Misconfigured(e.to_string()))?;
    let mut pg = url.pg;
    if pg.get_application_name().is_none() {
        pg.application_name("railhook-relay-poll");
    }
    let limits = Limits::default();
    tracing::info!(interval_ms = POLL_INTERVAL.as_millis() as u64, ?limits, "poll relay started");
    let mut unfinished: Option<Unfinished> = None;
    let mut backoff = RETRY_MIN;
    loop {
        let attempt = async {
            let (client, connection) = pg.connect(tls.clone()).await?;
            let conn = tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::warn!(error = %e, "poll relay: Postgres connection ended");
                }
            });
            ensure_index(&client).await?;
            announce_by_outbox(&client).await?;
            let result = poll_loop(&announcer, &client, &limits, &stats, &shutdown, &mut unfinished, &mut backoff).await;
            drop(client);
            conn.abort();
            result
        };
        match attempt.await {
            Ok(()) => break,
            // Refused credentials (SQLSTATE class 28) are the operator's to fix, as in CDC mode.
            Err(RelayError::Postgres(e)) if e.code().is_some_and(|c| c.code().starts_with("28")) => {
                return Err(RelayError::Misconfigured(crate::auth_failed(&e)));
            }
            Err(RelayError::Postgres(e)) => {
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "poll relay: Postgres failed, reconnecting");
                let stop = tokio::select! {
                    _ = shutdown.cancelled() => true,
                    _ = tokio::time::sleep(backoff) => false,
                };
                backoff = (backoff * 2).min(RETRY_MAX);
                if stop {
                    if let Some(u) = &unfinished {
                        tracing::warn!(rows = u.acked.len(), "poll relay stopping with a produced batch not marked PUBLISHED: it is announced again after the recovery age");
                    }
                    break;
                }
            }
            Err(e) => return Err(e),
        }
    }
    tracing::info!(produced = stats.produced.load(Ordering::Relaxed), "poll relay stopped");
    Ok(())
}

const RETRY_MIN: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(10);

async fn poll_loop(
    announcer: &Announcer,
    client: &Client,
    limits: &Limits,
    stats: &RelayStats,
    shutdown: &CancellationToken,
    unfinished: &mut Option<Unfinished>,
    backoff: &mut Duration,
) -> Result<(), RelayError> {
    if let Some(u) = unfinished.as_ref() {
        mark_published(client, &u.acked, u.claimed_at).await?;
        *unfinished = None;
    }
    while !shutdown.is_cancelled() {
        let claim = claim_batch(client, limits).await?;
        *backoff = RETRY_MIN;
        if !claim.rows.is_empty() {
            tracing::debug!(rows = claim.rows.len(), left_behind = claim.left_behind, "claimed a batch");
            // Not raced against `shutdown`: a batch once claimed is produced and finalised.
            let produced = produce_batch(announcer, &claim.rows, stats).await;
            *unfinished = Some(Unfinished { acked: produced.acked, claimed_at: claim.claimed_at });
            let u = unfinished.as_ref().expect("just set");
            let published = mark_published(client, &u.acked, u.claimed_at).await?;
            if published < u.acked.len() as u64 {
                // This batch took longer than the recovery age and another poller re-claimed
                // some rows; they go out again under its claim (absorbed by the Claim downstream).
                tracing::warn!(acked = u.acked.len(), published, "rows recovered by another poller before this one finalised them");
            }
            *unfinished = None;
            if let Some(e) = produced.error {
                // If this fails the rows stay SENDING and are recovered after the recovery age.
                release(client, &produced.failed, claim.claimed_at).await?;
                tracing::error!(error = %e, failed = produced.failed.len(), published, "producing to Kafka failed; failed rows released");
                return Err(e);
            }
        }
        let capped = !claim.rows.is_empty() && claim.left_behind > 0;
        if !capped {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(POLL_INTERVAL) => {}
            }
        }
    }
    Ok(())
}
