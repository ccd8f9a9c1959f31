//! A Railhook deployment for one benchmark: a fresh database, its own topic prefix and slot,
//! and the api (plus, for e2e, the relay and the worker) as separate `railhook` processes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use railhook_config::Config;
use railhook_testkit::{test_config, TestDb};
use serde_json::json;

use crate::http::post_json;
use crate::procs::{free_port, wait_ready, Proc};

pub struct Stack {
    pub db: TestDb,
    pub config: Config,
    pub api_addr: SocketAddr,
    pub api_key: String,
    pub procs: Vec<Proc>,
}

impl Stack {
    /// `pipeline`: also run the relay and the worker (e2e); the api alone otherwise.
    pub async fn start(bin: &Path, name: &str, pipeline: bool, tune: impl FnOnce(&mut Config)) -> anyhow::Result<Stack> {
        let (db, mut config) = fresh().await?;
        config.relay.ops_listen = format!("127.0.0.1:{}", free_port()?).parse()?;
        config.worker.ops_listen = format!("127.0.0.1:{}", free_port()?).parse()?;
        tune(&mut config);
        let dir = log_dir(name);
        let api_addr = config.api.listen;
        let mut api = Proc::spawn(bin, &config, "api", &["api"], &dir)?;
        wait_ready(&mut api, &format!("http://{api_addr}/readyz"), None, Duration::from_secs(30)).await?;
        let mut procs = vec![api];
        if pipeline {
            railhook_kafka::ensure_topics(&config.kafka, &[config.deliveries_topic(), config.forwards_topic()]).await?;
            let mut relay = Proc::spawn(bin, &config, "relay", &["relay"], &dir)?;
            let url = format!("http://{}/metrics", config.relay.ops_listen);
            wait_ready(&mut relay, &url, Some("railhook_relay_stream_live 1"), Duration::from_secs(60)).await?;
            let mut worker = Proc::spawn(bin, &config, "worker", &["worker"], &dir)?;
            wait_ready(&mut worker, &format!("http://{}/readyz", config.worker.ops_listen), None, Duration::from_secs(60)).await?;
            procs.push(relay);
            procs.push(worker);
        }
        let token = config.api.admin_token.clone();
        let org = post_json(api_addr, "/v1/admin/organizations", &token, json!({"name": "bench"})).await?;
        let org = org["id"].as_str().context("organization id")?;
        let project = post_json(api_addr, &format!("/v1/admin/organizations/{org}/projects"), &token, json!({"name": name})).await?;
        let api_key = project["api_key"]["secret"].as_str().context("api key")?.to_string();
        Ok(Stack { db, config, api_addr, api_key, procs })
    }

    /// One `railhook all` process on `transport` (issue 32's side-by-side): the API, the relay
    /// and the worker in one process, their metrics on the API's /metrics (the stack's relay
    /// and worker metrics addresses point there). Kafka's topics are made first on Kafka;
    /// inline gets no broker at all.
    pub async fn start_all(bin: &Path, name: &str, transport: railhook_config::TransportKind) -> anyhow::Result<Stack> {
        Stack::start_all_with(bin, name, transport, &[]).await
    }

    /// [`Stack::start_all`] with `env` set for the process (the `tracing` benchmark's
    /// `OTEL_*` variables).
    pub async fn start_all_with(bin: &Path, name: &str, transport: railhook_config::TransportKind, env: &[(&str, String)]) -> anyhow::Result<Stack> {
        let (db, mut config) = fresh().await?;
        config.relay.ops_listen = config.api.listen;
        config.worker.ops_listen = config.api.listen;
        match transport {
            railhook_config::TransportKind::Kafka => {
                config.transport = railhook_config::Transport::Kafka;
                railhook_kafka::ensure_topics(&config.kafka, &[config.deliveries_topic(), config.forwards_topic()]).await?;
            }
            railhook_config::TransportKind::Inline => {
                config.transport = railhook_config::Transport::Inline;
                config.kafka.brokers = String::new();
            }
        }
        let dir = log_dir(name);
        let api_addr = config.api.listen;
        let mut all = Proc::spawn_with(bin, &config, "all", &["all"], &dir, env)?;
        wait_ready(&mut all, &format!("http://{api_addr}/metrics"), Some("railhook_relay_stream_live 1"), Duration::from_secs(60)).await?;
        let token = config.api.admin_token.clone();
        let org = post_json(api_addr, "/v1/admin/organizations", &token, json!({"name": "bench"})).await?;
        let org = org["id"].as_str().context("organization id")?;
        let project = post_json(api_addr, &format!("/v1/admin/organizations/{org}/projects"), &token, json!({"name": name})).await?;
        let api_key = project["api_key"]["secret"].as_str().context("api key")?.to_string();
        Ok(Stack { db, config, api_addr, api_key, procs: vec![all] })
    }

    /// An Endpoint at `url` subscribed to `pattern`; returns its id.
    pub async fn endpoint(&self, url: &str, pattern: &str) -> anyhow::Result<String> {
        self.endpoint_with(url, pattern, false).await
    }

    /// An Endpoint subscribed to `pattern`, with ordered delivery when `ordering`.
    pub async fn endpoint_with(&self, url: &str, pattern: &str, ordering: bool) -> anyhow::Result<String> {
        let ep = post_json(self.api_addr, "/v1/endpoints", &self.api_key, json!({"url": url})).await?;
        let id = ep["id"].as_str().context("endpoint id")?.to_string();
        post_json(self.api_addr, "/v1/subscriptions", &self.api_key, json!({"endpoint_id": id, "event_type": pattern, "ordering": ordering})).await?;
        Ok(id)
    }

    pub fn proc(&self, name: &str) -> &Proc {
        self.procs.iter().find(|p| p.name == name).expect("a started component")
    }

    pub fn check_running(&mut self) -> anyhow::Result<()> {
        self.procs.iter_mut().try_for_each(|p| p.check_running())
    }

    pub async fn stop(mut self) {
        // The worker first, then the relay, then the api: nothing left half-done.
        while let Some(p) = self.procs.pop() {
            p.stop().await;
        }
        // The relay's walsender leaves a moment after the relay: the slot is dropped once it
        // is inactive (a slot left behind keeps the cluster's WAL for every later run).
        let client = self.db.client().await;
        let slot = &self.config.relay.slot_name;
        for _ in 0..100 {
            let active: Option<bool> = client
                .query_opt("SELECT active FROM pg_replication_slots WHERE slot_name = $1", &[slot])
                .await
                .ok()
                .flatten()
                .map(|r| r.get(0));
            match active {
                Some(true) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
                Some(false) => {
                    client.execute("SELECT pg_drop_replication_slot($1)", &[slot]).await.ok();
                    return;
                }
                None => return,
            }
        }
        eprintln!("the slot {slot} stayed active 5 s after its relay stopped; not dropped");
    }
}

/// A fresh database and the benchmarks' settings for it (the pool size of production, 6
/// partitions, warnings only, the API on a free port).
async fn fresh() -> anyhow::Result<(TestDb, Config)> {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.database.max_connections = Config::default().database.max_connections;
    config.kafka.partitions = 6;
    config.telemetry.log_filter = "warn".into();
    config.api.listen = format!("127.0.0.1:{}", free_port()?).parse()?;
    Ok((db, config))
}

pub fn log_dir(name: &str) -> PathBuf {
    let base = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("target"));
    base.join("bench").join(name)
}
