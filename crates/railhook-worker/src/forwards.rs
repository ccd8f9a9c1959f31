//! Forwards: the incoming direction's Attempts. A consume loop of its own on the forwards
//! topic claims each announced Forward (`railhook_store::lifecycle::forward`), sends the
//! Incoming Event to its Destination with the same [`http::Sender`] as Deliveries (SSRF
//! guard, bounded reads, no redirects, the same classification), and finalises the Attempt.
//!
//! # The request
//!
//! `POST` (the ingress accepts only POST) to the Destination's URL with the Incoming Event's
//! body bytes exactly as received and its `Content-Type`; the provider's headers in
//! [`FORWARDED_HEADERS`] (signatures, event names and ids, so the Destination can verify the
//! provider itself), nothing else of the original request (no `Host`, `User-Agent`,
//! `Authorization`, cookies, proxies' `X-Forwarded-*`); then `X-Incoming-Event-Id`,
//! `X-Forward-Attempt` (1-based) and `Idempotency-Key` (the Forward id, stable across
//! Attempts), `User-Agent: Railhook/<version>`, and the Destination's auth: `Authorization:
//! Basic`/`Bearer`, one custom header, or Standard Webhooks re-signing with the
//! Destination's own secret (`webhook-id` = the Forward id, stable across Attempts; a fresh
//! `webhook-timestamp`; the provider's `webhook-*`/`svix-*` headers are then left out).
//!
//! # Offsets and invariants
//!
//! As for Deliveries (`crate::consumer`): a message's offset is stored once its claim step is
//! over (claimed, deferred, or found done), never before, over a contiguous prefix per
//! partition; a crash before the claim re-reads the hint, one after it leaves a PROCESSING
//! Forward that the stuck sweep ([`lifecycle::forward::sweep`], after
//! `worker.processing_timeout_seconds`) announces again. No database or Kafka work inside the
//! HTTP request's future; the outcome is written only while the Claim holds (the fence), and a
//! retry is due only through that write. The consumer group is `worker.group_id` +
//! `.forwards`, apart from the Deliveries' group so neither rebalances the other.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use railhook_config::Config;
use railhook_core::signing::{sign, EndpointSecret};
use railhook_core::{AttemptId, ClaimToken, ForwardId};
use railhook_kafka::{Announcement, Target};
use railhook_store::incoming::ForwardToSend;
use railhook_store::lifecycle::forward::{self, CircuitTiming, ClaimedForward, ForwardClaim, ForwardClaimResult, ForwardFinalise, ForwardFinalised};
use railhook_store::lifecycle::{AttemptRecord, Circuit, Limits, Next};
use railhook_store::sources::DestinationAuth;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::Message;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::consumer::OffsetTracker;
use crate::error::{self, WorkerError};
use crate::http::{self, AttemptOutcome, OutgoingRequest, Verdict};
use railhook_core::TraceContext;
use railhook_telemetry::traces;
use rdkafka::message::Headers as _;
use tracing::Instrument as _;
use crate::ladder::{self, Step};
use crate::runner::Batcher;
use crate::WorkerMetrics;

/// The provider headers a Forward carries over from the original request (lower case; any
/// other header of the original request is left out). Grouped by provider.
pub const FORWARDED_HEADERS: &[&str] = &[
    // Stripe
    "stripe-signature",
    // GitHub
    "x-github-event", "x-github-delivery", "x-github-hook-id", "x-github-hook-installation-target-id",
    "x-github-hook-installation-target-type", "x-hub-signature", "x-hub-signature-256",
    // GitLab
    "x-gitlab-event", "x-gitlab-event-uuid", "x-gitlab-webhook-uuid", "x-gitlab-instance", "x-gitlab-token",
    // Shopify
    "x-shopify-topic", "x-shopify-webhook-id", "x-shopify-event-id", "x-shopify-hmac-sha256", "x-shopify-shop-domain",
    "x-shopify-api-version", "x-shopify-triggered-at",
    // Slack
    "x-slack-signature", "x-slack-request-timestamp", "x-slack-retry-num", "x-slack-retry-reason",
    // Twilio and SendGrid
    "x-twilio-signature", "i-twilio-idempotency-token", "x-twilio-email-event-webhook-signature",
    "x-twilio-email-event-webhook-timestamp",
    // Square, HubSpot
    "x-square-hmacsha256-signature", "x-square-signature", "x-hubspot-signature", "x-hubspot-signature-v3",
    "x-hubspot-signature-version", "x-hubspot-request-timestamp",
    // Standard Webhooks and Svix: left out when the Destination re-signs (RESIGNED_HEADERS).
    "webhook-id", "webhook-timestamp", "webhook-signature", "svix-id", "svix-timestamp", "svix-signature",
];

/// Provider headers a Standard Webhooks re-signing replaces (left out of the request then).
pub const RESIGNED_HEADERS: &[&str] = &["webhook-id", "webhook-timestamp", "webhook-signature", "svix-id", "svix-timestamp", "svix-signature"];

/// Waits before claiming again a Forward whose commit was not visible yet (about 4 s).
const UNSEEN_RETRY_MS: [u64; 7] = [5, 10, 25, 100, 300, 1000, 2500];
/// Claims that fail (Postgres unreachable) are made again this many times, up to 5 s apart.
const CLAIM_FAILURE_RETRIES: u32 = 64;
/// Scheduler and sweep bounds for Forwards.
pub const SCHEDULE_BATCH: i64 = 500;
pub const SCHEDULE_PER_DESTINATION: i64 = 50;
pub const SCHEDULE_PER_PROJECT: i64 = 200;
pub const SWEEP_BATCH: i64 = 1_000;

/// The Forwards' metrics (registered with the worker's).
#[derive(Clone)]
pub struct ForwardMetrics {
    /// Attempts by result and status class.
    pub attempts: IntCounterVec,
    pub in_flight: IntGauge,
    /// Claim outcomes: claimed, nothing, missing, destination_disabled, destination_rate,
    /// circuit_open, circuit_half_open; and unseen_retry, a claim made again because its row
    /// (or the scheduler's token on it) was not visible yet.
    pub claims: IntCounterVec,
    /// Destination circuit breaker state changes by change (opened, closed, reopened).
    pub circuit_changes: IntCounterVec,
    /// Finalises that found their Claim gone (swept).
    pub fence_lost: IntCounter,
    pub scheduled: IntCounter,
    /// Forwards moved by the sweeps: stuck, stranded.
    pub swept: IntCounterVec,
    pub bad_messages: IntCounter,
}

impl Default for ForwardMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ForwardMetrics {
    pub fn new() -> ForwardMetrics {
        let counter = |name: &str, help: &str| IntCounter::new(name, help).expect("valid metric");
        let vec = |name: &str, help: &str, labels: &[&str]| IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
        ForwardMetrics {
            attempts: vec("railhook_worker_forward_attempts_total", "Forward Attempts by result and status class.", &["result", "status_class"]),
            in_flight: IntGauge::new("railhook_worker_forwards_in_flight", "Forward Attempts running in this process.").expect("valid metric"),
            claims: vec("railhook_worker_forward_claims_total", "Forward announcements by what their claim found.", &["outcome"]),
            circuit_changes: vec("railhook_worker_forward_circuit_changes_total", "Destination circuit state changes, by change.", &["change"]),
            fence_lost: counter("railhook_worker_forward_fence_lost_total", "Forward finalises that found their Claim gone."),
            scheduled: counter("railhook_worker_forward_retries_scheduled_total", "Due Forwards claimed and announced by the scheduler."),
            swept: vec("railhook_worker_forwards_swept_total", "Forwards moved by the sweeps, by sweep.", &["sweep"]),
            bad_messages: counter("railhook_worker_forward_bad_messages_total", "Forward announcements that did not parse (skipped)."),
        }
    }

    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.attempts.clone()))?;
        registry.register(Box::new(self.in_flight.clone()))?;
        registry.register(Box::new(self.claims.clone()))?;
        registry.register(Box::new(self.circuit_changes.clone()))?;
        registry.register(Box::new(self.fence_lost.clone()))?;
        registry.register(Box::new(self.scheduled.clone()))?;
        registry.register(Box::new(self.swept.clone()))?;
        registry.register(Box::new(self.bad_messages.clone()))
    }

    fn attempt(&self, outcome: &AttemptOutcome) {
        let class = match outcome.status_code {
            Some(c) if (100..600).contains(&c) => ["1xx", "2xx", "3xx", "4xx", "5xx"][(c / 100 - 1) as usize],
            _ => "none",
        };
        self.attempts.with_label_values(&[outcome.result.as_str(), class]).inc();
    }
}

// ---- The request ---------------------------------------------------------------------------

/// Standard base64 (with padding), for `Authorization: Basic`.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16) | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8) | u32::from(*chunk.get(2).unwrap_or(&0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            out.push(if i <= chunk.len() { ALPHABET[(n >> shift & 63) as usize] as char } else { '=' });
        }
    }
    out
}

/// The headers of one Attempt of `forward` (see the module doc), `number` 1-based.
/// Provider headers that are not valid header text are left out; a Destination secret that
/// does not parse leaves the signature empty (the Destination refuses it, visibly).
pub fn forward_headers(forward: &ForwardToSend, number: i32, timestamp: i64) -> Vec<(String, String)> {
    let resigned = matches!(forward.destination.auth, DestinationAuth::StandardWebhooks { .. });
    let mut headers = Vec::new();
    for h in &forward.headers {
        let name = h.name.to_ascii_lowercase();
        let keep = FORWARDED_HEADERS.contains(&name.as_str()) && !(resigned && RESIGNED_HEADERS.contains(&name.as_str()));
        if let (true, Some(value)) = (keep, &h.value) {
            if reqwest::header::HeaderValue::from_str(value).is_ok() {
                headers.push((name, value.clone()));
            }
        }
    }
    if let Some(ct) = forward.content_type.as_deref().filter(|ct| reqwest::header::HeaderValue::from_str(ct).is_ok()) {
        headers.push(("Content-Type".into(), ct.to_string()));
    }
    headers.push(("User-Agent".into(), http::USER_AGENT.into()));
    headers.push(("X-Incoming-Event-Id".into(), forward.incoming_event_id.to_string()));
    headers.push(("X-Forward-Attempt".into(), number.to_string()));
    headers.push(("Idempotency-Key".into(), forward.id.to_string()));
    match &forward.destination.auth {
        DestinationAuth::None => {}
        DestinationAuth::Basic { username, password } => headers.push(("Authorization".into(), format!("Basic {}", base64(format!("{username}:{password}").as_bytes())))),
        DestinationAuth::Bearer { token } => headers.push(("Authorization".into(), format!("Bearer {token}"))),
        DestinationAuth::Header { name, value } => headers.push((name.clone(), value.clone())),
        DestinationAuth::StandardWebhooks { secret } => {
            let id = forward.id.to_string();
            let signature = EndpointSecret::parse(secret).map(|s| sign(&s, &id, timestamp, &forward.body)).unwrap_or_default();
            headers.push(("webhook-id".into(), id));
            headers.push(("webhook-timestamp".into(), timestamp.to_string()));
            headers.push(("webhook-signature".into(), signature));
        }
    }
    headers
}

/// The headers of a Forward's request as its Attempt records them: the Destination's auth
/// header (`Authorization`, or its custom header) redacted, and every credential
/// [`http::recorded_headers`] knows by name (a provider's `X-Gitlab-Token` among them).
pub fn recorded_headers(forward: &ForwardToSend, sent: &[(String, String)]) -> serde_json::Value {
    let custom = match &forward.destination.auth {
        DestinationAuth::Header { name, .. } => Some(name.as_str()),
        _ => None,
    };
    http::recorded_headers(sent, custom.as_slice())
}

fn request(forward: &ForwardToSend, number: i32) -> OutgoingRequest {
    OutgoingRequest {
        url: forward.destination.url.clone(),
        headers: forward_headers(forward, number, crate::clock::host_now().timestamp()),
        body: bytes::Bytes::from(forward.body.clone()),
        timeout: Duration::from_secs(forward.timeout_seconds.max(1) as u64),
    }
}

// ---- The Forwarder: claim, send, finalise ---------------------------------------------------

/// What a Forward's Attempt needs, shared by the tasks.
pub struct Forwarder {
    pub pool: railhook_store::Pool,
    pub sender: http::Sender,
    pub metrics: ForwardMetrics,
    claimer: Batcher<ForwardClaim, ForwardClaimResult>,
    finaliser: Batcher<ForwardFinalise, ForwardFinalised>,
    retry_after_max: Duration,
    max_age: Duration,
    /// The database's clock: retries are timed on it (`crate::clock`).
    pub(crate) clock: crate::clock::DbClock,
}

/// How one hint ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ran {
    NothingClaimed,
    Deferred,
    Delivered,
    Retrying,
    Failed,
    FenceLost,
    /// Shutdown cut it short; the Claim was given back.
    Released,
}

async fn connection(pool: &railhook_store::Pool) -> Result<deadpool_postgres::Object, WorkerError> {
    pool.get().await.map_err(|e| WorkerError::unavailable("no Postgres connection from the pool", e))
}

fn store_error(what: &'static str, e: railhook_store::StoreError) -> WorkerError {
    match e {
        railhook_store::StoreError::Db(e) => WorkerError::postgres(what, e),
        other => WorkerError::unavailable(what, other),
    }
}

impl Forwarder {
    pub fn new(config: &Config, pool: railhook_store::Pool, sender: http::Sender, metrics: ForwardMetrics) -> Forwarder {
        let w = &config.worker;
        let ladder: Arc<Vec<i32>> = Arc::new(w.incoming_retry_delays_seconds.clone());
        // The Endpoints' breaker settings, for the Destinations' circuits.
        let timing = CircuitTiming::from(&Limits::from_config(w));
        let circuit = Circuit { window_s: w.circuit_window_seconds as f64, min_volume: w.circuit_min_requests, ratio: w.circuit_failure_ratio };
        let claim_pool = pool.clone();
        let claimer = Batcher::start("forward claim", w.max_in_flight, move |claims: Arc<[ForwardClaim]>| {
            let (pool, ladder) = (claim_pool.clone(), ladder.clone());
            async move {
                let client = connection(&pool).await?;
                forward::claim_batch(&client, &claims, Some(ladder.as_slice()), &timing).await.map_err(|e| store_error("forward claim batch", e))
            }
        });
        let finalise_pool = pool.clone();
        let finaliser = Batcher::start("forward finalise", w.max_in_flight, move |requests: Arc<[ForwardFinalise]>| {
            let pool = finalise_pool.clone();
            async move {
                let client = connection(&pool).await?;
                forward::finalise_batch(&client, &requests, &circuit).await.map_err(|e| store_error("forward finalise batch", e))
            }
        });
        Forwarder {
            pool,
            sender,
            metrics,
            claimer,
            finaliser,
            retry_after_max: Duration::from_secs(w.retry_after_max_seconds),
            max_age: Duration::from_secs(w.incoming_max_age_seconds),
            clock: crate::clock::DbClock::default(),
        }
    }

    /// Claims the hint's Forward (made again while its commit is not visible, and while
    /// Postgres is unreachable); `None` when cut short by the hard stop.
    async fn claim(&self, forward: ForwardId, hint: Option<ClaimToken>, hard_stop: &CancellationToken) -> Result<Option<ForwardClaimResult>, WorkerError> {
        let request = ForwardClaim { forward, token: ClaimToken::new(), hint };
        let (mut unseen, mut failures) = (UNSEEN_RETRY_MS.iter(), 0u32);
        loop {
            let wait = match self.claimer.call(request).await {
                Ok(ForwardClaimResult::Missing) => match unseen.next() {
                    Some(ms) => {
                        self.metrics.claims.with_label_values(&["unseen_retry"]).inc();
                        Duration::from_millis(*ms)
                    }
                    None => return Ok(Some(ForwardClaimResult::Missing)),
                },
                Err(e) if failures < CLAIM_FAILURE_RETRIES => {
                    failures += 1;
                    tracing::warn!(error = %error::chain(&e), %forward, "forward claim failed; claiming again");
                    Duration::from_millis(100u64 << failures.min(6)).min(Duration::from_secs(5))
                }
                other => return other.map(Some),
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = hard_stop.cancelled() => return Ok(None),
            }
        }
    }

    /// One hint: the claim (then `claimed_tx`: the offset may be stored), the Attempt.
    /// `trace`: the announcement's trace context (issue 33): the claim, Attempt and finalise
    /// spans are its children, and the Destination gets `traceparent`, as for Deliveries.
    pub async fn run(&self, forward: ForwardId, hint: Option<ClaimToken>, trace: Option<TraceContext>, claimed_tx: impl FnOnce(), hard_stop: &CancellationToken) -> Result<Ran, WorkerError> {
        let claim_span = match &trace {
            None => tracing::Span::none(),
            Some(_) => tracing::info_span!(target: traces::TARGET, parent: None, traces::span::CLAIM, otel.kind = "consumer", railhook.forward_id = %forward),
        };
        traces::continue_from(&claim_span, trace.as_ref());
        let claimed = self.claim(forward, hint, hard_stop).instrument(claim_span).await;
        if matches!(claimed, Ok(None)) {
            // Stopping before the claim step ended: the offset stays, the hint is read again.
            return Ok(Ran::NothingClaimed);
        }
        // Also after a claim that kept failing: the sweeps recover the Forward.
        claimed_tx();
        let outcome = match claimed?.unwrap_or(ForwardClaimResult::Nothing) {
            ForwardClaimResult::Claimed(c) => c,
            ForwardClaimResult::Nothing => return self.counted("nothing", Ran::NothingClaimed),
            ForwardClaimResult::Missing => return self.counted("missing", Ran::NothingClaimed),
            ForwardClaimResult::Deferred(why) => return self.counted(why.as_str(), Ran::Deferred),
        };
        self.metrics.claims.with_label_values(&["claimed"]).inc();
        self.attempt(*outcome, hard_stop, trace.as_ref()).await
    }

    fn counted(&self, outcome: &str, ran: Ran) -> Result<Ran, WorkerError> {
        self.metrics.claims.with_label_values(&[outcome]).inc();
        Ok(ran)
    }

    /// One Attempt on a claimed Forward: the request, its outcome, the finalise.
    async fn attempt(&self, claimed: ClaimedForward, hard_stop: &CancellationToken, trace: Option<&TraceContext>) -> Result<Ran, WorkerError> {
        let f = &claimed.forward;
        let number = f.attempt_count + 1;
        self.metrics.in_flight.inc();
        let mut outgoing = request(f, number);
        let attempt_span = match trace {
            None => tracing::Span::none(),
            Some(_) => tracing::info_span!(target: traces::TARGET, parent: None, traces::span::ATTEMPT,
                otel.kind = "client", http.request.method = "POST", railhook.forward_id = %f.id, railhook.attempt = number,
                http.response.status_code = tracing::field::Empty),
        };
        traces::continue_from(&attempt_span, trace);
        if let Some(outgoing_trace) = traces::context_of(&attempt_span, trace) {
            http::set_trace_headers(&mut outgoing.headers, &outgoing_trace);
        }
        let request_headers = recorded_headers(f, &outgoing.headers);
        // Nothing but the HTTP request in this future.
        let outcome = tokio::select! {
            outcome = self.sender.send(outgoing).instrument(attempt_span.clone()) => Some(outcome),
            _ = hard_stop.cancelled() => None,
        };
        if let (false, Some(outcome)) = (attempt_span.is_disabled(), &outcome) {
            if let Some(status) = outcome.status_code {
                attempt_span.record("http.response.status_code", status);
            }
            if !matches!(outcome.result, http::AttemptResult::Success) {
                traces::fail(&attempt_span, outcome.result.as_str());
            }
        }
        drop(attempt_span);
        self.metrics.in_flight.dec();
        let Some(outcome) = outcome else {
            let client = connection(&self.pool).await?;
            forward::release(&client, &[(f.id, claimed.token)]).await.map_err(|e| store_error("forward release", e))?;
            return Ok(Ran::Released);
        };
        self.metrics.attempt(&outcome);
        let verdict = http::classify(&outcome);
        let (next, ran) = self.next(f, number, &verdict);
        let request = ForwardFinalise {
            forward: f.id,
            token: claimed.token,
            project_id: f.project_id,
            attempt_id: AttemptId::new(),
            number,
            next,
            last_error: last_error(&verdict, &outcome),
            attempt: record(&outcome, request_headers, self.clock.offset()),
            // As for Endpoints: an answer that asks for a retry is a failure; any other
            // answer, even a 4xx, shows the Destination is up.
            healthy: !matches!(verdict, Verdict::Retry { .. }),
        };
        let finalise_span = match trace {
            None => tracing::Span::none(),
            Some(_) => tracing::info_span!(target: traces::TARGET, parent: None, traces::span::FINALISE, railhook.forward_id = %f.id, railhook.outcome = ?ran),
        };
        traces::continue_from(&finalise_span, trace);
        let finalised = self.finalise(request).instrument(finalise_span).await?;
        if let Some(change) = finalised.circuit {
            tracing::info!(destination = %f.destination.id, %change, "circuit state changed");
            self.metrics.circuit_changes.with_label_values(&[change.as_str()]).inc();
        }
        if !finalised.wrote {
            self.metrics.fence_lost.inc();
            return Ok(Ran::FenceLost);
        }
        Ok(ran)
    }

    /// The Forward's next state after `verdict`: the incoming ladder's next step.
    fn next(&self, f: &ForwardToSend, number: i32, verdict: &Verdict) -> (Next, Ran) {
        match verdict {
            Verdict::Delivered => (Next::Success, Ran::Delivered),
            Verdict::Fail => (Next::Failed, Ran::Failed),
            Verdict::Retry { retry_after } => {
                let step = ladder::next_step(
                    self.clock.now(), number, f.max_attempts, &f.retry_delays, ladder::jitter(), *retry_after, self.retry_after_max, f.ladder_started_at, self.max_age,
                );
                match step {
                    Step::RetryAt(at) => (Next::RetryAt(at), Ran::Retrying),
                    Step::GiveUp(_) => (Next::Failed, Ran::Failed),
                }
            }
        }
    }

    /// The finalise, retried on connection trouble; giving up leaves the Forward PROCESSING
    /// for the stuck sweep (the Destination may then see it twice, same `Idempotency-Key`).
    async fn finalise(&self, request: ForwardFinalise) -> Result<ForwardFinalised, WorkerError> {
        let mut wait = Duration::from_millis(100);
        for _ in 0..6 {
            match self.finaliser.call(request.clone()).await {
                Ok(finalised) => return Ok(finalised),
                Err(e) => tracing::warn!(error = %error::chain(&e), forward = %request.forward, "forward finalise failed, retrying"),
            }
            tokio::time::sleep(wait).await;
            wait *= 2;
        }
        self.finaliser.call(request).await
    }
}

/// The Attempt as recorded; `request_headers` from [`recorded_headers`] (the Destination's
/// auth redacted); its start on the database's clock (`crate::clock`).
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

// ---- The consume loop ----------------------------------------------------------------------

/// A Forward announcement: the Forward and the scheduler's token; `None` for anything else.
pub fn parse_hint(key: &[u8], payload: &[u8]) -> Option<(ForwardId, Option<ClaimToken>)> {
    match Announcement::parse_keyed(key, payload) {
        Ok(Announcement { target: Target::Forward { forward, .. }, claim_token, .. }) => Some((forward, claim_token)),
        _ => None,
    }
}

fn subscribe(config: &Config) -> Result<StreamConsumer, WorkerError> {
    let topic = config.forwards_topic();
    let consumer: StreamConsumer = railhook_kafka::consumer_config(&config.kafka, &format!("{}.forwards", config.worker.group_id))
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("topic.metadata.refresh.interval.ms", "10000")
        .create()
        .map_err(|e| WorkerError::misconfigured("cannot create the Kafka consumer of Forwards", e))?;
    consumer.subscribe(&[&topic]).map_err(|e| WorkerError::misconfigured(format!("cannot subscribe to {topic}"), e))?;
    Ok(consumer)
}

/// Stores `offset`'s successor once the contiguous prefix moved (see `crate::Offsets`).
fn store_offset(consumer: &StreamConsumer, topic: &str, tracker: &mut OffsetTracker, partition: i32, offset: i64) {
    let Some(next) = tracker.done(partition, offset) else { return };
    let mut tpl = rdkafka::TopicPartitionList::new();
    if let Err(e) = tpl.add_partition_offset(topic, partition, rdkafka::Offset::Offset(next)).and_then(|()| consumer.store_offsets(&tpl)) {
        tracing::debug!(error = %e, partition, "cannot store a Forwards offset (partition revoked?)");
    }
}

/// The consume loop's state. With the inline transport there is no consumer: a hint's place
/// is (0, its sequence number) and the end of its claim step acknowledges it to the relay.
struct Consuming<'a> {
    consumer: Option<&'a StreamConsumer>,
    acks: railhook_kafka::inline::Pending,
    topic: String,
    tracker: OffsetTracker,
    forwarder: Arc<Forwarder>,
    permits: Arc<Semaphore>,
    done_tx: tokio::sync::mpsc::UnboundedSender<(i32, i64)>,
    tasks: JoinSet<()>,
    hard_stop: CancellationToken,
}

impl Consuming<'_> {
    fn done(&mut self, partition: i32, offset: i64) {
        match self.consumer {
            Some(consumer) => store_offset(consumer, &self.topic, &mut self.tracker, partition, offset),
            None => {
                self.acks.done(offset);
            }
        }
    }

    /// A message: a task for its Forward, under a permit (the loop reads only with one free).
    fn message(&mut self, m: &rdkafka::message::BorrowedMessage<'_>) {
        let (partition, offset) = (m.partition(), m.offset());
        self.tracker.started(partition, offset);
        let parsed = parse_hint(m.key().unwrap_or_default(), m.payload().unwrap_or_default());
        let trace = m.headers().and_then(|h| Announcement::trace_from_headers(h.iter().map(|h| (h.key, h.value))));
        self.hint(partition, offset, parsed, trace);
    }

    /// An announcement from this process's relay (the inline transport).
    fn inline(&mut self, inline: railhook_kafka::inline::InlineHint, seq: i64) {
        self.acks.taken(seq, inline.ack);
        let parsed = match inline.announcement.target {
            railhook_kafka::Target::Forward { forward, .. } => Some((forward, inline.announcement.claim_token)),
            railhook_kafka::Target::Delivery { .. } => None,
        };
        self.hint(0, seq, parsed, inline.announcement.trace);
    }

    fn hint(&mut self, partition: i32, offset: i64, parsed: Option<(ForwardId, Option<ClaimToken>)>, trace: Option<TraceContext>) {
        let Some((id, hint)) = parsed else {
            self.forwarder.metrics.bad_messages.inc();
            self.done(partition, offset);
            return;
        };
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            // Not reached: the loop reads only while a permit is free. Read again after a restart.
            return;
        };
        let (f, done, stop) = (self.forwarder.clone(), self.done_tx.clone(), self.hard_stop.clone());
        self.tasks.spawn(async move {
            let notify = move || {
                let _ = done.send((partition, offset));
            };
            if let Err(e) = f.run(id, hint, trace, notify, &stop).await {
                tracing::warn!(error = %error::chain(&e), forward = %id, "forward announcement failed");
            }
            drop(permit);
        });
    }
}

/// Consumes the forwards topic until `shutdown`, then drains: Attempts in flight get
/// `worker.shutdown_grace_ms`, then their Claims are given back; offsets are committed.
pub async fn run(
    config: Arc<Config>, forwarder: Arc<Forwarder>, mut inline: Option<tokio::sync::mpsc::Receiver<railhook_kafka::inline::InlineHint>>, shutdown: CancellationToken,
) -> Result<(), WorkerError> {
    let consumer = if inline.is_some() { None } else { Some(subscribe(&config)?) };
    let (mut seq, mut inline_open) = (0i64, inline.is_some());
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<(i32, i64)>();
    let mut c = Consuming {
        consumer: consumer.as_ref(),
        acks: Default::default(),
        topic: config.forwards_topic(),
        tracker: OffsetTracker::default(),
        forwarder,
        permits: Arc::new(Semaphore::new(config.worker.max_in_flight)),
        done_tx,
        tasks: JoinSet::new(),
        hard_stop: CancellationToken::new(),
    };
    tracing::info!(topic = %c.topic, "worker consuming Forwards");
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            Some((p, o)) = done_rx.recv() => c.done(p, o),
            Some(_) = c.tasks.join_next(), if !c.tasks.is_empty() => {}
            message = async { consumer.as_ref().expect("guarded").recv().await }, if consumer.is_some() && c.permits.available_permits() > 0 => match message {
                Ok(m) => c.message(&m),
                Err(e) => tracing::warn!(error = %e, "Kafka consumer error (Forwards)"),
            },
            hint = async { inline.as_mut().expect("guarded").recv().await }, if inline_open && c.permits.available_permits() > 0 => match hint {
                Some(h) => {
                    c.inline(h, seq);
                    seq += 1;
                }
                None => inline_open = false,
            },
        }
    }
    drain(&config, &mut c.tasks, &c.hard_stop).await;
    while let Ok((p, o)) = done_rx.try_recv() {
        c.done(p, o);
    }
    drop(c);
    let Some(consumer) = consumer else { return Ok(()) };
    // The final commit waits for the broker, and closing the consumer until it left the
    // group: both off the async threads.
    tokio::task::spawn_blocking(move || {
        match consumer.commit_consumer_state(CommitMode::Sync) {
            // Nothing consumed since the last commit.
            Ok(()) | Err(rdkafka::error::KafkaError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::NoOffset)) => {}
            Err(e) => tracing::warn!(error = %e, "final Forwards offset commit failed"),
        }
        drop(consumer);
    })
    .await
    .ok();
    Ok(())
}

async fn drain(config: &Config, tasks: &mut JoinSet<()>, hard_stop: &CancellationToken) {
    let grace = tokio::time::sleep(Duration::from_millis(config.worker.shutdown_grace_ms));
    tokio::pin!(grace);
    while !tasks.is_empty() {
        tokio::select! {
            _ = tasks.join_next() => {}
            _ = &mut grace, if !hard_stop.is_cancelled() => hard_stop.cancel(),
        }
    }
}

/// The Forwards' part of the worker's retry scheduler: one batch of due Forwards tokened and
/// announced; whether the batch came back full (the scheduler then loops at once).
pub async fn schedule(client: &deadpool_postgres::Object, config: &Config, metrics: &WorkerMetrics) -> bool {
    let reannounce_after_s = config.worker.retry_reannounce_after_seconds as f64;
    match forward::schedule_due(&***client, SCHEDULE_BATCH, SCHEDULE_PER_DESTINATION, SCHEDULE_PER_PROJECT, reannounce_after_s).await {
        Ok(n) => {
            metrics.forwards.scheduled.inc_by(n as u64);
            n as i64 == SCHEDULE_BATCH
        }
        Err(e) => {
            tracing::warn!(error = %e, "Forwards retry scheduler failed");
            false
        }
    }
}

/// The stuck and stranded sweeps of Forwards, every quarter of the shortest threshold
/// (between 250 ms and 30 s), until `shutdown`.
pub async fn sweep_loop(pool: railhook_store::Pool, config: Arc<Config>, metrics: ForwardMetrics, shutdown: CancellationToken) {
    let w = &config.worker;
    let every = Duration::from_millis((w.processing_timeout_seconds.min(w.stranded_after_seconds) * 1000 / 4).clamp(250, 30_000));
    loop {
        match pool.get().await {
            Ok(client) => match forward::sweep(&**client, w.processing_timeout_seconds as f64, w.stranded_after_seconds as f64, SWEEP_BATCH).await {
                Ok(s) => {
                    metrics.swept.with_label_values(&["processing_timeout"]).inc_by(s.stuck);
                    metrics.swept.with_label_values(&["stranded"]).inc_by(s.stranded);
                    if s.stuck + s.stranded > 0 {
                        tracing::info!(stuck = s.stuck, stranded = s.stranded, "sweeps announced Forwards again");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "Forwards sweep failed"),
            },
            Err(e) => tracing::warn!(error = %e, "Forwards sweep: no connection"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// Starts the Forwards' consume loop and sweeps (the worker's `run` spawns this); returns when
/// `shutdown` is cancelled and the Attempts in flight drained.
pub async fn serve(
    config: Arc<Config>, pool: railhook_store::Pool, sender: http::Sender, clock: crate::clock::DbClock, metrics: WorkerMetrics,
    inline: Option<tokio::sync::mpsc::Receiver<railhook_kafka::inline::InlineHint>>, shutdown: CancellationToken,
) -> Result<(), WorkerError> {
    let mut forwarder = Forwarder::new(&config, pool.clone(), sender, metrics.forwards.clone());
    forwarder.clock = clock;
    let forwarder = Arc::new(forwarder);
    let sweeps = tokio::spawn(sweep_loop(pool, config.clone(), metrics.forwards.clone(), shutdown.clone()));
    let result = run(config, forwarder, inline, shutdown).await;
    sweeps.await.ok();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_rfc_4648_vectors() {
        for (plain, encoded) in [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="), ("fooba", "Zm9vYmE="), ("foobar", "Zm9vYmFy")] {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
        assert_eq!(base64(b"Aladdin:open sesame"), "QWxhZGRpbjpvcGVuIHNlc2FtZQ==");
    }

    #[test]
    fn parses_forward_announcements_only() {
        let f = ForwardId::new();
        let dst = railhook_core::DestinationId::new().to_string();
        let v = serde_json::json!({"v": 1, "forward_id": f.to_string(), "reason": "created"}).to_string();
        assert_eq!(parse_hint(dst.as_bytes(), v.as_bytes()), Some((f, None)));
        let d = serde_json::json!({"v": 1, "delivery_id": railhook_core::DeliveryId::new().to_string(), "reason": "created"}).to_string();
        let ep = railhook_core::EndpointId::new().to_string();
        assert_eq!(parse_hint(ep.as_bytes(), d.as_bytes()), None);
        assert_eq!(parse_hint(dst.as_bytes(), b"\xff"), None);
    }
}
