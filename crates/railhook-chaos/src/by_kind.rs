//! The report by fault kind: what each kind injected, what the clients saw, and what was
//! lost, duplicated, stuck or slow because of it. A pure function over what the run
//! recorded, like the checkers, and tested the same way.
//!
//! Attribution: the faults run one after another, so the run's time is cut into segments,
//! each from a fault's start to the next fault's start (the last to the end of the run).
//! A lost or stuck Delivery (or Forward) belongs to the segment in which its event was
//! accepted; a duplicate arrival and a client's 5xx or connection error to the segment in
//! which they happened. What came before the first fault is the `baseline`. The longest
//! accepted-to-arrival time is over the Deliveries of healthy Endpoints' unordered
//! Subscriptions (which answer at once, so the time is the pipeline's), from the client's
//! answer to the first 2xx arrival, for the events accepted in the segment; the longest
//! across a fault, for the events accepted before it began and arrived after.
//!
//! Checks by kind (each fails the run): `postgres_crash`: a Delivery whose claim the crash
//! forgot (two Attempts with one number) went again within [`FORGOTTEN_RESEND_MAX_S`] of
//! Postgres being up; `slot_invalidation`: the slot was lost, exactly one relay log line
//! said so in an operator's words, the lost-slot counter rose; `relay_standby_takeover`:
//! the standby took over; `disk_full`: the ingest answered 503; `clock_skew`: the skewed
//! worker's requests arrived, and none of its retries came early or late; `task_panic`:
//! tasks panicked. Across the run: no Endpoint had more requests in flight at the receiver
//! than its concurrency limit, and every 5xx the clients got was the API's JSON error.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::checker::{AcceptedEvent, DeliveryRow, SubscriptionSpec, Verdict};
use crate::client::Trouble;
use crate::forwards::{ForwardsVerdict, IncomingRequest};
use crate::options::ladder_wait;
use crate::plan::FaultKind;
use crate::receiver::Arrival;
use crate::record::{AttemptRow, FaultRecord};

/// How soon after Postgres is up again a Delivery whose claim the crash forgot must go again.
pub const FORGOTTEN_RESEND_MAX_S: i64 = 30;
/// A retry timed by the skewed worker is early when it comes more than this before half its
/// wait (the jitter's least), late when more than [`LATE_SLACK_S`] after one and a half.
const EARLY_SLACK_MS: i64 = 500;
const LATE_SLACK_S: i64 = 15;

/// What the report by kind reads.
pub struct KindInputs<'a> {
    pub faults: &'a [FaultRecord],
    pub accepted: &'a [AcceptedEvent],
    pub incoming: &'a [IncomingRequest],
    pub subscriptions: &'a [SubscriptionSpec],
    /// Endpoints that answer 200 at once.
    pub healthy_endpoints: &'a HashSet<Uuid>,
    pub deliveries: &'a [DeliveryRow],
    pub attempts: &'a [AttemptRow],
    /// The Endpoints' arrivals (not the Destinations').
    pub arrivals: &'a [Arrival],
    pub troubles: &'a [Trouble],
    pub verdict: &'a Verdict,
    pub forwards: &'a ForwardsVerdict,
    /// `worker.endpoint_concurrency`.
    pub endpoint_concurrency: usize,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ClientSaw {
    pub answered_5xx: usize,
    pub answered_503: usize,
    pub answered_429: usize,
    pub timeouts: usize,
    pub connection_errors: usize,
    /// 5xx answers whose body was not the API's JSON error.
    pub non_json_5xx: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Injection {
    pub at: DateTime<Utc>,
    pub lasted_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    pub at_accepted: usize,
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub detail: serde_json::Value,
}

/// One fault kind's entry of the report (or the baseline's).
#[derive(Debug, Clone, Default, Serialize)]
pub struct KindReport {
    pub injected: usize,
    pub injections: Vec<Injection>,
    pub clients_saw: ClientSaw,
    pub lost: usize,
    pub lost_forwards: usize,
    pub duplicates_window_8: usize,
    pub duplicates_unexplained: usize,
    pub stuck: usize,
    /// Healthy Endpoints' unordered Deliveries of the events accepted in the kind's segments.
    pub longest_accepted_to_arrival_ms: Option<i64>,
    /// The same, of the events accepted before a fault of the kind began and not yet
    /// arrived then: in flight across it.
    pub longest_across_ms: Option<i64>,
    /// The most requests one Endpoint had in flight at the receiver at once.
    pub max_endpoint_concurrency: usize,
    /// The kind's own figures (see the module's documentation).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub figures: BTreeMap<String, serde_json::Value>,
    pub failures: Vec<String>,
    pub passed: bool,
}

/// The whole: per kind, the baseline, and the run's own failures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ByKind {
    pub kinds: BTreeMap<String, KindReport>,
    pub baseline: KindReport,
    pub max_endpoint_concurrency: usize,
    pub failures: Vec<String>,
}

/// The segments: fault `i` owns `[started_i, started_{i+1})`.
struct Segments {
    starts: Vec<DateTime<Utc>>,
}

impl Segments {
    /// The fault owning `t`, or `None` before the first.
    fn of(&self, t: DateTime<Utc>) -> Option<usize> {
        self.starts.partition_point(|s| *s <= t).checked_sub(1)
    }
}

pub fn by_kind(k: &KindInputs) -> ByKind {
    let mut faults: Vec<&FaultRecord> = k.faults.iter().collect();
    faults.sort_by_key(|f| f.started_at);
    let seg = Segments { starts: faults.iter().map(|f| f.started_at).collect() };
    let mut out = ByKind::default();
    // Every kind injected gets an entry, in the report's order.
    for f in &faults {
        let r = out.kinds.entry(f.kind.name().to_string()).or_default();
        r.injected += 1;
        r.injections.push(Injection {
            at: f.started_at,
            lasted_s: (f.ended_at - f.started_at).num_milliseconds() as f64 / 1000.0,
            link: f.link.map(|l| l.name()),
            at_accepted: f.at_accepted,
            detail: f.detail.clone(),
        });
    }
    let name_of = |i: Option<usize>| i.map(|i| faults[i].kind.name());
    let with = |out: &mut ByKind, i: Option<usize>, f: &mut dyn FnMut(&mut KindReport)| match name_of(i) {
        Some(name) => f(out.kinds.get_mut(name).expect("every injected kind has an entry")),
        None => f(&mut out.baseline),
    };

    // What the clients saw.
    for t in k.troubles {
        with(&mut out, seg.of(t.at), &mut |r| {
            let c = &mut r.clients_saw;
            match t.what {
                "5xx" => {
                    c.answered_5xx += 1;
                    c.answered_503 += usize::from(t.status == Some(503));
                    c.non_json_5xx += usize::from(!t.json_error);
                }
                "429" => c.answered_429 += 1,
                "timeout" => c.timeouts += 1,
                _ => c.connection_errors += 1,
            }
        });
    }

    // Lost and stuck, by the time their event was accepted.
    let accepted_at: HashMap<Uuid, DateTime<Utc>> = k.accepted.iter().map(|e| (e.id, e.accepted_at)).collect();
    let incoming_at: HashMap<Uuid, DateTime<Utc>> = k.incoming.iter().filter(|r| !r.resend).map(|r| (r.id, r.answered_at)).collect();
    for e in &k.verdict.lost_events {
        with(&mut out, accepted_at.get(e).and_then(|t| seg.of(*t)), &mut |r| r.lost += 1);
    }
    for e in &k.verdict.stuck_events {
        with(&mut out, accepted_at.get(e).and_then(|t| seg.of(*t)), &mut |r| r.stuck += 1);
    }
    for e in &k.forwards.lost_incoming {
        with(&mut out, incoming_at.get(e).and_then(|t| seg.of(*t)), &mut |r| r.lost_forwards += 1);
    }
    for e in &k.forwards.stuck_incoming {
        with(&mut out, incoming_at.get(e).and_then(|t| seg.of(*t)), &mut |r| r.stuck += 1);
    }
    // Duplicates, by the time the extra arrival came.
    let duplicates = k.verdict.duplicate_details.iter().map(|d| (d.received_at, d.explanation)).chain(k.forwards.duplicate_arrivals.iter().copied());
    for (at, e) in duplicates {
        with(&mut out, seg.of(at), &mut |r| {
            if e.is_window_8() {
                r.duplicates_window_8 += 1;
            } else {
                r.duplicates_unexplained += 1;
            }
        });
    }

    // The longest accepted-to-arrival, healthy Endpoints' unordered Deliveries.
    let ordered: HashSet<Uuid> = k.subscriptions.iter().filter(|s| s.ordering).map(|s| s.id).collect();
    let mut first_2xx: HashMap<&str, DateTime<Utc>> = HashMap::new();
    for a in k.arrivals.iter().filter(|a| a.answered_2xx()) {
        let at = first_2xx.entry(a.webhook_id.as_str()).or_insert(a.received_at);
        *at = (*at).min(a.received_at);
    }
    for d in k.deliveries {
        if !k.healthy_endpoints.contains(&d.endpoint_id) || d.subscription_id.is_some_and(|s| ordered.contains(&s)) {
            continue;
        }
        let (Some(accepted), Some(arrived)) = (accepted_at.get(&d.event_id), first_2xx.get(railhook_core::DeliveryId(d.id).to_string().as_str())) else { continue };
        let ms = (*arrived - *accepted).num_milliseconds();
        with(&mut out, seg.of(*accepted), &mut |r| r.longest_accepted_to_arrival_ms = Some(r.longest_accepted_to_arrival_ms.map_or(ms, |m| m.max(ms))));
        for f in faults.iter().filter(|f| *accepted < f.started_at && *arrived > f.started_at) {
            let r = out.kinds.get_mut(f.kind.name()).expect("every injected kind has an entry");
            r.longest_across_ms = Some(r.longest_across_ms.map_or(ms, |m| m.max(ms)));
        }
    }

    // Requests in flight at once per Endpoint, at the receiver.
    let timeouts: HashMap<Uuid, i64> = k.subscriptions.iter().map(|s| (s.endpoint_id, s.timeout_seconds)).collect();
    let endpoint_of: HashMap<String, Uuid> = k.deliveries.iter().map(|d| (railhook_core::DeliveryId(d.id).to_string(), d.endpoint_id)).collect();
    let mut spans: HashMap<Uuid, Vec<(DateTime<Utc>, i32)>> = HashMap::new();
    for a in k.arrivals {
        let Some(endpoint) = endpoint_of.get(&a.webhook_id) else { continue };
        // In flight until answered, or until the worker gave up (its timeout), whichever is
        // first: a hanging receiver keeps a request the worker has long let go of.
        let limit = a.received_at + Duration::seconds(timeouts.get(endpoint).copied().unwrap_or(30)) - Duration::milliseconds(250);
        let end = a.answered_at.map_or(limit, |t| t.min(limit)).max(a.received_at);
        let e = spans.entry(*endpoint).or_default();
        e.push((a.received_at, 1));
        e.push((end, -1));
    }
    for points in spans.values_mut() {
        // Ends before starts at the same instant: a request answered as the next arrives.
        points.sort_by_key(|(t, d)| (*t, *d));
        let mut now = 0i32;
        for (t, d) in points.iter() {
            now += d;
            if *d > 0 {
                let n = now.max(0) as usize;
                out.max_endpoint_concurrency = out.max_endpoint_concurrency.max(n);
                with(&mut out, seg.of(*t), &mut |r| r.max_endpoint_concurrency = r.max_endpoint_concurrency.max(n));
            }
        }
    }
    if out.max_endpoint_concurrency > k.endpoint_concurrency {
        out.failures.push(format!("an Endpoint had {} requests in flight at the receiver, over its limit of {}", out.max_endpoint_concurrency, k.endpoint_concurrency));
    }
    let non_json: usize = out.kinds.values().chain([&out.baseline]).map(|r| r.clients_saw.non_json_5xx).sum();
    if non_json > 0 {
        out.failures.push(format!("{non_json} 5xx answers were not the API's JSON error"));
    }

    kind_checks(k, &faults, &mut out);
    for r in out.kinds.values_mut().chain([&mut out.baseline]) {
        if r.lost + r.lost_forwards > 0 {
            r.failures.push(format!("{} lost", r.lost + r.lost_forwards));
        }
        if r.stuck > 0 {
            r.failures.push(format!("{} stuck", r.stuck));
        }
        if r.duplicates_unexplained > 0 {
            r.failures.push(format!("{} duplicates not explained by window 8", r.duplicates_unexplained));
        }
        r.passed = r.failures.is_empty();
    }
    out
}

/// The figures and checks of particular kinds.
fn kind_checks(k: &KindInputs, faults: &[&FaultRecord], out: &mut ByKind) {
    let detail_u64 = |f: &FaultRecord, key: &str| f.detail.get(key).and_then(|v| v.as_u64());
    let detail_str = |f: &FaultRecord, key: &str| f.detail.get(key).and_then(|v| v.as_str()).map(str::to_string);
    for f in faults {
        let Some(r) = out.kinds.get_mut(f.kind.name()) else { continue };
        match f.kind {
            FaultKind::PostgresCrash => {
                let (forgotten, longest) = forgotten_claims(k, f);
                r.figures.insert("forgotten_claims".into(), forgotten.into());
                if let Some(s) = longest {
                    let prev = r.figures.get("longest_forgotten_resend_s").and_then(|v| v.as_f64()).unwrap_or(0.0);
                    r.figures.insert("longest_forgotten_resend_s".into(), s.max(prev).into());
                    if s > FORGOTTEN_RESEND_MAX_S as f64 {
                        r.failures.push(format!("a Delivery whose claim the crash forgot went again {s:.1} s after Postgres was up (more than {FORGOTTEN_RESEND_MAX_S} s)"));
                    }
                }
            }
            FaultKind::SlotInvalidation => {
                let status = detail_str(f, "wal_status").unwrap_or_default();
                if status != "lost" {
                    r.failures.push(format!("the slot was not invalidated (wal_status {status:?})"));
                }
                match detail_u64(f, "operator_log_lines") {
                    Some(1) => {}
                    n => r.failures.push(format!("{n:?} relay log lines said the slot was lost and recreated (want exactly one)")),
                }
                if detail_u64(f, "slot_lost_total").unwrap_or(0) == 0 {
                    r.failures.push("railhook_relay_slot_lost_total did not rise".into());
                }
            }
            FaultKind::RelayStandbyTakeover => {
                if detail_u64(f, "takeover_ms").is_none() {
                    r.failures.push("no relay was streaming again after the kill".into());
                }
                let gap = stream_gap_ms(k, f.started_at);
                r.figures.insert("stream_gap_ms".into(), gap.map_or(serde_json::Value::Null, Into::into));
            }
            FaultKind::DiskFull => {
                if r.clients_saw.answered_503 == 0 {
                    r.failures.push("the ingest never answered 503 while the disk was full".into());
                }
            }
            FaultKind::TaskPanic => {
                let panics = detail_u64(f, "panics").unwrap_or(0);
                if panics == 0 {
                    r.failures.push("no attempt task panicked".into());
                }
            }
            FaultKind::ClockSkew => {
                let s = skewed_retries(k, f);
                r.figures.insert("skewed_requests".into(), s.requests.into());
                r.figures.insert("skewed_retries".into(), s.retries.into());
                r.figures.insert("retries_early".into(), s.early.into());
                r.figures.insert("retries_late".into(), s.late.into());
                r.figures.insert("largest_retry_error_s".into(), s.largest_error_s.into());
                if s.requests == 0 {
                    r.failures.push("no request of the skewed worker arrived".into());
                }
                if s.early + s.late > 0 {
                    r.failures.push(format!("the skewed worker timed {} retries early and {} late", s.early, s.late));
                }
            }
            _ => {}
        }
    }
}

/// Deliveries whose claim crash `f` forgot (two Attempts with one number, the first started
/// within 2 s before the crash or during it), and the longest time from Postgres being up to
/// each one's next arrival.
fn forgotten_claims(k: &KindInputs, f: &FaultRecord) -> (usize, Option<f64>) {
    let mut by_number: HashMap<(Uuid, i32), Vec<&AttemptRow>> = HashMap::new();
    for a in k.attempts {
        by_number.entry((a.delivery_id, a.attempt_number)).or_default().push(a);
    }
    let mut arrivals: HashMap<&str, Vec<DateTime<Utc>>> = HashMap::new();
    for a in k.arrivals {
        arrivals.entry(a.webhook_id.as_str()).or_default().push(a.received_at);
    }
    let (mut n, mut longest) = (0, None::<f64>);
    for ((delivery, _), list) in by_number.iter().filter(|(_, l)| l.len() > 1) {
        let first = list.iter().map(|a| a.started_at).min().unwrap_or(f.started_at);
        if first < f.started_at - Duration::seconds(2) || first > f.ended_at {
            continue;
        }
        n += 1;
        let id = railhook_core::DeliveryId(*delivery).to_string();
        let next = arrivals.get(id.as_str()).and_then(|ts| ts.iter().filter(|t| **t > f.ended_at).min().copied());
        if let Some(next) = next {
            let s = (next - f.ended_at).num_milliseconds() as f64 / 1000.0;
            longest = Some(longest.map_or(s, |l| l.max(s)));
        }
    }
    (n, longest)
}

/// From the relay's kill to the first arrival of a Delivery created after it.
fn stream_gap_ms(k: &KindInputs, killed: DateTime<Utc>) -> Option<i64> {
    let created: HashSet<String> = k.deliveries.iter().filter(|d| d.created_at.is_some_and(|c| c > killed)).map(|d| railhook_core::DeliveryId(d.id).to_string()).collect();
    k.arrivals.iter().filter(|a| a.received_at > killed && created.contains(&a.webhook_id)).map(|a| (a.received_at - killed).num_milliseconds()).min()
}

#[derive(Default)]
struct Skewed {
    requests: usize,
    retries: usize,
    early: usize,
    late: usize,
    largest_error_s: f64,
}

/// The retries timed by the worker whose clock runs ahead: after an Attempt it sent that
/// failed, the next arrival of the same Delivery must come after the ladder's wait (at
/// least half of it, the jitter's least), and not long after one and a half of it.
fn skewed_retries(k: &KindInputs, f: &FaultRecord) -> Skewed {
    let mut s = Skewed::default();
    let attempts: HashMap<String, usize> = {
        let mut n: HashMap<String, usize> = HashMap::new();
        for a in k.attempts {
            *n.entry(railhook_core::DeliveryId(a.delivery_id).to_string()).or_default() += 1;
        }
        n
    };
    let ordered: HashSet<Uuid> = k.subscriptions.iter().filter(|s| s.ordering).map(|s| s.id).collect();
    let unordered: HashMap<String, i64> = k
        .deliveries
        .iter()
        .filter(|d| d.subscription_id.is_some_and(|s| !ordered.contains(&s)))
        .filter_map(|d| k.subscriptions.iter().find(|s| Some(s.id) == d.subscription_id).map(|s| (railhook_core::DeliveryId(d.id).to_string(), s.timeout_seconds)))
        .collect();
    let mut by_delivery: HashMap<&str, Vec<&Arrival>> = HashMap::new();
    for a in k.arrivals {
        by_delivery.entry(a.webhook_id.as_str()).or_default().push(a);
    }
    for (id, mut list) in by_delivery {
        list.sort_by_key(|a| a.received_at);
        let skewed = |a: &Arrival| a.sender_skew_s() >= 15 && a.received_at >= f.started_at;
        s.requests += list.iter().filter(|a| skewed(a)).count();
        // Only where each arrival is one Attempt: no window 8 extras to miscount by.
        let (Some(timeout), Some(n)) = (unordered.get(id), attempts.get(id)) else { continue };
        if *n != list.len() {
            continue;
        }
        for (i, pair) in list.windows(2).enumerate() {
            let (a, b) = (pair[0], pair[1]);
            if !skewed(a) || a.answered_2xx() {
                continue;
            }
            let ended = a.answered_at.map_or(a.received_at + Duration::seconds(*timeout), |t| t.min(a.received_at + Duration::seconds(*timeout)));
            let gap_ms = (b.received_at - ended).num_milliseconds();
            let wait_ms = ladder_wait(i + 1) * 1000;
            s.retries += 1;
            if gap_ms < wait_ms / 2 - EARLY_SLACK_MS {
                s.early += 1;
            }
            if gap_ms > wait_ms * 3 / 2 + LATE_SLACK_S * 1000 {
                s.late += 1;
            }
            let error_s = if gap_ms < wait_ms / 2 { (wait_ms / 2 - gap_ms) as f64 / 1000.0 } else { (gap_ms - wait_ms * 3 / 2).max(0) as f64 / 1000.0 };
            s.largest_error_s = s.largest_error_s.max(error_s);
        }
    }
    s
}
