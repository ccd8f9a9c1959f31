//! The subcommands that start something. Each component starts as
//! `run(state, listener, shutdown)`; here they are wired to signals.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use railhook_config::Config;
use railhook_store::Migrator;
use railhook_telemetry::Metrics;
use tokio_util::sync::CancellationToken;

pub async fn migrate(config: &Config) -> anyhow::Result<ExitCode> {
    let (mut client, connection) = tokio_postgres::connect(&config.database.url, tokio_postgres::NoTls)
        .await
        .with_context(|| format!("connecting to {}", railhook_config::redact_url(&config.database.url)))?;
    tokio::spawn(connection);
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
    let pool = railhook_store::connect_pool(&config.database)
        .await
        .with_context(|| format!("connecting to {}", railhook_config::redact_url(&config.database.url)))?;
    Ok(railhook_api::AppState { config: Arc::new(config), pool, metrics })
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

pub async fn all(config: Config) -> anyhow::Result<ExitCode> {
    tracing::warn!("railhook all runs the API only: the relay and the worker are not built yet");
    api(config).await
}
