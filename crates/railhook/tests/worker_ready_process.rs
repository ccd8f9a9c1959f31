//! `railhook worker`'s `/readyz` answers 200 only once its Deliveries consumer received its
//! first assignment (issue 30): until then the worker reads nothing, and a burst sent as soon
//! as the process answered waited in Kafka (measured: 800-1,500 Events accepted before the
//! first reached the worker). The process starts its ops listener first, then makes its
//! topics, readies its connections and joins its consumer group: polled from the start, the
//! answer is 503 with the consumer's check failing, then 200 with every check passing, and
//! `railhook_worker_consumer_joined` is 1 by then.

mod common;

use std::time::{Duration, Instant};

use railhook_testkit::{test_config, TestDb};
use serde_json::Value;

#[tokio::test]
async fn the_worker_is_ready_once_its_consumer_joined_its_group() {
    let db = TestDb::new().await;
    let config = test_config(&db);
    let ops = railhook_testkit::free_port();
    let _worker = common::spawn_railhook(&config, "worker", None, &[("RAILHOOK_WORKER__OPS_LISTEN", format!("127.0.0.1:{ops}"))]);
    let http = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{ops}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut not_ready = Vec::new();
    let ready = loop {
        assert!(Instant::now() < deadline, "no 200 from /readyz within 60 s; answers before: {not_ready:?}");
        let Ok(resp) = http.get(format!("{url}/readyz")).send().await else {
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        };
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap();
        if status == 200 {
            break body;
        }
        assert_eq!(status, 503, "{body}");
        not_ready.push(body);
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let consumer = |body: &Value| body["checks"]["kafka_consumer"]["ok"].as_bool();
    assert!(!not_ready.is_empty(), "polled from the listener's start, some answer came before the join");
    assert!(not_ready.iter().all(|b| consumer(b) == Some(false)), "before: {not_ready:?}");
    assert_eq!(consumer(&ready), Some(true), "{ready}");
    let metrics = http.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.lines().any(|l| l == "railhook_worker_consumer_joined 1"), "{metrics}");
}
