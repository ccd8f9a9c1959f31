//! `railhook doctor`: what Railhook needs of Postgres, Kafka and this host, checked against
//! the same configuration every other subcommand reads, one line per check with what is
//! wrong and how to fix it.
//!
//! Exit codes: 0 when every check passed, 1 when at least one found a problem, 2 when
//! Postgres or Kafka could not be reached (the checks that need them are skipped; 2 wins
//! over 1).
//!
//! By default the doctor judges a running deployment: a missing publication, slot or topic
//! and a slot no relay streams from are problems. `--preflight` judges an installation
//! before its first start: what the relay and the worker create at start (the publication
//! and slot when `relay.create_slot` is true, the topics always) may be missing, and no relay
//! needs to stream yet.
//!
//! The thresholds follow the alerts in `infra/prometheus/alerts.yml`: slot lag over 1 GiB
//! (`RailhookRelaySlotLagHigh`), retained WAL over 80 % of `max_slot_wal_keep_size`
//! (`RailhookRelaySlotWalRetentionHigh`), no status update for 60 s
//! (`RailhookRelayFeedbackStale`).

use std::process::ExitCode;
use std::time::Duration;

use railhook_config::{Config, RelayMode};
use railhook_relay::health::{slot_health, SlotHealth};
use railhook_store::server::{server_facts, ServerFacts};
use serde::Serialize;
use tokio_postgres::Client;

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Print the checks as JSON instead of one line each.
    #[arg(long)]
    json: bool,
    /// Check an installation before its first start: the publication, the slot and the
    /// topics that Railhook creates at start may be missing, and no relay needs to stream yet.
    #[arg(long)]
    preflight: bool,
    /// Slot lag (WAL bytes not yet confirmed by the relay) above which the slot is a problem.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 30)]
    max_slot_lag_bytes: i64,
    /// Difference between this host's clock and the database's above which it is a problem.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    max_clock_skew_ms: i64,
    /// How long to wait for Postgres and for Kafka before giving up on them.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    timeout: u64,
}

/// A check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    Problem,
    /// Not checked: what it needs is missing (no connection, no slot) or not used.
    Skipped,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Stable name, for scripts reading `--json`.
    pub name: &'static str,
    pub verdict: Verdict,
    /// What was found.
    pub detail: String,
    /// What to do about a problem, in an operator's words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, detail: impl Into<String>) -> Check {
        Check { name, verdict: Verdict::Ok, detail: detail.into(), fix: None }
    }

    fn problem(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { name, verdict: Verdict::Problem, detail: detail.into(), fix: Some(fix.into()) }
    }

    fn skipped(name: &'static str, why: impl Into<String>) -> Check {
        Check { name, verdict: Verdict::Skipped, detail: why.into(), fix: None }
    }
}

/// The report and whether a connection failed.
struct Report {
    checks: Vec<Check>,
    unreachable: bool,
}

impl Report {
    fn exit_code(&self) -> u8 {
        if self.unreachable {
            2
        } else if self.checks.iter().any(|c| c.verdict == Verdict::Problem) {
            1
        } else {
            0
        }
    }
}

/// Whether this configuration announces through Kafka (`transport`, `auto` resolved): on
/// the inline transport the Kafka checks are skipped.
fn uses_kafka(config: &Config) -> bool {
    config.transport() == railhook_config::TransportKind::Kafka
}

/// The checks that need the slot, in the report's order (the server's settings, then the
/// publication and the slot); in poll mode they are skipped.
const SLOT_CHECKS: [&str; 8] =
    ["wal_level", "max_replication_slots", "max_wal_senders", "max_slot_wal_keep_size", "publication", "slot", "slot_lag", "relay_streaming"];

/// The checks that need a Postgres connection.
const POSTGRES_CHECKS: [&str; 10] = [
    "wal_level",
    "max_replication_slots",
    "max_wal_senders",
    "max_slot_wal_keep_size",
    "migrations",
    "publication",
    "slot",
    "slot_lag",
    "relay_streaming",
    "clock",
];

pub async fn run(config: &Config, args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let report = examine(config, &args).await;
    if args.json {
        let value = serde_json::json!({
            "checks": report.checks,
            "problems": report.checks.iter().filter(|c| c.verdict == Verdict::Problem).count(),
            "exit_code": report.exit_code(),
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        for check in &report.checks {
            let verdict = match check.verdict {
                Verdict::Ok => "ok",
                Verdict::Problem => "PROBLEM",
                Verdict::Skipped => "skipped",
            };
            match &check.fix {
                Some(fix) => println!("{verdict:<8} {:<23} {}; {fix}", check.name, check.detail),
                None => println!("{verdict:<8} {:<23} {}", check.name, check.detail),
            }
        }
    }
    let problems = report.checks.iter().filter(|c| c.verdict == Verdict::Problem).count();
    match report.exit_code() {
        0 => eprintln!("no problems found"),
        1 => eprintln!("{problems} problem(s) found"),
        _ => eprintln!("{problems} problem(s) found; could not reach everything, so some checks were skipped"),
    }
    Ok(ExitCode::from(report.exit_code()))
}

async fn examine(config: &Config, args: &DoctorArgs) -> Report {
    let timeout = Duration::from_secs(args.timeout.max(1));
    let mut checks = Vec::new();
    let mut unreachable = false;

    let url = railhook_config::redact_url(&config.database.url);
    let connected = tokio::time::timeout(timeout, railhook_store::connect_as(&config.database.url, railhook_store::application::CLI)).await;
    let client = match connected {
        Ok(Ok((client, _connection))) => Some(client),
        Ok(Err(e)) => {
            checks.push(Check::problem(
                "postgres",
                format!("cannot connect to {url}: {e}"),
                "check database.url (RAILHOOK_DATABASE_URL), that Postgres runs, and that it accepts this host's connections (listen_addresses, pg_hba.conf, the password)",
            ));
            None
        }
        Err(_) => {
            checks.push(Check::problem(
                "postgres",
                format!("no answer from {url} within {} s", timeout.as_secs()),
                "check database.url (RAILHOOK_DATABASE_URL), that Postgres runs, and that no firewall drops this host's connections",
            ));
            None
        }
    };
    match client {
        Some(client) => {
            // The checks take a few round trips; a server that stops answering midway is
            // given the same time again, not forever.
            let failed = match tokio::time::timeout(timeout * 2, postgres_checks(&client, config, args)).await {
                Ok(Ok(mut found)) => {
                    checks.append(&mut found);
                    None
                }
                Ok(Err(e)) => Some(Check::problem(
                    "postgres",
                    format!("connected to {url}, but a query failed: {e}"),
                    "the role in database.url must be able to read pg_settings, pg_replication_slots and pg_stat_replication (the relay's role can; else grant pg_monitor)",
                )),
                Err(_) => Some(Check::problem(
                    "postgres",
                    format!("connected to {url}, but it stopped answering within {} s", (timeout * 2).as_secs()),
                    "check the server's load and locks (pg_stat_activity)",
                )),
            };
            if let Some(problem) = failed {
                checks.push(problem);
                checks.extend(POSTGRES_CHECKS.iter().map(|name| Check::skipped(name, "the checks of Postgres did not finish")));
                unreachable = true;
            }
        }
        None => {
            unreachable = true;
            checks.extend(POSTGRES_CHECKS.iter().map(|name| Check::skipped(name, "no connection to Postgres")));
        }
    }

    if uses_kafka(config) {
        let (mut found, reached) = kafka_checks(config, args, timeout).await;
        checks.append(&mut found);
        unreachable |= !reached;
    } else {
        for name in ["kafka", "deliveries_topic", "forwards_topic"] {
            checks.push(Check::skipped(name, "the transport is inline: Kafka is not used"));
        }
    }
    Report { checks, unreachable }
}

fn mib(bytes: i64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

async fn postgres_checks(client: &Client, config: &Config, args: &DoctorArgs) -> Result<Vec<Check>, tokio_postgres::Error> {
    let facts = match server_facts(client).await {
        Ok(f) => f,
        Err(railhook_store::StoreError::Db(e)) => return Err(e),
        Err(e) => return Ok(vec![Check::problem("postgres", e.to_string(), "see the message above")]),
    };
    let version: String = client.query_one("SELECT current_setting('server_version')", &[]).await?.try_get(0)?;
    let database: String = client.query_one("SELECT current_database()", &[]).await?.try_get(0)?;
    let mut checks = Vec::new();
    if facts.server_version_num < 140000 {
        checks.push(Check::problem("postgres", format!("PostgreSQL {version} is too old"), "upgrade to PostgreSQL 14 or newer"));
    } else {
        checks.push(Check::ok("postgres", format!("PostgreSQL {version}, database {database}")));
    }

    let cdc = config.relay.mode == RelayMode::Cdc;
    let poll = |name: &'static str| Check::skipped(name, "relay.mode is poll: the relay reads the outbox table, not the WAL");
    let slot = slot_health(client, &config.relay.slot_name).await?;
    if cdc {
        checks.push(wal_level(&facts));
        checks.push(max_replication_slots(client, &facts, &slot).await?);
        checks.push(max_wal_senders(client, &facts, &slot).await?);
        checks.push(max_slot_wal_keep_size(&facts));
    } else {
        checks.extend(SLOT_CHECKS[..4].iter().map(|name| poll(name)));
    }
    checks.push(migrations(client).await?);
    if cdc {
        checks.push(publication(client, config, args.preflight).await?);
        checks.append(&mut slot_checks(&slot, &database, config, args));
    } else {
        checks.extend(SLOT_CHECKS[4..].iter().map(|name| poll(name)));
    }
    checks.push(clock(client, args.max_clock_skew_ms).await?);
    Ok(checks)
}

fn wal_level(facts: &ServerFacts) -> Check {
    if facts.wal_level == "logical" {
        Check::ok("wal_level", "logical")
    } else {
        Check::problem(
            "wal_level",
            format!("wal_level is {}, and the relay reads the outbox through logical decoding", facts.wal_level),
            "set wal_level = logical in postgresql.conf (or ALTER SYSTEM SET wal_level = 'logical') and restart Postgres; on a managed service turn on its logical replication flag (RDS: rds.logical_replication = 1, Cloud SQL: cloudsql.logical_decoding = on)",
        )
    }
}

async fn max_replication_slots(client: &Client, facts: &ServerFacts, slot: &SlotHealth) -> Result<Check, tokio_postgres::Error> {
    let used: i64 = client.query_one("SELECT count(*) FROM pg_replication_slots", &[]).await?.try_get(0)?;
    let max = facts.max_replication_slots;
    Ok(if max < 1 {
        Check::problem(
            "max_replication_slots",
            "max_replication_slots is 0, so no replication slot can exist",
            "set max_replication_slots = 10 (at least 1 for Railhook's slot, plus one per other replication consumer) in postgresql.conf and restart Postgres",
        )
    } else if !slot.exists && used >= i64::from(max) {
        Check::problem(
            "max_replication_slots",
            format!("all {max} replication slots are taken and Railhook's slot {} is not among them", slot.slot),
            "raise max_replication_slots in postgresql.conf and restart Postgres, or drop a slot nobody reads (SELECT pg_drop_replication_slot('name'))",
        )
    } else {
        Check::ok("max_replication_slots", format!("{max} ({used} in use)"))
    })
}

async fn max_wal_senders(client: &Client, facts: &ServerFacts, slot: &SlotHealth) -> Result<Check, tokio_postgres::Error> {
    let used: i64 = client.query_one("SELECT count(*) FROM pg_stat_replication", &[]).await?.try_get(0)?;
    let max = facts.max_wal_senders;
    Ok(if max < 1 {
        Check::problem(
            "max_wal_senders",
            "max_wal_senders is 0, so the relay cannot stream from the slot",
            "set max_wal_senders = 10 (at least 1 for Railhook's relay, plus one per replica and other replication consumer) in postgresql.conf and restart Postgres",
        )
    } else if !slot.active && used >= i64::from(max) {
        Check::problem(
            "max_wal_senders",
            format!("all {max} walsenders are busy, so the relay cannot start streaming"),
            "raise max_wal_senders in postgresql.conf and restart Postgres",
        )
    } else {
        Check::ok("max_wal_senders", format!("{max} ({used} in use)"))
    })
}

fn max_slot_wal_keep_size(facts: &ServerFacts) -> Check {
    if facts.max_slot_wal_keep_size_mb < 0 {
        Check::problem(
            "max_slot_wal_keep_size",
            "max_slot_wal_keep_size is -1 (unlimited): a slot no relay reads keeps WAL until the disk is full",
            "set max_slot_wal_keep_size in postgresql.conf to what the disk can spare for a stopped relay, e.g. max_slot_wal_keep_size = 4GB, and reload Postgres (SELECT pg_reload_conf()); past it Postgres invalidates the slot and the relay recreates it and re-announces what is pending",
        )
    } else {
        Check::ok("max_slot_wal_keep_size", mib(facts.max_slot_wal_keep_size_mb * 1024 * 1024))
    }
}

async fn migrations(client: &Client) -> Result<Check, tokio_postgres::Error> {
    let table = client.query_one("SELECT to_regclass('railhook_migrations') IS NOT NULL", &[]).await?.try_get::<_, bool>(0)?;
    if !table {
        return Ok(Check::problem("migrations", "the database has no Railhook tables", "run `railhook migrate` with the same configuration"));
    }
    let applied: Vec<i32> = client.query("SELECT version FROM railhook_migrations", &[]).await?.iter().map(|r| r.try_get(0)).collect::<Result<_, _>>()?;
    let migrator = railhook_store::Migrator::embedded();
    let known: Vec<i32> = migrator.migrations().iter().map(|m| m.version).collect();
    let pending: Vec<&str> = migrator.migrations().iter().filter(|m| !applied.contains(&m.version)).map(|m| m.name.as_str()).collect();
    let unknown: Vec<i32> = applied.iter().copied().filter(|v| !known.contains(v)).collect();
    Ok(if !unknown.is_empty() {
        Check::problem(
            "migrations",
            format!("the database has migrations this binary does not know (versions {unknown:?})"),
            "a newer Railhook migrated this database: run that version (or newer) of railhook",
        )
    } else if !pending.is_empty() {
        Check::problem("migrations", format!("{} not applied: {}", pending.len(), pending.join(", ")), "run `railhook migrate` with the same configuration")
    } else {
        Check::ok("migrations", format!("all {} applied", known.len()))
    })
}

async fn publication(client: &Client, config: &Config, preflight: bool) -> Result<Check, tokio_postgres::Error> {
    let name = &config.relay.publication_name;
    let create = format!("CREATE PUBLICATION {name} FOR TABLE outbox WITH (publish = 'insert')");
    let row = client.query_opt("SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = $1", &[name]).await?;
    let Some(row) = row else {
        return Ok(match (config.relay.create_slot, preflight) {
            (true, true) => Check::ok("publication", format!("{name} does not exist yet; the relay creates it at start (relay.create_slot = true)")),
            (true, false) => Check::problem(
                "publication",
                format!("publication {name} does not exist, so no relay has started against this database"),
                format!("start `railhook relay` (it creates the publication, since relay.create_slot = true), or run {create}"),
            ),
            (false, _) => Check::problem(
                "publication",
                format!("publication {name} does not exist and relay.create_slot = false"),
                format!("run {create} in the database, or set relay.create_slot = true"),
            ),
        });
    };
    let (ins, upd, del, trunc): (bool, bool, bool, bool) = (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?, row.try_get(3)?);
    if !ins || upd || del || trunc {
        return Ok(Check::problem(
            "publication",
            format!("publication {name} must publish inserts only"),
            format!("run ALTER PUBLICATION {name} SET (publish = 'insert')"),
        ));
    }
    let tables: Vec<String> = client
        .query("SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1", &[name])
        .await?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?;
    Ok(if tables.iter().any(|t| t.ends_with(".outbox")) {
        Check::ok("publication", format!("{name}: inserts into {}", tables.join(", ")))
    } else {
        Check::problem(
            "publication",
            format!("publication {name} does not include the outbox table (it has {})", if tables.is_empty() { "none".into() } else { tables.join(", ") }),
            format!("run ALTER PUBLICATION {name} ADD TABLE outbox"),
        )
    })
}

fn slot_checks(slot: &SlotHealth, database: &str, config: &Config, args: &DoctorArgs) -> Vec<Check> {
    let name = &slot.slot;
    let create = format!("SELECT pg_create_logical_replication_slot('{name}', 'pgoutput')");
    if !slot.exists {
        let missing = match (config.relay.create_slot, args.preflight) {
            (true, true) => Check::ok("slot", format!("{name} does not exist yet; the relay creates it at start (relay.create_slot = true)")),
            (true, false) => Check::problem(
                "slot",
                format!("replication slot {name} does not exist, so no relay streams the outbox to Kafka"),
                format!("start `railhook relay` (it creates the slot, since relay.create_slot = true, and announces what is pending), or run {create}"),
            ),
            (false, _) => Check::problem(
                "slot",
                format!("replication slot {name} does not exist and relay.create_slot = false"),
                format!("run {create} in the database, or set relay.create_slot = true"),
            ),
        };
        return vec![missing, Check::skipped("slot_lag", "no slot"), Check::skipped("relay_streaming", "no slot")];
    }

    let plugin = slot.plugin.as_deref().unwrap_or("-");
    let slot_check = if plugin != "pgoutput" {
        Check::problem(
            "slot",
            format!("slot {name} uses the plugin {plugin}, not pgoutput"),
            "stop the relays, run `railhook slot drop --confirm` and start them again: the relay recreates the slot with pgoutput",
        )
    } else if slot.database.as_deref() != Some(database) {
        Check::problem(
            "slot",
            format!("slot {name} belongs to database {}, not {database}", slot.database.as_deref().unwrap_or("-")),
            "give relay.slot_name a name of its own for this database, or drop the other database's slot if nothing reads it",
        )
    } else if slot.is_lost() {
        Check::problem(
            "slot",
            format!("slot {name} is lost (wal_status lost): Postgres removed WAL it still needed"),
            if config.relay.recreate_lost_slot {
                "start or restart `railhook relay`: it recreates the slot and re-announces the pending Deliveries (relay.recreate_lost_slot = true); then find out why the relay fell behind (docs/RUNBOOK.md#railhookrelayslotlost)"
            } else {
                "run `railhook slot drop --confirm` and start the relay, or set relay.recreate_lost_slot = true (docs/RUNBOOK.md#railhookrelayslotlost)"
            },
        )
    } else if slot.wal_status == "unreserved" {
        Check::problem(
            "slot",
            format!("slot {name} has wal_status unreserved: it retains more than max_slot_wal_keep_size and the next checkpoint may invalidate it"),
            "make sure a relay streams from it and catches up, or raise max_slot_wal_keep_size and reload Postgres (docs/RUNBOOK.md#railhookrelayslotwalunreserved)",
        )
    } else {
        Check::ok("slot", format!("{name}: pgoutput, wal_status {}", slot.wal_status))
    };

    let lag = slot.lag_bytes.unwrap_or(0);
    let retained = slot.retained_bytes.unwrap_or(0);
    let keep = slot.max_slot_wal_keep_size_bytes;
    let lag_check = if slot.is_lost() {
        Check::skipped("slot_lag", "the slot is lost")
    } else if lag > args.max_slot_lag_bytes {
        Check::problem(
            "slot_lag",
            format!("slot {name} is {} behind the WAL (more than {})", mib(lag), mib(args.max_slot_lag_bytes)),
            "the relay is stopped or falls behind: check `railhook slot status`, the relay's logs and Kafka (docs/RUNBOOK.md#railhookrelayslotlaghigh)",
        )
    } else if keep > 0 && retained as f64 > 0.8 * keep as f64 {
        Check::problem(
            "slot_lag",
            format!("slot {name} retains {} of WAL, over 80 % of max_slot_wal_keep_size ({}); at 100 % Postgres invalidates it", mib(retained), mib(keep)),
            "make sure a relay streams from it and catches up, or raise max_slot_wal_keep_size (docs/RUNBOOK.md#railhookrelayslotwalretentionhigh)",
        )
    } else {
        Check::ok("slot_lag", format!("{} behind, {} retained", mib(lag), mib(retained)))
    };

    let streaming = if slot.is_lost() {
        Check::skipped("relay_streaming", "the slot is lost")
    } else if !slot.active {
        if args.preflight {
            Check::ok("relay_streaming", "no relay streams yet (preflight)")
        } else {
            Check::problem(
                "relay_streaming",
                format!("no relay streams from slot {name}: nothing is announced, and the slot keeps WAL"),
                "start `railhook relay` (run two: the second waits as a hot standby) and check its logs (docs/RUNBOOK.md#railhookrelayslotinactive)",
            )
        }
    } else {
        match slot.last_feedback_age_seconds {
            Some(age) if age > 60.0 => Check::problem(
                "relay_streaming",
                format!("the relay (PID {}) has sent no status update for {age:.0} s", slot.active_pid.unwrap_or_default()),
                "the relay is stuck: check its logs and restart it; its standby takes over (docs/RUNBOOK.md#railhookrelayfeedbackstale)",
            ),
            _ => Check::ok("relay_streaming", format!("walsender PID {}", slot.active_pid.unwrap_or_default())),
        }
    };
    vec![slot_check, lag_check, streaming]
}

/// This host's clock against the database's, as the worker reads both
/// (`railhook_worker::clock`): the sample with the shortest round trip of five, judged
/// with half its round trip in this host's favour.
async fn clock(client: &Client, max_skew_ms: i64) -> Result<Check, tokio_postgres::Error> {
    let mut best: Option<(chrono::Duration, chrono::Duration)> = None;
    for _ in 0..5 {
        let before = railhook_worker::clock::host_now();
        let db_now: chrono::DateTime<chrono::Utc> = client.query_one("SELECT clock_timestamp()", &[]).await?.try_get(0)?;
        let after = railhook_worker::clock::host_now();
        let rtt = after - before;
        let offset = db_now - (before + rtt / 2);
        if best.is_none_or(|(_, r)| rtt < r) {
            best = Some((offset, rtt));
        }
    }
    let Some((offset, rtt)) = best else { return Ok(Check::skipped("clock", "no sample")) };
    let offset_ms = offset.num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0;
    let error_ms = rtt.num_microseconds().unwrap_or(0) as f64 / 2000.0;
    let side = if offset_ms > 0.0 { "behind" } else { "ahead of" };
    let detail = format!("this host's clock is {:.1} ms {side} the database's (±{error_ms:.1} ms)", offset_ms.abs());
    Ok(if offset_ms.abs() - error_ms > max_skew_ms as f64 {
        Check::problem(
            "clock",
            format!("{detail}, more than {max_skew_ms} ms"),
            "synchronise this host's clock and the database server's with NTP (chrony, systemd-timesyncd): retries are timed on the database's clock, but webhook-timestamp and the Attempts' times come from this host's, and receivers refuse a webhook-timestamp more than 5 minutes off",
        )
    } else {
        Check::ok("clock", detail)
    })
}

/// Kafka's checks, and whether the brokers answered.
async fn kafka_checks(config: &Config, args: &DoctorArgs, timeout: Duration) -> (Vec<Check>, bool) {
    let kafka = &config.kafka;
    let topics = [("deliveries_topic", config.deliveries_topic(), "kafka.deliveries_topic"), ("forwards_topic", config.forwards_topic(), "kafka.forwards_topic")];
    let names: Vec<String> = topics.iter().map(|(_, t, _)| t.clone()).collect();
    let (brokers, layouts) = match railhook_kafka::topic_layouts(kafka, &names, timeout).await {
        Ok(found) => found,
        Err(e) => {
            let why = match e {
                railhook_kafka::KafkaError::Unreachable { message, .. } => message,
                other => other.to_string(),
            };
            let mut checks = vec![Check::problem(
                "kafka",
                format!("no answer from the brokers {}: {why}", kafka.brokers),
                "check kafka.brokers (RAILHOOK_KAFKA_BROKERS), that the brokers run and that this host reaches the addresses they advertise (advertised.listeners); TLS and SASL settings go in kafka.properties",
            )];
            checks.extend(topics.iter().map(|(check, _, _)| Check::skipped(check, "no connection to Kafka")));
            return (checks, false);
        }
    };
    let mut checks = vec![Check::ok("kafka", format!("{brokers} broker(s) at {}", kafka.brokers))];
    for ((check, topic, key), layout) in topics.iter().zip(layouts) {
        let (want, replicas) = (kafka.partitions.max(1) as usize, kafka.replication_factor.max(1) as usize);
        let create = format!(
            "kafka-topics.sh --bootstrap-server {} --create --topic {topic} --partitions {want} --replication-factor {replicas}",
            kafka.brokers
        );
        checks.push(if !layout.exists {
            if args.preflight {
                Check::ok(check, format!("{topic} does not exist yet; the relay and the worker create it at start"))
            } else {
                Check::problem(
                    check,
                    format!("topic {topic} ({key}) does not exist"),
                    format!("start `railhook relay` or `railhook worker` (they create it with kafka.partitions = {want} partitions), or run {create}"),
                )
            }
        } else if layout.partitions < want {
            Check::problem(
                check,
                format!("topic {topic} has {} partition(s), fewer than kafka.partitions = {want}, which limits how many workers share the load", layout.partitions),
                format!(
                    "run kafka-topics.sh --bootstrap-server {} --alter --topic {topic} --partitions {want} (partitions can only be added; an Endpoint's hints may then reach a second worker for a while, which its Claim absorbs), or set kafka.partitions = {}",
                    kafka.brokers, layout.partitions
                ),
            )
        } else if layout.min_replicas < replicas {
            Check::problem(
                check,
                format!("topic {topic} has {} replica(s) per partition, fewer than kafka.replication_factor = {replicas}", layout.min_replicas),
                "add replicas with kafka-reassign-partitions.sh (a reassignment listing more brokers per partition), or set kafka.replication_factor to match",
            )
        } else {
            Check::ok(check, format!("{topic}: {} partitions, {} replica(s)", layout.partitions, layout.min_replicas))
        });
    }
    (checks, true)
}

#[cfg(test)]
mod tests {
    /// Every runbook section a fix points at exists.
    #[test]
    fn runbook_links_resolve() {
        let runbook = include_str!("../../../docs/RUNBOOK.md");
        let anchors: Vec<String> = runbook.lines().filter_map(|l| l.strip_prefix("## ")).map(|h| h.trim().to_ascii_lowercase().replace(' ', "-")).collect();
        let mut links = 0;
        for after in include_str!("doctor.rs").split("docs/RUNBOOK.md#").skip(1) {
            let anchor: String = after.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
            if anchor.is_empty() {
                continue; // this test's own pattern
            }
            assert!(anchors.contains(&anchor), "docs/RUNBOOK.md has no section #{anchor}");
            links += 1;
        }
        assert!(links >= 6, "{links} runbook links");
    }
}
