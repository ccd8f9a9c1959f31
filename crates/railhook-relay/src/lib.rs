//! `railhook relay`: streams committed outbox inserts from a logical replication slot
//! (pgoutput) to Kafka with an idempotent producer, and advances the slot only after Kafka
//! acknowledged (see [`progress`]).
//!
//! Modules: [`pgoutput`] decodes the protocol, [`outbox`] maps inserts to rows, [`progress`]
//! decides what may be confirmed, [`setup`] checks and creates publication and slot,
//! [`stream`] is the loop, [`slot`] writes the liveness marker and ends a stream (drain,
//! final confirm). The Kafka message is [`railhook_kafka::announcement`]'s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use railhook_config::{Config, RelayMode};
use railhook_kafka::Announcer;
use tokio_util::sync::CancellationToken;

pub mod health;
pub mod outbox;
pub mod pgoutput;
pub mod poll;
pub mod progress;
pub mod reannounce;
pub mod retention;
pub mod setup;
pub mod slot;
pub mod stream;

pub use health::RelayMetrics;
pub use stream::RelayStats;

/// The relay's one error type. Each error is classified where it is born: from the SQLSTATE
/// Postgres sent and the variant of the client library's error, never from message text
/// ([`RelayError::is_fatal`]: the operator must act; anything else resumes from the slot).
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("relay cannot start: {0}")]
    Misconfigured(String),
    #[error("replication slot {0} is lost (wal_status 'lost'): its WAL was removed")]
    SlotLost(String),
    /// The slot is not in the state the step needs yet (still active after the stream was
    /// closed, lost but still held by another relay); retried.
    #[error("replication slot: {0}")]
    SlotState(String),
    #[error("Postgres: {}", railhook_store::error::error_chain(.0))]
    Postgres(#[from] tokio_postgres::Error),
    #[error("store: {0}")]
    Store(#[from] railhook_store::StoreError),
    #[error("replication stream: {0}")]
    Replication(#[source] pgwire_replication::PgWireError),
    /// Another walsender streams from the slot (SQLSTATE 55006): this relay is the standby.
    #[error("replication slot in use: {0}")]
    SlotInUse(#[source] pgwire_replication::PgWireError),
    #[error("replication stream ended")]
    StreamEnded,
    /// Postgres refuses connections because it is shutting down while messages wait for
    /// their acknowledgements: the stream ends unconfirmed so that its walsender can exit
    /// (`stream`'s module docs); retried.
    #[error("Postgres is shutting down while announcements wait for acknowledgements")]
    PostgresShuttingDown,
    /// The stream's messages broke the Begin/change/Commit order.
    #[error("replication stream: {0}")]
    Progress(#[from] progress::OrderError),
    #[error("decoding pgoutput: {0}")]
    Decode(#[from] pgoutput::DecodeError),
    #[error("outbox row: {0}")]
    Row(#[from] outbox::RowError),
    /// A `railhook.announce.*` logical decoding message this build cannot read.
    #[error("announcement message: {0}")]
    Announcement(#[from] railhook_kafka::AnnouncementError),
    #[error("re-announcement task: {0}")]
    ReannounceTask(#[source] tokio::task::JoinError),
    /// Kafka refused a message, or it could not be handed over; the producer may be in a
    /// fatal state, so the supervisor builds a new one.
    #[error("producing to Kafka: {0}")]
    Produce(#[source] rdkafka::error::KafkaError),
    #[error("Kafka: {0}")]
    Kafka(#[from] railhook_kafka::KafkaError),
}

impl RelayError {
    /// Credentials the server refuses (SQLSTATE class 28, or pgwire-replication's `Auth`
    /// variant) are the operator's to fix: they end the relay ([`RelayError::is_fatal`])
    /// instead of being retried. 55006 (object in use) on the slot means another relay
    /// streams from it. TLS settings that cannot work are caught before connecting
    /// ([`stream::open`]), so every other error here is retried.
    fn from_replication(e: pgwire_replication::PgWireError) -> RelayError {
        use pgwire_replication::PgWireError;
        use tokio_postgres::error::SqlState;
        match &e {
            PgWireError::Auth(m) => RelayError::Misconfigured(format!("replication connection: authentication failed: {m}")),
            PgWireError::Server(m) => match server_sqlstate(m) {
                // Class 28: invalid authorization specification.
                Some(code) if code.code().starts_with("28") => {
                    RelayError::Misconfigured(format!("replication connection: authentication failed: {m}"))
                }
                Some(code) if code == SqlState::OBJECT_IN_USE => RelayError::SlotInUse(e),
                _ => RelayError::Replication(e),
            },
            _ => RelayError::Replication(e),
        }
    }

    /// See [`RelayError::from_replication`]; the same for `railhook_store::connect`.
    fn from_connect(e: railhook_store::StoreError) -> RelayError {
        match e {
            railhook_store::StoreError::Url(m) => RelayError::Misconfigured(format!("database.url: {m}")),
            e if e.is_auth_failure() => RelayError::Misconfigured(auth_failed(&e)),
            e => RelayError::Store(e),
        }
    }
}

/// The SQLSTATE of the first server error in `e`'s chain, if any.
pub(crate) fn sqlstate(e: &(dyn std::error::Error + 'static)) -> Option<tokio_postgres::error::SqlState> {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(db) = err.downcast_ref::<tokio_postgres::error::DbError>() {
            return Some(db.code().clone());
        }
        if let Some(pg) = err.downcast_ref::<tokio_postgres::Error>() {
            if let Some(code) = pg.code() {
                return Some(code.clone());
            }
        }
        next = err.source();
    }
    None
}

/// The message of a relay stopped by refused credentials: the server's own words.
fn auth_failed(e: &(dyn std::error::Error + 'static)) -> String {
    let mut detail = None;
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(db) = err.downcast_ref::<tokio_postgres::error::DbError>() {
            detail = Some(db.to_string());
            break;
        }
        next = err.source();
    }
    let detail = detail.unwrap_or_else(|| railhook_store::error::error_chain(e));
    format!("authentication failed (check the user and password in database.url): {detail}")
}

/// A connection for `url` (TLS per its `sslmode`), running on a task of its own.
/// A long-lived connection of a background loop: reconnects when `slot` is empty or closed;
/// `None` (after a warning naming `what`) when Postgres cannot be reached this time.
pub(crate) async fn reconnect<'a>(url: &str, slot: &'a mut Option<tokio_postgres::Client>, what: &str) -> Option<&'a tokio_postgres::Client> {
    if slot.as_ref().is_none_or(|c| c.is_closed()) {
        *slot = match railhook_store::connect_as(url, railhook_store::application::RELAY).await {
            Ok((c, _conn)) => Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "{what}: cannot connect to Postgres");
                None
            }
        };
    }
    slot.as_ref()
}

pub(crate) async fn connect(url: &str) -> Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), RelayError> {
    railhook_store::connect_as(url, railhook_store::application::RELAY).await.map_err(RelayError::from_connect)
}

/// Whether an error ends the relay (the operator must act) or is retried from the slot.
impl RelayError {
    pub fn is_fatal(&self) -> bool {
        matches!(self, RelayError::Misconfigured(_) | RelayError::SlotLost(_) | RelayError::Decode(_) | RelayError::Row(_) | RelayError::Announcement(_))
    }

    fn is_slot_in_use(&self) -> bool {
        matches!(self, RelayError::SlotInUse(_))
    }
}

/// The SQLSTATE of a server error as pgwire-replication reports it: the server's error
/// response flattened to text that ends in `(SQLSTATE xxxxx)` (its `parse_error_response`).
/// The code is the only stable part of that text; the message is the server's, in its
/// language.
fn server_sqlstate(message: &str) -> Option<tokio_postgres::error::SqlState> {
    let (_, rest) = message.rsplit_once("(SQLSTATE ")?;
    let code = rest.strip_suffix(')')?;
    (code.len() == 5 && code.bytes().all(|b| b.is_ascii_alphanumeric())).then(|| tokio_postgres::error::SqlState::from_code(code))
}

/// Runs the relay in the configured mode until `shutdown`: the CDC supervisor or the poller,
/// plus the slot-health sampler and the outbox cleanup.
pub async fn run(config: Arc<Config>, metrics: RelayMetrics, shutdown: CancellationToken) -> Result<(), RelayError> {
    run_with(config, metrics, None, shutdown).await
}

/// [`run`], with the transport: `inline` hands every announcement to the worker of this
/// process (`railhook_kafka::inline`); `None` produces to Kafka. The inline transport is
/// `railhook all`'s, which makes the channel and gives the worker its other end.
pub async fn run_with(config: Arc<Config>, metrics: RelayMetrics, inline: Option<railhook_kafka::inline::InlineSender>, shutdown: CancellationToken) -> Result<(), RelayError> {
    let background = shutdown.child_token();
    let every = Duration::from_secs(5).min(Duration::from_millis(config.relay.status_interval_ms * 5));
    let poll_mode = config.relay.mode == RelayMode::Poll;
    let mut tasks = tokio::task::JoinSet::new();
    if !poll_mode {
        tasks.spawn(health::sample_loop(config.database.url.clone(), metrics.clone(), config.relay.slot_name.clone(), every, background.clone()));
    }
    tasks.spawn(retention::cleanup_loop(
        config.database.url.clone(),
        Duration::from_secs(config.relay.outbox_retention_seconds),
        Duration::from_millis(config.relay.outbox_cleanup_interval_ms),
        poll_mode,
        background.clone(),
    ));
    let result = match config.relay.mode {
        RelayMode::Cdc => supervise(config, metrics, inline, shutdown).await,
        RelayMode::Poll => supervise_poll(config, metrics, inline, shutdown).await,
    };
    background.cancel();
    while tasks.join_next().await.is_some() {}
    result
}

/// The poller restarts with a new producer after a produce error (it reconnects to Postgres
/// by itself); rows it had claimed go back to PENDING, so nothing is skipped.
async fn supervise_poll(config: Arc<Config>, metrics: RelayMetrics, inline: Option<railhook_kafka::inline::InlineSender>, shutdown: CancellationToken) -> Result<(), RelayError> {
    let mut backoff = Backoff::new();
    while !shutdown.is_cancelled() {
        let Some(announcer) = connect_producer(&config, inline.as_ref(), &shutdown).await? else { return Ok(()) };
        match poll::run(config.clone(), announcer, metrics.stats.clone(), shutdown.clone()).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_fatal() => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "poller failed; restarting");
                backoff.wait(&shutdown).await;
            }
        }
    }
    Ok(())
}

/// Topics exist and an idempotent producer is built, wrapped in the [`Announcer`]; retried
/// until Kafka answers or `shutdown` (then `None`). With the inline transport, the
/// [`Announcer`] of its channel.
async fn connect_producer(config: &Config, inline: Option<&railhook_kafka::inline::InlineSender>, shutdown: &CancellationToken) -> Result<Option<Announcer>, RelayError> {
    if let Some(sender) = inline {
        return Ok(Some(Announcer::inline(sender.clone(), config)));
    }
    let topics = railhook_kafka::announcement::topics(config);
    let mut backoff = Backoff::new();
    loop {
        match railhook_kafka::ensure_topics(&config.kafka, &topics).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(error = %e, "relay: Kafka not ready, retrying");
                if !backoff.wait(shutdown).await {
                    return Ok(None);
                }
            }
        }
    }
    let mut producer_config = railhook_kafka::idempotent_producer_config(&config.kafka, stream::MAX_IN_FLIGHT);
    // Kafka being down must delay messages, never fail them: the slot holds them meanwhile.
    producer_config.set("message.timeout.ms", "0");
    let producer = producer_config.create().map_err(railhook_kafka::KafkaError::from)?;
    Ok(Some(Announcer::new(producer, config)))
}

/// Exponential backoff from 250 ms to 10 s; `wait` returns false on shutdown.
struct Backoff(Duration);

impl Backoff {
    fn new() -> Backoff {
        Backoff(Duration::from_millis(250))
    }

    fn reset(&mut self) {
        self.0 = Duration::from_millis(250);
    }

    async fn wait(&mut self, shutdown: &CancellationToken) -> bool {
        let d = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(10));
        tokio::select! {
            _ = shutdown.cancelled() => false,
            _ = tokio::time::sleep(d) => true,
        }
    }
}

/// The slot setup's lock (`setup::prepare`), held on by the relay that created the slot until
/// its stream is live (or ended, or [`setup::SETUP_IDLE_TIMEOUT`] passed, when Postgres ends
/// the idle session itself): the session holding it is closed then.
struct SetupLock {
    client: tokio_postgres::Client,
    conn: tokio::task::JoinHandle<()>,
}

impl SetupLock {
    /// How long the lock is held at most after the setup (Postgres ends the session then).
    const MAX_HOLD: Duration = setup::SETUP_IDLE_TIMEOUT;
    /// How often the stream's liveness is looked at meanwhile (only after a slot was created).
    const POLL: Duration = Duration::from_millis(10);

    fn hold(client: tokio_postgres::Client, conn: tokio::task::JoinHandle<()>) -> SetupLock {
        SetupLock { client, conn }
    }

    /// Closes the session once the stream is live, or when the returned token is cancelled
    /// (the stream ended), or after [`SetupLock::MAX_HOLD`].
    fn release_when_live(self, stats: Arc<stream::RelayStats>) -> CancellationToken {
        let ended = CancellationToken::new();
        let token = ended.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + SetupLock::MAX_HOLD;
            while !stats.live.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
                tokio::select! {
                    _ = ended.cancelled() => break,
                    _ = tokio::time::sleep(SetupLock::POLL) => {}
                }
            }
            drop(self.client);
            self.conn.abort();
        });
        token
    }
}

/// The CDC supervisor: set up, wait as a standby while another relay holds the slot, stream,
/// and start over from the slot after any error that is not fatal. A lost or dropped slot is
/// recreated (when `relay.recreate_lost_slot`) and what is still PENDING re-announced.
async fn supervise(config: Arc<Config>, metrics: RelayMetrics, inline: Option<railhook_kafka::inline::InlineSender>, shutdown: CancellationToken) -> Result<(), RelayError> {
    let Some(mut announcer) = connect_producer(&config, inline.as_ref(), &shutdown).await? else { return Ok(()) };
    let mut known = false;
    // Set when this process created the slot; cleared once the re-announcement succeeded.
    let mut needs_reannounce = stream::Reannounce::No;
    let mut waiting_since: Option<Instant> = None;
    let mut backoff = Backoff::new();
    let standby_poll = Duration::from_millis(config.relay.status_interval_ms.min(1_000));
    while !shutdown.is_cancelled() {
        let attempt: Result<(setup::SlotState, Option<SetupLock>), RelayError> = async {
            let (client, conn) = connect(&config.database.url).await?;
            let state = setup::prepare(&client, &config.relay, setup::SlotPolicy::from_config(&config.relay, known)).await;
            let state = match state {
                Ok(s) => s,
                Err(e) => {
                    conn.abort();
                    return Err(e);
                }
            };
            if state.recovered {
                metrics.slot_lost.inc();
            }
            if state.created {
                // This relay owes the re-announcement, which its own stream makes once live:
                // the setup lock stays held until then, so that a relay set up just after
                // this one finds the slot streamed and waits as a standby, instead of
                // winning START_REPLICATION and leaving the debt with a standby.
                return Ok((state, Some(SetupLock::hold(client, conn))));
            }
            conn.abort();
            Ok((state, None))
        }
        .await;
        let (state, setup_lock) = match attempt {
            Ok(s) => s,
            Err(e) if e.is_fatal() => {
                if matches!(e, RelayError::SlotLost(_)) {
                    metrics.slot_lost.inc();
                }
                tracing::error!(error = %e, "relay stopped");
                return Err(e);
            }
            Err(e) => {
                tracing::warn!(error = %e, "relay setup failed, retrying");
                backoff.wait(&shutdown).await;
                continue;
            }
        };
        known = true;
        if state.created {
            needs_reannounce = match state.loss.clone() {
                Some(loss) => stream::Reannounce::Recovered(loss),
                None => stream::Reannounce::Created,
            };
        }
        if let Some(pid) = state.active_pid {
            if waiting_since.is_none() {
                tracing::info!(slot = %config.relay.slot_name, active_pid = pid, "slot is active in another relay: waiting as standby");
                waiting_since = Some(Instant::now());
            }
            metrics.standby.set(1);
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(standby_poll) => {}
            }
            continue;
        }
        if let Some(since) = waiting_since.take() {
            tracing::info!(waited_ms = since.elapsed().as_millis() as u64, "the slot is free: standby taking over");
        }
        metrics.standby.set(0);
        let started = Instant::now();
        let released = setup_lock.map(|lock| lock.release_when_live(metrics.stats.clone()));
        let result = stream::stream(config.clone(), announcer.clone(), state.confirmed_flush, metrics.stats.clone(), &mut needs_reannounce, shutdown.clone()).await;
        if let Some(released) = released {
            released.cancel();
        }
        metrics.stats.live.store(false, std::sync::atomic::Ordering::Relaxed);
        metrics.stats.in_flight.store(0, std::sync::atomic::Ordering::Relaxed);
        match result {
            Ok(()) => return Ok(()),
            Err(e) if e.is_slot_in_use() => {
                // Another relay took the slot between the check and START_REPLICATION.
                if waiting_since.is_none() {
                    tracing::info!(slot = %config.relay.slot_name, "slot is active in another relay: waiting as standby");
                    waiting_since = Some(Instant::now());
                }
                metrics.standby.set(1);
                backoff.wait(&shutdown).await;
                continue;
            }
            Err(e) if e.is_fatal() => {
                tracing::error!(error = %e, "relay stopped");
                return Err(e);
            }
            Err(e) => {
                tracing::warn!(error = %e, "relay stream failed; resuming from the slot");
                if matches!(e, RelayError::Produce(_)) && !announcer.is_inline() {
                    // A fatal producer state (e.g. an idempotence violation) needs a new producer.
                    match connect_producer(&config, None, &shutdown).await? {
                        Some(a) => {
                            // Dropping the last handle of a producer flushes and destroys it,
                            // which blocks.
                            let old = std::mem::replace(&mut announcer, a);
                            tokio::task::spawn_blocking(move || drop(old));
                        }
                        None => return Ok(()),
                    }
                }
                if started.elapsed() > Duration::from_secs(30) {
                    backoff.reset();
                }
                backoff.wait(&shutdown).await;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgwire_replication::PgWireError;

    #[test]
    fn replication_errors_are_classified_by_sqlstate() {
        let server = |m: &str| RelayError::from_replication(PgWireError::Server(m.into()));
        // What pgwire-replication makes of Postgres 15's answers.
        assert!(server("replication slot \"rh\" is active for PID 4242 (SQLSTATE 55006)").is_slot_in_use());
        assert!(matches!(server("password authentication failed for user \"x\" (SQLSTATE 28P01)"), RelayError::Misconfigured(_)));
        assert!(matches!(server("no pg_hba.conf entry for replication connection (SQLSTATE 28000)"), RelayError::Misconfigured(_)));
        // The message text alone decides nothing: a translated server says it otherwise.
        assert!(server("le slot de réplication est actif pour le PID 4242 (SQLSTATE 55006)").is_slot_in_use());
        assert!(!server("replication slot \"rh\" is active for PID 4242").is_slot_in_use(), "no code: not classified");
        let other = server("could not open file (SQLSTATE 58P01)");
        assert!(matches!(other, RelayError::Replication(_)) && !other.is_fatal());
        // The library's error stays the source.
        let in_use = server("replication slot \"rh\" is active for PID 4242 (SQLSTATE 55006)");
        assert!(matches!(std::error::Error::source(&in_use).and_then(|s| s.downcast_ref::<PgWireError>()), Some(PgWireError::Server(_))));
        assert_eq!(server_sqlstate("x (SQLSTATE 55006)"), Some(tokio_postgres::error::SqlState::OBJECT_IN_USE));
        assert_eq!(server_sqlstate("x (SQLSTATE 5500)"), None);
        assert_eq!(server_sqlstate("unknown server error"), None);
    }

    /// By the library's error variant: refused credentials stop the relay; the network, TLS
    /// handshakes (a certificate that does not verify may be fixed on the server's side) and
    /// the rest are retried.
    #[test]
    fn replication_errors_are_classified_by_variant() {
        let e = RelayError::from_replication;
        assert!(e(PgWireError::Auth("SCRAM server error: invalid-proof".into())).is_fatal());
        for retried in [
            PgWireError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
            PgWireError::Tls("TLS handshake failed: invalid peer certificate: UnknownIssuer".into()),
            PgWireError::Tls("TLS config error: written by the library, read as any TLS error".into()),
            PgWireError::Protocol("unexpected message".into()),
            PgWireError::Task("worker ended".into()),
        ] {
            let e = e(retried);
            assert!(matches!(e, RelayError::Replication(_)) && !e.is_fatal() && std::error::Error::source(&e).is_some(), "{e}");
        }
    }

    /// TLS settings that cannot work are found before connecting, from Railhook's own reading
    /// of `database.url` (no server is needed: the port is never dialled).
    #[tokio::test]
    async fn an_unusable_sslrootcert_stops_the_relay_before_it_connects() {
        let mut config = Config::default();
        config.database.url = "postgres://u@127.0.0.1:1/app?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem".into();
        let e = stream::open(&config, railhook_core::Lsn::ZERO).await.err().expect("refused");
        assert!(matches!(e, RelayError::Misconfigured(_)) && e.is_fatal() && e.to_string().contains("/nonexistent/ca.pem"), "{e}");
        config.database.url = "postgres://u@127.0.0.1:1/app?sslmode=verify-everything".into();
        assert!(stream::open(&config, railhook_core::Lsn::ZERO).await.err().expect("refused").is_fatal());
    }

    /// Kafka's and the stream's errors keep their sources; a produce error is retried with a
    /// new producer, an order error from the stream from the slot.
    #[test]
    fn produce_and_order_errors_keep_their_source_and_are_retried() {
        let produce = RelayError::Produce(rdkafka::error::KafkaError::Canceled);
        assert!(!produce.is_fatal() && std::error::Error::source(&produce).is_some());
        let order = RelayError::from(progress::OrderError("Begin inside an open transaction"));
        assert!(!order.is_fatal() && order.to_string().contains("Begin inside an open transaction"));
    }
}
