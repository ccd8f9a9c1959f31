//! The e2e phases on a clean database each (docs/BENCHMARKS.md, "hot_endpoint and
//! fanout_10"): a fresh stack per phase (database, topics, slot, and the api, relay and worker
//! with default settings), the bench's receiver answering 204 at once, 32 connections, 1 KiB
//! payloads, no warm-up.
//! - `hot_endpoint`: one Endpoint; 10,000 events as fast as they are accepted, then the same
//!   Endpoint at 700 events/s for 20 s (reported as `hot_endpoint_700_per_s`).
//! - `fanout_10`: ten Endpoints subscribed to the one event type; 3,000 events as fast as they
//!   are accepted (30,000 Deliveries).
//! - `light`: one Endpoint at 200 events/s for 30 s after 3 s of the same (not counted): the
//!   light rate on a clean database, where the e2e stack's light phase follows the
//!   saturation search (`light_clean_200_per_s`).
//! - `ordered`: one hot Endpoint with an ordered Subscription, at rising fixed rates (100,
//!   200, 400, 700 and 1,000 events/s, 10 s each); the highest whose every Delivery arrived,
//!   in order and gap-free (the receiver checks each first arrival's `X-Sequence-Number`),
//!   with p99 under 1 s (100 ms at 1,000/s) is `ordered_max_sustained_per_s`, against the poller-based original's ceiling
//!   of about 10 events/s per hot Endpoint (one ordered Delivery per endpoint per 1 s poll).
//!
//! Each load waits for its Deliveries until 60 s after its last 201, then counts what arrived.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::{accepted_deliveries, counters_delta, cpu_delta, cpu_snapshot, ms_between, one_type, total, wait_arrivals, worker_counters, CONNECTIONS};
use crate::http::{get_text, Receiver};
use crate::load::{self, Plan};
use crate::stack::Stack;
use crate::{json, percentiles, Args, Percentiles};

/// The phases, by the name that selects them (`railhook-bench hot_endpoint fanout_10`).
pub const NAMES: [&str; 4] = ["hot_endpoint", "fanout_10", "ordered", "light"];
/// The poller-based original's ceiling for one hot ordered Endpoint: at most 10 rows per
/// endpoint per poll, one poll a second (DESIGN.md 5's polling baseline has the same bounds).
const POLLER_ORDERED_CEILING_PER_S: f64 = 10.0;
/// Every Endpoint of a phase is subscribed to this type, and every event has it.
const EVENT_TYPE: &str = "bench.clean";
/// How long after the last 201 a load waits for its Deliveries.
const WAIT: Duration = Duration::from_secs(60);
/// The longest a counted, closed-loop load may take to send its requests.
const CLOSED_LOOP_CAP: Duration = Duration::from_secs(600);

/// What a load must reach (the targets); `None` and `false` are no target.
struct Targets {
    p50_ms_at_most: Option<f64>,
    max_ms_at_most: Option<f64>,
    every_delivery: bool,
    deliveries_per_s_at_least: Option<f64>,
    p99_ms_at_most: Option<f64>,
    zero_deferrals: bool,
}

/// One load on a phase's stack: `count` requests as fast as accepted (`rate: None`), or `rate`
/// requests per second for `duration`.
struct Load {
    figure: &'static str,
    count: Option<u64>,
    rate: Option<f64>,
    duration: Duration,
    /// Sent before the measured window at the same rate, and not counted.
    warmup: Duration,
    targets: Targets,
}

/// One phase: a clean stack with `endpoints` Endpoints, then its loads in order.
struct Spec {
    name: &'static str,
    endpoints: usize,
    /// The Endpoints' Subscriptions are ordered.
    ordering: bool,
    /// Also run with `api.ingest_pacing = false`, reported beside as `<figure>_pacing_off`:
    /// what pacing buys and costs.
    pacing_off_too: bool,
    loads: &'static [Load],
}

/// A fixed-rate step of the `ordered` phase: every Delivery, in order and gap-free, p99 at
/// most `p99_ms`.
const fn ordered_step(figure: &'static str, rate: f64, p99_ms: f64) -> Load {
    Load {
        figure,
        count: None,
        rate: Some(rate),
        duration: Duration::from_secs(10),
        warmup: Duration::ZERO,
        targets: Targets { p50_ms_at_most: None, max_ms_at_most: None, every_delivery: true, deliveries_per_s_at_least: None, p99_ms_at_most: Some(p99_ms), zero_deferrals: false },
    }
}

static SPECS: [Spec; 4] = [
    Spec {
        name: "hot_endpoint",
        endpoints: 1,
        ordering: false,
        pacing_off_too: true,
        loads: &[
            Load {
                figure: "hot_endpoint",
                count: Some(10_000),
                rate: None,
                duration: CLOSED_LOOP_CAP,
                warmup: Duration::ZERO,
                targets: Targets { p50_ms_at_most: None, max_ms_at_most: None, every_delivery: true, deliveries_per_s_at_least: Some(1_000.0), p99_ms_at_most: Some(250.0), zero_deferrals: true },
            },
            Load {
                figure: "hot_endpoint_700_per_s",
                count: None,
                rate: Some(700.0),
                duration: Duration::from_secs(20),
                warmup: Duration::ZERO,
                targets: Targets { p50_ms_at_most: None, max_ms_at_most: None, every_delivery: false, deliveries_per_s_at_least: None, p99_ms_at_most: Some(100.0), zero_deferrals: true },
            },
        ],
    },
    Spec {
        name: "fanout_10",
        endpoints: 10,
        ordering: false,
        pacing_off_too: true,
        loads: &[Load {
            figure: "fanout_10",
            count: Some(3_000),
            rate: None,
            duration: CLOSED_LOOP_CAP,
            warmup: Duration::ZERO,
            targets: Targets { p50_ms_at_most: None, max_ms_at_most: None, every_delivery: true, deliveries_per_s_at_least: Some(2_500.0), p99_ms_at_most: Some(300.0), zero_deferrals: false },
        }],
    },
    Spec {
        name: "ordered",
        endpoints: 1,
        ordering: true,
        pacing_off_too: false,
        loads: &[
            ordered_step("ordered_100_per_s", 100.0, 1_000.0),
            ordered_step("ordered_200_per_s", 200.0, 1_000.0),
            ordered_step("ordered_400_per_s", 400.0, 1_000.0),
            ordered_step("ordered_700_per_s", 700.0, 1_000.0),
            // Issue 30's target: 1,000 events/s to one ordered Endpoint, p99 at most 100 ms.
            ordered_step("ordered_1000_per_s", 1_000.0, 100.0),
            // No target: 10,000 events as fast as accepted, so deliveries/s is how fast one
            // ordered Endpoint's Deliveries go one after another here (its capacity), the
            // figure the fixed-rate steps are read against (twenty-first session).
            Load {
                figure: "ordered_burst",
                count: Some(10_000),
                rate: None,
                duration: CLOSED_LOOP_CAP,
                warmup: Duration::ZERO,
                targets: Targets { p50_ms_at_most: None, max_ms_at_most: None, every_delivery: true, deliveries_per_s_at_least: None, p99_ms_at_most: None, zero_deferrals: false },
            },
        ],
    },
    Spec {
        name: "light",
        endpoints: 1,
        ordering: false,
        pacing_off_too: false,
        loads: &[Load {
            figure: "light_clean_200_per_s",
            count: None,
            rate: Some(200.0),
            duration: Duration::from_secs(30),
            warmup: Duration::from_secs(3),
            targets: Targets { p50_ms_at_most: Some(2.5), max_ms_at_most: Some(50.0), every_delivery: true, deliveries_per_s_at_least: None, p99_ms_at_most: Some(6.0), zero_deferrals: true },
        }],
    },
];

impl Targets {
    fn met(&self, f: &Figures) -> bool {
        (!self.every_delivery || (f.all_arrived() && f.requests == f.events))
            && f.order_violations == 0
            && self.deliveries_per_s_at_least.is_none_or(|t| f.deliveries_per_s >= t)
            && self.p99_ms_at_most.is_none_or(|t| f.latency.p99 <= t)
            && self.p50_ms_at_most.is_none_or(|t| f.latency.p50 <= t)
            && self.max_ms_at_most.is_none_or(|t| f.latency.max <= t)
            && (!self.zero_deferrals || f.deferrals == 0.0)
    }

    fn json(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        if self.every_delivery {
            m.insert("every_delivery".into(), true.into());
        }
        if let Some(t) = self.deliveries_per_s_at_least {
            m.insert("deliveries_per_s_at_least".into(), t.into());
        }
        if let Some(t) = self.p99_ms_at_most {
            m.insert("p99_ms_at_most".into(), t.into());
        }
        if let Some(t) = self.p50_ms_at_most {
            m.insert("p50_ms_at_most".into(), t.into());
        }
        if let Some(t) = self.max_ms_at_most {
            m.insert("max_ms_at_most".into(), t.into());
        }
        if self.zero_deferrals {
            m.insert("deferrals_at_most".into(), 0.into());
        }
        m.into()
    }

    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.every_delivery {
            parts.push("every Delivery".to_string());
        }
        if let Some(t) = self.deliveries_per_s_at_least {
            parts.push(format!(">= {t:.0} deliveries/s"));
        }
        if let Some(t) = self.p50_ms_at_most {
            parts.push(format!("p50 <= {t} ms"));
        }
        if let Some(t) = self.p99_ms_at_most {
            parts.push(format!("p99 <= {t:.0} ms"));
        }
        if let Some(t) = self.max_ms_at_most {
            parts.push(format!("max <= {t:.0} ms"));
        }
        if self.zero_deferrals {
            parts.push("zero Deferrals".to_string());
        }
        parts.join(", ")
    }
}

/// One load's figures. Rates are over the whole load: `accepted_per_s` from the first request
/// to the last 201, `deliveries_per_s` from the first request to the last arrival.
struct Figures {
    load: &'static Load,
    /// `_pacing_off` when measured with `api.ingest_pacing = false`, else empty.
    suffix: &'static str,
    requests: usize,
    events: usize,
    deliveries: usize,
    delivered: usize,
    duplicates: u64,
    /// First arrivals at an ordered Endpoint out of order or after a gap (0 unordered).
    order_violations: u64,
    accepted_per_s: f64,
    deliveries_per_s: f64,
    phase_s: f64,
    waited_after_last_201_s: f64,
    latency: Percentiles,
    cpu: serde_json::Value,
    worker: serde_json::Value,
    deferrals: f64,
    claims_busy: f64,
    /// The most hints seen waiting in the worker's per-Endpoint queues during the load.
    queue_waiting_peak: f64,
    /// The largest latency of the Deliveries whose 201 came back in each second of the load
    /// (ms, by second since the first request): where in the load a tail happened.
    max_ms_by_second: Vec<f64>,
    /// POSTs held by ingest pacing, and their holds' mean (s).
    ingest_held: f64,
    ingest_held_mean_s: f64,
    /// Each latency stage's count, mean, p50 and p99, and the WAL per Delivery (`stages`).
    stages: serde_json::Value,
}

impl Figures {
    /// Every Delivery of an accepted event arrived by the deadline.
    fn all_arrived(&self) -> bool {
        self.delivered == self.deliveries
    }

    fn met(&self) -> bool {
        self.load.targets.met(self)
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "offered_per_s": self.load.rate, "requests": self.requests, "events": self.events,
            "refused": self.requests - self.events, "deliveries": self.deliveries,
            "delivered": self.delivered, "all_arrived": self.all_arrived(), "duplicates": self.duplicates, "order_violations": self.order_violations,
            "accepted_per_s": self.accepted_per_s, "deliveries_per_s": self.deliveries_per_s,
            "phase_s": self.phase_s, "waited_after_last_201_s": self.waited_after_last_201_s,
            "latency_201_to_arrival": json(&self.latency), "cpu_cores": self.cpu, "worker": self.worker,
            "worker_queue_waiting_peak": self.queue_waiting_peak, "max_ms_by_second": self.max_ms_by_second,
            "api_ingest_held": self.ingest_held, "api_ingest_held_mean_s": self.ingest_held_mean_s, "targets_met": self.met(),
            "stages": self.stages["stages"], "wal_bytes_per_delivery": self.stages["wal_bytes_per_delivery"],
            "postgres_cpu_ms_per_delivery": super::postgres_ms_per_delivery(&self.cpu, self.deliveries_per_s),
        })
    }

    fn row(&self) {
        println!(
            "{:<24} {:>7} {:>11.0} {:>13} {:>12.0} {:>8.2} {:>9.2} {:>9.1} {:>9} {:>7} {:>10}  {} ({})",
            format!("{}{}", self.load.figure, self.suffix), self.events, self.accepted_per_s, format!("{}/{}", self.delivered, self.deliveries), self.deliveries_per_s,
            self.latency.p50, self.latency.p99, self.latency.max, self.deferrals, self.claims_busy, self.queue_waiting_peak,
            if self.met() { "met" } else { "MISSED" }, self.load.targets.describe(),
        );
    }
}

/// The phases' figures and targets, keyed by figure name, for `e2e.figures` and `e2e.targets`.
#[derive(Default)]
pub struct Clean {
    figures: serde_json::Map<String, serde_json::Value>,
    targets: serde_json::Map<String, serde_json::Value>,
}

impl Clean {
    pub fn merge_into(self, e2e: &mut serde_json::Value) {
        for (key, map) in [("figures", self.figures), ("targets", self.targets)] {
            if let Some(into) = e2e[key].as_object_mut() {
                into.extend(map);
            }
        }
    }
}

/// Runs the named phases (`NAMES`), each on its own clean stack, and prints their table.
pub async fn run(args: &Args, names: &[&str]) -> anyhow::Result<Clean> {
    let mut clean = Clean::default();
    let mut all = Vec::new();
    for name in names {
        let spec = SPECS.iter().find(|s| s.name == *name).with_context(|| format!("no e2e phase '{name}'"))?;
        let mut figures = run_spec(args, spec, true).await?;
        if spec.ordering {
            clean.figures.insert("ordered".into(), ordered_summary(&figures));
        }
        if spec.pacing_off_too {
            figures.extend(run_spec(args, spec, false).await?);
        }
        for f in figures {
            let key = format!("{}{}", f.load.figure, f.suffix);
            clean.figures.insert(key.clone(), f.json());
            if f.suffix.is_empty() {
                clean.targets.insert(key, f.load.targets.json());
            }
            all.push(f);
        }
    }
    if !all.is_empty() {
        println!();
        println!("e2e on a clean database each: {CONNECTIONS} connections, 1 KiB payloads; latency from the 201 to the receiver's arrival (ms); rates over the whole phase");
        println!(
            "{:<24} {:>7} {:>11} {:>13} {:>12} {:>8} {:>9} {:>9} {:>9} {:>7} {:>10}  targets",
            "", "events", "accepted/s", "arrived", "deliveries/s", "p50", "p99", "max", "deferrals", "busy", "queue peak"
        );
        all.iter().for_each(Figures::row);
        println!();
    }
    Ok(clean)
}

/// The `ordered` phase's result: the highest step met, against the poller's ceiling.
fn ordered_summary(steps: &[Figures]) -> serde_json::Value {
    let best = steps.iter().filter(|f| f.met()).filter_map(|f| f.load.rate).fold(0.0f64, f64::max);
    println!(
        "ordered: highest rate sustained to one ordered Endpoint with p99 under 1 s: {best:.0} events/s; the poller-based original's ceiling: about {POLLER_ORDERED_CEILING_PER_S:.0}/s ({:.0}x)",
        best / POLLER_ORDERED_CEILING_PER_S
    );
    serde_json::json!({
        "max_sustained_per_s": best,
        "baseline_poller_ceiling_per_s": POLLER_ORDERED_CEILING_PER_S,
        "ratio_over_poller": best / POLLER_ORDERED_CEILING_PER_S,
    })
}

/// The phases alone (`railhook-bench hot_endpoint fanout_10`): an `e2e` report holding only them.
pub async fn report(args: &Args, names: &[&str]) -> anyhow::Result<serde_json::Value> {
    let mut report = serde_json::json!({"name": "e2e", "connections": CONNECTIONS, "payload_bytes": 1024, "figures": {}, "targets": {}});
    run(args, names).await?.merge_into(&mut report);
    Ok(report)
}

/// One phase on a clean stack; `pacing`: `api.ingest_pacing` (the default, on).
async fn run_spec(args: &Args, spec: &'static Spec, pacing: bool) -> anyhow::Result<Vec<Figures>> {
    let (rx, rx_addr) = Receiver::start().await?;
    let suffix = if pacing { "" } else { "_pacing_off" };
    // Its own directory (configs and logs) beside the phase with pacing on.
    let mut stack = Stack::start(&args.bin()?, &format!("{}{suffix}", spec.name), true, |c| c.api.ingest_pacing = pacing).await?;
    for n in 0..spec.endpoints {
        stack.endpoint_with(&format!("http://{rx_addr}/{}/{n}", spec.name), EVENT_TYPE, spec.ordering).await?;
    }
    let mut out = Vec::new();
    let mut ladder_over = false;
    for load in spec.loads {
        // A rate ladder (ordered) stops at its first missed step: higher ones would only
        // queue. A load by count (the ordered burst) runs all the same.
        if ladder_over && load.rate.is_some() {
            continue;
        }
        let f = Figures { suffix, ..measure(&mut stack, &rx, load).await? };
        println!(
            "{}{suffix}: {} of {} Deliveries arrived, {:.0} deliveries/s, p99 {:.1} ms, accepted {:.0}/s, {} POSTs held by ingest pacing (mean {:.0} ms), worker {}",
            load.figure, f.delivered, f.deliveries, f.deliveries_per_s, f.latency.p99, f.accepted_per_s, f.ingest_held, f.ingest_held_mean_s * 1000.0, f.worker
        );
        println!("{}{suffix}: {}", load.figure, super::stages::describe(&f.stages));
        ladder_over |= spec.ordering && !f.met();
        out.push(f);
    }
    stack.check_running()?;
    stack.stop().await;
    Ok(out)
}

/// Runs one load and waits for its Deliveries (until `WAIT` after the last 201).
async fn measure(stack: &mut Stack, rx: &Receiver, load: &'static Load) -> anyhow::Result<Figures> {
    let plan = Plan { count: load.count, warmup: load.warmup, ..super::plan(stack, stack.api_addr, load.rate, load.duration, one_type(EVENT_TYPE)) };
    let (cpu0, counters0, dup0) = (cpu_snapshot(stack), worker_counters(stack).await?, rx.duplicates.load(Ordering::Relaxed));
    let order0 = rx.order_violations.load(Ordering::Relaxed);
    let held0 = ingest_held(stack).await;
    let stages0 = super::stages::snapshot(stack).await;
    let queue = QueuePeak::start(stack);
    let start = Instant::now();
    let sent = load::run(&plan).await?;
    let ids = accepted_deliveries(&sent);
    let accepted: Vec<_> = sent.iter().filter(|s| s.status.as_u16() == 201).collect();
    let last_201 = accepted.iter().map(|s| s.done).max().unwrap_or(start);
    wait_arrivals(stack, rx, &ids, last_201 + WAIT).await?;
    let waited_after_last_201_s = last_201.elapsed().as_secs_f64();
    let cpu = cpu_delta(stack, &cpu0, start.elapsed().as_secs_f64());
    let worker = counters_delta(&counters0, &worker_counters(stack).await?);
    let queue_waiting_peak = queue.finish().await;
    let held1 = ingest_held(stack).await;
    let ingest_held_n = held1.0 - held0.0;
    let first = sent.iter().map(|s| s.started).min().unwrap_or(start);
    let arrivals = rx.arrivals_of(ids.iter().map(|(id, _)| *id));
    let last = arrivals.iter().flatten().max().copied().unwrap_or(last_201);
    let ms: Vec<f64> = ids.iter().zip(&arrivals).filter_map(|((_, done), at)| at.map(|at| ms_between(*done, at))).collect();
    let stages = super::stages::delta(&stages0, &super::stages::snapshot(stack).await, ms.len());
    let secs = |to: Instant| to.saturating_duration_since(first).as_secs_f64().max(1e-3);
    let mut max_ms_by_second = Vec::new();
    for ((_, done), at) in ids.iter().zip(&arrivals) {
        if let Some(at) = at {
            let second = done.saturating_duration_since(first).as_secs() as usize;
            if max_ms_by_second.len() <= second {
                max_ms_by_second.resize(second + 1, 0.0);
            }
            let ms = (ms_between(*done, *at) * 10.0).round() / 10.0;
            max_ms_by_second[second] = f64::max(max_ms_by_second[second], ms);
        }
    }
    Ok(Figures {
        load,
        suffix: "",
        requests: sent.len(),
        events: accepted.len(),
        deliveries: ids.len(),
        delivered: ms.len(),
        duplicates: rx.duplicates.load(Ordering::Relaxed) - dup0,
        order_violations: rx.order_violations.load(Ordering::Relaxed) - order0,
        accepted_per_s: accepted.len() as f64 / secs(last_201),
        deliveries_per_s: ms.len() as f64 / secs(last),
        phase_s: secs(last),
        waited_after_last_201_s,
        latency: percentiles(ms),
        deferrals: total(&worker, "deferrals"),
        claims_busy: total(&worker, "claims_busy"),
        queue_waiting_peak,
        max_ms_by_second,
        ingest_held: ingest_held_n,
        ingest_held_mean_s: if ingest_held_n > 0.0 { (held1.1 - held0.1) / ingest_held_n } else { 0.0 },
        cpu,
        worker,
        stages,
    })
}

/// The API's ingest pacing counters: POSTs held and their seconds held in all (zeros when
/// pacing is off or the metrics cannot be read).
async fn ingest_held(stack: &Stack) -> (f64, f64) {
    let text = get_text(&format!("http://{}/metrics", stack.api_addr)).await.unwrap_or_default();
    let read = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok()).unwrap_or(0.0);
    (read("railhook_api_ingest_held_total"), read("railhook_api_ingest_held_seconds_sum"))
}

/// The peak of the worker's `railhook_worker_queue_waiting` gauge, sampled every 200 ms.
struct QueuePeak {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<f64>,
}

impl QueuePeak {
    fn start(stack: &Stack) -> QueuePeak {
        let url = format!("http://{}/metrics", stack.config.worker.ops_listen);
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut peak = 0.0f64;
            while !stopped.is_cancelled() {
                let text = get_text(&url).await.unwrap_or_default();
                let gauge = text.lines().find_map(|l| l.strip_prefix("railhook_worker_queue_waiting ")?.trim().parse::<f64>().ok());
                peak = peak.max(gauge.unwrap_or(0.0));
                tokio::select! {
                    _ = stopped.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            }
            peak
        });
        QueuePeak { stop, task }
    }

    async fn finish(self) -> f64 {
        self.stop.cancel();
        self.task.await.unwrap_or(0.0)
    }
}
