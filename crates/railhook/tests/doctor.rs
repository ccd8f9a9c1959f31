//! `railhook doctor` as an operator runs it, one test per check, each against a deployment
//! misconfigured in exactly that way: a private Postgres cluster for the server's settings
//! (they need a restart, and the shared server must stay as it is), a database and a topic
//! prefix of its own for the rest. Each test also shows the check passing once the fix it
//! printed is applied.

mod common;

use std::time::Duration;

use railhook_config::Config;
use railhook_testkit::pg::PgCluster;
use railhook_testkit::{eventually, test_config, TestDb};
use serde_json::Value;

/// What one `railhook doctor --json` run said.
struct Doctor {
    code: i32,
    report: Value,
    stdout: String,
}

impl Doctor {
    fn check(&self, name: &str) -> &Value {
        self.report["checks"]
            .as_array()
            .and_then(|checks| checks.iter().find(|c| c["name"] == name))
            .unwrap_or_else(|| panic!("no check {name} in {}", self.stdout))
    }

    fn verdict(&self, name: &str) -> &str {
        self.check(name)["verdict"].as_str().unwrap_or("")
    }

    /// The check is a problem whose detail and fix say what is given.
    fn assert_problem(&self, name: &str, detail: &str, fix: &str) {
        let check = self.check(name);
        assert_eq!(check["verdict"], "problem", "{name}: {}", self.stdout);
        let (d, f) = (check["detail"].as_str().unwrap_or(""), check["fix"].as_str().unwrap_or(""));
        assert!(d.contains(detail), "{name} detail {d:?} lacks {detail:?}");
        assert!(f.contains(fix), "{name} fix {f:?} lacks {fix:?}");
        assert_eq!(self.code, 1, "a problem exits 1: {}", self.stdout);
    }

    fn assert_ok(&self, name: &str) {
        assert_eq!(self.verdict(name), "ok", "{name}: {}", self.stdout);
    }
}

/// The environment every subcommand reads for this test's stack (as `common::spawn_railhook`).
fn stack_env(config: &Config) -> Vec<(&'static str, String)> {
    vec![
        ("RAILHOOK_DATABASE_URL", config.database.url.clone()),
        ("RAILHOOK_KAFKA_BROKERS", config.kafka.brokers.clone()),
        ("RAILHOOK_KAFKA__TOPIC_PREFIX", config.kafka.topic_prefix.clone()),
        ("RAILHOOK_KAFKA__PARTITIONS", config.kafka.partitions.to_string()),
        ("RAILHOOK_RELAY__SLOT_NAME", config.relay.slot_name.clone()),
        ("RAILHOOK_TELEMETRY__LOG_FILTER", "warn".into()),
    ]
}

async fn doctor_with(config: &Config, args: &[&str], env: &[(&str, String)]) -> Doctor {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_railhook"))
        .arg("doctor")
        .arg("--json")
        .args(if args.contains(&"--timeout") { &[][..] } else { &["--timeout", "5"][..] })
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(stack_env(config))
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .current_dir(std::env::temp_dir())
        .output()
        .await
        .expect("run railhook doctor");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let report: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("doctor --json printed no JSON ({e}): {stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    let code = out.status.code().unwrap_or(-1);
    assert_eq!(report["exit_code"], code, "{stdout}");
    Doctor { code, report, stdout }
}

async fn doctor(config: &Config, args: &[&str]) -> Doctor {
    doctor_with(config, args, &[]).await
}

/// A private cluster (testkit defaults: wal_level logical, 16 slots, no
/// max_slot_wal_keep_size) with `settings` applied by ALTER SYSTEM and a restart, and a
/// configuration pointing at it.
async fn private_cluster(settings: &[(&str, &str)]) -> (PgCluster, Config) {
    let mut pg = PgCluster::start().await;
    let client = railhook_testkit::connect(&pg.url("postgres")).await.expect("connect to the private cluster");
    for (key, value) in settings {
        client.batch_execute(&format!("ALTER SYSTEM SET {key} = '{value}'")).await.expect("ALTER SYSTEM");
    }
    drop(client);
    pg.fast_restart().await;
    let mut config = Config::default();
    config.database.url = pg.url("postgres");
    config.kafka.brokers = railhook_testkit::kafka_brokers();
    config.kafka.topic_prefix = railhook_testkit::topic_prefix();
    (pg, config)
}

/// Runs each statement on its own (ALTER SYSTEM refuses a transaction block), then restarts.
async fn alter_system(pg: &mut PgCluster, statements: &[&str], restart: bool) {
    let client = railhook_testkit::connect(&pg.url("postgres")).await.expect("connect to the private cluster");
    for sql in statements {
        client.batch_execute(sql).await.expect(sql);
    }
    drop(client);
    if restart {
        pg.fast_restart().await;
    }
}

async fn create_publication(db: &TestDb) {
    db.client().await.batch_execute("CREATE PUBLICATION railhook_outbox FOR TABLE outbox WITH (publish = 'insert')").await.unwrap();
}

async fn create_slot(db: &TestDb, config: &Config) {
    db.client()
        .await
        .execute("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", &[&config.relay.slot_name])
        .await
        .unwrap();
}

async fn drop_slot(db: &TestDb, config: &Config) {
    let _ = db.client().await.execute("SELECT pg_drop_replication_slot($1)", &[&config.relay.slot_name]).await;
}

async fn create_topics(config: &Config, partitions: i32) {
    let mut kafka = config.kafka.clone();
    kafka.partitions = partitions;
    railhook_kafka::ensure_topics(&kafka, &[config.deliveries_topic(), config.forwards_topic()]).await.expect("create topics");
}

#[tokio::test]
async fn a_running_stack_passes_every_check_and_prints_one_line_each() {
    let db = TestDb::new().await;
    let config = test_config(&db);
    let mut env = stack_env(&config);
    env.push(("RAILHOOK_RELAY__OPS_LISTEN", format!("127.0.0.1:{}", railhook_testkit::free_port())));
    let _relay = common::spawn_railhook(&config, "relay", None, &env);
    let client = db.client().await;
    eventually(Duration::from_secs(60), "the relay streaming from its slot", || {
        let client = &client;
        let slot = config.relay.slot_name.clone();
        async move {
            let row = client.query_opt("SELECT active FROM pg_replication_slots WHERE slot_name = $1", &[&slot]).await.ok()??;
            row.get::<_, bool>(0).then_some(())
        }
    })
    .await;
    // The relay creates the topics before it streams; ask until they are there too.
    let healthy = eventually(Duration::from_secs(30), "a clean bill of health", || {
        let config = &config;
        async move {
            let d = doctor(config, &[]).await;
            (d.code == 0).then_some(d)
        }
    })
    .await;
    let checks = healthy.report["checks"].as_array().unwrap();
    for name in [
        "postgres",
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
        "kafka",
        "deliveries_topic",
        "forwards_topic",
    ] {
        healthy.assert_ok(name);
    }
    assert_eq!(checks.len(), 14, "{}", healthy.stdout);

    // Without --json: one line per check, the verdict first.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_railhook"))
        .arg("doctor")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(stack_env(&config))
        .current_dir(std::env::temp_dir())
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 14, "{text}");
    assert!(lines.iter().all(|l| l.starts_with("ok ")), "{text}");
    assert!(lines[1].contains("wal_level") && lines[1].contains("logical"), "{text}");
}

#[tokio::test]
async fn wal_level_replica_is_a_problem_until_set_to_logical() {
    let (mut pg, config) = private_cluster(&[("wal_level", "replica")]).await;
    let d = doctor(&config, &[]).await;
    d.assert_problem("wal_level", "wal_level is replica", "set wal_level = logical in postgresql.conf");
    assert!(d.check("wal_level")["fix"].as_str().unwrap().contains("restart Postgres"));
    d.assert_ok("max_replication_slots");
    d.assert_ok("max_wal_senders");

    // The line an operator reads.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_railhook"))
        .arg("doctor")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(stack_env(&config))
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("wal_level ")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.starts_with("PROBLEM") && line.contains("wal_level is replica") && line.contains("; set wal_level = logical"), "{line}");

    alter_system(&mut pg, &["ALTER SYSTEM RESET wal_level"], true).await;
    doctor(&config, &[]).await.assert_ok("wal_level");
}

#[tokio::test]
async fn no_replication_slots_is_a_problem_until_raised() {
    let (mut pg, config) = private_cluster(&[("max_replication_slots", "0")]).await;
    let d = doctor(&config, &[]).await;
    d.assert_problem("max_replication_slots", "max_replication_slots is 0", "set max_replication_slots");
    d.assert_ok("wal_level");

    alter_system(&mut pg, &["ALTER SYSTEM RESET max_replication_slots"], true).await;
    doctor(&config, &[]).await.assert_ok("max_replication_slots");
}

#[tokio::test]
async fn no_walsenders_is_a_problem_until_raised() {
    let (mut pg, config) = private_cluster(&[("max_wal_senders", "0")]).await;
    let d = doctor(&config, &[]).await;
    d.assert_problem("max_wal_senders", "max_wal_senders is 0", "set max_wal_senders");

    alter_system(&mut pg, &["ALTER SYSTEM RESET max_wal_senders"], true).await;
    doctor(&config, &[]).await.assert_ok("max_wal_senders");
}

#[tokio::test]
async fn unlimited_max_slot_wal_keep_size_is_a_problem_until_set() {
    // The testkit's cluster leaves max_slot_wal_keep_size at Postgres' default, -1.
    let (mut pg, config) = private_cluster(&[]).await;
    let d = doctor(&config, &[]).await;
    d.assert_problem("max_slot_wal_keep_size", "-1 (unlimited)", "max_slot_wal_keep_size = 4GB");
    assert!(d.check("max_slot_wal_keep_size")["fix"].as_str().unwrap().contains("pg_reload_conf()"));
    d.assert_ok("wal_level");

    // A reload is enough, as the fix says.
    alter_system(&mut pg, &["ALTER SYSTEM SET max_slot_wal_keep_size = '4GB'", "SELECT pg_reload_conf()"], false).await;
    let d = eventually(Duration::from_secs(10), "the reloaded setting", || {
        let config = &config;
        async move {
            let d = doctor(config, &[]).await;
            (d.verdict("max_slot_wal_keep_size") == "ok").then_some(d)
        }
    })
    .await;
    assert_eq!(d.check("max_slot_wal_keep_size")["detail"], "4.0 GiB");
}

#[tokio::test]
async fn an_unmigrated_database_is_a_problem_until_migrated() {
    let db = TestDb::new().await;
    let admin = railhook_testkit::connect(&railhook_testkit::admin_url()).await.unwrap();
    let name = format!("{}_empty", db.name);
    admin.batch_execute(&format!("CREATE DATABASE {name}")).await.unwrap();
    let mut config = test_config(&db);
    config.database.url = railhook_testkit::with_database(&db.url, &name);
    let d = doctor(&config, &[]).await;
    d.assert_problem("migrations", "no Railhook tables", "railhook migrate");

    let mut client = railhook_testkit::connect(&config.database.url).await.unwrap();
    railhook_store::Migrator::embedded().run(&mut client).await.unwrap();
    doctor(&config, &[]).await.assert_ok("migrations");
    drop(client);
    let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await;
}

#[tokio::test]
async fn a_missing_or_wrong_publication_is_a_problem() {
    let db = TestDb::new().await;
    let config = test_config(&db);
    let d = doctor(&config, &[]).await;
    d.assert_problem("publication", "publication railhook_outbox does not exist", "CREATE PUBLICATION railhook_outbox FOR TABLE outbox WITH (publish = 'insert')");
    assert!(d.check("publication")["fix"].as_str().unwrap().contains("start `railhook relay`"));
    // Before the first start the relay creates it: not a problem.
    doctor(&config, &["--preflight"]).await.assert_ok("publication");
    // Unless the relay is told not to create it.
    let d = doctor_with(&config, &["--preflight"], &[("RAILHOOK_RELAY__CREATE_SLOT", "false".into())]).await;
    d.assert_problem("publication", "relay.create_slot = false", "CREATE PUBLICATION");
    // The polling relay reads the table, not the WAL: no publication, slot or WAL setting needed.
    let d = doctor_with(&config, &["--preflight"], &[("RAILHOOK_RELAY__MODE", "poll".into())]).await;
    for name in ["wal_level", "max_slot_wal_keep_size", "publication", "slot", "slot_lag", "relay_streaming"] {
        assert_eq!(d.verdict(name), "skipped", "{name} in poll mode: {}", d.stdout);
    }
    d.assert_ok("migrations");

    let client = db.client().await;
    client.batch_execute("CREATE PUBLICATION railhook_outbox FOR TABLE outbox").await.unwrap();
    doctor(&config, &[]).await.assert_problem("publication", "must publish inserts only", "ALTER PUBLICATION railhook_outbox SET (publish = 'insert')");
    client.batch_execute("ALTER PUBLICATION railhook_outbox SET (publish = 'insert'); ALTER PUBLICATION railhook_outbox DROP TABLE outbox").await.unwrap();
    doctor(&config, &[]).await.assert_problem("publication", "does not include the outbox table", "ALTER PUBLICATION railhook_outbox ADD TABLE outbox");
    client.batch_execute("ALTER PUBLICATION railhook_outbox ADD TABLE outbox").await.unwrap();
    doctor(&config, &[]).await.assert_ok("publication");
}

#[tokio::test]
async fn a_missing_slot_is_a_problem_unless_before_the_first_start() {
    let db = TestDb::new().await;
    let config = test_config(&db);
    create_publication(&db).await;
    let d = doctor(&config, &[]).await;
    d.assert_problem("slot", &format!("replication slot {} does not exist", config.relay.slot_name), "start `railhook relay`");
    assert_eq!(d.verdict("slot_lag"), "skipped");
    assert_eq!(d.verdict("relay_streaming"), "skipped");
    let d = doctor(&config, &["--preflight"]).await;
    d.assert_ok("slot");
    d.assert_ok("publication");

    create_slot(&db, &config).await;
    let d = doctor(&config, &[]).await;
    d.assert_ok("slot");
    // A slot nobody streams from is its own problem.
    d.assert_problem("relay_streaming", "no relay streams from slot", "start `railhook relay`");
    doctor(&config, &["--preflight"]).await.assert_ok("relay_streaming");
    drop_slot(&db, &config).await;
}

#[tokio::test]
async fn a_slot_behind_the_wal_is_a_problem() {
    let db = TestDb::new().await;
    let config = test_config(&db);
    create_publication(&db).await;
    create_slot(&db, &config).await;
    // Well under the default 1 GiB, whatever the other tests write meanwhile.
    doctor(&config, &[]).await.assert_ok("slot_lag");

    // 2 MiB of WAL the slot has not confirmed, against a 1 MiB limit.
    let client = db.client().await;
    for _ in 0..4 {
        client.execute("SELECT pg_logical_emit_message(true, 'doctor-test', repeat('x', 512 * 1024))", &[]).await.unwrap();
    }
    let d = doctor(&config, &["--max-slot-lag-bytes", "1048576"]).await;
    d.assert_problem("slot_lag", &format!("slot {} is", config.relay.slot_name), "railhook slot status");
    assert!(d.check("slot_lag")["detail"].as_str().unwrap().contains("behind the WAL (more than 1.0 MiB)"), "{}", d.stdout);
    d.assert_ok("slot");

    // Confirmed up to now, the slot is level again (against a limit that the WAL other tests
    // and other users of the shared server write meanwhile cannot reach: 64 MiB).
    client
        .execute("SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())", &[&config.relay.slot_name])
        .await
        .unwrap();
    doctor(&config, &["--max-slot-lag-bytes", "67108864"]).await.assert_ok("slot_lag");
    drop_slot(&db, &config).await;
}

#[tokio::test]
async fn a_lost_slot_is_a_problem() {
    // A private cluster: invalidating a slot needs max_slot_wal_keep_size at 1 MB and
    // checkpoints, which the shared server must not see.
    let (pg, config) = private_cluster(&[("max_slot_wal_keep_size", "1MB")]).await;
    let client = railhook_testkit::connect(&pg.url("postgres")).await.unwrap();
    client.execute("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", &[&config.relay.slot_name]).await.unwrap();
    doctor(&config, &[]).await.assert_ok("slot");
    eventually(Duration::from_secs(60), "the slot invalidated", || {
        let (client, slot) = (&client, &config.relay.slot_name);
        async move {
            // Each switch starts a new 16 MB segment; the checkpoint invalidates the slot
            // that needs more than 1 MB of them (as the chaos suite's lost slot).
            for _ in 0..4 {
                client.batch_execute("SELECT pg_logical_emit_message(false, 'doctor-test', 'filler')").await.ok()?;
                client.batch_execute("SELECT pg_switch_wal()").await.ok()?;
            }
            client.batch_execute("CHECKPOINT").await.ok()?;
            let row = client.query_opt("SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", &[slot]).await.ok()??;
            (row.get::<_, Option<String>>(0).as_deref() == Some("lost")).then_some(())
        }
    })
    .await;
    let d = doctor(&config, &[]).await;
    d.assert_problem("slot", "is lost (wal_status lost)", "it recreates the slot and re-announces the pending Deliveries");
    assert_eq!(d.verdict("slot_lag"), "skipped");
    assert_eq!(d.verdict("relay_streaming"), "skipped");
    let d = doctor_with(&config, &[], &[("RAILHOOK_RELAY__RECREATE_LOST_SLOT", "false".into())]).await;
    d.assert_problem("slot", "is lost", "railhook slot drop --confirm");

    // What the relay does about it: drop and create again.
    client.execute("SELECT pg_drop_replication_slot($1)", &[&config.relay.slot_name]).await.unwrap();
    client.execute("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", &[&config.relay.slot_name]).await.unwrap();
    doctor(&config, &[]).await.assert_ok("slot");
}

#[tokio::test]
async fn missing_topics_and_too_few_partitions_are_problems() {
    let db = TestDb::new().await;
    let config = test_config(&db);
    let d = doctor(&config, &[]).await;
    d.assert_ok("kafka");
    d.assert_problem("deliveries_topic", &format!("topic {} (kafka.deliveries_topic) does not exist", config.deliveries_topic()), "kafka-topics.sh");
    d.assert_problem("forwards_topic", "does not exist", "--create");
    doctor(&config, &["--preflight"]).await.assert_ok("deliveries_topic");

    // Made elsewhere with one partition, while kafka.partitions says 3.
    create_topics(&config, 1).await;
    let d = eventually(Duration::from_secs(10), "the topics in the metadata", || {
        let config = &config;
        async move {
            let d = doctor(config, &[]).await;
            (d.verdict("deliveries_topic") == "problem" && d.check("deliveries_topic")["detail"].as_str()?.contains("1 partition")).then_some(d)
        }
    })
    .await;
    d.assert_problem("deliveries_topic", "has 1 partition(s), fewer than kafka.partitions = 3", &format!("--alter --topic {} --partitions 3", config.deliveries_topic()));
    // With the configuration matching the topics, fine.
    doctor_with(&config, &[], &[("RAILHOOK_KAFKA__PARTITIONS", "1".into())]).await.assert_ok("deliveries_topic");
}

#[tokio::test]
async fn a_clock_away_from_the_databases_is_a_problem() {
    let db = TestDb::new().await;
    let config = test_config(&db);
    let d = doctor(&config, &[]).await;
    d.assert_ok("clock");
    // This host's clock 30 s ahead, as the chaos suite's clock_skew sets a worker's.
    let d = doctor_with(&config, &[], &[("RAILHOOK_FAILPOINT_CLOCK_AHEAD_MS", "30000".into())]).await;
    d.assert_problem("clock", "ms ahead of the database's", "NTP");
    let detail = d.check("clock")["detail"].as_str().unwrap();
    // About 30,000 ms (a sample's round trip either way: 29999.9 is as right as 30000.1).
    let ahead: f64 = detail.strip_prefix("this host's clock is ").and_then(|r| r.split(' ').next()).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{detail}"));
    assert!((29_000.0..31_000.0).contains(&ahead) && detail.contains("more than 1000 ms"), "{detail}");
}

#[tokio::test]
async fn unreachable_postgres_or_kafka_exits_2() {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    let closed = railhook_testkit::free_port();
    config.database.url = format!("postgres://railhook@127.0.0.1:{closed}/railhook?sslmode=disable");
    let d = doctor(&config, &[]).await;
    assert_eq!(d.code, 2, "{}", d.stdout);
    d.assert_problem_any_code("postgres", "cannot connect to", "database.url");
    assert_eq!(d.verdict("wal_level"), "skipped");
    assert_eq!(d.verdict("clock"), "skipped");
    d.assert_ok("kafka");

    let mut config = test_config(&db);
    config.kafka.brokers = format!("127.0.0.1:{closed}");
    let d = doctor_with(&config, &["--timeout", "2"], &[]).await;
    assert_eq!(d.code, 2, "{}", d.stdout);
    d.assert_problem_any_code("kafka", "no answer from the brokers", "kafka.brokers");
    assert_eq!(d.verdict("deliveries_topic"), "skipped");
    d.assert_ok("wal_level");

    // The inline transport uses no Kafka: the same unreachable brokers are not asked.
    let d = doctor_with(&config, &["--timeout", "2"], &[("RAILHOOK_TRANSPORT", "inline".into())]).await;
    for name in ["kafka", "deliveries_topic", "forwards_topic"] {
        assert_eq!(d.verdict(name), "skipped", "{name}: {}", d.stdout);
    }
    assert_ne!(d.code, 2, "nothing unreachable that the inline transport needs: {}", d.stdout);
}

impl Doctor {
    fn assert_problem_any_code(&self, name: &str, detail: &str, fix: &str) {
        let check = self.check(name);
        assert_eq!(check["verdict"], "problem", "{name}: {}", self.stdout);
        assert!(check["detail"].as_str().unwrap_or("").contains(detail), "{name}: {}", self.stdout);
        assert!(check["fix"].as_str().unwrap_or("").contains(fix), "{name}: {}", self.stdout);
    }
}
