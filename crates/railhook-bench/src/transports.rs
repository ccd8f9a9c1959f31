//! `transports` (issue 32): the same `railhook all` process on the Kafka transport and on the
//! inline one, side by side, alternating (kafka, inline, kafka, inline) so that a machine that
//! gets busier or quieter during the run touches both alike. Each run is a fresh database and
//! process with 50 Endpoints and a light one: a warm-up, the light rate (200 events/s to one
//! Endpoint) and a busy rate (`--transports-busy-rate`, 800 events/s by default, round robin
//! over the 50 Endpoints), each for `--duration`. Latency from the 201 to the receiver's
//! arrival, as in e2e. Reported: each run, the mean of each transport's runs, and the ratios
//! inline over Kafka (below 1: inline is faster).

use std::time::Duration;

use anyhow::bail;
use railhook_config::TransportKind;

use crate::e2e::{one_type, phase, round_robin, Phase, ENDPOINTS, LIGHT_TYPE};
use crate::http::Receiver;
use crate::stack::Stack;
use crate::Args;

/// Rounds of (kafka, inline).
const ROUNDS: usize = 2;

struct Run {
    transport: TransportKind,
    light: Phase,
    busy: Phase,
}

pub async fn run(args: &Args) -> anyhow::Result<serde_json::Value> {
    let (rx, rx_addr) = Receiver::start().await?;
    let mut runs = Vec::new();
    for round in 0..ROUNDS {
        for transport in [TransportKind::Kafka, TransportKind::Inline] {
            let name = format!("transports_{}_{round}", transport.as_str());
            let mut stack = Stack::start_all(&args.bin()?, &name, transport).await?;
            for n in 0..ENDPOINTS {
                stack.endpoint(&format!("http://{rx_addr}/e/{n}"), &format!("bench.e{n}")).await?;
            }
            stack.endpoint(&format!("http://{rx_addr}/light"), LIGHT_TYPE).await?;
            phase(&mut stack, &rx, 200.0, Duration::from_secs(3), one_type(LIGHT_TYPE)).await?;
            let light = phase(&mut stack, &rx, 200.0, args.duration, one_type(LIGHT_TYPE)).await?;
            let busy = phase(&mut stack, &rx, args.transports_busy_rate, args.duration, round_robin()).await?;
            stack.check_running()?;
            stack.stop().await;
            println!(
                "transports round {round} {:<6}: light p50 {:.2} ms p99 {:.2} ms max {:.1} ms; busy {:.0}/s offered, {:.0}/s accepted, {} of {} delivered, p50 {:.2} ms p99 {:.2} ms",
                transport.as_str(), light.latency.p50, light.latency.p99, light.latency.max, busy.rate, busy.achieved_per_s, busy.delivered, busy.accepted, busy.latency.p50, busy.latency.p99
            );
            runs.push(Run { transport, light, busy });
        }
    }
    if runs.iter().any(|r| r.light.delivered == 0) {
        bail!("transports: a run delivered nothing at the light rate; see target/bench/transports_*/all.log");
    }
    let mean = |t: TransportKind, f: &dyn Fn(&Run) -> f64| {
        let v: Vec<f64> = runs.iter().filter(|r| r.transport == t).map(f).collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let summary = |t: TransportKind| {
        serde_json::json!({
            "light_p50_ms": mean(t, &|r| r.light.latency.p50),
            "light_p99_ms": mean(t, &|r| r.light.latency.p99),
            "light_max_ms": mean(t, &|r| r.light.latency.max),
            "busy_deliveries_per_s": mean(t, &|r| r.busy.achieved_per_s),
            "busy_p50_ms": mean(t, &|r| r.busy.latency.p50),
            "busy_p99_ms": mean(t, &|r| r.busy.latency.p99),
            "busy_cpu_cores": mean(t, &|r| r.busy.cpu["all"].as_f64().unwrap_or(0.0) + r.busy.cpu["kafka"].as_f64().unwrap_or(0.0)),
        })
    };
    let (kafka, inline) = (summary(TransportKind::Kafka), summary(TransportKind::Inline));
    let ratio = |k: &str| inline[k].as_f64().unwrap_or(f64::NAN) / kafka[k].as_f64().unwrap_or(f64::NAN);
    let report = serde_json::json!({
        "name": "transports",
        "rounds": ROUNDS,
        "busy_rate": args.transports_busy_rate,
        "figures": {"kafka": kafka, "inline": inline},
        "runs": runs.iter().map(|r| serde_json::json!({"transport": r.transport.as_str(), "light": r.light.json(), "busy": r.busy.json()})).collect::<Vec<_>>(),
        "ratio": {
            "inline_over_kafka_light_p50": ratio("light_p50_ms"),
            "inline_over_kafka_light_p99": ratio("light_p99_ms"),
            "inline_over_kafka_busy_p99": ratio("busy_p99_ms"),
            "inline_over_kafka_busy_cpu": ratio("busy_cpu_cores"),
        },
    });
    println!();
    println!("transports (railhook all, {ROUNDS} rounds each, alternating): mean light p50 / p99 / max (ms), busy delivered/s, busy p50 / p99 (ms), CPU cores at the busy rate (railhook + Kafka)");
    for (name, s) in [("kafka", &report["figures"]["kafka"]), ("inline", &report["figures"]["inline"])] {
        println!(
            "{name:<8} {:>7.2} {:>7.2} {:>7.1}   {:>6.0}/s {:>7.2} {:>8.2}   {:.2}",
            s["light_p50_ms"].as_f64().unwrap_or(f64::NAN),
            s["light_p99_ms"].as_f64().unwrap_or(f64::NAN),
            s["light_max_ms"].as_f64().unwrap_or(f64::NAN),
            s["busy_deliveries_per_s"].as_f64().unwrap_or(f64::NAN),
            s["busy_p50_ms"].as_f64().unwrap_or(f64::NAN),
            s["busy_p99_ms"].as_f64().unwrap_or(f64::NAN),
            s["busy_cpu_cores"].as_f64().unwrap_or(f64::NAN),
        );
    }
    println!("inline / kafka: {}", report["ratio"]);
    println!();
    Ok(report)
}
