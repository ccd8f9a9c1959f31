//! The finalise (DESIGN.md 6.2): the Attempt on record, the Delivery's next state and its
//! successor only while the Claim holds, and the outcome in the endpoint's circuit
//! (`railhook_finalise_batch` and `railhook_circuit_record_many` in `rules.sql`); and the release
//! of a Claim that sent nothing.

use chrono::{DateTime, Utc};
use railhook_core::{AttemptId, CircuitChange, ClaimToken, DeliveryId, DeliveryStatus, EndpointId, ProjectId};

use super::Prepared;

use super::claim::Claimed;

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

impl Next {
    /// The Delivery's status after the finalise.
    pub fn status(&self) -> DeliveryStatus {
        match self {
            Next::Success => DeliveryStatus::Success,
            Next::RetryAt(_) => DeliveryStatus::Pending,
            Next::Failed => DeliveryStatus::Failed,
        }
    }
}

/// One Attempt as recorded (a row of `attempts`, migrations 0005 and 0017).
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    /// The worker's clock when the request started; also the partition key.
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    pub status_code: Option<i32>,
    /// The error class (`success`, `http_status`, `timeout`, `connect`, ...).
    pub result: String,
    pub error_message: Option<String>,
    /// The request's headers as sent, a JSON object of lower-case name to value, credential
    /// values redacted (`railhook_worker::http::recorded_headers`); `null` when unknown.
    pub request_headers: serde_json::Value,
    pub response_headers: serde_json::Value,
    /// At most the worker's body cap; Postgres compresses it (lz4) when the row is large.
    pub response_body: String,
    pub response_truncated: bool,
}

/// What the finalise reports: whether it held the Claim, and the circuit's state change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finalised {
    pub wrote: bool,
    pub circuit: Option<CircuitChange>,
    /// The parked successor this finalise released (ordered Deliveries): the caller claims
    /// it at once.
    pub released: Option<DeliveryId>,
}

/// One Attempt's finalise: the Claim it was made under, what to write on the Delivery, the
/// Attempt itself, and `healthy`: whether the outcome counts as a success for the endpoint's
/// circuit (it answered, whatever the status, unless the answer asks for a retry).
#[derive(Debug, Clone)]
pub struct FinaliseRequest {
    pub delivery: DeliveryId,
    pub token: ClaimToken,
    pub project_id: ProjectId,
    pub endpoint_id: EndpointId,
    /// The Attempt's id, fixed here so that a finalise made again (after a lost reply) does
    /// not record the Attempt twice.
    pub attempt_id: AttemptId,
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
            attempt_id: AttemptId::new(),
            number: claimed.attempt_count + 1,
            next,
            last_error,
            attempt,
            healthy,
        }
    }
}

/// The finalise, one statement (`rules.sql`).
pub(crate) const FINALISE_SQL: &str =
    "SELECT idx, wrote, circuit, released FROM railhook_finalise_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22)";

/// 6.2's finalise for many Attempts in one statement and one commit
/// (`railhook_finalise_batch`, `rules.sql`): each Attempt is inserted whatever happens to
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
    let deliveries: Vec<DeliveryId> = sorted.iter().map(|r| r.delivery).collect();
    let tokens: Vec<ClaimToken> = sorted.iter().map(|r| r.token).collect();
    let projects: Vec<ProjectId> = sorted.iter().map(|r| r.project_id).collect();
    let endpoints: Vec<EndpointId> = sorted.iter().map(|r| r.endpoint_id).collect();
    let attempt_ids: Vec<AttemptId> = sorted.iter().map(|r| r.attempt_id).collect();
    let statuses: Vec<&str> = sorted.iter().map(|r| r.next.status().as_sql()).collect();
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
    let request_headers: Vec<&serde_json::Value> = sorted.iter().map(|r| &r.attempt.request_headers).collect();
    let healthy: Vec<bool> = sorted.iter().map(|r| r.healthy).collect();
    let statement = db.prepare_cached(FINALISE_SQL).await?;
    let rows = db
        .query(
            &statement,
            &[
                &deliveries, &tokens, &statuses, &retry_at, &last_errors, &attempt_ids, &projects, &numbers, &started, &durations,
                &codes, &results, &errors, &headers, &bodies, &truncated, &request_headers, &endpoints, &healthy,
                &circuit.window_s, &circuit.min_volume, &circuit.ratio,
            ],
        )
        .await?;
    let mut out = vec![Finalised { wrote: false, circuit: None, released: None }; requests.len()];
    for row in rows {
        let Some(at) = usize::try_from(row.try_get::<_, i32>(0)?).ok().and_then(|i| i.checked_sub(1)).and_then(|i| order.get(i)) else { continue };
        let circuit = row.try_get::<_, Option<&str>>(2)?.and_then(|c| match c.parse::<CircuitChange>() {
            Ok(change) => Some(change),
            Err(e) => {
                tracing::error!(error = %e, "finalise: unknown circuit change");
                None
            }
        });
        out[*at] = Finalised { wrote: row.try_get(1)?, circuit, released: row.try_get(3)? };
    }
    Ok(out)
}

/// A Deferral, or a Claim given back at shutdown: back to PENDING, due at `at`, no Attempt
/// spent, and the Claim's row in `delivery_claims` gone with it. Conditional on the Claim
/// like every other write.
pub async fn release<C: Prepared>(db: &C, delivery: DeliveryId, token: ClaimToken, at: Option<DateTime<Utc>>) -> Result<bool, tokio_postgres::Error> {
    let release = db
        .prepare_cached(
            "WITH released AS (
                 UPDATE deliveries SET status = 'PENDING', claim_token = NULL, claimed_at = NULL, next_retry_at = $3, updated_at = now()
                 WHERE id = $1 AND claim_token = $2 AND status = 'PROCESSING'
                 RETURNING id, project_id, endpoint_id
             ), unclaimed AS (
                 DELETE FROM delivery_claims c USING released r
                 WHERE c.project_id = r.project_id AND c.endpoint_id = r.endpoint_id AND c.delivery_id = r.id
             )
             SELECT count(*) FROM released",
        )
        .await?;
    let n: i64 = db.query_one(&release, &[&delivery, &token, &at]).await?.try_get(0)?;
    Ok(n == 1)
}
