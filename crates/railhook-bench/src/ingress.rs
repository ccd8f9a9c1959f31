//! ingress (issue 16): `POST /ingress/{token}` at saturation (closed loop) over the ingest
//! benchmark's 32 keep-alive connections, 1 KiB bodies, each request signed here and carrying
//! its own provider event id; then at half that rate (open loop) for the tail latency. The
//! Source has one enabled Destination, so each accepted request writes the Incoming Event, a
//! Forward and an outbox row (`railhook_store::incoming::INGRESS_SQL`). What is measured is
//! acceptance (the `202`), not forwarding: the api runs alone, as in the ingest benchmark.
//!
//! The provider is Standard Webhooks (`webhook-id`, `webhook-timestamp`, `webhook-signature`),
//! signed with `railhook_core::signing`: an HMAC-SHA256 over the body like GitHub's, with the
//! event id and a timestamp (checked against the 300 s tolerance) on top.
//!
//! Baseline: the outgoing ingest's rate (`POST /v1/events`, [`ingest::ingest`]) on the same
//! machine in the same invocation: the ingest benchmark's report when it already ran, else it
//! runs first. Targets: ingress at least 0.8 of ingest, p99 under 50 ms at half the maximum.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use bytes::Bytes;
use hyper::StatusCode;
use railhook_core::signing::{sign, EndpointSecret};
use serde_json::{json, Value};

use crate::http::{post_json, Conn};
use crate::load::{self, Sent};
use crate::procs::{cpu_seconds_of_comm, self_cpu_seconds};
use crate::stack::Stack;
use crate::{ingest, percentiles, Args, Percentiles};

const PAYLOAD_BYTES: usize = 1024;
const WARMUP: Duration = Duration::from_secs(2);
const TARGET_RATIO: f64 = 0.8;
const TARGET_P99_MS: f64 = 50.0;

/// The ingress benchmark's report, preceded by the ingest benchmark's when it ran here.
/// `ingest_report`: the ingest benchmark's report of this invocation, if it already ran.
pub async fn ingress(args: &Args, ingest_report: Option<&Value>) -> anyhow::Result<Vec<Value>> {
    let mut reports = Vec::new();
    let ingest_report = match ingest_report {
        Some(r) => r.clone(),
        None => {
            let r = ingest::ingest(args).await?;
            reports.push(r.clone());
            r
        }
    };
    let ingest_rate = ingest_report["figures"]["api"]["events_per_s"].as_f64().context("the ingest report has no figures.api.events_per_s")?;
    let connections = args.connections.unwrap_or(32);
    let run = measure(args, connections).await?;
    print(&run, ingest_rate, connections, args);
    reports.push(report(&run, ingest_rate, connections, args));
    Ok(reports)
}

/// One phase's figures: the 202s' latencies and everything that was not a 202, by status.
struct Phase {
    offered: Option<f64>,
    rate: f64,
    accepted: Percentiles,
    refused: BTreeMap<u16, usize>,
    cpu: Value,
}

struct Run {
    max: Phase,
    half: Phase,
    stored: Value,
}

async fn measure(args: &Args, connections: usize) -> anyhow::Result<Run> {
    let stack = Stack::start(&args.bin()?, "ingress", false, |_| {}).await?;
    let target = Arc::new(Target::create(&stack).await?);
    target.probe().await?;
    let max = phase(&stack, &target, connections, None, args.duration).await?;
    let half = phase(&stack, &target, connections, Some(max.rate / 2.0), args.duration).await?;
    let stored = stored(&stack).await?;
    stack.stop().await;
    Ok(Run { max, half, stored })
}

/// A Source (Standard Webhooks) with one Destination, and how to sign a request to it.
struct Target {
    addr: SocketAddr,
    path: String,
    secret: EndpointSecret,
    body: Bytes,
}

impl Target {
    async fn create(stack: &Stack) -> anyhow::Result<Target> {
        let secret = EndpointSecret::generate();
        let source = post_json(stack.api_addr, "/v1/sources", &stack.api_key, json!({"provider": "standard_webhooks", "secret": secret.as_str(), "name": "bench"})).await?;
        let id = source["id"].as_str().context("source id")?;
        let path = source["ingress_path"].as_str().context("source ingress_path")?.to_string();
        let destinations = format!("/v1/sources/{id}/destinations");
        post_json(stack.api_addr, &destinations, &stack.api_key, json!({"url": "http://127.0.0.1:9/never"})).await?;
        let body = Bytes::from(format!("{{\"type\": \"bench.received\", \"data\": {}}}", load::payload(PAYLOAD_BYTES)));
        Ok(Target { addr: stack.api_addr, path, secret, body })
    }

    /// Request `n`'s headers: its own `webhook-id` (the provider event id: `load` is unique
    /// to each load, so no request is a duplicate), the current time, the signature.
    fn headers(&self, load: &str, n: u64) -> [(&'static str, String); 3] {
        let id = format!("msg_{load}_{n}");
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        let signature = sign(&self.secret, &id, ts, &self.body);
        [("webhook-id", id), ("webhook-timestamp", ts.to_string()), ("webhook-signature", signature)]
    }

    async fn send(&self, conn: &mut Conn, headers: &[(&'static str, String); 3]) -> (StatusCode, Bytes) {
        let refs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        conn.post(&self.path, &refs, self.body.clone()).await.unwrap_or((StatusCode::SERVICE_UNAVAILABLE, Bytes::new()))
    }

    /// One request before the load: a refusal here (a signing mismatch) stops the benchmark
    /// with the API's answer instead of measuring 401s.
    async fn probe(&self) -> anyhow::Result<()> {
        let mut conn = Conn::open(self.addr).await?;
        let (status, body) = self.send(&mut conn, &self.headers("probe", 0)).await;
        if status != StatusCode::ACCEPTED {
            bail!("ingress probe: {status}: {}", String::from_utf8_lossy(&body));
        }
        Ok(())
    }
}

/// Runs the load (closed loop when `rate` is None) and sums up its measured window.
async fn phase(stack: &Stack, target: &Arc<Target>, connections: usize, rate: Option<f64>, duration: Duration) -> anyhow::Result<Phase> {
    let (gen0, api0, pg0) = (self_cpu_seconds(), stack.proc("api").cpu_seconds(), cpu_seconds_of_comm("postgres"));
    let wall = Instant::now();
    let sent = drive(target, connections, rate, duration).await?;
    let wall_s = wall.elapsed().as_secs_f64() - WARMUP.as_secs_f64();
    let share = |cpu: f64| cpu / wall_s;
    let cpu = json!({"load_generator": share(self_cpu_seconds() - gen0), "api": share(stack.proc("api").cpu_seconds() - api0), "postgres": share(cpu_seconds_of_comm("postgres") - pg0)});
    let mut refused = BTreeMap::new();
    let mut ok = Vec::new();
    for s in &sent {
        if s.status == StatusCode::ACCEPTED {
            ok.push((s.done - s.started).as_secs_f64() * 1000.0);
        } else {
            *refused.entry(s.status.as_u16()).or_insert(0) += 1;
        }
    }
    if ok.is_empty() {
        bail!("ingress: no 202 in {} requests ({refused:?})", sent.len());
    }
    let accepted = percentiles(ok);
    Ok(Phase { offered: rate, rate: accepted.count as f64 / duration.as_secs_f64(), accepted, refused, cpu })
}

/// The load over `connections` keep-alive connections: as fast as answered, or `rate`
/// requests per second in all, each connection's due times phase-shifted so they interleave
/// (a late request goes at once, without catching up: the achieved rate shows it). Returns
/// the requests started after the warm-up.
async fn drive(target: &Arc<Target>, connections: usize, rate: Option<f64>, duration: Duration) -> anyhow::Result<Vec<Sent>> {
    let started = Instant::now();
    let window = (started + WARMUP, started + WARMUP + duration);
    let interval = rate.map(|r| Duration::from_secs_f64(connections as f64 / r));
    let load: Arc<str> = uuid::Uuid::new_v4().simple().to_string().into();
    let mut tasks = Vec::new();
    for c in 0..connections {
        let conn = Conn::open(target.addr).await?;
        let first_due = started + interval.map(|i| i.mul_f64(c as f64 / connections as f64)).unwrap_or_default();
        let lane = Lane { load: load.clone(), first: c as u64, step: connections as u64, interval, first_due, window };
        tasks.push(tokio::spawn(lane.run(conn, target.clone())));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await?);
    }
    Ok(all)
}

/// One connection's share of the load: requests first, first + step, ...
struct Lane {
    load: Arc<str>,
    first: u64,
    step: u64,
    interval: Option<Duration>,
    first_due: Instant,
    /// (measured from, end)
    window: (Instant, Instant),
}

impl Lane {
    async fn run(self, mut conn: Conn, target: Arc<Target>) -> Vec<Sent> {
        let mut out = Vec::new();
        let (mut n, mut due) = (self.first, self.first_due);
        loop {
            if let Some(i) = self.interval {
                tokio::time::sleep_until(due.into()).await;
                due += i;
            }
            let headers = target.headers(&self.load, n);
            let t0 = Instant::now();
            if t0 >= self.window.1 {
                return out;
            }
            let (status, _) = target.send(&mut conn, &headers).await;
            let done = Instant::now();
            n += self.step;
            if t0 >= self.window.0 {
                let [(_, key), _, _] = headers;
                out.push(Sent { started: t0, done, status, key, deliveries: Vec::new() });
            }
        }
    }
}

/// What the database holds afterwards: one Incoming Event, one Forward and one outbox row
/// per accepted request (the probe included).
async fn stored(stack: &Stack) -> anyhow::Result<Value> {
    let client = stack.db.client().await;
    let row = client
        .query_one("SELECT (SELECT count(*) FROM incoming_events), (SELECT count(*) FROM forwards), (SELECT count(*) FROM outbox WHERE forward_id IS NOT NULL)", &[])
        .await?;
    let (events, forwards, outbox): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    if forwards != events || outbox != events {
        bail!("ingress stored {events} Incoming Events but {forwards} Forwards and {outbox} outbox rows (one Destination: all three must match)");
    }
    Ok(json!({"incoming_events": events, "forwards": forwards, "outbox_rows": outbox}))
}

fn print(run: &Run, ingest_rate: f64, connections: usize, args: &Args) {
    println!();
    println!("ingress: {connections} connections, 1 KiB Standard Webhooks-signed bodies, one Destination, {} s per phase", args.duration.as_secs());
    println!("{:<22} {:>10} {:>8} {:>8} {:>8} {:>8}  {}", "", "accepted/s", "p50 ms", "p95 ms", "p99 ms", "max ms", "not 202");
    for (name, p) in [("at saturation", &run.max), ("at half (open loop)", &run.half)] {
        let a = &p.accepted;
        println!("{:<22} {:>10.0} {:>8.2} {:>8.2} {:>8.2} {:>8.1}  {:?}", name, p.rate, a.p50, a.p95, a.p99, a.max, p.refused);
    }
    println!("ingest api (POST /v1/events) this invocation: {ingest_rate:.0} events/s");
    println!("ingress / ingest = {:.2} (target: at least {TARGET_RATIO}); p99 at half the maximum {:.1} ms (target: under {TARGET_P99_MS} ms)", run.max.rate / ingest_rate, run.half.accepted.p99);
    println!("CPU at saturation (cores): {}; stored {}", run.max.cpu, run.stored);
}

fn phase_json(p: &Phase) -> Value {
    json!({"offered_per_s": p.offered, "accepted_per_s": p.rate, "latency": crate::json(&p.accepted), "not_accepted": p.refused, "cpu_cores": p.cpu})
}

fn report(run: &Run, ingest_rate: f64, connections: usize, args: &Args) -> Value {
    json!({
        "name": "ingress",
        "provider": "standard_webhooks",
        "destinations": 1,
        "connections": connections,
        "payload_bytes": PAYLOAD_BYTES,
        "duration_s": args.duration.as_secs(),
        "figures": {"saturation": phase_json(&run.max), "half_saturation": phase_json(&run.half), "stored": run.stored},
        "baseline": {"ingest_api": {"events_per_s": ingest_rate}},
        "ratio": {"ingress_over_ingest": run.max.rate / ingest_rate},
        "targets": {"ratio_at_least": TARGET_RATIO, "p99_ms_at_half_saturation_under": TARGET_P99_MS},
    })
}
