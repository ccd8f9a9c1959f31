//! Forwards end to end, against the real Postgres, Kafka and HTTP: the ingress's statement
//! (`railhook_store::incoming::receive`, what `POST /ingress/{token}` runs once the provider's
//! signature verified), the CDC relay, the worker's Forwards loop, and receivers on 127.0.0.1
//! that record what they were sent. Each auth kind is checked at the receiver (the Standard
//! Webhooks re-signing with this file's own verifier); an outage of 2 minutes; kill -9 of a
//! worker process; retry and replay.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use railhook_config::Config;
use tokio_util::sync::CancellationToken;

use common::*;
use railhook_core::{DestinationId, ForwardId, IncomingEventId, ProjectId, SourceId};
use railhook_store::incoming::{self, NewIncomingEvent, Received, StoredHeader};
use railhook_store::lifecycle::forward::{self, ForwardRetryOutcome, ForwardSelection, ReplayOutcome};
use railhook_store::sources::{self, DestinationAuth, NewDestination, NewSource};
use railhook_testkit::eventually;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A project and a Source (GitHub) in the System's database.
async fn source(sys_pool: &railhook_store::Pool) -> (ProjectId, SourceId) {
    let client = sys_pool.get().await.unwrap();
    let org = railhook_store::tenancy::create_organization(&**client, "acme").await.unwrap();
    let project = railhook_store::tenancy::create_project(&**client, org.id, "shop").await.unwrap().unwrap();
    let new = NewSource { name: "gh", provider: "github", config: None, secret: "s3cret", enabled: true, rate_limit_per_second: None };
    let src = sources::create_source(&**client, project.id, new).await.unwrap();
    (project.id, src.id)
}

async fn destination(pool: &railhook_store::Pool, project: ProjectId, source: SourceId, url: &str, auth: DestinationAuth) -> DestinationId {
    let client = pool.get().await.unwrap();
    let new = NewDestination { url, auth: &auth, enabled: true, rate_limit_per_second: None };
    sources::create_destination(&**client, project, source, new).await.unwrap().unwrap().id
}

/// Stores a request as the ingress does; its Incoming Event and Forwards.
async fn ingress(pool: &railhook_store::Pool, project: ProjectId, source: SourceId, headers: &[(&str, &[u8])], body: &[u8], content_type: Option<&str>) -> (IncomingEventId, Vec<(ForwardId, DestinationId)>) {
    let client = pool.get().await.unwrap();
    let stored: Vec<StoredHeader> = headers.iter().map(|(n, v)| StoredHeader::new(n, v)).collect();
    let event_id = uuid::Uuid::new_v4().to_string();
    let new = NewIncomingEvent { project, source, provider_event_id: Some(&event_id), method: "POST", headers: &stored, body, content_type, trace: None };
    match incoming::receive(&client, new).await.unwrap() {
        Received::Stored { id, forwards, .. } => (id, forwards),
        other => panic!("{other:?}"),
    }
}

async fn forward_status(client: &tokio_postgres::Client, id: ForwardId) -> (String, i32) {
    let row = client.query_one("SELECT status::text, attempt_count FROM forwards WHERE id = $1", &[&id.0]).await.unwrap();
    (row.get(0), row.get(1))
}

async fn wait_forward(client: &tokio_postgres::Client, id: ForwardId, want: &str, within: Duration) -> i32 {
    eventually(within, &format!("forward {id} to be {want}"), || async {
        let (status, attempts) = forward_status(client, id).await;
        (status == want).then_some(attempts)
    })
    .await
}

fn header<'a>(hit: &'a Hit, name: &str) -> Option<&'a str> {
    hit.headers.get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn forwards_carry_the_exact_request_the_allow_listed_headers_and_each_auth() {
    let (receiver, base) = Receiver::start(|_, _| Act::Status(200)).await;
    let sys = System::start(|_| {}).await;
    let (project, src) = source(&sys.pool).await;
    let auths = [
        ("none", DestinationAuth::None),
        ("basic", DestinationAuth::Basic { username: "ali".into(), password: "open: sesame".into() }),
        ("bearer", DestinationAuth::Bearer { token: "tok-123".into() }),
        ("header", DestinationAuth::Header { name: "X-Api-Key".into(), value: "k-456".into() }),
        ("sw", DestinationAuth::StandardWebhooks { secret: SECRET.into() }),
    ];
    for (path, auth) in &auths {
        destination(&sys.pool, project, src, &format!("{base}/{path}"), auth.clone()).await;
    }
    // Not UTF-8, with a NUL and a CRLF: must arrive byte for byte.
    let body: &[u8] = b"payload=\xff\x00\r\n{\"a\": 1}";
    let headers: &[(&str, &[u8])] = &[
        ("X-GitHub-Event", b"push"),
        ("X-GitHub-Delivery", b"72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        ("X-Hub-Signature-256", b"sha256=abc"),
        ("webhook-id", b"msg_original"),
        ("User-Agent", b"GitHub-Hookshot/044aadd"),
        ("Cookie", b"session=secret"),
        ("X-Forwarded-For", b"203.0.113.9"),
        ("Authorization", b"Bearer provider-token"),
    ];
    let ct = "application/x-www-form-urlencoded; charset=utf-8";
    let (ine, forwards) = ingress(&sys.pool, project, src, headers, body, Some(ct)).await;
    assert_eq!(forwards.len(), 5);
    for (id, _) in &forwards {
        assert_eq!(wait_forward(&sys.client, *id, "SUCCESS", Duration::from_secs(60)).await, 1);
    }
    for (path, auth) in &auths {
        let hits = receiver.hits(&format!("/{path}"));
        assert_eq!(hits.len(), 1, "{path}: one arrival");
        let hit = &hits[0];
        assert_eq!(hit.body, body, "{path}: the exact body bytes");
        assert_eq!(header(hit, "content-type"), Some(ct), "{path}");
        assert_eq!(header(hit, "x-github-event"), Some("push"));
        assert_eq!(header(hit, "x-github-delivery"), Some("72d3162e-cc78-11e3-81ab-4c9367dc0958"));
        assert_eq!(header(hit, "x-hub-signature-256"), Some("sha256=abc"));
        assert_eq!(header(hit, "x-incoming-event-id"), Some(ine.to_string().as_str()));
        assert_eq!(header(hit, "x-forward-attempt"), Some("1"));
        let key = header(hit, "idempotency-key").unwrap();
        assert!(forwards.iter().any(|(f, _)| f.to_string() == key), "{path}: Idempotency-Key is a Forward id: {key}");
        assert!(header(hit, "user-agent").unwrap().starts_with("Railhook/"), "{path}: the provider's User-Agent is not forwarded");
        assert_eq!(header(hit, "cookie"), None);
        assert_eq!(header(hit, "x-forwarded-for"), None);
        match auth {
            DestinationAuth::None => assert_eq!(header(hit, "authorization"), None),
            DestinationAuth::Basic { .. } => assert_eq!(header(hit, "authorization"), Some("Basic YWxpOm9wZW46IHNlc2FtZQ==")),
            DestinationAuth::Bearer { .. } => assert_eq!(header(hit, "authorization"), Some("Bearer tok-123")),
            DestinationAuth::Header { .. } => {
                assert_eq!(header(hit, "x-api-key"), Some("k-456"));
                assert_eq!(header(hit, "authorization"), None);
            }
            DestinationAuth::StandardWebhooks { secret } => {
                assert_eq!(header(hit, "webhook-id"), Some(key), "webhook-id is the Forward id");
                assert!(verifies(secret, &hit.headers, &hit.body), "the re-signed request verifies: {:?}", hit.headers);
                assert_eq!(hit.headers.get_all("webhook-id").iter().count(), 1, "the provider's webhook-id is replaced");
            }
        }
        if !matches!(auth, DestinationAuth::StandardWebhooks { .. }) {
            assert_eq!(header(hit, "webhook-id"), Some("msg_original"), "{path}: not re-signed: the provider's webhook-id goes through");
        }
    }
    let attempts = sys.worker.metrics.forwards.attempts.with_label_values(&["success", "2xx"]).get();
    assert_eq!(attempts, 5);
    sys.stop().await;
}

/// Which Forwards reached the receiver with a 2xx answer, by Idempotency-Key.
fn keys(receiver: &Receiver) -> std::collections::HashMap<String, usize> {
    let mut seen = std::collections::HashMap::new();
    for hit in receiver.hits.lock().unwrap().iter() {
        if let Some(key) = header(hit, "idempotency-key") {
            *seen.entry(key.to_string()).or_insert(0) += 1;
        }
    }
    seen
}

/// A receiver on a fixed address (for a Destination that comes up later).
async fn receiver_at(addr: std::net::SocketAddr) -> Receiver {
    let receiver = Receiver { hits: Arc::default(), poison: Arc::default(), script: Arc::new(|_, _| Act::Status(200)), concurrency: Arc::default() };
    let app = axum::Router::new().route("/{*path}", axum::routing::post(common::receive)).with_state(receiver.clone());
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    receiver
}

#[tokio::test]
async fn a_destination_down_for_two_minutes_receives_everything_afterwards() {
    // A port nobody listens on for the outage: connection refused, retried on the ladder.
    // Below the ephemeral range, so no outgoing connection holds it when it is bound later.
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], railhook_testkit::free_port()));
    // The incoming ladder shortened by configuration (10 s waits, 31 Attempts: at least
    // 150 s of retries, longer than the outage). The Destination's circuit opens on the first
    // failures; with a 5 s cool-down its probe finds the Destination back within 5 s.
    let sys = System::start(|c| {
        c.worker.incoming_retry_delays_seconds = vec![10; 30];
        c.worker.circuit_cooldown_seconds = 5;
    })
    .await;
    let (project, src) = source(&sys.pool).await;
    for path in ["a", "b"] {
        destination(&sys.pool, project, src, &format!("http://{addr}/{path}"), DestinationAuth::None).await;
    }
    let started = Instant::now();
    let mut forwards = Vec::new();
    let mut bodies = Vec::new();
    for n in 0..20 {
        let body = format!("{{\"n\": {n}}}");
        forwards.extend(ingress(&sys.pool, project, src, &[("X-GitHub-Event", b"push")], body.as_bytes(), Some("application/json")).await.1);
        bodies.push(body);
    }
    eventually(Duration::from_secs(60), "every Forward to have failed once", || async {
        let failed: i64 = sys.client.query_one("SELECT count(*) FROM forwards WHERE attempt_count >= 1 AND status = 'PENDING'", &[]).await.unwrap().get(0);
        (failed == 40).then_some(())
    })
    .await;
    tokio::time::sleep_until((started + Duration::from_secs(120)).into()).await;
    let receiver = receiver_at(addr).await;
    let up = Instant::now();
    for (id, _) in &forwards {
        wait_forward(&sys.client, *id, "SUCCESS", Duration::from_secs(90)).await;
    }
    let caught_up = up.elapsed();
    // At most one wait of the ladder (15 s jittered) after the Destination came up: no
    // announcement was lost to the retry scheduler's 30 s re-announcement.
    assert!(caught_up < Duration::from_secs(25), "caught up after {caught_up:?}");
    let seen = keys(&receiver);
    for (id, _) in &forwards {
        assert!(seen.contains_key(&id.to_string()), "{id} arrived");
    }
    for path in ["/a", "/b"] {
        let mut got: Vec<String> = receiver.hits(path).iter().map(|h| String::from_utf8(h.body.clone()).unwrap()).collect();
        got.sort();
        got.dedup();
        let mut want = bodies.clone();
        want.sort();
        assert_eq!(got, want, "{path}: every body");
    }
    let attempts: i64 = sys.client.query_one("SELECT count(*) FROM attempts WHERE forward_id IS NOT NULL", &[]).await.unwrap().get(0);
    let last = sys
        .client
        .query(
            "SELECT f.id::text, a.attempt_number, a.started_at::text, a.result, a.duration_ms FROM attempts a JOIN forwards f ON f.id = a.forward_id
             WHERE f.id = (SELECT forward_id FROM attempts WHERE forward_id IS NOT NULL ORDER BY started_at DESC LIMIT 1) ORDER BY a.attempt_number",
            &[],
        )
        .await
        .unwrap();
    for r in &last {
        println!("slowest: {} #{} {} {} {} ms", r.get::<_, String>(0), r.get::<_, i32>(1), r.get::<_, String>(2), r.get::<_, String>(3), r.get::<_, i32>(4));
    }
    let claims = &sys.worker.metrics.forwards.claims;
    let outcomes: Vec<(&str, u64)> = ["claimed", "nothing", "missing", "unseen_retry"].iter().map(|o| (*o, claims.with_label_values(&[o]).get())).collect();
    println!("claims: {outcomes:?}");
    println!("outage: 40 Forwards, {attempts} Attempts, {} arrivals, all delivered {caught_up:?} after the Destination came up", receiver.all_hits());
    sys.stop().await;
}

const CHILD_CONFIG: &str = "RAILHOOK_FORWARDS_TEST_CHILD_CONFIG";

/// Not a test: the worker process `a_worker_killed_with_sigkill_loses_no_forward` starts
/// (this test binary run again with only this function and its configuration).
#[tokio::test]
#[ignore = "a worker process started by a_worker_killed_with_sigkill_loses_no_forward"]
async fn worker_process() {
    let Ok(text) = std::env::var(CHILD_CONFIG) else { return };
    let config: Config = serde_json::from_str(&text).unwrap();
    railhook_worker::run(Arc::new(config), railhook_worker::WorkerMetrics::new(), CancellationToken::new()).await.unwrap();
}

fn worker_process_start(config: &Config) -> tokio::process::Child {
    tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "worker_process", "--ignored", "--nocapture", "--test-threads", "1"])
        .env(CHILD_CONFIG, serde_json::to_string(config).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn a_worker_killed_with_sigkill_loses_no_forward() {
    let (receiver, base) = Receiver::start(|_, _| Act::Slow(Duration::from_millis(300), 200)).await;
    let mut sys = System::start_kafka(|c| c.worker.processing_timeout_seconds = 5).await;
    // The in-process worker leaves: the worker here is a process of its own.
    std::mem::replace(&mut sys.worker, Worker::start_paused()).stop().await;
    let (project, src) = source(&sys.pool).await;
    for path in ["a", "b"] {
        destination(&sys.pool, project, src, &format!("{base}/{path}"), DestinationAuth::None).await;
    }
    let mut forwards = Vec::new();
    for n in 0..40 {
        forwards.extend(ingress(&sys.pool, project, src, &[], format!("before {n}").as_bytes(), None).await.1);
    }
    let mut child = worker_process_start(&sys.config);
    eventually(Duration::from_secs(60), "Forwards in flight", || async { (receiver.all_hits() >= 10).then_some(()) }).await;
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let processing: i64 = sys.client.query_one("SELECT count(*) FROM forwards WHERE status = 'PROCESSING'", &[]).await.unwrap().get(0);
    let done: i64 = sys.client.query_one("SELECT count(*) FROM forwards WHERE status = 'SUCCESS'", &[]).await.unwrap().get(0);
    // More arrive while no worker runs.
    for n in 0..20 {
        forwards.extend(ingress(&sys.pool, project, src, &[], format!("after {n}").as_bytes(), None).await.1);
    }
    let mut child = worker_process_start(&sys.config);
    for (id, _) in &forwards {
        wait_forward(&sys.client, *id, "SUCCESS", Duration::from_secs(180)).await;
    }
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let seen = keys(&receiver);
    for (id, _) in &forwards {
        assert!(seen.contains_key(&id.to_string()), "{id} arrived");
    }
    let duplicates: usize = seen.values().map(|n| n - 1).sum();
    println!("kill -9: {} Forwards, {processing} PROCESSING and {done} SUCCESS at the kill, {} arrivals, {duplicates} duplicates", forwards.len(), receiver.all_hits());
    assert!(processing > 0, "the kill hit Forwards in flight");
    sys.stop().await;
}

#[tokio::test]
async fn a_failed_forward_is_retried_and_an_incoming_event_replayed() {
    // First request to /flaky: 400 (failed at once); then 200. /down: always 400.
    let (receiver, base) = Receiver::start(|path, n| if path == "/down" || n == 0 { Act::Status(400) } else { Act::Status(200) }).await;
    let sys = System::start(|_| {}).await;
    let (project, src) = source(&sys.pool).await;
    let flaky = destination(&sys.pool, project, src, &format!("{base}/flaky"), DestinationAuth::None).await;
    let (ine, forwards) = ingress(&sys.pool, project, src, &[], b"one", Some("text/plain")).await;
    let first = forwards[0].0;
    assert_eq!(wait_forward(&sys.client, first, "FAILED", Duration::from_secs(30)).await, 1);
    let client = sys.pool.get().await.unwrap();
    let retried = forward::retry(&**client, project, first, 1).await.unwrap();
    assert!(matches!(retried, ForwardRetryOutcome::Retried(ref f) if f.status == railhook_core::DeliveryStatus::Pending && f.max_attempts == 2));
    assert!(matches!(forward::retry(&**client, project, first, 1).await.unwrap(), ForwardRetryOutcome::NotFailed(_)));
    assert_eq!(wait_forward(&sys.client, first, "SUCCESS", Duration::from_secs(30)).await, 2);
    let hits = receiver.hits("/flaky");
    assert_eq!(hits.iter().map(|h| header(h, "x-forward-attempt").unwrap()).collect::<Vec<_>>(), ["1", "2"]);
    assert_eq!(header(&hits[0], "idempotency-key"), header(&hits[1], "idempotency-key"), "stable across Attempts");

    // The replay: a new Forward (new Idempotency-Key) to the same Destination.
    let ReplayOutcome::Replayed(replayed) = forward::replay(&**client, project, ine, Some(flaky)).await.unwrap() else { panic!("not replayed") };
    assert_eq!(replayed.len(), 1);
    assert_ne!(replayed[0].id, first);
    wait_forward(&sys.client, replayed[0].id, "SUCCESS", Duration::from_secs(30)).await;
    let hits = receiver.hits("/flaky");
    assert_eq!(hits.len(), 3);
    assert_eq!(header(&hits[2], "idempotency-key"), Some(replayed[0].id.to_string().as_str()));
    assert_eq!(hits[2].body, b"one");
    assert!(matches!(forward::replay(&**client, project, ine, Some(DestinationId::new())).await.unwrap(), ReplayOutcome::DestinationNotFound));
    assert!(matches!(forward::replay(&**client, ProjectId::new(), ine, None).await.unwrap(), ReplayOutcome::NotFound));

    // Bulk retry by filter, then a disabled Destination defers without spending an Attempt.
    let down = destination(&sys.pool, project, src, &format!("{base}/down"), DestinationAuth::None).await;
    let (_, more) = ingress(&sys.pool, project, src, &[], b"two", None).await;
    let to_down = more.iter().find(|(_, d)| *d == down).unwrap().0;
    wait_forward(&sys.client, to_down, "FAILED", Duration::from_secs(30)).await;
    let filter = forward::FailedForwardFilter { destination_id: Some(down), ..Default::default() };
    assert_eq!(forward::list_failed(&**client, project, &filter, None, 10).await.unwrap().iter().map(|f| f.id).collect::<Vec<_>>(), [to_down]);
    sys.client.execute("UPDATE destinations SET enabled = false WHERE id = $1", &[&down.0]).await.unwrap();
    let bulk = forward::retry_many(&**client, project, ForwardSelection::Filter(&filter, 100), 1).await.unwrap();
    assert_eq!(bulk.retried, [to_down]);
    let deferred = &sys.worker.metrics.forwards.claims;
    eventually(Duration::from_secs(30), "the disabled Destination's Deferral", || async { (deferred.with_label_values(&["destination_disabled"]).get() == 1).then_some(()) }).await;
    assert_eq!(forward_status(&sys.client, to_down).await, ("PENDING".to_string(), 1), "no Attempt spent");
    let by_id = forward::retry_many(&**client, project, ForwardSelection::Ids(&[to_down, first, ForwardId::new()]), 1).await.unwrap();
    assert!(by_id.retried.is_empty());
    assert_eq!(by_id.skipped.len(), 3);
    sys.stop().await;
}

#[tokio::test]
async fn a_destination_rate_limit_spreads_its_forwards() {
    let (receiver, base) = Receiver::start(|_, _| Act::Status(200)).await;
    let sys = System::start(|_| {}).await;
    let (project, src) = source(&sys.pool).await;
    let client = sys.pool.get().await.unwrap();
    let new = NewDestination { url: &format!("{base}/limited"), auth: &DestinationAuth::None, enabled: true, rate_limit_per_second: Some(2) };
    sources::create_destination(&**client, project, src, new).await.unwrap().unwrap();
    let mut forwards = Vec::new();
    for n in 0..8 {
        forwards.extend(ingress(&sys.pool, project, src, &[], format!("{n}").as_bytes(), None).await.1);
    }
    for (id, _) in &forwards {
        wait_forward(&sys.client, *id, "SUCCESS", Duration::from_secs(60)).await;
    }
    let hits = receiver.hits("/limited");
    assert_eq!(hits.len(), 8);
    let span = hits.last().unwrap().at - hits[0].at;
    // 8 at 2 per second: at least 3 windows after the first.
    assert!(span >= Duration::from_millis(2500), "8 Forwards at 2/s took {span:?}");
    assert!(sys.worker.metrics.forwards.claims.with_label_values(&["destination_rate"]).get() > 0);
    sys.stop().await;
}

#[tokio::test]
async fn a_5xx_is_retried_on_the_ladder_with_the_same_idempotency_key() {
    let (receiver, base) = Receiver::start(|_, n| if n < 2 { Act::Status(500) } else { Act::Status(200) }).await;
    let sys = System::start(|c| c.worker.incoming_retry_delays_seconds = vec![1, 1]).await;
    let (project, src) = source(&sys.pool).await;
    destination(&sys.pool, project, src, &format!("{base}/flaky"), DestinationAuth::StandardWebhooks { secret: SECRET.into() }).await;
    let (_, forwards) = ingress(&sys.pool, project, src, &[], b"{}", Some("application/json")).await;
    assert_eq!(wait_forward(&sys.client, forwards[0].0, "SUCCESS", Duration::from_secs(30)).await, 3);
    let hits = receiver.hits("/flaky");
    assert_eq!(hits.iter().map(|h| header(h, "x-forward-attempt").unwrap()).collect::<Vec<_>>(), ["1", "2", "3"]);
    for pair in hits.windows(2) {
        // The ladder's 1 s jittered to 0.5-1.5 s, plus the scheduler's interval.
        let gap = pair[1].at - pair[0].at;
        assert!(gap >= Duration::from_millis(450) && gap < Duration::from_millis(3000), "gap {gap:?}");
        assert_eq!(header(&pair[0], "idempotency-key"), header(&pair[1], "idempotency-key"));
        assert_eq!(header(&pair[0], "webhook-id"), header(&pair[1], "webhook-id"), "webhook-id stable across Attempts");
    }
    for hit in &hits {
        assert!(verifies(SECRET, &hit.headers, &hit.body));
    }
    let results: Vec<(i32, Option<i32>)> = sys
        .client
        .query("SELECT attempt_number, status_code FROM attempts WHERE forward_id = $1 ORDER BY attempt_number", &[&forwards[0].0 .0])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(results, [(1, Some(500)), (2, Some(500)), (3, Some(200))]);
    sys.stop().await;
}

/// A Destination that is down gets the Endpoints' circuit breaker (issue 31): with both
/// behind one receiver that answers 503 for 60 s while 5 Forwards and 5 Deliveries a second
/// arrive (both on a ladder of 1, 1, 2, 3, 5, 8 and then 10 s, as in the chaos suite), the
/// breaker's default settings (20 outcomes, half of them failures, 30 s cool-down) hold the
/// Destination to about as many requests as the Endpoint. Without a breaker each Forward
/// went on down its ladder: 1,500 and more requests in the same minute.
#[tokio::test]
async fn a_destination_that_is_down_is_held_off_by_its_circuit_like_an_endpoint() {
    const OUTAGE: Duration = Duration::from_secs(60);
    let ladder: Vec<i32> = [1, 1, 2, 3, 5, 8].into_iter().chain(std::iter::repeat_n(10, 13)).collect();
    let down = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (receiver, base) = {
        let down = down.clone();
        Receiver::start(move |_, _| if down.load(std::sync::atomic::Ordering::Relaxed) { Act::Status(503) } else { Act::Status(200) }).await
    };
    let sys = {
        let ladder = ladder.clone();
        System::start(move |c| c.worker.incoming_retry_delays_seconds = ladder).await
    };
    let (project, src) = source(&sys.pool).await;
    destination(&sys.pool, project, src, &format!("{base}/destination"), DestinationAuth::None).await;
    let (fixture, _) = railhook_testkit::relay::Fixture::create_with(&sys.client, &[format!("{base}/endpoint")], &spec(&ladder, 20, 10)).await;

    let started = Instant::now();
    let (mut forwards, mut deliveries) = (Vec::new(), Vec::new());
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    while started.elapsed() < OUTAGE {
        tick.tick().await;
        forwards.extend(ingress(&sys.pool, project, src, &[], b"{}", Some("application/json")).await.1.into_iter().map(|(f, _)| f));
        deliveries.extend(fixture.ingest(&sys.pool, "order.created").await);
    }
    let (to_destination, to_endpoint) = (receiver.hits("/destination").len(), receiver.hits("/endpoint").len());
    down.store(false, std::sync::atomic::Ordering::Relaxed);
    let up = Instant::now();
    for id in &forwards {
        wait_forward(&sys.client, *id, "SUCCESS", Duration::from_secs(120)).await;
    }
    for d in &deliveries {
        sys.wait_status(d, "SUCCESS", Duration::from_secs(120)).await;
    }
    let m = &sys.worker.metrics;
    let deferred = |o: &str| m.forwards.claims.with_label_values(&[o]).get();
    println!(
        "{OUTAGE:?} down, {} Forwards and {} Deliveries: {to_destination} requests to the Destination, {to_endpoint} to the Endpoint; \
         Forward claims deferred circuit_open {}, circuit_half_open {}; circuit changes {:?}; all delivered {:?} after the receiver came back",
        forwards.len(),
        deliveries.len(),
        deferred("circuit_open"),
        deferred("circuit_half_open"),
        ["opened", "reopened", "closed"].map(|c| (c, m.forwards.circuit_changes.with_label_values(&[c]).get())),
        up.elapsed(),
    );
    assert!(m.forwards.circuit_changes.with_label_values(&["opened"]).get() >= 1, "the Destination's circuit opened");
    assert!(m.forwards.circuit_changes.with_label_values(&["closed"]).get() >= 1, "and closed once the Destination was back");
    assert!(deferred("circuit_open") > 0, "Forwards waited for the cool-down without spending an Attempt");
    assert!(
        to_destination <= 2 * to_endpoint + 20 && to_destination < 200,
        "the Destination took {to_destination} requests in the outage, the Endpoint {to_endpoint}"
    );
    sys.stop().await;
}
