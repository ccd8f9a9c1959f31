//! The claim (DESIGN.md 6.1) with its admission: `railhook_claim_batch` in `rules.sql`
//! decides, for many Deliveries in one statement and one commit, each claim, Deferral or
//! nothing, under the projects' and endpoints' advisory locks
//! (`crate::locks::PROJECT_CLAIM_SEED`, `ENDPOINT_CLAIM_SEED`).

use chrono::{DateTime, Utc};
use railhook_core::{ClaimToken, DeferralReason, DeliveryId, EndpointId, EventId, ProjectId};

use super::Prepared;

/// Everything one Attempt needs, returned by the claim itself (one round trip).
#[derive(Debug, Clone)]
pub struct Claimed {
    pub id: DeliveryId,
    pub project_id: ProjectId,
    pub event_id: EventId,
    pub endpoint_id: EndpointId,
    pub token: ClaimToken,
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
    /// When the Ordering Buffer first parked it (ordered Deliveries only).
    pub parked_at: Option<DateTime<Utc>>,
    /// Claimed without its predecessor: the ordering gap timeout was over.
    pub gap_timeout: bool,
    /// Claimed behind its predecessor, which the claiming worker holds (`p_mine`): the
    /// worker's Ordering Buffer sends it only once the predecessor's Attempt ended in a
    /// final verdict, and otherwise parks it ([`park_held`]).
    pub behind: bool,
}

/// The Attempt's details, read once the claim succeeded (by id and the new token):
/// `railhook_claimed` in `rules.sql`, a function so that its plan is kept (issue 30).
const CLAIMED_SQL: &str = "SELECT * FROM railhook_claimed($1::uuid[], $2::uuid[])";

/// The claim statement. Without `synchronous_commit`, its implicit transaction commits
/// with `synchronous_commit = off` (`set_config(..., true)` is local to that transaction and
/// read at its commit): the claim's locks are released without waiting for the WAL flush.
/// `railhook_claim_batch` answers one row per Delivery, so the filter runs for every batch
/// that wrote anything, after the function ran to its end (a PL/pgSQL set-returning
/// function fills its whole result first). Except a batch that handed out Sequence Numbers
/// (`railhook.claim_numbered`, migration 0035): it waits for its flush, so a number a
/// receiver saw is never handed out again after a Postgres crash.
fn claim_sql(synchronous_commit: bool) -> &'static str {
    if synchronous_commit {
        "SELECT idx, outcome FROM railhook_claim_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
    } else {
        "SELECT idx, outcome FROM railhook_claim_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
         WHERE set_config('synchronous_commit', \
                          CASE WHEN current_setting('railhook.claim_numbered', true) = 'on' THEN 'on' ELSE 'off' END, true) IS NOT NULL"
    }
}

/// Limits the claim enforces (see `railhook_claim_batch` in `rules.sql`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub endpoint_concurrency: i32,
    pub project_concurrency: i32,
    pub project_rate: i32,
    pub circuit_cooldown_s: f64,
    pub probe_timeout_s: f64,
    /// The ordering gap timeout: how long a parked Delivery waits for its predecessor.
    pub ordering_gap_s: f64,
    /// The claim waits for its WAL flush (`worker.claim_synchronous_commit`); `false`: its
    /// transaction commits with `synchronous_commit = off`.
    pub synchronous_commit: bool,
}

impl Limits {
    pub fn from_config(w: &railhook_config::WorkerConfig) -> Limits {
        Limits {
            endpoint_concurrency: w.endpoint_concurrency,
            project_concurrency: w.project_concurrency,
            project_rate: w.project_rate_limit_per_second,
            circuit_cooldown_s: w.circuit_cooldown_seconds as f64,
            probe_timeout_s: w.processing_timeout_seconds as f64,
            ordering_gap_s: w.ordering_gap_timeout_seconds as f64,
            synchronous_commit: w.claim_synchronous_commit,
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
    Deferred(DeferralReason),
    /// (Waiting mode) an ordered Delivery whose predecessor is due and not claimed yet: its
    /// own hint is about to claim it. Nothing was written; claimed again shortly, it goes
    /// behind the predecessor.
    Behind,
    /// A claim in the waiting mode found this limit taken: nothing was written; the hint
    /// may claim again when a slot frees or the rate window opens.
    Busy(DeferralReason),
}

/// One claim to make: the Delivery, the token this Attempt will hold, and the hint's token
/// (the scheduler's on the retry path, `None` for first announcements, which claim only
/// untokened rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimRequest {
    pub delivery: DeliveryId,
    pub token: ClaimToken,
    pub hint: Option<ClaimToken>,
    /// The waiting mode: a concurrency or rate limit answers [`ClaimResult::Busy`] instead of
    /// a Deferral (the worker's per-Endpoint queue waits it out), and an ordered Delivery
    /// whose predecessor is due and unclaimed [`ClaimResult::Behind`].
    pub wait: bool,
    /// When the hint's announcement was committed (the relay's `commit_time_us` header), if
    /// known: tells a retry's hint that overtook the scheduler's commit ([`ClaimResult::Missing`])
    /// from a stale one ([`ClaimResult::Nothing`]).
    pub announced_at: Option<DateTime<Utc>>,
    /// Where the hint came from (Kafka partition and offset), if anywhere: a batch is decided
    /// in this order, so one Endpoint's ordered Deliveries go predecessor first.
    pub position: Option<(i32, i64)>,
}

/// 6.1 with the admission checks, for many Deliveries at once: `railhook_claim_batch`
/// (`rules.sql`) takes the projects' and endpoints' advisory locks once for the batch,
/// checks each Delivery's circuit, concurrency and rates in order, and claims it (`WHERE
/// status = 'PENDING' AND due AND claim_token IS NOT DISTINCT FROM hint`), defers it, or
/// finds nothing. The rows the claims won are read by a second statement sent in the same
/// round trip (pipelined: it runs after the first one committed). Results are in the order
/// of `requests`. Every PROCESSING row counts against the concurrency limits; see
/// [`claim_batch_finishing`].
pub async fn claim_batch<C: Prepared>(db: &C, requests: &[ClaimRequest], limits: &Limits) -> Result<Vec<ClaimResult>, tokio_postgres::Error> {
    claim_batch_finishing(db, requests, limits, &[], &[]).await
}

/// Readies one connection for the delivery path: prepares the claim, its read and the
/// finalise, and runs the claim once for a Delivery that does not exist (it answers
/// [`ClaimResult::Missing`] and writes nothing), so that this backend has compiled the
/// claim's PL/pgSQL functions and planned their statements. A worker does this on its
/// connections as it starts (`railhook_worker`): otherwise the first burst after a start pays
/// it, in its first claims, on every connection at once.
pub async fn warm<C: Prepared>(db: &C, limits: &Limits) -> Result<(), tokio_postgres::Error> {
    db.prepare_cached(super::finalise::FINALISE_SQL).await?;
    let probe = ClaimRequest { delivery: DeliveryId::new(), token: ClaimToken::new(), hint: None, wait: true, announced_at: None, position: None };
    claim_batch(db, &[probe], limits).await?;
    Ok(())
}

/// [`claim_batch`] for a worker whose Claims in `finishing` have had their HTTP request end
/// and wait for their finalise's commit: those PROCESSING rows do not count against the
/// concurrency limits (they no longer hold a receiver's connection). Only the caller's own
/// Claims whose request is over may be named: the limits then bound requests in flight across
/// every worker (`rules.sql`, `p_finishing`). `mine`: the caller's Claims of ordered
/// Deliveries, behind which their successors may be claimed ([`Claimed::behind`]).
pub async fn claim_batch_finishing<C: Prepared>(
    db: &C,
    requests: &[ClaimRequest],
    limits: &Limits,
    finishing: &[ClaimToken],
    mine: &[ClaimToken],
) -> Result<Vec<ClaimResult>, tokio_postgres::Error> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    // In the order of their hints' Kafka positions (one Endpoint's hints are on one partition,
    // in commit order), so that an Endpoint's ordered Deliveries are decided predecessor first
    // whatever order their tasks reached the batch in; the rest after, by Delivery id. The
    // answers go back in the order of `requests`.
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&i| (requests[i].position.is_none(), requests[i].position, requests[i].delivery.0));
    let requests: Vec<ClaimRequest> = order.iter().map(|&i| requests[i]).collect();
    let claim = db.prepare_cached(claim_sql(limits.synchronous_commit)).await?;
    let read = db.prepare_cached(CLAIMED_SQL).await?;
    let deliveries: Vec<DeliveryId> = requests.iter().map(|r| r.delivery).collect();
    let tokens: Vec<ClaimToken> = requests.iter().map(|r| r.token).collect();
    let hints: Vec<Option<ClaimToken>> = requests.iter().map(|r| r.hint).collect();
    let waits: Vec<bool> = requests.iter().map(|r| r.wait).collect();
    let announced: Vec<Option<DateTime<Utc>>> = requests.iter().map(|r| r.announced_at).collect();
    let claim_params: [&(dyn tokio_postgres::types::ToSql + Sync); 13] = [
        &deliveries, &tokens, &hints, &limits.endpoint_concurrency, &limits.project_concurrency, &limits.project_rate,
        &limits.circuit_cooldown_s, &limits.probe_timeout_s, &waits, &limits.ordering_gap_s, &finishing, &announced, &mine,
    ];
    let read_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&deliveries, &tokens];
    // Both sent before either answer arrives (tokio-postgres pipelines queries polled
    // together, in the order polled); each is its own implicit transaction, so the read
    // runs after the claim committed.
    let (outcomes, rows) = tokio::join!(db.query(&claim, &claim_params), db.query(&read, &read_params));
    let (outcomes, rows) = (outcomes?, rows?);
    let mut claimed: std::collections::HashMap<ClaimToken, Claimed> = rows.iter().map(|r| Ok((r.try_get::<_, ClaimToken>(17)?, claimed_row(r)?))).collect::<Result<_, tokio_postgres::Error>>()?;
    let mut results: Vec<ClaimResult> = vec![ClaimResult::Nothing; requests.len()];
    for row in outcomes {
        let (idx, outcome): (i32, String) = (row.try_get(0)?, row.try_get(1)?);
        let Some(i) = usize::try_from(idx).ok().and_then(|i| i.checked_sub(1)).filter(|i| *i < requests.len()) else { continue };
        results[i] = match outcome.as_str() {
            "none" => ClaimResult::Nothing,
            "missing" => ClaimResult::Missing,
            "busy:ordering" => ClaimResult::Behind,
            // Claimed and read back; a row gone between the two statements (swept) claims
            // nothing.
            "claimed" | "claimed:gap" | "claimed:behind" => match claimed.remove(&requests[i].token) {
                Some(mut c) => {
                    c.gap_timeout = outcome == "claimed:gap";
                    c.behind = outcome == "claimed:behind";
                    ClaimResult::Claimed(Box::new(c))
                }
                None => ClaimResult::Nothing,
            },
            other => match other.strip_prefix("busy:").unwrap_or(other).parse::<DeferralReason>() {
                Ok(reason) if other.starts_with("busy:") => ClaimResult::Busy(reason),
                Ok(reason) => ClaimResult::Deferred(reason),
                Err(e) => {
                    // rules.sql and DeferralReason disagree: a bug, not a Deferral to count.
                    tracing::error!(error = %e, "claim: unknown outcome; the Delivery stays as it is");
                    ClaimResult::Nothing
                }
            },
        };
    }
    // Back in the order of the caller's requests.
    let mut out = vec![ClaimResult::Nothing; results.len()];
    for (result, i) in results.into_iter().zip(order) {
        out[i] = result;
    }
    Ok(out)
}

fn claimed_row(r: &tokio_postgres::Row) -> Result<Claimed, tokio_postgres::Error> {
    Ok(Claimed {
        id: r.try_get(0)?,
        project_id: r.try_get(1)?,
        event_id: r.try_get(2)?,
        endpoint_id: r.try_get(3)?,
        token: r.try_get(17)?,
        attempt_count: r.try_get(4)?,
        max_attempts: r.try_get(5)?,
        retry_delays: r.try_get(6)?,
        timeout_seconds: r.try_get(7)?,
        sequence_number: r.try_get(8)?,
        ladder_started_at: r.try_get(9)?,
        event_type: r.try_get(10)?,
        event_created_at: r.try_get(11)?,
        payload: r.try_get(12)?,
        url: r.try_get(13)?,
        enabled: r.try_get(14)?,
        headers: r.try_get(15)?,
        secrets: r.try_get(16)?,
        parked_at: r.try_get(18)?,
        gap_timeout: false,
        behind: false,
    })
}

/// Gives back a Delivery the worker's Ordering Buffer held behind a predecessor that did not
/// end in a final verdict: PENDING and parked, as a claim would have parked it, no Attempt
/// spent; only while `token` holds it (`railhook_park_held`). Whether it wrote.
pub async fn park_held<C: Prepared>(db: &C, delivery: DeliveryId, token: ClaimToken, ordering_gap_s: f64) -> Result<bool, tokio_postgres::Error> {
    let statement = db.prepare_cached("SELECT railhook_park_held($1, $2, $3)").await?;
    db.query_one(&statement, &[&delivery, &token, &ordering_gap_s]).await?.try_get(0)
}
