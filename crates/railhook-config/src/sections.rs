//! The configuration tree: [`Config`] and its sections, with the defaults (the first layer)
//! and what each key is for.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// How announcements travel from the relay to the workers: `kafka`, `inline` (the relay
    /// hands them to the workers of the same `railhook all` process through a bounded
    /// channel; no Kafka), or `auto` (the default): `kafka` when `kafka.brokers` is set,
    /// `inline` when it is not. See [`Config::transport`].
    pub transport: Transport,
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
    pub ui: UiConfig,
    pub kafka_source: KafkaSourceConfig,
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
    /// `POST /v1/events` in batches (issue 30): at most this many statements run at once
    /// for the API's POSTs, and the POSTs that arrive while they all run go together in
    /// the next one (one statement and one commit for them all). Nothing waits for a batch
    /// to fill: below this many POSTs at once each is its own statement, as it would be
    /// without batching.
    pub ingest_lanes: usize,
    /// The most POSTs in one ingest statement. 1: every POST its own statement.
    pub ingest_batch_max: usize,
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

/// The `transport` setting as written ([`Config::transport`] resolves `auto`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// `kafka` when `kafka.brokers` is set, `inline` when it is empty.
    Auto,
    /// Announcements go through Kafka topics: the relay, the workers and the API may run as
    /// separate processes, as many workers as partitions.
    Kafka,
    /// Announcements go from the relay to the workers of the same process (`railhook all`)
    /// through a bounded channel; Postgres is the only server Railhook needs.
    Inline,
}

/// The transport in effect (`auto` resolved).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    Kafka,
    Inline,
}

impl TransportKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TransportKind::Kafka => "kafka",
            TransportKind::Inline => "inline",
        }
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
    /// written, nor while an ordered Delivery waits in the worker behind its predecessor (an
    /// Endpoint seen to be ordered runs up to 64 claims at once in a worker when this is
    /// lower).
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
    /// How often the worker vacuums the Claims' table (`delivery_claims`) and the open
    /// Deliveries' (`open_deliveries`), in milliseconds (0: left to autovacuum). Each
    /// Delivery adds a row to each and removes it; every claim counts the Claims of its
    /// Project and Endpoint, and until a vacuum their dead index entries are read too.
    pub claims_vacuum_interval_ms: u64,
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

/// Events from Kafka (docs/KAFKA_SOURCE.md): every worker process (`railhook worker`,
/// `railhook all`) with `topics` set runs a consumer in `group_id` that ingests each record
/// as an Event with the statement of `POST /v1/events`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaSourceConfig {
    /// Topics whose records become Events, `kafka.topic_prefix` prepended. Empty (the
    /// default) turns the Kafka source off.
    pub topics: Vec<String>,
    /// The consumer group the source's consumers share (one per worker process); its
    /// committed offsets say which records were ingested.
    pub group_id: String,
    /// `bootstrap.servers` of the cluster that holds `topics`; empty: `kafka.brokers`.
    pub brokers: String,
    /// Any librdkafka property for the source's consumer and dead-letter producer, applied
    /// after `kafka.properties` (e.g. other SASL credentials for another cluster).
    pub properties: BTreeMap<String, String>,
    /// How a record carries its Event: `envelope` (the value is
    /// `{"type", "payload", "project"?, "idempotency_key"?}`) or `headers` (the value is the
    /// payload; the type, project and key are headers).
    pub format: RecordFormat,
    /// The Project every record belongs to (`proj_...`). Empty: each record names its
    /// Project (`project_header` or the envelope's `project`).
    pub project: String,
    /// Header naming the record's Project when `project` is empty.
    pub project_header: String,
    /// Header naming the event type (`format = "headers"`).
    pub type_header: String,
    /// Header carrying the idempotency key; without one (and without an envelope
    /// `idempotency_key`), the record's topic-partition-offset is its key.
    pub idempotency_key_header: String,
    /// Where records that cannot become an Event go, with the reason in headers;
    /// `kafka.topic_prefix` prepended. Created when missing.
    pub dead_letter_topic: String,
    /// A record value larger than this goes to the dead-letter topic (`too_large`).
    pub max_record_bytes: usize,
    /// Records ingested per transaction at most.
    pub batch_max_records: usize,
    /// How long a batch waits for more records after its first, in milliseconds.
    pub batch_max_wait_ms: u64,
    /// Transactions a batch is split into at most, run at once on as many connections (the
    /// records of one partition always in one of them, in order).
    pub connections: usize,
}

/// How a Kafka record carries its Event (`kafka_source.format`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RecordFormat {
    /// The value is a JSON envelope: `{"type": ..., "payload": {...}, "project": ...,
    /// "idempotency_key": ...}`.
    Envelope,
    /// The value is the payload; the type, the Project and the key are headers.
    Headers,
}

impl Default for KafkaSourceConfig {
    fn default() -> Self {
        KafkaSourceConfig {
            topics: Vec::new(),
            group_id: "railhook-kafka-source".into(),
            brokers: String::new(),
            properties: BTreeMap::new(),
            format: RecordFormat::Envelope,
            project: String::new(),
            project_header: "railhook-project".into(),
            type_header: "railhook-type".into(),
            idempotency_key_header: "railhook-idempotency-key".into(),
            dead_letter_topic: "railhook.kafka-source.dead-letter".into(),
            max_record_bytes: 1024 * 1024,
            batch_max_records: 500,
            batch_max_wait_ms: 5,
            connections: 8,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Human,
    Json,
}

/// The dashboard (`/ui`, docs/UI.md).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UiConfig {
    /// A trace viewer's URL for one trace, with `{trace_id}` where the 32-hex-digit trace id
    /// goes, e.g. `http://jaeger:16686/trace/{trace_id}` (Jaeger) or a Tempo/Honeycomb
    /// equivalent: the dashboard links an Event's trace id there (docs/TRACING.md). Empty (the
    /// default): the trace id is shown without a link.
    pub trace_url_template: String,
}

impl UiConfig {
    /// The trace viewer's URL of `trace_id`, if a template is set.
    pub fn trace_url(&self, trace_id: &str) -> Option<String> {
        (!self.trace_url_template.is_empty()).then(|| self.trace_url_template.replace("{trace_id}", trace_id))
    }
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
            transport: Transport::Auto,
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
            ui: UiConfig::default(),
            kafka_source: KafkaSourceConfig::default(),
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
            brokers: String::new(),
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
            ingest_hold_above_ms: 100,
            ingest_max_hold_ms: 1_000,
            ingest_hold_ignore_above_ms: 30_000,
            // One statement in flight (issue 30, twenty-third session): what arrives
            // meanwhile goes in the next one, so batches grow with the load and Postgres
            // does fewer, bigger statements and commits. Against 4 lanes, alternated
            // runs on 2 cores: ingest at saturation 9,400-10,000 events/s against
            // 6,800-7,300 with Postgres at 0.84 cores against 1.18, and one ordered
            // Endpoint's 1,000/s p99 under 100 ms in 9 of 11 runs against 2 of 11
            // (docs/BENCHMARKS.md "Issue 30, twenty-third session").
            ingest_lanes: 1,
            ingest_batch_max: 64,
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
            claims_vacuum_interval_ms: 2_000,
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

impl Config {
    /// The transport in effect: `transport` as set, or for `auto`, Kafka when
    /// `kafka.brokers` is set and inline when it is empty.
    pub fn transport(&self) -> TransportKind {
        match self.transport {
            Transport::Kafka => TransportKind::Kafka,
            Transport::Inline => TransportKind::Inline,
            Transport::Auto if self.kafka.brokers.trim().is_empty() => TransportKind::Inline,
            Transport::Auto => TransportKind::Kafka,
        }
    }

    /// Every configuration key, `section.key` (and the top-level `transport`): what a
    /// `RAILHOOK_SECTION__KEY` variable may name (deployment files are checked against it).
    pub fn keys() -> Vec<String> {
        let value = toml::Value::try_from(Config::default()).expect("the defaults serialise: every field is a TOML type");
        let toml::Value::Table(top) = value else { return Vec::new() };
        top.iter()
            .flat_map(|(section, v)| match v.as_table() {
                Some(t) => t.keys().map(|k| format!("{section}.{k}")).collect::<Vec<_>>(),
                None => vec![section.clone()],
            })
            .collect()
    }

    /// Full topic name of the deliveries topic, prefix included.
    pub fn deliveries_topic(&self) -> String {
        format!("{}{}", self.kafka.topic_prefix, self.kafka.deliveries_topic)
    }

    /// Whether this process runs the Kafka source's consumer (`kafka_source.topics` set).
    pub fn kafka_source_enabled(&self) -> bool {
        !self.kafka_source.topics.is_empty()
    }

    /// The Kafka source's topics, prefix included.
    pub fn kafka_source_topics(&self) -> Vec<String> {
        self.kafka_source.topics.iter().map(|t| format!("{}{t}", self.kafka.topic_prefix)).collect()
    }

    /// The Kafka source's dead-letter topic, prefix included.
    pub fn kafka_source_dead_letter_topic(&self) -> String {
        format!("{}{}", self.kafka.topic_prefix, self.kafka_source.dead_letter_topic)
    }

    /// The client settings of the Kafka source: `kafka`'s, with `kafka_source.brokers` when
    /// set and `kafka_source.properties` after `kafka.properties`.
    pub fn kafka_source_kafka(&self) -> KafkaConfig {
        let mut kafka = self.kafka.clone();
        if !self.kafka_source.brokers.trim().is_empty() {
            kafka.brokers = self.kafka_source.brokers.clone();
        }
        kafka.properties.extend(self.kafka_source.properties.iter().map(|(k, v)| (k.clone(), v.clone())));
        kafka
    }

    /// Full topic name of the forwards topic, prefix included.
    pub fn forwards_topic(&self) -> String {
        format!("{}{}", self.kafka.topic_prefix, self.kafka.forwards_topic)
    }
}
