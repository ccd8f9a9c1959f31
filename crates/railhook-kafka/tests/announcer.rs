//! The Announcer against the real Kafka: topics, key, headers and value as the worker reads
//! them, and the full-queue wait (a producer queue far smaller than what is sent).

use std::time::Duration;

use futures::StreamExt;
use railhook_config::Config;
use railhook_core::{AnnouncementReason, ClaimToken, DeliveryId, DestinationId, EndpointId, ForwardId, Lsn};
use railhook_kafka::announcement::header;
use railhook_kafka::{Announcement, Announcer, Stamp, Target};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Headers;
use rdkafka::Message;

#[tokio::test]
async fn announcements_arrive_as_the_worker_reads_them_even_through_a_full_queue() {
    let mut config = Config::default();
    config.kafka.brokers = railhook_testkit::kafka_brokers();
    config.kafka.topic_prefix = railhook_testkit::topic_prefix();
    railhook_kafka::ensure_topics(&config.kafka, &railhook_kafka::announcement::topics(&config)).await.unwrap();
    // A queue of 4 messages: most sends below find it full and must wait, not fail.
    let announcer = Announcer::new(railhook_kafka::idempotent_producer(&config.kafka, 4).unwrap(), &config);

    const N: i64 = 200;
    let mut sent = Vec::new();
    let mut acks = Vec::new();
    for i in 0..N {
        let target = if i % 10 == 9 {
            Target::Forward { forward: ForwardId::new(), destination: DestinationId::new() }
        } else {
            Target::Delivery { delivery: DeliveryId::new(), endpoint: EndpointId::new() }
        };
        let claim_token = (i % 3 == 0).then(ClaimToken::new);
        let a = Announcement { outbox_id: i, target, reason: AnnouncementReason::Created, claim_token, created_at: format!("t{i}"), trace: None };
        let lsn = (i % 2 == 0).then_some(Lsn(1000 + i as u64));
        let stamp = Stamp { commit_lsn: lsn, commit_time_us: lsn.map(|_| 1_700_000_000_000_000 + i), relay_read_us: Some(1_700_000_000_000_500 + i) };
        acks.push(announcer.send(&a, &stamp).await.expect("handed over, after waiting while the queue was full"));
        sent.push((a, stamp));
    }
    for ack in acks {
        ack.await.expect("acknowledged");
    }
    announcer.flush(Duration::from_secs(5)).await.unwrap();

    let consumer: StreamConsumer = railhook_kafka::client_config(&config.kafka)
        .set("group.id", format!("{}announcer", config.kafka.topic_prefix))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[&config.deliveries_topic(), &config.forwards_topic()]).unwrap();
    let mut got = std::collections::HashMap::new();
    let mut stream = consumer.stream();
    while got.len() < N as usize {
        let msg = tokio::time::timeout(Duration::from_secs(60), stream.next()).await.expect("consumed within 60 s").expect("stream").unwrap();
        let a = Announcement::parse_keyed(msg.key().unwrap(), msg.payload().unwrap()).unwrap();
        let headers = msg.headers().unwrap();
        let header = |name: &str| headers.iter().find(|h| h.key == name).and_then(|h| h.value).map(|v| String::from_utf8(v.to_vec()).unwrap());
        assert_eq!(header(header::OUTBOX_ID), Some(a.outbox_id.to_string()));
        let read = Stamp::relay_read_us(headers.iter().map(|h| (h.key, h.value)));
        got.insert(a.outbox_id, (a, msg.topic().to_string(), header(header::COMMIT_LSN), header(header::COMMIT_TIME_US), read));
    }
    for (a, stamp) in sent {
        let (parsed, topic, commit_lsn, commit_time, read) = &got[&a.outbox_id];
        assert_eq!(parsed, &a);
        assert_eq!(topic, &a.topic(&config));
        assert_eq!(commit_lsn, &stamp.commit_lsn.map(|l| l.to_string()));
        assert_eq!(commit_time, &stamp.commit_time_us.map(|t| t.to_string()));
        assert_eq!(*read, stamp.relay_read_us);
    }
}
