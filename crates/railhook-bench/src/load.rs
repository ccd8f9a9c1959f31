//! The load generator: events POSTed to /v1/events over N keep-alive connections, either as
//! fast as the server answers (closed loop) or at a fixed rate spread over the connections
//! (open loop), for a duration or a number of requests. Its own CPU time is reported next to the figures: it shares the 2 cores.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::StatusCode;

use crate::http::Conn;

/// One request's record.
pub struct Sent {
    pub started: Instant,
    pub done: Instant,
    pub status: StatusCode,
    /// The Idempotency-Key it carried (the receiver records it when driven directly).
    pub key: String,
    /// The Delivery ids of a 201 (only when asked for: parsing costs the generator CPU).
    pub deliveries: Vec<String>,
}

pub struct Plan {
    pub addr: SocketAddr,
    pub api_key: String,
    pub connections: usize,
    /// None: closed loop. Some(r): r requests per second in all.
    pub rate: Option<f64>,
    pub warmup: Duration,
    /// The load stops at the end of the warm-up plus this, or after `count` requests.
    pub duration: Duration,
    /// Some(n): n requests in all (warm-up included), then stop; None: until `duration` ends.
    pub count: Option<u64>,
    pub payload_bytes: usize,
    /// Event type of request n.
    pub event_type: Arc<dyn Fn(u64) -> String + Send + Sync>,
    pub keep_deliveries: bool,
    pub path: &'static str,
}

/// A JSON payload object of about `bytes` bytes.
pub fn payload(bytes: usize) -> String {
    let filler = "x".repeat(bytes.saturating_sub(40));
    format!("{{\"order_id\": 12345, \"note\": \"{filler}\"}}")
}

/// Runs the plan; returns the records of the measured window (after the warm-up).
pub async fn run(plan: &Plan) -> anyhow::Result<Vec<Sent>> {
    let payload = payload(plan.payload_bytes);
    let started = Instant::now();
    let end = started + plan.warmup + plan.duration;
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let mut tasks = Vec::new();
    for c in 0..plan.connections {
        let nonce = nonce.clone();
        let mut conn = Conn::open(plan.addr).await?;
        let auth = format!("Bearer {}", plan.api_key);
        let payload = payload.clone();
        let event_type = plan.event_type.clone();
        let keep = plan.keep_deliveries;
        let path = plan.path;
        let measure_from = started + plan.warmup;
        let per_conn = plan.rate.map(|r| r / plan.connections as f64);
        let conns = plan.connections as u64;
        let count = plan.count.unwrap_or(u64::MAX);
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            let mut n = c as u64;
            // Open loop: this connection's requests are due every 1/per_conn s, phase-shifted
            // so the connections interleave; a late request is sent at once (no catching up
            // beyond that: the achieved rate shows it).
            let interval = per_conn.map(|r| Duration::from_secs_f64(1.0 / r));
            let mut due = started + interval.map(|i| i.mul_f64(c as f64 / conns as f64)).unwrap_or_default();
            loop {
                if let Some(i) = interval {
                    let now = Instant::now();
                    if due > now {
                        tokio::time::sleep_until(due.into()).await;
                    }
                    due += i;
                }
                let t0 = Instant::now();
                if t0 >= end || n >= count {
                    break;
                }
                let key = format!("bench-{nonce}-{n}");
                let body = format!("{{\"type\": \"{}\", \"payload\": {payload}}}", event_type(n));
                let result = conn.post(path, &[("authorization", &auth), ("idempotency-key", &key)], Bytes::from(body)).await;
                let done = Instant::now();
                n += conns;
                let (status, bytes) = match result {
                    Ok(r) => r,
                    Err(_) => (StatusCode::SERVICE_UNAVAILABLE, Bytes::new()),
                };
                if t0 < measure_from {
                    continue;
                }
                let deliveries = if keep && status == StatusCode::CREATED { delivery_ids(&bytes) } else { Vec::new() };
                out.push(Sent { started: t0, done, status, key, deliveries });
            }
            out
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await?);
    }
    Ok(all)
}

fn delivery_ids(body: &[u8]) -> Vec<String> {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else { return Vec::new() };
    v["deliveries"].as_array().map(|a| a.iter().filter_map(|d| d["id"].as_str().map(str::to_owned)).collect()).unwrap_or_default()
}
