//! Railhook's configuration: one [`Config`] tree, loaded in layers and validated before any
//! component starts.
//!
//! Layers, later ones win:
//! 1. the defaults in this file ([`Config::default`]);
//! 2. `railhook.toml` (or the file named by `--config` / `RAILHOOK_CONFIG`);
//! 3. `RAILHOOK_*` environment variables: `RAILHOOK_DATABASE__URL` sets `database.url`
//!    (a double underscore separates sections), plus the short aliases listed in
//!    [`ENV_ALIASES`] such as `RAILHOOK_ADMIN_TOKEN`;
//! 4. command-line flags, passed in as [`Overrides`].
//!
//! Validation collects every problem at once and says how to fix each one.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::providers::{Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

/// Environment variables that are shorter than their `SECTION__KEY` spelling, because
/// operators expect them: `(variable, dotted key)`.
pub const ENV_ALIASES: &[(&str, &str)] = &[
    ("RAILHOOK_ADMIN_TOKEN", "api.admin_token"),
    ("RAILHOOK_DATABASE_URL", "database.url"),
    ("RAILHOOK_KAFKA_BROKERS", "kafka.brokers"),
];

/// What is shown instead of a secret.
pub const REDACTED: &str = "<redacted>";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub database: DatabaseConfig,
    pub kafka: KafkaConfig,
    pub api: ApiConfig,
    pub ingress: IngressConfig,
    pub relay: RelayConfig,
    pub worker: WorkerConfig,
    pub network: NetworkConfig,
    pub telemetry: TelemetryConfig,
    pub replay: ReplayConfig,
    pub retention: RetentionConfig,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// libpq-style URL of the Postgres database that holds Railhook's tables.
    pub url: String,
    /// Upper bound of the connection pool of each component.
    pub max_connections: usize,
    /// How long a component waits for a pooled connection before failing a request.
    pub acquire_timeout_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// `bootstrap.servers` for every producer, consumer and admin client.
    pub brokers: String,
    /// Prepended to every topic name; tests use it to isolate themselves.
    pub topic_prefix: String,
    /// Topic of outgoing Delivery announcements, keyed by endpoint id.
    pub deliveries_topic: String,
    /// Topic of incoming Forward announcements, keyed by destination id.
    pub forwards_topic: String,
    /// Partition count used when Railhook creates a missing topic.
    pub partitions: i32,
    /// Replication factor used when Railhook creates a missing topic.
    pub replication_factor: i32,
    /// Any librdkafka property (`security.protocol`, `sasl.*`, `ssl.*`, `linger.ms`, ...),
    /// applied to every client after Railhook's own settings.
    pub properties: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// Address the HTTP API listens on.
    pub listen: SocketAddr,
    /// Operator token for `/v1/admin/*`. Empty disables the admin routes.
    pub admin_token: String,
    /// Largest accepted request body, in bytes.
    pub max_body_bytes: usize,
    /// How long a client may take to send a request's line and headers (from the moment the
    /// server starts reading them, also between requests on a kept-alive connection); then
    /// the connection is closed. Cuts off slowloris clients and idle connections.
    pub header_read_timeout_ms: u64,
    /// How long a client may take to send a request body, from the end of its headers;
    /// then the request gets 408 and the connection is closed.
    pub body_read_timeout_ms: u64,
    /// Connections served at once; further ones wait in the listen backlog until one closes.
    pub max_connections: usize,
    /// After an early refusal that leaves a request's body unread (413 by `Content-Length`,
    /// 401, 415), how long the server keeps reading and throwing away the rest of the body
    /// before it closes (a lingering close, as nginx's): closing at once would reset a client
    /// still sending, and it would never see the response. 0 disables lingering.
    pub linger_timeout_ms: u64,
    /// How many bytes of such a body the lingering close throws away at most; then it closes.
    /// 0 disables lingering.
    pub linger_max_bytes: u64,
    /// Grace period during which a rotated-out endpoint secret still signs deliveries.
    pub secret_rotation_grace_seconds: u64,
    /// Ingest pacing (backpressure): while the workers report that a new Delivery would wait
    /// longer than `ingest_hold_above_ms` for work that is theirs to do (claims slowed by
    /// their own load, not by a slow Endpoint or a limit), `POST /v1/events` waits before
    /// its statement, until the wait falls back or `ingest_max_hold_ms` passed; then it runs
    /// anyway. Nothing is refused and nothing accepted is touched.
    pub ingest_pacing: bool,
    /// The workers' predicted delivery wait above which a POST is held.
    pub ingest_hold_above_ms: u64,
    /// The longest a POST is held; then it is accepted whatever the wait.
    pub ingest_max_hold_ms: u64,
    /// A predicted wait above this is a backlog no hold can help (the catch-up after an
    /// outage): POSTs are then not held, so ingest absorbs at full speed as without pacing.
    pub ingest_hold_ignore_above_ms: u64,
}

/// The incoming direction's ingress, `POST /ingress/{token}` (served by the API).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IngressConfig {
    /// Largest accepted provider request body, in bytes; a larger one gets 413 and is not
    /// stored. Providers send small bodies (Stripe and GitHub stay well under 512 KiB).
    pub max_body_bytes: usize,
    /// How long a Source's rotated-out secret still verifies requests, so that what the
    /// provider signed before the switch is not refused.
    pub secret_overlap_seconds: u64,
    /// The ingress's public base URL as providers call it (e.g. `https://hooks.example.com`,
    /// with a path prefix if a proxy adds one): Twilio, Square and HubSpot sign the URL, and
    /// the Sources API shows `ingress_url` under it. Empty: `http://` + the request's `Host`,
    /// and Sources show only the path.
    pub public_url: String,
}

impl Default for IngressConfig {
    fn default() -> Self {
        IngressConfig { max_body_bytes: 512 * 1024, secret_overlap_seconds: 24 * 3600, public_url: String::new() }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RelayMode {
    /// Stream the outbox from the WAL through a logical replication slot.
    Cdc,
    /// Poll the outbox table every second (the baseline the CDC relay replaces).
    Poll,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RelayConfig {
    pub mode: RelayMode,
    /// Logical replication slot the CDC relay reads.
    pub slot_name: String,
    /// Publication (publish = 'insert') on the outbox table.
    pub publication_name: String,
    /// Create the publication and slot when they are missing.
    pub create_slot: bool,
    /// Recreate a lost or dropped slot and re-announce what is still PENDING.
    pub recreate_lost_slot: bool,
    /// Interval of Standby Status Updates; keep it well inside `wal_sender_timeout`.
    pub status_interval_ms: u64,
    /// Relayed outbox rows older than this are deleted (3 days, the poller-based original's
    /// default for published rows; CDC mode never reads a row again once it is in the WAL,
    /// so an hour is enough where disk matters).
    pub outbox_retention_seconds: u64,
    /// How often the relay deletes expired outbox rows (in batches of 5000).
    pub outbox_cleanup_interval_ms: u64,
    /// Address of the relay's own /metrics, /healthz and /readyz when run alone.
    pub ops_listen: SocketAddr,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// Kafka consumer group of the delivery workers.
    pub group_id: String,
    /// Attempts in flight at once in one worker process.
    pub max_in_flight: usize,
    /// Address of the worker's own /metrics, /healthz and /readyz when run alone.
    pub ops_listen: SocketAddr,
    /// How often the retry scheduler looks for due Deliveries (it loops at once while
    /// batches come back full).
    pub scheduler_interval_ms: u64,
    /// A Delivery PROCESSING for longer than this goes back to PENDING (its worker stalled).
    pub processing_timeout_seconds: u64,
    /// A PENDING Delivery not announced for this long is announced again (lost announcement).
    pub stranded_after_seconds: u64,
    /// A retry the scheduler announced but nobody claimed within this long is announced again.
    pub retry_reannounce_after_seconds: u64,
    /// Outgoing Deliveries go to Failed Messages this long after their ladder started (96 h).
    pub outgoing_max_age_seconds: u64,
    /// Incoming Forwards go to Failed Messages this long after their ladder started (24 h).
    pub incoming_max_age_seconds: u64,
    /// The incoming Retry Ladder in seconds, replacing the one stored in each Forward at its
    /// first claim: these waits, and one Attempt more than waits. Empty (the default): each
    /// Forward keeps the ladder it was created with (60, 300, 900, 3600; 5 Attempts).
    pub incoming_retry_delays_seconds: Vec<i32>,
    /// Longest wait a `Retry-After` header may impose.
    pub retry_after_max_seconds: u64,
    /// On SIGTERM, how long Attempts in flight may take to finish before their Claims are
    /// released unfinished.
    pub shutdown_grace_ms: u64,
    /// Requests in flight at once per endpoint, across all worker processes (0: no limit): a
    /// Claim counts from the claim to the end of its request, not while its finalise is
    /// written.
    pub endpoint_concurrency: i32,
    /// Requests in flight at once per project, across all worker processes (0: no limit),
    /// counted the same way.
    pub project_concurrency: i32,
    /// Whether a claim waits for its WAL flush before it answers (Postgres'
    /// `synchronous_commit` as configured). `false` (the default): the claim's transaction
    /// alone commits with `synchronous_commit = off`, so a hot Endpoint's claims, serialised
    /// by its lock until commit, do not queue behind WAL flushes. A Postgres crash may then
    /// forget the last claims (at most about three `wal_writer_delay`s of them): those
    /// Deliveries are PENDING again and sent once more (duplicate window 8), announced by
    /// the workers as soon as they see the server's new start time (within one sweep
    /// interval), not by the stranded sweep. Every write that records an outcome (ingest,
    /// finalise and its Attempt, the scheduler's hand-offs) waits for the flush either way.
    pub claim_synchronous_commit: bool,
    /// Hints waiting in one Endpoint's queue inside a worker for a free slot; past it a hint
    /// over the limit is a Deferral through the retry path.
    pub endpoint_queue_max: usize,
    /// Hints waiting in all the Endpoint queues of a worker.
    pub queue_max: usize,
    /// How long an Endpoint's claims may find its slots or rate window taken elsewhere
    /// (another worker, the project's limit) before its waiting hints become Deferrals.
    pub queue_busy_max_ms: u64,
    /// Ordered Subscriptions: how long a Delivery parked behind an unresolved predecessor
    /// waits (from its first park) before it goes without it.
    pub ordering_gap_timeout_seconds: u64,
    /// Claims per second per project (0: no limit); per endpoint, the endpoint's
    /// `rate_limit_per_second` applies.
    pub project_rate_limit_per_second: i32,
    /// The circuit of an endpoint opens at this failure ratio within a window...
    pub circuit_failure_ratio: f64,
    /// ...once the window holds at least this many outcomes (0 disables the breaker).
    pub circuit_min_requests: i32,
    /// Length of the breaker's window.
    pub circuit_window_seconds: u64,
    /// How long an open circuit defers everything before one probe Attempt is let through.
    pub circuit_cooldown_seconds: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    /// CIDRs that endpoint URLs may reach although they are private, loopback or link-local
    /// (e.g. `127.0.0.0/8` for local development). Empty by default.
    pub allow_cidrs: Vec<String>,
}

/// Replays (the Time Machine): they run below live traffic, a small batch at a time with a
/// pause between batches, one batch at a time across all worker processes. With the
/// defaults a Replay reads at most about 100 Events per 250 ms (~400 Events/s, fewer while
/// the batches themselves take time), and makes one Delivery per Event and chosen Endpoint.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ReplayConfig {
    /// Events one batch reads (and replays), in one transaction.
    pub batch_size: i64,
    /// Least rest after each batch (the pace below usually rests longer).
    pub pause_ms: u64,
    /// Deliveries all Replays together may make per second, across every worker process
    /// (the shared pace, migration 0019): the Replay's share of the delivery capacity, so
    /// live traffic keeps the rest. A batch reads at most a tenth of a second's worth of
    /// Events (and at most `batch_size`), so the pace is smooth, not bursts.
    pub max_deliveries_per_second: f64,
    /// Longest time range one Replay may cover (`to - from`); longer is a 422 naming `to`.
    pub max_range_days: i64,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        ReplayConfig { batch_size: 100, pause_ms: 10, max_deliveries_per_second: 100.0, max_range_days: 30 }
    }
}

/// The worker's retention job (issue 17; docs/CONFIGURATION.md "Retention"). Periods are
/// days, fractional allowed, so a soak can keep minutes (0.0035 days is about 5 minutes).
/// Per-Project overrides of `events_days` and `failed_days` are columns of `projects`
/// (migration 0018), set with `PATCH /v1/admin/projects/{id}`. Published outbox rows are trimmed by the relay
/// (`relay.outbox_retention_seconds`), not here.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Run the job at all (one run at a time across every worker, under an advisory lock).
    pub enabled: bool,
    /// Pause between the end of one run and the start of the next.
    pub interval_seconds: f64,
    /// Events (and Incoming Events) whose every Delivery (Forward) is final are deleted with
    /// them this long after creation.
    pub events_days: f64,
    /// A FAILED Delivery or Forward (a Failed Message) keeps itself and its Event this long
    /// after it failed, so a person can still retry it.
    pub failed_days: f64,
    /// Attempts older than this go with their daily partition.
    pub attempts_days: f64,
    /// Most rows one batch examines (its statement deletes at most these and their children).
    pub batch_rows: i64,
    /// A batch's target duration: the batch size adapts so each takes about this long.
    pub batch_target_ms: u64,
    /// Least rest between two batches.
    pub pause_ms: u64,
    /// The most of the time the job may spend in its statements: after a batch that took
    /// `t` it rests at least `t * (100 / max_busy_percent - 1)`, so live traffic keeps the
    /// rest of the database (10: a 10 ms batch, then 90 ms of rest).
    pub max_busy_percent: u64,
    /// The most rows (Events, Deliveries, Attempts, Incoming Events, Forwards together) the
    /// job deletes per second on average (0: no cap): after a batch that deleted `n` rows it
    /// rests until `n / max_rows_per_second` has passed since the batch began. Every deleted
    /// row is WAL the relay's walsender decodes before the live outbox rows committed after
    /// it; this bounds that work (3000: about 1,000 Events a second with one Delivery and one
    /// Attempt each, 86 million a day).
    pub max_rows_per_second: u64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            enabled: true,
            interval_seconds: 60.0,
            events_days: 30.0,
            failed_days: 90.0,
            attempts_days: 30.0,
            batch_rows: 1_000,
            batch_target_ms: 10,
            pause_ms: 10,
            max_busy_percent: 10,
            max_rows_per_second: 3_000,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    pub log_format: LogFormat,
    /// A `tracing` filter such as `info` or `railhook_relay=debug,info`.
    pub log_filter: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            database: DatabaseConfig::default(),
            kafka: KafkaConfig::default(),
            api: ApiConfig::default(),
            ingress: IngressConfig::default(),
            relay: RelayConfig::default(),
            worker: WorkerConfig::default(),
            network: NetworkConfig::default(),
            telemetry: TelemetryConfig::default(),
            replay: ReplayConfig::default(),
            retention: RetentionConfig::default(),
        }
    }
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        DatabaseConfig {
            url: "postgres://railhook@127.0.0.1:54329/railhook".into(),
            max_connections: 16,
            acquire_timeout_ms: 5_000,
        }
    }
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: "127.0.0.1:19092".into(),
            topic_prefix: String::new(),
            deliveries_topic: "railhook.deliveries".into(),
            forwards_topic: "railhook.forwards".into(),
            partitions: 6,
            replication_factor: 1,
            properties: BTreeMap::new(),
        }
    }
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_token: String::new(),
            max_body_bytes: 1024 * 1024,
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 30_000,
            max_connections: 1024,
            // nginx lingers 5 s after the last byte (lingering_timeout) and 30 s in all
            // (lingering_time); 5 s in all covers a few MiB over a slow link. 4 MiB lets a
            // client that sends up to about 4 times max_body_bytes read its 413.
            linger_timeout_ms: 5_000,
            linger_max_bytes: 4 * 1024 * 1024,
            secret_rotation_grace_seconds: 24 * 3600,
            ingest_pacing: true,
            ingest_hold_above_ms: 250,
            ingest_max_hold_ms: 1_000,
            ingest_hold_ignore_above_ms: 30_000,
        }
    }
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            mode: RelayMode::Cdc,
            slot_name: "railhook_outbox".into(),
            publication_name: "railhook_outbox".into(),
            create_slot: true,
            recreate_lost_slot: true,
            status_interval_ms: 1_000,
            outbox_retention_seconds: 3 * 86_400,
            outbox_cleanup_interval_ms: 10_000,
            ops_listen: SocketAddr::from(([127, 0, 0, 1], 9091)),
        }
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            group_id: "railhook-worker".into(),
            max_in_flight: 256,
            ops_listen: SocketAddr::from(([127, 0, 0, 1], 9092)),
            scheduler_interval_ms: 250,
            processing_timeout_seconds: 300,
            stranded_after_seconds: 3_600,
            retry_reannounce_after_seconds: 30,
            outgoing_max_age_seconds: 96 * 3_600,
            incoming_max_age_seconds: 24 * 3_600,
            incoming_retry_delays_seconds: Vec::new(),
            retry_after_max_seconds: 6 * 3_600,
            shutdown_grace_ms: 25_000,
            endpoint_concurrency: 10,
            project_concurrency: 100,
            claim_synchronous_commit: false,
            endpoint_queue_max: 10_000,
            queue_max: 100_000,
            queue_busy_max_ms: 5_000,
            ordering_gap_timeout_seconds: 60,
            project_rate_limit_per_second: 0,
            circuit_failure_ratio: 0.5,
            circuit_min_requests: 20,
            circuit_window_seconds: 60,
            circuit_cooldown_seconds: 30,
        }
    }
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig { allow_cidrs: Vec::new() }
    }
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig { log_format: LogFormat::Human, log_filter: "info".into() }
    }
}

/// Values from command-line flags: the last layer. Keys are dotted paths
/// (`api.listen`), values are TOML literals or bare strings.
#[derive(Debug, Default, Clone)]
pub struct Overrides(pub Vec<(String, String)>);

impl Overrides {
    pub fn set(&mut self, key: &str, value: impl Into<String>) {
        self.0.push((key.to_string(), value.into()));
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration file {path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("invalid configuration: {0}")]
    Parse(String),
    #[error("invalid configuration:\n{}", .0.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<String>),
}

/// Where to look for the file layer.
#[derive(Debug, Clone)]
pub enum FileSource {
    /// `railhook.toml` in the working directory, if it exists.
    Default,
    /// A file the user named: it must exist.
    Explicit(PathBuf),
}

impl Config {
    /// Loads all four layers from the process environment and validates the result.
    pub fn load(file: FileSource, overrides: &Overrides) -> Result<Config, ConfigError> {
        let env: Vec<(String, String)> = std::env::vars().collect();
        Self::load_from(file, &env, overrides)
    }

    /// As [`Config::load`], with the environment given explicitly (for tests).
    pub fn load_from(
        file: FileSource,
        env: &[(String, String)],
        overrides: &Overrides,
    ) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        match file {
            FileSource::Default => {
                let path = Path::new("railhook.toml");
                if path.exists() {
                    figment = figment.merge(Toml::file(path));
                }
            }
            FileSource::Explicit(path) => {
                if !path.exists() {
                    return Err(ConfigError::File {
                        path,
                        message: "no such file; pass an existing path to --config".into(),
                    });
                }
                figment = figment.merge(Toml::file(path));
            }
        }

        // RAILHOOK_SECTION__KEY, read from the given environment rather than the process's.
        let env_map: BTreeMap<String, String> = env.iter().cloned().collect();
        let mut nested = toml::Table::new();
        for (name, value) in &env_map {
            let Some(rest) = name.strip_prefix("RAILHOOK_") else { continue };
            if let Some((_, key)) = ENV_ALIASES.iter().find(|(alias, _)| alias == name) {
                insert_dotted(&mut nested, key, value);
            } else if rest.contains("__") {
                let key = rest.to_ascii_lowercase().replace("__", ".");
                insert_dotted(&mut nested, &key, value);
            }
        }
        figment = figment.merge(Serialized::defaults(nested));

        let mut flags = toml::Table::new();
        for (key, value) in &overrides.0 {
            insert_dotted(&mut flags, key, value);
        }
        figment = figment.merge(Serialized::defaults(flags));

        let config: Config = figment.extract().map_err(|e| ConfigError::Parse(describe_figment_error(e)))?;
        config.validate()?;
        Ok(config)
    }

    /// Every problem at once, each with its fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        if !(self.database.url.starts_with("postgres://") || self.database.url.starts_with("postgresql://")) {
            problems.push("database.url must be a postgres:// URL, e.g. postgres://railhook@127.0.0.1:54329/railhook (set RAILHOOK_DATABASE__URL)".to_string());
        }
        if self.database.max_connections == 0 {
            problems.push("database.max_connections must be at least 1".into());
        }
        if self.kafka.brokers.trim().is_empty() {
            problems.push("kafka.brokers is empty: set it to host:port[,host:port], e.g. RAILHOOK_KAFKA__BROKERS=127.0.0.1:19092".into());
        }
        if self.kafka.partitions < 1 {
            problems.push(format!("kafka.partitions is {}: it must be at least 1", self.kafka.partitions));
        }
        if self.kafka.replication_factor < 1 {
            problems.push("kafka.replication_factor must be at least 1".into());
        }
        for topic in [&self.kafka.deliveries_topic, &self.kafka.forwards_topic] {
            if !valid_topic(&format!("{}{}", self.kafka.topic_prefix, topic)) {
                problems.push(format!("kafka topic '{}{}' is not a valid Kafka topic name (letters, digits, '.', '_', '-', at most 249 characters)", self.kafka.topic_prefix, topic));
            }
        }
        for key in self.kafka.properties.keys() {
            if ["enable.idempotence", "acks", "bootstrap.servers"].contains(&key.as_str()) {
                problems.push(format!("kafka.properties.{key} is set by Railhook itself and may not be overridden (remove it)"));
            }
        }
        if self.api.max_body_bytes < 1024 {
            problems.push("api.max_body_bytes must be at least 1024".into());
        }
        if !(100..=600_000).contains(&self.api.header_read_timeout_ms) {
            problems.push(format!("api.header_read_timeout_ms is {}: it must be between 100 and 600000 (10000 is the default)", self.api.header_read_timeout_ms));
        }
        if !(100..=3_600_000).contains(&self.api.body_read_timeout_ms) {
            problems.push(format!("api.body_read_timeout_ms is {}: it must be between 100 and 3600000 (30000 is the default)", self.api.body_read_timeout_ms));
        }
        if self.api.max_connections == 0 {
            problems.push("api.max_connections must be at least 1 (1024 is the default)".into());
        }
        if self.api.linger_timeout_ms > 600_000 {
            problems.push(format!("api.linger_timeout_ms is {}: it must be between 0 (no lingering) and 600000 (5000 is the default)", self.api.linger_timeout_ms));
        }
        if self.api.ingest_pacing && self.api.ingest_hold_above_ms >= self.api.ingest_hold_ignore_above_ms {
            problems.push(format!(
                "api.ingest_hold_above_ms ({}) must be below api.ingest_hold_ignore_above_ms ({}), or set api.ingest_pacing = false",
                self.api.ingest_hold_above_ms, self.api.ingest_hold_ignore_above_ms
            ));
        }
        if self.api.ingest_max_hold_ms > 60_000 {
            problems.push(format!("api.ingest_max_hold_ms is {}: it must be at most 60000 (1000 is the default)", self.api.ingest_max_hold_ms));
        }
        if self.api.linger_max_bytes > 1 << 40 {
            problems.push(format!("api.linger_max_bytes is {}: it must be between 0 (no lingering) and 1099511627776 (4194304 is the default)", self.api.linger_max_bytes));
        }
        if !self.api.admin_token.is_empty() && self.api.admin_token.len() < 16 {
            problems.push("api.admin_token is shorter than 16 characters: use a long random value (e.g. `openssl rand -hex 24`)".into());
        }
        problems.extend(self.ingress.problems());
        for name in [&self.relay.slot_name, &self.relay.publication_name] {
            if !valid_identifier(name) {
                problems.push(format!("relay slot/publication name '{name}' must be lower-case letters, digits and '_' (at most 63), starting with a letter"));
            }
        }
        if self.relay.status_interval_ms == 0 || self.relay.status_interval_ms > 30_000 {
            problems.push("relay.status_interval_ms must be between 1 and 30000 (well inside wal_sender_timeout, 60 s by default)".into());
        }
        if self.relay.outbox_cleanup_interval_ms == 0 {
            problems.push("relay.outbox_cleanup_interval_ms must be at least 1".into());
        }
        if self.worker.max_in_flight == 0 {
            problems.push("worker.max_in_flight must be at least 1".into());
        }
        if self.worker.scheduler_interval_ms == 0 || self.worker.scheduler_interval_ms > 1_000 {
            problems.push("worker.scheduler_interval_ms must be between 1 and 1000 (retries fire within about a second of their due time)".into());
        }
        if !(self.worker.circuit_failure_ratio > 0.0 && self.worker.circuit_failure_ratio <= 1.0) {
            problems.push("worker.circuit_failure_ratio must be above 0 and at most 1".into());
        }
        let delays = &self.worker.incoming_retry_delays_seconds;
        if delays.len() > 50 || delays.iter().any(|d| !(1..=86_400).contains(d)) {
            problems.push("worker.incoming_retry_delays_seconds must list at most 50 waits, each from 1 to 86400 seconds (or be empty: the default ladder)".into());
        }
        if self.worker.processing_timeout_seconds == 0 {
            problems.push("worker.processing_timeout_seconds must be at least 1".into());
        }
        if !(1..=10_000).contains(&self.replay.batch_size) {
            problems.push("replay.batch_size must be from 1 to 10000 (Events per batch, one transaction each)".into());
        }
        if !(self.replay.max_deliveries_per_second.is_finite() && (1.0..=100_000.0).contains(&self.replay.max_deliveries_per_second)) {
            problems.push("replay.max_deliveries_per_second must be from 1 to 100000 (100 is the default)".into());
        }
        if !(1..=3_650).contains(&self.replay.max_range_days) {
            problems.push("replay.max_range_days must be from 1 to 3650".into());
        }
        let r = &self.retention;
        for (key, days) in [("events_days", r.events_days), ("failed_days", r.failed_days), ("attempts_days", r.attempts_days)] {
            if !(days.is_finite() && days > 0.0 && days <= 36_500.0) {
                problems.push(format!("retention.{key} is {days}: it must be above 0 and at most 36500 (days; fractions allowed, 0.0035 is about 5 minutes)"));
            }
        }
        if !(r.interval_seconds.is_finite() && (0.1..=86_400.0).contains(&r.interval_seconds)) {
            problems.push("retention.interval_seconds must be from 0.1 to 86400 (60 is the default)".into());
        }
        if !(10..=100_000).contains(&r.batch_rows) {
            problems.push("retention.batch_rows must be from 10 to 100000 (1000 is the default)".into());
        }
        if !(1..=100).contains(&r.max_busy_percent) {
            problems.push("retention.max_busy_percent must be from 1 to 100 (10 is the default)".into());
        }
        if r.max_rows_per_second > 10_000_000 {
            problems.push("retention.max_rows_per_second must be at most 10000000 (3000 is the default; 0: no cap)".into());
        }
        if !(1..=1_000).contains(&r.batch_target_ms) {
            problems.push("retention.batch_target_ms must be from 1 to 1000 (10 is the default; batches are meant to stay under 100 ms)".into());
        }
        for cidr in &self.network.allow_cidrs {
            if !valid_cidr(cidr) {
                problems.push(format!("network.allow_cidrs entry '{cidr}' is not a CIDR such as 127.0.0.0/8 or ::1/128"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }

    /// The effective configuration as TOML, with every secret replaced by [`REDACTED`].
    pub fn redacted_toml(&self) -> String {
        let mut copy = self.clone();
        copy.database.url = redact_url(&copy.database.url);
        if !copy.api.admin_token.is_empty() {
            copy.api.admin_token = REDACTED.into();
        }
        for (key, value) in copy.kafka.properties.iter_mut() {
            if is_secret_property(key) {
                *value = REDACTED.into();
            }
        }
        toml::to_string_pretty(&copy).unwrap_or_else(|e| format!("# cannot render configuration: {e}\n"))
    }

    /// Full topic name of the deliveries topic, prefix included.
    pub fn deliveries_topic(&self) -> String {
        format!("{}{}", self.kafka.topic_prefix, self.kafka.deliveries_topic)
    }

    /// Full topic name of the forwards topic, prefix included.
    pub fn forwards_topic(&self) -> String {
        format!("{}{}", self.kafka.topic_prefix, self.kafka.forwards_topic)
    }
}

impl IngressConfig {
    /// What [`Config::validate`] reports about the `ingress.*` keys.
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !(1024..=64 * 1024 * 1024).contains(&self.max_body_bytes) {
            problems.push(format!("ingress.max_body_bytes is {}: it must be between 1024 and 67108864 (524288 is the default)", self.max_body_bytes));
        }
        if self.secret_overlap_seconds > 30 * 24 * 3600 {
            problems.push(format!("ingress.secret_overlap_seconds is {}: it must be at most 2592000 (30 days; 86400 is the default)", self.secret_overlap_seconds));
        }
        let url = self.public_url.trim_end_matches('/');
        let valid_url = url.is_empty()
            || ((url.starts_with("http://") || url.starts_with("https://")) && !url.contains(['?', '#', ' ']) && url.split("://").nth(1).is_some_and(|rest| !rest.is_empty()));
        if !valid_url {
            problems.push(format!("ingress.public_url '{}' must be an http(s) URL without query, e.g. https://hooks.example.com (or empty)", self.public_url));
        }
        problems
    }
}

fn insert_dotted(table: &mut toml::Table, key: &str, raw: &str) {
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().unwrap_or_default();
    let mut current = table;
    for part in parts {
        let entry = current
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        let toml::Value::Table(next) = entry else { return };
        current = next;
    }
    current.insert(last.to_string(), parse_scalar(raw));
}

/// Environment and flag values are strings; numbers, booleans and arrays are read as TOML
/// when they parse as such, so `RAILHOOK_KAFKA__PARTITIONS=12` is an integer.
fn parse_scalar(raw: &str) -> toml::Value {
    let probe = format!("v = {raw}");
    match probe.parse::<toml::Table>() {
        Ok(mut t) => match t.remove("v") {
            Some(v @ (toml::Value::Integer(_) | toml::Value::Boolean(_) | toml::Value::Array(_) | toml::Value::Float(_))) => v,
            _ => toml::Value::String(raw.to_string()),
        },
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

fn describe_figment_error(e: figment::Error) -> String {
    e.into_iter()
        .map(|err| {
            let path = err.path.join(".");
            if path.is_empty() {
                err.to_string()
            } else {
                format!("{path}: {err}")
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn valid_topic(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 249
        && name != "."
        && name != ".."
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn valid_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && name.len() <= 63
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn valid_cidr(cidr: &str) -> bool {
    let Some((addr, len)) = cidr.split_once('/') else { return false };
    let Ok(len) = len.parse::<u8>() else { return false };
    match addr.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => len <= 32,
        Ok(std::net::IpAddr::V6(_)) => len <= 128,
        Err(_) => false,
    }
}

fn is_secret_property(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key.contains("password") || key.contains("secret") || key.ends_with(".key.pem") || key.contains("sasl.oauthbearer.config")
}

/// Replaces the password of a URL (`postgres://user:pw@host/db`) with [`REDACTED`].
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let Some((userinfo, host)) = authority.rsplit_once('@') else { return url.to_string() };
    let redacted = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:{REDACTED}"),
        None => userinfo.to_string(),
    };
    let tail = redact_query_password(tail);
    format!("{scheme}://{redacted}@{host}{tail}")
}

fn redact_query_password(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else { return tail.to_string() };
    let query = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}={REDACTED}"),
            _ => kv.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&");
    format!("{path}?{query}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn layers_apply_in_order() {
        let dir = std::env::temp_dir().join(format!("railhook-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("railhook.toml");
        std::fs::write(&file, "[kafka]\npartitions = 3\nbrokers = \"file:1\"\n[api]\nlisten = \"127.0.0.1:7000\"\n").unwrap();
        let mut flags = Overrides::default();
        flags.set("api.listen", "127.0.0.1:7001");
        let config = Config::load_from(
            FileSource::Explicit(file),
            &env(&[("RAILHOOK_KAFKA__PARTITIONS", "12"), ("RAILHOOK_ADMIN_TOKEN", "0123456789abcdef0123")]),
            &flags,
        )
        .unwrap();
        assert_eq!(config.kafka.partitions, 12, "env beats file");
        assert_eq!(config.kafka.brokers, "file:1", "file beats defaults");
        assert_eq!(config.api.listen.port(), 7001, "flags beat file");
        assert_eq!(config.api.admin_token, "0123456789abcdef0123", "alias applies");
        assert_eq!(config.relay.slot_name, "railhook_outbox", "defaults remain");
    }

    #[test]
    fn invalid_values_say_how_to_fix() {
        let err = Config::load_from(
            FileSource::Default,
            &env(&[("RAILHOOK_KAFKA__PARTITIONS", "0"), ("RAILHOOK_DATABASE__URL", "mysql://x")]),
            &Overrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("kafka.partitions is 0"), "{err}");
        assert!(err.contains("RAILHOOK_DATABASE__URL"), "{err}");
    }

    #[test]
    fn server_limits_are_validated() {
        let err = Config::load_from(
            FileSource::Default,
            &env(&[("RAILHOOK_API__HEADER_READ_TIMEOUT_MS", "0"), ("RAILHOOK_API__BODY_READ_TIMEOUT_MS", "99"), ("RAILHOOK_API__MAX_CONNECTIONS", "0")]),
            &Overrides::default(),
        )
        .unwrap_err()
        .to_string();
        for key in ["api.header_read_timeout_ms is 0", "api.body_read_timeout_ms is 99", "api.max_connections must be at least 1"] {
            assert!(err.contains(key), "{key}: {err}");
        }
        let ok = Config::load_from(FileSource::Default, &env(&[("RAILHOOK_API__MAX_CONNECTIONS", "8")]), &Overrides::default()).unwrap();
        assert_eq!((ok.api.max_connections, ok.api.header_read_timeout_ms, ok.api.body_read_timeout_ms), (8, 10_000, 30_000));
        assert_eq!((ok.api.linger_timeout_ms, ok.api.linger_max_bytes), (5_000, 4 << 20));
    }

    #[test]
    fn lingering_bounds_are_validated() {
        let err = Config::load_from(
            FileSource::Default,
            &env(&[("RAILHOOK_API__LINGER_TIMEOUT_MS", "600001"), ("RAILHOOK_API__LINGER_MAX_BYTES", "1099511627777")]),
            &Overrides::default(),
        )
        .unwrap_err()
        .to_string();
        for key in ["api.linger_timeout_ms is 600001", "api.linger_max_bytes is 1099511627777"] {
            assert!(err.contains(key), "{key}: {err}");
        }
        let off = Config::load_from(
            FileSource::Default,
            &env(&[("RAILHOOK_API__LINGER_TIMEOUT_MS", "0"), ("RAILHOOK_API__LINGER_MAX_BYTES", "0")]),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!((off.api.linger_timeout_ms, off.api.linger_max_bytes), (0, 0));
    }

    #[test]
    fn ingress_keys_are_validated() {
        let err = Config::load_from(
            FileSource::Default,
            &env(&[("RAILHOOK_INGRESS__MAX_BODY_BYTES", "10"), ("RAILHOOK_INGRESS__PUBLIC_URL", "ftp://x")]),
            &Overrides::default(),
        )
        .unwrap_err()
        .to_string();
        for key in ["ingress.max_body_bytes is 10", "ingress.public_url 'ftp://x'"] {
            assert!(err.contains(key), "{key}: {err}");
        }
        let ok = Config::load_from(FileSource::Default, &env(&[("RAILHOOK_INGRESS__PUBLIC_URL", "https://hooks.example.com/in/")]), &Overrides::default()).unwrap();
        assert_eq!((ok.ingress.max_body_bytes, ok.ingress.secret_overlap_seconds), (512 * 1024, 86_400));
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = Config::load_from(FileSource::Default, &env(&[("RAILHOOK_API__LISTN", "x")]), &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("listn"), "{err}");
    }

    #[test]
    fn secrets_are_redacted() {
        let mut config = Config::default();
        config.database.url = "postgres://rh:hunter2@db:5432/railhook?sslmode=require".into();
        config.api.admin_token = "supersecretadmintoken".into();
        config.kafka.properties.insert("sasl.password".into(), "kafkapw".into());
        config.kafka.properties.insert("linger.ms".into(), "5".into());
        let text = config.redacted_toml();
        for secret in ["hunter2", "supersecretadmintoken", "kafkapw"] {
            assert!(!text.contains(secret), "{secret} leaked in\n{text}");
        }
        assert!(text.contains("linger.ms"));
        assert!(text.contains("rh:<redacted>@db:5432"));
    }
}

#[cfg(test)]
mod docs_tests {
    use super::*;

    /// docs/CONFIGURATION.md lists every key with its default.
    #[test]
    fn every_key_is_documented() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/CONFIGURATION.md")).unwrap();
        let value = toml::Value::try_from(Config::default()).unwrap();
        let mut missing = Vec::new();
        for (section, table) in value.as_table().unwrap() {
            for (key, v) in table.as_table().unwrap() {
                let row = format!("| `{section}.{key}` | ");
                let Some(line) = doc.lines().find(|l| l.starts_with(&row)) else {
                    missing.push(format!("{section}.{key}"));
                    continue;
                };
                let shown = match v {
                    toml::Value::String(s) => s.clone(),
                    toml::Value::Table(_) => "{}".into(),
                    other => other.to_string(),
                };
                let shown = if shown.is_empty() { "\"\"".to_string() } else { shown };
                assert!(line.contains(&format!("`{shown}`")), "default of {section}.{key} is {shown}: {line}");
            }
        }
        assert!(missing.is_empty(), "undocumented keys: {missing:?}");
    }
}
