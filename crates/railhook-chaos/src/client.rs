//! The client: creates the tenancy, Endpoints and Subscriptions through the API, then sends
//! the known set of events, each with its own `Idempotency-Key`, retrying the same key on
//! connection errors and 5xx until the API answers 201 (or 200, the replay of that key).
//! Besides the paced stream, [`send_burst`] sends a burst of events to the ordered
//! Subscriptions as fast as the API takes them (the fault controller fires one around each
//! fault).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::checker::{AcceptedEvent, SubscriptionSpec};

/// The api processes: each request goes to the next in turn.
#[derive(Clone)]
pub struct Api {
    bases: Arc<Vec<String>>,
    next: Arc<AtomicUsize>,
    pub http: reqwest::Client,
}

/// Something the client saw that was not the answer it wanted: a 5xx (with whether its body
/// was the API's JSON error), a 429, a connection error or a timeout. By time, so that the
/// report can say what each fault's clients saw.
#[derive(Debug, Clone, Serialize)]
pub struct Trouble {
    pub at: DateTime<Utc>,
    /// `5xx`, `429`, `timeout` or `connection`.
    pub what: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// A 5xx's body was `{"error": {"code": ..., "message": ...}}`.
    pub json_error: bool,
}

impl Trouble {
    pub fn of_error(e: &reqwest::Error) -> Trouble {
        Trouble { at: Utc::now(), what: if e.is_timeout() { "timeout" } else { "connection" }, status: None, json_error: false }
    }

    /// A 5xx or 429 answer, its body read.
    pub async fn of_answer(r: reqwest::Response) -> Trouble {
        let status = r.status().as_u16();
        let body: Option<Value> = r.json().await.ok();
        let json_error = body.is_some_and(|b| b["error"]["code"].is_string() && b["error"]["message"].is_string());
        Trouble { at: Utc::now(), what: if status == 429 { "429" } else { "5xx" }, status: Some(status), json_error }
    }
}

impl Api {
    pub fn new(bases: Vec<String>) -> Api {
        assert!(!bases.is_empty(), "at least one api process");
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).pool_max_idle_per_host(16).build().expect("reqwest client");
        Api { bases: Arc::new(bases), next: Arc::new(AtomicUsize::new(0)), http }
    }

    /// The next api process's base URL.
    pub fn base(&self) -> &str {
        &self.bases[self.next.fetch_add(1, Ordering::Relaxed) % self.bases.len()]
    }

    /// POST with retries on connection errors and 5xx (set-up only: before any fault).
    pub(crate) async fn post(&self, path: &str, bearer: &str, body: Value) -> anyhow::Result<Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let sent = self.http.post(format!("{}{path}", self.base())).bearer_auth(bearer).json(&body).send().await;
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
    /// Gets a third, ordered Subscription `chaos.o<j>.*` (its events come in bursts).
    pub ordered: bool,
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

/// Event type of the ordered bursts' events for Endpoint `j`: `chaos.o<j>.x`.
pub fn ordered_event_type(j: usize) -> String {
    format!("chaos.o{j}.x")
}

/// Org, project, Endpoints, and per Endpoint `j` two Subscriptions: `chaos.e<j>.*` and the
/// fan-out `chaos.e<j-1>.fan` (every tenth event goes to two Endpoints); an ordered Endpoint
/// a third, `chaos.o<j>.*` with `ordering: true` (unordered Subscriptions share the Endpoint,
/// and must not be held back by it).
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
        let mut patterns = vec![(format!("chaos.e{j}.*"), false), (format!("chaos.e{}.fan", (j + n - 1) % n), false)];
        if ep.ordered {
            patterns.push((format!("chaos.o{j}.*"), true));
        }
        for (pattern, ordering) in patterns {
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
                        "ordering": ordering,
                    }),
                )
                .await?;
            let id: railhook_core::SubscriptionId = id_of(&created, "subscription")?.parse()?;
            subscriptions.push(SubscriptionSpec { id: id.0, endpoint_id: endpoint_ids[j], pattern, timeout_seconds: ep.timeout_seconds, ordering });
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

#[derive(Default)]
pub struct Sending {
    /// Every accepted event, the paced stream's and the bursts'.
    pub accepted: Mutex<Vec<AcceptedEvent>>,
    /// Accepted events of the paced stream (the faults are planned against this count).
    pub accepted_count: AtomicUsize,
    /// Accepted events of the ordered bursts.
    pub burst_accepted: AtomicUsize,
    pub stats: Mutex<SendStats>,
    pub troubles: Mutex<Vec<Trouble>>,
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
                send_one(api, key, run, i, event_type(i, endpoints), give_up, &sending, &sending.accepted_count).await;
            }
        }
    });
    futures::future::join_all(workers).await;
}

/// Sends events `first..first + types.len()` (event `first + k` of type `types[k]`) over
/// `concurrency` connections as fast as the API takes them, counting each accepted one in
/// `sending.burst_accepted` and in `progress`.
#[allow(clippy::too_many_arguments)]
pub async fn send_burst(api: &Api, key: &str, run: &str, first: usize, types: Vec<String>, concurrency: usize, give_up_after: Duration, sending: Arc<Sending>, progress: Arc<AtomicUsize>) {
    let next = AtomicUsize::new(0);
    let give_up = Instant::now() + give_up_after;
    let workers = (0..concurrency.max(1)).map(|_| async {
        loop {
            let k = next.fetch_add(1, Ordering::SeqCst);
            let Some(event_type) = types.get(k) else { return };
            send_one(api, key, run, first + k, event_type.clone(), give_up, &sending, &sending.burst_accepted).await;
            progress.fetch_add(1, Ordering::SeqCst);
        }
    });
    futures::future::join_all(workers).await;
}

#[allow(clippy::too_many_arguments)]
async fn send_one(api: &Api, key: &str, run: &str, i: usize, event_type: String, give_up: Instant, sending: &Sending, counter: &AtomicUsize) {
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
            .post(format!("{}/v1/events", api.base()))
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
                        sending.accepted.lock().unwrap().push(AcceptedEvent { index: i, id: id.0, event_type, accepted_at: Utc::now() });
                        counter.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    // The answer was cut off after its status line: ask again (same key).
                    None => sending.stats.lock().unwrap().retried_connection_errors += 1,
                }
            }
            Ok(r) if r.status().is_server_error() || r.status().as_u16() == 429 => {
                sending.stats.lock().unwrap().retried_5xx += 1;
                let trouble = Trouble::of_answer(r).await;
                sending.troubles.lock().unwrap().push(trouble);
            }
            Ok(r) => {
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                sending.stats.lock().unwrap().rejected.push(format!("event {i}: {status} {text}"));
                return;
            }
            Err(e) => {
                sending.stats.lock().unwrap().retried_connection_errors += 1;
                sending.troubles.lock().unwrap().push(Trouble::of_error(&e));
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
