//! `tracing` (issue 33): what OpenTelemetry export costs. The same `railhook all` (Kafka
//! transport) with export off and with it on (every Event traced and sampled: five spans per
//! Delivery, exported over OTLP/HTTP to a sink in this process that answers 200 at once, so
//! the figure is Railhook's cost, not a collector's), alternating off, on, off, on so that a
//! machine that gets busier or quieter during the run touches both alike. Each run is a fresh
//! database and process: a warm-up, then the light rate (200 events/s to one Endpoint) for
//! `--duration`; `--tracing-rounds` rounds (2 by default). Latency from the 201 to the receiver's arrival, as in e2e. Reported: each
//! run, the mean of each mode's runs, the ratio on over off of the light p99 (target: within
//! 10 %), each round's p99 ratio and their median, and what the sink received (export
//! requests and bytes).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use railhook_config::TransportKind;

use crate::e2e::{one_type, phase, Phase, LIGHT_TYPE};
use crate::http::Receiver;
use crate::stack::Stack;
use crate::Args;

pub const NAME: &str = "tracing";


/// The OTLP/HTTP sink: counts export requests and their bytes, answers 200 with an empty
/// (valid) ExportTraceServiceResponse.
#[derive(Default)]
struct Sink {
    requests: AtomicU64,
    bytes: AtomicU64,
}

async fn start_sink() -> anyhow::Result<(Arc<Sink>, std::net::SocketAddr)> {
    let sink = Arc::new(Sink::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let s = sink.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let s = s.clone();
            async move {
                s.requests.fetch_add(1, Ordering::Relaxed);
                s.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                ([(axum::http::header::CONTENT_TYPE, "application/x-protobuf")], Vec::<u8>::new())
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((sink, addr))
}

struct Run {
    on: bool,
    light: Phase,
}

pub async fn run(args: &Args) -> anyhow::Result<serde_json::Value> {
    let (rx, rx_addr) = Receiver::start().await?;
    let (sink, sink_addr) = start_sink().await?;
    let mut runs = Vec::new();
    let (mut sink_requests, mut sink_bytes) = (0, 0);
    for round in 0..args.tracing_rounds {
        for on in [false, true] {
            let name = format!("tracing_{}_{round}", if on { "on" } else { "off" });
            let env: Vec<(&str, String)> = if on {
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{sink_addr}")), ("OTEL_SERVICE_NAME", "railhook-bench".into())]
            } else {
                Vec::new()
            };
            let mut stack = Stack::start_all_with(&args.bin()?, &name, TransportKind::Kafka, &env).await?;
            stack.endpoint(&format!("http://{rx_addr}/light"), LIGHT_TYPE).await?;
            phase(&mut stack, &rx, 200.0, Duration::from_secs(3), one_type(LIGHT_TYPE)).await?;
            let before = (sink.requests.load(Ordering::Relaxed), sink.bytes.load(Ordering::Relaxed));
            let light = phase(&mut stack, &rx, 200.0, args.duration, one_type(LIGHT_TYPE)).await?;
            stack.check_running()?;
            stack.stop().await;
            if on {
                sink_requests += sink.requests.load(Ordering::Relaxed) - before.0;
                sink_bytes += sink.bytes.load(Ordering::Relaxed) - before.1;
            }
            println!(
                "tracing round {round} {:<3}: light p50 {:.2} ms p99 {:.2} ms max {:.1} ms, {} of {} delivered",
                if on { "on" } else { "off" }, light.latency.p50, light.latency.p99, light.latency.max, light.delivered, light.accepted
            );
            runs.push(Run { on, light });
        }
    }
    if runs.iter().any(|r| r.light.delivered == 0) {
        bail!("tracing: a run delivered nothing at the light rate; see target/bench/tracing_*/all.log");
    }
    if sink_requests == 0 {
        bail!("tracing: export was on but the OTLP sink received nothing; see target/bench/tracing_on_*/all.log");
    }
    let mean = |on: bool, f: &dyn Fn(&Run) -> f64| {
        let v: Vec<f64> = runs.iter().filter(|r| r.on == on).map(f).collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let summary = |on: bool| {
        serde_json::json!({
            "light_p50_ms": mean(on, &|r| r.light.latency.p50),
            "light_p99_ms": mean(on, &|r| r.light.latency.p99),
            "light_max_ms": mean(on, &|r| r.light.latency.max),
            "light_cpu_cores": mean(on, &|r| r.light.cpu["all"].as_f64().unwrap_or(0.0)),
        })
    };
    let (off, on) = (summary(false), summary(true));
    let ratio = |k: &str| on[k].as_f64().unwrap_or(f64::NAN) / off[k].as_f64().unwrap_or(f64::NAN);
    let delivered_on: usize = runs.iter().filter(|r| r.on).map(|r| r.light.delivered).sum();
    // Each round's on/off p99 ratio, and their median: on a shared machine one slow minute
    // moves one run's p99 several times over, which a mean of p99s carries whole.
    let mut round_ratios: Vec<f64> = runs.chunks(2).filter(|pair| pair.len() == 2).map(|pair| pair[1].light.latency.p99 / pair[0].light.latency.p99).collect();
    round_ratios.sort_by(|a, b| a.total_cmp(b));
    let median_ratio = match round_ratios.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => round_ratios[n / 2],
        n => (round_ratios[n / 2 - 1] + round_ratios[n / 2]) / 2.0,
    };
    let report = serde_json::json!({
        "name": NAME,
        "rounds": args.tracing_rounds,
        "figures": {"off": off, "on": on},
        "export": {"requests": sink_requests, "bytes": sink_bytes, "bytes_per_delivery": sink_bytes as f64 / delivered_on.max(1) as f64},
        "runs": runs.iter().map(|r| serde_json::json!({"tracing": r.on, "light": r.light.json()})).collect::<Vec<_>>(),
        "ratio": {
            "on_over_off_light_p50": ratio("light_p50_ms"),
            "on_over_off_light_p99": ratio("light_p99_ms"),
            "on_over_off_light_cpu": ratio("light_cpu_cores"),
            "on_over_off_light_p99_median_of_rounds": median_ratio,
        },
        "round_p99_ratios_sorted": round_ratios,
    });
    println!();
    println!("tracing (railhook all on Kafka, {} rounds each, alternating): mean light p50 / p99 / max (ms), CPU cores of railhook", args.tracing_rounds);
    for (name, s) in [("off", &report["figures"]["off"]), ("on", &report["figures"]["on"])] {
        println!(
            "{name:<4} {:>7.2} {:>7.2} {:>7.1}   {:.3}",
            s["light_p50_ms"].as_f64().unwrap_or(f64::NAN),
            s["light_p99_ms"].as_f64().unwrap_or(f64::NAN),
            s["light_max_ms"].as_f64().unwrap_or(f64::NAN),
            s["light_cpu_cores"].as_f64().unwrap_or(f64::NAN),
        );
    }
    println!("export: {} requests, {} bytes; on / off: {}", sink_requests, sink_bytes, report["ratio"]);
    println!();
    Ok(report)
}
