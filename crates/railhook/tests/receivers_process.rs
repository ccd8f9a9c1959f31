//! The receiver kit against real deliveries (issue 32): `railhook all` delivers Events to the
//! three example receivers in examples/ (Python with the `standardwebhooks` package and
//! psycopg, Node with the `standardwebhooks` package and pg, Rust with railhook-receiver's
//! axum extractor and dedupe), each with its own Postgres database.
//!
//! Duplicate window 8 is forced: between Railhook and each receiver sits a lossy proxy that
//! passes the first arrival of each `webhook-id` to the receiver (which acts and commits) and
//! then answers Railhook 500, as if the response had been lost. Railhook retries the same
//! Delivery (same `webhook-id`, fresh timestamp and signature) a second later; the receiver
//! answers `duplicate`. Each Delivery must have exactly one effect in its receiver's
//! database. The Endpoints' secrets are rotated before the Events are sent while the
//! receivers keep the old secret, so every request carries two signatures and the receivers
//! verify with the second.
//!
//! Then, directly to each receiver: a forged and a stale request (401, no effect), and one
//! signed request sent eight times at once (exactly one effect). Finally `railhook verify`
//! checks a request exactly as Railhook sent it, captured by the proxy.
//!
//! The Python venv and the Node packages are installed by `scripts/test`
//! (`ensure_receiver_examples` in scripts/lib.sh); this test fails, not skips, without them.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use railhook_core::signing::EndpointSecret;
use railhook_receiver::{Secret, Verifier};
use railhook_testkit::{eventually, test_config, TestDb};
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;

const EVENTS: usize = 5;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// A database of the receiver's own (not Railhook's): empty, `rh_test_` prefixed so
/// `scripts/test` drops it with the other leftovers.
async fn receiver_database(test_db: &TestDb, name: &str) -> String {
    let admin = railhook_testkit::connect(&railhook_testkit::admin_url()).await.unwrap();
    let db = format!("{}_rx_{name}", test_db.name);
    admin.batch_execute(&format!("CREATE DATABASE {db}")).await.unwrap();
    railhook_testkit::with_database(&test_db.url, &db)
}

/// One example receiver: a child process (Python, Node) killed on drop, or the Rust one
/// served in this process.
struct Receiver {
    name: &'static str,
    url: String,
    database_url: String,
    _child: Option<tokio::process::Child>,
}

/// Starts `program args` in `dir` with the receiver's environment and reads the port from
/// its first line ("listening on http://127.0.0.1:PORT").
async fn spawn_receiver(name: &'static str, program: &Path, args: &[&str], dir: &Path, database_url: String, secret: &str) -> Receiver {
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .env("DATABASE_URL", &database_url)
        .env("WEBHOOK_SECRET", secret)
        .env("PORT", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start the {name} receiver ({}): {e}", program.display()));
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("the {name} receiver did not say where it listens within 30 s"))
        .unwrap()
        .unwrap_or_else(|| panic!("the {name} receiver exited before listening"));
    let url = first.strip_prefix("listening on ").unwrap_or_else(|| panic!("{name}: unexpected first line {first:?}")).to_string();
    // Keep draining its stdout so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Receiver { name, url, database_url, _child: Some(child) }
}

async fn python_receiver(database_url: String, secret: &str) -> Receiver {
    let dir = examples().join("receiver-python");
    let python = dir.join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: scripts/test installs it (ensure_receiver_examples in scripts/lib.sh), or run: python3 -m venv {0}/.venv && {0}/.venv/bin/pip install -r {0}/requirements.txt",
        dir.display()
    );
    spawn_receiver("python", &python, &["receiver.py"], &dir, database_url, secret).await
}

async fn node_receiver(database_url: String, secret: &str) -> Receiver {
    let dir = examples().join("receiver-node");
    assert!(
        dir.join("node_modules/standardwebhooks").exists() && dir.join("node_modules/pg").exists(),
        "{0}/node_modules is incomplete: scripts/test installs it (ensure_receiver_examples in scripts/lib.sh), or run: npm ci --prefix {0}",
        dir.display()
    );
    spawn_receiver("node", Path::new("node"), &["server.js"], &dir, database_url, secret).await
}

async fn rust_receiver(database_url: String, secret: &str) -> Receiver {
    use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
    let manager = Manager::from_config(database_url.parse().unwrap(), tokio_postgres::NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    let pool = Pool::builder(manager).max_size(10).runtime(Runtime::Tokio1).build().unwrap();
    railhook_example_receiver::migrate(&pool).await.unwrap();
    let state = railhook_example_receiver::AppState { verifier: Verifier::new([secret.parse::<Secret>().unwrap()]), pool };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, railhook_example_receiver::app(state)).await.unwrap() });
    Receiver { name: "rust", url, database_url, _child: None }
}

/// Between Railhook and a receiver: the first arrival of each `webhook-id` reaches the
/// receiver, and its answer is replaced by a 500 (a lost response); later arrivals pass
/// through. Records every answer the receiver gave, and the first request as raw HTTP.
struct LossyProxy {
    target: String,
    http: reqwest::Client,
    /// webhook-id -> (status, body) of each of the receiver's answers, in order.
    answers: Mutex<HashMap<String, Vec<(u16, String)>>>,
    /// The first request as it arrived from Railhook, for `railhook verify`.
    first_raw: Mutex<Option<Vec<u8>>>,
}

async fn lossy(State(proxy): State<Arc<LossyProxy>>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let id = headers.get("webhook-id").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let mut request = proxy.http.post(format!("{}{}", proxy.target, uri.path())).body(body.clone());
    let mut raw = format!("POST {} HTTP/1.1\r\n", uri.path()).into_bytes();
    for (name, value) in &headers {
        raw.extend_from_slice(format!("{name}: {}\r\n", value.to_str().unwrap_or_default()).as_bytes());
        if !matches!(name.as_str(), "host" | "content-length" | "connection" | "transfer-encoding") {
            request = request.header(name, value);
        }
    }
    raw.extend_from_slice(b"\r\n");
    raw.extend_from_slice(&body);
    let (status, text) = match request.send().await {
        Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
        Err(e) => (599, e.to_string()),
    };
    let first = {
        let mut answers = proxy.answers.lock().unwrap();
        let seen = answers.entry(id).or_default();
        seen.push((status, text.clone()));
        seen.len() == 1
    };
    if first && status == 200 {
        proxy.first_raw.lock().unwrap().get_or_insert(raw);
        return (StatusCode::INTERNAL_SERVER_ERROR, "the receiver's answer was lost on the way").into_response();
    }
    (StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY), text).into_response()
}

async fn start_proxy(target: &str) -> (Arc<LossyProxy>, String) {
    let proxy = Arc::new(LossyProxy { target: target.to_string(), http: reqwest::Client::new(), answers: Mutex::default(), first_raw: Mutex::default() });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().fallback(lossy).with_state(proxy.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (proxy, url)
}

async fn call(http: &reqwest::Client, url: String, key: &str, body: Value) -> Value {
    let resp = http.post(&url).bearer_auth(key).json(&body).send().await.unwrap();
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    assert!((200..300).contains(&status), "{url}: {status} {body}");
    body
}

/// `webhook-id` -> number of effects in a receiver's database.
async fn effects(database_url: &str) -> HashMap<String, i64> {
    let client = railhook_testkit::connect(database_url).await.unwrap();
    client
        .query("SELECT webhook_id, count(*) FROM effects GROUP BY webhook_id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// A request signed the way Railhook signs, sent straight to a receiver.
async fn send_signed(http: &reqwest::Client, url: &str, secret: &str, id: &str, timestamp: i64, body: &str) -> (u16, String) {
    let signature = secret.parse::<Secret>().unwrap().sign(id, timestamp, body.as_bytes());
    let resp = http
        .post(format!("{url}/webhooks"))
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap_or_default())
}

#[tokio::test]
async fn each_example_receiver_has_one_effect_per_delivery_sent_twice() {
    let db = TestDb::new().await;
    let config = test_config(&db);
    let port = railhook_testkit::free_port();
    let api = format!("http://127.0.0.1:{port}");
    let _railhook = common::spawn_railhook(&config, "all", None, &[("RAILHOOK_API__LISTEN", format!("127.0.0.1:{port}"))]);

    // Each receiver starts with the secret its Endpoint is created with (the "old" one).
    let old_secrets: Vec<String> = (0..3).map(|_| EndpointSecret::generate().as_str().to_string()).collect();
    let receivers = [
        python_receiver(receiver_database(&db, "python").await, &old_secrets[0]).await,
        node_receiver(receiver_database(&db, "node").await, &old_secrets[1]).await,
        rust_receiver(receiver_database(&db, "rust").await, &old_secrets[2]).await,
    ];

    let http = reqwest::Client::new();
    eventually(Duration::from_secs(60), "the API to answer", || async {
        http.get(format!("{api}/healthz")).send().await.ok().filter(|r| r.status().is_success()).map(|_| ())
    })
    .await;
    let admin = config.api.admin_token.clone();
    let org = call(&http, format!("{api}/v1/admin/organizations"), &admin, json!({"name": "acme"})).await;
    let project = call(&http, format!("{api}/v1/admin/organizations/{}/projects", org["id"].as_str().unwrap()), &admin, json!({"name": "shop"})).await;
    let key = project["api_key"]["secret"].as_str().unwrap().to_string();

    let mut proxies = Vec::new();
    let mut new_secrets = Vec::new();
    let mut endpoint_ids = Vec::new();
    for (receiver, old) in receivers.iter().zip(&old_secrets) {
        let (proxy, proxy_url) = start_proxy(&receiver.url).await;
        let endpoint = call(&http, format!("{api}/v1/endpoints"), &key, json!({"url": format!("{proxy_url}/webhooks"), "secret": old})).await;
        let id = endpoint["id"].as_str().unwrap().to_string();
        // One second between Attempts, so the forced duplicate comes quickly.
        call(&http, format!("{api}/v1/subscriptions"), &key, json!({"endpoint_id": id, "event_type": "order.*", "retry_delays": [1]})).await;
        // A rotation: Railhook now signs with the new secret and the old one; the receiver
        // holds only the old one.
        let new = EndpointSecret::generate().as_str().to_string();
        call(&http, format!("{api}/v1/endpoints/{id}/rotate-secret"), &key, json!({"secret": new})).await;
        proxies.push(proxy);
        new_secrets.push(new);
        endpoint_ids.push(id);
    }

    for n in 0..EVENTS {
        call(&http, format!("{api}/v1/events"), &key, json!({"type": "order.paid", "payload": {"n": n}})).await;
    }
    let client = db.client().await;
    let expected = (EVENTS * receivers.len()) as i64;
    eventually(Duration::from_secs(120), "every Delivery delivered (after its lost first response)", || async {
        let row = client.query_one("SELECT count(*) FILTER (WHERE status = 'SUCCESS'), count(*) FROM deliveries", &[]).await.unwrap();
        let (done, all): (i64, i64) = (row.get(0), row.get(1));
        (done == expected && all == expected).then_some(())
    })
    .await;

    for ((receiver, proxy), endpoint_id) in receivers.iter().zip(&proxies).zip(&endpoint_ids) {
        let name = receiver.name;
        let endpoint: railhook_core::EndpointId = endpoint_id.parse().unwrap();
        let rows = client.query("SELECT id, attempt_count FROM deliveries WHERE endpoint_id = $1", &[&endpoint.0]).await.unwrap();
        let deliveries: HashSet<String> = rows.iter().map(|r| railhook_core::DeliveryId(r.get::<_, uuid::Uuid>(0)).to_string()).collect();
        assert_eq!(deliveries.len(), EVENTS, "{name}");
        for r in &rows {
            assert_eq!(r.get::<_, i32>(1), 2, "{name}: each Delivery took two Attempts: the lost response, then the duplicate");
        }

        // The duplicate really reached the receiver, and the receiver recognised it.
        let answers = proxy.answers.lock().unwrap().clone();
        assert_eq!(answers.keys().cloned().collect::<HashSet<_>>(), deliveries, "{name}: the webhook-ids that arrived are the Deliveries' ids");
        for (id, seen) in &answers {
            assert_eq!(seen.len(), 2, "{name}: {id} arrived twice: {seen:?}");
            assert_eq!(seen[0].0, 200, "{name}: first arrival of {id}: {seen:?}");
            assert!(seen[0].1.contains("processed"), "{name}: first arrival of {id}: {seen:?}");
            assert_eq!(seen[1].0, 200, "{name}: second arrival of {id}: {seen:?}");
            assert!(seen[1].1.contains("duplicate"), "{name}: second arrival of {id}: {seen:?}");
        }

        // Exactly one effect per Delivery.
        let effects = effects(&receiver.database_url).await;
        assert_eq!(effects.keys().cloned().collect::<HashSet<_>>(), deliveries, "{name}: one effect per Delivery, none other");
        assert!(effects.values().all(|n| *n == 1), "{name}: effects per webhook-id: {effects:?}");
    }

    // Straight to each receiver: forged and stale requests have no effect; a duplicate sent
    // eight times at once has one.
    for (receiver, old) in receivers.iter().zip(&old_secrets) {
        let name = receiver.name;
        let before: i64 = effects(&receiver.database_url).await.values().sum();
        let body = r#"{"id":"evt_forged","type":"order.paid","timestamp":"2026-01-01T00:00:00.000Z","data":{}}"#;
        let stranger = EndpointSecret::generate().as_str().to_string();
        let (status, text) = send_signed(&http, &receiver.url, &stranger, "dlv_forged", now(), body).await;
        assert_eq!(status, 401, "{name}: a forged signature: {text}");
        let (status, text) = send_signed(&http, &receiver.url, old, "dlv_stale", now() - 3600, body).await;
        assert_eq!(status, 401, "{name}: an hour-old timestamp: {text}");
        assert_eq!(effects(&receiver.database_url).await.values().sum::<i64>(), before, "{name}: refused requests have no effect");

        let body = r#"{"id":"evt_concurrent","type":"order.paid","timestamp":"2026-01-01T00:00:00.000Z","data":{"n":99}}"#;
        let ts = now();
        let sends: Vec<_> = (0..8)
            .map(|_| {
                let (http, url, secret) = (http.clone(), receiver.url.clone(), old.clone());
                tokio::spawn(async move { send_signed(&http, &url, &secret, "dlv_concurrent", ts, body).await })
            })
            .collect();
        let mut answers = Vec::new();
        for send in sends {
            answers.push(send.await.unwrap());
        }
        assert!(answers.iter().all(|(s, _)| *s == 200), "{name}: {answers:?}");
        assert_eq!(answers.iter().filter(|(_, t)| t.contains("processed")).count(), 1, "{name}: {answers:?}");
        assert_eq!(effects(&receiver.database_url).await.get("dlv_concurrent"), Some(&1), "{name}: eight concurrent arrivals, one effect");
    }

    // `railhook verify` on a request exactly as Railhook sent it (two signatures: the new
    // secret's and the old one's), with either secret; not with a stranger's.
    let raw = proxies[0].first_raw.lock().unwrap().clone().expect("a captured request");
    let file = std::env::temp_dir().join(format!("railhook-captured-{}.http", uuid::Uuid::new_v4().simple()));
    std::fs::write(&file, &raw).unwrap();
    let verify = |secret: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_railhook"))
            .args(["verify", "--secret", secret, "--request"])
            .arg(&file)
            .env_clear()
            .output()
            .unwrap()
    };
    for secret in [&new_secrets[0], &old_secrets[0]] {
        let out = verify(secret);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("valid: webhook-id dlv_"), "{}", String::from_utf8_lossy(&out.stdout));
    }
    let out = verify(&old_secrets[1]);
    assert_eq!(out.status.code(), Some(1), "another Endpoint's secret: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::remove_file(&file).ok();
}
