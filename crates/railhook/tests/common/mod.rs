//! What the process tests of this crate share: a `railhook` process started with a test
//! stack's settings.

use std::path::Path;
use std::process::Stdio;

/// Starts `railhook <subcommand>` (with `--config config_file` when given) for the stack in
/// `config`: its database, Kafka, topic prefix, slot, admin token and consumer group, the
/// retry scheduler every 100 ms, loopback receivers allowed, warnings only; then `env`, which
/// may override any of these. Killed when dropped.
pub fn spawn_railhook(config: &railhook_config::Config, subcommand: &str, config_file: Option<&Path>, env: &[(&str, String)]) -> tokio::process::Child {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_railhook"));
    command.arg(subcommand);
    if let Some(file) = config_file {
        command.arg("--config").arg(file);
    }
    command
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RAILHOOK_DATABASE_URL", &config.database.url)
        .env("RAILHOOK_KAFKA_BROKERS", &config.kafka.brokers)
        .env("RAILHOOK_KAFKA__TOPIC_PREFIX", &config.kafka.topic_prefix)
        .env("RAILHOOK_RELAY__SLOT_NAME", &config.relay.slot_name)
        .env("RAILHOOK_ADMIN_TOKEN", &config.api.admin_token)
        .env("RAILHOOK_WORKER__GROUP_ID", &config.worker.group_id)
        .env("RAILHOOK_WORKER__SCHEDULER_INTERVAL_MS", "100")
        .env("RAILHOOK_NETWORK__ALLOW_CIDRS", r#"["127.0.0.0/8"]"#)
        .env("RAILHOOK_TELEMETRY__LOG_FILTER", "warn")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .current_dir(std::env::temp_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn railhook")
}
