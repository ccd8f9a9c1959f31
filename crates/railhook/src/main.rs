//! The `railhook` binary: parses flags, loads configuration, and wires the components.
//! Nothing here is business logic; each component lives in its own crate.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use railhook_config::{Config, FileSource, Overrides};

mod commands;
mod doctor;
mod project_data;
mod replay_cmd;
mod verify_cmd;

/// Railhook: a self-hosted webhook gateway. Events POSTed to the API are written to Postgres
/// with a transactional outbox, streamed from the WAL to Kafka by the relay, and delivered,
/// signed and retried, by the worker.
#[derive(Debug, Parser)]
#[command(
    name = "railhook",
    version,
    propagate_version = true,
    after_help = "OpenTelemetry traces (api, relay, worker, all): off unless OTEL_EXPORTER_OTLP_ENDPOINT (or \
                  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) names an OTLP/HTTP collector; OTEL_SERVICE_NAME, \
                  OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG apply. See docs/TRACING.md."
)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Args)]
struct GlobalArgs {
    /// Configuration file (TOML). Default: ./railhook.toml if it exists.
    #[arg(long, global = true, env = "RAILHOOK_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,
    /// Postgres URL; overrides database.url.
    #[arg(long, global = true, value_name = "URL")]
    database_url: Option<String>,
    /// Kafka bootstrap servers; overrides kafka.brokers.
    #[arg(long, global = true, value_name = "HOST:PORT,...")]
    kafka_brokers: Option<String>,
    /// kafka, inline or auto; overrides transport (auto: kafka when kafka.brokers is set).
    #[arg(long, global = true, value_name = "TRANSPORT")]
    transport: Option<String>,
    /// Log format: human or json; overrides telemetry.log_format.
    #[arg(long, global = true, value_name = "FORMAT")]
    log_format: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP API (ingest, management, /metrics, /healthz, /readyz).
    Api {
        /// Listen address; overrides api.listen.
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
    },
    /// Run the relay: outbox inserts from the WAL (logical slot, pgoutput) to Kafka, with
    /// /metrics, /healthz and /readyz on relay.ops_listen. A second relay on the same slot
    /// waits as a standby and takes over when the active one dies.
    Relay {
        /// cdc (replication slot) or poll (the 1 s polling baseline); overrides relay.mode.
        #[arg(long, value_name = "MODE")]
        mode: Option<String>,
    },
    /// Run the delivery worker: Kafka consumer, Attempt Runner, retry scheduler and sweeps,
    /// with /metrics, /healthz and /readyz on worker.ops_listen. SIGTERM drains Attempts in
    /// flight for worker.shutdown_grace_ms. With kafka_source.topics set, also the Kafka
    /// source: each record of those topics ingested as an Event (docs/KAFKA_SOURCE.md).
    Worker,
    /// Run the API, the relay and the worker in one process; their metrics on the API's
    /// /metrics. With kafka_source.topics set, also the Kafka source.
    All {
        /// API listen address; overrides api.listen.
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
    },
    /// Apply the SQL migrations in migrations/ that the database has not seen, in order.
    Migrate,
    /// Inspect or decommission the relay's logical replication slot.
    Slot {
        #[command(subcommand)]
        command: SlotCommand,
    },
    /// Operator commands: create organizations, projects and API keys (prints JSON; secrets shown once).
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
    /// Replays (the Time Machine) through a running server's API: create (or --dry-run
    /// count), follow with a progress bar, status, cancel, list. Needs a project API key in
    /// RAILHOOK_API_KEY; --api-url (default http://<api.listen>).
    Replay(replay_cmd::ReplayArgs),
    /// Check a captured request's Standard Webhooks signature (webhook-id, webhook-timestamp,
    /// webhook-signature) with an Endpoint's secret(s): exit 0 valid, 1 not valid, 2 bad input.
    Verify(verify_cmd::VerifyArgs),
    /// Check what Railhook needs of Postgres (wal_level, replication slots and walsenders,
    /// max_slot_wal_keep_size, migrations, the publication, the slot, its lag and its relay),
    /// of Kafka (the topics and their partitions) and of this host's clock; one line per check
    /// with the fix for each problem. Exits 0 when all is well, 1 on a problem, 2 when Postgres
    /// or Kafka cannot be reached.
    Doctor(doctor::DoctorArgs),
    /// Inspect the configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Debug, Subcommand)]
enum SlotCommand {
    /// Print lag, retained WAL and state of the relay's slot. Exits 0 when healthy, 3 when
    /// the slot is missing, 4 when it is lost, 5 when no relay streamed from it for
    /// --max-inactive seconds.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// How long an inactive slot is watched (sampled each second) before it counts as
        /// unhealthy; 0 reports an inactive slot at once.
        #[arg(long, value_name = "SECONDS", default_value_t = 10)]
        max_inactive: u64,
    },
    /// Drop the slot (decommission: its WAL is released and the relay will create a new one,
    /// re-announcing what is still PENDING). Refuses while a relay streams from it.
    Drop {
        /// Required: dropping the slot is not undoable.
        #[arg(long)]
        confirm: bool,
    },
}

#[derive(Debug, Subcommand)]
enum AdminCommand {
    /// Create an organization.
    CreateOrg {
        #[arg(long)]
        name: String,
    },
    /// Create a project in an organization, with its first API key.
    CreateProject {
        #[arg(long)]
        org: String,
        #[arg(long)]
        name: String,
    },
    /// Create another API key for a project.
    CreateApiKey {
        #[arg(long)]
        project: String,
        #[arg(long, default_value = "")]
        name: String,
    },
    /// A project's data (GDPR): export it as JSON Lines, or erase it.
    Project {
        #[command(subcommand)]
        command: project_data::ProjectCommand,
    },
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Validate the configuration and print the effective values, secrets redacted.
    Check,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match try_main(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn try_main(cli: Cli) -> anyhow::Result<ExitCode> {
    // Needs no configuration: it runs where a request was captured, maybe without railhook.toml.
    if let Command::Verify(args) = &cli.command {
        return Ok(verify_cmd::run(args));
    }
    let mut overrides = Overrides::default();
    if let Some(url) = &cli.global.database_url {
        overrides.set("database.url", url);
    }
    if let Some(brokers) = &cli.global.kafka_brokers {
        overrides.set("kafka.brokers", brokers);
    }
    if let Some(transport) = &cli.global.transport {
        overrides.set("transport", transport);
    }
    if let Some(format) = &cli.global.log_format {
        overrides.set("telemetry.log_format", format);
    }
    match &cli.command {
        Command::Api { listen: Some(l) } | Command::All { listen: Some(l) } => overrides.set("api.listen", l),
        Command::Relay { mode: Some(m) } => overrides.set("relay.mode", m),
        _ => {}
    }
    let file = match &cli.global.config {
        Some(p) => FileSource::Explicit(p.clone()),
        None => FileSource::Default,
    };
    let config = Config::load(file, &overrides)?;
    // OpenTelemetry export only for the long-running components (docs/TRACING.md): the CLI
    // commands make no spans worth a trace.
    let serves = matches!(cli.command, Command::Api { .. } | Command::All { .. } | Command::Relay { .. } | Command::Worker);
    let export = if serves {
        railhook_telemetry::init_tracing_with_export(&config.telemetry)?
    } else {
        railhook_telemetry::init_tracing(&config.telemetry);
        None
    };

    if let Command::Config { command: ConfigCommand::Check } = &cli.command {
        print!("{}", config.redacted_toml());
        eprintln!("configuration is valid");
        return Ok(ExitCode::SUCCESS);
    }


    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let outcome = runtime.block_on(async move {
        match cli.command {
            Command::Migrate => commands::migrate(&config).await,
            Command::Api { .. } => commands::api(config).await,
            Command::All { .. } => commands::all(config).await,
            Command::Relay { .. } => commands::relay(config).await,
            Command::Worker => commands::worker(config).await,
            Command::Slot { command: SlotCommand::Status { json, max_inactive } } => commands::slot_status(&config, json, max_inactive).await,
            Command::Slot { command: SlotCommand::Drop { confirm } } => commands::slot_drop(&config, confirm).await,
            Command::Replay(args) => replay_cmd::run(&config, args).await,
            Command::Doctor(args) => doctor::run(&config, args).await,
            Command::Admin { command } => match command {
                AdminCommand::CreateOrg { name } => commands::admin_create_org(&config, &name).await,
                AdminCommand::CreateProject { org, name } => commands::admin_create_project(&config, &org, &name).await,
                AdminCommand::CreateApiKey { project, name } => commands::admin_create_api_key(&config, &project, &name).await,
                AdminCommand::Project { command } => project_data::run(&config, command).await,
            },
            _ => unreachable!("handled above"),
        }
    });
    // The spans still queued go out before the process exits (bounded by the exporter's timeout).
    if let Some(export) = export {
        export.shutdown();
    }
    outcome
}
