//! Ingest pacing (issue 20): backpressure from the workers to `POST /v1/events`.
//!
//! The workers report how long a new Delivery would wait for work that is theirs to do
//! (`railhook_worker::queues::EndpointQueues::delivery_wait`: queues behind their own claims,
//! never behind a slow Endpoint or a limit), through Postgres `NOTIFY`
//! (`railhook_store::pacing`). This process `LISTEN`s on one connection and keeps the largest
//! report fresher than [`FRESH`]. To it, the API adds what it accepted since that report, at
//! the rate the report says the worker's requests end: a report is 50 ms old by the next, and 32
//! connections put a thousand Events in that time (issue 30's hot Endpoint overshot its
//! target before the next report said so). While that predicted wait is above
//! `api.ingest_hold_above_ms`, a POST waits before its statement until a report lets it go,
//! at most `api.ingest_max_hold_ms`; then it runs anyway. A report that a queue is a little
//! behind thus lets as many POSTs go as it can take before the hold bound, not every waiting
//! one at once. So the producers slow to what the workers deliver, as a Kafka
//! broker's quota delays its answers, and a burst does not queue seconds of Deliveries
//! behind itself. Nothing is refused, nothing accepted changes, no connection is held while
//! waiting. Without reports (no worker, workers idle or dead, the `LISTEN` connection down)
//! nothing is held; a wait above `api.ingest_hold_ignore_above_ms` (an outage's catch-up,
//! which holding cannot shorten) holds nothing either.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge};
use railhook_config::ApiConfig;
use railhook_store::pacing::{self, Report};
use railhook_telemetry::Metrics;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A worker's report counts this long (ten of its report intervals).
pub const FRESH: Duration = Duration::from_secs(1);

/// Worker processes remembered at most (the channel is open to any `NOTIFY`).
const MAX_INSTANCES: usize = 1_024;

/// How long after a lost `LISTEN` connection it is made again.
const RECONNECT: Duration = Duration::from_secs(1);

/// Holds POSTs while the workers are behind. Cloned into every request's state.
#[derive(Clone, Default)]
pub struct Pacer {
    inner: Option<Arc<Inner>>,
}

/// The largest fresh report, as a held POST reads it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Signal {
    /// The reported wait.
    wait: Duration,
    /// How fast that worker's requests end, Deliveries per second (0: not known, nothing added).
    per_s: u32,
    /// [`Inner::accepted`] when the report arrived.
    accepted_at: u64,
}

struct Inner {
    wait: watch::Receiver<Signal>,
    /// POSTs let go (held or not) since this process started.
    accepted: Arc<AtomicU64>,
    hold_above: Duration,
    max_hold: Duration,
    ignore_above: Duration,
    held: IntCounter,
    held_seconds: Histogram,
    holding: IntGauge,
}

impl Pacer {
    /// Holds nothing.
    pub fn off() -> Pacer {
        Pacer { inner: None }
    }

    /// Starts listening to the workers' reports (until `shutdown`) unless `api.ingest_pacing`
    /// is off.
    pub fn start(api: &ApiConfig, database_url: &str, metrics: &Metrics, shutdown: &CancellationToken) -> Pacer {
        if !api.ingest_pacing {
            return Pacer::off();
        }
        let held = IntCounter::new("railhook_api_ingest_held_total", "POST /v1/events held by ingest pacing (the workers were behind).").expect("valid metric");
        let held_seconds = Histogram::with_opts(
            HistogramOpts::new("railhook_api_ingest_held_seconds", "How long ingest pacing held a POST /v1/events.")
                .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
        )
        .expect("valid metric");
        let holding = IntGauge::new("railhook_api_ingest_holding", "POST /v1/events being held by ingest pacing now.").expect("valid metric");
        let wait_gauge = prometheus::Gauge::new("railhook_api_delivery_wait_seconds", "The workers' largest fresh delivery wait, as ingest pacing reads it.").expect("valid metric");
        for m in [Box::new(held.clone()) as Box<dyn prometheus::core::Collector>, Box::new(held_seconds.clone()), Box::new(wait_gauge.clone()), Box::new(holding.clone())] {
            if let Err(e) = metrics.registry().register(m) {
                tracing::debug!(error = %e, "ingest pacing metric not registered");
            }
        }
        let (tx, rx) = watch::channel(Signal::default());
        let accepted = Arc::new(AtomicU64::new(0));
        tokio::spawn(follow(database_url.to_string(), tx, accepted.clone(), wait_gauge, shutdown.clone()));
        Pacer {
            inner: Some(Arc::new(Inner {
                wait: rx,
                accepted,
                hold_above: Duration::from_millis(api.ingest_hold_above_ms),
                max_hold: Duration::from_millis(api.ingest_max_hold_ms),
                ignore_above: Duration::from_millis(api.ingest_hold_ignore_above_ms),
                held,
                held_seconds,
                holding,
            })),
        }
    }

    /// Waits while the workers are behind (see the module doc); returns at once otherwise.
    pub async fn hold(&self) {
        let Some(inner) = &self.inner else { return };
        let mut signal = inner.wait.clone();
        let mut since: Option<Instant> = None;
        loop {
            let s = *signal.borrow_and_update();
            let count = inner.accepted.load(Ordering::Acquire);
            if !inner.behind(&s, count) {
                // Counted as it goes, so the POSTs a report lets go stop at its bound.
                if inner.accepted.compare_exchange(count, count + 1, Ordering::AcqRel, Ordering::Acquire).is_err() {
                    continue;
                }
                break;
            }
            let start = *since.get_or_insert_with(|| {
                inner.holding.inc();
                Instant::now()
            });
            // Until the next report; the bound passed or the follower ended: go on.
            match tokio::time::timeout_at(start + inner.max_hold, signal.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) | Err(_) => {
                    inner.accepted.fetch_add(1, Ordering::AcqRel);
                    break;
                }
            }
        }
        if let Some(start) = since {
            inner.holding.dec();
            inner.held.inc();
            inner.held_seconds.observe(start.elapsed().as_secs_f64());
        }
    }
}

impl Inner {
    /// The reported wait plus what this process let go since the report, at the reported
    /// rate; behind while that is above the hold bound and the report within the ignore bound.
    fn behind(&self, s: &Signal, accepted: u64) -> bool {
        if s.wait > self.ignore_above || s.wait.is_zero() {
            return false;
        }
        let since = accepted.saturating_sub(s.accepted_at);
        let added = if s.per_s == 0 { Duration::ZERO } else { Duration::from_secs_f64(since as f64 / f64::from(s.per_s)) };
        s.wait + added > self.hold_above
    }
}

/// The reports' keeper: the largest fresh report into `current`, re-read on every report and
/// every quarter second (so a silent worker's last report ages out), with `accepted` as it was
/// when that report arrived.
async fn follow(url: String, current: watch::Sender<Signal>, accepted: Arc<AtomicU64>, gauge: prometheus::Gauge, shutdown: CancellationToken) {
    let (tx, mut reports) = mpsc::channel::<Report>(256);
    let listener = tokio::spawn(async move {
        loop {
            if let Err(e) = pacing::listen(&url, railhook_store::application::API_PACING, tx.clone()).await {
                tracing::warn!(error = %e, "ingest pacing: LISTEN connection lost; nothing is held until it is back");
            }
            if tx.is_closed() {
                return;
            }
            tokio::time::sleep(RECONNECT).await;
        }
    });
    let mut latest: HashMap<String, (Signal, Instant)> = HashMap::new();
    let mut tick = tokio::time::interval(FRESH / 4);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            report = reports.recv() => match report {
                Some(r) => {
                    if latest.len() < MAX_INSTANCES || latest.contains_key(&r.instance) {
                        let signal = Signal { wait: r.wait, per_s: r.per_s, accepted_at: accepted.load(Ordering::Acquire) };
                        tracing::debug!(instance = %r.instance, wait_ms = r.wait.as_millis() as u64, per_s = r.per_s, accepted = signal.accepted_at, "ingest pacing report");
                        latest.insert(r.instance, (signal, Instant::now()));
                    }
                }
                None => break,
            },
            _ = tick.tick() => {}
        }
        let now = Instant::now();
        latest.retain(|_, (_, at)| now.duration_since(*at) < FRESH);
        let signal = latest.values().map(|(s, _)| *s).max_by_key(|s| s.wait).unwrap_or_default();
        gauge.set(signal.wait.as_secs_f64());
        current.send_if_modified(|s| std::mem::replace(s, signal) != signal);
    }
    listener.abort();
}
