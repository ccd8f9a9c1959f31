//! 4. e2e and 5. memory. Events POSTed at fixed rates, each to one of 50 endpoints (its type
//! names the endpoint), all served by the fast local receiver; latency from the 201 to the
//! receiver's arrival. The saturation rate is found by stepping the rate up until the
//! pipeline falls behind; then a run at half of it, and a light run (200 events/s to one
//! endpoint). Baseline: the same load generator driving the receiver directly. Memory: peak
//! RSS (VmHWM) of the api, relay and worker processes over all of it, against their RSS
//! just after start-up.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::http::Receiver;
use crate::load::{self, Plan, Sent};
use crate::procs::{cpu_seconds_of_comm, self_cpu_seconds};
use crate::stack::Stack;
use crate::{json, percentiles, Args, Percentiles};

const ENDPOINTS: u64 = 50;
const CONNECTIONS: usize = 32;

struct Phase {
    rate: f64,
    accepted: usize,
    refused: usize,
    achieved_per_s: f64,
    delivered: usize,
    latency: Percentiles,
    drained_in_s: f64,
    cpu: serde_json::Value,
    /// The worker's counters over the phase: deferrals by reason, claims made again because
    /// the Delivery was not visible yet, and the mean claim and finalise batch sizes.
    worker: serde_json::Value,
}

impl Phase {
    fn sustained(&self) -> bool {
        self.refused == 0 && self.achieved_per_s >= 0.95 * self.rate && self.delivered == self.accepted && self.latency.p99 < 1000.0
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "offered_per_s": self.rate, "accepted": self.accepted, "refused": self.refused,
            "deliveries_per_s": self.achieved_per_s, "delivered": self.delivered,
            "latency_201_to_arrival": json(&self.latency), "drained_in_s": self.drained_in_s,
            "sustained": self.sustained(), "cpu_cores": self.cpu, "worker": self.worker,
        })
    }
}

pub async fn e2e(args: &Args) -> anyhow::Result<(serde_json::Value, serde_json::Value)> {
    let (rx, rx_addr) = Receiver::start().await?;
    let mut stack = Stack::start(&args.bin()?, "e2e", true, |_| {}).await?;
    for n in 0..ENDPOINTS {
        stack.endpoint(&format!("http://{rx_addr}/e/{n}"), &format!("bench.e{n}")).await?;
    }
    stack.endpoint(&format!("http://{rx_addr}/light"), "bench.light").await?;
    let idle_rss: HashMap<&str, u64> = stack.procs.iter().map(|p| (p.name, p.rss_kib())).collect();

    // Baseline: the load generator straight at the receiver.
    let direct_max = {
        let plan = plan(&stack, rx_addr, None, Duration::from_secs(10), "bench.light");
        let sent = load::run(&Plan { path: "/direct", ..plan }).await?;
        sent.len() as f64 / 10.0
    };
    let direct_light = {
        let plan = plan(&stack, rx_addr, Some(200.0), args.duration, "bench.light");
        let sent = load::run(&Plan { path: "/direct", ..plan }).await?;
        let ms: Vec<f64> = sent.iter().filter_map(|s| rx.arrived(&s.key).map(|at| ms_between(s.started, at))).collect();
        percentiles(ms)
    };

    // Warm-up, then the saturation search: 10 s steps, the rate up by a quarter each time.
    phase(&mut stack, &rx, 200.0, Duration::from_secs(3), None).await?;
    let mut steps = Vec::new();
    let mut rate = args.start_rate;
    let mut going_down = false;
    loop {
        let p = phase(&mut stack, &rx, rate, args.step, None).await?;
        println!(
            "e2e step: {:>6.0}/s offered, {:>6.0}/s accepted, {} of {} delivered, p50 {:.1} ms, p99 {:.1} ms, worker {}{}",
            p.rate, p.achieved_per_s, p.delivered, p.accepted, p.latency.p50, p.latency.p99, p.worker,
            if p.sustained() { "" } else { "  <- not sustained" }
        );
        let sustained = p.sustained();
        steps.push(p);
        if !sustained && steps.len() == 1 {
            // Not even the start rate (a slow or busy machine): step down until one holds.
            going_down = true;
        }
        if going_down {
            if sustained || rate <= 50.0 {
                break;
            }
            rate = (rate * 0.8).round();
            continue;
        }
        if !sustained || rate >= args.max_rate {
            break;
        }
        rate = (rate * 1.25).round();
    }
    let saturation = steps.iter().rev().find(|p| p.sustained()).map(|p| p.rate);
    let Some(saturation) = saturation else {
        bail!("e2e: not even {} events/s was sustained; see target/bench/e2e/*.log", args.start_rate);
    };
    let sustained_rate = steps.iter().rev().find(|p| p.sustained()).map(|p| p.achieved_per_s).unwrap_or(0.0);
    let half = phase(&mut stack, &rx, (saturation / 2.0).round(), args.duration, None).await?;
    let light = phase(&mut stack, &rx, 200.0, args.duration, Some("bench.light")).await?;

    let peak: HashMap<&str, u64> = stack.procs.iter().map(|p| (p.name, p.peak_rss_kib())).collect();
    stack.check_running()?;
    stack.stop().await;

    let total_peak_mib = peak.values().sum::<u64>() as f64 / 1024.0;
    let total_idle_mib = idle_rss.values().sum::<u64>() as f64 / 1024.0;
    println!();
    println!("e2e: events to {ENDPOINTS} endpoints over {CONNECTIONS} connections, 1 KiB payloads; latency from the 201 to the receiver's arrival (ms)");
    println!("{:<22} {:>10} {:>12} {:>8} {:>8} {:>8}", "", "offered/s", "delivered/s", "p50", "p99", "max");
    for (name, p) in [("saturation (sustained)", steps.iter().rev().find(|p| p.sustained()).unwrap()), ("half saturation", &half), ("light, one endpoint", &light)] {
        println!("{:<22} {:>10.0} {:>12.0} {:>8.2} {:>8.2} {:>8.1}", name, p.rate, p.achieved_per_s, p.latency.p50, p.latency.p99, p.latency.max);
    }
    println!("{:<22} {:>10} {:>12.0} {:>8} {:>8} {:>8}", "direct (baseline) max", "-", direct_max, "-", "-", "-");
    println!("{:<22} {:>10} {:>12} {:>8.2} {:>8.2} {:>8.1}", "direct (baseline) 200/s", 200, "-", direct_light.p50, direct_light.p99, direct_light.max);
    println!(
        "railhook sustained / direct = {:.2}; targets: at least 1,500 deliveries/s, p99 < 150 ms at half saturation, p50 < 5 ms and p99 < 25 ms at 200/s",
        sustained_rate / direct_max
    );
    println!("CPU at half saturation (cores): {}", half.cpu);
    println!("worker at half saturation: {}; at the light rate: {}", half.worker, light.worker);
    println!();
    println!("memory: peak RSS during e2e (MiB): api {:.1}, relay {:.1}, worker {:.1}; together {total_peak_mib:.1} (target < 256); after start-up {total_idle_mib:.1}",
        peak["api"] as f64 / 1024.0, peak["relay"] as f64 / 1024.0, peak["worker"] as f64 / 1024.0);

    let e2e = serde_json::json!({
        "name": "e2e",
        "endpoints": ENDPOINTS,
        "connections": CONNECTIONS,
        "payload_bytes": 1024,
        "figures": {
            "saturation_events_per_s": saturation,
            "sustained_deliveries_per_s": sustained_rate,
            "steps": steps.iter().map(Phase::json).collect::<Vec<_>>(),
            "half_saturation": half.json(),
            "light_200_per_s": light.json(),
        },
        "baseline": {"direct": {"max_requests_per_s": direct_max, "at_200_per_s": json(&direct_light)}},
        "ratio": {
            "sustained_over_direct_max": sustained_rate / direct_max,
            "light_p50_over_direct_p50": light.latency.p50 / direct_light.p50.max(0.001),
        },
        "targets": {"deliveries_per_s_at_least": 1500, "half_saturation_p99_ms_under": 150, "light_p50_ms_under": 5, "light_p99_ms_under": 25},
    });
    let memory = serde_json::json!({
        "name": "memory",
        "figures": {"peak_rss_mib": {"api": peak["api"] as f64 / 1024.0, "relay": peak["relay"] as f64 / 1024.0, "worker": peak["worker"] as f64 / 1024.0, "total": total_peak_mib}},
        "baseline": {"after_start_rss_mib": {"api": idle_rss["api"] as f64 / 1024.0, "relay": idle_rss["relay"] as f64 / 1024.0, "worker": idle_rss["worker"] as f64 / 1024.0, "total": total_idle_mib}},
        "ratio": {"peak_over_after_start": total_peak_mib / total_idle_mib.max(0.001)},
        "targets": {"total_peak_rss_mib_under": 256},
    });
    Ok((e2e, memory))
}

fn plan(stack: &Stack, addr: std::net::SocketAddr, rate: Option<f64>, duration: Duration, event_type: &'static str) -> Plan {
    Plan {
        addr,
        api_key: stack.api_key.clone(),
        connections: CONNECTIONS,
        rate,
        warmup: Duration::ZERO,
        duration,
        payload_bytes: 1024,
        event_type: if event_type == "bench.light" {
            Arc::new(|_| "bench.light".to_string())
        } else {
            Arc::new(|n| format!("bench.e{}", n % ENDPOINTS))
        },
        keep_deliveries: true,
        path: "/v1/events",
    }
}

fn ms_between(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1000.0
}

/// One fixed-rate phase; waits (at most 30 s) for every accepted event's Delivery to arrive.
async fn phase(stack: &mut Stack, rx: &Receiver, rate: f64, duration: Duration, light: Option<&'static str>) -> anyhow::Result<Phase> {
    let plan = plan(stack, stack.api_addr, Some(rate), duration, light.unwrap_or("bench.e"));
    let cpu0 = cpu_snapshot(stack);
    let counters0 = worker_counters(stack).await?;
    let wall = Instant::now();
    let sent: Vec<Sent> = load::run(&plan).await?;
    let load_end = Instant::now();
    let accepted: Vec<&Sent> = sent.iter().filter(|s| s.status.as_u16() == 201).collect();
    let ids: Vec<(&str, Instant)> = accepted.iter().flat_map(|s| s.deliveries.iter().map(move |d| (d.as_str(), s.done))).collect();
    let deadline = load_end + Duration::from_secs(30);
    loop {
        let missing = ids.iter().filter(|(id, _)| rx.arrived(id).is_none()).count();
        if missing == 0 || Instant::now() > deadline {
            break;
        }
        stack.check_running()?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drained_in_s = load_end.elapsed().as_secs_f64();
    let wall_s = wall.elapsed().as_secs_f64();
    let cpu = cpu_delta(stack, &cpu0, wall_s);
    let worker = counters_delta(&counters0, &worker_counters(stack).await?);
    let ms: Vec<f64> = ids.iter().filter_map(|(id, done)| rx.arrived(id).map(|at| ms_between(*done, at))).collect();
    let delivered = ms.len();
    Ok(Phase {
        rate,
        accepted: ids.len(),
        refused: sent.len() - accepted.len(),
        achieved_per_s: ids.len() as f64 / duration.as_secs_f64(),
        delivered,
        latency: percentiles(ms),
        drained_in_s,
        cpu,
        worker,
    })
}

/// The worker's deferral, unseen-claim and batch-size counters from its /metrics.
async fn worker_counters(stack: &Stack) -> anyhow::Result<HashMap<String, f64>> {
    let text = crate::http::get_text(&format!("http://{}/metrics", stack.config.worker.ops_listen)).await?;
    let wanted = ["railhook_worker_deferrals_total", "railhook_worker_claims_unseen_total", "railhook_worker_claim_batch_size_", "railhook_worker_finalise_batch_size_"];
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
    let deferrals: serde_json::Map<String, serde_json::Value> = after
        .keys()
        .filter_map(|k| k.strip_prefix("railhook_worker_deferrals_total{reason=\"").and_then(|r| r.strip_suffix("\"}")).map(|r| (r.to_string(), k)))
        .map(|(r, k)| (r, serde_json::json!(d(k))))
        .collect();
    serde_json::json!({
        "deferrals": deferrals,
        "claims_unseen": d("railhook_worker_claims_unseen_total"),
        "mean_claim_batch": (mean("railhook_worker_claim_batch_size") * 100.0).round() / 100.0,
        "mean_finalise_batch": (mean("railhook_worker_finalise_batch_size") * 100.0).round() / 100.0,
    })
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
