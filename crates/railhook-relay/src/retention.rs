//! Outbox retention: rows older than `relay.outbox_retention_seconds` are deleted in bounded
//! batches (`BATCH` rows per statement, oldest first), every `relay.outbox_cleanup_interval_ms`.
//!
//! CDC mode deletes by age alone: the publication publishes inserts only, so deletes never
//! reach the stream, and a pending insert is decoded from the WAL record, not from the
//! table, so deleting a row the relay has not streamed yet loses nothing. Poll mode deletes
//! only PUBLISHED rows. Concurrent cleaners skip each other's rows (`SKIP LOCKED`).

use std::time::Duration;

use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

/// Rows per DELETE statement.
pub const BATCH: i64 = 5_000;

const CDC_SQL: &str = "
DELETE FROM outbox WHERE id IN (
    SELECT id FROM outbox WHERE created_at < now() - make_interval(secs => $1) ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)";

const POLL_SQL: &str = "
DELETE FROM outbox WHERE id IN (
    SELECT id FROM outbox WHERE created_at < now() - make_interval(secs => $1) AND poll_status = 'PUBLISHED'
    ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)";

/// Deletes expired rows batch by batch until a batch comes back short; returns the count.
pub async fn delete_expired(client: &Client, retention: Duration, poll_mode: bool) -> Result<u64, tokio_postgres::Error> {
    let statement = client.prepare(if poll_mode { POLL_SQL } else { CDC_SQL }).await?;
    let secs = retention.as_secs_f64();
    let mut total = 0;
    loop {
        let n = client.execute(&statement, &[&secs, &BATCH]).await?;
        total += n;
        if (n as i64) < BATCH {
            return Ok(total);
        }
    }
}

/// Runs [`delete_expired`] on an interval until `shutdown`, on its own connection.
pub async fn cleanup_loop(url: String, retention: Duration, every: Duration, poll_mode: bool, shutdown: CancellationToken) {
    let mut client: Option<Client> = None;
    loop {
        if let Some(c) = crate::reconnect(&url, &mut client, "outbox cleanup").await {
            match delete_expired(c, retention, poll_mode).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(deleted = n, "outbox cleanup"),
                Err(e) => tracing::warn!(error = %e, "outbox cleanup failed"),
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
