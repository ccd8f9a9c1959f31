//! The CDC relay against the real Postgres and Kafka.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Headers;
use rdkafka::Message;
use railhook_relay::RelayStats;
use railhook_testkit::{eventually, test_config, TestDb};
use tokio_util::sync::CancellationToken;

async fn confirmed_flush(client: &tokio_postgres::Client, slot: &str) -> u64 {
    let lsn: String = client
        .query_one("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", &[&slot])
        .await
        .unwrap()
        .get(0);
    lsn.parse::<railhook_core::Lsn>().unwrap().0
}

/// Ignored in scripts/test for now: before the relay raised the applied LSN only on increases,
/// about one run in three stalled (the stream stopped delivering until more WAL arrived).
/// Since that change it passed 20 of 20 runs; it goes back into scripts/test once it has
/// more runs behind it. Run it with `cargo test -p railhook-relay -- --ignored`.
#[tokio::test]
#[ignore = "intermittent stall of the replication stream; see the relay issue notes"]
async fn relays_committed_inserts_in_order_per_key_and_confirms_after_acks() {
    let db = TestDb::new().await;
    let config = Arc::new(test_config(&db));
    let client = db.client().await;
    let stats = Arc::new(RelayStats::default());
    let shutdown = CancellationToken::new();
    let relay = tokio::spawn(railhook_relay::run(config.clone(), stats.clone(), shutdown.clone()));
    // The relay creates the slot; wait for it.
    let slot = config.relay.slot_name.clone();
    eventually(Duration::from_secs(30), "the slot", || {
        let client = &client;
        let slot = slot.clone();
        async move { client.query_opt("SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active", &[&slot]).await.unwrap().map(|_| ()) }
    })
    .await;

    let project = uuid::Uuid::now_v7();
    let endpoints: Vec<uuid::Uuid> = (0..4).map(|_| uuid::Uuid::now_v7()).collect();
    let mut expected: HashMap<String, Vec<String>> = HashMap::new();
    for txn in 0..20 {
        let deliveries: Vec<uuid::Uuid> = (0..25).map(|_| uuid::Uuid::now_v7()).collect();
        let routes: Vec<uuid::Uuid> = (0..25).map(|i| endpoints[(txn + i) % 4]).collect();
        client
            .execute(
                "INSERT INTO outbox (project_id, delivery_id, routing_id, reason)
                 SELECT $1, d, r, 'created' FROM unnest($2::uuid[], $3::uuid[]) AS t(d, r)",
                &[&project, &deliveries, &routes],
            )
            .await
            .unwrap();
        for (d, r) in deliveries.iter().zip(&routes) {
            expected.entry(railhook_core::EndpointId(*r).to_string()).or_default().push(railhook_core::DeliveryId(*d).to_string());
        }
    }
    let last_commit: String = client.query_one("SELECT pg_current_wal_lsn()::text", &[]).await.unwrap().get(0);
    let last_commit = last_commit.parse::<railhook_core::Lsn>().unwrap().0;

    let consumer: StreamConsumer = railhook_kafka::client_config(&config.kafka)
        .set("group.id", format!("{}check", config.kafka.topic_prefix))
        .set("auto.offset.reset", "earliest")
        // The topic is seconds old: look for it again soon rather than after 5 minutes.
        .set("topic.metadata.refresh.interval.ms", "500")
        .create()
        .unwrap();
    consumer.subscribe(&[&config.deliveries_topic()]).unwrap();
    let mut got: HashMap<String, Vec<String>> = HashMap::new();
    let mut stream = consumer.stream();
    for _ in 0..500 {
        let next = tokio::time::timeout(Duration::from_secs(60), stream.next()).await;
        if next.is_err() && relay.is_finished() {
            panic!("relay ended: {:?}", relay.await);
        }
        let Ok(msg) = next else {
            panic!("timed out; relay read {}, produced {} with {} errors; got {} so far", stats.read.load(std::sync::atomic::Ordering::Relaxed), stats.produced.load(std::sync::atomic::Ordering::Relaxed), stats.produce_errors.load(std::sync::atomic::Ordering::Relaxed), got.values().map(Vec::len).sum::<usize>());
        };
        let msg = msg.unwrap().unwrap();
        let key = String::from_utf8(msg.key().unwrap().to_vec()).unwrap();
        let value: serde_json::Value = serde_json::from_slice(msg.payload().unwrap()).unwrap();
        assert_eq!(value["v"], 1);
        assert_eq!(value["reason"], "created");
        let headers = msg.headers().unwrap();
        let names: Vec<&str> = (0..headers.count()).map(|i| headers.get(i).key).collect();
        assert_eq!(names, ["outbox_id", "commit_lsn"]);
        assert_eq!(headers.get(0).value.unwrap(), value["outbox_id"].to_string().as_bytes());
        got.entry(key).or_default().push(value["delivery_id"].as_str().unwrap().to_string());
    }
    assert_eq!(got, expected, "every row once, in commit order per key");

    // The slot advances to (at least) the last commit once everything is acknowledged.
    eventually(Duration::from_secs(30), "the slot to confirm the last commit", || {
        let client = &client;
        let slot = slot.clone();
        async move { (confirmed_flush(client, &slot).await >= last_commit).then_some(()) }
    })
    .await;
    assert_eq!(stats.produced.load(std::sync::atomic::Ordering::Relaxed), 500);

    shutdown.cancel();
    relay.await.unwrap().unwrap();
    client.query_one("SELECT pg_drop_replication_slot($1)", &[&slot]).await.unwrap();
}

#[tokio::test]
async fn refuses_a_publication_that_publishes_updates() {
    let db = TestDb::new().await;
    let config = Arc::new(test_config(&db));
    let client = db.client().await;
    client.batch_execute(&format!("CREATE PUBLICATION {} FOR TABLE outbox", config.relay.publication_name)).await.unwrap();
    let err = railhook_relay::run(config, Arc::new(RelayStats::default()), CancellationToken::new()).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("publish inserts only") && text.contains("ALTER PUBLICATION"), "{text}");
}
