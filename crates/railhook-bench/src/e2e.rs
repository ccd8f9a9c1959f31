//! 4. e2e and 5. memory. Events POSTed at fixed rates, each to one of 50 endpoints (its type
//! names the endpoint), all served by the fast local receiver; latency from the 201 to the
//! receiver's arrival. The saturation rate is found by stepping the rate up until the
//! pipeline falls behind; then a run at half of it, and a light run (200 events/s to one
//! endpoint). Baseline: the same load generator driving the receiver directly. Memory: peak
//! RSS (VmHWM) of the api, relay and worker processes over all of it, against their RSS
//! just after start-up. Then the phases on a clean database each (`clean`: `hot_endpoint`
//! and `fanout_10`), which can also run alone.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::http::Receiver;
use crate::load::{self, Plan, Sent};
use crate::procs::{cpu_seconds_of_comm, self_cpu_seconds, Proc};
use crate::stack::Stack;
use crate::{json, percentiles, Args, Percentiles};

mod clean;
pub mod replay;
mod stages;
pub mod retention;

pub use clean::NAMES as CLEAN_PHASES;
pub use clean::report as clean_phases_alone;

pub(crate) const ENDPOINTS: u64 = 50;
const CONNECTIONS: usize = 32;
pub(crate) const LIGHT_TYPE: &str = "bench.light";

/// The event type of request n.
type EventType = Arc<dyn Fn(u64) -> String + Send + Sync>;

pub(crate) fn one_type(t: &'static str) -> EventType {
    Arc::new(move |_| t.to_string())
}

pub(crate) fn round_robin() -> EventType {
    Arc::new(|n| format!("bench.e{}", n % ENDPOINTS))
}

pub(crate) struct Phase {
    pub(crate) rate: f64,
    pub(crate) accepted: usize,
    refused: usize,
    pub(crate) achieved_per_s: f64,
    pub(crate) delivered: usize,
    pub(crate) latency: Percentiles,
    drained_in_s: f64,
    pub(crate) cpu: serde_json::Value,
    /// The worker's counters over the phase: deferrals and busy claims by reason, claims made
    /// again because the Delivery was not visible yet, and the mean claim and finalise batch sizes.
    worker: serde_json::Value,
    /// Each latency stage's count, mean, p50 and p99, and the WAL per Delivery (`stages`).
    stages: serde_json::Value,
}

impl Phase {
    fn sustained(&self) -> bool {
        self.refused == 0 && self.achieved_per_s >= 0.95 * self.rate && self.delivered == self.accepted && self.latency.p99 < 1000.0
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "offered_per_s": self.rate, "accepted": self.accepted, "refused": self.refused,
            "deliveries_per_s": self.achieved_per_s, "delivered": self.delivered,
            "latency_201_to_arrival": json(&self.latency), "drained_in_s": self.drained_in_s,
            "sustained": self.sustained(), "cpu_cores": self.cpu, "worker": self.worker,
            "stages": self.stages["stages"], "wal_bytes_per_delivery": self.stages["wal_bytes_per_delivery"],
            "postgres_cpu_ms_per_delivery": postgres_ms_per_delivery(&self.cpu, self.achieved_per_s),
        })
    }

    fn row(&self, name: &str) {
        println!("{:<22} {:>10.0} {:>12.0} {:>8.2} {:>8.2} {:>8.1}", name, self.rate, self.achieved_per_s, self.latency.p50, self.latency.p99, self.latency.max);
    }
}

/// The baseline: the load generator straight at the receiver, as fast as it goes and at 200/s.
struct Direct {
    max_per_s: f64,
    light: Percentiles,
}

impl Direct {
    async fn measure(stack: &Stack, rx: &Receiver, rx_addr: std::net::SocketAddr, args: &Args) -> anyhow::Result<Direct> {
        let max = plan(stack, rx_addr, None, Duration::from_secs(10), one_type(LIGHT_TYPE));
        let max_per_s = load::run(&Plan { path: "/direct", ..max }).await?.len() as f64 / 10.0;
        let light = plan(stack, rx_addr, Some(200.0), args.duration, one_type(LIGHT_TYPE));
        let sent = load::run(&Plan { path: "/direct", ..light }).await?;
        let ms: Vec<f64> = sent.iter().filter_map(|s| rx.arrived(&s.key).map(|at| ms_between(s.started, at))).collect();
        Ok(Direct { max_per_s, light: percentiles(ms) })
    }
}

/// Peak RSS of the api, relay and worker over e2e against their RSS just after start-up.
struct Memory {
    idle: HashMap<&'static str, u64>,
    peak: HashMap<&'static str, u64>,
}

impl Memory {
    fn of(stack: &Stack, kib: fn(&Proc) -> u64) -> HashMap<&'static str, u64> {
        stack.procs.iter().map(|p| (p.name, kib(p))).collect()
    }

    fn mib(kib: &HashMap<&'static str, u64>) -> serde_json::Value {
        let m = |name: &str| kib[name] as f64 / 1024.0;
        serde_json::json!({"api": m("api"), "relay": m("relay"), "worker": m("worker"), "total": kib.values().sum::<u64>() as f64 / 1024.0})
    }

    fn print(&self) {
        let (peak, idle) = (Memory::mib(&self.peak), Memory::mib(&self.idle));
        println!(
            "memory: peak RSS during e2e (MiB): api {:.1}, relay {:.1}, worker {:.1}; together {:.1} (target < 256); after start-up {:.1}",
            peak["api"].as_f64().unwrap_or(0.0), peak["relay"].as_f64().unwrap_or(0.0), peak["worker"].as_f64().unwrap_or(0.0),
            peak["total"].as_f64().unwrap_or(0.0), idle["total"].as_f64().unwrap_or(0.0)
        );
    }

    fn json(&self) -> serde_json::Value {
        let (peak, idle) = (Memory::mib(&self.peak), Memory::mib(&self.idle));
        let ratio = peak["total"].as_f64().unwrap_or(0.0) / idle["total"].as_f64().unwrap_or(0.0).max(0.001);
        serde_json::json!({
            "name": "memory",
            "figures": {"peak_rss_mib": peak},
            "baseline": {"after_start_rss_mib": idle},
            "ratio": {"peak_over_after_start": ratio},
            "targets": {"total_peak_rss_mib_under": 256},
        })
    }
}

/// e2e on one stack (saturation, half saturation, light, memory), then `clean_phases` on a
/// clean stack each; returns the e2e and the memory reports.
pub async fn e2e(args: &Args, clean_phases: &[&str]) -> anyhow::Result<(serde_json::Value, serde_json::Value)> {
    let (rx, rx_addr) = Receiver::start().await?;
    let mut stack = Stack::start(&args.bin()?, "e2e", true, |_| {}).await?;
    for n in 0..ENDPOINTS {
        stack.endpoint(&format!("http://{rx_addr}/e/{n}"), &format!("bench.e{n}")).await?;
    }
    stack.endpoint(&format!("http://{rx_addr}/light"), LIGHT_TYPE).await?;
    let idle = Memory::of(&stack, Proc::rss_kib);
    let direct = Direct::measure(&stack, &rx, rx_addr, args).await?;

    // Warm-up, then the saturation search, half of it and the light rate.
    phase(&mut stack, &rx, 200.0, Duration::from_secs(3), one_type(LIGHT_TYPE)).await?;
    let steps = saturation_search(&mut stack, &rx, args).await?;
    let Some(saturation) = steps.iter().rev().find(|p| p.sustained()) else {
        bail!("e2e: not even {} events/s was sustained; see target/bench/e2e/*.log", args.start_rate);
    };
    let half = phase(&mut stack, &rx, (saturation.rate / 2.0).round(), args.duration, round_robin()).await?;
    let light = phase(&mut stack, &rx, 200.0, args.duration, one_type(LIGHT_TYPE)).await?;

    let memory = Memory { idle, peak: Memory::of(&stack, Proc::peak_rss_kib) };
    stack.check_running()?;
    stack.stop().await;
    print_e2e(saturation, &half, &light, &direct);
    memory.print();
    let mut report = e2e_json(&steps, saturation, &half, &light, &direct);
    clean::run(args, clean_phases).await?.merge_into(&mut report);
    Ok((report, memory.json()))
}

/// 10 s steps, the rate up by a quarter each time; when not even the start rate holds (a slow
/// or busy machine), down by a fifth until one does. Going up, the first step not sustained
/// is followed by [`REFINE_STEPS`] steps halving the gap between the last sustained rate and
/// the lowest not sustained, so that the result is within about 3 % of where the pipeline
/// stops keeping up instead of up to 25 % below it. The saturation is the highest step
/// sustained (`e2e` keeps the last sustained one; the halving goes up only from a sustained
/// step).
async fn saturation_search(stack: &mut Stack, rx: &Receiver, args: &Args) -> anyhow::Result<Vec<Phase>> {
    let mut steps = Vec::new();
    let mut rate = args.start_rate;
    let mut going_down = false;
    // Going up: (the highest rate sustained, the lowest not sustained, halvings left).
    let mut refining: Option<(f64, f64, usize)> = None;
    loop {
        let p = phase(stack, rx, rate, args.step, round_robin()).await?;
        println!(
            "e2e step: {:>6.0}/s offered, {:>6.0}/s accepted, {} of {} delivered, p50 {:.1} ms, p99 {:.1} ms, worker {}{}",
            p.rate, p.achieved_per_s, p.delivered, p.accepted, p.latency.p50, p.latency.p99, p.worker,
            if p.sustained() { "" } else { "  <- not sustained" }
        );
        let sustained = p.sustained();
        steps.push(p);
        going_down |= !sustained && steps.len() == 1;
        if going_down {
            if sustained || rate <= 50.0 {
                return Ok(steps);
            }
            rate = (rate * 0.8).round();
            continue;
        }
        let (low, high, left) = match refining {
            None if sustained && rate < args.max_rate => {
                rate = (rate * 1.25).round();
                continue;
            }
            None if sustained => return Ok(steps),
            None => (rate / 1.25, rate, REFINE_STEPS),
            Some((low, high, left)) if sustained => (rate.max(low), high, left),
            Some((low, _, left)) => (low, rate, left),
        };
        if left == 0 {
            return Ok(steps);
        }
        refining = Some((low, high, left - 1));
        rate = ((low + high) / 2.0).round();
    }
}

/// The halving steps after the first step not sustained ([`saturation_search`]).
const REFINE_STEPS: usize = 3;

fn print_e2e(saturation: &Phase, half: &Phase, light: &Phase, direct: &Direct) {
    println!();
    println!("e2e: events to {ENDPOINTS} endpoints over {CONNECTIONS} connections, 1 KiB payloads; latency from the 201 to the receiver's arrival (ms)");
    println!("{:<22} {:>10} {:>12} {:>8} {:>8} {:>8}", "", "offered/s", "delivered/s", "p50", "p99", "max");
    saturation.row("saturation (sustained)");
    half.row("half saturation");
    light.row("light, one endpoint");
    println!("{:<22} {:>10} {:>12.0} {:>8} {:>8} {:>8}", "direct (baseline) max", "-", direct.max_per_s, "-", "-", "-");
    println!("{:<22} {:>10} {:>12} {:>8.2} {:>8.2} {:>8.1}", "direct (baseline) 200/s", 200, "-", direct.light.p50, direct.light.p99, direct.light.max);
    println!(
        "railhook sustained / direct = {:.2}; targets (issue 30): at least 2,000 deliveries/s with Postgres at most 0.7 ms of CPU per Delivery (here {:.3} ms), p99 <= 100 ms at half saturation, at 200/s p50 <= 2.5 ms, p99 <= 6 ms, max <= 50 ms",
        saturation.achieved_per_s / direct.max_per_s,
        postgres_ms_per_delivery(&saturation.cpu, saturation.achieved_per_s).unwrap_or(f64::NAN)
    );
    println!("CPU at half saturation (cores): {}", half.cpu);
    println!("worker at half saturation: {}; at the light rate: {}", half.worker, light.worker);
    println!("half saturation {}", stages::describe(&half.stages));
    println!("light rate {}", stages::describe(&light.stages));
    println!();
}

fn e2e_json(steps: &[Phase], saturation: &Phase, half: &Phase, light: &Phase, direct: &Direct) -> serde_json::Value {
    serde_json::json!({
        "name": "e2e",
        "endpoints": ENDPOINTS,
        "connections": CONNECTIONS,
        "payload_bytes": 1024,
        "figures": {
            "saturation_events_per_s": saturation.rate,
            "sustained_deliveries_per_s": saturation.achieved_per_s,
            "steps": steps.iter().map(Phase::json).collect::<Vec<_>>(),
            "half_saturation": half.json(),
            "light_200_per_s": light.json(),
        },
        "baseline": {"direct": {"max_requests_per_s": direct.max_per_s, "at_200_per_s": json(&direct.light)}},
        "ratio": {
            "sustained_over_direct_max": saturation.achieved_per_s / direct.max_per_s,
            "light_p50_over_direct_p50": light.latency.p50 / direct.light.p50.max(0.001),
        },
        "targets": {
            "deliveries_per_s_at_least": 2000, "saturation_postgres_cpu_ms_per_delivery_at_most": 0.7,
            "half_saturation_p99_ms_at_most": 100, "light_p50_ms_at_most": 2.5, "light_p99_ms_at_most": 6, "light_max_ms_at_most": 50,
        },
    })
}

fn plan(stack: &Stack, addr: std::net::SocketAddr, rate: Option<f64>, duration: Duration, event_type: EventType) -> Plan {
    Plan {
        addr,
        api_key: stack.api_key.clone(),
        connections: CONNECTIONS,
        rate,
        warmup: Duration::ZERO,
        duration,
        count: None,
        payload_bytes: 1024,
        event_type,
        keep_deliveries: true,
        path: "/v1/events",
    }
}

fn ms_between(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1000.0
}

/// The Delivery ids of the accepted requests, each with the instant its 201 came back.
fn accepted_deliveries(sent: &[Sent]) -> Vec<(&str, Instant)> {
    sent.iter().filter(|s| s.status.as_u16() == 201).flat_map(|s| s.deliveries.iter().map(move |d| (d.as_str(), s.done))).collect()
}

/// Waits until every Delivery arrived at the receiver or the deadline passed; fails when a
/// component of the stack exited meanwhile.
async fn wait_arrivals(stack: &mut Stack, rx: &Receiver, ids: &[(&str, Instant)], deadline: Instant) -> anyhow::Result<()> {
    loop {
        let missing = rx.arrivals_of(ids.iter().map(|(id, _)| *id)).iter().filter(|a| a.is_none()).count();
        if missing == 0 || Instant::now() > deadline {
            return Ok(());
        }
        stack.check_running()?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One fixed-rate phase; waits (at most 30 s) for every accepted event's Delivery to arrive.
pub(crate) async fn phase(stack: &mut Stack, rx: &Receiver, rate: f64, duration: Duration, event_type: EventType) -> anyhow::Result<Phase> {
    let plan = plan(stack, stack.api_addr, Some(rate), duration, event_type);
    let cpu0 = cpu_snapshot(stack);
    let counters0 = worker_counters(stack).await?;
    let stages0 = stages::snapshot(stack).await;
    let wall = Instant::now();
    let sent: Vec<Sent> = load::run(&plan).await?;
    let load_end = Instant::now();
    let ids = accepted_deliveries(&sent);
    wait_arrivals(stack, rx, &ids, load_end + Duration::from_secs(30)).await?;
    let drained_in_s = load_end.elapsed().as_secs_f64();
    let cpu = cpu_delta(stack, &cpu0, wall.elapsed().as_secs_f64());
    let worker = counters_delta(&counters0, &worker_counters(stack).await?);
    let arrivals = rx.arrivals_of(ids.iter().map(|(id, _)| *id));
    let ms: Vec<f64> = ids.iter().zip(arrivals).filter_map(|((_, done), at)| at.map(|at| ms_between(*done, at))).collect();
    let stages = stages::delta(&stages0, &stages::snapshot(stack).await, ms.len());
    Ok(Phase {
        rate,
        accepted: ids.len(),
        refused: sent.iter().filter(|s| s.status.as_u16() != 201).count(),
        achieved_per_s: ids.len() as f64 / duration.as_secs_f64(),
        delivered: ms.len(),
        latency: percentiles(ms),
        drained_in_s,
        cpu,
        worker,
        stages,
    })
}

/// Postgres' CPU per Delivery over a phase (ms): its cores (from `cpu_delta`) over the
/// Deliveries per second.
fn postgres_ms_per_delivery(cpu: &serde_json::Value, deliveries_per_s: f64) -> Option<f64> {
    let cores = cpu["postgres"].as_f64()?;
    (deliveries_per_s > 0.0).then(|| (cores / deliveries_per_s * 1000.0 * 1000.0).round() / 1000.0)
}

/// The worker's deferral, busy-claim, unseen-claim and batch-size counters from its /metrics.
async fn worker_counters(stack: &Stack) -> anyhow::Result<HashMap<String, f64>> {
    let text = crate::http::get_text(&format!("http://{}/metrics", stack.config.worker.ops_listen)).await?;
    let wanted = [
        "railhook_worker_deferrals_total",
        "railhook_worker_claims_busy_total",
        "railhook_worker_claims_unseen_total",
        "railhook_worker_claim_batch_size_",
        "railhook_worker_finalise_batch_size_",
    ];
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#') && wanted.iter().any(|w| l.starts_with(w)) && !l.contains("_bucket"))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(k, v)| Some((k.to_string(), v.parse::<f64>().ok()?))))
        .collect())
}

fn counters_delta(before: &HashMap<String, f64>, after: &HashMap<String, f64>) -> serde_json::Value {
    let d = |k: &str| after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
    let mean = |name: &str| {
        let n = d(&format!("{name}_count"));
        if n > 0.0 { d(&format!("{name}_sum")) / n } else { 0.0 }
    };
    let by_reason = |metric: &str| -> serde_json::Map<String, serde_json::Value> {
        let prefix = format!("{metric}{{reason=\"");
        after
            .keys()
            .filter_map(|k| k.strip_prefix(prefix.as_str()).and_then(|r| r.strip_suffix("\"}")).map(|r| (r.to_string(), serde_json::json!(d(k)))))
            .collect()
    };
    serde_json::json!({
        "deferrals": by_reason("railhook_worker_deferrals_total"),
        "claims_busy": by_reason("railhook_worker_claims_busy_total"),
        "claims_unseen": d("railhook_worker_claims_unseen_total"),
        "mean_claim_batch": (mean("railhook_worker_claim_batch_size") * 100.0).round() / 100.0,
        "mean_finalise_batch": (mean("railhook_worker_finalise_batch_size") * 100.0).round() / 100.0,
    })
}

/// The sum of a by-reason map of `counters_delta` (`deferrals` or `claims_busy`).
fn total(worker: &serde_json::Value, key: &str) -> f64 {
    worker[key].as_object().map(|m| m.values().filter_map(|v| v.as_f64()).fold(0.0, |a, v| a + v)).unwrap_or(0.0)
}

fn cpu_snapshot(stack: &Stack) -> Vec<(String, f64)> {
    let mut v: Vec<(String, f64)> = stack.procs.iter().map(|p| (p.name.to_string(), p.cpu_seconds())).collect();
    v.push(("bench (load generator + receiver)".into(), self_cpu_seconds()));
    v.push(("postgres".into(), cpu_seconds_of_comm("postgres")));
    v.push(("kafka".into(), cpu_seconds_of_comm("java")));
    v
}

fn cpu_delta(stack: &Stack, before: &[(String, f64)], wall_s: f64) -> serde_json::Value {
    let after = cpu_snapshot(stack);
    let mut map = serde_json::Map::new();
    for ((name, b), (_, a)) in before.iter().zip(after.iter()) {
        map.insert(name.clone(), serde_json::json!(((a - b) / wall_s * 100.0).round() / 100.0));
    }
    serde_json::Value::Object(map)
}
