//! Produce to and consume from the real Kafka with the relay's producer settings.

use std::time::Duration;

use futures::StreamExt;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use rdkafka::Message;
use railhook_config::KafkaConfig;

#[tokio::test]
async fn idempotent_producer_round_trip_preserves_order_per_key() {
    let kafka = KafkaConfig {
        brokers: railhook_testkit::kafka_brokers(),
        topic_prefix: railhook_testkit::topic_prefix(),
        partitions: 3,
        ..KafkaConfig::default()
    };
    let topic = format!("{}roundtrip", kafka.topic_prefix);
    railhook_kafka::ensure_topics(&kafka, std::slice::from_ref(&topic)).await.unwrap();
    // Creating it twice is fine.
    railhook_kafka::ensure_topics(&kafka, std::slice::from_ref(&topic)).await.unwrap();
    assert!(railhook_kafka::check_reachable(&kafka, Duration::from_secs(10)).await.unwrap() >= 1);

    let config = railhook_kafka::idempotent_producer_config(&kafka, 10_000);
    assert_eq!(config.get("enable.idempotence"), Some("true"));
    assert_eq!(config.get("acks"), Some("all"));
    // One produce request in flight (a burst goes in batches), unless the properties say more;
    // the round trip below keeps each key's order with it.
    assert_eq!(config.get("max.in.flight.requests.per.connection"), Some("1"));
    let mut more = kafka.clone();
    more.properties.insert("max.in.flight.requests.per.connection".into(), "5".into());
    assert_eq!(railhook_kafka::idempotent_producer_config(&more, 10_000).get("max.in.flight.requests.per.connection"), Some("5"));
    let producer = railhook_kafka::idempotent_producer(&kafka, 10_000).unwrap();

    const PER_KEY: usize = 200;
    let keys = ["ep_a", "ep_b", "ep_c", "ep_d"];
    let mut sends = Vec::new();
    for i in 0..PER_KEY {
        for key in keys {
            let payload = format!("{key}:{i}");
            let headers = OwnedHeaders::new().insert(Header { key: "outbox_id", value: Some(&i.to_string()) });
            let record = FutureRecord::to(&topic).key(key).payload(&payload).headers(headers);
            sends.push(producer.send_result(record).unwrap());
        }
    }
    for send in sends {
        send.await.unwrap().map_err(|(e, _)| e).unwrap();
    }

    let consumer: StreamConsumer = railhook_kafka::client_config(&kafka)
        .set("group.id", format!("{}group", kafka.topic_prefix))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[&topic]).unwrap();
    let mut seen: std::collections::HashMap<String, Vec<usize>> = Default::default();
    let mut stream = consumer.stream();
    let total = PER_KEY * keys.len();
    let mut count = 0;
    while count < total {
        let msg = tokio::time::timeout(Duration::from_secs(60), stream.next())
            .await
            .expect("consumed everything within 60 s")
            .expect("stream ended")
            .unwrap();
        let text = std::str::from_utf8(msg.payload().unwrap()).unwrap().to_string();
        let (key, i) = text.split_once(':').unwrap();
        assert_eq!(msg.key(), Some(key.as_bytes()));
        let header = msg.headers().unwrap().get(0);
        assert_eq!(header.key, "outbox_id");
        assert_eq!(header.value, Some(i.as_bytes()));
        seen.entry(key.to_string()).or_default().push(i.parse().unwrap());
        count += 1;
    }
    for key in keys {
        let got = &seen[key];
        assert_eq!(got, &(0..PER_KEY).collect::<Vec<_>>(), "order of key {key}");
    }
}
