//! Forwards through the real binary, as three processes (`railhook api`, `relay`, `worker`):
//! providers' requests signed in the test arrive at `POST /ingress/{token}`, the Destination
//! (the chaos suite's receiver, which verifies the Standard Webhooks re-signing and records
//! each arrival by `webhook-id`, here the Forward id) gets every one, also across a kill -9 of
//! the worker process in the middle of the stream; then a replay and a retry over the API.

mod common;

use std::time::Duration;

use railhook_chaos::receiver::{Profile, Receiver, ReceiverEndpoint};
use railhook_core::signing::{sign, EndpointSecret};
use railhook_testkit::{eventually, test_config, TestDb};
use serde_json::{json, Value};

const SOURCE_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const DESTINATION_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

struct Stack {
    config: railhook_config::Config,
    api: String,
    worker_ops: u16,
}

impl Stack {
    fn spawn(&self, subcommand: &str) -> tokio::process::Child {
        let env = [
            ("RAILHOOK_KAFKA__PARTITIONS", "2".to_string()),
            ("RAILHOOK_RELAY__OPS_LISTEN", format!("127.0.0.1:{}", railhook_testkit::free_port())),
            ("RAILHOOK_API__LISTEN", self.api.trim_start_matches("http://").to_string()),
            ("RAILHOOK_WORKER__OPS_LISTEN", format!("127.0.0.1:{}", self.worker_ops)),
            ("RAILHOOK_WORKER__PROCESSING_TIMEOUT_SECONDS", "5".to_string()),
        ];
        common::spawn_railhook(&self.config, subcommand, None, &env)
    }
}

async fn post(http: &reqwest::Client, url: String, key: &str, body: Value) -> (u16, Value) {
    let resp = http.post(url).bearer_auth(key).json(&body).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// A project, a Standard Webhooks Source and one Destination re-signing with its own secret;
/// (API key, ingress path).
async fn setup(http: &reqwest::Client, stack: &Stack, destination_url: &str) -> (String, String) {
    let token = &stack.config.api.admin_token;
    let (_, org) = post(http, format!("{}/v1/admin/organizations", stack.api), token, json!({"name": "acme"})).await;
    let (status, project) = post(http, format!("{}/v1/admin/organizations/{}/projects", stack.api, org["id"].as_str().unwrap()), token, json!({"name": "shop"})).await;
    assert_eq!(status, 201, "{project}");
    let key = project["api_key"]["secret"].as_str().unwrap().to_string();
    let (status, src) = post(http, format!("{}/v1/sources", stack.api), &key, json!({"provider": "standard_webhooks", "secret": SOURCE_SECRET})).await;
    assert_eq!(status, 201, "{src}");
    let body = json!({"url": destination_url, "auth": {"type": "standard_webhooks", "secret": DESTINATION_SECRET}});
    let (status, dst) = post(http, format!("{}/v1/sources/{}/destinations", stack.api, src["id"].as_str().unwrap()), &key, body).await;
    assert_eq!(status, 201, "{dst}");
    (key, src["ingress_path"].as_str().unwrap().to_string())
}

/// One provider request, signed as the provider would; its Incoming Event id.
async fn provider_sends(http: &reqwest::Client, stack: &Stack, path: &str, n: usize) -> String {
    let body = format!(r#"{{"type": "invoice.paid", "n": {n}}}"#);
    let id = format!("msg_{n}_{}", uuid::Uuid::new_v4().simple());
    let t = chrono_now();
    let signature = sign(&EndpointSecret::parse(SOURCE_SECRET).unwrap(), &id, t, body.as_bytes());
    let resp = http
        .post(format!("{}{path}", stack.api))
        .header("webhook-id", &id)
        .header("webhook-timestamp", t.to_string())
        .header("webhook-signature", signature)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(status, 202, "{answer}");
    answer["id"].as_str().unwrap().to_string()
}

fn chrono_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

async fn forwards(client: &tokio_postgres::Client, status: &str) -> i64 {
    client.query_one("SELECT count(*) FROM forwards WHERE status::text = $1", &[&status]).await.unwrap().get(0)
}

#[tokio::test]
async fn forwards_arrive_through_the_ingress_across_a_kill_9_of_the_worker() {
    let db = TestDb::new().await;
    let config = test_config(&db);
    let stack = Stack { config, api: format!("http://127.0.0.1:{}", railhook_testkit::free_port()), worker_ops: railhook_testkit::free_port() };
    let secret = EndpointSecret::parse(DESTINATION_SECRET).unwrap();
    let receiver = Receiver::start(railhook_testkit::free_port(), vec![ReceiverEndpoint { secret, profile: Profile::Healthy, timeout: Duration::from_secs(30) }], 7).await.unwrap();
    let mut api = stack.spawn("api");
    let mut relay = stack.spawn("relay");
    let mut worker = stack.spawn("worker");
    let http = reqwest::Client::new();
    eventually(Duration::from_secs(60), "the API to answer", || async {
        http.get(format!("{}/healthz", stack.api)).send().await.ok().filter(|r| r.status().is_success()).map(|_| ())
    })
    .await;
    let (key, path) = setup(&http, &stack, &receiver.url(0)).await;
    let client = db.client().await;

    // One request through the whole chain first: the relay's slot and the worker's consumer
    // group are ready once it arrived.
    let mut events = vec![provider_sends(&http, &stack, &path, 0).await];
    eventually(Duration::from_secs(90), "the first Forward to arrive", || async { (receiver.arrival_count() >= 1).then_some(()) }).await;
    // A stream of provider requests; the worker is killed once 20 more arrived (during the
    // stream, or while it works off the backlog), more requests arrive while no worker runs,
    // and it is started again.
    let mut killed = None;
    for n in 1..130 {
        events.push(provider_sends(&http, &stack, &path, n).await);
        if killed.is_none() && receiver.arrival_count() >= 21 {
            killed = Some(n);
            worker.start_kill().unwrap();
            worker.wait().await.unwrap();
        }
    }
    if killed.is_none() {
        eventually(Duration::from_secs(60), "20 more arrivals", || async { (receiver.arrival_count() >= 21).then_some(()) }).await;
        worker.start_kill().unwrap();
        worker.wait().await.unwrap();
    }
    let (processing, arrived) = (forwards(&client, "PROCESSING").await, receiver.arrival_count());
    for n in 130..150 {
        events.push(provider_sends(&http, &stack, &path, n).await);
    }
    worker = stack.spawn("worker");
    eventually(Duration::from_secs(180), "every Forward delivered", || async { (forwards(&client, "SUCCESS").await == 150).then_some(()) }).await;
    let arrivals = receiver.arrivals();
    assert!(arrivals.iter().all(|a| a.verified), "every arrival verifies with the Destination's secret");
    let ids: std::collections::HashSet<String> = client.query("SELECT id FROM forwards", &[]).await.unwrap().iter().map(|r| railhook_core::ForwardId(r.get(0)).to_string()).collect();
    let delivered: std::collections::HashSet<String> = arrivals.iter().filter(|a| a.answered_2xx()).map(|a| a.webhook_id.clone()).collect();
    assert_eq!(ids, delivered, "each Forward arrived (its webhook-id is the Forward id)");
    println!(
        "kill -9 after {} requests sent and {arrived} arrived ({processing} PROCESSING right after it; a finalise sent just before may still commit): 150 Forwards, {} arrivals, {} duplicates",
        killed.map_or("all 130".to_string(), |n| (n + 1).to_string()),
        arrivals.len(),
        arrivals.len() - delivered.len()
    );

    // A replay over the API makes a new Forward, delivered with a new webhook-id.
    let (status, replayed) = post(&http, format!("{}/v1/incoming-events/{}/replay", stack.api, events[0]), &key, json!({})).await;
    assert_eq!(status, 202, "{replayed}");
    let new_id = replayed["forwards"][0]["id"].as_str().unwrap().to_string();
    eventually(Duration::from_secs(60), "the replay delivered", || async { receiver.arrivals().iter().any(|a| a.webhook_id == new_id && a.answered_2xx()).then_some(()) }).await;
    let metrics = http.get(format!("http://127.0.0.1:{}/metrics", stack.worker_ops)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("railhook_worker_forward_attempts_total{result=\"success\",status_class=\"2xx\"}"), "{metrics}");

    for child in [&mut worker, &mut relay, &mut api] {
        child.start_kill().ok();
        child.wait().await.ok();
    }
    let slot = stack.config.relay.slot_name.clone();
    eventually(Duration::from_secs(30), "the slot to be dropped", || {
        let (client, slot) = (&client, &slot);
        async move { client.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", &[slot]).await.ok().map(|_| ()) }
    })
    .await;
}
