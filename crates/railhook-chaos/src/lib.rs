//! Railhook's fault-injection suite (`scripts/chaos`, docs/RELIABILITY.md).
//!
//! One run: a private Postgres cluster and a private Kafka broker (the shared servers other
//! tests use are never touched); `railhook api`, `railhook relay` and `railhook worker` as
//! supervised processes of the real binary, with a short retry ladder and short sweeps; a
//! test receiver with healthy and flaky Endpoints; a client that sends a known set of events.
//! While it sends, the fault controller kills each component with SIGKILL, restarts Kafka,
//! restarts Postgres (fast shutdown) and takes the receiver away. Then the faults stop, the
//! system drains until every Delivery is terminal, and [`checker::check`] reads Postgres and
//! the receiver's log and says whether any accepted event was lost, which duplicate window
//! explains each duplicate arrival, and whether anything is stuck.
//!
//! Ordered delivery (DESIGN.md 6.5) is under the same faults: some Endpoints (one in five,
//! and the third after it: quick mode a healthy and a flaky one) get a third, ordered,
//! Subscription, and each fault is injected in the middle of a burst of events to them, so
//! it always hits ordered Deliveries in flight (parked, PENDING or PROCESSING). The checker
//! then demands that the receiver applied each ordered Endpoint's Deliveries in ascending
//! Sequence Number order and that no gap timeout fired ([`ORDERING_GAP_TIMEOUT_S`]).
//!
//! Quick mode (what `cargo test` runs, `crates/railhook/tests/chaos.rs`): about 500 events
//! over 5 Endpoints, exactly one fault of each kind at fixed points (counted in accepted
//! events of the paced stream), each in the middle of an ordered burst, a fixed seed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use railhook_core::signing::EndpointSecret;
use railhook_testkit::kafka::KafkaBroker;
use railhook_testkit::pg::{free_low_port, PgCluster};
use serde::Serialize;
use tokio::time::Instant;

pub mod checker;
pub mod client;
pub mod forwards;
pub mod incoming;
pub mod procs;
pub mod receiver;

use checker::{FaultKind, FaultRecord, Inputs, Verdict};
use procs::{ProcessStats, Supervised};
use receiver::{Profile, Receiver, ReceiverEndpoint};

/// The Retry Ladder of every Subscription: short, and long enough in total (about 150 s,
/// at least 75 s with the jitter) that neither the flaky receivers nor the receiver's
/// one-minute absence can exhaust 20 Attempts.
pub const RETRY_DELAYS: [i64; 7] = [1, 1, 2, 3, 5, 8, 10];
pub const MAX_ATTEMPTS: i64 = 20;
/// Subscription timeouts: flaky Endpoints 2 s (their hangs and slow answers are measured
/// against it), healthy ones 5 s.
pub const FLAKY_TIMEOUT_S: i64 = 2;
pub const HEALTHY_TIMEOUT_S: i64 = 5;
/// `worker.ordering_gap_timeout_seconds` of the run: above anything a fault can hold an
/// ordered Delivery, so a gap timeout never has to fire and any that fires fails the run.
/// The gap timeout counts from a Delivery's first park, which can be long before its
/// predecessor is the one at the head of the Endpoint: what it must outlast is the backlog
/// ahead of it when it parked (a burst on a flaky Endpoint: a minute or two, more behind a
/// killed worker's Delivery, which waits for the 20 s PROCESSING sweep) plus its predecessor's
/// whole Retry Ladder (at most 20 Attempts: 150 s of waits, 225 s with the jitter, plus 20
/// timeouts of 2-5 s: under 330 s), which also contains the receiver's absence (60 s in a
/// full run) and the Postgres and Kafka restarts. 600 s is above the sum; the default, 60 s,
/// is not (the full run's outage alone is 60 s), and a gap timeout sends a Delivery before
/// its predecessor, out of order by design.
pub const ORDERING_GAP_TIMEOUT_S: u64 = 600;
const ADMIN_TOKEN: &str = "chaos-admin-token-0123456789";

#[derive(Debug, Clone)]
pub struct Options {
    /// The `railhook` binary to run.
    pub railhook_bin: PathBuf,
    pub quick: bool,
    pub events: usize,
    pub endpoints: usize,
    /// Events per second the client offers (the send phase lasts about events / rate).
    pub rate: f64,
    pub concurrency: usize,
    pub seed: u64,
    /// SIGKILLs of each component (full mode; quick mode kills each once).
    pub kills_per_component: usize,
    /// How long the receiver stays away.
    pub outage: Duration,
    /// How long a killed component stays dead before its supervisor starts it again.
    pub restart_delay: Duration,
    /// How long the drain may take before what is left counts as stuck.
    pub drain_timeout: Duration,
    /// Keep the run's folder (logs, configuration, receiver log) even when it passed.
    pub keep: bool,
    /// Events of each ordered burst to a healthy ordered Endpoint (one burst per fault).
    pub ordered_burst: usize,
    /// Events of each ordered burst to a flaky ordered Endpoint: fewer, because a flaky
    /// Endpoint's ordered Deliveries go one at a time through its 500s and timeouts (about
    /// 1 s each), and that backlog is what the drain waits for.
    pub ordered_burst_flaky: usize,
    /// Provider events sent to the ingress during the send phase (plus a resend of every
    /// `incoming::RESEND_EVERY`-th), spread over the same time as the paced events.
    pub incoming: usize,
    /// Provider events sent to the ingress as fast as it takes them around each fault (the
    /// fault waits for half of them with the ordered burst's half), so that every fault hits
    /// Forwards in flight.
    pub incoming_burst: usize,
    /// Standard Webhooks Sources; Source `s` has `1 + s % 2` Destinations, every other
    /// Destination flaky.
    pub sources: usize,
    /// `railhook worker` processes in one consumer group (quick 1, full 2). The faults kill
    /// the first; its partitions move to the others within the session timeout (6 s).
    pub workers: usize,
}

impl Options {
    /// The deterministic short mode: 500 events over 5 Endpoints, one fault of each kind.
    pub fn quick(railhook_bin: PathBuf) -> Options {
        Options {
            railhook_bin,
            quick: true,
            events: 500,
            endpoints: 5,
            rate: 20.0,
            concurrency: 4,
            seed: 7,
            kills_per_component: 1,
            outage: Duration::from_secs(4),
            restart_delay: Duration::from_millis(500),
            drain_timeout: Duration::from_secs(150),
            keep: false,
            ordered_burst: 20,
            ordered_burst_flaky: 4,
            incoming: 100,
            incoming_burst: 20,
            sources: 3,
            workers: 1,
        }
    }

    /// The full suite: 20,000 events over 20 Endpoints, three kills of each component at
    /// random moments, a one-minute receiver outage.
    pub fn full(railhook_bin: PathBuf) -> Options {
        Options {
            railhook_bin,
            quick: false,
            events: 20_000,
            endpoints: 20,
            rate: 100.0,
            concurrency: 6,
            seed: rand::rng().random(),
            kills_per_component: 3,
            outage: Duration::from_secs(60),
            restart_delay: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(900),
            keep: false,
            ordered_burst: 25,
            ordered_burst_flaky: 5,
            incoming: 2_000,
            incoming_burst: 20,
            sources: 4,
            workers: 2,
        }
    }
}

/// One fault, injected once `at_accepted` events were accepted.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedFault {
    pub at_accepted: usize,
    pub kind: FaultKind,
}

/// Quick mode: each fault once at a fixed share of the events. Full mode: the kills, the
/// Kafka restart, the Postgres restart and the outage at random shares (seeded) between 5 %
/// and 85 %.
pub fn plan_faults(opts: &Options) -> Vec<PlannedFault> {
    let n = opts.events;
    let at = |share: f64| ((n as f64 * share) as usize).max(1);
    let mut plan = if opts.quick {
        vec![
            PlannedFault { at_accepted: at(0.10), kind: FaultKind::KillWorker },
            PlannedFault { at_accepted: at(0.20), kind: FaultKind::KillRelay },
            PlannedFault { at_accepted: at(0.30), kind: FaultKind::KillApi },
            PlannedFault { at_accepted: at(0.40), kind: FaultKind::KafkaRestart },
            PlannedFault { at_accepted: at(0.60), kind: FaultKind::PostgresRestart },
            PlannedFault { at_accepted: at(0.75), kind: FaultKind::ReceiverOutage },
        ]
    } else {
        let mut rng = StdRng::seed_from_u64(opts.seed);
        let mut plan = Vec::new();
        let mut add = |kind| plan.push(PlannedFault { at_accepted: at(rng.random_range(0.05..0.85)), kind });
        for _ in 0..opts.kills_per_component {
            add(FaultKind::KillApi);
            add(FaultKind::KillRelay);
            add(FaultKind::KillWorker);
        }
        add(FaultKind::KafkaRestart);
        add(FaultKind::PostgresRestart);
        add(FaultKind::ReceiverOutage);
        plan
    };
    plan.sort_by_key(|f| f.at_accepted);
    plan
}

/// Whether Endpoint `j` gets an ordered Subscription: one in five, and the third after it
/// (quick: 0 healthy and 2 flaky; full, where every other one is flaky: 0, 2, 10, 12 healthy
/// and 5, 7, 15, 17 flaky, 8 of 20).
pub fn is_ordered(j: usize) -> bool {
    matches!(j % 5, 0 | 2)
}

/// How the run counted ordering gap timeouts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GapTimeoutCount {
    /// `railhook_ordering_gap_timeout_total` summed over the last process of each worker,
    /// read just before they stopped (a killed worker's count is gone with it; hence the log).
    pub worker_metric: Option<u64>,
    /// "ordering gap timeout" lines in the workers' logs (every process of the run).
    pub worker_log: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Timings {
    pub setup_s: f64,
    pub send_s: f64,
    pub drain_s: f64,
    pub check_s: f64,
    pub total_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub mode: &'static str,
    pub seed: u64,
    pub events: usize,
    pub endpoints: usize,
    pub flaky_endpoints: usize,
    /// `railhook worker` processes in the group (the faults kill the first).
    pub workers: usize,
    /// Endpoints (by index) with an ordered Subscription.
    pub ordered_endpoints: Vec<usize>,
    /// Events sent in the ordered bursts (on top of `events`).
    pub burst_events: usize,
    pub ordering_gap_timeout_seconds: u64,
    pub gap_timeouts: GapTimeoutCount,
    pub started_at: DateTime<Utc>,
    pub verdict: Verdict,
    pub faults_planned: Vec<PlannedFault>,
    pub faults: Vec<FaultRecord>,
    pub processes: BTreeMap<String, ProcessStats>,
    pub client: client::SendStats,
    /// The incoming direction: Standard Webhooks Sources, their Destinations on the receiver.
    pub sources: usize,
    pub destinations: usize,
    pub flaky_destinations: usize,
    pub incoming_client: incoming::IncomingStats,
    /// Provider events sent in the bursts around the faults (on top of `Options::incoming`).
    pub incoming_burst_events: usize,
    pub drained: bool,
    pub timings: Timings,
    /// Logs, configuration and the receiver's log (kept when the run failed or `keep`).
    pub run_dir: Option<PathBuf>,
}

/// `RETRY_DELAYS`, its last wait repeated, as `MAX_ATTEMPTS - 1` waits.
pub fn incoming_ladder() -> Vec<i32> {
    (0..MAX_ATTEMPTS as usize - 1).map(|i| RETRY_DELAYS[i.min(RETRY_DELAYS.len() - 1)] as i32).collect()
}

/// Per Source, how many Destinations: 1, 2, 1, 2, ...
fn destinations_per_source(opts: &Options) -> Vec<usize> {
    (0..opts.sources).map(|s| 1 + s % 2).collect()
}

/// Destination `d` (in creation order) is flaky when `d` is odd.
fn destination_profile(d: usize) -> Profile {
    if d % 2 == 1 {
        Profile::flaky()
    } else {
        Profile::Healthy
    }
}

fn profile_for(j: usize, quick: bool) -> Profile {
    // Quick: endpoints 0 and 1 healthy, the rest flaky. Full: every other one flaky.
    let flaky = if quick { j >= 2 } else { j % 2 == 1 };
    if flaky {
        Profile::flaky()
    } else {
        Profile::Healthy
    }
}

fn config(pg: &PgCluster, kafka: &KafkaBroker, ports: &Ports) -> railhook_config::Config {
    let mut c = railhook_config::Config::default();
    c.database.url = pg.url("railhook");
    c.database.max_connections = 16;
    c.database.acquire_timeout_ms = 3000;
    c.kafka.brokers = kafka.brokers();
    c.kafka.topic_prefix = "chaos.".into();
    c.kafka.partitions = 3;
    // A killed worker's group membership ends after 6 s instead of 45 s, so the restarted
    // worker gets its partitions soon (librdkafka warns that producers ignore these).
    c.kafka.properties.insert("session.timeout.ms".into(), "6000".into());
    c.kafka.properties.insert("heartbeat.interval.ms".into(), "1000".into());
    c.api.listen = ([127, 0, 0, 1], ports.api).into();
    c.api.admin_token = ADMIN_TOKEN.into();
    c.relay.ops_listen = ([127, 0, 0, 1], ports.relay_ops).into();
    c.relay.status_interval_ms = 500;
    c.worker.ops_listen = ([127, 0, 0, 1], ports.worker_ops[0]).into();
    c.worker.group_id = "chaos-worker".into();
    // Sweeps within seconds: PROCESSING longer than 20 s (well past the longest Attempt,
    // 5 s plus the finalise's retries) goes back to PENDING; PENDING unannounced for 10 s is
    // announced again; an unclaimed retry hint after 5 s.
    c.worker.processing_timeout_seconds = 20;
    c.worker.stranded_after_seconds = 10;
    c.worker.retry_reannounce_after_seconds = 5;
    c.worker.shutdown_grace_ms = 5000;
    c.worker.circuit_cooldown_seconds = 5;
    // Never needed in this run (see ORDERING_GAP_TIMEOUT_S): one that fires fails it.
    c.worker.ordering_gap_timeout_seconds = ORDERING_GAP_TIMEOUT_S;
    // The Forwards' ladder: the Subscriptions' (20 Attempts, about 150 s) instead of the
    // incoming default (60 s to an hour, 5 Attempts).
    c.worker.incoming_retry_delays_seconds = incoming_ladder();
    c.network.allow_cidrs = vec!["127.0.0.0/8".into()];
    c.telemetry.log_filter = "info".into();
    c
}

struct Ports {
    api: u16,
    relay_ops: u16,
    /// One per worker process; the first is the one the faults kill.
    worker_ops: Vec<u16>,
    receiver: u16,
}

fn run_dir() -> PathBuf {
    std::env::temp_dir().join(format!("railhook-chaos-{}-{}", std::process::id(), &uuid::Uuid::new_v4().simple().to_string()[..8]))
}

async fn http_ok(http: &reqwest::Client, url: &str) -> bool {
    matches!(http.get(url).send().await, Ok(r) if r.status().is_success())
}

/// Polls `what` until it holds or `within` passed; an error naming `what` then.
async fn wait_for<F, Fut>(within: Duration, what: &str, mut cond: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !cond().await {
        if Instant::now() > deadline {
            anyhow::bail!("timed out after {within:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

struct Stack {
    api: Supervised,
    relay: Supervised,
    /// Never empty; the faults kill the first.
    workers: Vec<Supervised>,
}

/// The workers' process names: `worker`, then `worker2`, `worker3`, ...
const WORKER_NAMES: [&str; 4] = ["worker", "worker2", "worker3", "worker4"];

impl Stack {
    fn get(&self, kind: FaultKind) -> &Supervised {
        match kind {
            FaultKind::KillApi => &self.api,
            FaultKind::KillRelay => &self.relay,
            _ => &self.workers[0],
        }
    }

    fn all(&self) -> Vec<&Supervised> {
        let mut all = vec![&self.api, &self.relay];
        all.extend(self.workers.iter());
        all
    }

    async fn stop(&mut self) {
        // The API first (no more ingest), then the workers, then the relay.
        self.api.stop().await;
        for w in &mut self.workers {
            w.stop().await;
        }
        self.relay.stop().await;
    }

    fn stats(&self) -> BTreeMap<String, ProcessStats> {
        self.all().iter().map(|s| (s.name.to_string(), s.stats())).collect()
    }

    fn tails(&self) -> String {
        self.all()
            .iter()
            .map(|s| format!("--- {} ({}):\n{}", s.name, s.log.display(), s.log_tail(15)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Runs the whole suite once. An `Err` means the run could not be carried out (a server
/// did not start); a run that found a problem returns a [`Report`] whose verdict failed.
pub async fn run(opts: &Options) -> anyhow::Result<Report> {
    let t0 = Instant::now();
    let started_at = Utc::now();
    let dir = run_dir();
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("create {}", logs.display()))?;
    anyhow::ensure!(opts.railhook_bin.is_file(), "no railhook binary at {}", opts.railhook_bin.display());
    // The components run in the run's folder: the binary's path must not be relative.
    let bin = opts.railhook_bin.canonicalize().with_context(|| format!("resolve {}", opts.railhook_bin.display()))?;
    eprintln!(
        "railhook-chaos: {} run, {} events over {} endpoints, {} worker(s), seed {}, folder {}",
        if opts.quick { "quick" } else { "full" },
        opts.events,
        opts.endpoints,
        opts.workers,
        opts.seed,
        dir.display()
    );

    // Private servers.
    let (mut pg, mut kafka) = tokio::join!(PgCluster::start(), KafkaBroker::start());
    {
        let admin = railhook_testkit::connect(&pg.url("postgres")).await.context("connect to the private Postgres")?;
        admin.batch_execute("CREATE DATABASE railhook").await.context("create database railhook")?;
    }
    anyhow::ensure!((1..=WORKER_NAMES.len()).contains(&opts.workers), "workers must be 1 to {}", WORKER_NAMES.len());
    let ports = Ports {
        api: free_low_port(),
        relay_ops: free_low_port(),
        worker_ops: (0..opts.workers).map(|_| free_low_port()).collect(),
        receiver: free_low_port(),
    };
    let mut config = config(&pg, &kafka, &ports);
    let config_path = dir.join("railhook.toml");
    std::fs::write(&config_path, toml::to_string(&config).context("render the configuration")?)?;
    // The other workers differ only in their ops port.
    let mut worker_configs = vec![config_path.clone()];
    for (w, port) in ports.worker_ops.iter().enumerate().skip(1) {
        config.worker.ops_listen = ([127, 0, 0, 1], *port).into();
        let path = dir.join(format!("railhook-{}.toml", WORKER_NAMES[w]));
        std::fs::write(&path, toml::to_string(&config).context("render a worker's configuration")?)?;
        worker_configs.push(path);
    }
    let migrate = tokio::process::Command::new(&bin)
        .args(["migrate", "--config"])
        .arg(&config_path)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .await
        .context("run railhook migrate")?;
    anyhow::ensure!(migrate.status.success(), "railhook migrate failed: {}", String::from_utf8_lossy(&migrate.stderr));

    // The receiver.
    let mut secrets = Vec::new();
    let mut endpoints = Vec::new();
    for j in 0..opts.endpoints {
        let profile = profile_for(j, opts.quick);
        let timeout = if profile == Profile::Healthy { HEALTHY_TIMEOUT_S } else { FLAKY_TIMEOUT_S };
        let secret = EndpointSecret::generate();
        secrets.push(secret.as_str().to_string());
        endpoints.push(ReceiverEndpoint { secret, profile, timeout: Duration::from_secs(timeout as u64) });
    }
    let flaky_endpoints = endpoints.iter().filter(|e| e.profile != Profile::Healthy).count();
    // The Destinations' receiver endpoints follow the Endpoints': `opts.endpoints + d`.
    let destination_count: usize = destinations_per_source(opts).iter().sum();
    for d in 0..destination_count {
        let profile = destination_profile(d);
        let timeout = if profile == Profile::Healthy { HEALTHY_TIMEOUT_S } else { FLAKY_TIMEOUT_S };
        endpoints.push(ReceiverEndpoint { secret: EndpointSecret::generate(), profile, timeout: Duration::from_secs(timeout as u64) });
    }
    let receiver = Receiver::start(ports.receiver, endpoints.clone(), opts.seed ^ 0x5eed).await?;
    let receiver = Arc::new(tokio::sync::Mutex::new(receiver));

    // The components.
    let bin = &bin;
    let mut stack = Stack {
        relay: Supervised::start("relay", bin, "relay", &config_path, &logs, opts.restart_delay),
        workers: worker_configs.iter().enumerate().map(|(w, path)| Supervised::start(WORKER_NAMES[w], bin, "worker", path, &logs, opts.restart_delay)).collect(),
        api: Supervised::start("api", bin, "api", &config_path, &logs, opts.restart_delay),
    };
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let base = format!("http://127.0.0.1:{}", ports.api);
    let ready = async {
        let health = format!("{base}/healthz");
        wait_for(Duration::from_secs(60), "the API's /healthz", || http_ok(&http, &health)).await?;
        for port in &ports.worker_ops {
            let ready = format!("http://127.0.0.1:{port}/readyz");
            wait_for(Duration::from_secs(60), "the workers' /readyz", || http_ok(&http, &ready)).await?;
        }
        wait_for(Duration::from_secs(90), "the relay's stream to be live", || async {
            match http.get(format!("http://127.0.0.1:{}/metrics", ports.relay_ops)).send().await {
                Ok(r) => r.text().await.unwrap_or_default().lines().any(|l| l == "railhook_relay_stream_live 1"),
                Err(_) => false,
            }
        })
        .await
    };
    if let Err(e) = ready.await {
        let tails = stack.tails();
        stack.stop().await;
        return Err(e.context(tails));
    }

    let api = client::Api::new(base.clone());
    let plans: Vec<client::EndpointPlan> = (0..opts.endpoints)
        .map(|j| client::EndpointPlan {
            url: format!("http://127.0.0.1:{}/ep/{j}", ports.receiver),
            secret: secrets[j].clone(),
            timeout_seconds: endpoints[j].timeout.as_secs() as i64,
            ordered: is_ordered(j),
        })
        .collect();
    let tenancy = client::set_up(&api, ADMIN_TOKEN, &plans, &RETRY_DELAYS, MAX_ATTEMPTS).await?;
    let incoming_tenancy = Arc::new(incoming::set_up(&api, &tenancy.api_key, &destination_plans(opts, &endpoints, ports.receiver)).await?);
    let setup_s = t0.elapsed().as_secs_f64();
    eprintln!("railhook-chaos: set up in {setup_s:.1} s; sending");

    // Send, and inject the faults meanwhile.
    let t_send = Instant::now();
    let sending = Arc::new(client::Sending::default());
    let plan = plan_faults(opts);
    let run_tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let ordered_endpoints: Vec<usize> = (0..opts.endpoints).filter(|j| is_ordered(*j)).collect();
    let incoming_sending = Arc::new(incoming::IncomingSending::default());
    let bursts = Bursts {
        api: api.clone(),
        key: tenancy.api_key.clone(),
        run: run_tag.clone(),
        types: ordered_endpoints
            .iter()
            .map(|&j| {
                let n = if endpoints[j].profile == Profile::Healthy { opts.ordered_burst } else { opts.ordered_burst_flaky };
                vec![client::ordered_event_type(j); n]
            })
            .collect(),
        first_index: opts.events,
        incoming: IncomingBursts { tenancy: incoming_tenancy.clone(), sending: incoming_sending.clone(), size: opts.incoming_burst, first_index: opts.incoming },
    };
    let client_done = tokio_util::sync::CancellationToken::new();
    let send_incoming = async {
        // Over the paced stream's time (slightly less, so it ends with it).
        let (send_time, slots) = (opts.events as f64 / opts.rate, opts.incoming + opts.incoming / incoming::RESEND_EVERY);
        let rate = slots as f64 / (send_time * 0.95);
        let give_up = Duration::from_secs_f64(send_time) + Duration::from_secs(600);
        incoming::send_all(&api, &incoming_tenancy, &run_tag, opts.incoming, rate, opts.concurrency, give_up, incoming_sending.clone()).await;
    };
    let send = async {
        let give_up = Duration::from_secs_f64(opts.events as f64 / opts.rate) + Duration::from_secs(600);
        client::send_all(&api, &tenancy.api_key, &run_tag, opts.events, opts.endpoints, opts.rate, opts.concurrency, give_up, sending.clone()).await;
        client_done.cancel();
    };
    let faults = inject(&plan, opts, &stack, &mut pg, &mut kafka, receiver.clone(), &sending, &client_done, &bursts);
    let ((), (), (mut records, burst_events)) = tokio::join!(send, send_incoming, faults);
    let send_s = t_send.elapsed().as_secs_f64();
    eprintln!(
        "railhook-chaos: sent in {send_s:.1} s, {} accepted ({} of {burst_events} in ordered bursts); draining",
        sending.accepted_count.load(Ordering::SeqCst) + sending.burst_accepted.load(Ordering::SeqCst),
        sending.burst_accepted.load(Ordering::SeqCst)
    );

    // Drain: until every expected Delivery exists and none is PENDING or PROCESSING.
    let t_drain = Instant::now();
    let accepted: Vec<checker::AcceptedEvent> = sending.accepted.lock().unwrap().clone();
    let expected = expected_count(&accepted, &tenancy.subscriptions);
    let db_url = pg.url("railhook");
    let expected_forwards = incoming_sending.expected_forwards(&incoming_tenancy);
    let drained = wait_for(opts.drain_timeout, "every Delivery and Forward to be terminal", || async {
        let Ok(db) = railhook_testkit::connect(&db_url).await else { return false };
        terminal(&db, "deliveries", expected).await && terminal(&db, "forwards", expected_forwards).await
    })
    .await
    .is_ok();
    let drain_s = t_drain.elapsed().as_secs_f64();
    eprintln!("railhook-chaos: {} in {drain_s:.1} s; checking", if drained { "drained" } else { "NOT drained" });

    // Check.
    let t_check = Instant::now();
    let db = railhook_testkit::connect(&db_url).await.context("connect for the check")?;
    let mut inputs = read_postgres(&db).await?;
    drop(db);
    let mut worker_metric = None;
    for port in &ports.worker_ops {
        if let Some(n) = worker_gap_timeouts(&http, *port).await {
            worker_metric = Some(worker_metric.unwrap_or(0) + n);
        }
    }
    let mut gap_timeouts = GapTimeoutCount { worker_metric, worker_log: 0 };
    stack.stop().await;
    gap_timeouts.worker_log = stack
        .workers
        .iter()
        .map(|w| std::fs::read_to_string(&w.log).unwrap_or_default().lines().filter(|l| l.contains("ordering gap timeout")).count() as u64)
        .sum();
    let (arrivals, forward_arrivals): (Vec<_>, Vec<_>) = receiver.lock().await.arrivals().into_iter().partition(|a| a.endpoint < opts.endpoints);
    receiver.lock().await.go_away().await;
    records.sort_by_key(|r| r.started_at);
    inputs.planned_events = opts.events + burst_events;
    inputs.gap_timeouts = gap_timeouts.worker_log.max(gap_timeouts.worker_metric.unwrap_or(0));
    inputs.gap_timeouts_allowed = false;
    inputs.accepted = accepted;
    inputs.rejected = sending.stats.lock().unwrap().rejected.clone();
    inputs.subscriptions = tenancy.subscriptions.clone();
    inputs.arrivals = arrivals;
    inputs.faults = records.clone();
    let mut verdict = checker::check(&inputs);
    let in_postgres = read_forwards(&pg_client(&db_url).await?).await?;
    let forward_inputs = forwards::ForwardInputs {
        planned: opts.incoming + incoming_sending.burst_events.load(Ordering::SeqCst),
        requests: incoming_sending.answered.lock().unwrap().clone(),
        refused: incoming_sending.refused.lock().unwrap().clone(),
        destinations: incoming_tenancy.destinations.clone(),
        arrivals: forward_arrivals,
        faults: records.clone(),
        ..in_postgres
    };
    checker::merge_forwards(&mut verdict, forwards::check(&forward_inputs));
    let check_s = t_check.elapsed().as_secs_f64();
    std::fs::write(dir.join("arrivals.json"), serde_json::to_vec(&inputs.arrivals)?)?;
    std::fs::write(dir.join("forward_arrivals.json"), serde_json::to_vec(&forward_inputs.arrivals)?)?;
    let keep = opts.keep || !verdict.passed;
    let report = Report {
        mode: if opts.quick { "quick" } else { "full" },
        seed: opts.seed,
        events: opts.events,
        endpoints: opts.endpoints,
        workers: opts.workers,
        flaky_endpoints,
        ordered_endpoints,
        burst_events,
        ordering_gap_timeout_seconds: ORDERING_GAP_TIMEOUT_S,
        gap_timeouts,
        started_at,
        verdict,
        faults_planned: plan,
        faults: records,
        processes: stack.stats(),
        client: sending.stats.lock().unwrap().clone(),
        sources: opts.sources,
        destinations: incoming_tenancy.destinations.len(),
        flaky_destinations: (0..incoming_tenancy.destinations.len()).filter(|d| destination_profile(*d) != Profile::Healthy).count(),
        incoming_client: incoming_sending.stats.lock().unwrap().clone(),
        incoming_burst_events: incoming_sending.burst_events.load(Ordering::SeqCst),
        drained,
        timings: Timings { setup_s, send_s, drain_s, check_s, total_s: t0.elapsed().as_secs_f64() },
        run_dir: keep.then(|| dir.clone()),
    };
    drop(kafka);
    drop(pg);
    if !keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(report)
}

fn destination_plans(opts: &Options, endpoints: &[ReceiverEndpoint], port: u16) -> Vec<Vec<incoming::DestinationPlan>> {
    let mut d = 0;
    let mut plans = Vec::new();
    for count in destinations_per_source(opts) {
        let plan = (d..d + count)
            .map(|d| {
                let endpoint = opts.endpoints + d;
                incoming::DestinationPlan { endpoint, url: format!("http://127.0.0.1:{port}/ep/{endpoint}"), secret: endpoints[endpoint].secret.as_str().to_string() }
            })
            .collect();
        plans.push(plan);
        d += count;
    }
    plans
}

/// At least `expected` rows in `table` and none PENDING or PROCESSING.
async fn terminal(db: &tokio_postgres::Client, table: &str, expected: usize) -> bool {
    let sql = format!("SELECT count(*), count(*) FILTER (WHERE status IN ('PENDING', 'PROCESSING')) FROM {table}");
    match db.query_one(&sql, &[]).await {
        Ok(row) => row.get::<_, i64>(0) as usize >= expected && row.get::<_, i64>(1) == 0,
        Err(_) => false,
    }
}

async fn pg_client(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    railhook_testkit::connect(url).await.context("connect for the check")
}

/// Incoming Events, Forwards and the Forwards' Attempts (`delivery_id` holds the Forward id).
async fn read_forwards(db: &tokio_postgres::Client) -> anyhow::Result<forwards::ForwardInputs> {
    let incoming_in_postgres = db.query("SELECT id FROM incoming_events", &[]).await?.iter().map(|r| r.get(0)).collect();
    let forwards = db
        .query("SELECT id, incoming_event_id, destination_id, status::text, attempt_count, timeout_seconds, created_at FROM forwards", &[])
        .await?
        .iter()
        .map(|r| forwards::ForwardRow {
            id: r.get(0),
            incoming_event_id: r.get(1),
            destination_id: r.get(2),
            status: r.get(3),
            attempt_count: r.get(4),
            timeout_seconds: r.get(5),
            created_at: r.get(6),
        })
        .collect();
    let attempts = db
        .query("SELECT forward_id, attempt_number, started_at, duration_ms, result, status_code FROM attempts WHERE forward_id IS NOT NULL", &[])
        .await?
        .iter()
        .map(|r| checker::AttemptRow {
            delivery_id: r.get(0),
            attempt_number: r.get(1),
            started_at: r.get(2),
            duration_ms: r.get(3),
            result: r.get(4),
            status_code: r.get(5),
        })
        .collect();
    Ok(forwards::ForwardInputs { incoming_in_postgres, forwards, attempts, ..Default::default() })
}

fn expected_count(accepted: &[checker::AcceptedEvent], subs: &[checker::SubscriptionSpec]) -> usize {
    let patterns: Vec<_> = subs.iter().filter_map(|s| railhook_core::pattern::EventTypePattern::parse(&s.pattern).ok()).collect();
    accepted
        .iter()
        .filter_map(|e| railhook_core::pattern::EventType::parse(&e.event_type).ok())
        .map(|t| patterns.iter().filter(|p| p.matches(&t)).count())
        .sum()
}

async fn read_postgres(db: &tokio_postgres::Client) -> anyhow::Result<Inputs> {
    let mut inputs = Inputs::default();
    inputs.events_in_postgres = db.query("SELECT id FROM events", &[]).await?.iter().map(|r| r.get(0)).collect();
    inputs.deliveries = db
        .query("SELECT id, event_id, endpoint_id, subscription_id, status::text, attempt_count, sequence_number, created_at FROM deliveries", &[])
        .await?
        .iter()
        .map(|r| checker::DeliveryRow {
            id: r.get(0),
            event_id: r.get(1),
            endpoint_id: r.get(2),
            subscription_id: r.get(3),
            status: r.get(4),
            attempt_count: r.get(5),
            sequence_number: r.get(6),
            created_at: r.get(7),
        })
        .collect();
    inputs.attempts = db
        .query("SELECT delivery_id, attempt_number, started_at, duration_ms, result, status_code FROM attempts WHERE delivery_id IS NOT NULL", &[])
        .await?
        .iter()
        .map(|r| checker::AttemptRow {
            delivery_id: r.get(0),
            attempt_number: r.get(1),
            started_at: r.get(2),
            duration_ms: r.get(3),
            result: r.get(4),
            status_code: r.get(5),
        })
        .collect();
    Ok(inputs)
}

/// `railhook_ordering_gap_timeout_total` from the worker's /metrics, if it answers.
async fn worker_gap_timeouts(http: &reqwest::Client, port: u16) -> Option<u64> {
    let text = http.get(format!("http://127.0.0.1:{port}/metrics")).send().await.ok()?.text().await.ok()?;
    text.lines().find_map(|l| l.strip_prefix("railhook_ordering_gap_timeout_total ")).and_then(|v| v.trim().parse::<f64>().ok()).map(|v| v as u64)
}

/// The ordered bursts: before each fault, `types[k]` (a burst per ordered Endpoint) is sent
/// as fast as the API takes it, and the fault is injected once half of it was accepted: in
/// the middle of the burst, with ordered Deliveries parked, PENDING and PROCESSING.
struct Bursts {
    api: client::Api,
    key: String,
    run: String,
    types: Vec<Vec<String>>,
    /// Event index of the first burst event (after the paced stream's).
    first_index: usize,
    incoming: IncomingBursts,
}

/// The incoming bursts: before each fault, `size` provider events to the ingress.
struct IncomingBursts {
    tenancy: Arc<incoming::IncomingTenancy>,
    sending: Arc<incoming::IncomingSending>,
    size: usize,
    /// Request index of the first burst request (after the stream's).
    first_index: usize,
}

/// Injects the planned faults in order, each once the client has had that many events
/// accepted (the paced stream's), in the middle of an ordered burst; stops early (skipping
/// the rest) if the client finished first. Returns the faults and how many burst events were
/// sent, once every burst is accepted.
#[allow(clippy::too_many_arguments)]
async fn inject(
    plan: &[PlannedFault],
    opts: &Options,
    stack: &Stack,
    pg: &mut PgCluster,
    kafka: &mut KafkaBroker,
    receiver: Arc<tokio::sync::Mutex<Receiver>>,
    sending: &Arc<client::Sending>,
    client_done: &tokio_util::sync::CancellationToken,
    bursts: &Bursts,
) -> (Vec<FaultRecord>, usize) {
    let mut records = Vec::new();
    let mut outages = Vec::new();
    let mut burst_tasks = Vec::new();
    let mut next_index = bursts.first_index;
    for (fault_no, fault) in plan.iter().enumerate() {
        // Spacing: the fault waits for its point in the send phase.
        loop {
            let accepted = sending.accepted_count.load(Ordering::SeqCst);
            if accepted >= fault.at_accepted {
                break;
            }
            if client_done.is_cancelled() {
                eprintln!("railhook-chaos: the client finished before {:?} at {} accepted; not injected", fault.kind, fault.at_accepted);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if sending.accepted_count.load(Ordering::SeqCst) < fault.at_accepted {
            continue;
        }
        // The burst, and the fault once half of it is accepted (or after 15 s regardless).
        let progress = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut burst_size = 0;
        for types in &bursts.types {
            let (api, key, run, types, first) = (bursts.api.clone(), bursts.key.clone(), bursts.run.clone(), types.clone(), next_index);
            next_index += types.len();
            burst_size += types.len();
            let (sending, progress, concurrency) = (sending.clone(), progress.clone(), opts.concurrency);
            burst_tasks.push(tokio::spawn(async move {
                client::send_burst(&api, &key, &run, first, types, concurrency, Duration::from_secs(600), sending, progress).await;
            }));
        }
        // Each half on its own: the fault then hits Forwards just created as well.
        let incoming_progress = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        burst_tasks.push(incoming_burst(bursts, opts, fault_no, incoming_progress.clone()));
        let _ = wait_for(Duration::from_secs(15), "half of the ordered and incoming bursts", || {
            let (progress, incoming) = (progress.clone(), incoming_progress.clone());
            let incoming_size = bursts.incoming.size;
            async move { progress.load(Ordering::SeqCst) * 2 >= burst_size && incoming.load(Ordering::SeqCst) * 2 >= incoming_size }
        })
        .await;
        let at_accepted = sending.accepted_count.load(Ordering::SeqCst);
        let started_at = Utc::now();
        eprintln!("railhook-chaos: {:?} at {at_accepted} accepted", fault.kind);
        let ended_at = match fault.kind {
            FaultKind::KillApi | FaultKind::KillRelay | FaultKind::KillWorker => {
                let at = stack.get(fault.kind).kill().await;
                records.push(FaultRecord { kind: fault.kind, started_at: at, ended_at: at, at_accepted });
                continue;
            }
            FaultKind::KafkaRestart => {
                kafka.restart().await;
                Utc::now()
            }
            FaultKind::PostgresRestart => {
                pg.fast_restart().await;
                Utc::now()
            }
            FaultKind::ReceiverOutage => {
                let receiver = receiver.clone();
                let outage = opts.outage;
                outages.push(tokio::spawn(async move {
                    receiver.lock().await.go_away().await;
                    let gone = Utc::now();
                    tokio::time::sleep(outage).await;
                    if let Err(e) = receiver.lock().await.come_back().await {
                        eprintln!("railhook-chaos: the receiver cannot come back: {e}");
                    }
                    (gone, Utc::now())
                }));
                records.push(FaultRecord { kind: fault.kind, started_at, ended_at: started_at + opts.outage, at_accepted });
                continue;
            }
        };
        records.push(FaultRecord { kind: fault.kind, started_at, ended_at, at_accepted });
    }
    // The outages end on their own; wait for them, and record their real times.
    let mut real = Vec::new();
    for o in outages {
        if let Ok(times) = o.await {
            real.push(times);
        }
    }
    let mut outage_records = records.iter_mut().filter(|r| r.kind == FaultKind::ReceiverOutage);
    for (gone, back) in real {
        if let Some(r) = outage_records.next() {
            r.started_at = gone;
            r.ended_at = back;
        }
    }
    for task in burst_tasks {
        let _ = task.await;
    }
    (records, next_index - bursts.first_index)
}

/// Fault `fault_no`'s incoming burst, spawned.
fn incoming_burst(bursts: &Bursts, opts: &Options, fault_no: usize, progress: Arc<std::sync::atomic::AtomicUsize>) -> tokio::task::JoinHandle<()> {
    let b = &bursts.incoming;
    let (api, run, tenancy, sending) = (bursts.api.clone(), bursts.run.clone(), b.tenancy.clone(), b.sending.clone());
    let (first, n, concurrency) = (b.first_index + fault_no * b.size, b.size, opts.concurrency);
    tokio::spawn(async move {
        incoming::send_burst(&api, &tenancy, &run, first, n, concurrency, Duration::from_secs(600), &sending, &progress).await;
    })
}

/// The report as text.
pub fn render(report: &Report) -> String {
    let v = &report.verdict;
    let d = &v.duplicates;
    let mut out = String::new();
    let mut line = |k: &str, val: String| out.push_str(&format!("  {k:<38} {val}\n"));
    line("mode", format!("{} (seed {})", report.mode, report.seed));
    line("events planned / accepted", format!("{} / {}", v.planned_events, v.accepted));
    line("endpoints (flaky)", format!("{} ({})", report.endpoints, report.flaky_endpoints));
    line("worker processes", report.workers.to_string());
    line("deliveries expected / in Postgres", format!("{} / {}", v.deliveries_expected, v.deliveries_in_postgres));
    line("delivered (answered 2xx)", v.delivered.to_string());
    line("failed for a reason (all attempts failed)", v.failed_legitimately.to_string());
    line("LOST", v.lost.to_string());
    line("duplicate arrivals", d.total.to_string());
    line("  window 8: lost response", d.window_8_lost_response.to_string());
    line("  window 8: worker killed", d.window_8_worker_killed.to_string());
    line("  window 8: Postgres restart", d.window_8_postgres_restart.to_string());
    line("  UNEXPLAINED", d.unexplained.to_string());
    line("stuck (PENDING/PROCESSING)", v.stuck.to_string());
    let o = &v.ordering;
    line("ordered endpoints (index)", format!("{} {:?}, bursts of {} events in all", o.ordered_endpoints, report.ordered_endpoints, report.burst_events));
    line("ordered deliveries / applied", format!("{} / {}", o.ordered_deliveries, o.applied));
    line("OUT OF ORDER", o.out_of_order.to_string());
    line("sequence number problems", format!("{} (X-Sequence-Number mismatches {})", o.sequence_problems, o.header_mismatches));
    line(
        "GAP TIMEOUTS",
        format!(
            "{} (gap timeout {} s; worker log {}, last worker's /metrics {})",
            o.gap_timeouts,
            report.ordering_gap_timeout_seconds,
            report.gap_timeouts.worker_log,
            report.gap_timeouts.worker_metric.map_or("-".to_string(), |m| m.to_string())
        ),
    );
    line("accepted events missing in Postgres", v.accepted_missing_in_postgres.to_string());
    line("events in Postgres never accepted", v.events_in_postgres_not_accepted.to_string());
    line("deliveries without an accepted event", v.deliveries_without_accepted_event.to_string());
    line("bad signatures", v.bad_signatures.to_string());
    line("attempts", format!("{} {:?}", v.attempts_total, v.attempts_by_result));
    line("arrivals (2xx)", format!("{} ({}) {:?}", v.arrivals_total, v.arrivals_2xx, v.arrivals_by_behaviour));
    line("client", format!("{} requests, {} x 201, {} x 200 replay, {} conn-error retries, {} 5xx retries", report.client.requests, report.client.created_201, report.client.replayed_200, report.client.retried_connection_errors, report.client.retried_5xx));
    render_forwards(report, &mut line);
    for (name, p) in &report.processes {
        line(&format!("process {name}"), format!("{} starts, {} kills, {} unexpected exits", p.starts, p.kills, p.unexpected_exits.len()));
    }
    for f in &report.faults {
        let in_flight = v.ordering.in_flight_at_faults.iter().find(|o| o.kind == f.kind && o.started_at == f.started_at).map_or(0, |o| o.ordered_in_flight);
        line(
            "fault",
            format!("{:?} at {} accepted, {:.1} s, {in_flight} ordered in flight", f.kind, f.at_accepted, (f.ended_at - f.started_at).num_milliseconds() as f64 / 1000.0),
        );
    }
    let t = &report.timings;
    line("time", format!("setup {:.0} s, send {:.0} s, drain {:.0} s, total {:.0} s", t.setup_s, t.send_s, t.drain_s, t.total_s));
    for example in v.lost_examples.iter().take(5) {
        line("lost example", example.clone());
    }
    for example in v.stuck_examples.iter().take(5) {
        line("stuck example", example.clone());
    }
    for example in v.ordering.out_of_order_examples.iter().take(5) {
        line("out of order", example.clone());
    }
    for example in v.ordering.sequence_problem_examples.iter().take(5) {
        line("sequence problem", example.clone());
    }
    for dup in v.duplicate_details.iter().filter(|d| d.window != "8").take(5) {
        line("unexplained duplicate", format!("{} {:?} at {}", dup.delivery_id, dup.explanation, dup.received_at));
    }
    if let Some(dir) = &report.run_dir {
        line("run folder (logs)", dir.display().to_string());
    }
    let verdict = if v.passed { "PASSED".to_string() } else { format!("FAILED: {}", v.failures.join("; ")) };
    format!("railhook chaos report\n{out}  {verdict}\n")
}

/// The incoming direction's lines of the report.
fn render_forwards(report: &Report, line: &mut impl FnMut(&str, String)) {
    let f = &report.verdict.forwards;
    let c = &report.incoming_client;
    line("sources / destinations (flaky)", format!("{} / {} ({})", report.sources, report.destinations, report.flaky_destinations));
    line("incoming planned / accepted", format!("{} / {} ({} in bursts; refused {})", f.planned, f.accepted, report.incoming_burst_events, f.refused));
    line("incoming answers", format!("{} x 202, {} x 200; {} requests, {} conn-error retries, {} 5xx retries", c.stored_202, c.duplicate_200, c.requests, c.retried_connection_errors, c.retried_5xx));
    line("resends answered 200 (same id) / sent", format!("{} / {} (WRONG {}, id mismatches {})", f.resends_200, f.resends, f.resends_wrong, f.id_mismatches));
    line("incoming events in Postgres", format!("{} (accepted missing {}, never accepted {})", f.incoming_in_postgres, f.accepted_missing_in_postgres, f.incoming_not_accepted));
    line("forwards expected / in Postgres", format!("{} / {} (UNEXPECTED {})", f.expected, f.in_postgres, f.unexpected));
    line("forwards delivered (2xx)", format!("{} (failed for a reason {})", f.delivered, f.failed_legitimately));
    line("FORWARDS LOST", f.lost.to_string());
    let d = &f.duplicates;
    line(
        "forward duplicate arrivals",
        format!("{} (window 8: lost response {}, worker killed {}, Postgres restart {}; UNEXPLAINED {})", d.total, d.window_8_lost_response, d.window_8_worker_killed, d.window_8_postgres_restart, d.unexplained),
    );
    line("forwards stuck (PENDING/PROCESSING)", f.stuck.to_string());
    line("forward header mismatches / bad signatures", format!("{} / {}", f.header_mismatches, f.bad_signatures));
    line("forward arrivals (2xx)", format!("{} ({}); attempts {:?}", f.arrivals_total, f.arrivals_2xx, f.attempts_by_result));
    let in_flight: Vec<String> = f.in_flight_at_faults.iter().map(|x| format!("{:?} {}", x.kind, x.forwards_in_flight)).collect();
    line("forwards in flight at the faults", in_flight.join(", "));
    for example in f.lost_examples.iter().chain(&f.stuck_examples).chain(&f.header_examples).take(5) {
        line("forward problem", example.clone());
    }
    for example in f.duplicate_examples.iter().take(5) {
        line("forward duplicate", example.clone());
    }
}

/// Writes the report as pretty JSON, creating the folder.
pub fn write_json(report: &Report, path: &Path) -> anyhow::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(report)? + "\n").with_context(|| format!("write {}", path.display()))
}
