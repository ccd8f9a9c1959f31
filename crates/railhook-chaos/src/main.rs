//! `railhook-chaos`: runs the fault-injection suite once, prints the report, writes it as
//! JSON, and exits 0 when every invariant held (1 when one did not, 2 when the run could not
//! be carried out). `scripts/chaos` builds and runs it; docs/RELIABILITY.md explains it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

/// Railhook's fault-injection suite: real processes, a private Postgres and Kafka, a proxy
/// on every link, faults while events and provider requests are sent, then the invariant
/// checker (lost 0, duplicates window 8 only, nothing stuck) and a report by fault kind.
///
/// Fault kinds: kill_api, kill_relay, kill_worker, kafka_restart, postgres_restart,
/// postgres_crash (kill -9 of the postmaster), receiver_outage, net_latency (200 ms),
/// net_blackhole (20 s), net_reset (each on every component's link to Postgres and to Kafka),
/// slot_invalidation, disk_full (root: Postgres' data on a tmpfs), relay_standby_takeover,
/// clock_skew (a worker whose clock is 30 s ahead), task_panic (a worker whose attempt tasks
/// panic), kill_all (inline: SIGKILL of a `railhook all` process). Needs toxiproxy-server:
/// scripts/test and scripts/chaos install it.
///
/// With --transport inline the processes are `railhook all` (one; two in the full run, the
/// second the hot standby of the first's relay) with no Kafka at all; the faults that need
/// Kafka or separate components are listed in the report as not injected, with the reason.
#[derive(Debug, Parser)]
#[command(name = "railhook-chaos")]
struct Cli {
    /// The railhook binary (built in release mode by scripts/chaos).
    #[arg(long, value_name = "PATH")]
    railhook_bin: PathBuf,
    /// The short deterministic mode (what cargo test runs): 500 events over 5 endpoints, one
    /// process of each kind, kills of each, a Kafka restart, a Postgres crash and a restart,
    /// resets on the worker's link to Postgres, a receiver outage, a fixed seed.
    #[arg(long)]
    quick: bool,
    /// Only these fault kinds, comma-separated (default: every kind of the mode's plan).
    #[arg(long, value_name = "KINDS", value_delimiter = ',')]
    faults: Option<Vec<String>>,
    /// Events to send (default: 50000; 500 with --quick).
    #[arg(long)]
    events: Option<usize>,
    /// Endpoints (default: 20; 5 with --quick).
    #[arg(long)]
    endpoints: Option<usize>,
    /// Events per second offered (default: 100; 20 with --quick).
    #[arg(long)]
    rate: Option<f64>,
    /// Seed of the fault schedule and the receivers' dice (default: random; 7 with --quick).
    #[arg(long)]
    seed: Option<u64>,
    /// Seconds the receiver stays away (default: 60; 4 with --quick).
    #[arg(long)]
    outage_secs: Option<u64>,
    /// Kills of each component in a full run (default 3; the relay's are standby takeovers).
    #[arg(long)]
    kills: Option<usize>,
    /// Events of each ordered burst (one per fault) to a healthy ordered endpoint (default
    /// 25; 20 with --quick).
    #[arg(long)]
    ordered_burst: Option<usize>,
    /// Events of each ordered burst to a flaky ordered endpoint (default 5; 4 with --quick).
    #[arg(long)]
    ordered_burst_flaky: Option<usize>,
    /// Provider events sent to the ingress, plus a resend of every fourth (default 2000;
    /// 100 with --quick; 0 sends none).
    #[arg(long)]
    incoming: Option<usize>,
    /// Provider events sent around each fault as fast as the ingress takes them (default 20, also
    /// with --quick).
    #[arg(long)]
    incoming_burst: Option<usize>,
    /// Standard Webhooks Sources, with 1, 2, 1, 2, ... Destinations (default 4; 3 with --quick).
    #[arg(long)]
    sources: Option<usize>,
    /// `railhook worker` processes in one consumer group, 1 to 4 (default 2; 1 with --quick).
    /// The faults kill the first; its partitions move to the others.
    #[arg(long)]
    workers: Option<usize>,
    /// `railhook api` processes, 1 or 2 (default 2; 1 with --quick); the client alternates.
    #[arg(long)]
    apis: Option<usize>,
    /// `railhook relay` processes on the slot, 1 or 2 (default 2, one a hot standby; 1 with
    /// --quick).
    #[arg(long)]
    relays: Option<usize>,
    /// How announcements go from the relay to the workers: kafka (separate api, relay and
    /// worker processes, a private broker) or inline (`railhook all` processes, no Kafka).
    #[arg(long, value_name = "kafka|inline", default_value = "kafka")]
    transport: String,
    /// `railhook all` processes on --transport inline, 1 or 2 (default 2, the second the hot
    /// standby of the first's relay; 1 with --quick).
    #[arg(long)]
    alls: Option<usize>,
    /// Where the JSON report goes (default: chaos/results/latest.json; quick.json with --quick;
    /// latest-inline.json and quick-inline.json with --transport inline).
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    /// Keep the run's folder (logs, configuration, receiver log) even when it passed.
    #[arg(long)]
    keep: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt().with_env_filter(std::env::var("RAILHOOK_CHAOS_LOG").unwrap_or_else(|_| "warn".into())).with_writer(std::io::stderr).with_ansi(false).init();
    let mut opts = if cli.quick { railhook_chaos::Options::quick(cli.railhook_bin) } else { railhook_chaos::Options::full(cli.railhook_bin) };
    if let Some(n) = cli.events {
        opts.events = n.max(1);
    }
    if let Some(n) = cli.endpoints {
        opts.endpoints = n.max(1);
    }
    if let Some(r) = cli.rate {
        opts.rate = r.max(0.1);
    }
    if let Some(s) = cli.seed {
        opts.seed = s;
    }
    if let Some(s) = cli.outage_secs {
        opts.outage = Duration::from_secs(s);
    }
    if let Some(k) = cli.kills {
        opts.kills_per_component = k;
    }
    if let Some(n) = cli.ordered_burst {
        opts.ordered_burst = n;
    }
    if let Some(n) = cli.ordered_burst_flaky {
        opts.ordered_burst_flaky = n;
    }
    if let Some(n) = cli.incoming {
        opts.incoming = n;
    }
    if let Some(n) = cli.incoming_burst {
        opts.incoming_burst = n;
    }
    if let Some(n) = cli.sources {
        opts.sources = n.max(1);
    }
    if let Some(n) = cli.workers {
        opts.workers = n;
    }
    if let Some(n) = cli.apis {
        opts.apis = n;
    }
    if let Some(n) = cli.relays {
        opts.relays = n;
    }
    match railhook_chaos::options::parse_transport(&cli.transport) {
        Some(t) => opts.transport = t,
        None => {
            eprintln!("railhook-chaos: unknown transport {:?}; kafka or inline", cli.transport);
            return ExitCode::from(2);
        }
    }
    if let Some(n) = cli.alls {
        opts.alls = n;
    }
    if let Some(names) = cli.faults {
        let mut kinds = Vec::new();
        for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
            match railhook_chaos::plan::FaultKind::parse(name) {
                Some(k) => kinds.push(k),
                None => {
                    let all: Vec<&str> = railhook_chaos::plan::FaultKind::ALL.iter().map(|k| k.name()).collect();
                    eprintln!("railhook-chaos: unknown fault kind {name:?}; the kinds: {}", all.join(", "));
                    return ExitCode::from(2);
                }
            }
        }
        opts.only = Some(kinds);
    }
    opts.keep = cli.keep;
    // An inline run has files of its own, so that it does not replace the Kafka run's.
    let out = cli.out.unwrap_or_else(|| {
        let name = match (opts.quick, opts.inline()) {
            (true, false) => "quick.json",
            (false, false) => "latest.json",
            (true, true) => "quick-inline.json",
            (false, true) => "latest-inline.json",
        };
        PathBuf::from("chaos/results").join(name)
    });

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let report = match runtime.block_on(railhook_chaos::run(&opts)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("railhook-chaos: the run could not be carried out: {e:#}");
            return ExitCode::from(2);
        }
    };
    print!("{}", railhook_chaos::render(&report));
    match railhook_chaos::write_json(&report, &out) {
        Ok(()) => eprintln!("railhook-chaos: report written to {}", out.display()),
        Err(e) => eprintln!("railhook-chaos: {e:#}"),
    }
    if report.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
