//! Dedupe on `webhook-id` in the receiver's own Postgres transaction: the close of duplicate
//! window 8 (DESIGN.md 4), the only one Railhook cannot close itself.
//!
//! Railhook may send a Delivery more than once with the same `webhook-id`: when the receiver
//! acted but its answer never reached Railhook (a lost response, a timeout, a worker that
//! died mid-Attempt) the Delivery is tried again. [`dedupe`] inserts the id into
//! `processed_webhooks` in the transaction that also writes the effect, so the two commit
//! together or not at all:
//!
//! - first arrival: the insert succeeds, the effect is written, both commit;
//! - a later arrival: the insert does nothing, the handler skips the effect and answers 2xx;
//! - two arrivals at once: the second insert waits on the primary key until the first
//!   transaction ends, then does nothing if it committed (or succeeds if it rolled back);
//! - a crash before commit: neither the id nor the effect is kept, and the retry acts.
//!
//! Deduping in a separate transaction (or a cache) would reopen the window: record first
//! and crash before the effect, and the retry skips an effect that never happened; act
//! first and crash before recording, and the retry acts twice.

use std::time::Duration;

use tokio_postgres::{Error, GenericClient, Transaction};

/// The table [`dedupe`] writes, as plain SQL (idempotent: `IF NOT EXISTS`). Run it with
/// [`migrate`] or paste it into the receiver's own migrations. `processed_at` is what
/// [`prune`] reads.
pub const PROCESSED_WEBHOOKS_DDL: &str = "\
CREATE TABLE IF NOT EXISTS processed_webhooks (
    webhook_id   text        PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS processed_webhooks_processed_at ON processed_webhooks (processed_at);
";

/// Creates `processed_webhooks` if it does not exist ([`PROCESSED_WEBHOOKS_DDL`]).
pub async fn migrate(client: &impl GenericClient) -> Result<(), Error> {
    client.batch_execute(PROCESSED_WEBHOOKS_DDL).await
}

/// Records `webhook_id` in `processed_webhooks` inside `tx`; `true` when this is the first
/// time (do the effect, in `tx`, then commit), `false` when it was already processed (skip
/// the effect and answer 2xx, so Railhook stops retrying).
///
/// Contract: call it in the transaction that writes the effect, before the effect, and
/// commit once after both. Under `REPEATABLE READ` or `SERIALIZABLE` a concurrent duplicate
/// may fail with a serialization error instead of returning `false`; answer 5xx and the
/// retry will see the committed row.
pub async fn dedupe(tx: &Transaction<'_>, webhook_id: &str) -> Result<bool, Error> {
    let inserted = tx
        .execute("INSERT INTO processed_webhooks (webhook_id) VALUES ($1) ON CONFLICT (webhook_id) DO NOTHING", &[&webhook_id])
        .await?;
    Ok(inserted == 1)
}

/// Deletes the ids processed more than `older_than` ago; returns how many. Keep them longer
/// than a Delivery can come again: Railhook retries for up to 96 hours, and an operator may
/// retry a Failed Message (same `webhook-id`) later still, so 30 days is a sensible floor.
pub async fn prune(client: &impl GenericClient, older_than: Duration) -> Result<u64, Error> {
    client
        .execute("DELETE FROM processed_webhooks WHERE processed_at < now() - make_interval(secs => $1)", &[&older_than.as_secs_f64()])
        .await
}
