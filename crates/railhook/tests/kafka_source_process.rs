//! The Kafka source as it runs in production (issue #33): `railhook api`, `railhook relay`
//! and a `railhook worker` with `kafka_source.topics` set, as separate processes against one
//! Postgres and one Kafka. 10,000 records are produced to the source topic (half with their
//! own idempotency key, half keyed by their position); once 3,000 Events exist the worker
//! (its Attempts and its source consumer) is killed with -9 and a new worker starts. Every
//! record becomes exactly one Event, and every Event's Delivery reaches the receiver. The
//! first worker waits between each batch's transaction and its offset commit (a test hook),
//! so the kill falls in that window and the new worker reads that batch again.

mod common;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use rdkafka::producer::FutureRecord;
use railhook_testkit::{eventually, test_config, TestDb};
use serde_json::{json, Value};

const RECORDS: usize = 10_000;
const KILL_AFTER: i64 = 3_000;
const TOPIC: &str = "orders";

#[derive(Default)]
struct Rx {
    /// webhook-id of every request that arrived (a duplicate arrives twice).
    arrivals: Mutex<Vec<String>>,
}

async fn receive(State(rx): State<Arc<Rx>>, headers: axum::http::HeaderMap) -> StatusCode {
    let id = headers.get("webhook-id").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    rx.arrivals.lock().unwrap().push(id);
    StatusCode::OK
}

async fn post(http: &reqwest::Client, url: String, key: &str, body: Value) -> Value {
    let resp = http.post(&url).bearer_auth(key).json(&body).send().await.unwrap();
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    assert!(status == 201 || status == 200, "{url}: {status} {body}");
    body
}

async fn count(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

async fn metric_sum(http: &reqwest::Client, ops: u16, name: &str) -> f64 {
    let Ok(resp) = http.get(format!("http://127.0.0.1:{ops}/metrics")).send().await else { return f64::NAN };
    let body = resp.text().await.unwrap_or_default();
    body.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_records_through_a_kill_9_make_each_event_once_and_every_delivery() {
    let started = Instant::now();
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.kafka.partitions = 6;
    config.kafka.properties.insert("session.timeout.ms".into(), "6000".into());
    config.kafka.properties.insert("heartbeat.interval.ms".into(), "1000".into());
    let config_file = std::env::temp_dir().join(format!("railhook-kafka-source-{}.toml", uuid::Uuid::new_v4().simple()));
    let mut file = String::from("[kafka.properties]\n");
    for (k, v) in &config.kafka.properties {
        file.push_str(&format!("\"{k}\" = \"{v}\"\n"));
    }
    std::fs::write(&config_file, file).unwrap();
    let group = format!("{}source", config.kafka.topic_prefix);
    let spawn = |subcommand: &str, extra: Vec<(&'static str, String)>, file: &PathBuf| {
        let mut env = vec![
            ("RAILHOOK_KAFKA__PARTITIONS", "6".to_string()),
            ("RAILHOOK_WORKER__PROCESSING_TIMEOUT_SECONDS", "8".to_string()),
            ("RAILHOOK_KAFKA_SOURCE__TOPICS", format!(r#"["{TOPIC}"]"#)),
            ("RAILHOOK_KAFKA_SOURCE__GROUP_ID", group.clone()),
        ];
        env.extend(extra);
        common::spawn_railhook(&config, subcommand, Some(file), &env)
    };

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let rx_port = listener.local_addr().unwrap().port();
    let rx = Arc::new(Rx::default());
    let app = axum::Router::new().route("/hook", axum::routing::post(receive)).with_state(rx.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let (api_port, relay_ops, worker_ops) = (railhook_testkit::free_port(), railhook_testkit::free_port(), [railhook_testkit::free_port(), railhook_testkit::free_port()]);
    let api = format!("http://127.0.0.1:{api_port}");
    let mut api_child = spawn("api", vec![("RAILHOOK_API__LISTEN", format!("127.0.0.1:{api_port}"))], &config_file);
    let mut relay = spawn("relay", vec![("RAILHOOK_RELAY__OPS_LISTEN", format!("127.0.0.1:{relay_ops}"))], &config_file);
    // The first worker waits 500 ms between each batch's transaction and its offset commit
    // (a test hook), so the kill lands between the two: its last batch is read again.
    let mut worker = spawn(
        "worker",
        vec![("RAILHOOK_WORKER__OPS_LISTEN", format!("127.0.0.1:{}", worker_ops[0])), ("RAILHOOK_FAILPOINT_KAFKA_SOURCE_COMMIT_DELAY_MS", "500".to_string())],
        &config_file,
    );

    let http = reqwest::Client::new();
    eventually(Duration::from_secs(60), "the API to answer", || async { http.get(format!("{api}/healthz")).send().await.ok().filter(|r| r.status().is_success()).map(|_| ()) }).await;
    eventually(Duration::from_secs(60), "the relay to stream", || async { (metric_sum(&http, relay_ops, "railhook_relay_stream_live").await == 1.0).then_some(()) }).await;
    let token = &config.api.admin_token;
    let org = post(&http, format!("{api}/v1/admin/organizations"), token, json!({"name": "acme"})).await;
    let project = post(&http, format!("{api}/v1/admin/organizations/{}/projects", org["id"].as_str().unwrap()), token, json!({"name": "shop"})).await;
    let project_id = project["id"].as_str().unwrap().to_string();
    let key = project["api_key"]["secret"].as_str().unwrap().to_string();
    let endpoint = post(&http, format!("{api}/v1/endpoints"), &key, json!({"url": format!("http://127.0.0.1:{rx_port}/hook")})).await;
    post(&http, format!("{api}/v1/subscriptions"), &key, json!({"endpoint_id": endpoint["id"], "event_type": "order.*", "retry_delays": [1]})).await;

    let topic = format!("{}{TOPIC}", config.kafka.topic_prefix);
    railhook_kafka::ensure_topics(&config.kafka, std::slice::from_ref(&topic)).await.unwrap();
    let producer = railhook_kafka::idempotent_producer(&config.kafka, 100_000).unwrap();
    let sends = (0..RECORDS).map(|i| {
        let (producer, topic, project_id) = (&producer, &topic, &project_id);
        async move {
            let value = if i % 2 == 0 {
                json!({"type": "order.paid", "payload": {"n": i}, "project": project_id, "idempotency_key": format!("order-{i}")})
            } else {
                json!({"type": "order.paid", "payload": {"n": i}, "project": project_id})
            }
            .to_string();
            let k = i.to_string();
            producer.send(FutureRecord::to(topic).key(&k).payload(&value), Duration::from_secs(30)).await.map_err(|(e, _)| e).unwrap();
        }
    });
    futures::future::join_all(sends).await;
    let produced = started.elapsed();

    let client = db.client().await;
    eventually(Duration::from_secs(120), "3,000 Events ingested", || async { (count(&client, "SELECT count(*) FROM events").await >= KILL_AFTER).then_some(()) }).await;
    worker.start_kill().unwrap();
    worker.wait().await.unwrap();
    let at_kill = count(&client, "SELECT count(*) FROM events").await;
    let delivered_at_kill = rx.arrivals.lock().unwrap().len();
    let killed_at = Instant::now();
    let mut worker = spawn("worker", vec![("RAILHOOK_WORKER__OPS_LISTEN", format!("127.0.0.1:{}", worker_ops[1]))], &config_file);

    eventually(Duration::from_secs(240), "every record ingested", || async { (count(&client, "SELECT count(*) FROM events").await >= RECORDS as i64).then_some(()) }).await;
    eventually(Duration::from_secs(240), "every Delivery SUCCESS", || async { (count(&client, "SELECT count(*) FROM deliveries WHERE status::text = 'SUCCESS'").await >= RECORDS as i64).then_some(()) }).await;
    // The new worker's source has read to the end of every partition (its counters cover
    // all that the killed one had not committed): nothing more can come.
    eventually(Duration::from_secs(60), "the new source consumer through the backlog", || async {
        let seen = metric_sum(&http, worker_ops[1], "railhook_kafka_source_records_total").await;
        (seen >= (RECORDS as i64 - at_kill) as f64).then_some(())
    })
    .await;
    let all_done = killed_at.elapsed();
    let replayed = metric_sum(&http, worker_ops[1], r#"railhook_kafka_source_records_total{outcome="replayed"}"#).await;
    let dead = metric_sum(&http, worker_ops[1], "railhook_kafka_source_dead_letters_total").await;

    assert_eq!(count(&client, "SELECT count(*) FROM events").await, RECORDS as i64, "each record once");
    let ns: HashSet<i64> = client.query("SELECT (payload->>'n')::bigint FROM events", &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(ns, (0..RECORDS as i64).collect::<HashSet<_>>(), "every record, none twice");
    assert_eq!(count(&client, "SELECT count(*) FROM deliveries").await, RECORDS as i64, "one Delivery per Event");
    let want: HashSet<String> = client.query("SELECT id FROM deliveries", &[]).await.unwrap().iter().map(|r| railhook_core::DeliveryId(r.get(0)).to_string()).collect();
    eventually(Duration::from_secs(30), "every Delivery at the receiver", || async {
        let got: HashSet<String> = rx.arrivals.lock().unwrap().iter().cloned().collect();
        got.is_superset(&want).then_some(())
    })
    .await;
    assert_eq!(dead, 0.0, "no record was dead-lettered");
    assert!(replayed > 0.0, "the batch committed in Postgres but not in Kafka at the kill was read again ({replayed} records) and absorbed");
    let arrivals = rx.arrivals.lock().unwrap().len();
    eprintln!(
        "{RECORDS} records produced in {produced:.1?}; kill -9 of the worker at {at_kill} Events ({delivered_at_kill} delivered); all ingested and delivered {all_done:.1?} after it; \
         the new worker's source read {replayed} records again (absorbed by their keys); {arrivals} arrivals for {} Deliveries; whole test {:.1?}",
        want.len(),
        started.elapsed()
    );

    for child in [&mut worker, &mut relay, &mut api_child] {
        child.start_kill().ok();
        child.wait().await.ok();
    }
    let slot = config.relay.slot_name.clone();
    eventually(Duration::from_secs(30), "the slot to be dropped", || {
        let (client, slot) = (&client, &slot);
        async move { client.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", &[slot]).await.ok().map(|_| ()) }
    })
    .await;
    std::fs::remove_file(&config_file).ok();
}
