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
//! Quick mode (what `cargo test` runs, `crates/railhook/tests/chaos.rs`): about 500 events
//! over 5 Endpoints, exactly one fault of each kind at fixed points (counted in accepted
//! events), a fixed seed.

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
    pub started_at: DateTime<Utc>,
    pub verdict: Verdict,
    pub faults_planned: Vec<PlannedFault>,
    pub faults: Vec<FaultRecord>,
    pub processes: BTreeMap<String, ProcessStats>,
    pub client: client::SendStats,
    pub drained: bool,
    pub timings: Timings,
    /// Logs, configuration and the receiver's log (kept when the run failed or `keep`).
    pub run_dir: Option<PathBuf>,
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
    c.worker.ops_listen = ([127, 0, 0, 1], ports.worker_ops).into();
    c.worker.group_id = "chaos-worker".into();
    // Sweeps within seconds: PROCESSING longer than 20 s (well past the longest Attempt,
    // 5 s plus the finalise's retries) goes back to PENDING; PENDING unannounced for 10 s is
    // announced again; an unclaimed retry hint after 5 s.
    c.worker.processing_timeout_seconds = 20;
    c.worker.stranded_after_seconds = 10;
    c.worker.retry_reannounce_after_seconds = 5;
    c.worker.shutdown_grace_ms = 5000;
    c.worker.circuit_cooldown_seconds = 5;
    c.network.allow_cidrs = vec!["127.0.0.0/8".into()];
    c.telemetry.log_filter = "info".into();
    c
}

struct Ports {
    api: u16,
    relay_ops: u16,
    worker_ops: u16,
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
    worker: Supervised,
}

impl Stack {
    fn get(&self, kind: FaultKind) -> &Supervised {
        match kind {
            FaultKind::KillApi => &self.api,
            FaultKind::KillRelay => &self.relay,
            _ => &self.worker,
        }
    }

    async fn stop(&mut self) {
        // The API first (no more ingest), then the worker, then the relay.
        self.api.stop().await;
        self.worker.stop().await;
        self.relay.stop().await;
    }

    fn stats(&self) -> BTreeMap<String, ProcessStats> {
        [&self.api, &self.relay, &self.worker].iter().map(|s| (s.name.to_string(), s.stats())).collect()
    }

    fn tails(&self) -> String {
        [&self.api, &self.relay, &self.worker]
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
    eprintln!("railhook-chaos: {} run, {} events over {} endpoints, seed {}, folder {}", if opts.quick { "quick" } else { "full" }, opts.events, opts.endpoints, opts.seed, dir.display());

    // Private servers.
    let (mut pg, mut kafka) = tokio::join!(PgCluster::start(), KafkaBroker::start());
    {
        let admin = railhook_testkit::connect(&pg.url("postgres")).await.context("connect to the private Postgres")?;
        admin.batch_execute("CREATE DATABASE railhook").await.context("create database railhook")?;
    }
    let ports = Ports { api: free_low_port(), relay_ops: free_low_port(), worker_ops: free_low_port(), receiver: free_low_port() };
    let config = config(&pg, &kafka, &ports);
    let config_path = dir.join("railhook.toml");
    std::fs::write(&config_path, toml::to_string(&config).context("render the configuration")?)?;
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
    let receiver = Receiver::start(ports.receiver, endpoints.clone(), opts.seed ^ 0x5eed).await?;
    let receiver = Arc::new(tokio::sync::Mutex::new(receiver));

    // The components.
    let bin = &bin;
    let mut stack = Stack {
        relay: Supervised::start("relay", bin, "relay", &config_path, &logs, opts.restart_delay),
        worker: Supervised::start("worker", bin, "worker", &config_path, &logs, opts.restart_delay),
        api: Supervised::start("api", bin, "api", &config_path, &logs, opts.restart_delay),
    };
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let base = format!("http://127.0.0.1:{}", ports.api);
    let ready = async {
        let (health, ready) = (format!("{base}/healthz"), format!("http://127.0.0.1:{}/readyz", ports.worker_ops));
        wait_for(Duration::from_secs(60), "the API's /healthz", || http_ok(&http, &health)).await?;
        wait_for(Duration::from_secs(60), "the worker's /readyz", || http_ok(&http, &ready)).await?;
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
        })
        .collect();
    let tenancy = client::set_up(&api, ADMIN_TOKEN, &plans, &RETRY_DELAYS, MAX_ATTEMPTS).await?;
    let setup_s = t0.elapsed().as_secs_f64();
    eprintln!("railhook-chaos: set up in {setup_s:.1} s; sending");

    // Send, and inject the faults meanwhile.
    let t_send = Instant::now();
    let sending = Arc::new(client::Sending { accepted: Default::default(), accepted_count: Default::default(), stats: Default::default() });
    let plan = plan_faults(opts);
    let run_tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let client_done = tokio_util::sync::CancellationToken::new();
    let send = async {
        let give_up = Duration::from_secs_f64(opts.events as f64 / opts.rate) + Duration::from_secs(600);
        client::send_all(&api, &tenancy.api_key, &run_tag, opts.events, opts.endpoints, opts.rate, opts.concurrency, give_up, sending.clone()).await;
        client_done.cancel();
    };
    let faults = inject(&plan, opts, &stack, &mut pg, &mut kafka, receiver.clone(), &sending, &client_done);
    let ((), mut records) = tokio::join!(send, faults);
    let send_s = t_send.elapsed().as_secs_f64();
    eprintln!("railhook-chaos: sent in {send_s:.1} s, {} accepted; draining", sending.accepted_count.load(Ordering::SeqCst));

    // Drain: until every expected Delivery exists and none is PENDING or PROCESSING.
    let t_drain = Instant::now();
    let accepted: Vec<checker::AcceptedEvent> = sending.accepted.lock().unwrap().clone();
    let expected = expected_count(&accepted, &tenancy.subscriptions);
    let db_url = pg.url("railhook");
    let drained = wait_for(opts.drain_timeout, "every Delivery to be terminal", || async {
        let Ok(db) = railhook_testkit::connect(&db_url).await else { return false };
        match db
            .query_one("SELECT count(*), count(*) FILTER (WHERE status IN ('PENDING', 'PROCESSING')) FROM deliveries", &[])
            .await
        {
            Ok(row) => row.get::<_, i64>(0) as usize >= expected && row.get::<_, i64>(1) == 0,
            Err(_) => false,
        }
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
    stack.stop().await;
    let arrivals = receiver.lock().await.arrivals();
    receiver.lock().await.go_away().await;
    records.sort_by_key(|r| r.started_at);
    inputs.planned_events = opts.events;
    inputs.accepted = accepted;
    inputs.rejected = sending.stats.lock().unwrap().rejected.clone();
    inputs.subscriptions = tenancy.subscriptions.clone();
    inputs.arrivals = arrivals;
    inputs.faults = records.clone();
    let verdict = checker::check(&inputs);
    let check_s = t_check.elapsed().as_secs_f64();
    std::fs::write(dir.join("arrivals.json"), serde_json::to_vec(&inputs.arrivals)?)?;
    let keep = opts.keep || !verdict.passed;
    let report = Report {
        mode: if opts.quick { "quick" } else { "full" },
        seed: opts.seed,
        events: opts.events,
        endpoints: opts.endpoints,
        flaky_endpoints,
        started_at,
        verdict,
        faults_planned: plan,
        faults: records,
        processes: stack.stats(),
        client: sending.stats.lock().unwrap().clone(),
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
        .query("SELECT id, event_id, endpoint_id, subscription_id, status::text, attempt_count FROM deliveries", &[])
        .await?
        .iter()
        .map(|r| checker::DeliveryRow { id: r.get(0), event_id: r.get(1), endpoint_id: r.get(2), subscription_id: r.get(3), status: r.get(4), attempt_count: r.get(5) })
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

/// Injects the planned faults in order, each once the client has had that many events
/// accepted; stops early (skipping the rest) if the client finished first.
#[allow(clippy::too_many_arguments)]
async fn inject(
    plan: &[PlannedFault],
    opts: &Options,
    stack: &Stack,
    pg: &mut PgCluster,
    kafka: &mut KafkaBroker,
    receiver: Arc<tokio::sync::Mutex<Receiver>>,
    sending: &client::Sending,
    client_done: &tokio_util::sync::CancellationToken,
) -> Vec<FaultRecord> {
    let mut records = Vec::new();
    let mut outages = Vec::new();
    for fault in plan {
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
    records
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
    line("accepted events missing in Postgres", v.accepted_missing_in_postgres.to_string());
    line("events in Postgres never accepted", v.events_in_postgres_not_accepted.to_string());
    line("deliveries without an accepted event", v.deliveries_without_accepted_event.to_string());
    line("bad signatures", v.bad_signatures.to_string());
    line("attempts", format!("{} {:?}", v.attempts_total, v.attempts_by_result));
    line("arrivals (2xx)", format!("{} ({}) {:?}", v.arrivals_total, v.arrivals_2xx, v.arrivals_by_behaviour));
    line("client", format!("{} requests, {} x 201, {} x 200 replay, {} conn-error retries, {} 5xx retries", report.client.requests, report.client.created_201, report.client.replayed_200, report.client.retried_connection_errors, report.client.retried_5xx));
    for (name, p) in &report.processes {
        line(&format!("process {name}"), format!("{} starts, {} kills, {} unexpected exits", p.starts, p.kills, p.unexpected_exits.len()));
    }
    for f in &report.faults {
        line("fault", format!("{:?} at {} accepted, {:.1} s", f.kind, f.at_accepted, (f.ended_at - f.started_at).num_milliseconds() as f64 / 1000.0));
    }
    let t = &report.timings;
    line("time", format!("setup {:.0} s, send {:.0} s, drain {:.0} s, total {:.0} s", t.setup_s, t.send_s, t.drain_s, t.total_s));
    for example in v.lost_examples.iter().take(5) {
        line("lost example", example.clone());
    }
    for example in v.stuck_examples.iter().take(5) {
        line("stuck example", example.clone());
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

/// Writes the report as pretty JSON, creating the folder.
pub fn write_json(report: &Report, path: &Path) -> anyhow::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(report)? + "\n").with_context(|| format!("write {}", path.display()))
}
