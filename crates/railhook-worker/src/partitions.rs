//! Keeps the attempt log's daily partitions made ahead (migration 0017,
//! [`railhook_store::attempts::ensure_partitions`]): once at start, then every
//! [`EVERY`]. The only call site; every worker runs it (the SQL serialises callers and makes
//! each partition once), so no singleton lock is needed. Should it stall, nothing fails: an
//! Attempt whose day has no partition goes to the default partition, and the next run moves
//! it out. Dropping old partitions is retention's (`crate::retention`).

use std::time::Duration;

use railhook_store::attempts::{self, DAYS_AHEAD};
use tokio_util::sync::CancellationToken;

/// Between two runs. A week is made ahead, so a worker down for days still finds partitions.
pub const EVERY: Duration = Duration::from_secs(3600);
/// After a failed run (Postgres unreachable, a lock not granted in time).
const RETRY: Duration = Duration::from_secs(60);

pub async fn run(pool: railhook_store::Pool, shutdown: CancellationToken) {
    loop {
        let wait = match ensure(&pool).await {
            Ok(made) => {
                if !made.is_empty() {
                    tracing::info!(partitions = ?made, "made attempts partitions");
                }
                EVERY
            }
            Err(e) => {
                tracing::warn!(error = %e, "attempts partitions: could not make them ahead (Attempts go to the default partition meanwhile)");
                RETRY
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

async fn ensure(pool: &railhook_store::Pool) -> Result<Vec<String>, String> {
    let client = pool.get().await.map_err(|e| e.to_string())?;
    attempts::ensure_partitions(&**client, crate::clock::host_now(), DAYS_AHEAD).await.map_err(|e| e.to_string())
}
