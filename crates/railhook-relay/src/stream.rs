//! The CDC loop: replication stream in, Kafka out, progress back to Postgres.
//!
//! Contract: at-least-once. Every committed outbox insert is produced to Kafka before the slot
//! is allowed past its commit ([`crate::progress`]), so a crash at any point replays from the
//! slot and duplicates are absorbed downstream by the Claim (duplicate window 4).
//!
//! Backpressure: at most `MAX_IN_FLIGHT` messages await Kafka's acknowledgement; at the
//! bound the loop stops reading the replication stream (whose own buffer is bounded too), so
//! a stalled cluster turns into replication lag, not memory.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use pgwire_replication::client::ReplicationEvent;
use pgwire_replication::{ReplicationClient, ReplicationConfig, TlsConfig};
use railhook_config::Config;
use railhook_core::Lsn;
use rdkafka::producer::{FutureProducer, Producer};
use railhook_store::connection::RootCerts;
use railhook_store::{DatabaseUrl, SslMode};
use tokio_postgres::config::Host;
use tokio_util::sync::CancellationToken;

use crate::outbox::{OutboxRow, Relations};
use crate::pgoutput::{self, Message};
use crate::progress::{Progress, Ticket};
use crate::RelayError;

/// Messages produced but not yet acknowledged, at most.
pub const MAX_IN_FLIGHT: usize = 10_000;
/// Transactions seen but not yet confirmable, at most.
pub const MAX_TXNS_IN_FLIGHT: usize = 100_000;

/// The replication connection's settings, from `database.url` as
/// [`railhook_store::DatabaseUrl`] reads it: the same `sslmode` (`prefer` tries TLS,
/// `require` encrypts without verifying, `verify-ca`/`verify-full` check the server against
/// `sslrootcert` or the Mozilla roots) and the percent-decoded password, with which
/// pgwire-replication answers SCRAM-SHA-256 (or MD5/cleartext) when the server asks.
pub fn replication_config(config: &Config, start: Lsn) -> Result<ReplicationConfig, RelayError> {
    let url = DatabaseUrl::parse(&config.database.url).map_err(|e| RelayError::Misconfigured(e.to_string()))?;
    let pg = &url.pg;
    let host = match pg.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    // libpq's hostaddr: connect there, and check the certificate against `host`.
    let (addr, tls_name) = match pg.get_hostaddrs().first() {
        Some(ip) => (ip.to_string(), Some(host)),
        None => (host, None),
    };
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    let password = match pg.get_password() {
        None => String::new(),
        Some(p) => String::from_utf8(p.to_vec()).map_err(|_| RelayError::Misconfigured("database.url: the password is not UTF-8".into()))?,
    };
    let ca = match &url.root_certs {
        RootCerts::WebPki => None,
        RootCerts::File(path) => Some(path.clone()),
    };
    let mut tls = match url.ssl_mode {
        SslMode::Disable => TlsConfig::disabled(),
        SslMode::Prefer => TlsConfig { mode: pgwire_replication::SslMode::Prefer, ..TlsConfig::disabled() },
        SslMode::Require => TlsConfig::require(),
        SslMode::VerifyCa => TlsConfig::verify_ca(ca),
        SslMode::VerifyFull => TlsConfig::verify_full(ca),
    };
    match tls_name {
        Some(name) => tls = tls.with_sni_hostname(name),
        // pgwire-replication refuses verify-full for an IP address unless the name to check is
        // given explicitly; rustls checks an IP address against the certificate's IP SANs.
        None if url.ssl_mode == SslMode::VerifyFull && addr.parse::<std::net::IpAddr>().is_ok() => tls = tls.with_sni_hostname(addr.clone()),
        None => {}
    }
    let interval = Duration::from_millis(config.relay.status_interval_ms);
    Ok(ReplicationConfig::new(
        addr,
        pg.get_user().unwrap_or("postgres"),
        password,
        pg.get_dbname().unwrap_or("postgres"),
        config.relay.slot_name.clone(),
        config.relay.publication_name.clone(),
    )
    .with_port(port)
    .with_tls(tls)
    .with_start_lsn(pgwire_replication::Lsn::from_u64(start.0))
    .with_status_interval(interval)
    .with_wakeup_interval(interval)
    .with_buffer_size(4096)
    .with_application_name("railhook-relay"))
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
            live: Default::default(),
            in_flight: Default::default(),
        }
    }
}

/// How long SIGTERM waits for Kafka to acknowledge what is in flight. Past it the relay exits
/// without confirming those messages; the next start replays them from the slot.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// The final status, once the stream is closed: moves the slot's `confirmed_flush_lsn` to
/// `lsn` with `pg_replication_slot_advance` (the walsender has released the slot by then;
/// retried for `within` while it has not), unless the last status update already got there.
/// Never moves the slot backwards.
async fn final_confirm(config: &Config, lsn: Lsn, within: Duration) -> Result<Lsn, RelayError> {
    let (client, conn) = crate::connect(&config.database.url).await?;
    let deadline = Instant::now() + within;
    let result = loop {
        let row = client
            .query_opt("SELECT confirmed_flush_lsn::text, active FROM pg_replication_slots WHERE slot_name = $1", &[&config.relay.slot_name])
            .await?;
        let Some(row) = row else { break Err(RelayError::SlotLost(config.relay.slot_name.clone())) };
        let at: Option<Lsn> = row.get::<_, Option<String>>(0).and_then(|t| t.parse().ok());
        if at.is_some_and(|at| at >= lsn) {
            break Ok(at.unwrap_or(lsn));
        }
        if !row.get::<_, bool>(1) {
            match client.query_one("SELECT end_lsn::text FROM pg_replication_slot_advance($1, $2::text::pg_lsn)", &[&config.relay.slot_name, &lsn.to_string()]).await {
                Ok(r) => break Ok(r.get::<_, String>(0).parse().unwrap_or(lsn)),
                // Another relay took the slot in between: it resumes from there.
                Err(e) if Instant::now() >= deadline => break Err(e.into()),
                Err(_) => {}
            }
        }
        if Instant::now() >= deadline {
            break Err(RelayError::Replication(format!("slot still at {at:?} and active after {within:?}")));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    conn.abort();
    result
}

/// Prefix of the relay's liveness marker message.
pub const LIVE_PREFIX: &str = "railhook.live";

async fn emit_marker(url: &str, token: &str) -> Result<(), RelayError> {
    let (client, conn) = crate::connect(url).await?;
    let result = client.execute("SELECT pg_logical_emit_message(false, $1, $2)", &[&LIVE_PREFIX, &token]).await;
    conn.abort();
    result?;
    Ok(())
}

/// Microseconds from the Unix epoch to the Postgres epoch (2000-01-01).
const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;

fn seconds_since_pg_micros(pg_micros: i64) -> f64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0);
    ((now - PG_EPOCH_UNIX_MICROS - pg_micros).max(0) as f64) / 1e6
}

/// A message handed to the producer: its progress ticket, its commit's time, and Kafka's
/// answer when it comes.
type Acked = (Ticket, i64, Result<(), String>);
type Reannouncing = tokio::task::JoinHandle<Result<crate::reannounce::Reannounced, RelayError>>;

/// The loop's state between events. The order of the steps inside each method is what
/// at-least-once rests on: a row's progress ticket is taken before it is handed to Kafka, a
/// ticket is acknowledged only after Kafka acknowledged its message, and the slot is moved
/// only to what [`Progress::confirmed`] allows, after each event.
struct Streaming {
    config: Arc<Config>,
    stats: Arc<RelayStats>,
    announcer: railhook_kafka::Announcer,
    progress: Progress,
    relations: Relations,
    /// Messages Kafka has not acknowledged yet (at most [`MAX_IN_FLIGHT`]).
    in_flight: FuturesUnordered<std::pin::Pin<Box<dyn std::future::Future<Output = Acked> + Send>>>,
    /// The transaction being read: its commit's end LSN (the `commit_lsn` header) and time.
    commit_lsn: Lsn,
    commit_time: i64,
    /// The liveness marker's token (see [`stream`]).
    token: String,
    reannounce: Option<Reannouncing>,
}

/// Streams from `start` until `shutdown`, then drains in-flight messages and confirms them.
///
/// Liveness marker: once connected, the relay writes a non-transactional logical message
/// (prefix [`LIVE_PREFIX`], a random token) and counts the stream live when it comes back:
/// decoding is then consistent, and every transaction that starts later is in the stream.
/// When `needs_reannounce` is set (the slot was just created), the PENDING work is
/// re-announced at that moment, not before: rows committed while the new stream was still
/// starting are then covered too. On success the flag is cleared, so a failed attempt
/// leaves it for the next one.
pub async fn stream(
    config: Arc<Config>,
    producer: FutureProducer,
    start: Lsn,
    stats: Arc<RelayStats>,
    needs_reannounce: &mut bool,
    shutdown: CancellationToken,
) -> Result<(), RelayError> {
    let mut client = ReplicationClient::connect(replication_config(&config, start)?).await.map_err(RelayError::from_replication)?;
    tracing::info!(slot = %config.relay.slot_name, %start, "replication started");
    stats.live.store(false, std::sync::atomic::Ordering::Relaxed);
    let token = uuid::Uuid::new_v4().to_string();
    emit_marker(&config.database.url, &token).await?;
    let mut s = Streaming {
        announcer: railhook_kafka::Announcer::new(producer.clone()),
        progress: Progress::new(start),
        relations: Relations::default(),
        in_flight: FuturesUnordered::new(),
        commit_lsn: Lsn::ZERO,
        commit_time: 0,
        token,
        reannounce: None,
        config,
        stats,
    };
    let mut stopping = false;
    let mut drain_deadline = tokio::time::Instant::now();
    let mut reported = start;
    loop {
        // Bounded in messages and in transactions (a run of transactions without outbox rows
        // still queues one entry each until its commit is confirmable).
        let reading = !stopping && s.in_flight.len() < MAX_IN_FLIGHT && s.progress.in_flight() < MAX_TXNS_IN_FLIGHT;
        tokio::select! {
            biased;
            Some(acked) = s.in_flight.next(), if !s.in_flight.is_empty() => s.acked(acked)?,
            done = async { s.reannounce.as_mut().expect("guarded").await }, if s.reannounce.is_some() => s.reannounced(done, needs_reannounce)?,
            _ = shutdown.cancelled(), if !stopping => {
                tracing::info!(in_flight = s.in_flight.len(), "relay stopping: draining acknowledgements");
                stopping = true;
                drain_deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
            }
            _ = tokio::time::sleep_until(drain_deadline), if stopping => {
                tracing::warn!(in_flight = s.in_flight.len(), "Kafka did not acknowledge everything within the drain timeout; stopping without confirming it (the next start replays it)");
                break;
            }
            event = client.recv(), if reading => s.event(event.map_err(RelayError::from_replication)?, *needs_reannounce).await?,
        }
        s.stats.in_flight.store(s.in_flight.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let confirmed = s.progress.confirmed();
        if confirmed > reported {
            // Only raises wake the replication worker.
            client.update_applied_lsn(pgwire_replication::Lsn::from_u64(confirmed.0));
            s.stats.confirmed_lsn.store(confirmed.0, std::sync::atomic::Ordering::Relaxed);
            reported = confirmed;
        }
        if stopping && s.in_flight.is_empty() {
            break;
        }
    }
    s.finish(client, producer).await
}

impl Streaming {
    /// Kafka answered for one message: its ticket counts towards the confirmable position, or
    /// the stream ends unconfirmed (librdkafka already retried within its delivery timeout;
    /// the restart replays from the slot).
    fn acked(&mut self, (ticket, committed, result): Acked) -> Result<(), RelayError> {
        match result {
            Ok(()) => {
                self.progress.acked(ticket);
                self.stats.commit_to_ack.observe(seconds_since_pg_micros(committed));
                self.stats.produced.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.stats.produce_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Err(RelayError::Produce(e))
            }
        }
    }

    fn reannounced(&mut self, done: Result<Result<crate::reannounce::Reannounced, RelayError>, tokio::task::JoinError>, needs_reannounce: &mut bool) -> Result<(), RelayError> {
        self.reannounce = None;
        let slot = &self.config.relay.slot_name;
        match done {
            Ok(Ok(n)) => {
                *needs_reannounce = false;
                if n.deliveries + n.forwards > 0 {
                    tracing::warn!(%slot, deliveries = n.deliveries, forwards = n.forwards, "re-announced PENDING work after the slot was created");
                } else {
                    tracing::info!(%slot, "slot created; nothing PENDING to re-announce");
                }
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(e) => Err(RelayError::Replication(format!("re-announcement task: {e}"))),
        }
    }

    /// One replication event.
    async fn event(&mut self, event: Option<ReplicationEvent>, needs_reannounce: bool) -> Result<(), RelayError> {
        let progress_error = |e: crate::progress::OrderError| RelayError::Replication(e.to_string());
        match event {
            None => return Err(RelayError::StreamEnded),
            Some(ReplicationEvent::Begin { final_lsn, commit_time_micros, .. }) => {
                self.commit_lsn = Lsn(final_lsn.as_u64());
                self.commit_time = commit_time_micros;
                self.progress.begin().map_err(progress_error)?;
            }
            Some(ReplicationEvent::Commit { end_lsn, .. }) => self.progress.commit(Lsn(end_lsn.as_u64())).map_err(progress_error)?,
            Some(ReplicationEvent::KeepAlive { wal_end, .. }) => self.progress.idle_at(Lsn(wal_end.as_u64())),
            // A non-transactional logical message (the heartbeat of
            // [`crate::health::sample_loop`]) is a WAL position like a keepalive's.
            Some(ReplicationEvent::Message { transactional: false, lsn, prefix, content }) => {
                self.progress.idle_at(Lsn(lsn.as_u64()));
                if prefix == LIVE_PREFIX && content.as_ref() == self.token.as_bytes() {
                    self.live(needs_reannounce);
                }
            }
            Some(ReplicationEvent::Message { .. }) => {}
            Some(ReplicationEvent::StoppedAt { .. }) => return Err(RelayError::StreamEnded),
            Some(ReplicationEvent::XLogData { data, .. }) => match pgoutput::decode(&data)? {
                Message::Relation(rel) => self.relations.insert(&rel)?,
                Message::Insert { relation_id, tuple } => {
                    let row = self.relations.row(relation_id, &tuple)?;
                    self.produce(&row).await?;
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

    /// One outbox insert: its ticket first, then the message to Kafka (waiting while the
    /// producer's queue is full), then its acknowledgement awaited among the others.
    async fn produce(&mut self, row: &OutboxRow) -> Result<(), RelayError> {
        let announcement = row.announcement()?;
        let ticket = self.progress.produced().map_err(|e| RelayError::Replication(e.to_string()))?;
        self.stats.read.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let delivery = self.announcer.send(&self.config, &announcement, Some(self.commit_lsn)).await.map_err(|e| RelayError::Produce(e.to_string()))?;
        let committed = self.commit_time;
        self.in_flight.push(Box::pin(async move {
            let result = match delivery.await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err((e, _))) => Err(e.to_string()),
                Err(_) => Err("producer dropped the message".to_string()),
            };
            (ticket, committed, result)
        }));
        Ok(())
    }

    /// After the loop: flush the producer, close the stream, and move the slot to the final
    /// confirmed position (a status update may not have carried it yet).
    async fn finish(self, mut client: ReplicationClient, producer: FutureProducer) -> Result<(), RelayError> {
        let flush_started = Instant::now();
        // The flush is quick (nothing is in flight, or the drain timed out), but it blocks, so
        // not on this thread.
        let flush_for = if self.in_flight.is_empty() { Duration::from_secs(30) } else { Duration::from_secs(1) };
        drop(self.in_flight);
        if let Err(e) = tokio::task::spawn_blocking(move || producer.flush(flush_for)).await.map_err(|e| e.to_string()).and_then(|r| r.map_err(|e| e.to_string())) {
            tracing::warn!(error = %e, "producer flush at shutdown");
        }
        client.shutdown().await.map_err(RelayError::from_replication)?;
        let confirmed = self.progress.confirmed();
        match final_confirm(&self.config, confirmed, Duration::from_secs(5)).await {
            Ok(at) => tracing::info!(confirmed = %at, flush_ms = flush_started.elapsed().as_millis() as u64, "relay stopped; final position confirmed"),
            Err(e) => tracing::warn!(error = %e, %confirmed, "relay stopped, but the final position was not confirmed; the next start replays from the slot"),
        }
        Ok(())
    }
}
