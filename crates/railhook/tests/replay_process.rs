//! A Replay through real processes (issue 17's test): `railhook api`, `railhook relay` and
//! `railhook worker` against one Postgres and one Kafka, a Replay of 10,000 stored Events to
//! a local receiver, the worker killed (-9) while the Replay runs and started again, then the
//! Replay cancelled half-way. Each (Replay, Event, Endpoint) is made once, nothing is made
//! after the cancel, and every Delivery made arrives.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use railhook_testkit::{eventually, test_config, TestDb};
use serde_json::{json, Value};

const EVENTS: i64 = 10_000;

/// Every request's `X-Event-Id`, with how many times it came.
#[derive(Default)]
struct Rx {
    port: u16,
    events: Mutex<HashMap<String, usize>>,
}

async fn receive(State(rx): State<Arc<Rx>>, headers: axum::http::HeaderMap) -> StatusCode {
    if let Some(id) = headers.get("x-event-id").and_then(|v| v.to_str().ok()) {
        *rx.events.lock().unwrap().entry(id.to_string()).or_default() += 1;
    }
    StatusCode::NO_CONTENT
}

async fn start_receiver() -> Arc<Rx> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let rx = Arc::new(Rx { port: listener.local_addr().unwrap().port(), ..Default::default() });
    let app = axum::Router::new().route("/hook", axum::routing::post(receive)).with_state(rx.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    rx
}

struct Stack {
    config: railhook_config::Config,
    config_file: PathBuf,
}

impl Stack {
    fn spawn(&self, subcommand: &str, env: &[(&str, String)]) -> tokio::process::Child {
        let mut all = vec![
            ("RAILHOOK_WORKER__PROCESSING_TIMEOUT_SECONDS", "8".to_string()),
            // Fast enough for a test, slow enough to kill and cancel it on the way.
            ("RAILHOOK_REPLAY__MAX_DELIVERIES_PER_SECOND", "500".to_string()),
        ];
        all.extend(env.iter().map(|(k, v)| (*k, v.clone())));
        common::spawn_railhook(&self.config, subcommand, Some(&self.config_file), &all)
    }
}

async fn call(http: &reqwest::Client, method: reqwest::Method, url: String, key: &str, body: Option<Value>) -> Value {
    let mut req = http.request(method, &url).bearer_auth(key);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    assert!((200..300).contains(&status), "{url}: {status} {body}");
    body
}

async fn made(http: &reqwest::Client, api: &str, key: &str, id: &str) -> (i64, String) {
    let r = call(http, reqwest::Method::GET, format!("{api}/v1/replays/{id}"), key, None).await;
    (r["made"].as_i64().unwrap(), r["state"].as_str().unwrap().to_string())
}

#[tokio::test]
async fn a_replay_of_10000_events_survives_a_worker_kill_9_and_a_cancel_half_way() {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.kafka.properties.insert("session.timeout.ms".into(), "6000".into());
    config.kafka.properties.insert("heartbeat.interval.ms".into(), "1000".into());
    let config_file = std::env::temp_dir().join(format!("railhook-replay-{}.toml", uuid::Uuid::new_v4().simple()));
    let mut file = String::from("[kafka.properties]\n");
    for (k, v) in &config.kafka.properties {
        file.push_str(&format!("\"{k}\" = \"{v}\"\n"));
    }
    std::fs::write(&config_file, file).unwrap();
    let stack = Stack { config, config_file };

    let rx = start_receiver().await;
    let port = railhook_testkit::free_port();
    let api = format!("http://127.0.0.1:{port}");
    let _api = stack.spawn("api", &[("RAILHOOK_API__LISTEN", format!("127.0.0.1:{port}"))]);
    let _relay = stack.spawn("relay", &[("RAILHOOK_RELAY__OPS_LISTEN", format!("127.0.0.1:{}", railhook_testkit::free_port()))]);
    let worker = |ops: u16| stack.spawn("worker", &[("RAILHOOK_WORKER__OPS_LISTEN", format!("127.0.0.1:{ops}"))]);
    let mut first = worker(railhook_testkit::free_port());

    let http = reqwest::Client::new();
    eventually(Duration::from_secs(60), "the API to answer", || async {
        http.get(format!("{api}/healthz")).send().await.ok().filter(|r| r.status().is_success()).map(|_| ())
    })
    .await;
    let admin = stack.config.api.admin_token.clone();
    let org = call(&http, reqwest::Method::POST, format!("{api}/v1/admin/organizations"), &admin, Some(json!({"name": "acme"}))).await;
    let project = call(&http, reqwest::Method::POST, format!("{api}/v1/admin/organizations/{}/projects", org["id"].as_str().unwrap()), &admin, Some(json!({"name": "shop"}))).await;
    let key = project["api_key"]["secret"].as_str().unwrap().to_string();
    let endpoint = call(&http, reqwest::Method::POST, format!("{api}/v1/endpoints"), &key, Some(json!({"url": format!("http://127.0.0.1:{}/hook", rx.port)}))).await;
    call(&http, reqwest::Method::POST, format!("{api}/v1/subscriptions"), &key, Some(json!({"endpoint_id": endpoint["id"], "event_type": "order.*"}))).await;

    // A live Event first: the whole chain works (the consumer group formed).
    let live = call(&http, reqwest::Method::POST, format!("{api}/v1/events"), &key, Some(json!({"type": "order.live", "payload": {}}))).await;
    let live_id = live["id"].as_str().unwrap().to_string();
    eventually(Duration::from_secs(90), "the live Event at the receiver", || async { rx.events.lock().unwrap().contains_key(&live_id).then_some(()) }).await;

    // The history: EVENTS stored Events of the last hour, no Deliveries of their own.
    let client = db.client().await;
    client
        .execute(
            "INSERT INTO events (id, project_id, event_type, payload, created_at)
             SELECT railhook_uuid_v7(), (SELECT id FROM projects LIMIT 1), 'order.paid', jsonb_build_object('n', i), now() - interval '1 hour' + i * interval '1 ms'
             FROM generate_series(1, $1::bigint) i",
            &[&EVENTS],
        )
        .await
        .unwrap();
    let now = chrono::Utc::now();
    let body = json!({"from": (now - chrono::Duration::hours(2)).to_rfc3339(), "to": (now - chrono::Duration::minutes(30)).to_rfc3339(), "event_types": ["order.paid"]});
    let replay = call(&http, reqwest::Method::POST, format!("{api}/v1/replays"), &key, Some(body)).await;
    let id = replay["id"].as_str().unwrap().to_string();
    assert_eq!(replay["total"].as_i64(), Some(EVENTS));

    // kill -9 of the worker (the Replay runner's process) while the Replay runs, then a new one.
    eventually(Duration::from_secs(120), "a fifth of the Replay made", || async { (made(&http, &api, &key, &id).await.0 >= EVENTS / 5).then_some(()) }).await;
    first.start_kill().unwrap();
    first.wait().await.unwrap();
    let at_kill = made(&http, &api, &key, &id).await.0;
    let _second = worker(railhook_testkit::free_port());

    // Cancel half-way.
    eventually(Duration::from_secs(120), "half the Replay made", || async { (made(&http, &api, &key, &id).await.0 >= EVENTS / 2).then_some(()) }).await;
    let cancelled = call(&http, reqwest::Method::POST, format!("{api}/v1/replays/{id}/cancel"), &key, Some(json!({}))).await;
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
    let (at_cancel, _) = made(&http, &api, &key, &id).await;
    assert!(at_cancel < EVENTS, "cancelled half-way: {at_cancel} made");

    // Every Delivery made arrives; each (Replay, Event, Endpoint) made once.
    let replay_uuid: uuid::Uuid = client.query_one("SELECT id FROM replays", &[]).await.unwrap().get(0);
    let rows: i64 = client.query_one("SELECT count(*) FROM deliveries WHERE replay_id = $1", &[&replay_uuid]).await.unwrap().get(0);
    let distinct: i64 = client.query_one("SELECT count(DISTINCT (event_id, endpoint_id)) FROM deliveries WHERE replay_id = $1", &[&replay_uuid]).await.unwrap().get(0);
    assert_eq!(rows, at_cancel, "the Deliveries made are those the Replay counted, none after the cancel");
    assert_eq!(distinct, rows, "each (Replay, Event, Endpoint) made once");
    eventually(Duration::from_secs(180), "every replayed Delivery delivered", || async {
        let open: i64 = client.query_one("SELECT count(*) FROM deliveries WHERE replay_id = $1 AND status <> 'SUCCESS'", &[&replay_uuid]).await.unwrap().get(0);
        (open == 0).then_some(())
    })
    .await;
    let arrived = rx.events.lock().unwrap().clone();
    let replayed_ids: HashSet<String> = client
        .query("SELECT event_id FROM deliveries WHERE replay_id = $1", &[&replay_uuid])
        .await
        .unwrap()
        .iter()
        .map(|r| railhook_core::EventId(r.get::<_, uuid::Uuid>(0)).to_string())
        .collect();
    let missing: Vec<&String> = replayed_ids.iter().filter(|e| !arrived.contains_key(*e)).collect();
    let again = arrived.values().filter(|n| **n > 1).count();
    eprintln!("replay: {at_kill} made at the kill -9, {at_cancel} at the cancel (of {EVENTS}); {} arrived, {again} Events more than once (a kill -9 may resend)", replayed_ids.len() - missing.len());
    assert!(missing.is_empty(), "{} replayed Deliveries never arrived, e.g. {:?}", missing.len(), missing.first());
    assert_eq!(rows, made(&http, &api, &key, &id).await.0, "nothing made after the cancel");
    assert!(at_cancel > at_kill, "the new worker went on with the Replay");
}
