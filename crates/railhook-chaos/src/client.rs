//! The client: creates the tenancy, Endpoints and Subscriptions through the API, then sends
//! the known set of events, each with its own `Idempotency-Key`, retrying the same key on
//! connection errors and 5xx until the API answers 201 (or 200, the replay of that key).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::checker::{AcceptedEvent, SubscriptionSpec};

pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
}

impl Api {
    pub fn new(base: String) -> Api {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).pool_max_idle_per_host(16).build().expect("reqwest client");
        Api { base, http }
    }

    /// POST with retries on connection errors and 5xx (set-up only: before any fault).
    async fn post(&self, path: &str, bearer: &str, body: Value) -> anyhow::Result<Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let sent = self.http.post(format!("{}{path}", self.base)).bearer_auth(bearer).json(&body).send().await;
            match sent {
                Ok(r) if r.status().is_success() => return Ok(r.json().await?),
                Ok(r) if r.status().is_client_error() => {
                    let status = r.status();
                    anyhow::bail!("POST {path}: {status}: {}", r.text().await.unwrap_or_default())
                }
                Ok(r) if Instant::now() > deadline => anyhow::bail!("POST {path}: {}", r.status()),
                Err(e) if Instant::now() > deadline => return Err(e).with_context(|| format!("POST {path}")),
                _ => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
    }
}

/// One Endpoint to create.
pub struct EndpointPlan {
    pub url: String,
    pub secret: String,
    pub timeout_seconds: i64,
}

pub struct Tenancy {
    pub api_key: String,
    pub endpoint_ids: Vec<uuid::Uuid>,
    pub subscriptions: Vec<SubscriptionSpec>,
}

fn id_of(v: &Value, what: &str) -> anyhow::Result<String> {
    v["id"].as_str().map(str::to_string).with_context(|| format!("{what}: no id in {v}"))
}

/// Event type of event `i` for `n` endpoints: `chaos.e<j>.x`, every tenth `chaos.e<j>.fan`.
pub fn event_type(i: usize, n: usize) -> String {
    let kind = if i % 10 == 0 { "fan" } else { "x" };
    format!("chaos.e{}.{kind}", i % n)
}

/// Org, project, Endpoints, and per Endpoint `j` two Subscriptions: `chaos.e<j>.*` and the
/// fan-out `chaos.e<j-1>.fan` (every tenth event goes to two Endpoints).
pub async fn set_up(api: &Api, admin_token: &str, endpoints: &[EndpointPlan], retry_delays: &[i64], max_attempts: i64) -> anyhow::Result<Tenancy> {
    let org = api.post("/v1/admin/organizations", admin_token, json!({"name": "chaos"})).await?;
    let org = id_of(&org, "organization")?;
    let project = api.post(&format!("/v1/admin/organizations/{org}/projects"), admin_token, json!({"name": "chaos"})).await?;
    let api_key = project["api_key"]["secret"].as_str().context("project: no api_key.secret")?.to_string();
    let n = endpoints.len();
    let mut endpoint_ids = Vec::new();
    for ep in endpoints {
        let created = api.post("/v1/endpoints", &api_key, json!({"url": ep.url, "secret": ep.secret})).await?;
        let id: railhook_core::EndpointId = id_of(&created, "endpoint")?.parse()?;
        endpoint_ids.push(id.0);
    }
    let mut subscriptions = Vec::new();
    for (j, ep) in endpoints.iter().enumerate() {
        let patterns = [format!("chaos.e{j}.*"), format!("chaos.e{}.fan", (j + n - 1) % n)];
        for pattern in patterns {
            let created = api
                .post(
                    "/v1/subscriptions",
                    &api_key,
                    json!({
                        "endpoint_id": railhook_core::EndpointId(endpoint_ids[j]).to_string(),
                        "event_type": pattern,
                        "max_attempts": max_attempts,
                        "timeout_seconds": ep.timeout_seconds,
                        "retry_delays": retry_delays,
                    }),
                )
                .await?;
            let id: railhook_core::SubscriptionId = id_of(&created, "subscription")?.parse()?;
            subscriptions.push(SubscriptionSpec { id: id.0, endpoint_id: endpoint_ids[j], pattern, timeout_seconds: ep.timeout_seconds });
        }
    }
    Ok(Tenancy { api_key, endpoint_ids, subscriptions })
}

/// What the sending saw.
#[derive(Debug, Default, Clone, Serialize)]
pub struct SendStats {
    pub requests: usize,
    pub created_201: usize,
    pub replayed_200: usize,
    pub retried_connection_errors: usize,
    pub retried_5xx: usize,
    pub rejected: Vec<String>,
}

pub struct Sending {
    pub accepted: Mutex<Vec<AcceptedEvent>>,
    pub accepted_count: AtomicUsize,
    pub stats: Mutex<SendStats>,
}

/// Sends events `0..count` at `rate` per second over `concurrency` connections; returns when
/// every one was accepted or refused, or `give_up_after` passed.
pub async fn send_all(api: &Api, key: &str, run: &str, count: usize, endpoints: usize, rate: f64, concurrency: usize, give_up_after: Duration, sending: Arc<Sending>) {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let give_up = start + give_up_after;
    let workers = (0..concurrency).map(|_| {
        let next = next.clone();
        let sending = sending.clone();
        async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= count {
                    return;
                }
                // Pacing: event i is not sent before start + i / rate.
                tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
                send_one(api, key, run, i, endpoints, give_up, &sending).await;
            }
        }
    });
    futures::future::join_all(workers).await;
}

async fn send_one(api: &Api, key: &str, run: &str, i: usize, endpoints: usize, give_up: Instant, sending: &Sending) {
    let event_type = event_type(i, endpoints);
    let body = json!({"type": event_type, "payload": {"n": i, "run": run}});
    let idempotency_key = format!("chaos-{run}-{i}");
    loop {
        if Instant::now() > give_up {
            sending.stats.lock().unwrap().rejected.push(format!("event {i}: gave up"));
            return;
        }
        sending.stats.lock().unwrap().requests += 1;
        let sent = api
            .http
            .post(format!("{}/v1/events", api.base))
            .bearer_auth(key)
            .header("Idempotency-Key", &idempotency_key)
            .json(&body)
            .send()
            .await;
        match sent {
            Ok(r) if r.status().as_u16() == 201 || r.status().as_u16() == 200 => {
                let replay = r.status().as_u16() == 200;
                let value: Result<Value, _> = r.json().await;
                let id = value.ok().and_then(|v| v["id"].as_str().and_then(|s| s.parse::<railhook_core::EventId>().ok()));
                match id {
                    Some(id) => {
                        {
                            let mut stats = sending.stats.lock().unwrap();
                            if replay {
                                stats.replayed_200 += 1;
                            } else {
                                stats.created_201 += 1;
                            }
                        }
                        sending.accepted.lock().unwrap().push(AcceptedEvent { index: i, id: id.0, event_type });
                        sending.accepted_count.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    // The answer was cut off after its status line: ask again (same key).
                    None => sending.stats.lock().unwrap().retried_connection_errors += 1,
                }
            }
            Ok(r) if r.status().is_server_error() || r.status().as_u16() == 429 => sending.stats.lock().unwrap().retried_5xx += 1,
            Ok(r) => {
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                sending.stats.lock().unwrap().rejected.push(format!("event {i}: {status} {text}"));
                return;
            }
            Err(_) => sending.stats.lock().unwrap().retried_connection_errors += 1,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
