//! The Kafka source against the real broker and a real Postgres, in process: a poison record
//! among good ones (dead-lettered with its reason, the good ones ingested, the partition not
//! blocked), and a rebalance across two consumers of one group (each record one Event).
//! The kill -9 of a worker mid-way is `crates/railhook/tests/kafka_source_process.rs`.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use railhook_config::Config;
use railhook_core::ProjectId;
use railhook_kafka_source::dead_letter;
use railhook_kafka_source::SourceMetrics;
use railhook_store::endpoints::{create_endpoint, NewEndpoint};
use railhook_store::subscriptions::{create_subscription, NewSubscription};
use railhook_testkit::{eventually, test_config, TestDb};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Message;
use tokio_util::sync::CancellationToken;

const TOPIC: &str = "orders";

/// A Project with one Endpoint subscribed to `order.*`.
async fn project(db: &TestDb) -> ProjectId {
    let client = db.client().await;
    let org = railhook_store::tenancy::create_organization(&client, "acme").await.unwrap();
    let project = railhook_store::tenancy::create_project(&client, org.id, "shop").await.unwrap().unwrap();
    let headers = BTreeMap::new();
    let ep = create_endpoint(&client, project.id, NewEndpoint { url: "http://127.0.0.1:9/never", description: "", enabled: true, rate_limit_per_second: None, headers: &headers, secret: "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3" })
        .await
        .unwrap();
    let sub = NewSubscription { endpoint_id: ep.id, event_type_pattern: "order.*", ordering: false, max_attempts: 7, timeout_seconds: 30, retry_delays: None, enabled: true };
    create_subscription(&client, project.id, sub).await.unwrap().unwrap();
    project.id
}

fn source_config(db: &TestDb, partitions: i32) -> Config {
    let mut config = test_config(db);
    config.kafka.partitions = partitions;
    config.kafka.properties.insert("session.timeout.ms".into(), "6000".into());
    config.kafka.properties.insert("heartbeat.interval.ms".into(), "1000".into());
    config.kafka_source.topics = vec![TOPIC.into()];
    config.kafka_source.group_id = format!("{}source", config.kafka.topic_prefix);
    config.kafka_source.max_record_bytes = 4096;
    config.kafka_source.batch_max_records = 100;
    config.validate().unwrap();
    config
}

fn producer(config: &Config) -> FutureProducer {
    railhook_kafka::idempotent_producer(&config.kafka, 100_000).unwrap()
}

async fn produce(producer: &FutureProducer, topic: &str, key: &str, value: Option<&[u8]>, headers: &[(&str, &str)]) {
    let mut h = OwnedHeaders::new();
    for (k, v) in headers {
        h = h.insert(Header { key: k, value: Some(*v) });
    }
    let mut record: FutureRecord<'_, str, [u8]> = FutureRecord::to(topic).key(key).headers(h);
    if let Some(v) = value {
        record = record.payload(v);
    }
    producer.send(record, Duration::from_secs(30)).await.map_err(|(e, _)| e).unwrap();
}

struct Running {
    metrics: SourceMetrics,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), railhook_kafka_source::SourceError>>,
}

fn start(config: &Arc<Config>) -> Running {
    let (metrics, stop) = (SourceMetrics::new(), CancellationToken::new());
    let task = tokio::spawn(railhook_kafka_source::run(config.clone(), metrics.clone(), stop.clone()));
    Running { metrics, stop, task }
}

impl Running {
    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }

    fn count(&self, outcome: &str) -> u64 {
        self.metrics.records.with_label_values(&[outcome]).get()
    }
}

/// Records of `topic` not yet committed by the source's group.
async fn lag(config: &Config, topic: &str) -> i64 {
    let (kafka, group, topic) = (config.kafka.clone(), config.kafka_source.group_id.clone(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let consumer: rdkafka::consumer::BaseConsumer = railhook_kafka::consumer_config(&kafka, &group).create().unwrap();
        let mut tpl = rdkafka::TopicPartitionList::new();
        for p in 0..kafka.partitions {
            tpl.add_partition(&topic, p);
        }
        let committed = consumer.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
        (0..kafka.partitions)
            .map(|p| {
                let (_, high) = consumer.fetch_watermarks(&topic, p, Duration::from_secs(10)).unwrap();
                let done = match committed.find_partition(&topic, p).map(|e| e.offset()) {
                    Some(rdkafka::Offset::Offset(o)) => o,
                    _ => 0,
                };
                high - done
            })
            .sum()
    })
    .await
    .unwrap()
}

async fn count(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

/// The dead-letter topic's records: (reason header, source offset header, value), read
/// from the start by a consumer of its own group until `n` arrived.
async fn dead_letters(config: &Config, n: usize) -> Vec<(String, String, Option<Vec<u8>>)> {
    let consumer: StreamConsumer = railhook_kafka::consumer_config(&config.kafka, &format!("{}dlq-reader", config.kafka.topic_prefix)).set("auto.offset.reset", "earliest").create().unwrap();
    consumer.subscribe(&[&config.kafka_source_dead_letter_topic()]).unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        let m = tokio::time::timeout(Duration::from_secs(60), consumer.recv()).await.expect("a dead-letter record within 60 s").unwrap();
        let header = |name: &str| {
            m.headers().and_then(|h| h.iter().find(|x| x.key == name).and_then(|x| x.value.map(|v| String::from_utf8_lossy(v).to_string()))).unwrap_or_default()
        };
        out.push((header(dead_letter::REASON_HEADER), header(dead_letter::OFFSET_HEADER), m.payload().map(<[u8]>::to_vec)));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_records_go_to_the_dead_letter_topic_and_the_good_ones_are_ingested() {
    let db = TestDb::new().await;
    let project = project(&db).await;
    let config = Arc::new(source_config(&db, 1));
    let topic = format!("{}{TOPIC}", config.kafka.topic_prefix);
    railhook_kafka::ensure_topics(&config.kafka, std::slice::from_ref(&topic)).await.unwrap();
    let p = producer(&config);
    let project_text = project.to_string();
    let good = |i: usize| format!(r#"{{"type":"order.paid","payload":{{"n":{i}}},"project":"{project_text}","idempotency_key":"order-{i}"}}"#);
    let big = format!(r#"{{"type":"order.paid","payload":{{"x":"{}"}},"project":"{project_text}"}}"#, "y".repeat(5000));
    let other_project = ProjectId::new().to_string();
    let unknown = format!(r#"{{"type":"order.paid","payload":{{}},"project":"{other_project}"}}"#);
    let no_type = format!(r#"{{"payload":{{}},"project":"{project_text}"}}"#);
    let nul = format!(r#"{{"type":"order.paid","payload":{{"s":"a\u0000b"}},"project":"{project_text}"}}"#);
    let reused = format!(r#"{{"type":"order.paid","payload":{{"n":"another"}},"project":"{project_text}","idempotency_key":"order-3"}}"#);
    // One partition: every poison record sits between good ones, in one order.
    let poison: Vec<(&str, Option<Vec<u8>>)> = vec![
        ("bad_json", Some(b"{not json".to_vec())),
        ("too_large", Some(big.into_bytes())),
        ("unknown_project", Some(unknown.into_bytes())),
        ("bad_type", Some(no_type.into_bytes())),
        ("bad_json", None),
        ("bad_payload", Some(nul.into_bytes())),
        ("idempotency_key_reused", Some(reused.into_bytes())),
    ];
    let mut expected_reasons = Vec::new();
    let mut n = 0;
    for (reason, value) in &poison {
        for _ in 0..20 {
            produce(&p, &topic, "k", Some(good(n).as_bytes()), &[]).await;
            n += 1;
        }
        produce(&p, &topic, "poison", value.as_deref(), &[("trace", "kept")]).await;
        expected_reasons.push(reason.to_string());
    }
    for _ in 0..20 {
        produce(&p, &topic, "k", Some(good(n).as_bytes()), &[]).await;
        n += 1;
    }

    let source = start(&config);
    let client = db.client().await;
    eventually(Duration::from_secs(60), "every good record ingested", || async { (count(&client, "SELECT count(*) FROM events").await == n as i64).then_some(()) }).await;
    let letters = dead_letters(&config, poison.len()).await;
    let reasons: Vec<String> = letters.iter().map(|l| l.0.clone()).collect();
    assert_eq!(reasons, expected_reasons, "each poison record dead-lettered once with its reason, in order");
    // The copy is the record as it arrived: its value, and its position in the source.
    assert_eq!(letters[0].2.as_deref(), Some(&b"{not json"[..]));
    assert_eq!(letters[4].2, None, "the tombstone stays a tombstone");
    assert_eq!(letters[0].1, "20");
    eventually(Duration::from_secs(10), "the counters", || async { (source.count("dead_letter") == poison.len() as u64 && source.count("created") == n as u64).then_some(()) }).await;
    assert_eq!(source.metrics.dead_letters.with_label_values(&["bad_json"]).get(), 2);
    assert_eq!(source.metrics.dead_letters.with_label_values(&["idempotency_key_reused"]).get(), 1);
    assert_eq!(count(&client, "SELECT count(*) FROM deliveries").await, n as i64, "each Event has its Delivery");
    // The reused key kept its first Event.
    let payload: serde_json::Value = client.query_one("SELECT payload FROM events WHERE idempotency_key = 'order-3'", &[]).await.unwrap().get(0);
    assert_eq!(payload, serde_json::json!({"n": 3}));
    source.stop().await;

    // Nothing was left uncommitted: a new consumer of the group finds nothing to do.
    let again = start(&config);
    produce(&p, &topic, "k", Some(good(n).as_bytes()), &[]).await;
    eventually(Duration::from_secs(60), "the record after the restart", || async { (count(&client, "SELECT count(*) FROM events").await == n as i64 + 1).then_some(()) }).await;
    eventually(Duration::from_secs(10), "its counter", || async { (again.count("created") == 1).then_some(()) }).await;
    assert_eq!((again.count("replayed"), again.count("dead_letter")), (0, 0), "the committed offsets were after every record of the first run");
    again.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_across_two_consumers_makes_each_record_one_event() {
    const RECORDS: usize = 8_000;
    let db = TestDb::new().await;
    let project = project(&db).await;
    let mut config = source_config(&db, 6);
    config.kafka_source.project = project.to_string();
    config.kafka_source.format = railhook_config::RecordFormat::Headers;
    // Small batches: the rebalance finds many in flight.
    config.kafka_source.batch_max_records = 10;
    let config = Arc::new(config);
    let topic = format!("{}{TOPIC}", config.kafka.topic_prefix);
    railhook_kafka::ensure_topics(&config.kafka, std::slice::from_ref(&topic)).await.unwrap();
    let p = producer(&config);
    // Half the records carry a key, half are keyed by their position.
    let sends = (0..RECORDS).map(|i| {
        let (p, topic) = (&p, &topic);
        async move {
            let value = format!(r#"{{"n":{i}}}"#);
            let key = format!("rec-{i}");
            let mut headers = vec![("railhook-type", "order.created")];
            if i % 2 == 0 {
                headers.push(("railhook-idempotency-key", key.as_str()));
            }
            produce(p, topic, &key, Some(value.as_bytes()), &headers).await;
        }
    });
    futures::future::join_all(sends).await;

    let client = db.client().await;
    // The first consumer waits 100 ms between each batch's transaction and its offset commit
    // (the test hook, read when a consumer starts), so that its stop below lands between the
    // two. (The other test of this file may read it too: it only slows that one down.)
    std::env::set_var(railhook_kafka_source::COMMIT_DELAY_ENV, "100");
    let first = start(&config);
    eventually(Duration::from_secs(60), "the first consumer under way", || async { (count(&client, "SELECT count(*) FROM events").await >= 300).then_some(()) }).await;
    std::env::remove_var(railhook_kafka_source::COMMIT_DELAY_ENV);
    let second = start(&config);
    // The second consumer took partitions over (a rebalance with batches in flight).
    eventually(Duration::from_secs(60), "the second consumer ingesting", || async { (second.count("created") > 0).then_some(()) }).await;
    // Then the first one stops dead, a batch likely in flight (its transaction perhaps
    // committed, its offsets not): the second takes its partitions and reads what was not
    // committed again.
    first.task.abort();
    let (c1, r1) = (first.count("created"), first.count("replayed"));
    eventually(Duration::from_secs(120), "every record ingested", || async { (count(&client, "SELECT count(*) FROM events").await >= RECORDS as i64).then_some(()) }).await;
    eventually(Duration::from_secs(60), "the group's offsets at the end of every partition", || async { (lag(&config, &topic).await == 0).then_some(()) }).await;
    let (c2, r2) = (second.count("created"), second.count("replayed"));
    eprintln!("created by the first consumer {c1} (before it stopped), by the second {c2}; read again and absorbed: {r1} + {r2}");
    assert_eq!(first.count("dead_letter") + second.count("dead_letter"), 0);
    assert!(r2 > 0, "the batch the first consumer had committed in Postgres but not in Kafka was read again by the second and absorbed");
    second.stop().await;

    assert_eq!(count(&client, "SELECT count(*) FROM events").await, RECORDS as i64, "each record one Event");
    assert_eq!(count(&client, "SELECT count(*) FROM deliveries").await, RECORDS as i64, "each Event one Delivery");
    let payloads: HashSet<i64> = client.query("SELECT (payload->>'n')::bigint FROM events", &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(payloads, (0..RECORDS as i64).collect::<HashSet<_>>(), "every record, none twice");
    let keyed: i64 = count(&client, "SELECT count(*) FROM events WHERE idempotency_key LIKE 'rec-%'").await;
    let positioned: i64 = count(&client, &format!("SELECT count(*) FROM events WHERE idempotency_key LIKE 'kafka:{topic}:%'")).await;
    assert_eq!((keyed, positioned), (RECORDS as i64 / 2, RECORDS as i64 / 2));
}
