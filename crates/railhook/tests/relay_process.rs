//! `railhook relay` as a process: kill -9, SIGTERM, a standby taking over, and a 100k-row
//! transaction, against the real Postgres and Kafka.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use railhook_config::Config;
use railhook_testkit::relay::{all_announced, current_lsn, insert_outbox, slot, Announcements};
use railhook_testkit::{eventually, test_config, TestDb};
use uuid::Uuid;

struct RelayProcess {
    child: Child,
    ops: u16,
    log: PathBuf,
}

impl RelayProcess {
    fn spawn(config: &Config) -> RelayProcess {
        Self::spawn_with(config, &[])
    }

    fn spawn_with(config: &Config, env: &[(&str, &str)]) -> RelayProcess {
        let ops = railhook_testkit::free_port();
        let log = std::env::temp_dir().join(format!("railhook-relay-{}.log", Uuid::new_v4().simple()));
        let child = Command::new(env!("CARGO_BIN_EXE_railhook"))
            .arg("relay")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RAILHOOK_DATABASE_URL", &config.database.url)
            .env("RAILHOOK_KAFKA_BROKERS", &config.kafka.brokers)
            .env("RAILHOOK_KAFKA__TOPIC_PREFIX", &config.kafka.topic_prefix)
            .env("RAILHOOK_KAFKA__PARTITIONS", config.kafka.partitions.to_string())
            .env("RAILHOOK_RELAY__SLOT_NAME", &config.relay.slot_name)
            .env("RAILHOOK_RELAY__STATUS_INTERVAL_MS", "200")
            .env("RAILHOOK_RELAY__OPS_LISTEN", format!("127.0.0.1:{ops}"))
            .env("RAILHOOK_TELEMETRY__LOG_FILTER", "info")
            .envs(env.iter().copied())
            .current_dir(std::env::temp_dir())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn railhook relay");
        RelayProcess { child, ops, log }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// A metric's value from the relay's own /metrics (first series of that name).
    async fn metric(&self, name: &str) -> Option<f64> {
        let body = reqwest::get(format!("http://127.0.0.1:{}/metrics", self.ops)).await.ok()?.text().await.ok()?;
        body.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    async fn wait_metric(&self, name: &str, want: f64, within: Duration) {
        let what = format!("{name} = {want}");
        let deadline = Instant::now() + within;
        while self.metric(name).await != Some(want) {
            if Instant::now() > deadline {
                panic!("timed out waiting for {what}; relay log:\n{}", self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn live(&self) {
        self.wait_metric("railhook_relay_stream_live", 1.0, Duration::from_secs(60)).await
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([&format!("-{signal}"), &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit; its exit code.
    async fn exited(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            if Instant::now() > deadline {
                panic!("relay did not exit within {within:?}; log:\n{}", self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

async fn drop_slot(client: &tokio_postgres::Client, name: &str) {
    eventually(Duration::from_secs(30), "the slot to be dropped", || async move {
        client.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", &[&name]).await.ok().map(|_| ())
    })
    .await
}

fn ids(deliveries: &[Uuid]) -> Vec<String> {
    deliveries.iter().map(|d| railhook_core::DeliveryId(*d).to_string()).collect()
}

/// kill -9 while rows stream, twice; after the restart every committed row is in Kafka.
#[tokio::test]
async fn kill_9_mid_stream_loses_nothing() {
    let db = TestDb::new().await;
    let config = test_config(&db);
    let client = db.client().await;
    let mut relay = RelayProcess::spawn(&config);
    relay.live().await;

    let project = Uuid::now_v7();
    let routes: Vec<Uuid> = (0..20).map(|_| Uuid::now_v7()).collect();
    let mut committed = Vec::new();
    for round in 0..2 {
        // Load, with the kill landing while rows are in flight.
        let before = relay.metric("railhook_relay_messages_produced_total").await.unwrap_or(0.0);
        loop {
            committed.extend(ids(&insert_outbox(&client, project, &routes).await));
            let produced = relay.metric("railhook_relay_messages_produced_total").await.unwrap_or(0.0);
            if produced > before + 500.0 {
                break;
            }
        }
        relay.signal("KILL");
        assert_eq!(relay.exited(Duration::from_secs(10)).await, None, "killed by a signal");
        // Commits while no relay runs.
        for _ in 0..10 {
            committed.extend(ids(&insert_outbox(&client, project, &routes).await));
        }
        eprintln!("kill -9 round {round}: {} rows committed so far", committed.len());
        relay = RelayProcess::spawn(&config);
        relay.live().await;
    }
    for _ in 0..10 {
        committed.extend(ids(&insert_outbox(&client, project, &routes).await));
    }
    let mut seen = Announcements::subscribe(&config, &config.deliveries_topic());
    let want = committed.len();
    seen.until(Duration::from_secs(120), "every committed row", |s| s.len() >= want && all_announced(s, &committed)).await;
    let duplicates = seen.seen.len() - want;
    eprintln!("kill -9: {want} rows committed, {} announcements ({duplicates} duplicates from replays)", seen.seen.len());
    relay.signal("TERM");
    assert_eq!(relay.exited(Duration::from_secs(30)).await, Some(0));
    drop_slot(&client, &config.relay.slot_name).await;
}

/// SIGTERM drains the producer and confirms the final position: with status updates only
/// every 20 s, the slot is still behind the last commit when the signal arrives, and at or
/// past it once the process exited 0.
#[tokio::test]
async fn sigterm_flushes_and_confirms_before_exit() {
    let db = TestDb::new().await;
    let config = test_config(&db);
    let client = db.client().await;
    let mut relay = RelayProcess::spawn_with(&config, &[("RAILHOOK_RELAY__STATUS_INTERVAL_MS", "20000")]);
    relay.live().await;
    let project = Uuid::now_v7();
    let routes: Vec<Uuid> = (0..50).map(|_| Uuid::now_v7()).collect();
    let mut committed = Vec::new();
    for _ in 0..20 {
        committed.extend(ids(&insert_outbox(&client, project, &routes).await));
    }
    let last = current_lsn(&client).await;
    let mut seen = Announcements::subscribe(&config, &config.deliveries_topic());
    seen.until(Duration::from_secs(60), "the rows", |s| s.len() >= committed.len()).await;
    let (before, _) = slot(&client, &config.relay.slot_name).await.unwrap();
    assert!(before < last, "precondition: no status update carried the last commit yet ({before:X} vs {last:X})");
    let started = Instant::now();
    relay.signal("TERM");
    assert_eq!(relay.exited(Duration::from_secs(30)).await, Some(0), "log:\n{}", relay.log_tail());
    let stop = started.elapsed();
    let (confirmed, pid) = slot(&client, &config.relay.slot_name).await.unwrap();
    assert!(confirmed >= last, "slot at {confirmed:X}, last commit {last:X}");
    assert_eq!(pid, None, "the slot is released");
    eprintln!("SIGTERM: exited 0 after {stop:?}; slot moved from {before:X} to {confirmed:X} (last commit {last:X})");
    drop_slot(&client, &config.relay.slot_name).await;
}

/// A second relay on the same slot waits as a standby (and says so in a metric), then takes
/// over within seconds when the active one is killed.
#[tokio::test]
async fn a_standby_takes_over_when_the_active_relay_dies() {
    let db = TestDb::new().await;
    let config = test_config(&db);
    let client = db.client().await;
    let active = RelayProcess::spawn(&config);
    active.live().await;
    let standby = RelayProcess::spawn(&config);
    standby.wait_metric("railhook_relay_standby", 1.0, Duration::from_secs(30)).await;
    assert_eq!(active.metric("railhook_relay_standby").await, Some(0.0));
    let project = Uuid::now_v7();
    let routes: Vec<Uuid> = (0..10).map(|_| Uuid::now_v7()).collect();
    let mut committed = ids(&insert_outbox(&client, project, &routes).await);

    let killed = Instant::now();
    active.signal("KILL");
    standby.live().await;
    let takeover = killed.elapsed();
    assert_eq!(standby.metric("railhook_relay_standby").await, Some(0.0));
    committed.extend(ids(&insert_outbox(&client, project, &routes).await));
    let mut seen = Announcements::subscribe(&config, &config.deliveries_topic());
    seen.until(Duration::from_secs(60), "rows from before and after the takeover", |s| all_announced(s, &committed)).await;
    eprintln!("standby took over {takeover:?} after kill -9 of the active relay");
    assert!(takeover < Duration::from_secs(10), "takeover took {takeover:?}");
    drop(active);
    drop(standby);
    drop_slot(&client, &config.relay.slot_name).await;
}

/// Peak resident memory of a process, from /proc.
fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap()
}

/// One transaction of 100,000 outbox inserts is relayed completely, and the relay's peak
/// memory grows by much less than the transaction would take if it were held whole.
#[tokio::test]
async fn a_100k_row_transaction_is_relayed_in_bounded_memory() {
    let db = TestDb::new().await;
    let config = test_config(&db);
    let client = db.client().await;
    let relay = RelayProcess::spawn(&config);
    relay.live().await;
    let mut seen = Announcements::subscribe(&config, &config.deliveries_topic());
    // Warm-up: a small transaction first, so the baseline includes the producer's buffers.
    let project = Uuid::now_v7();
    let routes: Vec<Uuid> = (0..64).map(|_| Uuid::now_v7()).collect();
    client
        .execute("INSERT INTO outbox (project_id, delivery_id, routing_id, reason) SELECT $1, gen_random_uuid(), ($2::uuid[])[1 + g % 64], 'created' FROM generate_series(1, 1000) g", &[&project, &routes])
        .await
        .unwrap();
    seen.until(Duration::from_secs(60), "the warm-up rows", |s| s.len() >= 1_000).await;
    let baseline = vm_hwm_kib(relay.child.id());

    let started = Instant::now();
    client
        .execute("INSERT INTO outbox (project_id, delivery_id, routing_id, reason) SELECT $1, gen_random_uuid(), ($2::uuid[])[1 + g % 64], 'created' FROM generate_series(1, 100000) g", &[&project, &routes])
        .await
        .unwrap();
    seen.until(Duration::from_secs(300), "100,000 rows of one transaction", |s| s.len() >= 101_000).await;
    let took = started.elapsed();
    let peak = vm_hwm_kib(relay.child.id());
    let distinct: std::collections::HashSet<i64> = seen.seen.iter().map(|a| a.outbox_id).collect();
    assert_eq!(distinct.len(), 101_000, "every row of the transaction");
    let grew = peak.saturating_sub(baseline);
    eprintln!("100k-row transaction: relayed in {took:?}; relay peak RSS {baseline} KiB -> {peak} KiB (+{grew} KiB)");
    // Held whole, 100k announcements with their futures and headers take well over 100 MiB.
    assert!(grew < 96 * 1024, "peak memory grew by {grew} KiB");
    drop(relay);
    drop_slot(&client, &config.relay.slot_name).await;
}

/// `railhook slot status` and `railhook slot drop` as an operator runs them.
#[tokio::test]
async fn slot_status_and_drop_report_and_decommission() {
    let db = TestDb::new().await;
    let config = test_config(&db);
    let client = db.client().await;
    let cli = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_railhook"))
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RAILHOOK_DATABASE_URL", &config.database.url)
            .env("RAILHOOK_RELAY__SLOT_NAME", &config.relay.slot_name)
            .current_dir(std::env::temp_dir())
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, _, err) = cli(&["slot", "status"]);
    assert_eq!(code, Some(3), "missing slot: {err}");
    assert!(err.contains("does not exist"), "{err}");

    let mut relay = RelayProcess::spawn(&config);
    relay.live().await;
    let (code, out, err) = cli(&["slot", "status", "--json"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status["healthy"], true);
    assert_eq!(status["active"], true);
    assert_eq!(status["wal_status"], "reserved");
    assert!(status["lag_bytes"].is_i64() && status["retained_bytes"].is_i64(), "{status}");
    let (code, _, err) = cli(&["slot", "drop"]);
    assert_eq!(code, Some(2), "drop needs --confirm: {err}");
    let (code, _, err) = cli(&["slot", "drop", "--confirm"]);
    assert_eq!(code, Some(4), "refused while a relay streams: {err}");
    assert!(slot(&client, &config.relay.slot_name).await.is_some());

    relay.signal("TERM");
    assert_eq!(relay.exited(Duration::from_secs(30)).await, Some(0));
    let (code, _, err) = cli(&["slot", "status", "--max-inactive", "1"]);
    assert_eq!(code, Some(5), "inactive: {err}");
    let (code, out, err) = cli(&["slot", "drop", "--confirm"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(slot(&client, &config.relay.slot_name).await.is_none(), "dropped");
}
