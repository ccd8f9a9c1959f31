//! The vacuum of the Claims' and open Deliveries' tables (`railhook_store::lifecycle::vacuum_claims`),
//! every `worker.claims_vacuum_interval_ms` (0: off, left to autovacuum). Every Delivery adds
//! a row to each and removes it, and every claim counts its Project's and Endpoint's Claims
//! by the index: with autovacuum's one look a minute, that count read the dead entries of
//! every Delivery of the last minute (issue 30). Each worker runs it; two at once do not wait
//! for each other (`SKIP_LOCKED`).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub async fn run(pool: railhook_store::Pool, interval_ms: u64, shutdown: CancellationToken) {
    if interval_ms == 0 {
        return;
    }
    let every = Duration::from_millis(interval_ms);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        match pool.get().await {
            Ok(client) => {
                if let Err(e) = railhook_store::lifecycle::vacuum_claims(&**client).await {
                    tracing::warn!(error = %e, "vacuum of delivery_claims and open_deliveries failed");
                }
            }
            Err(e) => tracing::debug!(error = %e, "claims vacuum: no connection"),
        }
    }
}
