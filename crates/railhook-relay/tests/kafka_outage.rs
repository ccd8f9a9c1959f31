//! Kafka stopped for 30 s under the CDC relay (a private broker, so other tests keep theirs):
//! nothing is lost, and the slot does not move past what Kafka acknowledged.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use railhook_relay::{RelayMetrics, RelayStats};
use railhook_testkit::kafka::KafkaBroker;
use railhook_testkit::relay::{all_announced, current_lsn, insert_outbox, slot, Announcements};
use railhook_testkit::{eventually, test_config, TestDb};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

fn ids(deliveries: &[Uuid]) -> Vec<String> {
    deliveries.iter().map(|d| railhook_core::DeliveryId(*d).to_string()).collect()
}

#[tokio::test]
async fn kafka_down_for_30_s_loses_nothing_and_holds_the_slot() {
    let mut broker = KafkaBroker::start().await;
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.kafka.brokers = broker.brokers();
    config.kafka.partitions = 3;
    config.relay.status_interval_ms = 200;
    // Reconnect soon after the broker is back (librdkafka backs off up to 10 s by default).
    config.kafka.properties.insert("reconnect.backoff.max.ms".into(), "1000".into());
    let config = Arc::new(config);
    let client = db.client().await;
    let metrics = RelayMetrics::new(Arc::new(RelayStats::default()));
    let shutdown = CancellationToken::new();
    let relay = tokio::spawn(railhook_relay::run(config.clone(), metrics.clone(), shutdown.clone()));
    eventually(Duration::from_secs(60), "the relay stream to be live", || async {
        metrics.stats.live.load(Ordering::Relaxed).then_some(())
    })
    .await;

    let project = Uuid::now_v7();
    let routes: Vec<Uuid> = (0..8).map(|_| Uuid::now_v7()).collect();
    let mut committed = Vec::new();
    for _ in 0..10 {
        committed.extend(ids(&insert_outbox(&client, project, &routes).await));
    }
    eventually(Duration::from_secs(60), "the first rows acknowledged", || async {
        (metrics.stats.produced.load(Ordering::Relaxed) >= 80).then_some(())
    })
    .await;

    broker.stop().await;
    // The slot may pass WAL the cluster's other databases write meanwhile (an idle relay
    // confirms the walsender's keepalive positions), never the outage's commits: the
    // reference is read right after the first of them (read before it, other tests' WAL in
    // between failed this test once under scripts/test's load).
    committed.extend(ids(&insert_outbox(&client, project, &routes).await));
    let before_outage = current_lsn(&client).await;
    for _ in 1..10 {
        committed.extend(ids(&insert_outbox(&client, project, &routes).await));
    }
    let outage_started = Instant::now();
    let mut highest = 0;
    // Kafka stays down for 30 s; meanwhile the slot must not pass the commits it holds.
    while outage_started.elapsed() < Duration::from_secs(30) {
        let (confirmed, _) = slot(&client, &config.relay.slot_name).await.expect("slot exists");
        highest = highest.max(confirmed);
        assert!(confirmed <= before_outage, "slot advanced to {confirmed:X} past {before_outage:X} while Kafka was down");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(!relay.is_finished(), "the relay waits for Kafka instead of failing");
    assert_eq!(metrics.stats.produced.load(Ordering::Relaxed), 80, "nothing acknowledged while Kafka was down");

    let restarted = Instant::now();
    broker.restart().await;
    let last = current_lsn(&client).await;
    let mut seen = Announcements::subscribe_at(&config, &broker.brokers(), &config.deliveries_topic());
    seen.until(Duration::from_secs(120), "every row after Kafka came back", |s| all_announced(s, &committed)).await;
    let recovered = restarted.elapsed();
    eventually(Duration::from_secs(60), "the slot to pass the last commit", || {
        let (client, name) = (&client, &config.relay.slot_name);
        async move { (slot(client, name).await?.0 >= last).then_some(()) }
    })
    .await;
    eprintln!(
        "Kafka outage 30 s: slot held at or below {highest:X} (outage started at {before_outage:X}); all {} rows in Kafka {recovered:?} after the broker restart began; {} errors",
        committed.len(),
        metrics.stats.produce_errors.load(Ordering::Relaxed)
    );
    shutdown.cancel();
    relay.await.unwrap().unwrap();
    eventually(Duration::from_secs(30), "the slot to be dropped", || {
        let (client, name) = (&client, &config.relay.slot_name);
        async move { client.execute("SELECT pg_drop_replication_slot($1)", &[name]).await.ok().map(|_| ()) }
    })
    .await;
}
