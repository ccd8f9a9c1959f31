//! Deleting an Endpoint, a Destination or a Source: the history behind it (Deliveries,
//! Forwards, Incoming Events) goes first, in batches of [`BATCH`] rows, each batch its own
//! short transaction; the row itself last, whose cascades then find at most the few rows made
//! meanwhile. The owner is disabled first, so that no new Delivery or Forward is made for it
//! and the worker sends nothing more to it while its history goes.
//!
//! Why not the foreign keys' `ON DELETE CASCADE` alone: it deletes everything in the one
//! statement. For an Endpoint with a million Deliveries that transaction ran 6.7 s, and its
//! commit held the relay up while logical decoding replayed its million changes: a light
//! load's p99 (ingest to arrival) on another Endpoint went from 23 ms to 2.0 s
//! (`railhook-worker/tests/delete_under_load.rs`). A delete interrupted half-way leaves the
//! owner disabled with part of its history; deleting it again finishes the work.
//!
//! `db` must not be inside a transaction (the batches would be one transaction again). A
//! Subscription's delete touches no Delivery (a Delivery keeps the id of the Subscription that
//! made it, migration 0027), so it is one statement (`subscriptions::delete_subscription`).

use tokio_postgres::types::ToSql;
use tokio_postgres::GenericClient;

use crate::StoreError;

/// Rows deleted per transaction, as `railhook admin project erase` does.
pub const BATCH: i64 = 1_000;

/// Runs `sql` (a DELETE of at most `$2` rows of the owner `$1`, answering how many it deleted)
/// until a batch comes back short; how many rows in all.
pub(crate) async fn in_batches(db: &impl GenericClient, sql: &str, owner: &(dyn ToSql + Sync)) -> Result<u64, StoreError> {
    let mut total = 0u64;
    loop {
        let n: i64 = db.query_one(sql, &[owner, &BATCH]).await?.try_get(0)?;
        total += n.max(0) as u64;
        if n < BATCH {
            return Ok(total);
        }
    }
}

/// An Endpoint's Deliveries (`deliveries_endpoint_idx`), with the rows of those still open in
/// `open_deliveries` and `delivery_claims` (migration 0032; no foreign key takes them along).
pub const ENDPOINT_DELIVERIES: &str = "WITH gone AS (
    DELETE FROM deliveries WHERE id = ANY (ARRAY(SELECT id FROM deliveries WHERE endpoint_id = $1 LIMIT $2))
    RETURNING id, project_id, endpoint_id, status
), closed AS (
    DELETE FROM open_deliveries o WHERE o.delivery_id = ANY (ARRAY(SELECT id FROM gone WHERE status IN ('PENDING', 'PROCESSING')))
), unclaimed AS (
    DELETE FROM delivery_claims c USING gone
    WHERE gone.status = 'PROCESSING' AND c.project_id = gone.project_id AND c.endpoint_id = gone.endpoint_id AND c.delivery_id = gone.id
) SELECT count(*) FROM gone";

/// A Destination's Forwards (`forwards_destination_idx`).
pub(crate) const DESTINATION_FORWARDS: &str = "WITH gone AS (
    DELETE FROM forwards WHERE id = ANY (ARRAY(SELECT id FROM forwards WHERE destination_id = $1 LIMIT $2)) RETURNING 1
) SELECT count(*) FROM gone";

/// The Forwards of a Source's Destinations, one Destination after the other.
pub(crate) const SOURCE_FORWARDS: &str = "WITH gone AS (
    DELETE FROM forwards WHERE id = ANY (ARRAY(
        SELECT f.id FROM destinations d CROSS JOIN LATERAL (
            SELECT id FROM forwards WHERE destination_id = d.id LIMIT $2
        ) f WHERE d.source_id = $1 LIMIT $2)) RETURNING 1
) SELECT count(*) FROM gone";

/// A Source's Incoming Events (`incoming_events_source_idx`), once their Forwards are gone.
pub(crate) const SOURCE_INCOMING_EVENTS: &str = "WITH gone AS (
    DELETE FROM incoming_events WHERE id = ANY (ARRAY(SELECT id FROM incoming_events WHERE source_id = $1 LIMIT $2)) RETURNING 1
) SELECT count(*) FROM gone";
