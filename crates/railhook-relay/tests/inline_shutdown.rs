//! A clean Postgres stop is not held up by the relay while the inline transport's
//! acknowledgements cannot come (a private cluster, so other tests keep theirs).
//!
//! On inline an acknowledgement is the end of a hint's claim step, and claims need Postgres.
//! A fast shutdown (`pg_ctl -m fast stop`) terminates the sessions and then waits for each
//! walsender's client to confirm what it was sent: with hints waiting for claims that could
//! no longer be made, it waited for ever (the chaos suite's `postgres_restart` on inline,
//! docs/RELIABILITY.md "On the inline transport"). The relay now ends its stream unconfirmed
//! when Postgres says it is shutting down; the next stream reads those commits again.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use railhook_kafka::announcement::Target;
use railhook_relay::{RelayMetrics, RelayStats};
use railhook_testkit::pg::PgCluster;
use railhook_testkit::relay::insert_outbox;
use railhook_testkit::eventually;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[tokio::test]
async fn a_clean_postgres_stop_is_not_held_by_hints_waiting_for_their_claims() {
    let mut pg = PgCluster::start().await;
    let admin = railhook_testkit::connect(&pg.url("postgres")).await.expect("connect to the private Postgres");
    admin.batch_execute("CREATE DATABASE railhook").await.expect("create database");
    drop(admin);
    let url = pg.url("railhook");
    let mut migrations = railhook_testkit::connect(&url).await.expect("connect");
    railhook_store::Migrator::embedded().run(&mut migrations).await.expect("migrate");
    drop(migrations);

    let mut config = railhook_config::Config::default();
    config.database.url = url.clone();
    config.kafka.brokers = String::new();
    config.transport = railhook_config::Transport::Inline;
    config.relay.status_interval_ms = 200;
    let config = Arc::new(config);
    let (tx, mut rx) = railhook_kafka::inline::channel(1_000);
    let metrics = RelayMetrics::new(Arc::new(RelayStats::default()));
    let shutdown = CancellationToken::new();
    let relay = tokio::spawn(railhook_relay::run_with(config.clone(), metrics.clone(), Some(tx), shutdown.clone()));
    eventually(Duration::from_secs(60), "the relay stream to be live", || async { metrics.stats.live.load(Ordering::Relaxed).then_some(()) }).await;

    // Hints the "worker" takes and holds: their claim steps never end, as when the claims
    // cannot reach Postgres.
    let client = railhook_testkit::connect(&url).await.expect("connect");
    let routes: Vec<Uuid> = (0..5).map(|_| Uuid::now_v7()).collect();
    let committed: HashSet<Uuid> = insert_outbox(&client, Uuid::now_v7(), &routes).await.into_iter().collect();
    drop(client);
    let mut held = Vec::new();
    while held.len() < committed.len() {
        let hint = tokio::time::timeout(Duration::from_secs(30), rx.deliveries.recv()).await.expect("the hints within 30 s").expect("the relay runs");
        held.push(hint);
    }

    let started = Instant::now();
    let stopped = pg.try_stop().await;
    let took = started.elapsed();
    assert!(stopped.is_ok(), "a clean stop with hints unacknowledged: {stopped:?}");
    assert!(took < Duration::from_secs(30), "the clean stop took {took:?}");
    eprintln!("clean stop with {} hints unacknowledged: {took:?}", held.len());

    // After the restart the relay reads those commits again: each hint comes a second time.
    pg.start_again().await;
    let mut again = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    while again.len() < committed.len() && Instant::now() < deadline {
        if let Ok(Some(hint)) = tokio::time::timeout(Duration::from_secs(1), rx.deliveries.recv()).await {
            if let Target::Delivery { delivery, .. } = hint.announcement.target {
                if committed.contains(&delivery.0) {
                    again.insert(delivery.0);
                }
            }
            hint.ack.done();
        }
    }
    assert_eq!(again.len(), committed.len(), "every hint came again from the slot after the restart");
    drop(held);
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), relay).await;
}
