//! The worker's SQL. Every write that matters is conditional on the Claim (`claim_token`), and
//! each step is one statement: claim (with everything the Attempt needs), finalise (with the
//! Attempt record and the successor), release (a Deferral), and the scheduler's and sweeps'
//! batches.

use chrono::{DateTime, Utc};
use tokio_postgres::GenericClient;
use uuid::Uuid;

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

/// 6.1: the row is the truth, the Kafka message a hint. `hint_token` is the scheduler's token
/// on the retry path (the consumer swaps it for its own only while the row still carries it);
/// `None` for first announcements, which claim only untokened rows.
const CLAIM_SQL: &str = "
WITH claimed AS (
    UPDATE deliveries d
    SET status = 'PROCESSING', claim_token = $2, claimed_at = now(), updated_at = now()
    WHERE d.id = $1 AND d.status = 'PENDING'
      AND (d.next_retry_at IS NULL OR d.next_retry_at <= now())
      AND d.claim_token IS NOT DISTINCT FROM $3
    RETURNING d.*
)
SELECT c.id, c.project_id, c.event_id, c.endpoint_id, c.attempt_count, c.max_attempts, c.retry_delays,
       c.timeout_seconds, c.sequence_number, c.ladder_started_at,
       e.event_type, e.created_at, e.payload::text, ep.url, ep.enabled, ep.headers,
       ARRAY(SELECT s.secret FROM endpoint_secrets s
             WHERE s.endpoint_id = c.endpoint_id AND (s.expires_at IS NULL OR s.expires_at > now())
             ORDER BY s.expires_at IS NULL DESC, s.created_at DESC)
FROM claimed c
JOIN events e ON e.id = c.event_id
JOIN endpoints ep ON ep.id = c.endpoint_id";

pub async fn claim(db: &impl GenericClient, delivery: Uuid, token: Uuid, hint_token: Option<Uuid>) -> Result<Option<Claimed>, tokio_postgres::Error> {
    let row = db.query_opt(CLAIM_SQL, &[&delivery, &token, &hint_token]).await?;
    Ok(row.map(|r| Claimed {
        id: r.get(0),
        project_id: r.get(1),
        event_id: r.get(2),
        endpoint_id: r.get(3),
        token,
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
    }))
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

/// The Attempt is inserted whatever happens to the fence (every Attempt is on record); the
/// Delivery changes, and the successor is queued, only while this worker still holds the
/// Claim. Returns whether it did.
const FINALISE_SQL: &str = "
WITH fenced AS (
    UPDATE deliveries
    SET status = $3::text::delivery_status,
        attempt_count = attempt_count + 1,
        next_retry_at = $4,
        claim_token = NULL, claimed_at = NULL,
        last_error = $5,
        completed_at = CASE WHEN $3 IN ('SUCCESS', 'FAILED') THEN now() END,
        updated_at = now()
    WHERE id = $1 AND claim_token = $2 AND status = 'PROCESSING'
    RETURNING id
), attempt AS (
    INSERT INTO attempts (id, project_id, delivery_id, attempt_number, started_at, duration_ms, status_code,
                          result, error_message, response_headers, response_body, response_truncated)
    VALUES ($6, $7, $1, $8, $9, $10, $11, $12, $13, $14, $15, $16)
)
SELECT count(*) FROM fenced";

pub async fn finalise(db: &impl GenericClient, claimed: &Claimed, next: &Next, last_error: Option<&str>, attempt: &AttemptRecord) -> Result<bool, tokio_postgres::Error> {
    let (status, retry_at) = match next {
        Next::Success => ("SUCCESS", None),
        Next::RetryAt(at) => ("PENDING", Some(*at)),
        Next::Failed => ("FAILED", None),
    };
    let attempt_id = Uuid::now_v7();
    let number = claimed.attempt_count + 1;
    let row = db
        .query_one(
            FINALISE_SQL,
            &[
                &claimed.id,
                &claimed.token,
                &status,
                &retry_at,
                &last_error,
                &attempt_id,
                &claimed.project_id,
                &number,
                &attempt.started_at,
                &attempt.duration_ms,
                &attempt.status_code,
                &attempt.result,
                &attempt.error_message,
                &attempt.response_headers,
                &attempt.response_body,
                &attempt.response_truncated,
            ],
        )
        .await?;
    Ok(row.get::<_, i64>(0) == 1)
}

/// A Deferral, or a Claim given back at shutdown: back to PENDING, due at `at`, no Attempt
/// spent. Conditional on the Claim like every other write.
pub async fn release(db: &impl GenericClient, delivery: Uuid, token: Uuid, at: Option<DateTime<Utc>>) -> Result<bool, tokio_postgres::Error> {
    let n = db
        .execute(
            "UPDATE deliveries SET status = 'PENDING', claim_token = NULL, claimed_at = NULL, next_retry_at = $3, updated_at = now()
             WHERE id = $1 AND claim_token = $2 AND status = 'PROCESSING'",
            &[&delivery, &token, &at],
        )
        .await?;
    Ok(n == 1)
}

/// The retry scheduler's batch: due PENDING Deliveries, claimed under a scheduler token with
/// SKIP LOCKED, at most `per_endpoint` per endpoint and `limit` in all, oldest due first, and
/// announced in the same statement through the outbox (reason `retry`, with the token), so
/// ownership passes with the announcement and cannot be lost between the two.
const SCHEDULE_SQL: &str = "
WITH due AS (
    SELECT id, project_id, endpoint_id, next_retry_at FROM deliveries
    WHERE status = 'PENDING' AND claim_token IS NULL AND next_retry_at <= now()
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
pub async fn schedule_due(db: &impl GenericClient, limit: i64, per_endpoint: i64, per_project: i64) -> Result<usize, tokio_postgres::Error> {
    Ok(db.query(SCHEDULE_SQL, &[&limit, &per_endpoint, &per_project]).await?.len())
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

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    pub stuck: u64,
    pub stranded: u64,
    pub capped: u64,
}

/// The advisory lock that makes the sweeps a singleton across worker processes.
pub const SWEEP_LOCK: i64 = 0x7261_696c_686f_6f6b; // "railhook"

/// Runs every sweep in bounded batches, if this process gets the sweep lock (a
/// transaction-level advisory lock, so a crash cannot leave it held). `None` when another
/// process holds it.
pub async fn sweep(client: &mut deadpool_postgres::Object, processing_timeout_s: f64, stranded_s: f64, max_age_s: f64, limit: i64) -> Result<Option<Swept>, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let locked: bool = tx.query_one("SELECT pg_try_advisory_xact_lock($1)", &[&SWEEP_LOCK]).await?.get(0);
    if !locked {
        return Ok(None);
    }
    let stuck = tx.query(SWEEP_STUCK_SQL, &[&processing_timeout_s, &limit]).await?.len() as u64;
    let stranded = tx.query(SWEEP_STRANDED_SQL, &[&stranded_s, &limit]).await?.len() as u64;
    let capped = tx.execute(SWEEP_CAPPED_SQL, &[&max_age_s, &limit]).await?;
    tx.commit().await?;
    Ok(Some(Swept { stuck, stranded, capped }))
}
