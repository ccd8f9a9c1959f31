//! Railhook's fault-injection suite (`scripts/chaos`, docs/RELIABILITY.md).
//!
//! One run: a private Postgres cluster and a private Kafka broker (the shared servers other
//! tests use are never touched); `railhook api`, `relay` and `worker` as supervised
//! processes of the real binary, with a short retry ladder and short sweeps, reaching
//! Postgres and Kafka through a fault-injecting proxy (Toxiproxy, one proxy per link); a
//! test receiver with healthy and flaky Endpoints; a client that sends a known set of events
//! and provider requests. While it sends, the fault controller injects the planned faults
//! one after another: process kills, Kafka and Postgres restarts, a Postgres crash, the
//! receiver's absence, latency, blackholes and resets on each link, a lost replication slot,
//! a full disk under Postgres, a standby relay's takeover, a worker whose clock runs ahead,
//! attempt tasks that panic. Then the system drains until every Delivery is terminal, and the
//! checkers read Postgres and the receiver's log: whether any accepted event was lost, which
//! duplicate window explains each duplicate arrival, whether anything is stuck, and, per
//! fault kind, what it did to the clients and to delivery times.
//!
//! Modules: [`options`] (a run's size and settings), [`plan`] (the fault kinds and when),
//! [`stack`] and [`procs`] (the processes), [`network`] (the proxy), [`receiver`],
//! [`client`] and [`incoming`] (the two directions' traffic), [`inject`] (the controller),
//! [`record`] (what the run recorded; window 8), [`checker`] (Deliveries), [`forwards`]
//! (Forwards), [`by_kind`] (the report by fault kind), [`report`] and [`run`].
//!
//! Quick mode (what `cargo test` runs, `crates/railhook/tests/chaos.rs`): 500 events over 5
//! Endpoints, one process of each kind, a short list of faults at fixed points (the Postgres
//! crash among them), each in the middle of an ordered burst, a fixed seed.
//!
//! Either transport ([`Options::transport`], `--transport`): on Kafka the above; on inline
//! `railhook all` processes (quick one, full two: one streams from the slot, the other's relay
//! is its standby) and no broker at all, `kill_all` for the single components' kills, the
//! network faults on the `all` processes' link to Postgres, and what needs Kafka listed in
//! the report as not applicable, with the reason ([`plan::skipped_faults`]).

use std::time::Duration;

use tokio::time::Instant;

pub mod by_kind;
pub mod checker;
pub mod client;
pub mod forwards;
pub mod incoming;
pub mod inject;
pub mod network;
pub mod options;
pub mod plan;
pub mod procs;
pub mod receiver;
pub mod record;
pub mod report;
pub mod run;
pub mod stack;

pub use options::Options;
pub use report::{render, write_json, Report};
pub use run::run;

/// Polls `what` until it holds or `within` passed; an error naming `what` then.
pub(crate) async fn wait_for<F, Fut>(within: Duration, what: &str, mut cond: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !cond().await {
        if Instant::now() > deadline {
            anyhow::bail!("timed out after {within:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
