//! The Replay runner (the Time Machine, issue 17): a background loop in every worker that
//! advances running Replays one bounded batch at a time (`railhook_store::replays::run_batch`).
//!
//! - Singleton: each batch takes `railhook_store::locks::REPLAY` as a transaction-level
//!   try-lock, so across all worker processes one batch runs at a time and a crash never
//!   leaves the lock held.
//! - Resumable: a batch's Deliveries, their announcements and the Replay's cursor commit
//!   together; a restarted worker (any of them) goes on from the cursor.
//! - Below live traffic, first by a cap: all Replays together make at most
//!   `replay.max_deliveries_per_second` Deliveries a second (100 by default), whichever
//!   worker runs them: each batch moves a shared pace (`replay_pace`, migration 0019) on by
//!   the Deliveries it made over the cap, and a batch reads at most a tenth of a second's
//!   worth of Events ([`events_per_batch`]), so the Deliveries come smoothly, not in bursts.
//!   `replay.pause_ms` is the least rest after a batch; with nothing running the runner
//!   looks again every [`IDLE`]. Before each batch it also yields
//!   ([`pressure`]): no batch while the replayed Deliveries not yet claimed reach
//!   `2 x replay.batch_size` (the Replay goes no faster than its Deliveries are sent, so its
//!   backlog never queues in front of live hints), nor while a live Delivery has been waiting
//!   for its claim longer than [`LIVE_WAIT_LIMIT`] (the workers are behind on live traffic).
//!   It holds back at most [`MAX_HOLDS`] times in a row, so a backlog that does not drain (a
//!   rate-limited or failing Endpoint) slows a Replay down but never starves it.

use std::time::Duration;

use railhook_config::ReplayConfig;
use railhook_store::replays::{step, Batch, Step};
use tokio_util::sync::CancellationToken;

/// How often an idle runner (nothing running, or another process holds the lock) looks.
pub const IDLE: Duration = Duration::from_secs(1);

/// A live Delivery due and unclaimed for longer than this holds the Replays back: the
/// workers are behind on live traffic.
pub const LIVE_WAIT_LIMIT: Duration = Duration::from_millis(50);

/// Consecutive checks that may hold a batch back before one runs anyway.
pub const MAX_HOLDS: u32 = 10;

/// Due, unclaimed Deliveries (not parked), at most `$1` of them: how many a Replay made, and
/// how long the live one that waits longest has waited since it became due (ms). Through
/// `open_deliveries` (the Deliveries not ended, migration 0032), so its cost is bounded by
/// `$1` rows and the open Deliveries before them.
pub const PRESSURE_SQL: &str = "
SELECT count(*) FILTER (WHERE replay_id IS NOT NULL),
       COALESCE(EXTRACT(EPOCH FROM now() - min(due) FILTER (WHERE replay_id IS NULL)) * 1000, 0)::float8
FROM (SELECT d.replay_id, COALESCE(d.next_retry_at, d.created_at) AS due
      FROM open_deliveries o
      CROSS JOIN LATERAL (SELECT dl.replay_id, dl.next_retry_at, dl.created_at, dl.status, dl.parked_at
                          FROM deliveries dl WHERE dl.id = o.delivery_id OFFSET 0) d
      WHERE d.status = 'PENDING' AND (d.next_retry_at IS NULL OR d.next_retry_at <= now()) AND d.parked_at IS NULL
      LIMIT $1) d";

/// Why the runner holds back, if it does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pressure {
    /// This many replayed Deliveries wait for their claim.
    ReplayBacklog(i64),
    /// A live Delivery has waited this long (ms) for its claim.
    LiveWaiting(f64),
}

/// Whether to hold the next batch back (see the module doc); `None` also when the check
/// itself failed (the batch then finds out).
pub async fn pressure(pool: &railhook_store::Pool, batch_size: i64) -> Option<Pressure> {
    let max_backlog = 2 * batch_size.max(1);
    let client = pool.get().await.ok()?;
    let row = client.query_one(PRESSURE_SQL, &[&(max_backlog + 1_000)]).await.ok()?;
    let (backlog, live_wait_ms): (i64, f64) = (row.try_get(0).ok()?, row.try_get(1).ok()?);
    if live_wait_ms > LIVE_WAIT_LIMIT.as_secs_f64() * 1000.0 {
        Some(Pressure::LiveWaiting(live_wait_ms))
    } else if backlog >= max_backlog {
        Some(Pressure::ReplayBacklog(backlog))
    } else {
        None
    }
}

/// Events one batch reads: a tenth of a second's worth at the cap (one Delivery per Event;
/// a fan-out's batch makes more and the pace rests longer after it), at least 1, at most
/// `replay.batch_size`.
pub fn events_per_batch(config: &ReplayConfig) -> i64 {
    ((config.max_deliveries_per_second / 10.0).ceil() as i64).clamp(1, config.batch_size.max(1))
}

/// Runs batches until `shutdown`. A failed batch rolled back entirely; it is tried again
/// after the idle wait.
pub async fn run(pool: railhook_store::Pool, config: ReplayConfig, shutdown: CancellationToken) {
    let pause = Duration::from_millis(config.pause_ms);
    let size = events_per_batch(&config);
    let mut holds = 0u32;
    loop {
        let held = if holds < MAX_HOLDS { pressure(&pool, size).await } else { None };
        if let Some(p) = held {
            holds += 1;
            tracing::debug!(pressure = ?p, "replay runner: live traffic first");
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(pause.max(Duration::from_millis(50))) => {}
            }
            continue;
        }
        holds = 0;
        let wait = match batch(&pool, size, config.max_deliveries_per_second).await {
            Step::Ran(b) => {
                log(&b);
                pause
            }
            // Not yet: no hold counted, the pace is the Replay's own rule.
            Step::NotBefore(d) => d.clamp(Duration::from_millis(1), IDLE),
            Step::Idle => IDLE,
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

async fn batch(pool: &railhook_store::Pool, size: i64, max_per_second: f64) -> Step {
    let mut client = match pool.get().await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "replay runner: no connection");
            return Step::Idle;
        }
    };
    match step(&mut client, size, Some(max_per_second)).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "replay batch failed (rolled back; tried again)");
            Step::Idle
        }
    }
}

fn log(b: &Batch) {
    tracing::debug!(replay = %b.replay, events = b.events, made = b.made, "replay batch");
    if b.finished {
        tracing::info!(replay = %b.replay, "replay completed");
    }
}
