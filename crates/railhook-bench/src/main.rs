//! `railhook-bench`: the benchmarks `scripts/bench` runs. Each one measures Railhook and its
//! baseline in the same invocation and reports both with their ratio, because the machines
//! are shared and noisy: absolute figures from different runs do not compare.
//!
//! `relay_latency` (commit to visible in Kafka, CDC relay vs the polling relay) and
//! `relay_throughput` (catching up a backlog, CDC relay vs `pg_recvlogical`) run the relay in
//! process; `ingest` (the API vs `pgbench` of its statement), `ingress` (`POST /ingress/{token}`
//! vs the ingest's rate of the same invocation, which it runs first unless it already ran),
//! `e2e` (POST to the receiver's arrival vs the load generator driving the receiver directly)
//! and `memory` (peak RSS during e2e) run the `railhook` binary's api, relay and worker as separate processes. e2e ends with
//! the phases on a clean database each (`hot_endpoint`, `fanout_10`), which can also be named
//! alone: then only they run, and the report's `e2e` holds only their figures. `replay` (also
//! on a clean stack): live e2e latency to one Endpoint without and with a Replay of 100,000
//! Events to another. `retention` (also on a clean stack): live e2e latency to one Endpoint in
//! alternating windows without and with the retention job deleting a backlog of expired history.
//! `tracing` (issue 33): one `railhook all` with OpenTelemetry export off and on, alternating,
//! the light rate's latency each (traces.rs).
//! `kafka_source`: Events ingested from a Kafka topic by the Kafka source against `POST
//! /v1/events`, same database, same run.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};

mod e2e;
mod http;
mod ingest;
mod ingress;
mod kafka_source;
mod load;
mod procs;
mod relay;
mod stack;
mod traces;
mod transports;

const BENCHMARKS: [&str; 11] = ["relay_latency", "relay_throughput", "ingest", "ingress", "e2e", "memory", "transports", "tracing", "replay", "retention", "kafka_source"];

/// Every name the command line takes: the benchmarks and e2e's clean-database phases.
fn known(name: &str) -> bool {
    BENCHMARKS.contains(&name) || e2e::CLEAN_PHASES.contains(&name)
}

pub struct Args {
    names: Vec<String>,
    pub rate: u64,
    pub duration: Duration,
    pub rows: u64,
    out: String,
    bin: Option<String>,
    pub connections: Option<usize>,
    /// e2e: length of each step of the saturation search.
    pub step: Duration,
    pub start_rate: f64,
    pub max_rate: f64,
    /// replay: the live rate to Endpoint B, and the Replay's pacing (None: the config default).
    pub replay_live_rate: f64,
    pub replay_batch_size: Option<i64>,
    pub replay_pause_ms: Option<u64>,
    pub replay_max_per_second: Option<f64>,
    /// replay: no paired windows with the Replay held (only before and after it).
    pub replay_no_alternate: bool,
    /// retention: the live rate, the number of off/on window pairs, and the job's settings
    /// (None: the config default).
    pub retention_live_rate: f64,
    pub retention_pairs: usize,
    pub retention_steady_pairs: usize,
    pub retention_control: bool,
    pub retention_batch_target_ms: Option<u64>,
    pub retention_pause_ms: Option<u64>,
    pub retention_max_busy_percent: Option<u64>,
    pub retention_max_rows_per_second: Option<u64>,
    /// `transports`' busy rate (events/s over 50 Endpoints).
    pub transports_busy_rate: f64,
    /// `tracing`'s rounds of (off, on).
    pub tracing_rounds: usize,
    /// e2e without its clean-database phases (`--no-clean-phases`).
    no_clean_phases: bool,
}

impl Args {
    /// The `railhook` binary the process-level benchmarks run.
    pub fn bin(&self) -> anyhow::Result<PathBuf> {
        procs::railhook_bin(self.bin.as_deref())
    }
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        names: Vec::new(),
        rate: 1_000,
        duration: Duration::from_secs(30),
        rows: 500_000,
        out: "bench/results/latest.json".into(),
        bin: None,
        connections: None,
        step: Duration::from_secs(10),
        start_rate: 500.0,
        max_rate: 20_000.0,
        replay_live_rate: 150.0,
        replay_batch_size: None,
        replay_pause_ms: None,
        replay_max_per_second: None,
        replay_no_alternate: false,
        retention_live_rate: 200.0,
        retention_pairs: 2,
        retention_steady_pairs: 8,
        retention_control: false,
        retention_batch_target_ms: None,
        retention_pause_ms: None,
        retention_max_busy_percent: None,
        retention_max_rows_per_second: None,
        transports_busy_rate: 800.0,
        tracing_rounds: 2,
        no_clean_phases: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--rate" => args.rate = it.next().context("--rate needs a value")?.parse().context("--rate: events per second")?,
            "--duration" => args.duration = Duration::from_secs(it.next().context("--duration needs a value")?.parse().context("--duration: seconds")?),
            "--rows" => args.rows = it.next().context("--rows needs a value")?.parse().context("--rows: a row count")?,
            "--out" => args.out = it.next().context("--out needs a path")?,
            "--bin" => args.bin = Some(it.next().context("--bin needs the railhook binary's path")?),
            "--connections" => args.connections = Some(it.next().context("--connections needs a value")?.parse().context("--connections: a count")?),
            "--step" => args.step = Duration::from_secs(it.next().context("--step needs a value")?.parse().context("--step: seconds")?),
            "--start-rate" => args.start_rate = it.next().context("--start-rate needs a value")?.parse().context("--start-rate: events per second")?,
            "--max-rate" => args.max_rate = it.next().context("--max-rate needs a value")?.parse().context("--max-rate: events per second")?,
            "--replay-live-rate" => args.replay_live_rate = it.next().context("--replay-live-rate needs a value")?.parse().context("--replay-live-rate: events per second")?,
            "--replay-batch-size" => args.replay_batch_size = Some(it.next().context("--replay-batch-size needs a value")?.parse().context("--replay-batch-size: Events per batch")?),
            "--replay-max-per-second" => args.replay_max_per_second = Some(it.next().context("--replay-max-per-second needs a value")?.parse().context("--replay-max-per-second: Deliveries per second")?),
            "--replay-no-alternate" => args.replay_no_alternate = true,
            "--replay-pause-ms" => args.replay_pause_ms = Some(it.next().context("--replay-pause-ms needs a value")?.parse().context("--replay-pause-ms: milliseconds")?),
            "--transports-busy-rate" => args.transports_busy_rate = it.next().context("--transports-busy-rate needs a value")?.parse().context("--transports-busy-rate: events per second")?,
            "--no-clean-phases" => args.no_clean_phases = true,
            "--tracing-rounds" => args.tracing_rounds = it.next().context("--tracing-rounds needs a value")?.parse().context("--tracing-rounds: a count")?,
            "--retention-live-rate" => args.retention_live_rate = it.next().context("--retention-live-rate needs a value")?.parse().context("--retention-live-rate: events per second")?,
            "--retention-pairs" => args.retention_pairs = it.next().context("--retention-pairs needs a value")?.parse().context("--retention-pairs: a count")?,
            "--retention-control" => args.retention_control = true,
            "--retention-steady-pairs" => {
                args.retention_steady_pairs = it.next().context("--retention-steady-pairs needs a value")?.parse().context("--retention-steady-pairs: a count")?
            }
            "--retention-batch-target-ms" => args.retention_batch_target_ms = Some(it.next().context("--retention-batch-target-ms needs a value")?.parse().context("--retention-batch-target-ms: milliseconds")?),
            "--retention-pause-ms" => args.retention_pause_ms = Some(it.next().context("--retention-pause-ms needs a value")?.parse().context("--retention-pause-ms: milliseconds")?),
            "--retention-max-busy-percent" => args.retention_max_busy_percent = Some(it.next().context("--retention-max-busy-percent needs a value")?.parse().context("--retention-max-busy-percent: 1 to 100")?),
            "--retention-max-rows-per-second" => args.retention_max_rows_per_second = Some(it.next().context("--retention-max-rows-per-second needs a value")?.parse().context("--retention-max-rows-per-second: rows per second, 0 for no cap")?),
            "-h" | "--help" => {
                println!("usage: railhook-bench [--rate N] [--duration SECONDS] [--rows N] [--connections N] [--step SECONDS] [--start-rate N] [--max-rate N] [--bin PATH] [--out PATH] [{}|{}]...", BENCHMARKS.join("|"), e2e::CLEAN_PHASES.join("|"));
                println!("  no name: every benchmark; e2e (or memory) includes the phases {}", e2e::CLEAN_PHASES.join(" and "));
                println!("  hot_endpoint, fanout_10: only these e2e phases, each on a clean database (hot_endpoint: one Endpoint, 10,000 events");
                println!("    as fast as accepted, then 700 events/s for 20 s; fanout_10: ten Endpoints, 3,000 events, 30,000 Deliveries)");
                println!("  --rate, --rows: relay_latency's commit rate and relay_throughput's backlog");
                println!("  ingress: POST /ingress/{{token}} at saturation, then at half of it; ingest runs first for the ratio unless named before it");
                println!("  --duration: relay_latency, ingest, each ingress phase and the fixed-rate e2e runs (default 30)");
                println!("  --connections: ingest's and ingress's HTTP connections (default 32)");
                println!("  --no-clean-phases: e2e (or memory) without the clean-database phases (the saturation search, half saturation and light rate only)");
                println!("  --step, --start-rate, --max-rate: e2e's saturation search (default 10 s steps from 500/s, +25% each, then three steps halving the gap after the first not sustained; -20% each while not even the start rate holds)");
                println!("  replay: 100,000 Events of Endpoint A's history replayed while Endpoint B gets live events at --replay-live-rate (150/s);");
                println!("    B's p50/p99 without and with the Replay, their ratio (target p99 <= 1.2x) and the Replay's throughput;");
                println!("    after each 10 s window with the Replay, a 5 s one with it held (its pace row), pooled with the windows before and after it");
                println!("  --replay-no-alternate: no held windows, only the baseline before and after the Replay");
                println!("  --replay-batch-size, --replay-pause-ms, --replay-max-per-second: the Replay's replay.batch_size, replay.pause_ms and replay.max_deliveries_per_second (default: the configuration's)");
                println!("  retention: Endpoint L gets live events at --retention-live-rate (200/s) in pairs of 15 s windows, off (nothing expired) and on:");
                println!("    --retention-steady-pairs (8): history expiring at the live rate during the on window, as in a steady state (target: pooled");
                println!("    p99 on/off < 1.1x); then --retention-pairs (2): the job catching up with a backlog of 40-day-old Events seeded just before");
                println!("  --retention-control: the steady history expires 30 s after the on window instead of in it (an A/A check of the phase's own bias)");
                println!("  --retention-batch-target-ms, --retention-pause-ms, --retention-max-busy-percent, --retention-max-rows-per-second:");
                println!("    the job's retention.batch_target_ms, pause_ms, max_busy_percent and max_rows_per_second (default: the configuration's)");
                println!("  transports: one `railhook all` on the Kafka transport and one on the inline transport, alternating, 2 rounds each:");
                println!("    the light rate (200/s, one Endpoint) and --transports-busy-rate (800/s over 50 Endpoints), --duration each; ratios inline/kafka");
                println!("  tracing: one `railhook all` (Kafka) with OpenTelemetry export off and on (every Event traced, to an OTLP sink in-process),");
                println!("    alternating, --tracing-rounds (2) rounds: the light rate (200/s, one Endpoint) for --duration; ratio on/off of the light p99 (target <= 1.1)");
                println!("  kafka_source: POST /v1/events at saturation (as ingest) for --duration, then a `railhook worker` with the Kafka source catching up");
                println!("    as many records from a topic (1 KiB, one Subscription); records/s of each and ratio.kafka_source_over_rest (target at least 1.5)");
                println!("  --bin: the railhook binary (default: next to railhook-bench, or RAILHOOK_BIN)");
                std::process::exit(0);
            }
            name if known(name) => args.names.push(name.to_string()),
            other => bail!("unknown benchmark or flag '{other}' (benchmarks: {}; e2e phases alone: {})", BENCHMARKS.join(", "), e2e::CLEAN_PHASES.join(", ")),
        }
    }
    if args.names.is_empty() {
        args.names = BENCHMARKS.iter().map(|s| s.to_string()).collect();
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let mut results = Vec::new();
    let mut e2e_done = false;
    // The clean-database phases: all of them within e2e, else the ones named.
    let whole_e2e = !args.no_clean_phases && args.names.iter().any(|n| n == "e2e" || n == "memory");
    let clean: Vec<&str> = e2e::CLEAN_PHASES.into_iter().filter(|p| whole_e2e || args.names.iter().any(|n| n == p)).collect();
    for name in &args.names {
        match name.as_str() {
            "relay_latency" => results.push(relay::relay_latency(&args).await?),
            "relay_throughput" => results.push(relay::relay_throughput(&args).await?),
            "replay" => results.push(e2e::replay::run(&args).await?),
            "transports" => results.push(transports::run(&args).await?),
            "tracing" => results.push(traces::run(&args).await?),
            "retention" => results.push(e2e::retention::run(&args).await?),
            "kafka_source" => results.push(kafka_source::run(&args).await?),
            // ingress reports the ingest's rate of this invocation: it runs ingest when needed.
            "ingest" if !ran(&results, "ingest") => results.push(ingest::ingest(&args).await?),
            "ingress" => {
                let ingest = results.iter().find(|r| r["name"] == "ingest").cloned();
                results.extend(ingress::ingress(&args, ingest.as_ref()).await?);
            }
            // memory is measured during e2e: either name runs e2e once and reports both.
            "e2e" | "memory" if !e2e_done => {
                let (e2e, memory) = e2e::e2e(&args, &clean).await?;
                results.push(e2e);
                results.push(memory);
                e2e_done = true;
            }
            // The clean-database phases named without e2e: all of them at once, as one report.
            p if !whole_e2e && !e2e_done && e2e::CLEAN_PHASES.contains(&p) => {
                results.push(e2e::clean_phases_alone(&args, &clean).await?);
                e2e_done = true;
            }
            _ => {}
        }
    }
    let report = serde_json::json!({
        "commit": git_commit(),
        "machine": {"cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0), "memory_gib": memory_gib()},
        "benchmarks": results,
    });
    if let Some(dir) = std::path::Path::new(&args.out).parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)? + "\n")?;
    println!("wrote {}", args.out);
    Ok(())
}

fn ran(results: &[serde_json::Value], name: &str) -> bool {
    results.iter().any(|r| r["name"] == name)
}

fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn memory_gib() -> f64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib: f64 = text.lines().find(|l| l.starts_with("MemTotal:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    (kib / 1024.0 / 1024.0 * 10.0).round() / 10.0
}

#[derive(Debug, Clone, Copy)]
pub struct Percentiles {
    pub count: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

/// Percentiles of a sample; an empty sample gives NaN everywhere (printed as "NaN", never a
/// panic: a phase in which nothing arrived is a result too).
pub fn percentiles(mut ms: Vec<f64>) -> Percentiles {
    if ms.is_empty() {
        return Percentiles { count: 0, p50: f64::NAN, p95: f64::NAN, p99: f64::NAN, max: f64::NAN };
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| ms[((ms.len() as f64 - 1.0) * q).round() as usize];
    Percentiles { count: ms.len(), p50: at(0.50), p95: at(0.95), p99: at(0.99), max: *ms.last().unwrap_or(&0.0) }
}

pub fn json(p: &Percentiles) -> serde_json::Value {
    serde_json::json!({"count": p.count, "p50_ms": p.p50, "p95_ms": p.p95, "p99_ms": p.p99, "max_ms": p.max})
}

