//! The worker's end-to-end harness: a System (a test database, the CDC relay and a worker
//! in this process) and a Receiver on 127.0.0.1 that records what it was sent, answers as a
//! test scripts it, and verifies signatures with its own Standard Webhooks implementation.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use hmac::{Hmac, Mac};
use railhook_config::Config;
use railhook_testkit::relay::SubscriptionSpec;
use railhook_testkit::{eventually, test_config, TestDb};
use sha2::Sha256;
use tokio_util::sync::CancellationToken;

/// What the receiver does with the n-th request (0-based) to a path.
#[derive(Debug, Clone, Copy)]
pub enum Act {
    Status(u16),
    /// Waits, then answers.
    Slow(Duration, u16),
    /// Never answers.
    Hang,
    Redirect,
}

#[derive(Debug, Clone)]
pub struct Hit {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub at: Instant,
}

pub type Script = Arc<dyn Fn(&str, usize) -> Act + Send + Sync>;

#[derive(Clone)]
pub struct Receiver {
    pub hits: Arc<Mutex<Vec<Hit>>>,
    /// Requests whose body contains one of these answer 500, whatever the script says.
    pub poison: Arc<Mutex<Vec<String>>>,
    pub script: Script,
    /// Requests being answered now, and the most at once: overall and per path.
    pub concurrency: Arc<Mutex<HashMap<String, (usize, usize)>>>,
}

/// Counts a request in flight until dropped.
pub struct InFlight(Arc<Mutex<HashMap<String, (usize, usize)>>>, String);

impl InFlight {
    pub fn enter(map: &Arc<Mutex<HashMap<String, (usize, usize)>>>, path: &str) -> [InFlight; 2] {
        let mut m = map.lock().unwrap();
        for key in ["*", path] {
            let e = m.entry(key.to_string()).or_default();
            e.0 += 1;
            e.1 = e.1.max(e.0);
        }
        [InFlight(map.clone(), "*".into()), InFlight(map.clone(), path.into())]
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.lock().unwrap().get_mut(&self.1).unwrap().0 -= 1;
    }
}

impl Receiver {
    pub async fn start(script: impl Fn(&str, usize) -> Act + Send + Sync + 'static) -> (Receiver, String) {
        let receiver = Receiver { hits: Arc::default(), poison: Arc::default(), script: Arc::new(script), concurrency: Arc::default() };
        let app = axum::Router::new().route("/{*path}", axum::routing::post(receive)).with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (receiver, base)
    }

    pub fn hits(&self, path: &str) -> Vec<Hit> {
        self.hits.lock().unwrap().iter().filter(|h| h.path == path).cloned().collect()
    }

    pub fn all_hits(&self) -> usize {
        self.hits.lock().unwrap().len()
    }

    /// (in flight now, most at once) for a path, or "*" for all.
    pub fn concurrency(&self, key: &str) -> (usize, usize) {
        self.concurrency.lock().unwrap().get(key).copied().unwrap_or_default()
    }
}

pub async fn receive(State(r): State<Receiver>, Path(path): Path<String>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let path = format!("/{path}");
    let n = {
        let mut hits = r.hits.lock().unwrap();
        let n = hits.iter().filter(|h| h.path == path).count();
        hits.push(Hit { path: path.clone(), headers, body: body.to_vec(), at: Instant::now() });
        n
    };
    let _in_flight = InFlight::enter(&r.concurrency, &path);
    let text = String::from_utf8_lossy(&body);
    if r.poison.lock().unwrap().iter().any(|p| text.contains(p.as_str())) {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    match (r.script)(&path, n) {
        Act::Status(s) => StatusCode::from_u16(s).unwrap().into_response(),
        Act::Slow(d, s) => {
            tokio::time::sleep(d).await;
            StatusCode::from_u16(s).unwrap().into_response()
        }
        Act::Hang => {
            std::future::pending::<()>().await;
            unreachable!()
        }
        Act::Redirect => (StatusCode::FOUND, [("location", "/elsewhere")]).into_response(),
    }
}

/// Standard Webhooks verification, written from the spec: HMAC-SHA256 keyed with the base64
/// after `whsec_`, over `{id}.{timestamp}.{body}`, sent as space-separated `v1,<base64>`.
pub fn verifies(secret: &str, headers: &HeaderMap, body: &[u8]) -> bool {
    let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let key = base64::engine::general_purpose::STANDARD.decode(secret.strip_prefix("whsec_").unwrap()).unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{}.{}.", h("webhook-id"), h("webhook-timestamp")).as_bytes());
    mac.update(body);
    let expected = format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes()));
    h("webhook-signature").split(' ').any(|s| s == expected)
}

pub struct System {
    pub db: TestDb,
    pub config: Arc<Config>,
    pub client: tokio_postgres::Client,
    pub pool: railhook_store::Pool,
    pub relay: (CancellationToken, tokio::task::JoinHandle<Result<(), railhook_relay::RelayError>>),
    pub relay_metrics: railhook_relay::RelayMetrics,
    pub worker: Worker,
}

pub struct Worker {
    pub metrics: railhook_worker::WorkerMetrics,
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<Result<(), railhook_worker::WorkerError>>,
}

/// The transport the tests run with: `RAILHOOK_TEST_TRANSPORT=inline` runs every [`System`]
/// that does not ask for Kafka itself with the inline transport (the relay hands its
/// announcements to the worker through `railhook_kafka::inline`'s channel); anything else,
/// Kafka. `scripts/test` runs this crate's end-to-end tests in both.
pub fn transport_from_env() -> railhook_config::TransportKind {
    match std::env::var("RAILHOOK_TEST_TRANSPORT").as_deref() {
        Ok("inline") => railhook_config::TransportKind::Inline,
        _ => railhook_config::TransportKind::Kafka,
    }
}

impl Worker {
    /// A worker on Kafka (also a second one beside a [`System`]'s).
    pub fn start(config: &Arc<Config>) -> Worker {
        Worker::start_with(config, None)
    }

    /// A worker on `inline`'s channel (the inline transport), or on Kafka.
    pub fn start_with(config: &Arc<Config>, inline: Option<railhook_kafka::inline::InlineReceivers>) -> Worker {
        let metrics = railhook_worker::WorkerMetrics::new();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(railhook_worker::run_with(config.clone(), metrics.clone(), inline, shutdown.clone()));
        Worker { metrics, shutdown, task }
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }

    /// A stand-in that is already stopped (for a test that stopped the real one itself).
    pub fn start_paused() -> Worker {
        let shutdown = CancellationToken::new();
        Worker { metrics: railhook_worker::WorkerMetrics::new(), shutdown, task: tokio::spawn(async { Ok(()) }) }
    }
}

impl System {
    /// A relay and a worker on the transport of [`transport_from_env`].
    pub async fn start(tune: impl FnOnce(&mut Config)) -> System {
        System::start_on(transport_from_env(), tune).await
    }

    /// On Kafka whatever the environment says: for tests of what only Kafka has (a second
    /// worker in the consumer group, a worker restarted on its own).
    pub async fn start_kafka(tune: impl FnOnce(&mut Config)) -> System {
        System::start_on(railhook_config::TransportKind::Kafka, tune).await
    }

    pub async fn start_on(transport: railhook_config::TransportKind, tune: impl FnOnce(&mut Config)) -> System {
        let db = TestDb::new().await;
        let mut config = test_config(&db);
        config.relay.status_interval_ms = 200;
        config.kafka.partitions = 1;
        config.worker.scheduler_interval_ms = 100;
        tune(&mut config);
        let mut telemetry = config.telemetry.clone();
        telemetry.log_filter = std::env::var("RAILHOOK_TEST_LOG").unwrap_or_else(|_| "warn".into());
        railhook_telemetry::init_tracing(&telemetry);
        let config = Arc::new(config);
        let client = db.client().await;
        let pool = railhook_store::build_pool(&config.database).unwrap();
        let metrics = railhook_relay::RelayMetrics::new(Arc::new(railhook_relay::RelayStats::default()));
        let relay_stop = CancellationToken::new();
        let (inline_tx, inline_rx) = match transport {
            railhook_config::TransportKind::Inline => {
                let (tx, rx) = railhook_kafka::inline::channel(config.worker.max_in_flight);
                (Some(tx), Some(rx))
            }
            railhook_config::TransportKind::Kafka => (None, None),
        };
        let relay = tokio::spawn(railhook_relay::run_with(config.clone(), metrics.clone(), inline_tx, relay_stop.clone()));
        eventually(Duration::from_secs(60), "the relay stream to be live", || async {
            metrics.stats.live.load(Ordering::Relaxed).then_some(())
        })
        .await;
        let worker = Worker::start_with(&config, inline_rx);
        System { db, config, client, pool, relay: (relay_stop, relay), relay_metrics: metrics, worker }
    }

    pub async fn status(&self, delivery: &str) -> (String, i32) {
        let id: railhook_core::DeliveryId = delivery.parse().unwrap();
        let row = self.client.query_one("SELECT status::text, attempt_count FROM deliveries WHERE id = $1", &[&id.0]).await.unwrap();
        (row.get(0), row.get(1))
    }

    pub async fn wait_status(&self, delivery: &str, want: &str, within: Duration) -> i32 {
        eventually(within, &format!("delivery {delivery} to be {want}"), || async {
            let (status, attempts) = self.status(delivery).await;
            (status == want).then_some(attempts)
        })
        .await
    }

    pub async fn attempts(&self, delivery: &str) -> Vec<(i32, Option<i32>, String)> {
        let id: railhook_core::DeliveryId = delivery.parse().unwrap();
        self.client
            .query("SELECT attempt_number, status_code, result FROM attempts WHERE delivery_id = $1 ORDER BY attempt_number, started_at", &[&id.0])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    }

    pub async fn stop(self) {
        self.worker.stop().await;
        self.relay.0.cancel();
        self.relay.1.await.unwrap().unwrap();
        let name = self.config.relay.slot_name.clone();
        eventually(Duration::from_secs(30), "the slot to be dropped", || {
            let (client, name) = (&self.client, &name);
            async move { client.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", &[name]).await.ok().map(|_| ()) }
        })
        .await;
        drop(self.db);
    }
}

pub fn spec(delays: &[i32], max_attempts: i16, timeout_seconds: i16) -> SubscriptionSpec {
    SubscriptionSpec { max_attempts, timeout_seconds, retry_delays: Some(delays.to_vec()), ordering: false }
}

pub async fn count(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get(0)
}
