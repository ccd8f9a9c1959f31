//! The incoming load (issue 16): Standard Webhooks Sources, each with one or two Destinations
//! on the chaos receiver (re-signing with their own secret, so the receiver verifies every
//! Forward and records it by `webhook-id` = the Forward id), and a paced stream of signed
//! provider requests to `POST /ingress/{token}` that runs through every fault. Every fifth
//! request is a resend of a provider event already accepted (same `webhook-id`, same body,
//! signed again): it must be answered `200` with the first answer's id and make no Forward.
//! A request cut off by a fault (connection error, 5xx, 429) is sent again until answered,
//! as a provider would; the answer to that is `202`, or `200` when the first one was stored.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use railhook_core::signing::{sign, EndpointSecret};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::client::Api;
use crate::forwards::{DestinationSpec, IncomingRequest};

/// Every `RESEND_EVERY + 1`-th request of the stream is a resend.
pub const RESEND_EVERY: usize = 4;

/// One Destination to create: the receiver's endpoint it points at.
pub struct DestinationPlan {
    pub endpoint: usize,
    pub url: String,
    /// The Destination's Standard Webhooks secret (the receiver verifies with it).
    pub secret: String,
}

pub struct SourceSetUp {
    pub ingress_path: String,
    pub secret: EndpointSecret,
}

pub struct IncomingTenancy {
    pub sources: Vec<SourceSetUp>,
    pub destinations: Vec<DestinationSpec>,
}

impl IncomingTenancy {
    /// Forwards an accepted provider event of Source `s` makes.
    pub fn destinations_of(&self, s: usize) -> usize {
        self.destinations.iter().filter(|d| d.source == s).count()
    }
}

/// A Standard Webhooks Source per entry of `plans`, with its Destinations.
pub async fn set_up(api: &Api, key: &str, plans: &[Vec<DestinationPlan>]) -> anyhow::Result<IncomingTenancy> {
    let mut tenancy = IncomingTenancy { sources: Vec::new(), destinations: Vec::new() };
    for (s, destinations) in plans.iter().enumerate() {
        let secret = EndpointSecret::generate();
        let body = json!({"provider": "standard_webhooks", "secret": secret.as_str(), "name": format!("chaos-{s}")});
        let source = api.post("/v1/sources", key, body).await?;
        let id = source["id"].as_str().with_context(|| format!("source: no id in {source}"))?.to_string();
        let ingress_path = source["ingress_path"].as_str().with_context(|| format!("source: no ingress_path in {source}"))?.to_string();
        for d in destinations {
            let body = json!({"url": d.url, "auth": {"type": "standard_webhooks", "secret": d.secret}});
            let created = api.post(&format!("/v1/sources/{id}/destinations"), key, body).await?;
            let text = created["id"].as_str().with_context(|| format!("destination: no id in {created}"))?;
            let id: railhook_core::DestinationId = text.parse()?;
            tenancy.destinations.push(DestinationSpec { id: id.0, source: s, endpoint: d.endpoint });
        }
        tenancy.sources.push(SourceSetUp { ingress_path, secret });
    }
    Ok(tenancy)
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct IncomingStats {
    pub requests: usize,
    pub stored_202: usize,
    pub duplicate_200: usize,
    pub retried_connection_errors: usize,
    pub retried_5xx: usize,
}

#[derive(Default)]
pub struct IncomingSending {
    /// Every answered request (originals and resends).
    pub answered: Mutex<Vec<IncomingRequest>>,
    /// Requests given up on or refused.
    pub refused: Mutex<Vec<String>>,
    pub stats: Mutex<IncomingStats>,
    /// Accepted provider events not resent yet (by request index).
    resend_queue: Mutex<VecDeque<usize>>,
    /// Provider events sent in the bursts around the faults (on top of the stream's).
    pub burst_events: std::sync::atomic::AtomicUsize,
    pub troubles: Mutex<Vec<crate::client::Trouble>>,
}

impl IncomingSending {
    /// Forwards the accepted provider events make (resends and re-asks counted once).
    pub fn expected_forwards(&self, tenancy: &IncomingTenancy) -> usize {
        let answered = self.answered.lock().unwrap();
        let mut seen = std::collections::HashSet::new();
        answered.iter().filter(|r| seen.insert((r.source, r.provider_event_id.clone()))).map(|r| tenancy.destinations_of(r.source)).sum()
    }
}

/// The stream: `count` provider events (request `k` to Source `k mod sources`) and a resend
/// after every `RESEND_EVERY` of them, paced at `rate` requests per second over
/// `concurrency` connections.
#[allow(clippy::too_many_arguments)]
pub async fn send_all(api: &Api, tenancy: &IncomingTenancy, run: &str, count: usize, rate: f64, concurrency: usize, give_up_after: Duration, sending: Arc<IncomingSending>) {
    let slots = count + count / RESEND_EVERY;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let start = Instant::now();
    let give_up = start + give_up_after;
    let workers = (0..concurrency.max(1)).map(|_| async {
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if i >= slots {
                return;
            }
            tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
            let (k, resend) = if (i + 1).is_multiple_of(RESEND_EVERY + 1) {
                match sending.resend_queue.lock().unwrap().pop_front() {
                    Some(k) => (k, true),
                    None => continue,
                }
            } else {
                (i - i / (RESEND_EVERY + 1), false)
            };
            if k < count || resend {
                send_one(api, tenancy, run, k, resend, give_up, &sending).await;
            }
        }
    });
    futures::future::join_all(workers).await;
}

/// A burst around a fault: provider events `first..first + n` sent as fast as the API takes
/// them over `concurrency` connections, each accepted one counted in `progress`.
#[allow(clippy::too_many_arguments)]
pub async fn send_burst(api: &Api, tenancy: &IncomingTenancy, run: &str, first: usize, n: usize, concurrency: usize, give_up_after: Duration, sending: &IncomingSending, progress: &std::sync::atomic::AtomicUsize) {
    use std::sync::atomic::Ordering::SeqCst;
    sending.burst_events.fetch_add(n, SeqCst);
    let next = std::sync::atomic::AtomicUsize::new(first);
    let give_up = Instant::now() + give_up_after;
    let workers = (0..concurrency.max(1)).map(|_| async {
        loop {
            let k = next.fetch_add(1, SeqCst);
            if k >= first + n {
                return;
            }
            send_one(api, tenancy, run, k, false, give_up, sending).await;
            progress.fetch_add(1, SeqCst);
        }
    });
    futures::future::join_all(workers).await;
}

fn provider_event_id(run: &str, k: usize) -> String {
    format!("msg_chaos_{run}_{k}")
}

async fn send_one(api: &Api, tenancy: &IncomingTenancy, run: &str, k: usize, resend: bool, give_up: Instant, sending: &IncomingSending) {
    let s = k % tenancy.sources.len();
    let source = &tenancy.sources[s];
    let id = provider_event_id(run, k);
    let body = json!({"type": "chaos.incoming", "data": {"n": k, "run": run}}).to_string();
    loop {
        if Instant::now() > give_up {
            sending.refused.lock().unwrap().push(format!("incoming {k}: gave up"));
            return;
        }
        sending.stats.lock().unwrap().requests += 1;
        match post_signed(api, source, &id, &body).await {
            Ok(Answer::Named(status, incoming)) => {
                record(sending, IncomingRequest { source: s, provider_event_id: id, resend, status, id: incoming, answered_at: chrono::Utc::now() }, k);
                return;
            }
            // An answer cut off after its status line is asked for again, as are 5xx and 429.
            Ok(Answer::CutOff) => sending.stats.lock().unwrap().retried_connection_errors += 1,
            Err(e) => {
                sending.stats.lock().unwrap().retried_connection_errors += 1;
                sending.troubles.lock().unwrap().push(crate::client::Trouble::of_error(&e));
            }
            Ok(Answer::Trouble(trouble)) => {
                sending.stats.lock().unwrap().retried_5xx += 1;
                sending.troubles.lock().unwrap().push(trouble);
            }
            Ok(Answer::Refused(status)) => {
                sending.refused.lock().unwrap().push(format!("incoming {k}: {status}"));
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn record(sending: &IncomingSending, request: IncomingRequest, k: usize) {
    {
        let mut stats = sending.stats.lock().unwrap();
        if request.status == 202 {
            stats.stored_202 += 1;
        } else {
            stats.duplicate_200 += 1;
        }
    }
    if !request.resend {
        sending.resend_queue.lock().unwrap().push_back(k);
    }
    sending.answered.lock().unwrap().push(request);
}

/// How a provider request was answered.
enum Answer {
    /// 200 or 202 naming the Incoming Event.
    Named(u16, uuid::Uuid),
    /// 200 or 202 whose body did not arrive whole.
    CutOff,
    /// 5xx or 429: asked again.
    Trouble(crate::client::Trouble),
    /// Any other status.
    Refused(u16),
}

/// One provider request, signed now; how it was answered.
async fn post_signed(api: &Api, source: &SourceSetUp, id: &str, body: &str) -> reqwest::Result<Answer> {
    let t = chrono::Utc::now().timestamp();
    let signature = sign(&source.secret, id, t, body.as_bytes());
    let r = api
        .http
        .post(format!("{}{}", api.base(), source.ingress_path))
        .header("webhook-id", id)
        .header("webhook-timestamp", t.to_string())
        .header("webhook-signature", signature)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await?;
    let status = r.status().as_u16();
    if status >= 500 || status == 429 {
        return Ok(Answer::Trouble(crate::client::Trouble::of_answer(r).await));
    }
    if status != 200 && status != 202 {
        return Ok(Answer::Refused(status));
    }
    let answer: Option<Value> = r.json().await.ok();
    let incoming = answer.and_then(|v| v["id"].as_str().and_then(|s| s.parse::<railhook_core::IncomingEventId>().ok())).map(|id| id.0);
    Ok(match incoming {
        Some(id) => Answer::Named(status, id),
        None => Answer::CutOff,
    })
}
