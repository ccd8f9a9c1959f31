//! The Replay runner (the Time Machine, issue 17): a background loop in every worker that
//! advances running Replays one bounded batch at a time (`railhook_store::replays::run_batch`).
//!
//! - Singleton: each batch takes `railhook_store::locks::REPLAY` as a transaction-level
//!   try-lock, so across all worker processes one batch runs at a time and a crash never
//!   leaves the lock held.
//! - Resumable: a batch's Deliveries, their announcements and the Replay's cursor commit
//!   together; a restarted worker (any of them) goes on from the cursor.
//! - Below live traffic: `replay.batch_size` Events per batch, then `replay.pause_ms` of
//!   rest; with nothing running it looks again every [`IDLE`].

use std::time::Duration;

use railhook_config::ReplayConfig;
use railhook_store::replays::{run_batch, Batch};
use tokio_util::sync::CancellationToken;

/// How often an idle runner (nothing running, or another process holds the lock) looks.
pub const IDLE: Duration = Duration::from_secs(1);

/// Runs batches until `shutdown`. A failed batch rolled back entirely; it is tried again
/// after the idle wait.
pub async fn run(pool: railhook_store::Pool, config: ReplayConfig, shutdown: CancellationToken) {
    let pause = Duration::from_millis(config.pause_ms);
    loop {
        let wait = match batch(&pool, config.batch_size).await {
            Some(b) => {
                log(&b);
                pause
            }
            None => IDLE,
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

async fn batch(pool: &railhook_store::Pool, size: i64) -> Option<Batch> {
    let mut client = match pool.get().await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "replay runner: no connection");
            return None;
        }
    };
    match run_batch(&mut client, size).await {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "replay batch failed (rolled back; tried again)");
            None
        }
    }
}

fn log(b: &Batch) {
    tracing::debug!(replay = %b.replay, events = b.events, made = b.made, "replay batch");
    if b.finished {
        tracing::info!(replay = %b.replay, "replay completed");
    }
}
