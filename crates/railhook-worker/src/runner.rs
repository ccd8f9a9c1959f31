//! The Attempt Runner: one claimed Delivery, one HTTP request, one finalise.
//!
//! Invariants (DESIGN.md 6.2), each covered by a test in `tests/worker.rs`:
//! 1. No database or Kafka work inside the HTTP request's future: the request is built from
//!    what the claim returned, sent, and only its finished outcome is written. A slow write
//!    can never turn a delivered webhook into a failed one.
//! 2. A successor (the retry) is queued only by a finalise that reports it wrote, i.e. this
//!    worker still held the Claim: the successor is part of the fenced UPDATE itself.
//! 3. Once the status line of a 2xx arrived the Attempt is delivered, even if reading the
//!    body fails or stalls (`http::Sender` reads bodies with their own short deadline).
//! 4. Deferrals release the Claim and spend no Attempt (`store::release`).
//! 5. Response bodies are read up to `http::BODY_CAP` and stored truncated.
//! 6. Redirects are not followed: a 3xx goes to Failed Messages.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use railhook_config::Config;
use railhook_core::signing::EndpointSecret;
use railhook_core::{DeliveryId, EventId};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::http::{self, OutgoingRequest, Verdict};
use crate::ladder::{self, Step};
use crate::metrics::WorkerMetrics;
use crate::store::{self, AttemptRecord, Claimed, Next};

/// How an announcement ended, for the metrics and the tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ran {
    /// The hint claimed nothing: already done, not yet due, or owned by someone else.
    NothingClaimed,
    Delivered,
    Retrying,
    Failed,
    Deferred,
    /// The finalise found the Claim gone (swept): the Attempt is on record, nothing else.
    FenceLost,
    /// Shutdown cut the Attempt short; the Claim was released.
    Released,
}

pub struct Runner {
    pub config: Arc<Config>,
    pub pool: railhook_store::Pool,
    pub sender: http::Sender,
    pub metrics: WorkerMetrics,
    pub claimer: Claimer,
    pub finaliser: Finaliser,
}

/// Waits before claiming again a Delivery the claim did not see (`ClaimResult::Missing`):
/// about 4 s in all, far beyond the moment between a commit's WAL flush and its visibility.
const UNSEEN_RETRY_MS: [u64; 8] = [2, 5, 10, 25, 50, 200, 700, 3000];
/// Claims that fail (Postgres unreachable) are made again this many times, 0.2 s to 5 s
/// apart: about five minutes.
const CLAIM_FAILURE_RETRIES: u32 = 64;

/// Claims, or finalises, at most this many Deliveries per round trip.
pub const BATCH: usize = 64;

type Reply<A> = tokio::sync::oneshot::Sender<Result<A, RunError>>;

/// Batches one kind of statement: one task takes the first waiting request and every other
/// one already waiting (up to [`BATCH`]), runs them in one call of `run` (one round trip and
/// one commit), and answers each. Nothing waits for a batch to fill: alone, a request goes
/// at once; under load, the requests that queued while a batch ran form the next one. If
/// Postgres refused the batch's statement (one request may be the cause: a foreign key, a
/// deadlock), each request is made again alone, so one bad request fails only itself. Any
/// other failure (no connection) goes to every request of the batch; their callers retry.
pub struct Batcher<Q, A> {
    tx: tokio::sync::mpsc::Sender<(Q, Reply<A>)>,
    what: &'static str,
}

impl<Q, A> Clone for Batcher<Q, A> {
    fn clone(&self) -> Self {
        Batcher { tx: self.tx.clone(), what: self.what }
    }
}

impl<Q: Clone + Send + Sync + 'static, A: Send + 'static> Batcher<Q, A> {
    /// Starts the batching task; it ends when every clone of the Batcher is dropped.
    /// `capacity` bounds the requests waiting (the consumer's `max_in_flight`). `run` answers
    /// a batch in the order of its requests.
    pub fn start<F, Fut>(what: &'static str, capacity: usize, run: F) -> Batcher<Q, A>
    where
        F: Fn(Arc<[Q]>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<Vec<A>, RunError>> + Send,
    {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<(Q, Reply<A>)>(capacity.max(1));
        tokio::spawn(async move {
            let mut batch = Vec::with_capacity(BATCH);
            while rx.recv_many(&mut batch, BATCH).await > 0 {
                let (requests, replies): (Vec<Q>, Vec<Reply<A>>) = batch.drain(..).unzip();
                let requests: Arc<[Q]> = requests.into();
                match run(requests.clone()).await {
                    Ok(answers) => {
                        for (reply, answer) in replies.into_iter().zip(answers) {
                            let _ = reply.send(Ok(answer));
                        }
                    }
                    Err(e) if replies.len() > 1 && e.is_statement_error() => {
                        tracing::warn!(error = %e, requests = replies.len(), what, "batch refused; making each request alone");
                        for (request, reply) in requests.iter().zip(replies) {
                            let alone = run(Arc::from([request.clone()])).await.and_then(|mut a| a.pop().ok_or_else(|| RunError::Batch("no answer".into())));
                            let _ = reply.send(alone);
                        }
                    }
                    Err(e) => {
                        let message = e.to_string();
                        for reply in replies {
                            let _ = reply.send(Err(RunError::Batch(message.clone())));
                        }
                    }
                }
            }
        });
        Batcher { tx, what }
    }

    pub async fn call(&self, request: Q) -> Result<A, RunError> {
        let stopped = || RunError::Batch(format!("the {} batcher stopped", self.what));
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.tx.send((request, reply)).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// Claims in batches. Claims of one project are serialised by its advisory lock until
/// commit, so one lock and one commit per batch instead of per Delivery is what lets a
/// project go past a few hundred claims per second.
pub type Claimer = Batcher<store::ClaimRequest, store::ClaimResult>;

/// Finalises in batches: one statement and one WAL flush for many Attempts.
pub type Finaliser = Batcher<store::FinaliseRequest, store::Finalised>;

pub fn claimer(pool: railhook_store::Pool, limits: store::Limits, metrics: WorkerMetrics, capacity: usize) -> Claimer {
    Batcher::start("claim", capacity, move |requests: Arc<[store::ClaimRequest]>| {
        let (pool, metrics) = (pool.clone(), metrics.clone());
        async move {
            metrics.claim_batch_size.observe(requests.len() as f64);
            let client = pool.get().await.map_err(|e| RunError::Pool(e.to_string()))?;
            Ok(store::claim_batch(&client, &requests, &limits).await?)
        }
    })
}

pub fn finaliser(pool: railhook_store::Pool, circuit: store::Circuit, metrics: WorkerMetrics, capacity: usize) -> Finaliser {
    Batcher::start("finalise", capacity, move |requests: Arc<[store::FinaliseRequest]>| {
        let (pool, metrics) = (pool.clone(), metrics.clone());
        async move {
            metrics.finalise_batch_size.observe(requests.len() as f64);
            let client = pool.get().await.map_err(|e| RunError::Pool(e.to_string()))?;
            Ok(store::finalise_batch(&client, &requests, &circuit).await?)
        }
    })
}

/// The JSON body every receiver gets: the Event, Standard Webhooks style.
pub fn body(claimed: &Claimed) -> String {
    format!(
        r#"{{"id":{},"type":{},"timestamp":{},"data":{}}}"#,
        serde_json::Value::String(EventId(claimed.event_id).to_string()),
        serde_json::Value::String(claimed.event_type.clone()),
        serde_json::Value::String(claimed.event_created_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        claimed.payload
    )
}

impl Runner {
    /// Claims `delivery` (with the scheduler's `hint_token` on the retry path), then runs the
    /// Attempt. `claimed_tx` is told once the claim step is over (the consumer commits the
    /// message's offset then, not after the HTTP request: a slow endpoint holds no offsets).
    pub async fn run(&self, delivery: Uuid, hint_token: Option<Uuid>, claimed_tx: impl FnOnce(), hard_stop: CancellationToken) -> Result<Ran, RunError> {
        let token = Uuid::new_v4();
        let request = store::ClaimRequest { delivery, token, hint: hint_token };
        let mut unseen_waits = UNSEEN_RETRY_MS.iter();
        let mut failures = 0u32;
        let claimed = loop {
            let wait = match self.claimer.call(request).await {
                // The hint overtook its Delivery's commit: claim again shortly. After the
                // last wait the row is taken to be gone (deleted with its endpoint).
                Ok(store::ClaimResult::Missing) => match unseen_waits.next() {
                    Some(ms) => {
                        self.metrics.claims_unseen.inc();
                        Duration::from_millis(*ms)
                    }
                    None => break Ok(store::ClaimResult::Nothing),
                },
                // Postgres unreachable or restarting: claim again, backing off, for about
                // five minutes; the permit held meanwhile is the backpressure on the consumer.
                Err(e) if failures < CLAIM_FAILURE_RETRIES => {
                    failures += 1;
                    let wait = Duration::from_millis(100u64 << failures.min(6)).min(Duration::from_secs(5));
                    tracing::warn!(error = %e, delivery = %railhook_core::DeliveryId(delivery), ?wait, "claim failed; claiming again");
                    wait
                }
                other => break other,
            };
            // Both waits hold the hint's offset: a crash meanwhile redelivers the hint, and so
            // does a shutdown (the offset stays uncommitted).
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = hard_stop.cancelled() => return Ok(Ran::NothingClaimed),
            }
        };
        // Also after a claim that kept failing: the hint is then dropped and the sweeps
        // recover the Delivery; holding its offset longer would stall the partition's commits.
        claimed_tx();
        let claimed = claimed?;
        let claimed = match claimed {
            store::ClaimResult::Claimed(c) => *c,
            store::ClaimResult::Nothing | store::ClaimResult::Missing => {
                self.metrics.claims_lost.inc();
                return Ok(Ran::NothingClaimed);
            }
            store::ClaimResult::Deferred(reason) => {
                // Invariant 4: released before any Attempt (the row never left PENDING).
                self.metrics.deferrals.with_label_values(&[reason.as_str()]).inc();
                return Ok(Ran::Deferred);
            }
        };
        self.metrics.claims_won.inc();
        if !claimed.enabled {
            // A disabled endpoint: wait, spending no Attempt.
            self.defer(&claimed, Duration::from_secs(60), "endpoint_disabled").await?;
            return Ok(Ran::Deferred);
        }

        let request = self.request(&claimed);
        // Invariant 1: nothing but the HTTP request in this future.
        let outcome = tokio::select! {
            outcome = self.sender.send(request) => outcome,
            _ = hard_stop.cancelled() => {
                let client = self.pool.get().await.map_err(|e| RunError::Pool(e.to_string()))?;
                store::release(&client, claimed.id, claimed.token, None).await?;
                return Ok(Ran::Released);
            }
        };
        let verdict = http::classify(&outcome);
        let now = Utc::now();
        let (next, ran) = match &verdict {
            Verdict::Delivered => (Next::Success, Ran::Delivered),
            Verdict::Fail => (Next::Failed, Ran::Failed),
            Verdict::Retry { retry_after } => {
                let step = ladder::next_step(
                    now,
                    claimed.attempt_count + 1,
                    claimed.max_attempts,
                    &claimed.retry_delays,
                    ladder::jitter(),
                    *retry_after,
                    Duration::from_secs(self.config.worker.retry_after_max_seconds),
                    claimed.ladder_started_at,
                    Duration::from_secs(self.config.worker.outgoing_max_age_seconds),
                );
                match step {
                    Step::RetryAt(at) => (Next::RetryAt(at), Ran::Retrying),
                    Step::GiveUp(_) => (Next::Failed, Ran::Failed),
                }
            }
        };
        let record = AttemptRecord {
            started_at: outcome.started_at,
            duration_ms: outcome.duration.as_millis().min(i32::MAX as u128) as i32,
            status_code: outcome.status_code.map(i32::from),
            result: outcome.result.as_str().to_string(),
            error_message: outcome.error_message.clone(),
            response_headers: outcome.response_headers.clone(),
            response_body: outcome.response_body.clone(),
            response_truncated: outcome.response_truncated,
        };
        let last_error = match &verdict {
            Verdict::Delivered => None,
            _ => Some(match (outcome.status_code, &outcome.error_message) {
                (Some(code), _) => format!("HTTP {code}"),
                (None, Some(e)) => format!("{}: {e}", outcome.result.as_str()),
                (None, None) => outcome.result.as_str().to_string(),
            }),
        };
        self.metrics.attempt(&outcome);
        // The circuit counts an answer that asks for a retry as a failure; any other answer,
        // even a 4xx, shows the endpoint is up.
        let healthy = !matches!(verdict, Verdict::Retry { .. });
        let finalised = self.finalise(store::FinaliseRequest::new(&claimed, next, last_error, record, healthy)).await?;
        if let Some(change) = &finalised.circuit {
            tracing::info!(endpoint = %railhook_core::EndpointId(claimed.endpoint_id), change, "circuit state changed");
            self.metrics.circuit_changes.with_label_values(&[change.as_str()]).inc();
        }
        if !finalised.wrote {
            // Invariant 2: no successor without the Claim.
            self.metrics.fence_lost.inc();
            return Ok(Ran::FenceLost);
        }
        if ran == Ran::Delivered {
            let latency = (Utc::now() - claimed.event_created_at).to_std().unwrap_or_default();
            self.metrics.delivery_latency.observe(latency.as_secs_f64());
        }
        Ok(ran)
    }

    fn request(&self, claimed: &Claimed) -> OutgoingRequest {
        let body = body(claimed);
        let secrets: Vec<EndpointSecret> = claimed.secrets.iter().filter_map(|s| EndpointSecret::parse(s).ok()).collect();
        let extra: BTreeMap<String, String> = claimed
            .headers
            .as_object()
            .map(|o| o.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string()))).collect())
            .unwrap_or_default();
        let headers = http::webhook_headers(
            &DeliveryId(claimed.id).to_string(),
            &EventId(claimed.event_id).to_string(),
            Utc::now().timestamp(),
            body.as_bytes(),
            &secrets,
            claimed.sequence_number,
            &extra,
        );
        OutgoingRequest {
            url: claimed.url.clone(),
            headers,
            body: bytes::Bytes::from(body),
            timeout: Duration::from_secs(claimed.timeout_seconds.max(1) as u64),
        }
    }

    /// The finalise, retried a few times on connection trouble: giving up leaves the Delivery
    /// PROCESSING for the sweep (duplicate window 8 then applies).
    async fn finalise(&self, request: store::FinaliseRequest) -> Result<store::Finalised, RunError> {
        let mut wait = Duration::from_millis(100);
        for attempt in 0.. {
            match self.finaliser.call(request.clone()).await {
                Ok(finalised) => return Ok(finalised),
                Err(e) if attempt < 5 => {
                    tracing::warn!(error = %e, delivery = %DeliveryId(request.delivery), "finalise failed, retrying");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                Err(e) => return Err(e),
            }
        }
        unreachable!("the loop returns")
    }

    async fn defer(&self, claimed: &Claimed, wait: Duration, reason: &'static str) -> Result<(), RunError> {
        let at = Utc::now() + chrono::Duration::from_std(wait).unwrap_or_default();
        let client = self.pool.get().await.map_err(|e| RunError::Pool(e.to_string()))?;
        store::release(&client, claimed.id, claimed.token, Some(at)).await?;
        self.metrics.deferrals.with_label_values(&[reason]).inc();
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("Postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("connection pool: {0}")]
    Pool(String),
    /// The batch this claim or finalise was in failed (the message is the batch's error).
    #[error("batch: {0}")]
    Batch(String),
}

impl RunError {
    /// Postgres answered with an error for the statement (constraint, deadlock, ...), as
    /// opposed to a connection that failed.
    pub fn is_statement_error(&self) -> bool {
        matches!(self, RunError::Postgres(e) if e.as_db_error().is_some())
    }
}
