//! The inline transport as a user meets it (issue 32): `railhook all` with no Kafka at all
//! (`kafka.brokers` empty, so `transport = "auto"` is inline) delivers signed Events, and a
//! `kill -9` of the process in the middle of a burst loses none of them: the relay confirms a
//! commit only after the worker acknowledged its hints' claim steps, so the restarted process
//! reads what was not claimed again from the slot. And the start-up errors that name the
//! setting: `railhook relay` on inline, a broker that does not answer on kafka.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use railhook_testkit::{eventually, test_config, TestDb};
use serde_json::{json, Value};

/// Every request's `X-Event-Id` with how many times it came, and whether every request
/// carried the three Standard Webhooks headers.
#[derive(Default)]
struct Rx {
    port: u16,
    events: Mutex<HashMap<String, usize>>,
    unsigned: Mutex<usize>,
}

async fn receive(State(rx): State<Arc<Rx>>, headers: HeaderMap) -> StatusCode {
    // A slow receiver (with two slots per Endpoint, below) keeps a backlog in the worker for
    // the kill to cut into.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let signed = ["webhook-id", "webhook-timestamp", "webhook-signature"].iter().all(|h| headers.contains_key(*h))
        && headers.get("webhook-signature").and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("v1,"));
    if !signed {
        *rx.unsigned.lock().unwrap() += 1;
    }
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

async fn call(http: &reqwest::Client, url: String, key: &str, body: Value) -> Value {
    let resp = http.post(&url).bearer_auth(key).json(&body).send().await.unwrap();
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    assert!((200..300).contains(&status), "{url}: {status} {body}");
    body
}

/// `railhook all` without Kafka: brokers empty, no transport set.
fn spawn_inline(config: &railhook_config::Config, port: u16) -> tokio::process::Child {
    common::spawn_railhook(
        config,
        "all",
        None,
        &[
            ("RAILHOOK_KAFKA_BROKERS", String::new()),
            ("RAILHOOK_API__LISTEN", format!("127.0.0.1:{port}")),
            ("RAILHOOK_WORKER__PROCESSING_TIMEOUT_SECONDS", "5".into()),
            ("RAILHOOK_WORKER__ENDPOINT_CONCURRENCY", "2".into()),
        ],
    )
}

#[tokio::test]
async fn railhook_all_without_kafka_delivers_and_a_kill_9_loses_nothing() {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    // Nothing of this test may reach a broker: a dead port where the tests' Kafka would be.
    config.kafka.brokers = "127.0.0.1:1".into();
    let rx = start_receiver().await;
    let port = railhook_testkit::free_port();
    let api = format!("http://127.0.0.1:{port}");
    let mut first = spawn_inline(&config, port);
    let http = reqwest::Client::new();
    eventually(Duration::from_secs(60), "the API to answer", || async {
        http.get(format!("{api}/readyz")).send().await.ok().filter(|r| r.status().is_success()).map(|_| ())
    })
    .await;
    let admin = config.api.admin_token.clone();
    let org = call(&http, format!("{api}/v1/admin/organizations"), &admin, json!({"name": "acme"})).await;
    let project = call(&http, format!("{api}/v1/admin/organizations/{}/projects", org["id"].as_str().unwrap()), &admin, json!({"name": "shop"})).await;
    let key = project["api_key"]["secret"].as_str().unwrap().to_string();
    let endpoint = call(&http, format!("{api}/v1/endpoints"), &key, json!({"url": format!("http://127.0.0.1:{}/hook", rx.port)})).await;
    call(&http, format!("{api}/v1/subscriptions"), &key, json!({"endpoint_id": endpoint["id"], "event_type": "order.*"})).await;

    // One Event through the whole chain first.
    let live = call(&http, format!("{api}/v1/events"), &key, json!({"type": "order.live", "payload": {}})).await;
    let live_id = live["id"].as_str().unwrap().to_string();
    eventually(Duration::from_secs(60), "the first Event at the receiver", || async { rx.events.lock().unwrap().contains_key(&live_id).then_some(()) }).await;
    let metrics = http.get(format!("{api}/metrics")).send().await.unwrap().text().await.unwrap();
    // The relay counts what the worker acknowledged as it counts Kafka's acknowledgements.
    let produced = metrics.lines().find(|l| l.starts_with("railhook_relay_messages_produced_total ")).unwrap_or_default().to_string();
    assert!(produced.split(' ').nth(1).and_then(|v| v.parse::<f64>().ok()).is_some_and(|v| v >= 1.0), "the relay handed it over: {produced:?}");

    // A burst, and the process killed while it is being delivered.
    let mut ids = vec![live_id];
    for n in 0..300 {
        let e = call(&http, format!("{api}/v1/events"), &key, json!({"type": "order.created", "payload": {"n": n}})).await;
        ids.push(e["id"].as_str().unwrap().to_string());
    }
    eventually(Duration::from_secs(60), "part of the burst delivered", || async { (rx.events.lock().unwrap().len() >= 20).then_some(()) }).await;
    first.start_kill().unwrap();
    first.wait().await.unwrap();
    let before_restart = rx.events.lock().unwrap().len();
    let _second = spawn_inline(&config, port);
    eventually(Duration::from_secs(120), "every accepted Event at the receiver after the restart", || async {
        let got = rx.events.lock().unwrap();
        ids.iter().all(|id| got.contains_key(id)).then_some(())
    })
    .await;
    assert_eq!(*rx.unsigned.lock().unwrap(), 0, "every request signed");
    eprintln!("inline: {before_restart} of {} delivered before the kill -9, all after the restart", ids.len());
    assert!(before_restart + 100 <= ids.len(), "the kill came while at least 100 were still to go ({before_restart} of {}): the test must cross the window", ids.len());
}

/// What the process prints on stderr and its exit code, for a command expected to stop.
async fn run_to_exit(config: &railhook_config::Config, subcommand: &str, env: &[(&str, &str)]) -> (bool, String) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_railhook"));
    command
        .arg(subcommand)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RAILHOOK_DATABASE_URL", &config.database.url)
        .env("RAILHOOK_RELAY__OPS_LISTEN", format!("127.0.0.1:{}", railhook_testkit::free_port()))
        .env("RAILHOOK_WORKER__OPS_LISTEN", format!("127.0.0.1:{}", railhook_testkit::free_port()))
        .env("RAILHOOK_API__LISTEN", format!("127.0.0.1:{}", railhook_testkit::free_port()))
        .envs(env.iter().copied())
        .current_dir(std::env::temp_dir())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(90), command.output()).await.expect("the process stops by itself").unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test]
async fn a_transport_that_cannot_work_is_a_start_up_error_naming_the_setting() {
    let db = TestDb::new().await;
    let config = test_config(&db);
    // The relay or a worker alone on inline: nothing to hand the announcements to.
    for sub in ["relay", "worker"] {
        let (ok, err) = run_to_exit(&config, sub, &[]).await;
        assert!(!ok && err.contains(&format!("railhook {sub} cannot run with the inline transport")) && err.contains("kafka.brokers"), "{sub}: {err}");
        let (ok, err) = run_to_exit(&config, sub, &[("RAILHOOK_TRANSPORT", "inline"), ("RAILHOOK_KAFKA_BROKERS", "127.0.0.1:19092")]).await;
        assert!(!ok && err.contains("transport is \"inline\""), "{sub}: {err}");
    }
    // A transport that does not exist, and kafka without brokers.
    let (ok, err) = run_to_exit(&config, "all", &[("RAILHOOK_TRANSPORT", "kafak")]).await;
    assert!(!ok && err.contains("transport: unknown variant") && err.contains("kafak"), "{err}");
    let (ok, err) = run_to_exit(&config, "all", &[("RAILHOOK_TRANSPORT", "kafka")]).await;
    assert!(!ok && err.contains("transport is kafka but kafka.brokers is empty"), "{err}");
    // Kafka named but not answering: an error naming kafka.brokers after the start-up wait,
    // not a silent fallback to inline.
    let (ok, err) = run_to_exit(&config, "all", &[("RAILHOOK_KAFKA_BROKERS", "127.0.0.1:1")]).await;
    assert!(!ok && err.contains("kafka.brokers = 127.0.0.1:1: no Kafka broker answered"), "{err}");
}

/// A Postgres without logical replication: `railhook all` (inline, so nothing but Postgres is
/// asked) stops at start-up with the setting and its fix, instead of serving an API whose
/// Events nobody would announce.
#[tokio::test]
async fn a_postgres_without_logical_replication_stops_railhook_all_naming_wal_level() {
    let mut pg = railhook_testkit::pg::PgCluster::start().await;
    let client = railhook_testkit::connect(&pg.url("postgres")).await.expect("connect to the private cluster");
    client.batch_execute("ALTER SYSTEM SET wal_level = 'replica'").await.unwrap();
    drop(client);
    pg.fast_restart().await;
    let mut config = railhook_config::Config::default();
    config.database.url = pg.url("postgres");
    let (ok, err) = run_to_exit(&config, "all", &[("RAILHOOK_TRANSPORT", "inline")]).await;
    assert!(!ok && err.contains("wal_level is 'replica', it must be 'logical'"), "{err}");
}
