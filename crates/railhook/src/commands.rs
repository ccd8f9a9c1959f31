//! The subcommands that start something. Each component starts as
//! `run(state, listener, shutdown)`; here they are wired to signals.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use railhook_config::Config;
use railhook_core::{OrganizationId, ProjectId};
use railhook_store::tenancy;
use railhook_store::Migrator;
use railhook_telemetry::stages::Stages;
use railhook_telemetry::{Metrics, Ops, ReadyCheck};
use tokio_util::sync::CancellationToken;

async fn connect(config: &Config) -> anyhow::Result<tokio_postgres::Client> {
    let (client, _connection) = railhook_store::connect_as(&config.database.url, railhook_store::application::CLI)
        .await
        .with_context(|| format!("connecting to {}", railhook_config::redact_url(&config.database.url)))?;
    Ok(client)
}

fn print_json(value: &impl serde::Serialize) -> anyhow::Result<ExitCode> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(ExitCode::SUCCESS)
}

pub async fn admin_create_org(config: &Config, name: &str) -> anyhow::Result<ExitCode> {
    let name = railhook_api::admin::check_name(name).map_err(|e| anyhow::anyhow!(e.message))?;
    let client = connect(config).await?;
    print_json(&tenancy::create_organization(&client, name).await?)
}

pub async fn admin_create_project(config: &Config, org: &str, name: &str) -> anyhow::Result<ExitCode> {
    let org: OrganizationId = org.parse().with_context(|| format!("--org {org}"))?;
    let name = railhook_api::admin::check_name(name).map_err(|e| anyhow::anyhow!(e.message))?;
    let mut client = connect(config).await?;
    let tx = client.transaction().await?;
    let project = tenancy::create_project(&tx, org, name).await?.ok_or_else(|| anyhow::anyhow!("organization {org} does not exist"))?;
    let api_key = tenancy::create_api_key(&tx, project.id, "default").await?.ok_or_else(|| anyhow::anyhow!("project vanished"))?;
    tx.commit().await?;
    print_json(&railhook_api::admin::ProjectCreated { project, api_key })
}

pub async fn admin_create_api_key(config: &Config, project: &str, name: &str) -> anyhow::Result<ExitCode> {
    let project: ProjectId = project.parse().with_context(|| format!("--project {project}"))?;
    let client = connect(config).await?;
    let key = tenancy::create_api_key(&client, project, name).await?.ok_or_else(|| anyhow::anyhow!("project {project} does not exist"))?;
    print_json(&key)
}

pub async fn migrate(config: &Config) -> anyhow::Result<ExitCode> {
    let mut client = connect(config).await?;
    let report = Migrator::embedded().run(&mut client).await?;
    if report.applied.is_empty() {
        println!("database is up to date ({} migrations already applied)", report.already_applied);
    } else {
        for name in &report.applied {
            println!("applied {name}");
        }
        println!("{} applied, {} already applied", report.applied.len(), report.already_applied);
    }
    Ok(ExitCode::SUCCESS)
}

/// Cancels `token` on SIGINT or SIGTERM.
fn cancel_on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
        token.cancel();
    });
}

async fn api_state(config: Config, metrics: Metrics) -> anyhow::Result<railhook_api::AppState> {
    let pool = railhook_store::connect_pool_as(&config.database, railhook_store::application::API)
        .await
        .with_context(|| format!("connecting to {}", railhook_config::redact_url(&config.database.url)))?;
    Ok(railhook_api::AppState::new(Arc::new(config), pool, metrics))
}

pub async fn api(config: Config) -> anyhow::Result<ExitCode> {
    let listen = config.api.listen;
    let state = api_state(config, Metrics::new()).await?;
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    let shutdown = CancellationToken::new();
    cancel_on_signal(shutdown.clone());
    railhook_api::run(state, listener, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

/// The relay's metrics; `stages` is the latency-stage histogram, shared with the worker when
/// both run in one process (one registry, one series per stage).
fn relay_metrics(metrics: &Metrics, stages: &Stages) -> anyhow::Result<railhook_relay::RelayMetrics> {
    let relay = railhook_relay::RelayMetrics::new(Arc::new(railhook_relay::RelayStats { stages: stages.clone(), ..Default::default() }));
    relay.register(metrics.registry())?;
    Ok(relay)
}

/// The worker's metrics, with the shared latency-stage histogram (see [`relay_metrics`]).
fn worker_metrics(metrics: &Metrics, stages: &Stages) -> anyhow::Result<railhook_worker::WorkerMetrics> {
    let worker = railhook_worker::WorkerMetrics { stages: stages.clone(), ..railhook_worker::WorkerMetrics::new() };
    worker.register(metrics.registry())?;
    Ok(worker)
}

/// The latency-stage histogram (`railhook_telemetry::stages`), registered once per process.
fn stages(metrics: &Metrics) -> anyhow::Result<Stages> {
    let stages = Stages::new();
    stages.register(metrics.registry())?;
    Ok(stages)
}

type CheckFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

/// `/readyz` of the relay: Postgres and Kafka must answer.
fn relay_checks(config: &Arc<Config>) -> Vec<(&'static str, ReadyCheck)> {
    let pg = config.clone();
    let kafka = config.clone();
    vec![
        (
            "postgres",
            Arc::new(move || -> CheckFuture {
                let url = pg.database.url.clone();
                Box::pin(async move {
                    let (client, _conn) = railhook_store::connect(&url).await.map_err(|e| e.to_string())?;
                    client.simple_query("SELECT 1").await.map(|_| ()).map_err(|e| e.to_string())
                })
            }) as ReadyCheck,
        ),
        (
            "kafka",
            Arc::new(move || -> CheckFuture {
                let kafka = kafka.kafka.clone();
                Box::pin(async move {
                    railhook_kafka::check_reachable(&kafka, std::time::Duration::from_secs(2)).await.map(|_| ()).map_err(|e| e.to_string())
                })
            }) as ReadyCheck,
        ),
    ]
}

/// `/readyz` of `railhook worker`: the relay's checks and [`consumer_check`].
fn worker_checks(config: &Arc<Config>, worker: railhook_worker::WorkerMetrics) -> Vec<(&'static str, ReadyCheck)> {
    let mut checks = relay_checks(config);
    checks.push(("kafka_consumer", consumer_check(worker)));
    checks
}

/// The worker's Deliveries consumer has received its first assignment
/// (`railhook_worker_consumer_joined`). Before that it reads nothing: a burst sent as soon as
/// the process answered would wait in Kafka (issue 30). `railhook worker`'s `/readyz`, and
/// `railhook all`'s on the Kafka transport.
fn consumer_check(worker: railhook_worker::WorkerMetrics) -> ReadyCheck {
    Arc::new(move || -> CheckFuture {
        let joined = worker.consumer_joined.get() == 1;
        Box::pin(async move { if joined { Ok(()) } else { Err("the Deliveries consumer has not joined its consumer group yet".to_string()) } })
    }) as ReadyCheck
}

/// The inline transport hands announcements from the relay to the worker of one process:
/// `railhook relay` and `railhook worker` alone cannot use it.
fn needs_kafka(config: &Config, command: &str) -> anyhow::Result<()> {
    if config.transport() == railhook_config::TransportKind::Inline {
        let why = if config.transport == railhook_config::Transport::Inline { "transport is \"inline\"" } else { "kafka.brokers is not set, so transport \"auto\" is inline" };
        anyhow::bail!(
            "railhook {command} cannot run with the inline transport ({why}): inline hands announcements from the relay to the worker inside one `railhook all` process. Run `railhook all`, or set kafka.brokers (RAILHOOK_KAFKA_BROKERS) and transport = \"kafka\" to run the relay and the workers as separate processes"
        );
    }
    Ok(())
}

/// How long a component started with the Kafka transport waits for a broker to answer
/// before it stops with an error naming `kafka.brokers`.
const KAFKA_STARTUP_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// With the Kafka transport, a broker must answer at start-up (within
/// [`KAFKA_STARTUP_WAIT`], so components started together with Kafka wait for it):
/// otherwise a clear error naming the setting, never a silent fallback to inline. Once
/// running, a Kafka outage only delays announcements (the relay and workers retry).
async fn kafka_reachable(config: &Config) -> anyhow::Result<()> {
    if config.transport() != railhook_config::TransportKind::Kafka {
        return Ok(());
    }
    let started = std::time::Instant::now();
    loop {
        match railhook_kafka::check_reachable(&config.kafka, std::time::Duration::from_secs(5)).await {
            Ok(_) => return Ok(()),
            Err(e) if started.elapsed() >= KAFKA_STARTUP_WAIT => {
                anyhow::bail!(
                    "kafka.brokers = {}: no Kafka broker answered within {} s ({e}). The transport is kafka because {}. Start Kafka or fix kafka.brokers; for one process without Kafka, set transport = \"inline\" and run `railhook all`",
                    config.kafka.brokers,
                    KAFKA_STARTUP_WAIT.as_secs(),
                    if config.transport == railhook_config::Transport::Kafka { "transport = \"kafka\"" } else { "kafka.brokers is set" }
                )
            }
            Err(e) => {
                tracing::warn!(brokers = %config.kafka.brokers, error = %e, "Kafka not reachable yet at kafka.brokers; waiting");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }
}

pub async fn relay(config: Config) -> anyhow::Result<ExitCode> {
    needs_kafka(&config, "relay")?;
    kafka_reachable(&config).await?;
    let config = Arc::new(config);
    let metrics = Metrics::new();
    let relay_metrics = relay_metrics(&metrics, &stages(&metrics)?)?;
    let listen = config.relay.ops_listen;
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding relay.ops_listen {listen}"))?;
    let shutdown = CancellationToken::new();
    cancel_on_signal(shutdown.clone());
    let ops = railhook_telemetry::ops_router(Ops::new(metrics, relay_checks(&config)));
    let server = tokio::spawn(railhook_telemetry::serve(listener, ops, shutdown.clone()));
    let result = railhook_relay::run(config, relay_metrics, shutdown.clone()).await;
    shutdown.cancel();
    server.await??;
    result?;
    Ok(ExitCode::SUCCESS)
}

pub async fn worker(config: Config) -> anyhow::Result<ExitCode> {
    needs_kafka(&config, "worker")?;
    kafka_reachable(&config).await?;
    let config = Arc::new(config);
    let metrics = Metrics::new();
    let worker_metrics = worker_metrics(&metrics, &stages(&metrics)?)?;
    let listen = config.worker.ops_listen;
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding worker.ops_listen {listen}"))?;
    let shutdown = CancellationToken::new();
    cancel_on_signal(shutdown.clone());
    let source = kafka_source(&config, &metrics, &shutdown)?;
    let ops = railhook_telemetry::ops_router(Ops::new(metrics, worker_checks(&config, worker_metrics.clone())));
    let server = tokio::spawn(railhook_telemetry::serve(listener, ops, shutdown.clone()));
    let result = railhook_worker::run(config, worker_metrics, shutdown.clone()).await;
    shutdown.cancel();
    let source = match source {
        Some(task) => task.await.map_err(anyhow::Error::from).and_then(|r| r),
        None => Ok(()),
    };
    server.await??;
    result?;
    source?;
    Ok(ExitCode::SUCCESS)
}

/// The Kafka source (`kafka_source.topics` set), beside the worker of this process: its
/// metrics on the process's registry, and a stop of its own (a setting that cannot work)
/// stops the process, as a component of `railhook all` does.
fn kafka_source(config: &Arc<Config>, metrics: &Metrics, shutdown: &CancellationToken) -> anyhow::Result<Option<tokio::task::JoinHandle<anyhow::Result<()>>>> {
    if !config.kafka_source_enabled() {
        return Ok(None);
    }
    let source_metrics = railhook_kafka_source::SourceMetrics::new();
    source_metrics.register(metrics.registry())?;
    let (config, token) = (config.clone(), shutdown.clone());
    Ok(Some(tokio::spawn(async move {
        let result = railhook_kafka_source::run(config, source_metrics, token.clone()).await;
        if !token.is_cancelled() {
            token.cancel();
        }
        result.map_err(|e| anyhow::anyhow!("{}", railhook_kafka_source::error::chain(&e)))
    })))
}

/// The API, the relay and the worker in one process, with one /metrics (the API's).
///
/// Supervised: the first component to stop, for any reason, cancels the others. A stop that
/// nobody asked for (no SIGTERM/SIGINT: a fatal error, or a component that returned on its
/// own) makes the process exit non-zero after the others drained, so that a process manager
/// restarts the whole; a process that kept serving without its worker would accept Events
/// and deliver none.
pub async fn all(config: Config) -> anyhow::Result<ExitCode> {
    kafka_reachable(&config).await?;
    // The inline transport: the relay's announcements go to this process's worker through
    // bounded channels (railhook_kafka::inline), as many as the worker may run at once.
    let (inline_tx, inline_rx) = match config.transport() {
        railhook_config::TransportKind::Inline => {
            let (tx, rx) = railhook_kafka::inline::channel(config.worker.max_in_flight);
            (Some(tx), Some(rx))
        }
        railhook_config::TransportKind::Kafka => (None, None),
    };
    tracing::info!(transport = config.transport().as_str(), "railhook all starting");
    let metrics = Metrics::new();
    let stages = stages(&metrics)?;
    let relay_metrics = relay_metrics(&metrics, &stages)?;
    let worker_metrics = worker_metrics(&metrics, &stages)?;
    let source_metrics = match config.kafka_source_enabled() {
        true => {
            let m = railhook_kafka_source::SourceMetrics::new();
            m.register(metrics.registry())?;
            Some(m)
        }
        false => None,
    };
    let listen = config.api.listen;
    let mut state = api_state(config, metrics).await?;
    if inline_rx.is_none() {
        state.ready_checks.push(("kafka_consumer", consumer_check(worker_metrics.clone())));
    }
    let config = state.config.clone();
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    let shutdown = CancellationToken::new();
    cancel_on_signal(shutdown.clone());
    let mut components: tokio::task::JoinSet<(&'static str, anyhow::Result<()>)> = tokio::task::JoinSet::new();
    let token = shutdown.clone();
    components.spawn(async move { ("api", railhook_api::run(state, listener, token).await.map_err(anyhow::Error::from)) });
    let (c, token) = (config.clone(), shutdown.clone());
    components.spawn(async move { ("worker", railhook_worker::run_with(c, worker_metrics, inline_rx, token).await.map_err(anyhow::Error::from)) });
    if let Some(source_metrics) = source_metrics {
        let (c, token) = (config.clone(), shutdown.clone());
        components.spawn(async move {
            let result = railhook_kafka_source::run(c, source_metrics, token).await;
            ("kafka_source", result.map_err(|e| anyhow::anyhow!("{}", railhook_kafka_source::error::chain(&e))))
        });
    }
    let token = shutdown.clone();
    components.spawn(async move { ("relay", railhook_relay::run_with(config, relay_metrics, inline_tx, token).await.map_err(anyhow::Error::from)) });

    let mut failure: Option<anyhow::Error> = None;
    while let Some(joined) = components.join_next().await {
        let asked = shutdown.is_cancelled();
        let (name, result) = match joined {
            Ok(stopped) => stopped,
            Err(e) => ("a component", Err(anyhow::Error::from(e).context("panicked"))),
        };
        match result {
            Err(e) => {
                tracing::error!(component = name, error = %format!("{e:#}"), "component failed; stopping the others");
                failure.get_or_insert(e.context(format!("{name} failed")));
            }
            Ok(()) if !asked => {
                tracing::error!(component = name, "component stopped on its own; stopping the others");
                failure.get_or_insert(anyhow::anyhow!("{name} stopped on its own"));
            }
            Ok(()) => {}
        }
        shutdown.cancel();
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(ExitCode::SUCCESS),
    }
}

pub async fn slot_status(config: &Config, json: bool, max_inactive: u64) -> anyhow::Result<ExitCode> {
    let client = connect(config).await?;
    let slot = &config.relay.slot_name;
    let started = std::time::Instant::now();
    let mut health = railhook_relay::health::slot_health(&client, slot).await?;
    while health.exists && !health.is_lost() && !health.active && started.elapsed().as_secs() < max_inactive {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        health = railhook_relay::health::slot_health(&client, slot).await?;
    }
    let (code, verdict) = if !health.exists {
        (3, format!("slot {slot} does not exist"))
    } else if health.is_lost() {
        (4, format!("slot {slot} is lost (wal_status 'lost'): its WAL was removed; the relay recreates it when relay.recreate_lost_slot = true"))
    } else if !health.active {
        (5, format!("slot {slot} has had no relay streaming from it for {max_inactive} s"))
    } else {
        (0, format!("slot {slot} is healthy"))
    };
    if json {
        let mut value = serde_json::to_value(&health)?;
        value["healthy"] = serde_json::Value::Bool(code == 0);
        value["verdict"] = serde_json::Value::String(verdict.clone());
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        let opt = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
        println!("slot                      {slot}");
        println!("exists                    {}", health.exists);
        println!("plugin                    {}", health.plugin.as_deref().unwrap_or("-"));
        println!("active                    {} (pid {})", health.active, health.active_pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()));
        println!("wal_status                {}", health.wal_status);
        println!("lag_bytes                 {}", opt(health.lag_bytes));
        println!("retained_bytes            {}", opt(health.retained_bytes));
        println!("safe_wal_size_bytes       {}", opt(health.safe_wal_size_bytes));
        println!("max_slot_wal_keep_size    {}", health.max_slot_wal_keep_size_bytes);
        println!(
            "last_feedback_age_s       {}",
            health.last_feedback_age_seconds.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into())
        );
        println!("confirmed_flush_lsn       {}", health.confirmed_flush_lsn.as_deref().unwrap_or("-"));
        println!("restart_lsn               {}", health.restart_lsn.as_deref().unwrap_or("-"));
        println!("current_wal_lsn           {}", health.current_wal_lsn);
    }
    eprintln!("{verdict}");
    Ok(ExitCode::from(code))
}

pub async fn slot_drop(config: &Config, confirm: bool) -> anyhow::Result<ExitCode> {
    let slot = &config.relay.slot_name;
    if !confirm {
        eprintln!("dropping slot {slot} releases its WAL and cannot be undone; run again with --confirm");
        return Ok(ExitCode::from(2));
    }
    let client = connect(config).await?;
    let health = railhook_relay::health::slot_health(&client, slot).await?;
    if !health.exists {
        eprintln!("slot {slot} does not exist; nothing dropped");
        return Ok(ExitCode::from(3));
    }
    if health.active {
        eprintln!("slot {slot} is in use by PID {}: stop the relay first", health.active_pid.unwrap_or_default());
        return Ok(ExitCode::from(4));
    }
    client.execute("SELECT pg_drop_replication_slot($1)", &[slot]).await.with_context(|| format!("dropping slot {slot}"))?;
    println!("dropped slot {slot}; publication {} is left in place (DROP PUBLICATION {} to remove it)", config.relay.publication_name, config.relay.publication_name);
    Ok(ExitCode::SUCCESS)
}
