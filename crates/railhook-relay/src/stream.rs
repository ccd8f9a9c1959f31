//! The CDC loop: replication stream in, Kafka out, progress back to Postgres.
//!
//! Contract: at-least-once. Every committed outbox insert is produced to Kafka before the slot
//! is allowed past its commit ([`crate::progress`]), so a crash at any point replays from the
//! slot and duplicates are absorbed downstream by the Claim (duplicate window 4).
//!
//! The order that contract rests on, kept by [`stream`] and the `Streaming` methods it calls:
//! 1. a row's progress ticket is taken before its message is handed to Kafka (`produce`);
//! 2. a ticket is acknowledged only after Kafka acknowledged its own message (`acked`); a
//!    refused message ends the stream with nothing past it confirmed;
//! 3. after every event, the slot is told at most [`Progress::confirmed`]: the end of the
//!    last commit whose messages, and all earlier ones, Kafka acknowledged (`confirm`);
//! 4. at shutdown: stop reading, drain the acknowledgements in flight (bounded by
//!    [`slot::DRAIN_TIMEOUT`]), flush the producer, close the stream, then confirm the final
//!    position ([`slot::final_confirm`]), never more than step 3 allows.
//!
//! Backpressure: at most `MAX_IN_FLIGHT` messages await Kafka's acknowledgement; at the
//! bound the loop stops reading the replication stream (whose own buffer is bounded too), so
//! a stalled cluster turns into replication lag, not memory.
//!
//! A clean Postgres shutdown (`pg_ctl -m fast`) waits for every walsender's client to confirm
//! what it was sent. With the inline transport the acknowledgements are claims, which need
//! Postgres, which by then refuses connections: nothing would ever be confirmed, and the
//! shutdown would wait for ever (the chaos suite's `postgres_restart` on inline found it). So
//! while acknowledgements have not moved for [`STALL_PROBE_AFTER`], the loop asks Postgres
//! whether it is shutting down (SQLSTATE 57P03 on a new connection) and if so ends the stream
//! unconfirmed ([`RelayError::PostgresShuttingDown`]): the walsender exits, the shutdown goes
//! on, and the next stream reads those commits again (window 4). Kafka mode gets the same
//! when the broker is away during a Postgres shutdown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use pgwire_replication::client::ReplicationEvent;
use pgwire_replication::{ReplicationClient, ReplicationConfig};
use railhook_config::Config;
use railhook_core::Lsn;
use railhook_kafka::announcement::MESSAGE_PREFIX_FAMILY;
use railhook_kafka::{Announcement, Announcer, Stamp};
use railhook_telemetry::stages::{self, Stage};
use railhook_store::DatabaseUrl;
use rdkafka::error::KafkaError;
use tokio_util::sync::CancellationToken;

use crate::outbox::{OutboxRow, Relations};
use crate::pgoutput::{self, Message};
use crate::progress::{Progress, Ticket};
use crate::slot::{self, DRAIN_TIMEOUT, LIVE_PREFIX};
use crate::RelayError;

/// Messages produced but not yet acknowledged, at most.
pub const MAX_IN_FLIGHT: usize = 10_000;
/// How long acknowledgements may stand still, messages in flight, before the loop asks
/// whether Postgres is shutting down (see the module docs); and how often it asks then.
pub const STALL_PROBE_AFTER: Duration = Duration::from_secs(3);
/// Transactions seen but not yet confirmable, at most.
pub const MAX_TXNS_IN_FLIGHT: usize = 100_000;

/// The replication connection's settings: the connection from `database.url` as
/// [`railhook_store::DatabaseUrl::replication_config`] reads it (the same `sslmode`,
/// `sslrootcert` and password as every other connection), the slot and publication, the start
/// position, and status updates every `relay.status_interval_ms`.
pub fn replication_config(config: &Config, start: Lsn) -> Result<ReplicationConfig, RelayError> {
    let url = DatabaseUrl::parse(&config.database.url).map_err(RelayError::from_connect)?;
    let replication = url
        .replication_config(&config.relay.slot_name, &config.relay.publication_name, railhook_store::application::RELAY)
        .map_err(RelayError::from_connect)?;
    let interval = Duration::from_millis(config.relay.status_interval_ms);
    Ok(replication
        .with_start_lsn(pgwire_replication::Lsn::from_u64(start.0))
        .with_status_interval(interval)
        .with_wakeup_interval(interval)
        .with_buffer_size(4096))
}

/// Opens the replication stream at `start`. The trusted roots of a verifying `sslmode` are
/// read first, here: a `sslrootcert` that cannot be used is then [`RelayError::Misconfigured`]
/// from Railhook's own typed error, not from the text of pgwire-replication's (whose TLS
/// errors are one variant with a message).
pub async fn open(config: &Config, start: Lsn) -> Result<ReplicationClient, RelayError> {
    let url = DatabaseUrl::parse(&config.database.url).map_err(RelayError::from_connect)?;
    if url.ssl_mode.verifies() {
        url.root_store().map_err(RelayError::from_connect)?;
    }
    ReplicationClient::connect(replication_config(config, start)?).await.map_err(RelayError::from_replication)
}

/// The Kafka message for one outbox row: topic, key and value (`railhook_kafka::announcement`).
pub fn announcement(config: &Config, row: &OutboxRow) -> Result<(String, String, Vec<u8>), crate::outbox::RowError> {
    let a = row.announcement()?;
    Ok((a.topic(config), a.key(), a.to_bytes()))
}

/// Counts the relay exposes; shared with the metrics layer ([`crate::health::RelayMetrics`]).
#[derive(Debug)]
pub struct RelayStats {
    /// Outbox inserts read from the stream and handed to the producer.
    pub read: std::sync::atomic::AtomicU64,
    /// Acknowledged by Kafka.
    pub produced: std::sync::atomic::AtomicU64,
    pub produce_errors: std::sync::atomic::AtomicU64,
    pub confirmed_lsn: std::sync::atomic::AtomicU64,
    /// From the commit of an outbox insert to Kafka's acknowledgement.
    pub commit_to_ack: prometheus::Histogram,
    /// The latency stages the relay sees (`commit_to_read`, `read_to_ack`), in the histogram
    /// the worker observes the others in (`railhook_telemetry::stages`).
    pub stages: railhook_telemetry::stages::Stages,
    /// The current stream returned its liveness marker (see [`stream`]).
    pub live: std::sync::atomic::AtomicBool,
    /// Messages handed to the producer and not yet acknowledged.
    pub in_flight: std::sync::atomic::AtomicU64,
}

impl Default for RelayStats {
    fn default() -> Self {
        RelayStats {
            read: Default::default(),
            produced: Default::default(),
            produce_errors: Default::default(),
            confirmed_lsn: Default::default(),
            commit_to_ack: crate::health::commit_to_ack_histogram(),
            stages: Default::default(),
            live: Default::default(),
            in_flight: Default::default(),
        }
    }
}

/// Microseconds from the Unix epoch to the Postgres epoch (2000-01-01).
const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;

/// A commit time (Postgres epoch microseconds) as Postgres prints a `timestamptz` in UTC
/// (`2026-12-05 18:00:00.123456+00`): the `created_at` of an announcement that has no outbox
/// row to take it from.
fn pg_timestamp_text(pg_micros: i64) -> String {
    chrono::DateTime::from_timestamp_micros(pg_micros + PG_EPOCH_UNIX_MICROS)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S%.6f+00").to_string())
        .unwrap_or_default()
}

fn seconds_since_pg_micros(pg_micros: i64) -> f64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0);
    ((now - PG_EPOCH_UNIX_MICROS - pg_micros).max(0) as f64) / 1e6
}

/// A message handed to the producer: its progress ticket, its commit's time, when the relay
/// read it, and Kafka's answer when it comes.
type Acked = (Ticket, i64, Instant, Result<(), KafkaError>);
type Reannouncing = tokio::task::JoinHandle<Result<crate::reannounce::Reannounced, RelayError>>;

/// The loop's state between events. The order of the steps inside each method is what
/// at-least-once rests on (see the module docs): a row's progress ticket is taken before it
/// is handed to Kafka, a ticket is acknowledged only after Kafka acknowledged its message,
/// and the slot is moved only to what [`Progress::confirmed`] allows, after each event.
struct Streaming {
    config: Arc<Config>,
    stats: Arc<RelayStats>,
    /// The producer; its futures are the per-message acknowledgements `progress` counts.
    announcer: Announcer,
    /// What the slot may be confirmed up to.
    progress: Progress,
    /// The outbox table's Relation messages by OID.
    relations: Relations,
    /// Messages Kafka has not acknowledged yet (at most [`MAX_IN_FLIGHT`]).
    in_flight: FuturesUnordered<std::pin::Pin<Box<dyn std::future::Future<Output = Acked> + Send>>>,
    /// The transaction being read: its commit's end LSN (the `commit_lsn` header) and time.
    commit_lsn: Lsn,
    commit_time: i64,
    /// The liveness marker's token (see [`stream`]).
    token: String,
    /// The re-announcement after a slot was created, while it runs.
    reannounce: Option<Reannouncing>,
    /// The last position the slot was told ([`Streaming::confirm`]).
    reported: Lsn,
    /// Since when messages have been in flight with no acknowledgement: None while nothing
    /// is in flight, reset by each acknowledgement.
    waiting_since: Option<Instant>,
}

/// Whether the stream's slot was just created, so that what is PENDING must be announced
/// again once the stream is live, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reannounce {
    /// Nothing to do: the slot existed.
    No,
    /// The slot was created (the first start, or `relay.create_slot` for a missing one).
    Created,
    /// The slot was recreated after it was lost: said once, as an error an operator reads
    /// ([`SLOT_LOST`]), when the re-announcement is done.
    Recovered(crate::setup::SlotLoss),
}

/// The beginning of the relay's one log line after it recovered from an invalidated slot.
pub const SLOT_LOST: &str = "the replication slot was lost and has been recreated";
/// Likewise, after a dropped one.
pub const SLOT_DROPPED: &str = "the replication slot was dropped and has been recreated";

/// Streams from `start` until `shutdown`, then drains in-flight messages and confirms them.
///
/// Liveness marker: once connected, the relay writes a non-transactional logical message
/// ([`slot::emit_marker`], a random token) and counts the stream live when it comes back:
/// decoding is then consistent, and every transaction that starts later is in the stream.
/// When `needs_reannounce` is set (the slot was just created), the PENDING work is
/// re-announced at that moment, not before: rows committed while the new stream was still
/// starting are then covered too. On success it is cleared, so a failed attempt leaves it
/// for the next one.
///
/// Each turn of the loop, in this order (the module docs say why the order matters): one
/// thing happens (an acknowledgement, the re-announcement's end, the shutdown signal, the
/// drain's timeout, or one replication event, read only below the in-flight bounds and
/// before the drain), then the in-flight gauge, then `Streaming::confirm`, then the
/// drain's end check. After the loop, `Streaming::finish`.
pub async fn stream(
    config: Arc<Config>,
    announcer: Announcer,
    start: Lsn,
    stats: Arc<RelayStats>,
    needs_reannounce: &mut Reannounce,
    shutdown: CancellationToken,
) -> Result<(), RelayError> {
    let mut client = open(&config, start).await?;
    tracing::info!(slot = %config.relay.slot_name, %start, "replication started");
    stats.live.store(false, std::sync::atomic::Ordering::Relaxed);
    let token = uuid::Uuid::new_v4().to_string();
    slot::emit_marker(&config.database.url, &token).await?;
    let mut s = Streaming::new(config, stats, announcer, start, token);
    let mut drain = slot::Drain::new(DRAIN_TIMEOUT);
    let mut stall_probe = tokio::time::interval(STALL_PROBE_AFTER);
    stall_probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let reading = !drain.started() && s.has_room();
        let stalled = s.waiting_since.is_some_and(|t| t.elapsed() >= STALL_PROBE_AFTER);
        tokio::select! {
            biased;
            Some(acked) = s.in_flight.next(), if !s.in_flight.is_empty() => s.acked(acked)?,
            done = async { s.reannounce.as_mut().expect("guarded").await }, if s.reannounce.is_some() => s.reannounced(done, needs_reannounce)?,
            _ = shutdown.cancelled(), if !drain.started() => {
                tracing::info!(in_flight = s.in_flight.len(), "relay stopping: draining acknowledgements");
                drain.start();
            }
            _ = drain.expired(), if drain.started() => {
                tracing::warn!(in_flight = s.in_flight.len(), "Kafka did not acknowledge everything within the drain timeout; stopping without confirming it (the next start replays it)");
                break;
            }
            _ = stall_probe.tick(), if stalled && !drain.started() => {
                if postgres_shutting_down(&s.config.database.url).await {
                    tracing::warn!(
                        in_flight = s.in_flight.len(),
                        "Postgres is shutting down while announcements wait for their acknowledgements; ending the stream unconfirmed so that its walsender can exit (the next stream reads them again)"
                    );
                    return Err(RelayError::PostgresShuttingDown);
                }
            }
            event = client.recv(), if reading => s.event(event.map_err(RelayError::from_replication)?, *needs_reannounce != Reannounce::No).await?,
        }
        if s.in_flight.is_empty() {
            s.waiting_since = None;
        } else if s.waiting_since.is_none() {
            s.waiting_since = Some(Instant::now());
        }
        s.stats.in_flight.store(s.in_flight.len() as u64, std::sync::atomic::Ordering::Relaxed);
        s.confirm(&mut client);
        if drain.started() && s.in_flight.is_empty() {
            break;
        }
    }
    s.finish(client).await
}

/// Whether a new connection to `url` is refused because the server is shutting down
/// (SQLSTATE 57P03, `cannot_connect_now`). Anything else, a timeout included, is "no": the
/// stream keeps waiting for its acknowledgements.
async fn postgres_shutting_down(url: &str) -> bool {
    match tokio::time::timeout(Duration::from_secs(2), crate::connect(url)).await {
        Ok(Ok((_client, connection))) => {
            connection.abort();
            false
        }
        Ok(Err(e)) => crate::sqlstate(&e).is_some_and(|code| code == tokio_postgres::error::SqlState::CANNOT_CONNECT_NOW),
        Err(_) => false,
    }
}

impl Streaming {
    fn new(config: Arc<Config>, stats: Arc<RelayStats>, announcer: Announcer, start: Lsn, token: String) -> Streaming {
        Streaming {
            config,
            stats,
            announcer,
            progress: Progress::new(start),
            relations: Relations::default(),
            in_flight: FuturesUnordered::new(),
            commit_lsn: Lsn::ZERO,
            commit_time: 0,
            token,
            reannounce: None,
            reported: start,
            waiting_since: None,
        }
    }

    /// Whether another event may be read: bounded in messages and in transactions (a run of
    /// transactions without outbox rows still queues one entry each until its commit is
    /// confirmable).
    fn has_room(&self) -> bool {
        self.in_flight.len() < MAX_IN_FLIGHT && self.progress.in_flight() < MAX_TXNS_IN_FLIGHT
    }

    /// Tells the slot what [`Progress::confirmed`] allows, when that moved forward (only
    /// raises wake the replication worker). The status update carries it to Postgres.
    fn confirm(&mut self, client: &mut ReplicationClient) {
        let confirmed = self.progress.confirmed();
        if confirmed > self.reported {
            client.update_applied_lsn(pgwire_replication::Lsn::from_u64(confirmed.0));
            self.stats.confirmed_lsn.store(confirmed.0, std::sync::atomic::Ordering::Relaxed);
            self.reported = confirmed;
        }
    }

    /// Kafka answered for one message: its ticket counts towards the confirmable position, or
    /// the stream ends unconfirmed (librdkafka already retried within its delivery timeout;
    /// the restart replays from the slot).
    fn acked(&mut self, (ticket, committed, read, result): Acked) -> Result<(), RelayError> {
        match result {
            Ok(()) => {
                self.waiting_since = Some(Instant::now());
                self.progress.acked(ticket);
                self.stats.commit_to_ack.observe(seconds_since_pg_micros(committed));
                self.stats.stages.observe_since(Stage::ReadToAck, read);
                self.stats.produced.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.stats.produce_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Err(RelayError::Produce(e))
            }
        }
    }

    fn reannounced(&mut self, done: Result<Result<crate::reannounce::Reannounced, RelayError>, tokio::task::JoinError>, needs_reannounce: &mut Reannounce) -> Result<(), RelayError> {
        self.reannounce = None;
        let slot = &self.config.relay.slot_name;
        match done {
            Ok(Ok(n)) => {
                let why = std::mem::replace(needs_reannounce, Reannounce::No);
                let again = format!(
                    "every Delivery and Forward still PENDING was announced again from Postgres ({} Deliveries, {} Forwards), so nothing is lost; receivers may get some of them twice, with the same webhook-id",
                    n.deliveries, n.forwards
                );
                match why {
                    Reannounce::Recovered(crate::setup::SlotLoss::Invalidated { max_slot_wal_keep_size }) => tracing::error!(
                        %slot,
                        deliveries = n.deliveries,
                        forwards = n.forwards,
                        %max_slot_wal_keep_size,
                        "{SLOT_LOST}: the relay fell further behind than max_slot_wal_keep_size allowed, and Postgres removed WAL the slot still needed; {again}"
                    ),
                    Reannounce::Recovered(crate::setup::SlotLoss::Dropped) => tracing::error!(
                        %slot,
                        deliveries = n.deliveries,
                        forwards = n.forwards,
                        "{SLOT_DROPPED}: it no longer existed (pg_drop_replication_slot, or a restore without it); {again}"
                    ),
                    _ if n.deliveries + n.forwards > 0 => {
                        tracing::warn!(%slot, deliveries = n.deliveries, forwards = n.forwards, "re-announced PENDING work after the slot was created")
                    }
                    _ => tracing::info!(%slot, "slot created; nothing PENDING to re-announce"),
                }
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(e) => Err(RelayError::ReannounceTask(e)),
        }
    }

    /// One replication event.
    async fn event(&mut self, event: Option<ReplicationEvent>, needs_reannounce: bool) -> Result<(), RelayError> {
        match event {
            None => return Err(RelayError::StreamEnded),
            Some(ReplicationEvent::Begin { final_lsn, commit_time_micros, .. }) => {
                self.commit_lsn = Lsn(final_lsn.as_u64());
                self.commit_time = commit_time_micros;
                self.progress.begin()?;
            }
            Some(ReplicationEvent::Commit { end_lsn, .. }) => self.progress.commit(Lsn(end_lsn.as_u64()))?,
            Some(ReplicationEvent::KeepAlive { wal_end, .. }) => self.progress.idle_at(Lsn(wal_end.as_u64())),
            // A non-transactional logical message (the heartbeat of
            // [`crate::health::sample_loop`]) is a WAL position like a keepalive's.
            Some(ReplicationEvent::Message { transactional: false, lsn, prefix, content }) => {
                self.progress.idle_at(Lsn(lsn.as_u64()));
                if prefix == LIVE_PREFIX && content.as_ref() == self.token.as_bytes() {
                    self.live(needs_reannounce);
                }
            }
            // An announcement written by `railhook_announce` in this transaction (CDC mode):
            // one message for a whole statement, an announcement per line. Produced now,
            // like an outbox insert; confirmed with the commit.
            Some(ReplicationEvent::Message { transactional: true, prefix, content, .. }) if prefix.starts_with(MESSAGE_PREFIX_FAMILY) => {
                let created_at = pg_timestamp_text(self.commit_time);
                for announcement in Announcement::parse_message(&prefix, &content, &created_at)? {
                    self.produce(announcement).await?;
                }
            }
            // Someone else's messages (other software may emit its own in this database).
            Some(ReplicationEvent::Message { .. }) => {}
            Some(ReplicationEvent::StoppedAt { .. }) => return Err(RelayError::StreamEnded),
            Some(ReplicationEvent::XLogData { data, .. }) => match pgoutput::decode(&data)? {
                Message::Relation(rel) => self.relations.insert(&rel)?,
                Message::Insert { relation_id, tuple } => {
                    let row = self.relations.row(relation_id, &tuple)?;
                    self.produce(row.announcement()?).await?;
                }
                Message::Begin { .. } | Message::Commit { .. } | Message::Logical { .. } | Message::Origin { .. } | Message::Type { .. } => {}
            },
        }
        Ok(())
    }

    /// The liveness marker came back: the stream is live; re-announce now if the slot is new.
    fn live(&mut self, needs_reannounce: bool) {
        self.stats.live.store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(slot = %self.config.relay.slot_name, "stream is live");
        // From now on this stream decodes every transaction that starts: announcements may
        // go as logical decoding messages (`railhook_store::lifecycle::announce`). Not
        // setting it (Postgres refused) leaves outbox rows, which this relay reads too.
        let url = self.config.database.url.clone();
        tokio::spawn(async move {
            let set = async {
                let (client, conn) = crate::connect(&url).await?;
                let before = railhook_store::lifecycle::announce::set_via(&client, railhook_store::lifecycle::announce::Via::Message).await;
                conn.abort();
                Ok::<_, RelayError>(before?)
            };
            match set.await {
                Ok(Some(before)) => tracing::info!(before = before.as_str(), "announcements now go as logical decoding messages"),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "could not switch announcements to logical decoding messages; they stay outbox rows"),
            }
        });
        if needs_reannounce && self.reannounce.is_none() {
            let url = self.config.database.url.clone();
            self.reannounce = Some(tokio::spawn(async move {
                let (client, conn) = crate::connect(&url).await?;
                let result = crate::reannounce::reannounce_pending(&client).await;
                conn.abort();
                Ok(result?)
            }));
        }
    }

    /// One announcement (an outbox insert, or a line of an announcement message), in this
    /// order: its ticket first, then the message to Kafka (waiting while the producer's queue
    /// is full), then its acknowledgement awaited among the others.
    async fn produce(&mut self, announcement: Announcement) -> Result<(), RelayError> {
        let ticket = self.progress.produced()?;
        self.stats.read.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (read, read_us) = (Instant::now(), stages::unix_micros_now());
        let commit_time_us = self.commit_time + PG_EPOCH_UNIX_MICROS;
        self.stats.stages.observe(Stage::CommitToRead, Duration::from_micros((read_us - commit_time_us).max(0) as u64));
        let stamp = Stamp { commit_lsn: Some(self.commit_lsn), commit_time_us: Some(commit_time_us), relay_read_us: Some(read_us) };
        let delivery = self.announcer.send(&announcement, &stamp).await.map_err(RelayError::Produce)?;
        let committed = self.commit_time;
        self.in_flight.push(Box::pin(async move {
            (ticket, committed, read, delivery.await)
        }));
        Ok(())
    }

    /// After the loop, in this order: forget what is still in flight (it stays unconfirmed),
    /// flush the producer, close the stream, and move the slot to the final confirmed
    /// position (a status update may not have carried it yet).
    async fn finish(self, mut client: ReplicationClient) -> Result<(), RelayError> {
        let flush_started = Instant::now();
        // The flush is quick: nothing is in flight, or the drain timed out.
        let flush_for = if self.in_flight.is_empty() { Duration::from_secs(30) } else { Duration::from_secs(1) };
        drop(self.in_flight);
        if let Err(e) = self.announcer.flush(flush_for).await {
            tracing::warn!(error = %e, "producer flush at shutdown");
        }
        client.shutdown().await.map_err(RelayError::from_replication)?;
        let confirmed = self.progress.confirmed();
        match slot::final_confirm(&self.config, confirmed, Duration::from_secs(5)).await {
            Ok(at) => tracing::info!(confirmed = %at, flush_ms = flush_started.elapsed().as_millis() as u64, "relay stopped; final position confirmed"),
            Err(e) => tracing::warn!(error = %e, %confirmed, "relay stopped, but the final position was not confirmed; the next start replays from the slot"),
        }
        Ok(())
    }
}
