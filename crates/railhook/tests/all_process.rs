//! `railhook all` as a process: supervised, so a component that stops on its own takes the
//! process down (non-zero) instead of leaving an API that accepts Events nobody delivers.

use std::process::Stdio;
use std::time::Duration;

use railhook_testkit::{test_config, TestDb};

#[tokio::test]
async fn a_worker_that_fails_stops_the_whole_process() {
    let db = TestDb::new().await;
    let config = test_config(&db);
    // A fatal error in the worker alone: its Kafka consumer cannot join a group with an
    // empty group id (the API and the relay do not use it).
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_railhook"))
        .arg("all")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RAILHOOK_DATABASE_URL", &config.database.url)
        .env("RAILHOOK_KAFKA_BROKERS", &config.kafka.brokers)
        .env("RAILHOOK_KAFKA__TOPIC_PREFIX", &config.kafka.topic_prefix)
        .env("RAILHOOK_KAFKA__PARTITIONS", config.kafka.partitions.to_string())
        .env("RAILHOOK_RELAY__SLOT_NAME", &config.relay.slot_name)
        .env("RAILHOOK_API__LISTEN", format!("127.0.0.1:{}", railhook_testkit::free_port()))
        .env("RAILHOOK_WORKER__GROUP_ID", "")
        .env("RAILHOOK_TELEMETRY__LOG_FILTER", "info")
        .current_dir(std::env::temp_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn railhook all");
    let mut stderr = child.stderr.take().unwrap();
    let log = tokio::spawn(async move {
        let mut text = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut text).await.ok();
        text
    });
    let status = tokio::time::timeout(Duration::from_secs(90), child.wait()).await;
    let log = match status {
        Ok(_) => log.await.unwrap(),
        Err(_) => {
            child.kill().await.ok();
            panic!("railhook all kept running without its worker:\n{}", log.await.unwrap());
        }
    };
    let status = status.unwrap().unwrap();
    assert!(!status.success(), "exit status {status:?}; log:\n{log}");
    assert!(log.contains("worker failed"), "the error names the worker:\n{log}");
    // The relay was stopped by the supervisor (a drain), not left behind.
    assert!(log.contains("component failed; stopping the others"), "{log}");
    let slot_active: Option<bool> = db
        .client()
        .await
        .query_opt("SELECT active FROM pg_replication_slots WHERE slot_name = $1", &[&config.relay.slot_name])
        .await
        .unwrap()
        .map(|r| r.get(0));
    assert_ne!(slot_active, Some(true), "the relay's walsender is gone with the process");
}
