//! What the CDC relay does to its replication slot outside the replication protocol: the
//! liveness marker it writes into the WAL when a stream starts, and the end of a stream (the
//! shutdown drain and the final confirm with `pg_replication_slot_advance`).
//!
//! Contract kept here: the slot never moves past what Kafka acknowledged (the caller passes
//! only [`crate::progress::Progress::confirmed`]), and never backwards.

use std::time::{Duration, Instant};

use railhook_config::Config;
use railhook_core::Lsn;

use crate::RelayError;

/// Prefix of the relay's liveness marker message.
pub const LIVE_PREFIX: &str = "railhook.live";

/// Writes the liveness marker: a non-transactional logical message ([`LIVE_PREFIX`],
/// `token`). When it comes back through the stream, decoding is consistent and every
/// transaction that starts later is in the stream.
pub async fn emit_marker(url: &str, token: &str) -> Result<(), RelayError> {
    let (client, conn) = crate::connect(url).await?;
    let result = client.execute("SELECT pg_logical_emit_message(false, $1, $2)", &[&LIVE_PREFIX, &token]).await;
    conn.abort();
    result?;
    Ok(())
}

/// How long SIGTERM waits for Kafka to acknowledge what is in flight. Past it the relay exits
/// without confirming those messages; the next start replays them from the slot.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// The shutdown drain: once started, the loop stops reading the stream and waits for the
/// acknowledgements in flight, until they are all in or its timeout ([`DRAIN_TIMEOUT`] in
/// the relay) passed.
#[derive(Debug)]
pub struct Drain {
    timeout: Duration,
    deadline: Option<tokio::time::Instant>,
}

impl Drain {
    pub fn new(timeout: Duration) -> Drain {
        Drain { timeout, deadline: None }
    }

    /// Starts the drain; a second call keeps the first deadline.
    pub fn start(&mut self) {
        let timeout = self.timeout;
        self.deadline.get_or_insert_with(|| tokio::time::Instant::now() + timeout);
    }

    pub fn started(&self) -> bool {
        self.deadline.is_some()
    }

    /// Resolves when the drain's time is up; pending until it is started.
    pub async fn expired(&self) {
        match self.deadline {
            Some(deadline) => tokio::time::sleep_until(deadline).await,
            None => std::future::pending().await,
        }
    }
}

/// The final status, once the stream is closed: moves the slot's `confirmed_flush_lsn` to
/// `lsn` with `pg_replication_slot_advance` (the walsender has released the slot by then;
/// retried for `within` while it has not), unless the last status update already got there.
/// Never moves the slot backwards.
pub async fn final_confirm(config: &Config, lsn: Lsn, within: Duration) -> Result<Lsn, RelayError> {
    let (client, conn) = crate::connect(&config.database.url).await?;
    let deadline = Instant::now() + within;
    let result = loop {
        let row = client
            .query_opt("SELECT confirmed_flush_lsn::text, active FROM pg_replication_slots WHERE slot_name = $1", &[&config.relay.slot_name])
            .await?;
        let Some(row) = row else { break Err(RelayError::SlotLost(config.relay.slot_name.clone())) };
        let at: Option<Lsn> = row.try_get::<_, Option<String>>(0)?.and_then(|t| t.parse().ok());
        if at.is_some_and(|at| at >= lsn) {
            break Ok(at.unwrap_or(lsn));
        }
        if !row.try_get::<_, bool>(1)? {
            match client.query_one("SELECT end_lsn::text FROM pg_replication_slot_advance($1, $2::text::pg_lsn)", &[&config.relay.slot_name, &lsn.to_string()]).await {
                Ok(r) => break Ok(r.try_get::<_, String>(0)?.parse().unwrap_or(lsn)),
                // Another relay took the slot in between: it resumes from there.
                Err(e) if Instant::now() >= deadline => break Err(e.into()),
                Err(_) => {}
            }
        }
        if Instant::now() >= deadline {
            break Err(RelayError::SlotState(format!("slot still at {at:?} and active after {within:?}")));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    conn.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_drain_expires_only_once_started() {
        let timeout = Duration::from_millis(50);
        let mut drain = Drain::new(timeout);
        assert!(!drain.started());
        assert!(tokio::time::timeout(timeout * 3, drain.expired()).await.is_err(), "not started: never expires");
        drain.start();
        let started = std::time::Instant::now();
        drain.expired().await;
        assert!(started.elapsed() >= timeout - Duration::from_millis(2));
        drain.start();
        assert!(tokio::time::timeout(Duration::from_millis(5), drain.expired()).await.is_ok(), "a second start keeps the first deadline");
    }
}
