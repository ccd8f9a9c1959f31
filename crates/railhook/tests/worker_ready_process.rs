//! `railhook worker`'s `/readyz` answers 200 only once its Deliveries consumer received its
//! first assignment (issue 30), and so does `railhook all`'s on the Kafka transport: until
//! then the worker reads nothing, and a burst sent as soon as the process answered waited in
//! Kafka (measured: 800-1,500 Events accepted before the first reached the worker). The
//! process starts its listener first, then makes its topics, readies its connections and
//! joins its consumer group: polled from the start, the answer is 503 with the consumer's
//! check failing, then 200 with every check passing, and `railhook_worker_consumer_joined`
//! is 1 by then.

mod common;

use std::time::{Duration, Instant};

use railhook_testkit::{test_config, TestDb};
use serde_json::Value;

/// Polls `{url}/readyz` from before the listener is up until a 200: the bodies of the 503s
/// before it, and the 200's.
async fn until_ready(url: &str) -> (Vec<Value>, Value) {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut not_ready = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "no 200 from {url}/readyz within 60 s; answers before: {not_ready:?}");
        let Ok(resp) = http.get(format!("{url}/readyz")).send().await else {
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        };
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap();
        if status == 200 {
            return (not_ready, body);
        }
        assert_eq!(status, 503, "{body}");
        not_ready.push(body);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The 503s all failed the consumer's check, the 200 passed it, and the gauge says joined.
async fn joined_before_ready(url: &str, not_ready: &[Value], ready: &Value) {
    let consumer = |body: &Value| body["checks"]["kafka_consumer"]["ok"].as_bool();
    assert!(!not_ready.is_empty(), "polled from the listener's start, some answer came before the join");
    assert!(not_ready.iter().all(|b| consumer(b) == Some(false)), "before: {not_ready:?}");
    assert_eq!(consumer(ready), Some(true), "{ready}");
    let metrics = reqwest::get(format!("{url}/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.lines().any(|l| l == "railhook_worker_consumer_joined 1"), "{metrics}");
}

#[tokio::test]
async fn the_worker_is_ready_once_its_consumer_joined_its_group() {
    let db = TestDb::new().await;
    let config = test_config(&db);
    let ops = railhook_testkit::free_port();
    let _worker = common::spawn_railhook(&config, "worker", None, &[("RAILHOOK_WORKER__OPS_LISTEN", format!("127.0.0.1:{ops}"))]);
    let url = format!("http://127.0.0.1:{ops}");
    let (not_ready, ready) = until_ready(&url).await;
    joined_before_ready(&url, &not_ready, &ready).await;
}

#[tokio::test]
async fn railhook_all_on_kafka_is_ready_once_its_consumer_joined_its_group() {
    let db = TestDb::new().await;
    let config = test_config(&db);
    let port = railhook_testkit::free_port();
    let _all = common::spawn_railhook(&config, "all", None, &[("RAILHOOK_API__LISTEN", format!("127.0.0.1:{port}")), ("RAILHOOK_TRANSPORT", "kafka".to_string())]);
    let url = format!("http://127.0.0.1:{port}");
    let (not_ready, ready) = until_ready(&url).await;
    joined_before_ready(&url, &not_ready, &ready).await;
}
