//! The subcommands that start something. Each component starts as
//! `run(state, listener, shutdown)`; here they are wired to signals.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use railhook_config::Config;
use railhook_core::{OrganizationId, ProjectId};
use railhook_store::tenancy;
use railhook_store::Migrator;
use railhook_telemetry::Metrics;
use tokio_util::sync::CancellationToken;

async fn connect(config: &Config) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(&config.database.url, tokio_postgres::NoTls)
        .await
        .with_context(|| format!("connecting to {}", railhook_config::redact_url(&config.database.url)))?;
    tokio::spawn(connection);
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
