//! The Kafka source (issue #33, docs/KAFKA_SOURCE.md): records of the topics in
//! `kafka_source.topics` become Events, as if each had been POSTed to `/v1/events`.
//!
//! The contract, kept here and in [`batch`]:
//! - **What REST writes.** A batch of records is one statement and one transaction
//!   ([`railhook_store::events::ingest_batch`]: the set form of the statement of
//!   `POST /v1/events`, held to the same rows by the store's `tests/ingest_batch.rs`): each
//!   Event, its Deliveries and their announcement commit together.
//! - **Offsets after the commit.** A batch's offsets are committed only after its transaction
//!   committed and its dead-letter copies were acknowledged. A crash before that reads the
//!   records again.
//! - **Once.** A record read twice (that crash, a rebalance) is one Event: its idempotency key
//!   (the record's own, or its topic-partition-offset) is unique per Project.
//! - **Never stuck, never dropped.** A record that cannot be an Event goes to the dead-letter
//!   topic with its reason (`dead_letter`), counted by `railhook_kafka_source_dead_letters_total`,
//!   and its partition moves on. Postgres or Kafka being unreachable is not the record's
//!   fault: the batch waits and is made again, nothing is dead-lettered for it.
//!
//! Runs in every worker process (`railhook worker`, `railhook all`) with `kafka_source.topics`
//! set; the consumer group (`kafka_source.group_id`) spreads the partitions over them. In a
//! process, one consumer reads and hands each record to one of `kafka_source.connections`
//! lanes by its partition (a partition always to the same lane, so its records keep their
//! order); each lane ingests its batches one after the other on its own connection, the lanes
//! at once, so Postgres works on several transactions in parallel.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Headers, OwnedMessage};
use rdkafka::Message;
use railhook_config::Config;
use tokio_util::sync::CancellationToken;

pub mod batch;
pub mod dead_letter;
pub mod error;
pub mod metrics;
pub mod record;

pub use error::{ErrorKind, SourceError};
pub use metrics::SourceMetrics;

use batch::{Batch, Outcome};
use record::{Mapping, Record};

/// How long the source waits at start for a broker to answer before it stops with an error
/// naming the setting.
pub const STARTUP_WAIT: Duration = Duration::from_secs(30);
/// Bounds of the wait between two tries of a batch that failed for want of Postgres or Kafka.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// Each lane's queue holds this many batches of records at most.
const LANE_QUEUE_BATCHES: usize = 8;

/// A test hook, not a setting (docs/CONFIGURATION.md "Test hooks"): this many milliseconds
/// between a batch's transaction commit and its offset commit, so that a test's kill -9
/// lands in that window and the records are read again by the next consumer. Read once.
pub const COMMIT_DELAY_ENV: &str = "RAILHOOK_FAILPOINT_KAFKA_SOURCE_COMMIT_DELAY_MS";

fn commit_delay() -> Duration {
    Duration::from_millis(std::env::var(COMMIT_DELAY_ENV).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0))
}

/// Consumes `kafka_source.topics` until `shutdown`. Returns `Err` at start for a setting that
/// cannot work (naming it); once running, outages are waited out, never an error.
///
/// Shutdown: the consumer stops reading; each lane finishes the records it holds (or, while
/// Postgres or Kafka is away, gives them up uncommitted: they are read again), then commits
/// the offsets of what it did synchronously.
pub async fn run(config: Arc<Config>, metrics: SourceMetrics, shutdown: CancellationToken) -> Result<(), SourceError> {
    let source = &config.kafka_source;
    let mapping = Mapping::from_config(source).map_err(SourceError::misconfigured)?;
    let kafka = config.kafka_source_kafka();
    let brokers_key = if source.brokers.trim().is_empty() { "kafka.brokers" } else { "kafka_source.brokers" };
    let topics = config.kafka_source_topics();
    let dead_letter_topic = config.kafka_source_dead_letter_topic();

    let started = tokio::time::Instant::now();
    loop {
        match railhook_kafka::ensure_topics(&kafka, std::slice::from_ref(&dead_letter_topic)).await {
            Ok(()) => break,
            Err(e) if started.elapsed() >= STARTUP_WAIT => {
                return Err(SourceError::misconfigured(format!(
                    "kafka_source: cannot create the dead-letter topic {dead_letter_topic} at {brokers_key} = {} within {} s ({}). Start Kafka or fix {brokers_key}",
                    kafka.brokers,
                    STARTUP_WAIT.as_secs(),
                    error::chain(&e)
                )))
            }
            Err(e) => {
                tracing::warn!(error = %e, brokers = %kafka.brokers, "kafka_source: Kafka not ready, retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
    if let Ok((_, layouts)) = railhook_kafka::topic_layouts(&kafka, &topics, Duration::from_secs(5)).await {
        for missing in layouts.iter().filter(|l| !l.exists) {
            tracing::warn!(topic = %missing.topic, "kafka_source: the topic does not exist (yet); its records are read once it does");
        }
    }

    let producer = railhook_kafka::idempotent_producer(&kafka, 10_000).map_err(|e| SourceError::misconfigured(format!("kafka_source: cannot create the dead-letter producer: {e}")))?;
    let dead_letters = dead_letter::DeadLetters::new(producer, dead_letter_topic);
    let consumer: StreamConsumer = railhook_kafka::consumer_config(&kafka, &source.group_id)
        // Offsets are committed by `commit` below, after the batch's transaction; never by
        // the client on its own.
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("topic.metadata.refresh.interval.ms", "10000")
        .create()
        .map_err(|e| SourceError::misconfigured(format!("kafka_source: cannot create the consumer: {e}")))?;
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    consumer.subscribe(&names).map_err(|e| SourceError::misconfigured(format!("kafka_source: cannot subscribe to {topics:?}: {e}")))?;
    let pool = railhook_store::build_pool_as(&config.database, railhook_store::application::KAFKA_SOURCE)
        .map_err(|e| SourceError::misconfigured(format!("kafka_source: database.url: {e}")))?;
    tracing::info!(topics = ?topics, group = %source.group_id, "kafka_source: consuming");

    // The lanes: each partition always goes to the same one, so its records are ingested in
    // their order; the lanes ingest at once, each on its own connection.
    let consumer = Arc::new(consumer);
    let lane = Arc::new(Lane {
        consumer: consumer.clone(),
        mapping,
        pool,
        dead_letters,
        metrics,
        batch_max_records: source.batch_max_records,
        wait: Duration::from_millis(source.batch_max_wait_ms),
        commit_delay: commit_delay(),
    });
    let width = source.connections.max(1);
    let mut senders = Vec::with_capacity(width);
    let mut lanes = tokio::task::JoinSet::new();
    for _ in 0..width {
        // Bounded: a lane that cannot keep up stops the consumer reading (backpressure). Room
        // for LANE_QUEUE_BATCHES batches: librdkafka hands out a fetch partition by partition
        // (up to `max.partition.fetch.bytes` each), so with room for one batch only, the lane
        // of the partition at the head would hold the others' records back and the lanes
        // would take turns instead of working at once (measured: no faster than one lane).
        let (tx, rx) = tokio::sync::mpsc::channel(source.batch_max_records * LANE_QUEUE_BATCHES);
        senders.push(tx);
        lanes.spawn(lane.clone().run(rx, shutdown.clone()));
    }
    loop {
        let message = tokio::select! {
            _ = shutdown.cancelled() => break,
            m = consumer.recv() => m,
        };
        let message = match message {
            Ok(m) => m.detach(),
            Err(e) => {
                tracing::warn!(error = %e, "kafka_source: consumer error");
                tokio::time::sleep(RETRY_FIRST).await;
                continue;
            }
        };
        let slot = partition_slot(message.topic(), message.partition(), width);
        let sent = tokio::select! {
            _ = shutdown.cancelled() => break,
            sent = senders[slot].send(message) => sent,
        };
        if sent.is_err() {
            // A lane ended: only at shutdown.
            break;
        }
    }
    // The lanes finish what they hold (while Postgres and Kafka answer) and commit it.
    drop(senders);
    while lanes.join_next().await.is_some() {}
    Ok(())
}

/// Which lane a partition's records go to: a topic's partitions in turn from a place its
/// name picks, so they spread evenly over the lanes (a hash of the partition too would leave
/// some lanes with two partitions and others idle).
fn partition_slot(topic: &str, partition: i32, width: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    topic.hash(&mut h);
    ((h.finish() % width as u64) as usize + partition.unsigned_abs() as usize) % width
}

/// What every lane shares.
struct Lane {
    /// For the offset commits (the consume loop reads it; commits are thread-safe).
    consumer: Arc<StreamConsumer>,
    mapping: Mapping,
    pool: railhook_store::Pool,
    dead_letters: dead_letter::DeadLetters,
    metrics: SourceMetrics,
    batch_max_records: usize,
    wait: Duration,
    commit_delay: Duration,
}

impl Lane {
    /// Batches of this lane's records, one at a time: ingested, counted, then their offsets
    /// committed. Ends when the consume loop drops its sender (shutdown), after the records
    /// still queued; a batch that Postgres or Kafka keeps failing is given up at shutdown,
    /// uncommitted (read again after the restart).
    async fn run(self: Arc<Self>, mut rx: tokio::sync::mpsc::Receiver<OwnedMessage>, shutdown: CancellationToken) {
        let mut done: BTreeMap<(String, i32), i64> = BTreeMap::new();
        'batches: while let Some(first) = rx.recv().await {
            let mut messages = vec![first];
            let deadline = tokio::time::Instant::now() + self.wait;
            while messages.len() < self.batch_max_records {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(m)) => messages.push(m),
                    Ok(None) | Err(_) => break,
                }
            }
            let batch = view(&messages);
            let mut backoff = RETRY_FIRST;
            let outcomes = loop {
                match batch.ingest(&self.mapping, &self.pool, &self.dead_letters, &self.metrics).await {
                    Ok(outcomes) => break outcomes,
                    Err(e) => {
                        self.metrics.batch_retries.inc();
                        tracing::warn!(error = %error::chain(&e), records = messages.len(), retry_in = ?backoff, "kafka_source: batch not ingested; making it again");
                        tokio::select! {
                            _ = shutdown.cancelled() => break 'batches,
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(RETRY_MAX);
                    }
                }
            };
            count(&self.metrics, &outcomes);
            if !self.commit_delay.is_zero() {
                tokio::time::sleep(self.commit_delay).await;
            }
            // The batch's partitions, each at the offset after its last record in the batch.
            let mut next: BTreeMap<(&str, i32), i64> = BTreeMap::new();
            for m in &messages {
                let n = next.entry((m.topic(), m.partition())).or_insert(0);
                *n = (*n).max(m.offset() + 1);
            }
            let mut tpl = rdkafka::TopicPartitionList::new();
            for ((topic, partition), offset) in next {
                done.insert((topic.to_string(), partition), offset);
                if tpl.add_partition_offset(topic, partition, rdkafka::Offset::Offset(offset)).is_err() {
                    tracing::debug!(topic, partition, "kafka_source: cannot add an offset to commit");
                }
            }
            // Async: the next batch need not wait for the broker. A commit lost in a rebalance
            // or a crash only means its records are read again, and their keys absorb it.
            if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
                tracing::debug!(error = %e, "kafka_source: offset commit not sent (rebalance?)");
            }
            // Partitions this consumer lost are no longer ours to commit.
            if let Ok(assigned) = self.consumer.assignment() {
                done.retain(|(topic, partition), _| assigned.find_partition(topic, *partition).is_some());
            }
        }
        let mut tpl = rdkafka::TopicPartitionList::new();
        for ((topic, partition), next) in &done {
            let _ = tpl.add_partition_offset(topic, *partition, rdkafka::Offset::Offset(*next));
        }
        if tpl.count() > 0 {
            if let Err(e) = self.consumer.commit(&tpl, CommitMode::Sync) {
                tracing::warn!(error = %e, "kafka_source: final offset commit failed (the last records will be read again)");
            }
        }
    }
}

/// The batch's records as the mapping reads them, borrowed from the messages.
fn view(messages: &[OwnedMessage]) -> Batch<'_> {
    let records = messages
        .iter()
        .map(|m| Record {
            topic: m.topic(),
            partition: m.partition(),
            offset: m.offset(),
            value: m.payload(),
            headers: m.headers().map(|h| h.iter().map(|h| (h.key, h.value)).collect()).unwrap_or_default(),
        })
        .collect();
    Batch { records, keys: messages.iter().map(|m| m.key()).collect() }
}

fn count(metrics: &SourceMetrics, outcomes: &[Outcome]) {
    for o in outcomes {
        match o {
            Outcome::Created => metrics.records.with_label_values(&["created"]).inc(),
            Outcome::Replayed => metrics.records.with_label_values(&["replayed"]).inc(),
            Outcome::DeadLetter(refusal) => {
                metrics.records.with_label_values(&["dead_letter"]).inc();
                metrics.dead_letters.with_label_values(&[refusal.reason.as_str()]).inc();
            }
        }
    }
}
