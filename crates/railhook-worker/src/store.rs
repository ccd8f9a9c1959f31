//! The worker's SQL. Every write that matters is conditional on the Claim (`claim_token`), and
//! each step is one statement: claim (with everything the Attempt needs), finalise (with the
//! Attempt record and the successor), release (a Deferral), and the scheduler's and sweeps'
//! batches.

use chrono::{DateTime, Utc};
use tokio_postgres::GenericClient;
use uuid::Uuid;

/// A pooled connection (or a transaction on one) with its statement cache: the per-Attempt
/// statements (claim, finalise, release) are prepared once per connection, so each costs one
/// round trip instead of a parse and an execute.
pub trait Prepared: deadpool_postgres::GenericClient + Sync {}
impl<C: deadpool_postgres::GenericClient + Sync> Prepared for C {}

/// Everything one Attempt needs, returned by the claim itself (one round trip).
#[derive(Debug, Clone)]
pub struct Claimed {
    pub id: Uuid,
    pub project_id: Uuid,
    pub event_id: Uuid,
    pub endpoint_id: Uuid,
    pub token: Uuid,
    /// Attempts made before this one.
    pub attempt_count: i32,
    pub max_attempts: i32,
    pub retry_delays: Vec<i32>,
    pub timeout_seconds: i32,
    pub sequence_number: Option<i64>,
    pub ladder_started_at: DateTime<Utc>,
    pub event_type: String,
    pub event_created_at: DateTime<Utc>,
    pub payload: String,
    pub url: String,
    pub enabled: bool,
    pub headers: serde_json::Value,
    /// Current secret first, then unexpired rotated ones.
    pub secrets: Vec<String>,
}

/// The Attempt's details, read once the claim succeeded (by id and the new token).
const CLAIMED_SQL: &str = "
SELECT c.id, c.project_id, c.event_id, c.endpoint_id, c.attempt_count, c.max_attempts, c.retry_delays,
       c.timeout_seconds, c.sequence_number, c.ladder_started_at,
       e.event_type, e.created_at, e.payload::text, ep.url, ep.enabled, ep.headers,
       ARRAY(SELECT s.secret FROM endpoint_secrets s
             WHERE s.endpoint_id = c.endpoint_id AND (s.expires_at IS NULL OR s.expires_at > now())
             ORDER BY s.expires_at IS NULL DESC, s.created_at DESC),
       c.claim_token
FROM unnest($1::uuid[], $2::uuid[]) AS want (id, token)
JOIN deliveries c ON c.id = want.id AND c.claim_token = want.token AND c.status = 'PROCESSING'
JOIN events e ON e.id = c.event_id
JOIN endpoints ep ON ep.id = c.endpoint_id";

/// Limits the claim enforces (see `railhook_claim_batch` in migrations/0009_claim_batch.sql).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub endpoint_concurrency: i32,
    pub project_concurrency: i32,
    pub project_rate: i32,
    pub circuit_cooldown_s: f64,
    pub probe_timeout_s: f64,
}

impl Limits {
    pub fn from_config(w: &railhook_config::WorkerConfig) -> Limits {
        Limits {
            endpoint_concurrency: w.endpoint_concurrency,
            project_concurrency: w.project_concurrency,
            project_rate: w.project_rate_limit_per_second,
            circuit_cooldown_s: w.circuit_cooldown_seconds as f64,
            probe_timeout_s: w.processing_timeout_seconds as f64,
        }
    }
}

#[derive(Debug, Clone)]
pub enum ClaimResult {
    Claimed(Box<Claimed>),
    /// The hint claims nothing: done, not due, or owned by another token (duplicate windows
    /// 4 and 5).
    Nothing,
    /// No such Delivery in the claim's snapshot. A hint's Delivery was committed with its
    /// outbox row, so it exists; Postgres flushes (and the walsender may decode and send) a
    /// commit before the committing backend's transaction is visible to other snapshots, so
    /// a fast hint can overtake its own commit. Claimed again shortly (`runner::Runner::run`).
    Missing,
    /// A Deferral: the Delivery stays PENDING, due again later, no Attempt spent.
    Deferred(String),
}

/// One claim to make: the Delivery, the token this Attempt will hold, and the hint's token
/// (the scheduler's on the retry path, `None` for first announcements, which claim only
/// untokened rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimRequest {
    pub delivery: Uuid,
    pub token: Uuid,
    pub hint: Option<Uuid>,
}

/// 6.1 with the admission checks, for many Deliveries at once: `railhook_claim_batch`
/// (migrations/0009) takes the projects' and endpoints' advisory locks once for the batch,
/// checks each Delivery's circuit, concurrency and rates in order, and claims it (`WHERE
/// status = 'PENDING' AND due AND claim_token IS NOT DISTINCT FROM hint`), defers it, or
/// finds nothing. The rows the claims won are read by a second statement sent in the same
/// round trip (pipelined: it runs after the first one committed). Results are in the order
/// of `requests`.
pub async fn claim_batch<C: Prepared>(db: &C, requests: &[ClaimRequest], limits: &Limits) -> Result<Vec<ClaimResult>, tokio_postgres::Error> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    let claim = db.prepare_cached("SELECT idx, outcome FROM railhook_claim_batch($1, $2, $3, $4, $5, $6, $7, $8)").await?;
    let read = db.prepare_cached(CLAIMED_SQL).await?;
    let deliveries: Vec<Uuid> = requests.iter().map(|r| r.delivery).collect();
    let tokens: Vec<Uuid> = requests.iter().map(|r| r.token).collect();
    let hints: Vec<Option<Uuid>> = requests.iter().map(|r| r.hint).collect();
    let claim_params: [&(dyn tokio_postgres::types::ToSql + Sync); 8] =
        [&deliveries, &tokens, &hints, &limits.endpoint_concurrency, &limits.project_concurrency, &limits.project_rate, &limits.circuit_cooldown_s, &limits.probe_timeout_s];
    let read_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&deliveries, &tokens];
    // Both sent before either answer arrives (tokio-postgres pipelines queries polled
    // together, in the order polled); each is its own implicit transaction, so the read
    // runs after the claim committed.
    let (outcomes, rows) = tokio::join!(db.query(&claim, &claim_params), db.query(&read, &read_params));
    let (outcomes, rows) = (outcomes?, rows?);
    let mut claimed: std::collections::HashMap<Uuid, Claimed> = rows.iter().map(|r| (r.get::<_, Uuid>(17), claimed_row(r))).collect();
    let mut results: Vec<ClaimResult> = vec![ClaimResult::Nothing; requests.len()];
    for row in outcomes {
        let (idx, outcome): (i32, String) = (row.get(0), row.get(1));
        let Some(i) = usize::try_from(idx).ok().and_then(|i| i.checked_sub(1)).filter(|i| *i < requests.len()) else { continue };
        results[i] = match outcome.as_str() {
            "none" => ClaimResult::Nothing,
            "missing" => ClaimResult::Missing,
            // Claimed and read back; a row gone between the two statements (swept) claims
            // nothing.
            "claimed" => claimed.remove(&requests[i].token).map_or(ClaimResult::Nothing, |c| ClaimResult::Claimed(Box::new(c))),
            _ => ClaimResult::Deferred(outcome),
        };
    }
    Ok(results)
}

fn claimed_row(r: &tokio_postgres::Row) -> Claimed {
    Claimed {
        id: r.get(0),
        project_id: r.get(1),
        event_id: r.get(2),
        endpoint_id: r.get(3),
        token: r.get(17),
        attempt_count: r.get(4),
        max_attempts: r.get(5),
        retry_delays: r.get(6),
        timeout_seconds: r.get(7),
        sequence_number: r.get(8),
        ladder_started_at: r.get(9),
        event_type: r.get(10),
        event_created_at: r.get(11),
        payload: r.get(12),
        url: r.get(13),
        enabled: r.get(14),
        headers: r.get(15),
        secrets: r.get(16),
    }
}

/// The breaker's settings for the finalise.
#[derive(Debug, Clone, Copy)]
pub struct Circuit {
    pub window_s: f64,
    pub min_volume: i32,
    pub ratio: f64,
}

/// What the finalise writes on the Delivery.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    Success,
    /// Back to PENDING, due at this time (the successor).
    RetryAt(DateTime<Utc>),
    /// Failed Messages.
    Failed,
}

/// One Attempt as recorded.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    pub status_code: Option<i32>,
    pub result: String,
    pub error_message: Option<String>,
    pub response_headers: serde_json::Value,
    pub response_body: String,
    pub response_truncated: bool,
}

/// What the finalise reports: whether it held the Claim, and the circuit's state change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finalised {
    pub wrote: bool,
    pub circuit: Option<String>,
}

/// One Attempt's finalise: the Claim it was made under, what to write on the Delivery, the
/// Attempt itself, and `healthy`: whether the outcome counts as a success for the endpoint's
/// circuit (it answered, whatever the status, unless the answer asks for a retry).
#[derive(Debug, Clone)]
pub struct FinaliseRequest {
    pub delivery: Uuid,
    pub token: Uuid,
    pub project_id: Uuid,
    pub endpoint_id: Uuid,
    /// The Attempt's id, fixed here so that a finalise made again (after a lost reply) does
    /// not record the Attempt twice.
    pub attempt_id: Uuid,
    /// The Attempt's number (the Delivery's `attempt_count` at the claim, plus one).
    pub number: i32,
    pub next: Next,
    pub last_error: Option<String>,
    pub attempt: AttemptRecord,
    pub healthy: bool,
}

impl FinaliseRequest {
    pub fn new(claimed: &Claimed, next: Next, last_error: Option<String>, attempt: AttemptRecord, healthy: bool) -> FinaliseRequest {
        FinaliseRequest {
            delivery: claimed.id,
            token: claimed.token,
            project_id: claimed.project_id,
            endpoint_id: claimed.endpoint_id,
            attempt_id: Uuid::now_v7(),
            number: claimed.attempt_count + 1,
            next,
            last_error,
            attempt,
            healthy,
        }
    }
}

/// 6.2's finalise for many Attempts in one statement and one commit
/// (`railhook_finalise_batch`, migrations/0010): each Attempt is inserted whatever happens to
/// its fence (every Attempt is on record); its Delivery changes, and its successor is
/// queued, only while the Claim still holds; only then does the outcome count in the
/// endpoint's circuit. The rows go in endpoint order, so every batch locks circuit rows in
/// the same order. Results are in the order of `requests`.
pub async fn finalise_batch<C: Prepared>(db: &C, requests: &[FinaliseRequest], circuit: &Circuit) -> Result<Vec<Finalised>, tokio_postgres::Error> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&i| (requests[i].endpoint_id, i));
    let sorted: Vec<&FinaliseRequest> = order.iter().map(|&i| &requests[i]).collect();
    let deliveries: Vec<Uuid> = sorted.iter().map(|r| r.delivery).collect();
    let tokens: Vec<Uuid> = sorted.iter().map(|r| r.token).collect();
    let projects: Vec<Uuid> = sorted.iter().map(|r| r.project_id).collect();
    let endpoints: Vec<Uuid> = sorted.iter().map(|r| r.endpoint_id).collect();
    let attempt_ids: Vec<Uuid> = sorted.iter().map(|r| r.attempt_id).collect();
    let statuses: Vec<&str> = sorted
        .iter()
        .map(|r| match r.next {
            Next::Success => "SUCCESS",
            Next::RetryAt(_) => "PENDING",
            Next::Failed => "FAILED",
        })
        .collect();
    let retry_at: Vec<Option<DateTime<Utc>>> = sorted.iter().map(|r| if let Next::RetryAt(at) = r.next { Some(at) } else { None }).collect();
    let last_errors: Vec<Option<&str>> = sorted.iter().map(|r| r.last_error.as_deref()).collect();
    let numbers: Vec<i32> = sorted.iter().map(|r| r.number).collect();
    let started: Vec<DateTime<Utc>> = sorted.iter().map(|r| r.attempt.started_at).collect();
    let durations: Vec<i32> = sorted.iter().map(|r| r.attempt.duration_ms).collect();
    let codes: Vec<Option<i32>> = sorted.iter().map(|r| r.attempt.status_code).collect();
    let results: Vec<&str> = sorted.iter().map(|r| r.attempt.result.as_str()).collect();
    let errors: Vec<Option<&str>> = sorted.iter().map(|r| r.attempt.error_message.as_deref()).collect();
    let headers: Vec<&serde_json::Value> = sorted.iter().map(|r| &r.attempt.response_headers).collect();
    let bodies: Vec<&str> = sorted.iter().map(|r| r.attempt.response_body.as_str()).collect();
    let truncated: Vec<bool> = sorted.iter().map(|r| r.attempt.response_truncated).collect();
    let healthy: Vec<bool> = sorted.iter().map(|r| r.healthy).collect();
    let statement = db
        .prepare_cached(
            "SELECT idx, wrote, circuit FROM railhook_finalise_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)",
        )
        .await?;
    let rows = db
        .query(
            &statement,
            &[
                &deliveries, &tokens, &statuses, &retry_at, &last_errors, &attempt_ids, &projects, &numbers, &started, &durations,
                &codes, &results, &errors, &headers, &bodies, &truncated, &endpoints, &healthy,
                &circuit.window_s, &circuit.min_volume, &circuit.ratio,
            ],
        )
        .await?;
    let mut out = vec![Finalised { wrote: false, circuit: None }; requests.len()];
    for row in rows {
        let Some(at) = usize::try_from(row.get::<_, i32>(0)).ok().and_then(|i| i.checked_sub(1)).and_then(|i| order.get(i)) else { continue };
        out[*at] = Finalised { wrote: row.get(1), circuit: row.get(2) };
    }
    Ok(out)
}

/// A Deferral, or a Claim given back at shutdown: back to PENDING, due at `at`, no Attempt
/// spent. Conditional on the Claim like every other write.
pub async fn release<C: Prepared>(db: &C, delivery: Uuid, token: Uuid, at: Option<DateTime<Utc>>) -> Result<bool, tokio_postgres::Error> {
    let release = db
        .prepare_cached(
            "UPDATE deliveries SET status = 'PENDING', claim_token = NULL, claimed_at = NULL, next_retry_at = $3, updated_at = now()
             WHERE id = $1 AND claim_token = $2 AND status = 'PROCESSING'",
        )
        .await?;
    let n = db
        .execute(
            &release,
            &[&delivery, &token, &at],
        )
        .await?;
    Ok(n == 1)
}

/// The retry scheduler's batch: due PENDING Deliveries, claimed under a scheduler token with
/// SKIP LOCKED, at most `per_endpoint` per endpoint and `limit` in all, oldest due first, and
/// announced in the same statement through the outbox (reason `retry`, with the token), so
/// ownership passes with the announcement and cannot be lost between the two. A row still
/// carrying a scheduler token `$4` seconds after its announcement was not claimed (the hint
/// was lost): it is tokened and announced again, and the old token's hint then claims
/// nothing.
const SCHEDULE_SQL: &str = "
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
    UPDATE deliveries d SET claim_token = gen_random_uuid(), last_announced_at = now(), updated_at = now()
    FROM picked WHERE d.id = picked.id
    RETURNING d.id, d.project_id, d.endpoint_id, d.claim_token
)
INSERT INTO outbox (project_id, delivery_id, routing_id, reason, claim_token)
SELECT project_id, id, endpoint_id, 'retry', claim_token FROM tokened
RETURNING id";

/// Claims and announces one batch of due retries; how many.
pub async fn schedule_due(db: &impl GenericClient, limit: i64, per_endpoint: i64, per_project: i64, reannounce_after_s: f64) -> Result<usize, tokio_postgres::Error> {
    Ok(db.query(SCHEDULE_SQL, &[&limit, &per_endpoint, &per_project, &reannounce_after_s]).await?.len())
}

/// Sweep 6.4 (a): PROCESSING for longer than `older_than_s` goes back to PENDING with the
/// token cleared and is announced again (reason `reannounce`); bounded by `limit`.
const SWEEP_STUCK_SQL: &str = "
WITH stuck AS (
    SELECT id FROM deliveries
    WHERE status = 'PROCESSING' AND claimed_at < now() - make_interval(secs => $1)
    ORDER BY claimed_at LIMIT $2 FOR UPDATE SKIP LOCKED
), reset AS (
    UPDATE deliveries d SET status = 'PENDING', claim_token = NULL, claimed_at = NULL, next_retry_at = NULL,
                            last_announced_at = now(), updated_at = now()
    FROM stuck WHERE d.id = stuck.id
    RETURNING d.id, d.project_id, d.endpoint_id
)
INSERT INTO outbox (project_id, delivery_id, routing_id, reason)
SELECT project_id, id, endpoint_id, 'reannounce' FROM reset
RETURNING id";

/// Sweep 6.4 (b): PENDING and not announced for `older_than_s` (its announcement was lost):
/// announced again, the scheduler's token (if any) cleared; bounded by `limit`.
const SWEEP_STRANDED_SQL: &str = "
WITH stranded AS (
    SELECT id FROM deliveries
    WHERE status = 'PENDING' AND last_announced_at < now() - make_interval(secs => $1)
      AND (next_retry_at IS NULL OR next_retry_at <= now())
    ORDER BY last_announced_at LIMIT $2 FOR UPDATE SKIP LOCKED
), reset AS (
    UPDATE deliveries d SET claim_token = NULL, last_announced_at = now(), updated_at = now()
    FROM stranded WHERE d.id = stranded.id
    RETURNING d.id, d.project_id, d.endpoint_id
)
INSERT INTO outbox (project_id, delivery_id, routing_id, reason)
SELECT project_id, id, endpoint_id, 'reannounce' FROM reset
RETURNING id";

/// Sweep 6.4 (c): the hard cap. PENDING Deliveries whose ladder started more than
/// `max_age_s` ago go to Failed Messages.
const SWEEP_CAPPED_SQL: &str = "
WITH capped AS (
    SELECT id FROM deliveries
    WHERE status = 'PENDING' AND ladder_started_at < now() - make_interval(secs => $1)
    ORDER BY ladder_started_at LIMIT $2 FOR UPDATE SKIP LOCKED
)
UPDATE deliveries d SET status = 'FAILED', claim_token = NULL, next_retry_at = NULL, completed_at = now(),
                        last_error = coalesce(d.last_error || '; ', '') || 'hard cap reached', updated_at = now()
FROM capped WHERE d.id = capped.id";

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

/// The advisory lock that makes the sweeps a singleton across worker processes.
pub const SWEEP_LOCK: i64 = 0x7261_696c_686f_6f6b; // "railhook"

/// Runs every sweep in bounded batches, if this process gets the sweep lock (a
/// transaction-level advisory lock, so a crash cannot leave it held). `None` when another
/// process holds it.
pub async fn sweep(client: &mut deadpool_postgres::Object, l: &SweepLimits) -> Result<Option<Swept>, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let locked: bool = tx.query_one("SELECT pg_try_advisory_xact_lock($1)", &[&SWEEP_LOCK]).await?.get(0);
    if !locked {
        return Ok(None);
    }
    let stuck = tx.query(SWEEP_STUCK_SQL, &[&l.processing_timeout_s, &l.batch]).await?.len() as u64;
    let stranded = tx.query(SWEEP_STRANDED_SQL, &[&l.stranded_s, &l.batch]).await?.len() as u64;
    let capped = tx.execute(SWEEP_CAPPED_SQL, &[&l.outgoing_max_age_s, &l.batch]).await?;
    let capped_forwards = tx.execute(SWEEP_CAPPED_FORWARDS_SQL, &[&l.incoming_max_age_s, &l.batch]).await?;
    tx.commit().await?;
    Ok(Some(Swept { stuck, stranded, capped, capped_forwards }))
}
