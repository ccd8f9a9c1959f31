//! What one run is: its size, its topology, its timings, and the settings of the product it
//! runs with (a short Retry Ladder and short sweeps, so that a run takes minutes).

use std::path::PathBuf;
use std::time::Duration;

use rand::Rng;
pub use railhook_config::TransportKind;

use crate::plan::FaultKind;
use crate::receiver::Profile;

/// The Retry Ladder of every Subscription: short, and long enough in total (about 150 s,
/// at least 75 s with the jitter) that neither the flaky receivers nor the receiver's
/// one-minute absence can exhaust 20 Attempts.
pub const RETRY_DELAYS: [i64; 7] = [1, 1, 2, 3, 5, 8, 10];
pub const MAX_ATTEMPTS: i64 = 20;
/// Subscription timeouts: flaky Endpoints 2 s (their hangs and slow answers are measured
/// against it), healthy ones 5 s.
pub const FLAKY_TIMEOUT_S: i64 = 2;
pub const HEALTHY_TIMEOUT_S: i64 = 5;
/// `worker.endpoint_concurrency` of the run: low, so that the unordered bursts to a healthy
/// Endpoint reach it, and the receiver can tell whether any fault let more through.
pub const ENDPOINT_CONCURRENCY: i32 = 4;
/// `worker.stranded_after_seconds` of the run: a minute, so that what goes again within
/// seconds after a fault (a claim a Postgres crash forgot) is seen to go through the
/// re-announcement after the restart, not through this sweep.
pub const STRANDED_AFTER_S: u64 = 60;
/// `worker.ordering_gap_timeout_seconds` of the run: above anything a fault can hold an
/// ordered Delivery, so a gap timeout never has to fire and any that fires fails the run.
/// The gap timeout counts from a Delivery's first park, which can be long before its
/// predecessor is the one at the head of the Endpoint: what it must outlast is the backlog
/// ahead of it when it parked (a burst on a flaky Endpoint: a minute or two, more behind a
/// killed worker's Delivery, which waits for the 20 s PROCESSING sweep) plus its predecessor's
/// whole Retry Ladder (at most 20 Attempts: 150 s of waits, 225 s with the jitter, plus 20
/// timeouts of 2-5 s: under 330 s), which also contains the receiver's absence (60 s in a
/// full run), the network faults (20 s) and the Postgres and Kafka restarts. 600 s is above
/// the sum; the default, 60 s, is not (the full run's outage alone is 60 s), and a gap
/// timeout sends a Delivery before its predecessor, out of order by design.
pub const ORDERING_GAP_TIMEOUT_S: u64 = 600;
pub const ADMIN_TOKEN: &str = "chaos-admin-token-0123456789";

#[derive(Debug, Clone)]
pub struct Options {
    /// The `railhook` binary to run.
    pub railhook_bin: PathBuf,
    pub quick: bool,
    pub events: usize,
    pub endpoints: usize,
    /// Events per second the client offers (the send phase lasts about events / rate).
    pub rate: f64,
    pub concurrency: usize,
    pub seed: u64,
    /// Injections of each kind that kills a process (full mode; quick mode: one each).
    pub kills_per_component: usize,
    /// Which fault kinds the run injects (the mode's plan, filtered); all by default.
    pub only: Option<Vec<FaultKind>>,
    /// How long the receiver stays away.
    pub outage: Duration,
    /// How long a network fault lasts (the blackhole: [`Options::blackhole`]).
    pub net_fault: Duration,
    /// How long a network blackhole lasts (the 20 s).
    pub blackhole: Duration,
    /// How long the data disk of Postgres stays full.
    pub disk_full: Duration,
    /// How long the worker with the clock 30 s ahead runs.
    pub clock_skew: Duration,
    /// How long a killed component stays dead before its supervisor starts it again.
    pub restart_delay: Duration,
    /// How long the drain may take before what is left counts as stuck.
    pub drain_timeout: Duration,
    /// Keep the run's folder (logs, configuration, receiver log) even when it passed.
    pub keep: bool,
    /// Events of each ordered burst to a healthy ordered Endpoint (one burst per fault).
    pub ordered_burst: usize,
    /// Events of each ordered burst to a flaky ordered Endpoint: fewer, because a flaky
    /// Endpoint's ordered Deliveries go one at a time through its 500s and timeouts (about
    /// 1 s each), and that backlog is what the drain waits for.
    pub ordered_burst_flaky: usize,
    /// Provider events sent to the ingress during the send phase (plus a resend of every
    /// `incoming::RESEND_EVERY`-th), spread over the same time as the paced events.
    pub incoming: usize,
    /// Provider events sent to the ingress as fast as it takes them around each fault (the
    /// fault waits for half of them with the ordered burst's half), so that every fault hits
    /// Forwards in flight.
    pub incoming_burst: usize,
    /// Standard Webhooks Sources; Source `s` has `1 + s % 2` Destinations, every other
    /// Destination flaky.
    pub sources: usize,
    /// `railhook worker` processes in one consumer group (quick 1, full 2).
    pub workers: usize,
    /// `railhook api` processes (quick 1, full 2); the client sends to each in turn.
    pub apis: usize,
    /// `railhook relay` processes on the one slot (quick 1, full 2: one streams, the other
    /// waits as its hot standby).
    pub relays: usize,
    /// How announcements go from the relay to the workers: `kafka` (the processes above and a
    /// private broker) or `inline` (`railhook all` processes, [`Options::alls`] of them, and
    /// no Kafka at all).
    pub transport: TransportKind,
    /// `railhook all` processes on the inline transport (quick 1, full 2: one streams from
    /// the slot and its worker gets the announcements, the other's relay is its hot standby).
    /// Unused on Kafka.
    pub alls: usize,
}

impl Options {
    /// The deterministic short mode: 500 events over 5 Endpoints, one process of each kind,
    /// one fault of each of a short list of kinds (the Postgres crash among them).
    pub fn quick(railhook_bin: PathBuf) -> Options {
        Options {
            railhook_bin,
            quick: true,
            events: 500,
            endpoints: 5,
            rate: 20.0,
            concurrency: 4,
            seed: 7,
            kills_per_component: 1,
            only: None,
            outage: Duration::from_secs(4),
            net_fault: Duration::from_secs(3),
            blackhole: Duration::from_secs(5),
            disk_full: Duration::from_secs(5),
            clock_skew: Duration::from_secs(20),
            restart_delay: Duration::from_millis(500),
            drain_timeout: Duration::from_secs(150),
            keep: false,
            ordered_burst: 20,
            ordered_burst_flaky: 4,
            incoming: 100,
            incoming_burst: 20,
            sources: 3,
            workers: 1,
            apis: 1,
            relays: 1,
            transport: TransportKind::Kafka,
            alls: 1,
        }
    }

    /// The full suite: 50,000 events over 20 Endpoints, two api, two relay (active and hot
    /// standby) and two worker processes, every fault kind at seeded points.
    pub fn full(railhook_bin: PathBuf) -> Options {
        Options {
            railhook_bin,
            quick: false,
            events: 50_000,
            endpoints: 20,
            rate: 100.0,
            concurrency: 6,
            seed: rand::rng().random(),
            kills_per_component: 3,
            only: None,
            outage: Duration::from_secs(60),
            net_fault: Duration::from_secs(10),
            blackhole: Duration::from_secs(20),
            disk_full: Duration::from_secs(15),
            clock_skew: Duration::from_secs(40),
            restart_delay: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(900),
            keep: false,
            ordered_burst: 25,
            ordered_burst_flaky: 5,
            incoming: 2_000,
            incoming_burst: 20,
            sources: 4,
            workers: 2,
            apis: 2,
            relays: 2,
            transport: TransportKind::Kafka,
            alls: 2,
        }
    }
}

impl Options {
    /// Whether the run is on the inline transport (`railhook all` processes, no Kafka).
    pub fn inline(&self) -> bool {
        self.transport == TransportKind::Inline
    }
}

/// Parses `--transport`: `kafka` or `inline`.
pub fn parse_transport(name: &str) -> Option<TransportKind> {
    match name.trim() {
        "kafka" => Some(TransportKind::Kafka),
        "inline" => Some(TransportKind::Inline),
        _ => None,
    }
}

/// Whether Endpoint `j` gets an ordered Subscription: one in five, and the third after it
/// (quick: 0 healthy and 2 flaky; full, where every other one is flaky: 0, 2, 10, 12 healthy
/// and 5, 7, 15, 17 flaky, 8 of 20).
pub fn is_ordered(j: usize) -> bool {
    matches!(j % 5, 0 | 2)
}

/// `RETRY_DELAYS`, its last wait repeated, as `MAX_ATTEMPTS - 1` waits.
pub fn incoming_ladder() -> Vec<i32> {
    (0..MAX_ATTEMPTS as usize - 1).map(|i| RETRY_DELAYS[i.min(RETRY_DELAYS.len() - 1)] as i32).collect()
}

/// The wait after Attempt `attempt` (1-based) failed, before the jitter.
pub fn ladder_wait(attempt: usize) -> i64 {
    RETRY_DELAYS[attempt.saturating_sub(1).min(RETRY_DELAYS.len() - 1)]
}

/// Per Source, how many Destinations: 1, 2, 1, 2, ...
pub fn destinations_per_source(opts: &Options) -> Vec<usize> {
    (0..opts.sources).map(|s| 1 + s % 2).collect()
}

/// Destination `d` (in creation order) is flaky when `d` is odd.
pub fn destination_profile(d: usize) -> Profile {
    if d % 2 == 1 {
        Profile::flaky()
    } else {
        Profile::Healthy
    }
}

/// Quick: endpoints 0 and 1 healthy, the rest flaky. Full: every other one flaky.
pub fn profile_for(j: usize, quick: bool) -> Profile {
    let flaky = if quick { j >= 2 } else { j % 2 == 1 };
    if flaky {
        Profile::flaky()
    } else {
        Profile::Healthy
    }
}
