//! Re-announcement after a slot was created: the Deliveries and Forwards that are still
//! PENDING, unclaimed and not scheduled for a retry get a fresh outbox row (reason
//! `reannounce`), in bounded batches, each batch one statement.
//!
//! Why: an outbox row committed before the slot existed (first start after the API already
//! took events, or a slot that was lost or dropped and recreated) is not in any stream the
//! new slot will decode. The obligation never lived in Kafka; it lives in the row's status,
//! so Postgres is asked again. Rows with `next_retry_at` set belong to the retry scheduler,
//! which finds them by due time in Postgres. Duplicates (a row announced twice) are absorbed
//! by the Claim (`WHERE status = 'PENDING'` matches once).

use tokio_postgres::Client;
use uuid::Uuid;

/// Rows per statement.
pub const BATCH: i64 = 5_000;

const DELIVERIES_SQL: &str = "
WITH batch AS (
    SELECT id, project_id, endpoint_id FROM deliveries
    WHERE status = 'PENDING' AND claim_token IS NULL AND next_retry_at IS NULL AND id > $1
    ORDER BY id LIMIT $2
), marked AS (
    UPDATE deliveries d SET last_announced_at = now() FROM batch WHERE d.id = batch.id
)
INSERT INTO outbox (project_id, delivery_id, routing_id, reason)
SELECT project_id, id, endpoint_id, 'reannounce' FROM batch ORDER BY id
RETURNING delivery_id";

const FORWARDS_SQL: &str = "
WITH batch AS (
    SELECT id, project_id, destination_id FROM forwards
    WHERE status = 'PENDING' AND claim_token IS NULL AND next_retry_at IS NULL AND id > $1
    ORDER BY id LIMIT $2
), marked AS (
    UPDATE forwards f SET last_announced_at = now() FROM batch WHERE f.id = batch.id
)
INSERT INTO outbox (project_id, forward_id, routing_id, reason)
SELECT project_id, id, destination_id, 'reannounce' FROM batch ORDER BY id
RETURNING forward_id";

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reannounced {
    pub deliveries: u64,
    pub forwards: u64,
}

/// Re-announces everything eligible; returns how many rows of each kind.
pub async fn reannounce_pending(client: &Client) -> Result<Reannounced, tokio_postgres::Error> {
    Ok(Reannounced { deliveries: batches(client, DELIVERIES_SQL).await?, forwards: batches(client, FORWARDS_SQL).await? })
}

async fn batches(client: &Client, sql: &str) -> Result<u64, tokio_postgres::Error> {
    let statement = client.prepare(sql).await?;
    let mut after = Uuid::nil();
    let mut total = 0u64;
    loop {
        let rows = client.query(&statement, &[&after, &BATCH]).await?;
        total += rows.len() as u64;
        match rows.iter().map(|r| r.get::<_, Uuid>(0)).max() {
            Some(last) if rows.len() as i64 == BATCH => after = last,
            _ => return Ok(total),
        }
    }
}
