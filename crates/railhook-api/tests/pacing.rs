//! Ingest pacing (issue 20): a POST waits while the workers report that they are behind, at
//! most `api.ingest_max_hold_ms`, and never for a report that is stale or beyond
//! `api.ingest_hold_ignore_above_ms`. The reports go through the real Postgres `NOTIFY`, sent
//! with the very function the workers use.

mod common;

use std::time::{Duration, Instant};

use common::{metric, Api};
use railhook_testkit::{eventually, test_config, TestDb};
use serde_json::json;

/// Reports `wait` as worker `instance` would (one NOTIFY), its drain rate not known.
async fn report(pool: &railhook_store::Pool, instance: &str, wait: Duration) {
    report_rate(pool, instance, wait, 0).await;
}

/// Reports `wait` and the rate its queue drains (`per_s`), as worker `instance` would.
async fn report_rate(pool: &railhook_store::Pool, instance: &str, wait: Duration, per_s: u32) {
    let client = pool.get().await.unwrap();
    railhook_store::pacing::publish(&client, instance, wait, per_s).await.unwrap();
}

async fn workers(api: &Api) -> railhook_store::Pool {
    railhook_store::connect_pool(&api.config.database).await.unwrap()
}

/// The API's view of the workers' wait, once it has read a report.
async fn sees(api: &Api, wait: Duration) {
    let want = wait.as_secs_f64();
    eventually(Duration::from_secs(10), "the API to read the report", || async {
        ((metric(api, "railhook_api_delivery_wait_seconds").await - want).abs() < 1e-9).then_some(())
    })
    .await;
}

async fn start(max_hold_ms: u64) -> Api {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.api.ingest_max_hold_ms = max_hold_ms;
    Api::start_with(db, config).await
}

#[tokio::test]
async fn a_post_waits_while_the_workers_are_behind_and_goes_when_they_catch_up() {
    let api = start(60_000).await;
    let p = api.project().await;
    let w = workers(&api).await;
    // The LISTEN connection may not be up yet: report until the API has read one.
    eventually(Duration::from_secs(10), "the API to read a report", || async {
        report(&w, "w1", Duration::from_millis(800)).await;
        (metric(&api, "railhook_api_delivery_wait_seconds").await == 0.8).then_some(())
    })
    .await;

    let post = {
        let (http, url, key) = (api.http.clone(), api.url("/v1/events"), p.key.clone());
        tokio::spawn(async move {
            let resp = http.post(url).bearer_auth(key).json(&json!({"type": "order.paid", "payload": {}})).send().await.unwrap();
            resp.status().as_u16()
        })
    };
    eventually(Duration::from_secs(10), "the POST to be held", || async {
        (metric(&api, "railhook_api_ingest_holding").await == 1.0).then_some(())
    })
    .await;
    assert_eq!(api.count("SELECT count(*) FROM events").await, 0, "a held POST has written nothing");
    // Keep the report fresh for a while: still held.
    report(&w, "w1", Duration::from_millis(800)).await;
    assert!(!post.is_finished());

    // A second worker's smaller wait does not release it: the largest fresh report counts.
    report(&w, "w2", Duration::from_millis(100)).await;
    assert_eq!(metric(&api, "railhook_api_ingest_holding").await, 1.0);
    // The first worker caught up.
    report(&w, "w1", Duration::ZERO).await;
    assert_eq!(post.await.unwrap(), 201);
    assert_eq!(api.count("SELECT count(*) FROM events").await, 1);
    assert_eq!(metric(&api, "railhook_api_ingest_held_total").await, 1.0);
    assert_eq!(metric(&api, "railhook_api_ingest_holding").await, 0.0);
}

#[tokio::test]
async fn a_hold_is_bounded_and_stale_or_hopeless_reports_hold_nothing() {
    let api = start(300).await;
    let p = api.project().await;
    let w = workers(&api).await;
    eventually(Duration::from_secs(10), "the API to read a report", || async {
        report(&w, "w1", Duration::from_millis(5_000)).await;
        (metric(&api, "railhook_api_delivery_wait_seconds").await == 5.0).then_some(())
    })
    .await;
    // Behind for good: the POST goes after api.ingest_max_hold_ms (300 ms) anyway.
    let t = Instant::now();
    let (status, _) = api.post(&p.key, "/v1/events", json!({"type": "order.paid", "payload": {}})).await;
    let took = t.elapsed();
    assert_eq!(status, 201);
    assert!(took >= Duration::from_millis(300), "held for its bound: {took:?}");
    assert_eq!(metric(&api, "railhook_api_ingest_held_total").await, 1.0);

    // A worker that stops reporting: its last report ages out (railhook_api::pacing::FRESH).
    sees(&api, Duration::ZERO).await;
    api.post(&p.key, "/v1/events", json!({"type": "order.paid", "payload": {}})).await;
    assert_eq!(metric(&api, "railhook_api_ingest_held_total").await, 1.0, "nothing held without a fresh report");

    // A backlog beyond api.ingest_hold_ignore_above_ms (30 s): an outage's catch-up, not held.
    report(&w, "w1", Duration::from_secs(120)).await;
    sees(&api, Duration::from_secs(120)).await;
    let (status, _) = api.post(&p.key, "/v1/events", json!({"type": "order.paid", "payload": {}})).await;
    assert_eq!(status, 201);
    assert_eq!(metric(&api, "railhook_api_ingest_held_total").await, 1.0, "not held beyond the ignore bound");
}

/// Issue 30: what the API accepted since a report counts at the report's rate. A report of
/// 51 ms at 100 Deliveries/s leaves room for 5 POSTs below the 100 ms hold bound; the sixth
/// waits for the next report, which lets the next 5 go (and not every waiting POST at once).
#[tokio::test]
async fn posts_since_a_report_count_at_its_rate() {
    let api = start(60_000).await;
    assert_eq!(api.config.api.ingest_hold_above_ms, 100);
    let p = api.project().await;
    let w = workers(&api).await;
    let post = |n: usize| {
        let (http, url, key) = (api.http.clone(), api.url("/v1/events"), p.key.clone());
        tokio::spawn(async move {
            let resp = http.post(url).bearer_auth(key).json(&json!({"type": "order.paid", "payload": {"n": n}})).send().await.unwrap();
            resp.status().as_u16()
        })
    };
    eventually(Duration::from_secs(10), "the API to read a report", || async {
        report_rate(&w, "w1", Duration::from_millis(50), 100).await;
        (metric(&api, "railhook_api_delivery_wait_seconds").await == 0.05).then_some(())
    })
    .await;
    // The report the API read last (another may still arrive from the loop above): once
    // read, 5 POSTs fit.
    report_rate(&w, "w1", Duration::from_millis(51), 100).await;
    sees(&api, Duration::from_millis(51)).await;
    for n in 0..4 {
        assert_eq!(post(n).await.unwrap(), 201, "POST {n} fits in the report's room");
    }
    assert_eq!(metric(&api, "railhook_api_ingest_held_total").await, 0.0);
    // 51 ms + 4 / 100 per s = 91 ms: one more fits, then 101 ms holds the rest.
    let held: Vec<_> = (4..12).map(post).collect();
    eventually(Duration::from_secs(10), "seven POSTs to be held", || async {
        (metric(&api, "railhook_api_ingest_holding").await == 7.0).then_some(())
    })
    .await;
    assert_eq!(api.count("SELECT count(*) FROM events").await, 5);
    // The next report: room for 5 of the 7 (a report lives 1 s: these steps take far less).
    report_rate(&w, "w1", Duration::from_millis(51), 100).await;
    eventually(Duration::from_secs(10), "five held POSTs to go", || async {
        (api.count("SELECT count(*) FROM events").await == 10).then_some(())
    })
    .await;
    assert_eq!(metric(&api, "railhook_api_ingest_holding").await, 2.0, "the rest wait for the next report");
    // Caught up: the rest go.
    report_rate(&w, "w1", Duration::ZERO, 100).await;
    for h in held {
        assert_eq!(h.await.unwrap(), 201);
    }
    assert_eq!(api.count("SELECT count(*) FROM events").await, 12);
    assert_eq!(metric(&api, "railhook_api_ingest_held_total").await, 7.0);
}

#[tokio::test]
async fn pacing_off_holds_nothing() {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.api.ingest_pacing = false;
    let api = Api::start_with(db, config).await;
    let p = api.project().await;
    let w = workers(&api).await;
    report(&w, "w1", Duration::from_millis(5_000)).await;
    let (status, _) = api.post(&p.key, "/v1/events", json!({"type": "order.paid", "payload": {}})).await;
    assert_eq!(status, 201);
    let text = api.http.get(api.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(!text.contains("railhook_api_ingest_held_total"), "no pacing, no pacing metrics");
}
