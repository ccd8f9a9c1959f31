//! The Forward lifecycle (the incoming direction's counterpart of the Delivery's): every
//! write to `forwards` after the ingress (`incoming::INGRESS_SQL`) and the hard-cap sweep
//! (`schedule::sweep`): the claim, the finalise, the release, the retry scheduler, the
//! stuck and stranded sweeps, a person's retry (one or in bulk) and the replay.
//!
//! Each is one statement for a whole batch. Every write on a claimed row is conditional on
//! its `claim_token` (the fence); every write on an unclaimed row on the state it read.
//!
//! Admission at the claim (no Attempt spent, the Forward stays PENDING, due later; the retry
//! scheduler announces it again when due):
//! - a **disabled Destination** defers it by [`DISABLED_DEFERRAL_S`] (60 s), as a disabled
//!   Endpoint does, until it is enabled again or the 24 h hard cap sends it to the failed
//!   Forwards: disabling a Destination for a while loses nothing, deleting it deletes its
//!   Forwards;
//! - a Destination's `rate_limit_per_second` counts its Forwards claimed within the last
//!   second (`claimed_at`, kept after the finalise) plus those admitted earlier in the same
//!   batch; over it, the Forward is deferred by 1 s. Exact within one claim statement (one
//!   worker's claims go through one batching task, so one worker never exceeds it); two
//!   workers' statements that overlap may each admit up to the limit in the same second;
//! - the Destination's **circuit breaker**, the Endpoints' own (`railhook_circuit_admit`,
//!   `railhook_circuit_take_probe` and `railhook_circuit_record_batch` in `rules.sql`, the
//!   same `worker.circuit_*` settings): while open the Forward waits for the cool-down's end,
//!   while a probe is in flight 1 s; the first claim after the cool-down is the probe (one per
//!   statement and Destination), whose outcome closes or reopens the circuit. The finalise
//!   records each Attempt's outcome (an answer that asks for a retry is a failure). Two
//!   workers' statements that overlap after a cool-down may each send a probe; the circuit
//!   follows the later one.

use chrono::{DateTime, Utc};
use railhook_core::{AnnouncementReason, AttemptId, CircuitChange, ClaimToken, DeliveryStatus, DestinationId, ForwardId, IncomingEventId, ProjectId, SourceId};
use serde::Serialize;
use tokio_postgres::types::Json;
use tokio_postgres::{GenericClient, Row};
use uuid::Uuid;

use super::finalise::{AttemptRecord, Circuit, Next};
use super::manual::SkipReason;
use super::{Limits, Prepared};
use crate::incoming::{ForwardToSend, FORWARD_TIMEOUT_SECONDS, INCOMING_DELAYS, INCOMING_MAX_ATTEMPTS};
use crate::sources::{destination_from, DESTINATION_COLUMNS};
use crate::StoreError;

/// How long a Forward to a disabled Destination waits before it is tried again.
pub const DISABLED_DEFERRAL_S: i32 = 60;

// ---- Claim -------------------------------------------------------------------------------

/// One claim to make: the Forward, the token this Attempt will hold, and the hint's token
/// (the scheduler's on the retry path; `None` for first announcements, which claim only
/// untokened rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardClaim {
    pub forward: ForwardId,
    pub token: ClaimToken,
    pub hint: Option<ClaimToken>,
}

/// Why a claim deferred a Forward (no Attempt spent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardDeferral {
    DestinationDisabled,
    DestinationRate,
    /// The Destination's circuit is open: until its cool-down ends.
    CircuitOpen,
    /// Its probe is in flight: 1 s.
    CircuitHalfOpen,
}

impl ForwardDeferral {
    pub fn as_str(&self) -> &'static str {
        match self {
            ForwardDeferral::DestinationDisabled => "destination_disabled",
            ForwardDeferral::DestinationRate => "destination_rate",
            ForwardDeferral::CircuitOpen => "circuit_open",
            ForwardDeferral::CircuitHalfOpen => "circuit_half_open",
        }
    }
}

/// The circuit breaker's timing at the claim: the Endpoints' settings
/// (`worker.circuit_cooldown_seconds`; a probe older than `worker.processing_timeout_seconds`
/// is replaced).
#[derive(Debug, Clone, Copy)]
pub struct CircuitTiming {
    pub cooldown_s: f64,
    pub probe_timeout_s: f64,
}

impl From<&Limits> for CircuitTiming {
    fn from(l: &Limits) -> CircuitTiming {
        CircuitTiming { cooldown_s: l.circuit_cooldown_s, probe_timeout_s: l.probe_timeout_s }
    }
}

/// A claimed Forward: everything its Attempt needs, and the token it holds.
#[derive(Debug, Clone)]
pub struct ClaimedForward {
    pub token: ClaimToken,
    pub forward: ForwardToSend,
}

#[derive(Debug, Clone)]
pub enum ForwardClaimResult {
    Claimed(Box<ClaimedForward>),
    /// Done, not due, or owned by another token (duplicate windows 4 and 5).
    Nothing,
    /// Not in the claim's snapshot as the hint announced it: no such Forward, or (a hint of
    /// the retry scheduler) a PENDING Forward without the scheduler's token. The commit that
    /// wrote it may not be visible yet (a hint can overtake its own commit, see
    /// `claim::ClaimResult::Missing`; on the retry path that left such a hint claiming nothing
    /// until the scheduler announced again, 30 s later), or the Forward was deleted, or swept
    /// (then announced again). The worker claims again shortly, a few times.
    Missing,
    Deferred(ForwardDeferral),
}

/// The claim: decides each request (claim, Deferral or nothing), claims and defers in the
/// same statement, and returns the claimed rows with their Destination and Incoming Event.
/// `$4`, the configured ladder (`worker.incoming_retry_delays_seconds`), replaces the ladder
/// of a Forward at its first claim (`attempt_count = 0`): its delays, and one Attempt more
/// than delays. `$6`, `$7`: the circuit's cool-down and probe timeout. A claim admitted
/// through a circuit that is not closed takes the probe (`probed`, read by the final SELECT
/// so that it runs, after `claimed`).
const CLAIM_SQL_HEAD: &str = "
WITH want AS (
    SELECT w.id, w.token, w.hint, w.idx
    FROM unnest($1::uuid[], $2::uuid[], $3::uuid[]) WITH ORDINALITY AS w (id, token, hint, idx)
), cand AS (
    SELECT w.idx, w.id, w.token, w.hint, f.destination_id, d.enabled, d.rate_limit_per_second AS rate,
           ca.state AS circuit_state, ca.reason AS circuit_reason, ca.defer_until AS circuit_until,
           -- Not visible yet: no row, or (retry path) the scheduler's token not yet on it.
           f.id IS NULL OR (w.hint IS NOT NULL AND f.status = 'PENDING' AND f.claim_token IS NULL) AS missing,
           coalesce(f.status = 'PENDING' AND (f.next_retry_at IS NULL OR f.next_retry_at <= now())
                    AND f.claim_token IS NOT DISTINCT FROM w.hint, false) AS eligible
    FROM want w LEFT JOIN forwards f ON f.id = w.id LEFT JOIN destinations d ON d.id = f.destination_id
    LEFT JOIN LATERAL railhook_circuit_admit(f.destination_id, $6, $7) ca ON true
), admitted AS (
    SELECT c.idx, c.id, c.token, c.hint, c.destination_id, c.circuit_state, c.circuit_until,
           CASE WHEN NOT c.enabled THEN 'destination_disabled'
                WHEN c.circuit_reason IS NOT NULL THEN c.circuit_reason
                -- Through a circuit that is not closed: the first claim is the probe, the
                -- others wait for its outcome.
                WHEN c.circuit_state IN ('open', 'half_open')
                     AND row_number() OVER (PARTITION BY c.destination_id ORDER BY c.idx) > 1 THEN 'circuit_half_open'
                WHEN c.rate IS NOT NULL
                     AND (SELECT count(*) FROM forwards r WHERE r.destination_id = c.destination_id AND r.claimed_at > now() - interval '1 second')
                         + row_number() OVER (PARTITION BY c.destination_id ORDER BY c.idx) > c.rate THEN 'destination_rate'
                ELSE 'claim' END AS decision
    FROM cand c WHERE c.eligible
), deferred AS (
    UPDATE forwards f SET claim_token = NULL, updated_at = now(),
        next_retry_at = CASE a.decision WHEN 'destination_disabled' THEN now() + make_interval(secs => $5)
                                        WHEN 'circuit_open' THEN a.circuit_until
                                        ELSE now() + interval '1 second' END
    FROM admitted a
    WHERE a.decision <> 'claim' AND f.id = a.id AND f.status = 'PENDING'
      AND (f.next_retry_at IS NULL OR f.next_retry_at <= now()) AND f.claim_token IS NOT DISTINCT FROM a.hint
    RETURNING f.id
), claimed AS (
    UPDATE forwards f SET status = 'PROCESSING', claim_token = a.token, claimed_at = now(), updated_at = now(),
        retry_delays = CASE WHEN f.attempt_count = 0 AND $4::int[] IS NOT NULL THEN $4::int[] ELSE f.retry_delays END,
        max_attempts = CASE WHEN f.attempt_count = 0 AND $4::int[] IS NOT NULL THEN cardinality($4::int[]) + 1 ELSE f.max_attempts END
    FROM admitted a, destinations d, incoming_events i
    WHERE a.decision = 'claim' AND f.id = a.id AND f.status = 'PENDING'
      AND (f.next_retry_at IS NULL OR f.next_retry_at <= now()) AND f.claim_token IS NOT DISTINCT FROM a.hint
      AND d.id = f.destination_id AND i.id = f.incoming_event_id
    RETURNING ";

const CLAIM_SQL_TAIL: &str = ",
        f.id AS fid, f.project_id, f.attempt_count, f.max_attempts, f.retry_delays, f.timeout_seconds, f.ladder_started_at,
        i.id AS iid, i.provider_event_id, i.method, i.headers AS iheaders, i.body, i.content_type, i.received_at, f.claim_token AS won
), probed AS (
    SELECT railhook_circuit_take_probe(a.destination_id, k.won)
    FROM claimed k JOIN admitted a ON a.id = k.fid AND a.token = k.won
    WHERE a.circuit_state IN ('open', 'half_open')
)
SELECT c.idx,
       CASE WHEN c.missing THEN 'missing'
            WHEN k.fid IS NOT NULL THEN 'claim'
            WHEN EXISTS (SELECT 1 FROM deferred x WHERE x.id = c.id) THEN (SELECT a.decision FROM admitted a WHERE a.idx = c.idx)
            ELSE 'none' END,
       p.probes,
       k.*
FROM cand c LEFT JOIN claimed k ON k.fid = c.id AND k.won = c.token
CROSS JOIN (SELECT count(*) AS probes FROM probed) p
ORDER BY c.idx";

fn claim_sql() -> String {
    format!("{CLAIM_SQL_HEAD}{DESTINATION_COLUMNS}{CLAIM_SQL_TAIL}")
}

/// Claims (or defers) a batch of Forwards in one statement; results in the order of
/// `claims`. `ladder`: the configured incoming ladder, if any (see [`CLAIM_SQL_HEAD`]).
pub async fn claim_batch<C: Prepared>(db: &C, claims: &[ForwardClaim], ladder: Option<&[i32]>, circuit: &CircuitTiming) -> Result<Vec<ForwardClaimResult>, StoreError> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let statement = db.prepare_cached(&claim_sql()).await?;
    let ids: Vec<ForwardId> = claims.iter().map(|c| c.forward).collect();
    let tokens: Vec<ClaimToken> = claims.iter().map(|c| c.token).collect();
    let hints: Vec<Option<ClaimToken>> = claims.iter().map(|c| c.hint).collect();
    let ladder: Option<Vec<i32>> = ladder.filter(|l| !l.is_empty()).map(<[i32]>::to_vec);
    let rows = db.query(&statement, &[&ids, &tokens, &hints, &ladder, &(DISABLED_DEFERRAL_S as f64), &circuit.cooldown_s, &circuit.probe_timeout_s]).await?;
    let mut out = vec![ForwardClaimResult::Nothing; claims.len()];
    for row in &rows {
        let Some(i) = usize::try_from(row.try_get::<_, i64>(0)?).ok().and_then(|i| i.checked_sub(1)).filter(|i| *i < claims.len()) else { continue };
        out[i] = match row.try_get::<_, &str>(1)? {
            "missing" => ForwardClaimResult::Missing,
            "claim" => ForwardClaimResult::Claimed(Box::new(claimed_from(row, 3)?)),
            "destination_disabled" => ForwardClaimResult::Deferred(ForwardDeferral::DestinationDisabled),
            "destination_rate" => ForwardClaimResult::Deferred(ForwardDeferral::DestinationRate),
            "circuit_open" => ForwardClaimResult::Deferred(ForwardDeferral::CircuitOpen),
            "circuit_half_open" => ForwardClaimResult::Deferred(ForwardDeferral::CircuitHalfOpen),
            _ => ForwardClaimResult::Nothing,
        };
    }
    Ok(out)
}

/// A claimed row: [`DESTINATION_COLUMNS`] from `at`, then the Forward and Incoming Event.
fn claimed_from(r: &Row, at: usize) -> Result<ClaimedForward, StoreError> {
    let destination = destination_from(r, at)?;
    let f = at + 8;
    let headers = serde_json::from_value(r.try_get::<_, Json<serde_json::Value>>(f + 10)?.0).unwrap_or_default();
    let forward = ForwardToSend {
        id: ForwardId(r.try_get(f)?),
        project_id: ProjectId(r.try_get(f + 1)?),
        status: DeliveryStatus::Processing,
        attempt_count: r.try_get(f + 2)?,
        max_attempts: r.try_get(f + 3)?,
        retry_delays: r.try_get(f + 4)?,
        timeout_seconds: r.try_get(f + 5)?,
        ladder_started_at: r.try_get(f + 6)?,
        destination,
        incoming_event_id: IncomingEventId(r.try_get(f + 7)?),
        provider_event_id: r.try_get(f + 8)?,
        method: r.try_get(f + 9)?,
        headers,
        body: r.try_get(f + 11)?,
        content_type: r.try_get(f + 12)?,
        received_at: r.try_get(f + 13)?,
    };
    Ok(ClaimedForward { token: r.try_get(f + 14)?, forward })
}

// ---- Finalise and release ----------------------------------------------------------------

/// One Attempt's finalise: the Claim it was made under, the Forward's next state, the
/// Attempt itself.
#[derive(Debug, Clone)]
pub struct ForwardFinalise {
    pub forward: ForwardId,
    pub token: ClaimToken,
    pub project_id: ProjectId,
    /// Fixed by the caller, so a finalise made again does not record the Attempt twice.
    pub attempt_id: AttemptId,
    /// The Attempt's number: the Forward's `attempt_count` at the claim, plus one.
    pub number: i32,
    pub next: Next,
    pub last_error: Option<String>,
    pub attempt: AttemptRecord,
    /// Whether the outcome counts as a success for the Destination's circuit (it answered,
    /// whatever the status, unless the answer asks for a retry).
    pub healthy: bool,
}

/// What the finalise reports for one Attempt: whether it held the Claim, and its
/// Destination's circuit change (on one Attempt per Destination of the batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ForwardFinalised {
    pub wrote: bool,
    pub circuit: Option<CircuitChange>,
}

/// Records each Attempt (whatever happened to its fence: every Attempt is on record, unless
/// its Forward was deleted meanwhile) and, only while the Claim holds, the Forward's next
/// state: SUCCESS, PENDING due at the ladder's next step (the retry scheduler announces it),
/// or FAILED. `claimed_at` stays (the Destination's rate counts it). Only while the Claim
/// holds does the outcome count in the Destination's circuit (`railhook_circuit_record_batch`,
/// `$19`-`$21` the breaker's window, volume and ratio).
const FINALISE_SQL: &str = "
WITH req AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::timestamptz[], $5::text[], $6::uuid[], $7::uuid[], $8::int[],
                         $9::timestamptz[], $10::int[], $11::int[], $12::text[], $13::text[], $14::jsonb[], $15::text[], $16::bool[],
                         $17::jsonb[], $18::bool[])
        WITH ORDINALITY AS r (id, token, status, retry_at, last_error, attempt_id, project_id, number, started_at, duration_ms,
                              status_code, result, error_message, response_headers, response_body, response_truncated,
                              request_headers, healthy, idx)
), recorded AS (
    INSERT INTO attempts (id, project_id, forward_id, attempt_number, started_at, duration_ms, status_code, result, error_message,
                          response_headers, response_body, response_truncated, request_headers)
    SELECT r.attempt_id, r.project_id, r.id, r.number, r.started_at, r.duration_ms, r.status_code, r.result, r.error_message,
           r.response_headers, r.response_body, r.response_truncated, r.request_headers
    FROM req r WHERE EXISTS (SELECT 1 FROM forwards f WHERE f.id = r.id)
    ON CONFLICT (id, started_at) DO NOTHING
), updated AS (
    UPDATE forwards f SET status = r.status::delivery_status, attempt_count = r.number, next_retry_at = r.retry_at,
        claim_token = NULL, last_error = r.last_error, updated_at = now(),
        completed_at = CASE WHEN r.status IN ('SUCCESS', 'FAILED') THEN now() END
    FROM req r WHERE f.id = r.id AND f.claim_token = r.token AND f.status = 'PROCESSING'
    RETURNING r.idx, f.destination_id, r.token, r.healthy
), circuit AS (
    SELECT b.target, b.change FROM railhook_circuit_record_batch('destination',
        (SELECT array_agg(u.destination_id ORDER BY u.idx) FROM updated u),
        (SELECT array_agg(u.token ORDER BY u.idx) FROM updated u),
        (SELECT array_agg(u.healthy ORDER BY u.idx) FROM updated u),
        $19, $20, $21) AS b
)
SELECT r.idx, u.idx IS NOT NULL,
       CASE WHEN u.idx = max(u.idx) OVER (PARTITION BY u.destination_id) THEN ch.change END
FROM req r LEFT JOIN updated u ON u.idx = r.idx LEFT JOIN circuit ch ON ch.target = u.destination_id
ORDER BY r.idx";

/// Finalises a batch in one statement; for each request (in order), whether it still held
/// its Claim (wrote the Forward's state), and the circuit's change.
pub async fn finalise_batch<C: Prepared>(db: &C, requests: &[ForwardFinalise], circuit: &Circuit) -> Result<Vec<ForwardFinalised>, StoreError> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    let statement = db.prepare_cached(FINALISE_SQL).await?;
    let ids: Vec<ForwardId> = requests.iter().map(|r| r.forward).collect();
    let tokens: Vec<ClaimToken> = requests.iter().map(|r| r.token).collect();
    let statuses: Vec<&str> = requests.iter().map(|r| r.next.status().as_sql()).collect();
    let retry_at: Vec<Option<DateTime<Utc>>> = requests.iter().map(|r| if let Next::RetryAt(at) = r.next { Some(at) } else { None }).collect();
    let last_errors: Vec<Option<&str>> = requests.iter().map(|r| r.last_error.as_deref()).collect();
    let attempt_ids: Vec<AttemptId> = requests.iter().map(|r| r.attempt_id).collect();
    let projects: Vec<ProjectId> = requests.iter().map(|r| r.project_id).collect();
    let numbers: Vec<i32> = requests.iter().map(|r| r.number).collect();
    let started: Vec<DateTime<Utc>> = requests.iter().map(|r| r.attempt.started_at).collect();
    let durations: Vec<i32> = requests.iter().map(|r| r.attempt.duration_ms).collect();
    let codes: Vec<Option<i32>> = requests.iter().map(|r| r.attempt.status_code).collect();
    let results: Vec<&str> = requests.iter().map(|r| r.attempt.result.as_str()).collect();
    let errors: Vec<Option<&str>> = requests.iter().map(|r| r.attempt.error_message.as_deref()).collect();
    let headers: Vec<&serde_json::Value> = requests.iter().map(|r| &r.attempt.response_headers).collect();
    let bodies: Vec<&str> = requests.iter().map(|r| r.attempt.response_body.as_str()).collect();
    let truncated: Vec<bool> = requests.iter().map(|r| r.attempt.response_truncated).collect();
    let request_headers: Vec<&serde_json::Value> = requests.iter().map(|r| &r.attempt.request_headers).collect();
    let healthy: Vec<bool> = requests.iter().map(|r| r.healthy).collect();
    let rows = db
        .query(
            &statement,
            &[
                &ids, &tokens, &statuses, &retry_at, &last_errors, &attempt_ids, &projects, &numbers, &started, &durations, &codes, &results, &errors, &headers,
                &bodies, &truncated, &request_headers, &healthy, &circuit.window_s, &circuit.min_volume, &circuit.ratio,
            ],
        )
        .await?;
    let mut out = vec![ForwardFinalised::default(); requests.len()];
    for row in rows {
        if let Some(i) = usize::try_from(row.try_get::<_, i64>(0)?).ok().and_then(|i| i.checked_sub(1)).filter(|i| *i < out.len()) {
            let circuit = match row.try_get::<_, Option<&str>>(2)?.map(str::parse::<CircuitChange>) {
                Some(Ok(change)) => Some(change),
                Some(Err(e)) => return Err(StoreError::Misconfigured(format!("forward finalise: {e}"))),
                None => None,
            };
            out[i] = ForwardFinalised { wrote: row.try_get(1)?, circuit };
        }
    }
    Ok(out)
}

/// Claims given back unsent (shutdown): PENDING, due now (the retry scheduler announces
/// them), no Attempt spent; each conditional on its Claim. How many were given back.
pub async fn release<C: Prepared>(db: &C, claims: &[(ForwardId, ClaimToken)]) -> Result<u64, StoreError> {
    if claims.is_empty() {
        return Ok(0);
    }
    let statement = db
        .prepare_cached(
            "UPDATE forwards f SET status = 'PENDING', claim_token = NULL, claimed_at = NULL, next_retry_at = now(), updated_at = now()
             FROM unnest($1::uuid[], $2::uuid[]) AS r (id, token)
             WHERE f.id = r.id AND f.claim_token = r.token AND f.status = 'PROCESSING'",
        )
        .await?;
    let ids: Vec<ForwardId> = claims.iter().map(|c| c.0).collect();
    let tokens: Vec<ClaimToken> = claims.iter().map(|c| c.1).collect();
    Ok(db.execute(&statement, &[&ids, &tokens]).await?)
}

// ---- Retry scheduler and sweeps ----------------------------------------------------------

/// The retry scheduler's batch for Forwards, as `schedule::SCHEDULE_SQL` for Deliveries: due
/// PENDING Forwards tokened under SKIP LOCKED, at most `$2` per Destination and `$3` per
/// project, `$1` in all, oldest due first, and announced in the same statement (reason
/// `retry`, with the token, routed by the Destination). A token whose announcement nobody
/// claimed within `$4` seconds is replaced and announced again.
const SCHEDULE_SQL: &str = "
WITH due AS (
    SELECT id, project_id, destination_id, next_retry_at FROM forwards
    WHERE status = 'PENDING' AND next_retry_at <= now()
      AND (claim_token IS NULL OR last_announced_at < now() - make_interval(secs => $4))
    ORDER BY next_retry_at
    LIMIT $1::bigint * 4
    FOR UPDATE SKIP LOCKED
), fair AS (
    SELECT id, project_id, destination_id, next_retry_at,
           row_number() OVER (PARTITION BY destination_id ORDER BY next_retry_at) AS n_destination,
           row_number() OVER (PARTITION BY project_id ORDER BY next_retry_at) AS n_project
    FROM due
), picked AS (
    SELECT id FROM fair WHERE n_destination <= $2::bigint AND n_project <= $3::bigint
    ORDER BY n_destination, next_retry_at LIMIT $1
), tokened AS (
    UPDATE forwards f SET claim_token = coalesce(f.claim_token, gen_random_uuid()), last_announced_at = now(), updated_at = now()
    FROM picked WHERE f.id = picked.id
    RETURNING f.id, f.project_id, f.destination_id, f.claim_token
), announced AS (
    SELECT railhook_announce('f', array_agg(project_id ORDER BY id), array_agg(id ORDER BY id), array_agg(destination_id ORDER BY id), $5, array_agg(claim_token ORDER BY id)) AS n FROM tokened
)
SELECT tokened.id FROM tokened CROSS JOIN announced";

/// Tokens and announces one batch of due Forwards; how many.
pub async fn schedule_due(db: &impl GenericClient, limit: i64, per_destination: i64, per_project: i64, reannounce_after_s: f64) -> Result<usize, StoreError> {
    Ok(db.query(SCHEDULE_SQL, &[&limit, &per_destination, &per_project, &reannounce_after_s, &AnnouncementReason::Retry.as_str()]).await?.len())
}

/// PROCESSING for longer than `$1` s (the worker died or stalled): back to PENDING, token
/// cleared, announced again (reason `reannounce`). Whichever worker finishes first records
/// the outcome (the fence).
const SWEEP_STUCK_SQL: &str = "
WITH stuck AS (
    SELECT id FROM forwards WHERE status = 'PROCESSING' AND claimed_at < now() - make_interval(secs => $1)
    ORDER BY claimed_at LIMIT $2 FOR UPDATE SKIP LOCKED
), reset AS (
    UPDATE forwards f SET status = 'PENDING', claim_token = NULL, claimed_at = NULL, next_retry_at = NULL,
                          last_announced_at = now(), updated_at = now()
    FROM stuck WHERE f.id = stuck.id
    RETURNING f.id, f.project_id, f.destination_id
), announced AS (
    SELECT railhook_announce('f', array_agg(project_id ORDER BY id), array_agg(id ORDER BY id), array_agg(destination_id ORDER BY id), $3) AS n FROM reset
)
SELECT reset.id FROM reset CROSS JOIN announced";

/// PENDING, due, and not announced for `$1` s (the announcement was lost): announced again.
const SWEEP_STRANDED_SQL: &str = "
WITH stranded AS (
    SELECT id FROM forwards
    WHERE status = 'PENDING' AND last_announced_at < now() - make_interval(secs => $1)
      AND (next_retry_at IS NULL OR next_retry_at <= now())
    ORDER BY last_announced_at LIMIT $2 FOR UPDATE SKIP LOCKED
), reset AS (
    UPDATE forwards f SET claim_token = NULL, last_announced_at = now(), updated_at = now()
    FROM stranded WHERE f.id = stranded.id
    RETURNING f.id, f.project_id, f.destination_id
), announced AS (
    SELECT railhook_announce('f', array_agg(project_id ORDER BY id), array_agg(id ORDER BY id), array_agg(destination_id ORDER BY id), $3) AS n FROM reset
)
SELECT reset.id FROM reset CROSS JOIN announced";

/// What [`sweep`] moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ForwardsSwept {
    pub stuck: u64,
    pub stranded: u64,
}

/// The stuck and stranded sweeps of Forwards, one bounded batch each (SKIP LOCKED: safe to
/// run in several processes at once). The 24 h hard cap is `schedule::sweep`'s.
pub async fn sweep(db: &impl GenericClient, processing_timeout_s: f64, stranded_s: f64, limit: i64) -> Result<ForwardsSwept, StoreError> {
    let reason = AnnouncementReason::Reannounce.as_str();
    let stuck = db.query(SWEEP_STUCK_SQL, &[&processing_timeout_s, &limit, &reason]).await?.len() as u64;
    let stranded = db.query(SWEEP_STRANDED_SQL, &[&stranded_s, &limit, &reason]).await?.len() as u64;
    Ok(ForwardsSwept { stuck, stranded })
}

// ---- A person's retry, the failed Forwards, the replay -----------------------------------

/// A Forward as the API shows it after a retry or a replay, and in the failed Forwards.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ForwardSummary {
    #[schema(value_type = String)]
    pub id: ForwardId,
    #[schema(value_type = String)]
    pub incoming_event_id: IncomingEventId,
    #[schema(value_type = String)]
    pub source_id: SourceId,
    #[schema(value_type = String)]
    pub destination_id: DestinationId,
    /// PENDING, PROCESSING, SUCCESS or FAILED.
    #[schema(value_type = String)]
    pub status: DeliveryStatus,
    pub attempt_count: i32,
    pub max_attempts: i32,
    pub next_retry_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    /// When it succeeded or was abandoned.
    pub completed_at: Option<DateTime<Utc>>,
}

/// The columns [`summary_from`] reads, of `forwards f` joined with `destinations d`.
const SUMMARY_COLUMNS: &str = "f.id, f.incoming_event_id, d.source_id, f.destination_id, f.status::text, f.attempt_count, f.max_attempts,
    f.next_retry_at, f.last_error, f.created_at, f.completed_at";

fn summary_from(r: &Row, at: usize) -> Result<ForwardSummary, StoreError> {
    Ok(ForwardSummary {
        id: ForwardId(r.try_get(at)?),
        incoming_event_id: IncomingEventId(r.try_get(at + 1)?),
        source_id: SourceId(r.try_get(at + 2)?),
        destination_id: DestinationId(r.try_get(at + 3)?),
        status: r.try_get::<_, &str>(at + 4)?.parse().map_err(|e: railhook_core::status::UnknownStatus| StoreError::Misconfigured(e.to_string()))?,
        attempt_count: r.try_get(at + 5)?,
        max_attempts: r.try_get(at + 6)?,
        next_retry_at: r.try_get(at + 7)?,
        last_error: r.try_get(at + 8)?,
        created_at: r.try_get(at + 9)?,
        completed_at: r.try_get(at + 10)?,
    })
}

/// The SET list that puts a Forward back on its ladder with `$3` more Attempts: PENDING, due
/// now, no Claim, a fresh 24 h window, announced now (the outbox row goes in with it).
const BACK_ON_THE_LADDER: &str = "status = 'PENDING', max_attempts = attempt_count + $3, next_retry_at = NULL,
    claim_token = NULL, claimed_at = NULL, completed_at = NULL, ladder_started_at = now(), last_announced_at = now(), updated_at = now()";

pub enum ForwardRetryOutcome {
    Retried(Box<ForwardSummary>),
    /// Only a FAILED Forward can be retried; this is its status.
    NotFailed(DeliveryStatus),
    NotFound,
}

/// Retries one FAILED Forward with `extra_attempts` more Attempts (the caller checks the
/// range). The row is locked first, so the answer is never stale.
pub async fn retry(db: &impl GenericClient, project: ProjectId, id: ForwardId, extra_attempts: i32) -> Result<ForwardRetryOutcome, StoreError> {
    let sql = format!(
        "WITH target AS (
            SELECT id, status FROM forwards WHERE id = $1 AND project_id = $2 FOR UPDATE
        ), f AS (
            UPDATE forwards SET {BACK_ON_THE_LADDER} FROM target
            WHERE forwards.id = target.id AND target.status = 'FAILED'
            RETURNING forwards.*
        ), announced AS (
            SELECT railhook_announce('f', array_agg(project_id), array_agg(id), array_agg(destination_id), $4) AS n FROM f
        )
        SELECT target.status::text, f.id IS NOT NULL, {SUMMARY_COLUMNS}
        FROM target CROSS JOIN announced LEFT JOIN f ON true LEFT JOIN destinations d ON d.id = f.destination_id"
    );
    let Some(row) = db.query_opt(&sql, &[&id, &project, &extra_attempts, &AnnouncementReason::ManualRetry.as_str()]).await? else {
        return Ok(ForwardRetryOutcome::NotFound);
    };
    if row.try_get::<_, bool>(1)? {
        return Ok(ForwardRetryOutcome::Retried(Box::new(summary_from(&row, 2)?)));
    }
    let status = row.try_get::<_, &str>(0)?.parse().map_err(|e: railhook_core::status::UnknownStatus| StoreError::Misconfigured(e.to_string()))?;
    Ok(ForwardRetryOutcome::NotFailed(status))
}

/// Which failed Forwards to list or retry.
#[derive(Debug, Clone, Default)]
pub struct FailedForwardFilter {
    pub source_id: Option<SourceId>,
    pub destination_id: Option<DestinationId>,
    /// Inclusive.
    pub completed_after: Option<DateTime<Utc>>,
    /// Exclusive.
    pub completed_before: Option<DateTime<Utc>>,
}

/// `$1` project, `$2`-`$5` the filter: the FAILED Forwards it matches.
const FAILED_WHERE: &str = "f.project_id = $1 AND f.status = 'FAILED'
    AND ($2::uuid IS NULL OR d.source_id = $2) AND ($3::uuid IS NULL OR f.destination_id = $3)
    AND ($4::timestamptz IS NULL OR f.completed_at >= $4) AND ($5::timestamptz IS NULL OR f.completed_at < $5)";

/// The project's failed Forwards in id (= creation) order after `after`.
pub async fn list_failed(db: &impl GenericClient, project: ProjectId, filter: &FailedForwardFilter, after: Option<ForwardId>, limit: i64) -> Result<Vec<ForwardSummary>, StoreError> {
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS} FROM forwards f JOIN destinations d ON d.id = f.destination_id
         WHERE {FAILED_WHERE} AND ($6::uuid IS NULL OR f.id > $6) ORDER BY f.id LIMIT $7"
    );
    let rows = db
        .query(&sql, &[&project, &filter.source_id, &filter.destination_id, &filter.completed_after, &filter.completed_before, &after, &limit])
        .await?;
    rows.iter().map(|r| summary_from(r, 0)).collect()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct SkippedForward {
    #[schema(value_type = String)]
    pub id: ForwardId,
    pub reason: SkipReason,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub status: Option<DeliveryStatus>,
}

#[derive(Debug, Clone, Default)]
pub struct BulkForwardRetry {
    /// In id order.
    pub retried: Vec<ForwardId>,
    /// For a retry by ids: those not retried, in the order given.
    pub skipped: Vec<SkippedForward>,
}

/// Which Forwards a bulk retry is about.
#[derive(Clone, Copy)]
pub enum ForwardSelection<'a> {
    /// These ids (the caller bounds them).
    Ids(&'a [ForwardId]),
    /// The FAILED Forwards that match, at most `limit`.
    Filter(&'a FailedForwardFilter, i64),
}

/// Bulk retry in one statement: the listed ids (`$6`) or those matching the filter, FAILED
/// ones only, at most `$7`, in id order, SKIP LOCKED (two bulk retries never wait on each
/// other nor retry a row twice). `requested` sees the listed ids, to say why one was skipped.
fn bulk_retry_sql() -> String {
    format!(
        "WITH requested AS (
            SELECT id, status FROM forwards WHERE project_id = $1 AND id = ANY($6::uuid[])
        ), picked AS (
            SELECT f.id FROM forwards f JOIN destinations d ON d.id = f.destination_id
            WHERE {FAILED_WHERE} AND ($6::uuid[] IS NULL OR f.id = ANY($6::uuid[]))
            ORDER BY f.id LIMIT $7 FOR UPDATE OF f SKIP LOCKED
        ), retried AS (
            UPDATE forwards f SET {} FROM picked WHERE f.id = picked.id
            RETURNING f.id, f.project_id, f.destination_id
        ), announced AS (
            SELECT railhook_announce('f', array_agg(project_id ORDER BY id), array_agg(id ORDER BY id), array_agg(destination_id ORDER BY id), $9) AS n FROM retried
        )
        SELECT coalesce(r.id, q.id), q.status::text, r.id IS NOT NULL FROM retried r FULL JOIN requested q ON q.id = r.id CROSS JOIN announced",
        BACK_ON_THE_LADDER.replace("$3", "$8")
    )
}

/// Retries FAILED Forwards in bulk with `extra_attempts` more Attempts each.
pub async fn retry_many(db: &impl GenericClient, project: ProjectId, selection: ForwardSelection<'_>, extra_attempts: i32) -> Result<BulkForwardRetry, StoreError> {
    let none = FailedForwardFilter::default();
    let (ids, filter, limit) = match selection {
        ForwardSelection::Ids(ids) => {
            let mut unique: Vec<Uuid> = ids.iter().map(|i| i.0).collect();
            unique.sort();
            unique.dedup();
            let n = unique.len() as i64;
            (Some(unique), &none, n)
        }
        ForwardSelection::Filter(filter, limit) => (None, filter, limit),
    };
    let rows = db
        .query(
            &bulk_retry_sql(),
            &[&project, &filter.source_id, &filter.destination_id, &filter.completed_after, &filter.completed_before, &ids, &limit, &extra_attempts, &AnnouncementReason::ManualRetry.as_str()],
        )
        .await?;
    let mut out = BulkForwardRetry::default();
    let mut seen = std::collections::HashMap::new();
    for r in &rows {
        let id = ForwardId(r.try_get(0)?);
        if r.try_get::<_, bool>(2)? {
            out.retried.push(id);
        } else if let Some(status) = r.try_get::<_, Option<&str>>(1)?.and_then(|s| s.parse::<DeliveryStatus>().ok()) {
            seen.insert(id, status);
        }
    }
    out.retried.sort();
    if let ForwardSelection::Ids(given) = selection {
        out.skipped = skipped(given, &out.retried, &seen);
    }
    Ok(out)
}

fn skipped(given: &[ForwardId], retried: &[ForwardId], seen: &std::collections::HashMap<ForwardId, DeliveryStatus>) -> Vec<SkippedForward> {
    let retried: std::collections::HashSet<ForwardId> = retried.iter().copied().collect();
    let mut reported = std::collections::HashSet::new();
    let mut out = Vec::new();
    for id in given {
        if retried.contains(id) || !reported.insert(*id) {
            continue;
        }
        out.push(match seen.get(id) {
            // FAILED but not retried: another request held it (SKIP LOCKED).
            Some(DeliveryStatus::Failed) => SkippedForward { id: *id, reason: SkipReason::Busy, status: None },
            Some(status) => SkippedForward { id: *id, reason: SkipReason::NotFailed, status: Some(*status) },
            None => SkippedForward { id: *id, reason: SkipReason::NotFound, status: None },
        });
    }
    out
}

pub enum ReplayOutcome {
    /// The new Forwards (one per enabled Destination, or the one asked for), announced.
    Replayed(Vec<ForwardSummary>),
    /// No such Incoming Event in this project.
    NotFound,
    /// The Destination asked for is not one of the Incoming Event's Source.
    DestinationNotFound,
    /// The Destination asked for is disabled.
    DestinationDisabled,
}

/// A replay: new Forwards of a stored Incoming Event (new ids, fresh ladders, the incoming
/// ladder's constants), each announced (reason `replay`), in one statement. `$3`: one
/// Destination (enabled), or NULL for every enabled Destination of the Source.
fn replay_sql() -> String {
    format!(
        "WITH ev AS (
            SELECT id, project_id, source_id, traceparent, tracestate FROM incoming_events WHERE id = $1 AND project_id = $2
        ), fw AS (
            INSERT INTO forwards (id, project_id, incoming_event_id, destination_id, max_attempts, retry_delays, timeout_seconds)
            SELECT railhook_uuid_v7(), ev.project_id, ev.id, d.id, $4, $5, $6
            FROM ev JOIN destinations d ON d.source_id = ev.source_id AND d.enabled AND ($3::uuid IS NULL OR d.id = $3)
            RETURNING *
        ), ob AS (
            -- In the Incoming Event's trace (issue 33): passed here, since the announcement's
            -- own lookup cannot see the Forwards this statement makes.
            SELECT railhook_announce('f', array_agg(fw.project_id ORDER BY fw.id), array_agg(fw.id ORDER BY fw.id), array_agg(fw.destination_id ORDER BY fw.id), $7,
                                     NULL, coalesce(array_agg(ev.traceparent ORDER BY fw.id), '{{}}'), coalesce(array_agg(ev.tracestate ORDER BY fw.id), '{{}}')) AS n
            FROM fw CROSS JOIN ev
        )
        SELECT (SELECT d.enabled FROM destinations d WHERE d.id = $3 AND d.source_id = ev.source_id), f.id IS NOT NULL, {}
        FROM ev CROSS JOIN ob LEFT JOIN fw f ON true LEFT JOIN destinations d ON d.id = f.destination_id
        ORDER BY f.id",
        SUMMARY_COLUMNS
    )
}

/// Replays the Incoming Event to every enabled Destination of its Source, or to one.
pub async fn replay(db: &impl GenericClient, project: ProjectId, id: IncomingEventId, destination: Option<DestinationId>) -> Result<ReplayOutcome, StoreError> {
    let delays = INCOMING_DELAYS.to_vec();
    let rows = db
        .query(
            &replay_sql(),
            &[&id, &project, &destination, &INCOMING_MAX_ATTEMPTS, &delays, &FORWARD_TIMEOUT_SECONDS, &AnnouncementReason::Replay.as_str()],
        )
        .await?;
    let Some(first) = rows.first() else { return Ok(ReplayOutcome::NotFound) };
    if destination.is_some() {
        match first.try_get::<_, Option<bool>>(0)? {
            None => return Ok(ReplayOutcome::DestinationNotFound),
            Some(false) => return Ok(ReplayOutcome::DestinationDisabled),
            Some(true) => {}
        }
    }
    let mut forwards = Vec::with_capacity(rows.len());
    for r in &rows {
        if r.try_get::<_, bool>(1)? {
            forwards.push(summary_from(r, 2)?);
        }
    }
    Ok(ReplayOutcome::Replayed(forwards))
}
