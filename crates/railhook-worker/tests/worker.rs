//! The worker end to end, against the real Postgres, Kafka and HTTP: ingest through the
//! store, the CDC relay, the worker, and a receiver on 127.0.0.1 that verifies signatures
//! with its own implementation of the Standard Webhooks scheme.

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
use railhook_testkit::relay::{Fixture, SubscriptionSpec};
use railhook_testkit::{eventually, test_config, TestDb};
use sha2::Sha256;
use tokio_util::sync::CancellationToken;

/// What the receiver does with the n-th request (0-based) to a path.
#[derive(Debug, Clone, Copy)]
enum Act {
    Status(u16),
    /// Waits, then answers.
    Slow(Duration, u16),
    /// Never answers.
    Hang,
    Redirect,
}

#[derive(Debug, Clone)]
struct Hit {
    path: String,
    headers: HeaderMap,
    body: Vec<u8>,
    at: Instant,
}

type Script = Arc<dyn Fn(&str, usize) -> Act + Send + Sync>;

#[derive(Clone)]
struct Receiver {
    hits: Arc<Mutex<Vec<Hit>>>,
    script: Script,
}

impl Receiver {
    async fn start(script: impl Fn(&str, usize) -> Act + Send + Sync + 'static) -> (Receiver, String) {
        let receiver = Receiver { hits: Arc::default(), script: Arc::new(script) };
        let app = axum::Router::new().route("/{*path}", axum::routing::post(receive)).with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (receiver, base)
    }

    fn hits(&self, path: &str) -> Vec<Hit> {
        self.hits.lock().unwrap().iter().filter(|h| h.path == path).cloned().collect()
    }
}

async fn receive(State(r): State<Receiver>, Path(path): Path<String>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let path = format!("/{path}");
    let n = {
        let mut hits = r.hits.lock().unwrap();
        let n = hits.iter().filter(|h| h.path == path).count();
        hits.push(Hit { path: path.clone(), headers, body: body.to_vec(), at: Instant::now() });
        n
    };
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
fn verifies(secret: &str, headers: &HeaderMap, body: &[u8]) -> bool {
    let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let key = base64::engine::general_purpose::STANDARD.decode(secret.strip_prefix("whsec_").unwrap()).unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{}.{}.", h("webhook-id"), h("webhook-timestamp")).as_bytes());
    mac.update(body);
    let expected = format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes()));
    h("webhook-signature").split(' ').any(|s| s == expected)
}

struct System {
    db: TestDb,
    config: Arc<Config>,
    client: tokio_postgres::Client,
    pool: railhook_store::Pool,
    relay: (CancellationToken, tokio::task::JoinHandle<Result<(), railhook_relay::RelayError>>),
    worker: Worker,
}

struct Worker {
    metrics: railhook_worker::WorkerMetrics,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), railhook_worker::WorkerError>>,
}

impl Worker {
    fn start(config: &Arc<Config>) -> Worker {
        let metrics = railhook_worker::WorkerMetrics::new();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(railhook_worker::run(config.clone(), metrics.clone(), shutdown.clone()));
        Worker { metrics, shutdown, task }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }
}

impl System {
    async fn start(tune: impl FnOnce(&mut Config)) -> System {
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
        let relay = tokio::spawn(railhook_relay::run(config.clone(), metrics.clone(), relay_stop.clone()));
        eventually(Duration::from_secs(60), "the relay stream to be live", || async {
            metrics.stats.live.load(Ordering::Relaxed).then_some(())
        })
        .await;
        let worker = Worker::start(&config);
        System { db, config, client, pool, relay: (relay_stop, relay), worker }
    }

    async fn status(&self, delivery: &str) -> (String, i32) {
        let id: railhook_core::DeliveryId = delivery.parse().unwrap();
        let row = self.client.query_one("SELECT status::text, attempt_count FROM deliveries WHERE id = $1", &[&id.0]).await.unwrap();
        (row.get(0), row.get(1))
    }

    async fn wait_status(&self, delivery: &str, want: &str, within: Duration) -> i32 {
        eventually(within, &format!("delivery {delivery} to be {want}"), || async {
            let (status, attempts) = self.status(delivery).await;
            (status == want).then_some(attempts)
        })
        .await
    }

    async fn attempts(&self, delivery: &str) -> Vec<(i32, Option<i32>, String)> {
        let id: railhook_core::DeliveryId = delivery.parse().unwrap();
        self.client
            .query("SELECT attempt_number, status_code, result FROM attempts WHERE delivery_id = $1 ORDER BY attempt_number, started_at", &[&id.0])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    }

    async fn stop(self) {
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

fn spec(delays: &[i32], max_attempts: i16, timeout_seconds: i16) -> SubscriptionSpec {
    SubscriptionSpec { max_attempts, timeout_seconds, retry_delays: Some(delays.to_vec()) }
}

#[tokio::test]
async fn the_happy_path_is_signed_and_verifies() {
    let (receiver, base) = Receiver::start(|_, _| Act::Status(200)).await;
    let sys = System::start(|_| {}).await;
    let (fixture, secrets) = Fixture::create_with(&sys.client, &[format!("{base}/ok")], &spec(&[1], 3, 5)).await;
    let delivery = fixture.ingest(&sys.pool, "order.created").await.remove(0);
    assert_eq!(sys.wait_status(&delivery, "SUCCESS", Duration::from_secs(30)).await, 1);
    let hits = receiver.hits("/ok");
    assert_eq!(hits.len(), 1, "exactly one arrival");
    let hit = &hits[0];
    assert!(verifies(&secrets[0], &hit.headers, &hit.body), "signature verifies: {:?}", hit.headers);
    assert_eq!(hit.headers["webhook-id"], delivery.as_str());
    assert_eq!(hit.headers["content-type"], "application/json");
    assert!(hit.headers["user-agent"].to_str().unwrap().starts_with("Railhook/"));
    assert!(hit.headers["x-event-id"].to_str().unwrap().starts_with("evt_"));
    let body: serde_json::Value = serde_json::from_slice(&hit.body).unwrap();
    assert_eq!(body["type"], "order.created");
    assert!(body["data"]["n"].is_string());
    assert_eq!(sys.attempts(&delivery).await, vec![(1, Some(200), "success".to_string())]);
    assert_eq!(sys.worker.metrics.claims_won.get(), 1);
    sys.stop().await;
}

#[tokio::test]
async fn a_500_then_a_200_retries_along_the_ladder() {
    let (receiver, base) = Receiver::start(|_, n| if n < 2 { Act::Status(500) } else { Act::Status(200) }).await;
    let sys = System::start(|_| {}).await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/flaky")], &spec(&[1, 1], 5, 5)).await;
    let delivery = fixture.ingest(&sys.pool, "order.created").await.remove(0);
    assert_eq!(sys.wait_status(&delivery, "SUCCESS", Duration::from_secs(30)).await, 3);
    let hits = receiver.hits("/flaky");
    assert_eq!(hits.len(), 3);
    // The ladder's 1 s, jittered to 0.5-1.5 s, plus the scheduler's interval.
    for pair in hits.windows(2) {
        let gap = pair[1].at - pair[0].at;
        assert!(gap >= Duration::from_millis(450) && gap < Duration::from_millis(3000), "gap {gap:?}");
        assert_eq!(pair[0].headers["webhook-id"], pair[1].headers["webhook-id"], "same webhook-id across retries");
    }
    let attempts = sys.attempts(&delivery).await;
    assert_eq!(attempts.iter().map(|a| (a.0, a.1)).collect::<Vec<_>>(), vec![(1, Some(500)), (2, Some(500)), (3, Some(200))]);
    sys.stop().await;
}

#[tokio::test]
async fn gone_bad_request_and_redirects_go_straight_to_failed_messages() {
    let (receiver, base) = Receiver::start(|path, _| match path {
        "/gone" => Act::Status(410),
        "/bad" => Act::Status(400),
        _ => Act::Redirect,
    })
    .await;
    let sys = System::start(|_| {}).await;
    let urls = [format!("{base}/gone"), format!("{base}/bad"), format!("{base}/moved")];
    let (fixture, _) = Fixture::create_with(&sys.client, &urls, &spec(&[1], 5, 5)).await;
    let deliveries = fixture.ingest(&sys.pool, "order.created").await;
    assert_eq!(deliveries.len(), 3);
    for d in &deliveries {
        assert_eq!(sys.wait_status(d, "FAILED", Duration::from_secs(30)).await, 1);
    }
    for path in ["/gone", "/bad", "/moved"] {
        assert_eq!(receiver.hits(path).len(), 1, "{path}: one arrival, no retry");
    }
    assert!(receiver.hits("/elsewhere").is_empty(), "the redirect was not followed");
    sys.stop().await;
}

#[tokio::test]
async fn a_timeout_is_retried() {
    let (receiver, base) = Receiver::start(|_, n| if n == 0 { Act::Hang } else { Act::Status(200) }).await;
    let sys = System::start(|_| {}).await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/slow")], &spec(&[1], 3, 1)).await;
    let delivery = fixture.ingest(&sys.pool, "order.created").await.remove(0);
    assert_eq!(sys.wait_status(&delivery, "SUCCESS", Duration::from_secs(30)).await, 2);
    assert_eq!(receiver.hits("/slow").len(), 2);
    let attempts = sys.attempts(&delivery).await;
    assert_eq!(attempts[0].2, "timeout");
    assert_eq!(attempts[1].1, Some(200));
    sys.stop().await;
}

/// Duplicate windows 4 and 5: the relay replays an announcement after a crash, or Kafka
/// redelivers one. Here the same announcement is produced again, twice, after the Delivery
/// succeeded, and a retry-path announcement with a stale scheduler token is produced too:
/// the Claim matches nothing, so the receiver sees exactly one request.
#[tokio::test]
async fn replayed_and_redelivered_announcements_claim_nothing() {
    let (receiver, base) = Receiver::start(|_, _| Act::Status(200)).await;
    let sys = System::start(|_| {}).await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/once")], &spec(&[1], 3, 5)).await;
    let delivery = fixture.ingest(&sys.pool, "order.created").await.remove(0);
    sys.wait_status(&delivery, "SUCCESS", Duration::from_secs(30)).await;
    let producer = railhook_kafka::idempotent_producer(&sys.config.kafka, 100).unwrap();
    let endpoint = fixture.endpoints[0].to_string();
    let replay = serde_json::json!({"v": 1, "delivery_id": delivery, "reason": "created", "outbox_id": 1, "created_at": "x"}).to_string();
    let stale = serde_json::json!({"v": 1, "delivery_id": delivery, "reason": "retry", "outbox_id": 2, "created_at": "x", "claim_token": uuid::Uuid::new_v4().to_string()}).to_string();
    for value in [&replay, &replay, &stale] {
        producer
            .send(rdkafka::producer::FutureRecord::to(&sys.config.deliveries_topic()).key(&endpoint).payload(value), Duration::from_secs(10))
            .await
            .unwrap();
    }
    let won = sys.worker.metrics.claims_won.get();
    eventually(Duration::from_secs(30), "the three duplicates to be consumed", || async {
        (sys.worker.metrics.claims_lost.get() >= 3).then_some(())
    })
    .await;
    assert_eq!(sys.worker.metrics.claims_won.get(), won);
    assert_eq!(receiver.hits("/once").len(), 1, "exactly one arrival");
    sys.stop().await;
}

/// Duplicate window 7: a stalled Attempt's Delivery is swept back to PENDING and delivered
/// by another run; when the stalled one finally finishes (with a 500), its finalise finds
/// the Claim gone and queues no successor. Two arrivals (window 8: the receiver dedupes by
/// webhook-id), one outcome, no third request.
#[tokio::test]
async fn a_swept_attempt_that_finishes_late_queues_no_successor() {
    let (receiver, base) = Receiver::start(|_, n| if n == 0 { Act::Slow(Duration::from_secs(4), 500) } else { Act::Status(200) }).await;
    let sys = System::start(|c| c.worker.processing_timeout_seconds = 1).await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/stall")], &spec(&[1], 5, 10)).await;
    let delivery = fixture.ingest(&sys.pool, "order.created").await.remove(0);
    sys.wait_status(&delivery, "SUCCESS", Duration::from_secs(30)).await;
    eventually(Duration::from_secs(30), "the stalled Attempt to finish and lose its fence", || async {
        (sys.worker.metrics.fence_lost.get() == 1).then_some(())
    })
    .await;
    let (status, attempt_count) = sys.status(&delivery).await;
    assert_eq!((status.as_str(), attempt_count), ("SUCCESS", 1), "the late 500 changed nothing");
    let id: railhook_core::DeliveryId = delivery.parse().unwrap();
    let next: Option<chrono::DateTime<chrono::Utc>> = sys.client.query_one("SELECT next_retry_at FROM deliveries WHERE id = $1", &[&id.0]).await.unwrap().get(0);
    assert_eq!(next, None, "no successor queued");
    let hits = receiver.hits("/stall");
    assert_eq!(hits.len(), 2);
    assert_eq!(hits[0].headers["webhook-id"], hits[1].headers["webhook-id"]);
    // Both Attempts are on record: the late 500 and the 200.
    let mut codes: Vec<Option<i32>> = sys.attempts(&delivery).await.iter().map(|a| a.1).collect();
    codes.sort();
    assert_eq!(codes, vec![Some(200), Some(500)]);
    sys.stop().await;
}

/// 6.6: an endpoint that never answers shares the only partition with a healthy one; the
/// healthy endpoint's deliveries are not held up behind it.
#[tokio::test]
async fn a_dead_endpoint_does_not_delay_a_healthy_one_on_its_partition() {
    let (receiver, base) = Receiver::start(|path, _| if path == "/dead" { Act::Hang } else { Act::Status(200) }).await;
    let sys = System::start(|_| {}).await;
    let urls = [format!("{base}/dead"), format!("{base}/healthy")];
    let (fixture, _) = Fixture::create_with(&sys.client, &urls, &spec(&[60], 3, 10)).await;
    let mut healthy = Vec::new();
    let mut created = HashMap::new();
    for _ in 0..20 {
        let started = Instant::now();
        let ids = fixture.ingest(&sys.pool, "order.created").await;
        for d in ids {
            created.insert(d.clone(), started);
            healthy.push(d);
        }
    }
    // Every healthy Delivery arrives while the dead endpoint's 20 Attempts hang.
    eventually(Duration::from_secs(30), "the healthy endpoint's 20 deliveries", || async {
        (receiver.hits("/healthy").len() >= 20).then_some(())
    })
    .await;
    let dead_hits = receiver.hits("/dead");
    let first = created.values().min().copied().unwrap();
    let last_healthy = receiver.hits("/healthy").iter().map(|h| h.at).max().unwrap();
    let spread = last_healthy - first;
    eprintln!("isolation: 20 healthy deliveries done {spread:?} after the first event, while {} Attempts to the dead endpoint hung", dead_hits.len());
    assert!(dead_hits.len() >= 10, "the dead endpoint's Attempts were running meanwhile");
    assert!(spread < Duration::from_secs(5), "healthy deliveries took {spread:?}");
    sys.stop().await;
}
