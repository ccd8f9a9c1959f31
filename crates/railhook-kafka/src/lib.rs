//! Railhook's Kafka clients. Every producer, consumer and admin client is configured here,
//! so the librdkafka passthrough (`kafka.properties`) applies to all of them the same way.

use std::time::Duration;

pub mod announcement;
pub mod inline;
pub use announcement::{Acknowledgement, Announcement, AnnouncementError, Announcer, Stamp, Target};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::FutureProducer;
use railhook_config::KafkaConfig;

#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    #[error("Kafka client error: {0}")]
    Client(#[from] rdkafka::error::KafkaError),
    #[error("cannot create topic {topic}: {message}")]
    CreateTopic { topic: String, message: String },
    #[error("Kafka at {brokers} is not reachable: {message}")]
    Unreachable { brokers: String, message: String },
}

/// The base configuration: brokers, TCP_NODELAY (`socket.nagle.disable`: librdkafka leaves
/// Nagle's algorithm on by default, which can hold a small produce or fetch request back
/// until the previous one is acknowledged), then the user's passthrough properties, which win.
pub fn client_config(kafka: &KafkaConfig) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &kafka.brokers);
    config.set("socket.nagle.disable", "true");
    for (key, value) in &kafka.properties {
        config.set(key, value);
    }
    config
}

/// The worker's consumers: how soon a dead worker's partitions move to the others. Without
/// a setting librdkafka's default session timeout (45 s) applies, so a worker killed with
/// kill -9 would leave its Endpoints' hints unread for about 45 s; Railhook defaults to 10 s
/// with a heartbeat every 3 s (Kafka's brokers accept 6 s and up by default). Either can be
/// set in `kafka.properties`, which wins.
pub const SESSION_TIMEOUT_MS: &str = "10000";
pub const HEARTBEAT_INTERVAL_MS: &str = "3000";

/// How long the broker may hold an empty fetch (librdkafka's default 500 ms), and how long
/// the consumer waits after a fetch error before fetching again (500 ms): a hint that lands
/// on a partition whose fetch just errored (a topic seconds old, a leader moving) waited up to
/// that long before the worker saw it (issue 30: `read_to_poll` p99 near 500 ms on a fresh
/// stack). The broker answers a waiting fetch as soon as data arrives, so a shorter wait
/// costs idle fetch requests (10 a second per broker), not latency.
pub const FETCH_WAIT_MAX_MS: &str = "100";
pub const FETCH_ERROR_BACKOFF_MS: &str = "50";

pub fn consumer_config(kafka: &KafkaConfig, group_id: &str) -> ClientConfig {
    let mut config = client_config(kafka);
    config.set("group.id", group_id);
    set_defaults(
        &mut config,
        kafka,
        &[
            ("session.timeout.ms", SESSION_TIMEOUT_MS),
            ("heartbeat.interval.ms", HEARTBEAT_INTERVAL_MS),
            ("fetch.wait.max.ms", FETCH_WAIT_MAX_MS),
            ("fetch.error.backoff.ms", FETCH_ERROR_BACKOFF_MS),
        ],
    );
    config
}

/// Railhook's defaults for librdkafka properties that `kafka.properties` may set instead.
fn set_defaults(config: &mut ClientConfig, kafka: &KafkaConfig, defaults: &[(&str, &str)]) {
    for (key, default) in defaults {
        if !kafka.properties.contains_key(*key) {
            config.set(*key, *default);
        }
    }
}

/// The relay's produce requests in flight per broker connection, unless `kafka.properties`
/// sets `max.in.flight.requests.per.connection` (at most 5 with idempotence). One: with no
/// lingering, each announcement of a burst was a produce request of its own while up to five
/// were in flight; with one, what queues while a request is in flight goes in the next
/// (issue 30, BENCHMARKS "One produce request in flight"). A lone announcement (the light
/// rate) goes at once either way.
pub const PRODUCER_MAX_IN_FLIGHT: &str = "1";

/// Producer settings the relay's guarantees rest on: idempotence (no duplicates or
/// reordering from internal retries), `acks=all`, and a bounded local queue so a stalled
/// cluster becomes backpressure instead of memory growth.
pub fn idempotent_producer_config(kafka: &KafkaConfig, queue_messages: usize) -> ClientConfig {
    let mut config = client_config(kafka);
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("queue.buffering.max.messages", queue_messages.to_string())
        .set("queue.buffering.max.kbytes", "65536");
    // No lingering: an announcement goes at once (a wait of up to `linger.ms` was most of the
    // relay's share of the light rate's latency). Under load the producer batches anyway:
    // what queues while its request is in flight goes in the next one.
    set_defaults(&mut config, kafka, &[("linger.ms", "0"), ("max.in.flight.requests.per.connection", PRODUCER_MAX_IN_FLIGHT)]);
    config
}

pub fn idempotent_producer(kafka: &KafkaConfig, queue_messages: usize) -> Result<FutureProducer, KafkaError> {
    Ok(idempotent_producer_config(kafka, queue_messages).create()?)
}

/// Creates each missing topic with the configured partitions and replication factor.
/// A topic that already exists is left as it is.
pub async fn ensure_topics(kafka: &KafkaConfig, topics: &[String]) -> Result<(), KafkaError> {
    let admin: AdminClient<DefaultClientContext> = client_config(kafka).create()?;
    let new_topics: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, kafka.partitions, TopicReplication::Fixed(kafka.replication_factor)))
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin.create_topics(new_topics.iter(), &options).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(KafkaError::CreateTopic { topic, message: code.to_string() }),
        }
    }
    Ok(())
}

/// Asks the cluster for its metadata. librdkafka's call blocks, so it runs off the async
/// threads.
pub async fn check_reachable(kafka: &KafkaConfig, timeout: Duration) -> Result<usize, KafkaError> {
    let config = client_config(kafka);
    let brokers = kafka.brokers.clone();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config.create()?;
        let metadata = consumer
            .fetch_metadata(None, timeout)
            .map_err(|e| KafkaError::Unreachable { brokers: brokers.clone(), message: e.to_string() })?;
        Ok(metadata.brokers().len())
    })
    .await
    .map_err(|e| KafkaError::Unreachable { brokers: kafka.brokers.clone(), message: e.to_string() })?
}

/// What the cluster says about one topic (`railhook doctor` compares it with the
/// configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicLayout {
    pub topic: String,
    /// False when the cluster does not know the topic (the other fields are then empty).
    pub exists: bool,
    pub partitions: usize,
    /// The fewest replicas any of its partitions has.
    pub min_replicas: usize,
}

/// The brokers the cluster lists and the layout of each of `topics`, from one metadata
/// request for every topic (asking for a topic by name would create it where the brokers
/// auto-create topics).
pub async fn topic_layouts(kafka: &KafkaConfig, topics: &[String], timeout: Duration) -> Result<(usize, Vec<TopicLayout>), KafkaError> {
    let config = client_config(kafka);
    let brokers = kafka.brokers.clone();
    let topics = topics.to_vec();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config.create()?;
        let metadata = consumer
            .fetch_metadata(None, timeout)
            .map_err(|e| KafkaError::Unreachable { brokers: brokers.clone(), message: e.to_string() })?;
        let layouts = topics
            .iter()
            .map(|name| match metadata.topics().iter().find(|t| t.name() == name && t.error().is_none()) {
                Some(t) => TopicLayout {
                    topic: name.clone(),
                    exists: true,
                    partitions: t.partitions().len(),
                    min_replicas: t.partitions().iter().map(|p| p.replicas().len()).min().unwrap_or(0),
                },
                None => TopicLayout { topic: name.clone(), exists: false, partitions: 0, min_replicas: 0 },
            })
            .collect();
        Ok((metadata.brokers().len(), layouts))
    })
    .await
    .map_err(|e| KafkaError::Unreachable { brokers: kafka.brokers.clone(), message: e.to_string() })?
}
