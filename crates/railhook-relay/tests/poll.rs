//! The polling relay (`relay --mode poll`) against the real Postgres and Kafka.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use railhook_config::Config;
use railhook_relay::outbox::OutboxRow;
use railhook_relay::poll::{self, Limits};
use railhook_relay::RelayStats;
use railhook_testkit::{eventually, test_config, TestDb};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::message::Headers;
use rdkafka::{Message, Offset, TopicPartitionList};
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

async fn setup() -> (TestDb, Arc<Config>, Client) {
    let db = TestDb::new().await;
    let config = Arc::new(test_config(&db));
    let client = db.client().await;
    (db, config, client)
}

async fn setup_kafka(config: &Config) {
    railhook_kafka::ensure_topics(&config.kafka, &[config.deliveries_topic(), config.forwards_topic()]).await.unwrap();
}

/// The relay's producer, built as `railhook_relay::run` builds it.
fn announcer(config: &Config) -> railhook_kafka::Announcer {
    let mut producer_config = railhook_kafka::idempotent_producer_config(&config.kafka, railhook_relay::stream::MAX_IN_FLIGHT);
    producer_config.set("message.timeout.ms", "0");
    railhook_kafka::Announcer::new(producer_config.create().unwrap(), config)
}

/// Inserts one outbox row per route (delivery rows) in one transaction, in order; returns their ids.
async fn insert(client: &Client, project: Uuid, routes: &[Uuid]) -> Vec<i64> {
    let deliveries: Vec<Uuid> = routes.iter().map(|_| Uuid::now_v7()).collect();
    let rows = client
        .query(
            "INSERT INTO outbox (project_id, delivery_id, routing_id, reason)
             SELECT $1, d, r, 'created' FROM unnest($2::uuid[], $3::uuid[]) WITH ORDINALITY AS t(d, r, n) ORDER BY n
             RETURNING id",
            &[&project, &deliveries, &routes],
        )
        .await
        .unwrap();
    let mut ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    ids.sort_unstable();
    ids
}

async fn insert_forwards(client: &Client, project: Uuid, destination: Uuid, n: usize) -> Vec<i64> {
    let forwards: Vec<Uuid> = (0..n).map(|_| Uuid::now_v7()).collect();
    let rows = client
        .query(
            "INSERT INTO outbox (project_id, forward_id, routing_id, reason)
             SELECT $1, f, $2, 'retry' FROM unnest($3::uuid[]) WITH ORDINALITY AS t(f, n) ORDER BY n RETURNING id",
            &[&project, &destination, &forwards],
        )
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

async fn outbox_rows(client: &Client) -> Vec<OutboxRow> {
    client
        .query(
            "SELECT id, project_id, delivery_id, forward_id, routing_id, reason, claim_token, created_at::text
             FROM outbox ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| OutboxRow {
            id: r.get(0),
            project_id: r.get(1),
            delivery_id: r.get(2),
            forward_id: r.get(3),
            routing_id: r.get(4),
            reason: r.get(5),
            claim_token: r.get(6),
            created_at: r.get(7),
            traceparent: None,
            tracestate: None,
        })
        .collect()
}

async fn status_counts(client: &Client) -> HashMap<String, i64> {
    client
        .query("SELECT poll_status, count(*) FROM outbox GROUP BY 1", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

async fn all_published(client: &Client) -> Option<()> {
    let n: i64 = client.query_one("SELECT count(*) FROM outbox WHERE poll_status <> 'PUBLISHED'", &[]).await.unwrap().get(0);
    (n == 0).then_some(())
}

#[derive(Debug)]
struct Got {
    key: String,
    value: Vec<u8>,
    headers: Vec<(String, Vec<u8>)>,
}

impl Got {
    fn outbox_id(&self) -> i64 {
        let (_, v) = self.headers.iter().find(|(k, _)| k == "outbox_id").expect("outbox_id header");
        std::str::from_utf8(v).unwrap().parse().unwrap()
    }
}

/// Everything in `topic`, per partition in offset order, read once the producers are done:
/// the high watermarks say how many messages there are, so duplicates cannot hide.
async fn read_topic(config: &Config, topic: &str) -> Vec<Got> {
    let partitions = config.kafka.partitions;
    let watermarks = {
        let base: BaseConsumer = railhook_kafka::client_config(&config.kafka).create().unwrap();
        let topic = topic.to_string();
        tokio::task::spawn_blocking(move || {
            (0..partitions).map(|p| base.fetch_watermarks(&topic, p, Duration::from_secs(10)).unwrap()).collect::<Vec<_>>()
        })
        .await
        .unwrap()
    };
    let total: i64 = watermarks.iter().map(|(low, high)| high - low).sum();
    let consumer: StreamConsumer = railhook_kafka::client_config(&config.kafka)
        .set("group.id", format!("{}check", config.kafka.topic_prefix))
        .set("enable.auto.commit", "false")
        // The topic is seconds old: look for it again soon rather than after 5 minutes.
        .set("topic.metadata.refresh.interval.ms", "500")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions {
        assignment.add_partition_offset(topic, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut got = Vec::new();
    let mut stream = consumer.stream();
    while (got.len() as i64) < total {
        let msg = tokio::time::timeout(Duration::from_secs(60), stream.next())
            .await
            .unwrap_or_else(|_| panic!("timed out reading {topic}: {} of {total}", got.len()))
            .unwrap()
            .unwrap();
        let headers = msg
            .headers()
            .map(|h| h.iter().map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec())).collect())
            .unwrap_or_default();
        got.push(Got {
            key: String::from_utf8(msg.key().unwrap().to_vec()).unwrap(),
            value: msg.payload().unwrap().to_vec(),
            headers,
        });
    }
    got
}

struct Poller {
    stats: Arc<RelayStats>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), railhook_relay::RelayError>>,
}

impl Poller {
    fn start(config: &Arc<Config>) -> Poller {
        let stats = Arc::new(RelayStats::default());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(poll::run(config.clone(), announcer(config), stats.clone(), shutdown.clone()));
        Poller { stats, shutdown, task }
    }

    async fn stop(self) -> Arc<RelayStats> {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task).await.expect("poller stops").unwrap().unwrap();
        self.stats
    }

    fn check_running(&self) {
        assert!(!self.task.is_finished(), "poller ended early");
    }
}

#[tokio::test]
async fn publishes_every_row_in_order_per_key_and_marks_it_published() {
    let (_db, config, client) = setup().await;
    setup_kafka(&config).await;
    let project = Uuid::now_v7();
    let endpoints: Vec<Uuid> = (0..4).map(|_| Uuid::now_v7()).collect();
    let destination = Uuid::now_v7();
    // Half before the poller starts, half while it runs.
    for txn in 0..6 {
        let routes: Vec<Uuid> = (0..25).map(|i| endpoints[(txn * 7 + i * i) % 4]).collect();
        insert(&client, project, &routes).await;
    }
    let poller = Poller::start(&config);
    for txn in 6..12 {
        let routes: Vec<Uuid> = (0..25).map(|i| endpoints[(txn * 7 + i * i) % 4]).collect();
        insert(&client, project, &routes).await;
    }
    insert_forwards(&client, project, destination, 10).await;

    eventually(Duration::from_secs(60), "every row PUBLISHED", || {
        poller.check_running();
        all_published(&client)
    })
    .await;
    let stats = poller.stop().await;
    assert_eq!(stats.read.load(Ordering::Relaxed), 310);
    assert_eq!(stats.produced.load(Ordering::Relaxed), 310);
    assert_eq!(stats.produce_errors.load(Ordering::Relaxed), 0);

    let rows = outbox_rows(&client).await;
    let by_id: HashMap<i64, &OutboxRow> = rows.iter().map(|r| (r.id, r)).collect();
    for (topic, want) in [(config.deliveries_topic(), 300), (config.forwards_topic(), 10)] {
        let got = read_topic(&config, &topic).await;
        assert_eq!(got.len(), want, "{topic}: each row exactly once");
        let mut per_key: HashMap<String, Vec<i64>> = HashMap::new();
        for msg in &got {
            let names: Vec<&str> = msg.headers.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(names, ["outbox_id", "relay_read_us"], "no commit_lsn or commit time when polling, the time the row was read");
            let row = by_id[&msg.outbox_id()];
            // Byte for byte what the CDC relay would have sent for this row.
            let (want_topic, want_key, want_value) = railhook_relay::stream::announcement(&config, row).unwrap();
            assert_eq!((want_topic.as_str(), want_key.as_str(), want_value.as_slice()), (topic.as_str(), msg.key.as_str(), msg.value.as_slice()));
            per_key.entry(msg.key.clone()).or_default().push(row.id);
        }
        let mut expected: HashMap<String, Vec<i64>> = HashMap::new();
        for row in rows.iter().filter(|r| railhook_relay::stream::announcement(&config, r).unwrap().0 == topic) {
            expected.entry(railhook_relay::stream::announcement(&config, row).unwrap().1).or_default().push(row.id);
        }
        assert_eq!(per_key, expected, "{topic}: every row once, in id order per key");
    }
}

#[tokio::test]
async fn claim_caps_each_endpoint_so_a_hot_one_does_not_crowd_out_the_others() {
    let (_db, _config, client) = setup().await;
    let project = Uuid::now_v7();
    let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
    let a_ids = insert(&client, project, &[a; 100]).await;
    let b_ids = insert(&client, project, &[b; 5]).await;

    let claim = poll::claim_batch(&client, &Limits::default()).await.unwrap();
    let of = |route: Uuid| claim.rows.iter().filter(|r| r.routing_id == route).map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(of(a), a_ids[..10], "A's ten oldest");
    assert_eq!(of(b), b_ids, "all of B, though it is behind 100 rows of A");
    assert_eq!(claim.rows.len(), 15);
    assert_eq!(claim.left_behind, 90);
    assert!(claim.rows.windows(2).all(|w| w[0].id < w[1].id), "rows come in id order");

    // Exactly the claimed rows are SENDING, under the claim's time.
    let sending: Vec<i64> = client
        .query("SELECT id FROM outbox WHERE poll_status = 'SENDING' AND poll_claimed_at = $1 ORDER BY id", &[&claim.claimed_at])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(sending, claim.ids());
    assert_eq!(status_counts(&client).await, HashMap::from([("SENDING".into(), 15), ("PENDING".into(), 90)]));

    // The next claim takes A's next ten, not B's again.
    let next = poll::claim_batch(&client, &Limits::default()).await.unwrap();
    assert_eq!(next.ids(), a_ids[10..20]);
}

#[tokio::test]
async fn claim_caps_each_project_round_robin_over_its_endpoints() {
    let (_db, _config, client) = setup().await;
    let (p, q) = (Uuid::now_v7(), Uuid::now_v7());
    let endpoints: Vec<Uuid> = (0..5).map(|_| Uuid::now_v7()).collect();
    let mut ids_of: HashMap<Uuid, Vec<i64>> = HashMap::new();
    // Endpoint after endpoint, so taking the oldest 30 would give two endpoints only.
    for e in &endpoints {
        ids_of.insert(*e, insert(&client, p, &[*e; 20]).await);
    }
    let q_endpoint = Uuid::now_v7();
    let q_ids = insert(&client, q, &[q_endpoint; 3]).await;

    let claim = poll::claim_batch(&client, &Limits::default()).await.unwrap();
    let of_project = |project: Uuid| claim.rows.iter().filter(|r| r.project_id.0 == project).count();
    assert_eq!(of_project(p), 30, "project cap");
    assert_eq!(of_project(q), 3, "the cap is per project");
    for e in &endpoints {
        let got: Vec<i64> = claim.rows.iter().filter(|r| r.routing_id == *e).map(|r| r.id).collect();
        assert_eq!(got, ids_of[e][..6], "six oldest of each of the five endpoints");
    }
    let got_q: Vec<i64> = claim.rows.iter().filter(|r| r.project_id.0 == q).map(|r| r.id).collect();
    assert_eq!(got_q, q_ids);
}

#[tokio::test]
async fn claim_caps_the_batch_round_robin_over_projects() {
    let (_db, _config, client) = setup().await;
    let projects: Vec<Uuid> = (0..4).map(|_| Uuid::now_v7()).collect();
    for p in &projects {
        let endpoints: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
        let routes: Vec<Uuid> = (0..30).map(|i| endpoints[i % 3]).collect();
        insert(&client, *p, &routes).await;
    }
    let limits = Limits { batch: 12, ..Limits::default() };
    let claim = poll::claim_batch(&client, &limits).await.unwrap();
    assert_eq!(claim.rows.len(), 12);
    for p in &projects {
        assert_eq!(claim.rows.iter().filter(|r| r.project_id.0 == *p).count(), 3, "each project its share");
    }
    assert_eq!(claim.left_behind, 120 - 12);
}

#[tokio::test]
async fn concurrent_claims_are_disjoint() {
    let (db, _config, client) = setup().await;
    let mut all = BTreeSet::new();
    for _ in 0..10 {
        let project = Uuid::now_v7();
        let endpoints: Vec<Uuid> = (0..10).map(|_| Uuid::now_v7()).collect();
        let routes: Vec<Uuid> = (0..100).map(|i| endpoints[i % 10]).collect();
        all.extend(insert(&client, project, &routes).await);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(8));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let client = db.client().await;
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut mine = Vec::new();
            loop {
                let claim = poll::claim_batch(&client, &Limits::default()).await.unwrap();
                if claim.rows.is_empty() && claim.left_behind == 0 {
                    return mine;
                }
                mine.extend(claim.ids());
                tokio::task::yield_now().await;
            }
        }));
    }
    let mut seen: Vec<i64> = Vec::new();
    for t in tasks {
        seen.extend(tokio::time::timeout(Duration::from_secs(60), t).await.expect("claims run out").unwrap());
    }
    let unique: BTreeSet<i64> = seen.iter().copied().collect();
    assert_eq!(unique.len(), seen.len(), "a row claimed twice");
    assert_eq!(unique, all);
}

#[tokio::test]
async fn two_pollers_publish_each_row_exactly_once() {
    let (_db, config, client) = setup().await;
    setup_kafka(&config).await;
    let projects: Vec<Uuid> = (0..5).map(|_| Uuid::now_v7()).collect();
    let endpoints: Vec<Uuid> = (0..40).map(|_| Uuid::now_v7()).collect();
    let mut all = BTreeSet::new();
    let insert_round = |round: usize| {
        let client = &client;
        let projects = &projects;
        let endpoints = &endpoints;
        async move {
            let mut ids = Vec::new();
            for (pi, p) in projects.iter().enumerate() {
                let routes: Vec<Uuid> = (0..100).map(|i| endpoints[pi * 8 + (i * 3 + round) % 8]).collect();
                ids.extend(insert(client, *p, &routes).await);
            }
            ids
        }
    };
    for round in 0..2 {
        all.extend(insert_round(round).await);
    }
    let pollers = [Poller::start(&config), Poller::start(&config)];
    for round in 2..4 {
        all.extend(insert_round(round).await);
    }
    eventually(Duration::from_secs(90), "every row PUBLISHED", || {
        pollers.iter().for_each(Poller::check_running);
        all_published(&client)
    })
    .await;
    let mut produced = Vec::new();
    for p in pollers {
        let stats = p.stop().await;
        assert_eq!(stats.produce_errors.load(Ordering::Relaxed), 0);
        produced.push(stats.produced.load(Ordering::Relaxed));
    }
    eprintln!("produced per poller: {produced:?}");
    assert_eq!(produced.iter().sum::<u64>(), all.len() as u64);

    let got = read_topic(&config, &config.deliveries_topic()).await;
    let mut count: HashMap<i64, usize> = HashMap::new();
    for msg in &got {
        *count.entry(msg.outbox_id()).or_default() += 1;
    }
    let twice: Vec<_> = count.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "published more than once: {twice:?}");
    assert_eq!(count.keys().copied().collect::<BTreeSet<_>>(), all);
    assert_eq!(got.len(), all.len());
}

#[tokio::test]
async fn recovers_sending_rows_claimed_more_than_300_s_ago_only() {
    let (_db, config, client) = setup().await;
    setup_kafka(&config).await;
    let project = Uuid::now_v7();
    let ids = insert(&client, project, &[Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7()]).await;
    let (stale, live, pending) = (ids[0], ids[1], ids[2]);
    client
        .execute("UPDATE outbox SET poll_status = 'SENDING', poll_claimed_at = now() - interval '301 seconds' WHERE id = $1", &[&stale])
        .await
        .unwrap();
    let live_claimed_at: chrono::DateTime<chrono::Utc> = client
        .query_one(
            "UPDATE outbox SET poll_status = 'SENDING', poll_claimed_at = now() - interval '10 seconds' WHERE id = $1
             RETURNING poll_claimed_at",
            &[&live],
        )
        .await
        .unwrap()
        .get(0);

    let poller = Poller::start(&config);
    eventually(Duration::from_secs(30), "the stale and the pending row PUBLISHED", || {
        poller.check_running();
        let client = &client;
        async move {
            let n: i64 = client
                .query_one("SELECT count(*) FROM outbox WHERE id = ANY($1) AND poll_status = 'PUBLISHED'", &[&vec![stale, pending]])
                .await
                .unwrap()
                .get(0);
            (n == 2).then_some(())
        }
    })
    .await;
    let stats = poller.stop().await;
    assert_eq!(stats.produced.load(Ordering::Relaxed), 2);

    let row = client.query_one("SELECT poll_status, poll_claimed_at FROM outbox WHERE id = $1", &[&live]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "SENDING", "a live claim is left alone");
    assert_eq!(row.get::<_, chrono::DateTime<chrono::Utc>>(1), live_claimed_at);

    let got: BTreeSet<i64> = read_topic(&config, &config.deliveries_topic()).await.iter().map(Got::outbox_id).collect();
    assert_eq!(got, BTreeSet::from([stale, pending]));
}

#[tokio::test]
async fn finalise_under_a_stale_claim_time_updates_nothing() {
    let (_db, _config, client) = setup().await;
    let endpoint = Uuid::now_v7();
    let ids = insert(&client, Uuid::now_v7(), &[endpoint; 5]).await;
    let first = poll::claim_batch(&client, &Limits::default()).await.unwrap();
    assert_eq!(first.ids(), ids);

    let off_by_a_microsecond = first.claimed_at - chrono::Duration::microseconds(1);
    assert_eq!(poll::mark_published(&client, &ids, off_by_a_microsecond).await.unwrap(), 0);
    assert_eq!(poll::release(&client, &ids, off_by_a_microsecond).await.unwrap(), 0);
    assert_eq!(status_counts(&client).await, HashMap::from([("SENDING".into(), 5)]));

    // The first poller stalls past the recovery age; another one re-claims the rows.
    let stalled_at: chrono::DateTime<chrono::Utc> = client
        .query("UPDATE outbox SET poll_claimed_at = poll_claimed_at - interval '301 seconds' RETURNING poll_claimed_at", &[])
        .await
        .unwrap()[0]
        .get(0);
    let second = poll::claim_batch(&client, &Limits::default()).await.unwrap();
    assert_eq!(second.ids(), ids, "recovered");
    assert_ne!(second.claimed_at, stalled_at);

    // The stalled poller wakes up and finalises: nothing, the rows are no longer its.
    assert_eq!(poll::mark_published(&client, &ids, stalled_at).await.unwrap(), 0);
    assert_eq!(poll::release(&client, &ids, stalled_at).await.unwrap(), 0);
    let claimed_at: Vec<chrono::DateTime<chrono::Utc>> = client
        .query("SELECT poll_claimed_at FROM outbox WHERE poll_status = 'SENDING'", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(claimed_at, vec![second.claimed_at; 5]);

    // The current claim finalises once.
    assert_eq!(poll::mark_published(&client, &ids, second.claimed_at).await.unwrap(), 5);
    assert_eq!(poll::mark_published(&client, &ids, second.claimed_at).await.unwrap(), 0);
    assert_eq!(poll::release(&client, &ids, second.claimed_at).await.unwrap(), 0, "PUBLISHED is final");
    assert_eq!(status_counts(&client).await, HashMap::from([("PUBLISHED".into(), 5)]));
    let nothing = poll::claim_batch(&client, &Limits::default()).await.unwrap();
    assert!(nothing.rows.is_empty() && nothing.left_behind == 0);
}

#[tokio::test]
async fn a_failed_produce_releases_the_rows_and_stops_the_poller() {
    let (_db, config, client) = setup().await;
    // A deliveries topic whose broker refuses every message (too large): a permanent error.
    let admin: AdminClient<DefaultClientContext> = railhook_kafka::client_config(&config.kafka).create().unwrap();
    let topic = config.deliveries_topic();
    let tiny = NewTopic::new(&topic, config.kafka.partitions, TopicReplication::Fixed(config.kafka.replication_factor)).set("max.message.bytes", "64");
    for result in admin.create_topics([&tiny], &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)))).await.unwrap() {
        result.unwrap();
    }
    setup_kafka(&config).await;
    let ids = insert(&client, Uuid::now_v7(), &[Uuid::now_v7(); 3]).await;

    let stats = Arc::new(RelayStats::default());
    let result = tokio::time::timeout(
        Duration::from_secs(60),
        poll::run(config.clone(), announcer(&config), stats.clone(), CancellationToken::new()),
    )
    .await
    .expect("the poller gives up on a permanent error");
    // Kafka's own error, kept as the source.
    assert!(matches!(result, Err(railhook_relay::RelayError::Produce(rdkafka::error::KafkaError::MessageProduction(_)))), "{result:?}");
    assert_eq!(stats.read.load(Ordering::Relaxed), 3);
    assert_eq!(stats.produced.load(Ordering::Relaxed), 0);
    assert_eq!(stats.produce_errors.load(Ordering::Relaxed), 3);
    // Back to PENDING, for the next poller to take at once.
    let pending: Vec<i64> = client
        .query("SELECT id FROM outbox WHERE poll_status = 'PENDING' AND poll_claimed_at IS NULL ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(pending, ids);
}

#[tokio::test]
async fn stops_promptly_when_idle() {
    let (_db, config, _client) = setup().await;
    let poller = Poller::start(&config);
    eventually(Duration::from_secs(30), "the poller to run a claim", || {
        poller.check_running();
        let db_url = config.database.url.clone();
        async move {
            let client = railhook_testkit::connect(&db_url).await.unwrap();
            let n: i64 = client
                .query_one("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE '%WITH head AS%' AND pid <> pg_backend_pid()", &[])
                .await
                .unwrap()
                .get(0);
            (n > 0).then_some(())
        }
    })
    .await;
    let started = std::time::Instant::now();
    poller.stop().await;
    assert!(started.elapsed() < Duration::from_millis(500), "cancellation cuts the interval short: {:?}", started.elapsed());
}

#[tokio::test]
async fn reconnects_after_losing_its_postgres_connection() {
    let (_db, config, client) = setup().await;
    setup_kafka(&config).await;
    let project = Uuid::now_v7();
    insert(&client, project, &[Uuid::now_v7(); 5]).await;
    let poller = Poller::start(&config);
    eventually(Duration::from_secs(30), "the first rows PUBLISHED", || {
        poller.check_running();
        all_published(&client)
    })
    .await;
    let killed: i64 = client
        .query_one(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'railhook-relay-poll') t",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(killed, 1, "the poller's session, found by its application_name");
    insert(&client, project, &[Uuid::now_v7(); 5]).await;
    eventually(Duration::from_secs(30), "the rows inserted after the kill PUBLISHED", || {
        poller.check_running();
        all_published(&client)
    })
    .await;
    let stats = poller.stop().await;
    assert_eq!(stats.produced.load(Ordering::Relaxed), 10);
    assert_eq!(read_topic(&config, &config.deliveries_topic()).await.len(), 10);
}

#[tokio::test]
async fn drains_a_backlog_without_waiting_between_capped_batches() {
    let (_db, config, client) = setup().await;
    setup_kafka(&config).await;
    // One endpoint, 200 rows: 20 batches of 10. Sleeping the interval between them would
    // take 19 s or more.
    insert(&client, Uuid::now_v7(), &[Uuid::now_v7(); 200]).await;
    let started = std::time::Instant::now();
    let poller = Poller::start(&config);
    eventually(Duration::from_secs(60), "every row PUBLISHED", || {
        poller.check_running();
        all_published(&client)
    })
    .await;
    let took = started.elapsed();
    poller.stop().await;
    assert!(took < Duration::from_secs(8), "capped batches follow each other at once: {took:?}");
}

async fn poll_index_valid(client: &Client) -> Option<bool> {
    client
        .query_opt(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = 'outbox_poll_idx'",
            &[],
        )
        .await
        .unwrap()
        .map(|r| r.get(0))
}

#[tokio::test]
async fn the_poll_index_exists_only_once_a_poller_made_it_and_an_invalid_one_is_rebuilt() {
    let (_db, _config, client) = setup().await;
    // Migrated for CDC mode: no index that every announcement would pay for.
    assert_eq!(poll_index_valid(&client).await, None);
    poll::ensure_index(&client).await.unwrap();
    assert_eq!(poll_index_valid(&client).await, Some(true));
    poll::ensure_index(&client).await.unwrap();
    assert_eq!(poll_index_valid(&client).await, Some(true));
    // What a failed CREATE INDEX CONCURRENTLY leaves behind: an invalid index of that name
    // (here a unique one that two rows of one project violate).
    client.batch_execute("DROP INDEX outbox_poll_idx").await.unwrap();
    insert(&client, Uuid::now_v7(), &[Uuid::now_v7(), Uuid::now_v7()]).await;
    let failed = client.batch_execute("CREATE UNIQUE INDEX CONCURRENTLY outbox_poll_idx ON outbox (project_id) WHERE poll_status <> 'PUBLISHED'").await;
    assert!(failed.is_err());
    assert_eq!(poll_index_valid(&client).await, Some(false));
    poll::ensure_index(&client).await.unwrap();
    assert_eq!(poll_index_valid(&client).await, Some(true));
    // The poller's claim can read through it (the table is small: no sequential scan then).
    client.batch_execute("SET enable_seqscan = off").await.unwrap();
    let plan: Vec<String> = client
        .query("EXPLAIN SELECT id FROM outbox WHERE poll_status <> 'PUBLISHED' ORDER BY id LIMIT 10", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(plan.iter().any(|l| l.contains("outbox_poll_idx")), "{plan:?}");
}
