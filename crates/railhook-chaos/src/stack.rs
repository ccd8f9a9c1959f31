//! The product's processes of one run and their configuration. On the Kafka transport:
//! `railhook api`, `relay` and `worker` processes (quick mode one of each; the full run two
//! of each, one relay the hot standby of the other). On the inline transport: `railhook
//! all` processes with `transport = "inline"` and no broker (quick one; full two, one
//! streaming from the slot, the other's relay its hot standby), each the run's api, relay
//! and worker at once: the stack lists a handle of each in the three roles, and its one
//! `/metrics` (the API's) is where the relay's and the worker's metrics are read. Each
//! process under a supervisor ([`crate::procs`]), each with its own configuration file (its
//! ports), reaching Postgres (and Kafka) through its component's proxy when the run injects
//! network faults ([`crate::network`]).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use crate::options::{incoming_ladder, Options, ADMIN_TOKEN, ENDPOINT_CONCURRENCY, ORDERING_GAP_TIMEOUT_S, STRANDED_AFTER_S};
use crate::plan::Component;
use crate::procs::{ProcessStats, Supervised};

/// Process names, by role and index: the faults act on the first of a kind (the relay's on
/// the one streaming).
const API_NAMES: [&str; 2] = ["api", "api2"];
const RELAY_NAMES: [&str; 2] = ["relay", "relay2"];
pub const WORKER_NAMES: [&str; 4] = ["worker", "worker2", "worker3", "worker4"];
const SKEWED_NAME: &str = "worker-skewed";
const ALL_NAMES: [&str; 2] = ["all", "all2"];

/// How far ahead the skewed worker's clock runs (`clock_skew`): 30 s.
pub const CLOCK_AHEAD_MS: i64 = 30_000;

/// On inline, `api`, `relay_ops` and `worker_ops` are the same ports: each `all` process's
/// API, whose `/metrics` has its relay's and its worker's metrics.
pub struct Ports {
    pub api: Vec<u16>,
    /// Where each relay's `/metrics` is.
    pub relay_ops: Vec<u16>,
    /// One per worker process: its `/metrics` and `/readyz`.
    pub worker_ops: Vec<u16>,
    /// The worker with the skewed clock.
    pub skewed_ops: u16,
    pub receiver: u16,
}

impl Ports {
    pub fn pick(opts: &Options) -> Ports {
        let free = railhook_testkit::free_port;
        if opts.inline() {
            let api: Vec<u16> = (0..opts.alls).map(|_| free()).collect();
            return Ports { relay_ops: api.clone(), worker_ops: api.clone(), api, skewed_ops: free(), receiver: free() };
        }
        Ports {
            api: (0..opts.apis).map(|_| free()).collect(),
            relay_ops: (0..opts.relays).map(|_| free()).collect(),
            worker_ops: (0..opts.workers).map(|_| free()).collect(),
            skewed_ops: free(),
            receiver: free(),
        }
    }
}

/// Where each component reaches Postgres (a URL) and Kafka (`bootstrap.servers`).
pub struct Routes {
    pub postgres: HashMap<Component, String>,
    pub kafka: HashMap<Component, String>,
}

/// The configuration every process shares; [`Stack::start`] sets each one's ports and routes.
pub fn base_config() -> railhook_config::Config {
    let mut c = railhook_config::Config::default();
    c.database.max_connections = 16;
    c.database.acquire_timeout_ms = 3000;
    c.kafka.topic_prefix = "chaos.".into();
    c.kafka.partitions = 3;
    // A killed worker's group membership ends after 6 s instead of 45 s, so the restarted
    // worker gets its partitions soon (librdkafka warns that producers ignore these).
    c.kafka.properties.insert("session.timeout.ms".into(), "6000".into());
    c.kafka.properties.insert("heartbeat.interval.ms".into(), "1000".into());
    c.api.admin_token = ADMIN_TOKEN.into();
    c.relay.status_interval_ms = 500;
    c.worker.group_id = "chaos-worker".into();
    // Sweeps within seconds: PROCESSING longer than 20 s (well past the longest Attempt,
    // 5 s plus the finalise's retries) goes back to PENDING; an unclaimed retry hint after
    // 5 s. PENDING unannounced after a minute (see STRANDED_AFTER_S).
    c.worker.processing_timeout_seconds = 20;
    c.worker.stranded_after_seconds = STRANDED_AFTER_S;
    c.worker.retry_reannounce_after_seconds = 5;
    c.worker.shutdown_grace_ms = 5000;
    c.worker.circuit_cooldown_seconds = 5;
    c.worker.endpoint_concurrency = ENDPOINT_CONCURRENCY;
    // Never needed in this run (see ORDERING_GAP_TIMEOUT_S): one that fires fails it.
    c.worker.ordering_gap_timeout_seconds = ORDERING_GAP_TIMEOUT_S;
    // The Forwards' ladder: the Subscriptions' (20 Attempts, about 150 s) instead of the
    // incoming default (60 s to an hour, 5 Attempts).
    c.worker.incoming_retry_delays_seconds = incoming_ladder();
    c.network.allow_cidrs = vec!["127.0.0.0/8".into()];
    c.telemetry.log_filter = "info".into();
    c
}

pub struct Stack {
    /// The `railhook all` processes on inline (each also in `apis`, `relays` and `workers`);
    /// empty on Kafka.
    pub alls: Vec<Supervised>,
    pub apis: Vec<Supervised>,
    /// One streams; with two, the other waits as its hot standby.
    pub relays: Vec<Supervised>,
    /// Never empty; the faults kill the first.
    pub workers: Vec<Supervised>,
    /// The worker whose clock runs ahead, while `clock_skew` lasts.
    pub skewed: Option<Supervised>,
    bin: PathBuf,
    logs: PathBuf,
    restart_delay: Duration,
    skewed_config: PathBuf,
    pub ports: Ports,
}

impl Stack {
    /// Writes each process's configuration into `dir` and starts them all.
    pub fn start(opts: &Options, bin: &Path, dir: &Path, logs: &Path, base: &railhook_config::Config, routes: &Routes, ports: Ports) -> anyhow::Result<Stack> {
        anyhow::ensure!((1..=WORKER_NAMES.len()).contains(&opts.workers), "workers must be 1 to {}", WORKER_NAMES.len());
        anyhow::ensure!((1..=2).contains(&opts.apis) && (1..=2).contains(&opts.relays), "1 or 2 api and relay processes");
        let write = |name: &str, component: Component, set: &dyn Fn(&mut railhook_config::Config)| -> anyhow::Result<PathBuf> {
            let mut c = base.clone();
            c.database.url = routes.postgres[&component].clone();
            c.kafka.brokers = routes.kafka[&component].clone();
            set(&mut c);
            let path = dir.join(format!("{name}.toml"));
            std::fs::write(&path, toml::to_string(&c).context("render a configuration")?)?;
            Ok(path)
        };
        let local = |port: u16| std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let skewed_config = write(SKEWED_NAME, Component::Worker, &|c| c.worker.ops_listen = local(ports.skewed_ops))?;
        if opts.inline() {
            anyhow::ensure!((1..=ALL_NAMES.len()).contains(&opts.alls), "1 or 2 `railhook all` processes");
            let mut alls = Vec::new();
            for (i, port) in ports.api.iter().enumerate() {
                let path = write(ALL_NAMES[i], Component::All, &|c| {
                    c.api.listen = local(*port);
                    c.transport = railhook_config::Transport::Inline;
                    c.kafka.brokers = String::new();
                })?;
                alls.push(Supervised::start(ALL_NAMES[i], bin, "all", &path, logs, opts.restart_delay));
            }
            let (apis, relays, workers) = (alls.clone(), alls.clone(), alls.clone());
            return Ok(Stack { alls, apis, relays, workers, skewed: None, bin: bin.to_path_buf(), logs: logs.to_path_buf(), restart_delay: opts.restart_delay, skewed_config, ports });
        }
        let mut apis = Vec::new();
        for (i, port) in ports.api.iter().enumerate() {
            let path = write(API_NAMES[i], Component::Api, &|c| c.api.listen = local(*port))?;
            apis.push(Supervised::start(API_NAMES[i], bin, "api", &path, logs, opts.restart_delay));
        }
        let mut relays = Vec::new();
        for (i, port) in ports.relay_ops.iter().enumerate() {
            let path = write(RELAY_NAMES[i], Component::Relay, &|c| c.relay.ops_listen = local(*port))?;
            relays.push(Supervised::start(RELAY_NAMES[i], bin, "relay", &path, logs, opts.restart_delay));
        }
        let mut workers = Vec::new();
        for (i, port) in ports.worker_ops.iter().enumerate() {
            let path = write(WORKER_NAMES[i], Component::Worker, &|c| c.worker.ops_listen = local(*port))?;
            workers.push(Supervised::start(WORKER_NAMES[i], bin, "worker", &path, logs, opts.restart_delay));
        }
        Ok(Stack { alls: Vec::new(), apis, relays, workers, skewed: None, bin: bin.to_path_buf(), logs: logs.to_path_buf(), restart_delay: opts.restart_delay, skewed_config, ports })
    }

    /// Starts the worker whose clock runs [`CLOCK_AHEAD_MS`] ahead: its wall clock read
    /// through `RAILHOOK_FAILPOINT_CLOCK_AHEAD_MS` (`railhook_worker::clock::host_now`).
    pub fn start_skewed(&mut self) {
        let env = vec![("RAILHOOK_FAILPOINT_CLOCK_AHEAD_MS".to_string(), CLOCK_AHEAD_MS.to_string())];
        self.skewed = Some(Supervised::start_with_env(SKEWED_NAME, &self.bin, "worker", &self.skewed_config, &self.logs, self.restart_delay, env));
    }

    pub async fn stop_skewed(&mut self) {
        if let Some(s) = self.skewed.as_mut() {
            s.stop().await;
        }
    }

    /// The relay streaming from the slot (its `/metrics` says `railhook_relay_stream_live 1`).
    pub async fn active_relay(&self, http: &reqwest::Client) -> Option<usize> {
        for (i, port) in self.ports.relay_ops.iter().enumerate() {
            if let Ok(r) = http.get(format!("http://127.0.0.1:{port}/metrics")).send().await {
                if r.text().await.unwrap_or_default().lines().any(|l| l == "railhook_relay_stream_live 1") {
                    return Some(i);
                }
            }
        }
        None
    }

    /// A metric's value summed over the relays' `/metrics` (those that answer).
    pub async fn relay_metric(&self, http: &reqwest::Client, name: &str) -> f64 {
        let mut sum = 0.0;
        for port in &self.ports.relay_ops {
            sum += metric(http, *port, name).await.unwrap_or(0.0);
        }
        sum
    }

    /// Every process once (on inline each `all` process is in three roles).
    pub fn all(&self) -> Vec<&Supervised> {
        let mut all: Vec<&Supervised> = Vec::new();
        for s in self.apis.iter().chain(&self.relays).chain(&self.workers).chain(&self.skewed) {
            if !all.iter().any(|a| a.name == s.name) {
                all.push(s);
            }
        }
        all
    }

    pub async fn stop(&mut self) {
        // The APIs first (no more ingest), then the workers, then the relays.
        for a in &mut self.apis {
            a.stop().await;
        }
        for w in self.workers.iter_mut().chain(self.skewed.iter_mut()) {
            w.stop().await;
        }
        for r in &mut self.relays {
            r.stop().await;
        }
    }

    pub fn stats(&self) -> BTreeMap<String, ProcessStats> {
        self.all().iter().map(|s| (s.name.to_string(), s.stats())).collect()
    }

    pub fn tails(&self) -> String {
        self.all().iter().map(|s| format!("--- {} ({}):\n{}", s.name, s.log.display(), s.log_tail(15))).collect::<Vec<_>>().join("\n")
    }
}

/// One unlabelled sample of `name` from the `/metrics` on 127.0.0.1:`port`; labelled series
/// of the name are summed.
pub async fn metric(http: &reqwest::Client, port: u16, name: &str) -> Option<f64> {
    let text = http.get(format!("http://127.0.0.1:{port}/metrics")).send().await.ok()?.text().await.ok()?;
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let base = series.split('{').next().unwrap_or(series);
        if base == name {
            if let Ok(v) = value.trim().parse::<f64>() {
                *found.get_or_insert(0.0) += v;
            }
        }
    }
    found
}
