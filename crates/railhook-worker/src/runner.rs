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
//! 4. Deferrals release the Claim and spend no Attempt (the claim defers in the same
//!    statement: `railhook_store::lifecycle::claim_batch`).
//! 5. Response bodies are read up to `http::BODY_CAP` and stored truncated.
//! 6. Redirects are not followed: a 3xx goes to Failed Messages.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use railhook_core::signing::EndpointSecret;
use railhook_core::{ClaimToken, DeferralReason, TraceContext};
use railhook_store::lifecycle::{self, AttemptRecord, ClaimRequest, ClaimResult, Claimed, Next};
use railhook_telemetry::stages::Stage;
use railhook_telemetry::traces;
use tracing::Instrument as _;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::consumer::Hint;
use crate::error::{ErrorKind, WorkerError};
use crate::http::{self, AttemptOutcome, OutgoingRequest, Verdict};
use crate::ladder::{self, Step};
use crate::metrics::WorkerMetrics;
use crate::ordering::{Held, OrderingBuffer, Resolution};
use crate::queues::{BusyOn, ClaimMode};

/// How a hint's task ended, and the parked successor its finalise released (ordering), which
/// the consume loop claims at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub ran: Ran,
    pub released: Option<railhook_core::DeliveryId>,
}

impl From<Ran> for Outcome {
    fn from(ran: Ran) -> Outcome {
        Outcome { ran, released: None }
    }
}

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
    /// A claim in the waiting mode found a limit taken (nothing written): the hint goes back
    /// to its Endpoint's queue, to claim again when that limit may have room.
    Busy(BusyOn),
}

/// The settings an Attempt reads (a slice of `worker.*`, cut once).
#[derive(Debug, Clone, Copy)]
pub struct AttemptSettings {
    /// The longest wait a `Retry-After` may impose.
    pub retry_after_max: Duration,
    /// The outgoing hard cap, from the ladder's start.
    pub max_age: Duration,
    /// The ordering gap timeout (a Delivery the Ordering Buffer gives back is parked with it).
    pub ordering_gap_s: f64,
    /// The longest a Delivery claimed behind its predecessor waits for the predecessor's
    /// verdict (`worker.processing_timeout_seconds`: by then the stuck sweep takes over).
    pub ordering_wait: Duration,
}

impl AttemptSettings {
    pub fn from_config(w: &railhook_config::WorkerConfig) -> AttemptSettings {
        AttemptSettings {
            retry_after_max: Duration::from_secs(w.retry_after_max_seconds),
            max_age: Duration::from_secs(w.outgoing_max_age_seconds),
            ordering_gap_s: w.ordering_gap_timeout_seconds as f64,
            ordering_wait: Duration::from_secs(w.processing_timeout_seconds),
        }
    }
}

pub struct Runner {
    pub settings: AttemptSettings,
    pub pool: railhook_store::Pool,
    pub sender: http::Sender,
    pub metrics: WorkerMetrics,
    pub claimer: Claimer,
    pub finaliser: Finaliser,
    /// This worker's Deliveries between the end of their request and their finalise's
    /// commit; the claimer shares it.
    pub finishing: Finishing,
    /// The held Claims of ordered Deliveries and their resolutions; the claimer shares it.
    pub ordering: OrderingBuffer,
    /// The database's clock: retries are timed on it (the claim compares them with `now()`).
    pub clock: crate::clock::DbClock,
}

/// This worker's Claims whose HTTP request has ended and whose finalise has not committed
/// yet. Their Endpoint's slot is already free in the worker's queue, and the claim leaves them
/// out of the concurrency counts (`claim_batch_finishing`), so a slot covers the claim and
/// the request, not the finalise. A Claim is added only after its request ended and removed
/// once its finalise is over (or has given up), so the claim never leaves out a request in
/// flight; and, before its request, while an ordered Delivery waits in the Ordering Buffer
/// behind its predecessor (removed before it is sent). At most `worker.max_in_flight` entries.
#[derive(Clone, Default)]
pub struct Finishing(Arc<std::sync::Mutex<std::collections::HashSet<ClaimToken>>>);

impl Finishing {
    fn set(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<ClaimToken>> {
        // Nothing panics while holding the lock; a poisoned set is still the right set.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds `token` until the returned guard is dropped.
    fn enter(&self, token: ClaimToken) -> FinishingGuard {
        self.set().insert(token);
        FinishingGuard { finishing: self.clone(), token }
    }

    /// The Claims finishing now, for a claim batch.
    pub fn snapshot(&self) -> Vec<ClaimToken> {
        self.set().iter().copied().collect()
    }
}

struct FinishingGuard {
    finishing: Finishing,
    token: ClaimToken,
}

impl Drop for FinishingGuard {
    fn drop(&mut self) {
        self.finishing.set().remove(&self.token);
    }
}

/// Waits before claiming again a Delivery the claim did not see (`ClaimResult::Missing`):
/// about 4 s in all, far beyond the moment between a commit's WAL flush and its visibility.
const UNSEEN_RETRY_MS: [u64; 8] = [2, 5, 10, 25, 50, 200, 700, 3000];
/// Waits before claiming again an ordered Delivery whose predecessor was due and unclaimed
/// (`ClaimResult::Behind`): its hint is normally a claim batch away. Short, because the task
/// holds one of the Endpoint's slots meanwhile: if the predecessor's hint waits for a slot
/// (or was announced again at the back of the queue), it is parked instead.
const BEHIND_RETRY_MS: [u64; 4] = [1, 2, 5, 10];
/// Claims that fail (Postgres unreachable) are made again this many times, 0.2 s to 5 s
/// apart: about five minutes.
const CLAIM_FAILURE_RETRIES: u32 = 64;

/// Claims, or finalises, at most this many Deliveries per round trip.
pub const BATCH: usize = 64;

type Reply<A> = tokio::sync::oneshot::Sender<Result<A, WorkerError>>;

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
        F: Fn(Arc<[Q]>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Vec<A>, WorkerError>> + Send,
    {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<(Q, Reply<A>)>(capacity.max(1));
        tokio::spawn(async move {
            let mut batch = Vec::with_capacity(BATCH);
            while rx.recv_many(&mut batch, BATCH).await > 0 {
                let (requests, replies): (Vec<Q>, Vec<Reply<A>>) = batch.drain(..).unzip();
                answer_batch(what, &run, requests.into(), replies).await;
            }
        });
        Batcher { tx, what }
    }

    pub async fn call(&self, request: Q) -> Result<A, WorkerError> {
        let what = self.what;
        let stopped = || WorkerError::new(ErrorKind::Unavailable, format!("the {what} batcher stopped"), None);
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.tx.send((request, reply)).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn answer_batch<Q: Clone, A, F, Fut>(what: &'static str, run: &F, requests: Arc<[Q]>, replies: Vec<Reply<A>>)
where
    F: Fn(Arc<[Q]>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<A>, WorkerError>>,
{
    match run(requests.clone()).await {
        Ok(answers) => {
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(Ok(answer));
            }
        }
        Err(e) if replies.len() > 1 && e.kind() == ErrorKind::Refused => {
            tracing::warn!(error = %crate::error::chain(&e), requests = replies.len(), what, "batch refused; making each request alone");
            for (request, reply) in requests.iter().zip(replies) {
                let no_answer = || WorkerError::new(ErrorKind::Refused, format!("{what}: no answer for the request"), None);
                let alone = run(Arc::from([request.clone()])).await.and_then(|mut a| a.pop().ok_or_else(no_answer));
                let _ = reply.send(alone);
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

/// Claims in batches. Claims of one project are serialised by its advisory lock until
/// commit, so one lock and one commit per batch instead of per Delivery is what lets a
/// project go past a few hundred claims per second.
pub type Claimer = Batcher<ClaimRequest, ClaimResult>;

/// Finalises in batches: one statement and one WAL flush for many Attempts.
pub type Finaliser = Batcher<lifecycle::FinaliseRequest, lifecycle::Finalised>;

async fn connection(pool: &railhook_store::Pool) -> Result<deadpool_postgres::Object, WorkerError> {
    pool.get().await.map_err(|e| WorkerError::unavailable("no Postgres connection from the pool", e))
}

pub fn claimer(pool: railhook_store::Pool, limits: lifecycle::Limits, metrics: WorkerMetrics, capacity: usize, finishing: Finishing, ordering: OrderingBuffer) -> Claimer {
    Batcher::start("claim", capacity, move |requests: Arc<[ClaimRequest]>| {
        let (pool, metrics, finishing, ordering) = (pool.clone(), metrics.clone(), finishing.clone(), ordering.clone());
        async move {
            metrics.claim_batch_size.observe(requests.len() as f64);
            let client = connection(&pool).await?;
            // Read when the batch goes, not when its requests were made: a Delivery whose
            // finalise committed since is no longer PROCESSING, so naming it changes nothing.
            let finishing = finishing.snapshot();
            let mine = ordering.held();
            let results = lifecycle::claim_batch_finishing(&client, &requests, &limits, &finishing, &mine).await.map_err(|e| WorkerError::postgres("claim batch", e))?;
            // Held from here, before the answers go out: the next batch may claim their
            // successors behind them (the task's `Held` guard lets each go).
            for result in &results {
                if let ClaimResult::Claimed(c) = result {
                    if c.sequence_number.is_some() {
                        ordering.hold(c.token);
                    }
                }
            }
            Ok(results)
        }
    })
}

pub fn finaliser(pool: railhook_store::Pool, circuit: lifecycle::Circuit, metrics: WorkerMetrics, capacity: usize) -> Finaliser {
    Batcher::start("finalise", capacity, move |requests: Arc<[lifecycle::FinaliseRequest]>| {
        let (pool, metrics) = (pool.clone(), metrics.clone());
        async move {
            metrics.finalise_batch_size.observe(requests.len() as f64);
            let client = connection(&pool).await?;
            lifecycle::finalise_batch(&client, &requests, &circuit).await.map_err(|e| WorkerError::postgres("finalise batch", e))
        }
    })
}

/// The JSON body every receiver gets: the Event, Standard Webhooks style.
pub fn body(claimed: &Claimed) -> String {
    format!(
        r#"{{"id":{},"type":{},"timestamp":{},"data":{}}}"#,
        serde_json::Value::String(claimed.event_id.to_string()),
        serde_json::Value::String(claimed.event_type.clone()),
        serde_json::Value::String(claimed.event_created_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        claimed.payload
    )
}

impl Runner {
    /// Claims the hint's Delivery under `token` (the caller's, so that a task that panics can
    /// give the Claim back: [`Runner::give_back`]; the scheduler's token on the retry path is
    /// the hint's), then runs the Attempt. `claimed_tx` is told once the claim step is over (the consumer commits the
    /// message's offset then, not after the HTTP request: a slow endpoint holds no offsets),
    /// with the Delivery's Project if it was claimed (the queues count its slots).
    /// In the waiting `mode` a limit that bites answers [`Ran::Busy`], without telling
    /// `claimed_tx`: the hint is not done with, its offset stays pending. `sent_tx` is told
    /// once the request has ended, before the finalise (the Endpoint's slot is free then; see
    /// [`Finishing`]); never if no request was made. `behind_tx` is told when the Delivery
    /// was claimed behind its predecessor (the Endpoint is ordered: `queues::ORDERED_AHEAD`).
    ///
    /// `received`: when the hint's Kafka message arrived, for the `poll_to_claim` latency
    /// stage (`railhook_telemetry::stages`; the Attempt's own stages are observed in
    /// [`Runner::attempt`]).
    ///
    /// Traces (issue 33): with the hint's trace context, the claim, the Attempt and the
    /// finalise are spans, children of that context in this order; untraced hints make none.
    pub async fn run(&self, hint: Hint, token: ClaimToken, received: Option<Instant>, mode: ClaimMode, claimed_tx: impl FnOnce(Option<railhook_core::ProjectId>), behind_tx: impl FnOnce(), sent_tx: impl FnOnce(), hard_stop: CancellationToken) -> Result<Outcome, WorkerError> {
        let trace = hint.trace.clone();
        let claim_span = match &trace {
            None => tracing::Span::none(),
            Some(_) => tracing::info_span!(target: traces::TARGET, parent: None, traces::span::CLAIM,
                otel.kind = "consumer", railhook.delivery_id = %hint.delivery, railhook.claim = tracing::field::Empty),
        };
        traces::continue_from(&claim_span, trace.as_ref());
        let claimed = self.claim(&hint, token, mode, &hard_stop).instrument(claim_span.clone()).await;
        if !claim_span.is_disabled() {
            let answer = match &claimed {
                Ok(Some(ClaimResult::Claimed(_))) => "claimed",
                Ok(Some(ClaimResult::Deferred(_))) => "deferred",
                Ok(Some(ClaimResult::Busy(_))) => "busy",
                Ok(Some(_)) | Ok(None) => "nothing",
                Err(_) => "error",
            };
            claim_span.record("railhook.claim", answer);
        }
        drop(claim_span);
        let claim_done = Instant::now();
        if let Ok(Some(ClaimResult::Busy(reason))) = &claimed {
            self.metrics.claims_busy.with_label_values(&[reason.as_str()]).inc();
            return Ok(Ran::Busy(busy_on(*reason)).into());
        }
        // The Ordering Buffer (crate::ordering): an ordered Claim is held until this task ends,
        // guarded from the moment its answer is here, so that a task that panics or is cut
        // short from now on (even in `claimed_tx`) still lets the Claim go and stops what is
        // held behind it, instead of leaving it in every later claim batch's `p_mine`.
        let held = match &claimed {
            Ok(Some(ClaimResult::Claimed(c))) => c.sequence_number.map(|seq| self.ordering.guard(c.endpoint_id, seq, c.token)),
            _ => None,
        };
        // Also after a claim that kept failing: the hint is then dropped and the sweeps
        // recover the Delivery; holding its offset longer would stall the partition's commits.
        claimed_tx(match &claimed {
            Ok(Some(ClaimResult::Claimed(c))) => Some(c.project_id),
            _ => None,
        });
        let claimed = match claimed? {
            Some(ClaimResult::Claimed(c)) => *c,
            None => return Ok(Ran::NothingClaimed.into()),
            Some(ClaimResult::Nothing | ClaimResult::Missing | ClaimResult::Behind) => {
                self.metrics.claims_lost.inc();
                return Ok(Ran::NothingClaimed.into());
            }
            Some(ClaimResult::Busy(_)) => unreachable!("answered above"),
            Some(ClaimResult::Deferred(reason)) => {
                // Invariant 4: released before any Attempt (the row never left PENDING).
                self.metrics.deferrals.with_label_values(&[reason.as_str()]).inc();
                return Ok(Ran::Deferred.into());
            }
        };
        self.metrics.claims_won.inc();
        if let Some(received) = received {
            self.metrics.stages.observe(Stage::PollToClaim, claim_done - received);
        }
        // One claimed behind its predecessor waits for that one's verdict before it is sent.
        if let (true, Some(seq)) = (claimed.behind, claimed.sequence_number) {
            // Waiting, it uses no connection of the receiver: the claim leaves it out of the
            // concurrency counts (as a finishing Claim) until it is sent, and the Endpoint's
            // queue lets its claims run ahead of its request slots (`queues::ORDERED_AHEAD`).
            let waiting = self.finishing.enter(claimed.token);
            behind_tx();
            let resolution = tokio::select! {
                r = self.ordering.wait(claimed.endpoint_id, seq - 1, self.settings.ordering_wait) => r,
                _ = hard_stop.cancelled() => Resolution::Stop,
            };
            drop(waiting);
            if resolution == Resolution::Stop {
                // Parked in Postgres, as a claim would have parked it; `held` drops with
                // `Stop` for whatever this worker holds behind it.
                let client = connection(&self.pool).await?;
                lifecycle::park_held(&client, claimed.id, claimed.token, self.settings.ordering_gap_s).await.map_err(|e| WorkerError::postgres("park a held Delivery", e))?;
                self.metrics.deferrals.with_label_values(&[DeferralReason::Ordering.as_str()]).inc();
                return Ok(Ran::Deferred.into());
            }
            self.metrics.ordering_held.inc();
        }
        if claimed.gap_timeout {
            tracing::info!(delivery = %claimed.id, sequence = ?claimed.sequence_number, "ordering gap timeout: sent without its predecessor");
            self.metrics.ordering_gap_timeouts.inc();
        }
        if let Some(parked) = claimed.parked_at {
            self.metrics.ordering_parked_seconds.observe((self.clock.now() - parked).to_std().unwrap_or_default().as_secs_f64());
        }
        self.attempt(claimed, claim_done, held, sent_tx, &hard_stop, trace.as_ref()).await
    }

    /// Gives back the Claim `token` on `delivery` of a task that ended without finishing (it
    /// panicked): PENDING and due now (the retry scheduler announces it), no Attempt spent,
    /// instead of PROCESSING until the stuck sweep (which counts it against its Endpoint's
    /// concurrency meanwhile). Conditional on the Claim, like every write: a Claim that was never won, or
    /// whose finalise committed, is left as it is. A request the task had sent is sent again,
    /// as after the sweep (duplicate window 8). If Postgres does not answer, the sweep is
    /// still there.
    pub async fn give_back(&self, delivery: railhook_core::DeliveryId, token: ClaimToken) {
        match self.release_due_now(delivery, token).await {
            Ok(true) => {
                self.metrics.claims_given_back.inc();
                tracing::info!(%delivery, "the Claim of a task that panicked was given back");
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %crate::error::chain(&e), %delivery, "the Claim of a task that panicked could not be given back; the stuck sweep recovers it"),
        }
    }

    /// Gives the Claim `token` on `delivery` back unsent: PENDING, due now on the database's
    /// clock, so the retry scheduler announces it again (its hint's offset was stored at the
    /// claim; with no due time it waited for the stranded sweep, an hour). Whether it was
    /// given back (conditional on the Claim).
    async fn release_due_now(&self, delivery: railhook_core::DeliveryId, token: ClaimToken) -> Result<bool, WorkerError> {
        let client = connection(&self.pool).await?;
        lifecycle::release(&client, delivery, token, Some(self.clock.now())).await.map_err(|e| WorkerError::postgres("release", e))
    }

    /// The claim, made again while the Delivery is not visible yet (`Missing`, about 4 s in
    /// all) and while Postgres is unreachable (about five minutes). `None`: cut short by the
    /// hard stop. Both waits hold the hint's offset: a crash meanwhile redelivers the hint,
    /// and so does a shutdown (the offset stays uncommitted).
    async fn claim(&self, hint: &Hint, token: ClaimToken, mode: ClaimMode, hard_stop: &CancellationToken) -> Result<Option<ClaimResult>, WorkerError> {
        let mut request = ClaimRequest { delivery: hint.delivery, token, hint: hint.claim_token, wait: mode == ClaimMode::Wait, announced_at: hint.announced_at, position: hint.position };
        let mut unseen_waits = UNSEEN_RETRY_MS.iter();
        let mut behind_waits = BEHIND_RETRY_MS.iter();
        let mut failures = 0u32;
        loop {
            let wait = match self.claimer.call(request).await {
                // An ordered Delivery whose predecessor's hint is about to claim it: claim again
                // shortly (holding the slot), to go behind it. After about 20 ms the claim is
                // made in the Deferral mode, which parks it.
                Ok(ClaimResult::Behind) => {
                    self.metrics.claims_busy.with_label_values(&[DeferralReason::Ordering.as_str()]).inc();
                    match behind_waits.next() {
                        Some(ms) => Duration::from_millis(*ms),
                        None => {
                            request.wait = false;
                            Duration::ZERO
                        }
                    }
                }
                // The hint overtook its Delivery's commit: claim again shortly. After the
                // last wait the row is taken to be gone (deleted with its endpoint).
                Ok(ClaimResult::Missing) => match unseen_waits.next() {
                    Some(ms) => {
                        self.metrics.claims_unseen.inc();
                        Duration::from_millis(*ms)
                    }
                    None => return Ok(Some(ClaimResult::Nothing)),
                },
                // The permit held meanwhile is the backpressure on the consumer.
                Err(e) if failures < CLAIM_FAILURE_RETRIES => {
                    failures += 1;
                    let wait = Duration::from_millis(100u64 << failures.min(6)).min(Duration::from_secs(5));
                    tracing::warn!(error = %crate::error::chain(&e), delivery = %hint.delivery, ?wait, "claim failed; claiming again");
                    wait
                }
                other => return other.map(Some),
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = hard_stop.cancelled() => return Ok(None),
            }
        }
    }

    /// One Attempt on a claimed Delivery: the request, its outcome, the finalise.
    ///
    /// `trace`: the hint's trace context. The Attempt span (a client span) is its child; the
    /// receiver gets `traceparent` (and `tracestate`) naming that span, or with export off
    /// the context as it came (the W3C pass-through).
    async fn attempt(&self, claimed: Claimed, claim_done: Instant, mut held: Option<Held>, sent_tx: impl FnOnce(), hard_stop: &CancellationToken, trace: Option<&TraceContext>) -> Result<Outcome, WorkerError> {
        let mut request = self.request(&claimed);
        let attempt_span = match trace {
            None => tracing::Span::none(),
            Some(_) => tracing::info_span!(target: traces::TARGET, parent: None, traces::span::ATTEMPT,
                otel.kind = "client", http.request.method = "POST", railhook.delivery_id = %claimed.id,
                railhook.attempt = claimed.attempt_count + 1, http.response.status_code = tracing::field::Empty),
        };
        traces::continue_from(&attempt_span, trace);
        if let Some(outgoing) = traces::context_of(&attempt_span, trace) {
            http::set_trace_headers(&mut request.headers, &outgoing);
        }
        let request_headers = http::recorded_headers(&request.headers, &[]);
        let sending = Instant::now();
        self.metrics.stages.observe(Stage::ClaimToSend, sending - claim_done);
        // Invariant 1: nothing but the HTTP request in this future.
        let outcome = tokio::select! {
            outcome = self.sender.send(request).instrument(attempt_span.clone()) => outcome,
            _ = hard_stop.cancelled() => {
                self.release_due_now(claimed.id, claimed.token).await?;
                return Ok(Ran::Released.into());
            }
        };
        // The request is over: out of the concurrency counts from here to the finalise's end
        // (the guard), and the Endpoint's slot is free for its next hint.
        let responded = Instant::now();
        if !attempt_span.is_disabled() {
            if let Some(status) = outcome.status_code {
                attempt_span.record("http.response.status_code", status);
            }
            if !matches!(outcome.result, http::AttemptResult::Success) {
                traces::fail(&attempt_span, outcome.result.as_str());
            }
        }
        drop(attempt_span);
        self.metrics.stages.observe(Stage::Request, responded - sending);
        let _finishing = self.finishing.enter(claimed.token);
        sent_tx();
        let verdict = http::classify(&outcome);
        let (next, ran) = self.next(&claimed, &verdict);
        // The successor held behind this one may go now, before this finalise: delivered or
        // in Failed Messages is the end of it either way (crate::ordering).
        if let Some(held) = held.as_mut() {
            held.resolve(if matches!(ran, Ran::Delivered | Ran::Failed) { Resolution::Go } else { Resolution::Stop });
        }
        self.metrics.attempt(&outcome);
        // The circuit counts an answer that asks for a retry as a failure; any other answer,
        // even a 4xx, shows the endpoint is up.
        let healthy = !matches!(verdict, Verdict::Retry { .. });
        let last_error = last_error(&verdict, &outcome);
        let request = lifecycle::FinaliseRequest::new(&claimed, next, last_error, record(&outcome, request_headers, self.clock.offset()), healthy);
        let finalise_span = match trace {
            None => tracing::Span::none(),
            Some(_) => tracing::info_span!(target: traces::TARGET, parent: None, traces::span::FINALISE, railhook.delivery_id = %claimed.id, railhook.outcome = ?ran),
        };
        traces::continue_from(&finalise_span, trace);
        let finalised = self.finalise(request).instrument(finalise_span).await?;
        self.metrics.stages.observe(Stage::ResponseToFinalise, responded.elapsed());
        if let Some(change) = finalised.circuit {
            tracing::info!(endpoint = %claimed.endpoint_id, %change, "circuit state changed");
            self.metrics.circuit_changes.with_label_values(&[change.as_str()]).inc();
        }
        if !finalised.wrote {
            // Invariant 2: no successor without the Claim.
            self.metrics.fence_lost.inc();
            return Ok(Ran::FenceLost.into());
        }
        if ran == Ran::Delivered {
            let latency = (self.clock.now() - claimed.event_created_at).to_std().unwrap_or_default();
            self.metrics.delivery_latency.observe(latency.as_secs_f64());
        }
        if claimed.sequence_number.is_some() && matches!(ran, Ran::Delivered | Ran::Failed) {
            self.metrics.ordering_cursor_advances.inc();
        }
        if finalised.released.is_some() {
            self.metrics.ordering_released.inc();
        }
        Ok(Outcome { ran, released: finalised.released })
    }

    /// What the finalise writes on the Delivery after `verdict`: the ladder's next step.
    fn next(&self, claimed: &Claimed, verdict: &Verdict) -> (Next, Ran) {
        match verdict {
            Verdict::Delivered => (Next::Success, Ran::Delivered),
            Verdict::Fail => (Next::Failed, Ran::Failed),
            Verdict::Retry { retry_after } => {
                let step = ladder::next_step(
                    self.clock.now(),
                    claimed.attempt_count + 1,
                    claimed.max_attempts,
                    &claimed.retry_delays,
                    ladder::jitter(),
                    *retry_after,
                    self.settings.retry_after_max,
                    claimed.ladder_started_at,
                    self.settings.max_age,
                );
                match step {
                    Step::RetryAt(at) => (Next::RetryAt(at), Ran::Retrying),
                    Step::GiveUp(_) => (Next::Failed, Ran::Failed),
                }
            }
        }
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
            &claimed.id.to_string(),
            &claimed.event_id.to_string(),
            crate::clock::host_now().timestamp(),
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
    async fn finalise(&self, request: lifecycle::FinaliseRequest) -> Result<lifecycle::Finalised, WorkerError> {
        let mut wait = Duration::from_millis(100);
        let mut attempt = 0;
        loop {
            match self.finaliser.call(request.clone()).await {
                Ok(finalised) => return Ok(finalised),
                Err(e) if attempt < 5 => {
                    tracing::warn!(error = %crate::error::chain(&e), delivery = %request.delivery, "finalise failed, retrying");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// What a busy claim waits for. For a rate limit, the time left in the current one-second
/// window (the claim's windows are whole seconds of the database clock; this host's clock is
/// close enough for a pause).
fn busy_on(reason: DeferralReason) -> BusyOn {
    match reason {
        DeferralReason::EndpointRate | DeferralReason::ProjectRate => {
            let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            BusyOn::RateWindow(Duration::from_millis(1_000 - u64::from(since_epoch.subsec_millis())))
        }
        DeferralReason::ProjectConcurrency => BusyOn::ProjectSlots,
        _ => BusyOn::EndpointSlots,
    }
}

/// The Attempt as recorded: the request's headers (credentials redacted, see
/// [`http::recorded_headers`]; the Endpoint's custom headers go by their names) and what came
/// back.
/// The Attempt as recorded; its start on the database's clock (`crate::clock`), like every
/// other time of the Delivery's.
fn record(outcome: &AttemptOutcome, request_headers: serde_json::Value, clock_offset: chrono::Duration) -> AttemptRecord {
    AttemptRecord {
        started_at: outcome.started_at + clock_offset,
        duration_ms: outcome.duration.as_millis().min(i32::MAX as u128) as i32,
        status_code: outcome.status_code.map(i32::from),
        result: outcome.result.as_str().to_string(),
        error_message: outcome.error_message.clone(),
        request_headers,
        response_headers: outcome.response_headers.clone(),
        response_body: outcome.response_body.clone(),
        response_truncated: outcome.response_truncated,
    }
}

/// The Delivery's `last_error` after an Attempt that did not deliver.
fn last_error(verdict: &Verdict, outcome: &AttemptOutcome) -> Option<String> {
    match verdict {
        Verdict::Delivered => None,
        _ => Some(match (outcome.status_code, &outcome.error_message) {
            (Some(code), _) => format!("HTTP {code}"),
            (None, Some(e)) => format!("{}: {e}", outcome.result.as_str()),
            (None, None) => outcome.result.as_str().to_string(),
        }),
    }
}
