//! The invariant checker: what the client had accepted, what Postgres holds (events,
//! Deliveries, Attempts), what the receiver recorded and which faults were injected when, in;
//! a [`Verdict`] out. A pure function over plain data, so it is tested on hand-made inputs.
//!
//! - **expected**: accepted events x Subscriptions whose pattern matches the event's type.
//! - **delivered**: the receiver answered a 2xx for the Delivery's `webhook-id`.
//! - **lost**: expected, never answered 2xx, and not FAILED for a legitimate reason (FAILED
//!   with every Attempt on record a failure). A missing Delivery row is lost too.
//! - **duplicate**: each 2xx answer for a `webhook-id` beyond its first. Each is explained by
//!   a window of DESIGN.md section 4, or is *unexplained*. Window 8 (the receiver acted but
//!   the outcome never reached Postgres) when the extra 2xx arrival has no SUCCESS Attempt of
//!   its own and
//!   - an Attempt that failed (timeout, connection error) was in flight when it arrived: a
//!     lost response; or
//!   - no Attempt covers it and a worker was killed (or its attempt task panicked) after it
//!     arrived, within the time the Attempt's record would have taken (its timeout plus the
//!     finalise's retries); or
//!   - likewise, Postgres was restarting, crashed, full or out of the worker's reach then
//!     (the finalise could not reach it and gave up; the sweep handed the Delivery out
//!     again); or
//!   - its SUCCESS Attempt is on record but a Postgres crash forgot the claim it was made
//!     under: another Attempt carries the same number ([`crate::record::explain`]).
//!
//!   A second 2xx that has a SUCCESS Attempt of its own, or one that nothing explains, is
//!   unexplained.
//! - **stuck**: a Delivery still PENDING or PROCESSING after the drain.
//! - **ordering** (Subscriptions with `ordering: true`, DESIGN.md 6.5): per ordered Endpoint,
//!   the order in which the receiver *applied* Deliveries (the first 2xx-answered arrival of
//!   each Delivery, in the receiver's log order) must be ascending by Sequence Number. An
//!   applied Delivery whose number is below one already applied on its Endpoint is
//!   **out of order**. A later 2xx of an already applied Delivery (a window 8 duplicate) is
//!   not an application and never out of order; neither is an arrival answered 500. The
//!   numbers themselves are checked too: an ordered Endpoint's are exactly 1..n, only its
//!   ordered Subscriptions' Deliveries carry one, and every request's `X-Sequence-Number`
//!   is its Delivery's. The gap timeouts the run counted (worker log and /metrics) must be 0
//!   when the run is configured never to need one.
//!
//! It passes when every accepted event is in Postgres and nothing else is, lost = 0, every
//! duplicate is window 8, nothing is stuck, every signature verified, nothing was applied out
//! of order, the Sequence Numbers are sound, and no gap timeout fired.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use railhook_core::pattern::{EventType, EventTypePattern};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::plan::FaultKind;
use crate::receiver::Arrival;
use crate::record::{explain, repeated_attempt_numbers, AttemptRow, DuplicateSummary, Explanation, FaultRecord, FaultTimes};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AcceptedEvent {
    pub index: usize,
    pub id: Uuid,
    pub event_type: String,
    /// When the client had its answer.
    #[serde(default = "epoch")]
    pub accepted_at: DateTime<Utc>,
}

fn epoch() -> DateTime<Utc> {
    DateTime::UNIX_EPOCH
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubscriptionSpec {
    pub id: Uuid,
    pub endpoint_id: Uuid,
    pub pattern: String,
    pub timeout_seconds: i64,
    /// Ordered delivery (DESIGN.md 6.5): its Deliveries carry the Endpoint's Sequence Numbers.
    #[serde(default)]
    pub ordering: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeliveryRow {
    pub id: Uuid,
    pub event_id: Uuid,
    pub endpoint_id: Uuid,
    pub subscription_id: Option<Uuid>,
    pub status: String,
    pub attempt_count: i32,
    /// The Endpoint-scoped Sequence Number (ordered Subscriptions only).
    #[serde(default)]
    pub sequence_number: Option<i64>,
    /// When the Delivery row was written (the ingest's commit, near enough).
    #[serde(default)]
    pub created_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Default)]
pub struct Inputs {
    pub planned_events: usize,
    pub accepted: Vec<AcceptedEvent>,
    /// Events the client gave up on or that were refused (never accepted).
    pub rejected: Vec<String>,
    pub subscriptions: Vec<SubscriptionSpec>,
    pub events_in_postgres: Vec<Uuid>,
    pub deliveries: Vec<DeliveryRow>,
    pub attempts: Vec<AttemptRow>,
    pub arrivals: Vec<Arrival>,
    pub faults: Vec<FaultRecord>,
    /// Ordering gap timeouts the run counted (`railhook_ordering_gap_timeout_total` and the
    /// worker's log, over every worker process of the run).
    pub gap_timeouts: u64,
    /// Whether the run's configuration may need a gap timeout. The chaos run sets the gap
    /// timeout above anything a fault can hold a Delivery, so it is `false` there and any
    /// gap timeout fails the run.
    pub gap_timeouts_allowed: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Duplicate {
    pub delivery_id: String,
    pub endpoint_id: Uuid,
    pub arrivals_2xx: usize,
    pub received_at: DateTime<Utc>,
    /// When the Delivery had arrived twice: the later of this arrival and the one counted
    /// as its delivery (a forgotten claim's extra arrival is the earlier one).
    #[serde(default = "epoch")]
    pub twice_at: DateTime<Utc>,
    pub explanation: Explanation,
    /// "8" or "unexplained".
    pub window: String,
}

/// How many ordered Deliveries were in flight (created, not yet applied) when a fault began.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderedInFlight {
    pub kind: FaultKind,
    pub started_at: DateTime<Utc>,
    pub ordered_in_flight: usize,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OrderingSummary {
    /// Endpoints with at least one ordered Subscription.
    pub ordered_endpoints: usize,
    /// Deliveries of ordered Subscriptions.
    pub ordered_deliveries: usize,
    /// Of them, applied by the receiver (answered 2xx at least once).
    pub applied: usize,
    /// Applied after a Delivery with a higher Sequence Number of the same Endpoint.
    pub out_of_order: usize,
    /// The first few, with the Delivery applied before them.
    pub out_of_order_examples: Vec<String>,
    /// Sequence Numbers that are not exactly 1..n per ordered Endpoint (a gap, a number twice,
    /// an ordered Delivery without one, an unordered one with one).
    pub sequence_problems: usize,
    pub sequence_problem_examples: Vec<String>,
    /// Requests whose `X-Sequence-Number` is not their Delivery's (or is missing, or is there
    /// for an unordered Delivery).
    pub header_mismatches: usize,
    /// Gap timeouts the run counted.
    pub gap_timeouts: u64,
    /// Per fault, the ordered Deliveries in flight when it began.
    pub in_flight_at_faults: Vec<OrderedInFlight>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Verdict {
    pub passed: bool,
    pub failures: Vec<String>,
    pub planned_events: usize,
    pub accepted: usize,
    pub rejected: usize,
    pub events_in_postgres: usize,
    pub accepted_missing_in_postgres: usize,
    pub events_in_postgres_not_accepted: usize,
    pub deliveries_expected: usize,
    pub deliveries_in_postgres: usize,
    pub deliveries_without_accepted_event: usize,
    pub deliveries_unexpected: usize,
    pub delivered: usize,
    pub failed_legitimately: usize,
    pub lost: usize,
    /// The first lost ones (id or "event/subscription" when the row is missing), with why.
    pub lost_examples: Vec<String>,
    pub duplicates: DuplicateSummary,
    pub duplicate_details: Vec<Duplicate>,
    pub stuck: usize,
    pub stuck_examples: Vec<String>,
    pub statuses: BTreeMap<String, usize>,
    pub attempts_total: usize,
    pub attempts_by_result: BTreeMap<String, usize>,
    pub arrivals_total: usize,
    pub arrivals_2xx: usize,
    pub arrivals_by_behaviour: BTreeMap<String, usize>,
    pub arrivals_unknown_webhook_id: usize,
    pub bad_signatures: usize,
    pub ordering: OrderingSummary,
    /// The events of the lost and of the stuck Deliveries (for the report by fault kind).
    #[serde(skip)]
    pub lost_events: Vec<Uuid>,
    #[serde(skip)]
    pub stuck_events: Vec<Uuid>,
}

const EXAMPLES: usize = 20;

fn delivery_text(id: Uuid) -> String {
    railhook_core::DeliveryId(id).to_string()
}

pub fn check(inputs: &Inputs) -> Verdict {
    let mut v = Verdict { planned_events: inputs.planned_events, accepted: inputs.accepted.len(), rejected: inputs.rejected.len(), ..Verdict::default() };

    // Events.
    let accepted_ids: HashSet<Uuid> = inputs.accepted.iter().map(|e| e.id).collect();
    let in_pg: HashSet<Uuid> = inputs.events_in_postgres.iter().copied().collect();
    v.events_in_postgres = in_pg.len();
    v.accepted_missing_in_postgres = accepted_ids.difference(&in_pg).count();
    v.events_in_postgres_not_accepted = in_pg.difference(&accepted_ids).count();

    // Expected deliveries: accepted events x matching Subscriptions.
    let patterns: Vec<(&SubscriptionSpec, Option<EventTypePattern>)> =
        inputs.subscriptions.iter().map(|s| (s, EventTypePattern::parse(&s.pattern).ok())).collect();
    let mut expected: Vec<(Uuid, &SubscriptionSpec)> = Vec::new();
    for event in &inputs.accepted {
        let Ok(t) = EventType::parse(&event.event_type) else { continue };
        for (sub, pattern) in &patterns {
            if pattern.as_ref().is_some_and(|p| p.matches(&t)) {
                expected.push((event.id, sub));
            }
        }
    }
    v.deliveries_expected = expected.len();
    let expected_keys: HashSet<(Uuid, Uuid)> = expected.iter().map(|(e, s)| (*e, s.id)).collect();

    // Deliveries, attempts and arrivals by Delivery.
    v.deliveries_in_postgres = inputs.deliveries.len();
    let by_pair: HashMap<(Uuid, Option<Uuid>), &DeliveryRow> = inputs.deliveries.iter().map(|d| ((d.event_id, d.subscription_id), d)).collect();
    let mut attempts: HashMap<Uuid, Vec<&AttemptRow>> = HashMap::new();
    for a in &inputs.attempts {
        attempts.entry(a.delivery_id).or_default().push(a);
        *v.attempts_by_result.entry(a.result.clone()).or_default() += 1;
    }
    v.attempts_total = inputs.attempts.len();
    let known: HashSet<Uuid> = inputs.deliveries.iter().map(|d| d.id).collect();
    let mut arrivals: HashMap<Uuid, Vec<&Arrival>> = HashMap::new();
    for a in &inputs.arrivals {
        v.arrivals_total += 1;
        *v.arrivals_by_behaviour.entry(a.behaviour.clone()).or_default() += 1;
        if !a.verified {
            v.bad_signatures += 1;
        }
        if a.answered_2xx() {
            v.arrivals_2xx += 1;
        }
        match a.webhook_id.parse::<railhook_core::DeliveryId>() {
            Ok(id) if known.contains(&id.0) => arrivals.entry(id.0).or_default().push(a),
            _ => v.arrivals_unknown_webhook_id += 1,
        }
    }
    for d in &inputs.deliveries {
        *v.statuses.entry(d.status.clone()).or_default() += 1;
        if !accepted_ids.contains(&d.event_id) {
            v.deliveries_without_accepted_event += 1;
        } else if !d.subscription_id.is_some_and(|s| expected_keys.contains(&(d.event_id, s))) {
            v.deliveries_unexpected += 1;
        }
        if d.status == "PENDING" || d.status == "PROCESSING" {
            v.stuck += 1;
            v.stuck_events.push(d.event_id);
            if v.stuck_examples.len() < EXAMPLES {
                v.stuck_examples.push(format!("{} {} (attempts {})", delivery_text(d.id), d.status, d.attempt_count));
            }
        }
    }

    // Delivered, failed for a reason, lost.
    let timeouts: HashMap<Uuid, i64> = inputs.subscriptions.iter().map(|s| (s.id, s.timeout_seconds)).collect();
    for (event, sub) in &expected {
        let Some(d) = by_pair.get(&(*event, Some(sub.id))) else {
            v.lost += 1;
            v.lost_events.push(*event);
            if v.lost_examples.len() < EXAMPLES {
                v.lost_examples.push(format!("{}/{}: no Delivery in Postgres", railhook_core::EventId(*event), railhook_core::SubscriptionId(sub.id)));
            }
            continue;
        };
        let got_2xx = arrivals.get(&d.id).is_some_and(|a| a.iter().any(|a| a.answered_2xx()));
        if got_2xx {
            v.delivered += 1;
            continue;
        }
        let tried = attempts.get(&d.id).map(Vec::as_slice).unwrap_or_default();
        if d.status == "FAILED" && !tried.is_empty() && tried.iter().all(|a| a.result != "success") {
            v.failed_legitimately += 1;
            continue;
        }
        v.lost += 1;
        v.lost_events.push(*event);
        if v.lost_examples.len() < EXAMPLES {
            v.lost_examples.push(format!("{}: {} with {} attempts, never answered 2xx", delivery_text(d.id), d.status, tried.len()));
        }
    }

    // Duplicates.
    let fault_times = FaultTimes::new(&inputs.faults);
    let repeated = repeated_attempt_numbers(&inputs.attempts);
    for d in &inputs.deliveries {
        let Some(list) = arrivals.get(&d.id) else { continue };
        let mut ok: Vec<&Arrival> = list.iter().copied().filter(|a| a.answered_2xx()).collect();
        if ok.len() < 2 {
            continue;
        }
        ok.sort_by_key(|a| a.received_at);
        let tried = attempts.get(&d.id).map(Vec::as_slice).unwrap_or_default();
        let timeout = d.subscription_id.and_then(|s| timeouts.get(&s).copied()).unwrap_or(30);
        let explained: Vec<Explanation> = ok.iter().map(|a| explain(a, tried, timeout, &fault_times, &repeated)).collect();
        // The one that is not a duplicate: the first with a SUCCESS Attempt of its own, else
        // the first.
        let primary = explained.iter().position(|e| *e == Explanation::SuccessAttempt).unwrap_or(0);
        for (i, (a, e)) in ok.iter().zip(&explained).enumerate() {
            if i == primary {
                continue;
            }
            let window_8 = e.is_window_8();
            v.duplicates.count(*e);
            v.duplicate_details.push(Duplicate {
                delivery_id: delivery_text(d.id),
                endpoint_id: d.endpoint_id,
                arrivals_2xx: ok.len(),
                received_at: a.received_at,
                twice_at: a.received_at.max(ok[primary].received_at),
                explanation: *e,
                window: if window_8 { "8".into() } else { "unexplained".into() },
            });
        }
    }
    // Unexplained first, then by time.
    v.duplicate_details.sort_by_key(|d| (d.window != "unexplained", d.received_at));

    v.ordering = check_ordering(inputs);

    // The verdict.
    let mut fail = |cond: bool, what: String| {
        if cond {
            v.failures.push(what);
        }
    };
    fail(v.accepted < v.planned_events, format!("{} of {} events were never accepted", v.planned_events - v.accepted.min(v.planned_events), v.planned_events));
    fail(v.accepted_missing_in_postgres > 0, format!("{} accepted events are not in Postgres", v.accepted_missing_in_postgres));
    fail(v.events_in_postgres_not_accepted > 0, format!("{} events in Postgres were never accepted", v.events_in_postgres_not_accepted));
    fail(v.deliveries_without_accepted_event > 0, format!("{} Deliveries have no accepted event", v.deliveries_without_accepted_event));
    fail(v.deliveries_unexpected > 0, format!("{} Deliveries match no Subscription of their event", v.deliveries_unexpected));
    fail(v.lost > 0, format!("{} Deliveries lost", v.lost));
    fail(v.duplicates.unexplained > 0, format!("{} duplicate arrivals are not window 8", v.duplicates.unexplained));
    fail(v.stuck > 0, format!("{} Deliveries stuck in a non-terminal state", v.stuck));
    fail(v.bad_signatures > 0, format!("{} requests failed signature verification", v.bad_signatures));
    let o = &v.ordering;
    fail(o.out_of_order > 0, format!("{} ordered Deliveries applied out of order", o.out_of_order));
    fail(o.sequence_problems > 0, format!("{} Sequence Number problems", o.sequence_problems));
    fail(o.header_mismatches > 0, format!("{} requests with a wrong X-Sequence-Number", o.header_mismatches));
    fail(
        o.gap_timeouts > 0 && !inputs.gap_timeouts_allowed,
        format!("{} ordering gap timeouts fired in a run configured never to need one", o.gap_timeouts),
    );
    v.passed = v.failures.is_empty();
    v
}

/// The ordering invariants (see the module's documentation).
fn check_ordering(inputs: &Inputs) -> OrderingSummary {
    let mut o = OrderingSummary { gap_timeouts: inputs.gap_timeouts, ..OrderingSummary::default() };
    let ordered_subs: HashSet<Uuid> = inputs.subscriptions.iter().filter(|s| s.ordering).map(|s| s.id).collect();
    let ordered_endpoints: HashSet<Uuid> = inputs.subscriptions.iter().filter(|s| s.ordering).map(|s| s.endpoint_id).collect();
    o.ordered_endpoints = ordered_endpoints.len();
    let is_ordered = |d: &DeliveryRow| d.subscription_id.is_some_and(|s| ordered_subs.contains(&s));
    let by_id: HashMap<Uuid, &DeliveryRow> = inputs.deliveries.iter().map(|d| (d.id, d)).collect();
    let problem = |o: &mut OrderingSummary, what: String| {
        o.sequence_problems += 1;
        if o.sequence_problem_examples.len() < EXAMPLES {
            o.sequence_problem_examples.push(what);
        }
    };

    // The numbers: exactly 1..n per ordered Endpoint, on the ordered Deliveries only.
    let mut numbers: BTreeMap<Uuid, Vec<i64>> = BTreeMap::new();
    for d in &inputs.deliveries {
        match (is_ordered(d), d.sequence_number) {
            (true, Some(n)) => {
                o.ordered_deliveries += 1;
                numbers.entry(d.endpoint_id).or_default().push(n);
            }
            (true, None) => {
                o.ordered_deliveries += 1;
                problem(&mut o, format!("{}: ordered, without a Sequence Number", delivery_text(d.id)));
            }
            (false, Some(n)) => problem(&mut o, format!("{}: unordered, with Sequence Number {n}", delivery_text(d.id))),
            (false, None) => {}
        }
    }
    for (endpoint, mut ns) in numbers {
        ns.sort_unstable();
        for (i, n) in ns.iter().enumerate() {
            let want = i as i64 + 1;
            if *n != want {
                problem(&mut o, format!("endpoint {}: Sequence Numbers are not 1..{}: {n} where {want} was due", railhook_core::EndpointId(endpoint), ns.len()));
                break;
            }
        }
    }

    // The applied order: the first 2xx of each ordered Delivery, in the receiver's log order.
    let mut applied_at: HashMap<Uuid, DateTime<Utc>> = HashMap::new();
    // Per Endpoint: the highest Sequence Number applied so far, and its Delivery.
    let mut highest: HashMap<Uuid, (i64, Uuid, DateTime<Utc>)> = HashMap::new();
    for a in &inputs.arrivals {
        let Some(d) = a.webhook_id.parse::<railhook_core::DeliveryId>().ok().and_then(|id| by_id.get(&id.0).copied()) else { continue };
        let ordered = is_ordered(d);
        if a.verified && a.sequence != d.sequence_number {
            o.header_mismatches += 1;
        }
        if !ordered || !a.answered_2xx() || applied_at.contains_key(&d.id) {
            continue;
        }
        applied_at.insert(d.id, a.received_at);
        o.applied += 1;
        let Some(n) = d.sequence_number else { continue };
        match highest.get(&d.endpoint_id) {
            Some(&(top, top_id, top_at)) if n < top => {
                o.out_of_order += 1;
                if o.out_of_order_examples.len() < EXAMPLES {
                    o.out_of_order_examples.push(format!(
                        "endpoint {}: {} #{n} applied at {} after {} #{top} (applied at {})",
                        railhook_core::EndpointId(d.endpoint_id),
                        delivery_text(d.id),
                        a.received_at.format("%H:%M:%S%.3f"),
                        delivery_text(top_id),
                        top_at.format("%H:%M:%S%.3f"),
                    ));
                }
            }
            _ => {
                highest.insert(d.endpoint_id, (n, d.id, a.received_at));
            }
        }
    }

    // What each fault hit: ordered Deliveries created before it and not yet applied.
    for f in &inputs.faults {
        let ordered_in_flight = inputs
            .deliveries
            .iter()
            .filter(|d| is_ordered(d) && d.created_at.is_some_and(|c| c <= f.started_at))
            .filter(|d| applied_at.get(&d.id).is_none_or(|at| *at > f.started_at))
            .count();
        o.in_flight_at_faults.push(OrderedInFlight { kind: f.kind, started_at: f.started_at, ordered_in_flight });
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
    }

    fn arrival(delivery: Uuid, at: i64, status: u16) -> Arrival {
        Arrival::for_test(delivery, at, 5, status, 0)
    }

    fn attempt(delivery: Uuid, n: i32, at: i64, ms: i32, result: &str) -> AttemptRow {
        AttemptRow { delivery_id: delivery, attempt_number: n, started_at: t(at), duration_ms: ms, result: result.into(), status_code: None }
    }

    /// Two events for one endpoint subscribed to `a.*`, both delivered once.
    fn base() -> (Inputs, [Uuid; 2]) {
        let sub = SubscriptionSpec { id: Uuid::now_v7(), endpoint_id: Uuid::now_v7(), pattern: "a.*".into(), timeout_seconds: 2, ordering: false };
        let events = [Uuid::now_v7(), Uuid::now_v7()];
        let deliveries = [Uuid::now_v7(), Uuid::now_v7()];
        let mut inputs = Inputs { planned_events: 2, subscriptions: vec![sub.clone()], ..Inputs::default() };
        for i in 0..2 {
            inputs.accepted.push(AcceptedEvent { index: i, id: events[i], event_type: "a.b".into(), accepted_at: t(0) });
            inputs.events_in_postgres.push(events[i]);
            inputs.deliveries.push(DeliveryRow {
                id: deliveries[i],
                event_id: events[i],
                endpoint_id: sub.endpoint_id,
                subscription_id: Some(sub.id),
                status: "SUCCESS".into(),
                attempt_count: 1,
                sequence_number: None,
                created_at: Some(t(0)),
            });
            inputs.attempts.push(attempt(deliveries[i], 1, 1000, 20, "success"));
            inputs.arrivals.push(arrival(deliveries[i], 1010, 200));
        }
        (inputs, deliveries)
    }

    #[test]
    fn a_clean_run_passes() {
        let (inputs, _) = base();
        let v = check(&inputs);
        assert!(v.passed, "{:?}", v.failures);
        assert_eq!((v.deliveries_expected, v.delivered, v.lost, v.duplicates.total), (2, 2, 0, 0));
    }

    #[test]
    fn a_lost_delivery_fails() {
        let (mut inputs, deliveries) = base();
        // Recorded as SUCCESS, but the receiver never answered it 2xx.
        inputs.arrivals.retain(|a| a.webhook_id != delivery_text(deliveries[1]));
        let v = check(&inputs);
        assert!(!v.passed);
        assert_eq!(v.lost, 1);
        assert!(v.failures.iter().any(|f| f.contains("lost")), "{:?}", v.failures);

        // A missing Delivery row is lost too.
        let (mut inputs, deliveries) = base();
        inputs.deliveries.retain(|d| d.id != deliveries[0]);
        let v = check(&inputs);
        assert!(!v.passed);
        assert_eq!(v.lost, 1);
    }

    #[test]
    fn failed_for_a_reason_is_not_lost_but_success_without_arrival_is() {
        let (mut inputs, deliveries) = base();
        inputs.deliveries[1].status = "FAILED".into();
        inputs.attempts.retain(|a| a.delivery_id != deliveries[1]);
        inputs.attempts.push(attempt(deliveries[1], 1, 1000, 20, "http_status"));
        inputs.arrivals.retain(|a| a.webhook_id != delivery_text(deliveries[1]));
        inputs.arrivals.push(arrival(deliveries[1], 1010, 500));
        let v = check(&inputs);
        assert!(v.passed, "{:?}", v.failures);
        assert_eq!((v.failed_legitimately, v.lost), (1, 0));
    }

    #[test]
    fn an_unexplained_duplicate_fails() {
        let (mut inputs, deliveries) = base();
        // A second 2xx 10 s later: no Attempt was in flight, and no fault happened.
        inputs.arrivals.push(arrival(deliveries[0], 60_000, 200));
        let v = check(&inputs);
        assert!(!v.passed);
        assert_eq!((v.duplicates.total, v.duplicates.unexplained), (1, 1));
        assert_eq!(v.duplicate_details[0].explanation, Explanation::Unrecorded);

        // Two SUCCESS Attempts, each with its arrival: not window 8 either.
        let (mut inputs, deliveries) = base();
        inputs.attempts.push(attempt(deliveries[0], 2, 5000, 20, "success"));
        inputs.arrivals.push(arrival(deliveries[0], 5010, 200));
        let v = check(&inputs);
        assert!(!v.passed);
        assert_eq!(v.duplicates.unexplained, 1);
        assert_eq!(v.duplicate_details[0].explanation, Explanation::SuccessAttempt);
    }

    #[test]
    fn window_8_duplicates_pass() {
        let (mut inputs, deliveries) = base();
        // Lost response: the first Attempt timed out after 2 s, but the receiver had answered
        // 200 at 1.9 s; the second Attempt succeeded.
        inputs.attempts.retain(|a| a.delivery_id != deliveries[0]);
        inputs.arrivals.retain(|a| a.webhook_id != delivery_text(deliveries[0]));
        inputs.attempts.push(attempt(deliveries[0], 1, 1000, 2000, "timeout"));
        inputs.arrivals.push(arrival(deliveries[0], 1010, 200));
        inputs.attempts.push(attempt(deliveries[0], 2, 5000, 20, "success"));
        inputs.arrivals.push(arrival(deliveries[0], 5010, 200));
        // Worker killed: the receiver answered, then the worker died before the record; the
        // sweep handed the Delivery out again 20 s later.
        inputs.arrivals.push(arrival(deliveries[1], -20_000, 200));
        inputs.faults.push(FaultRecord { kind: FaultKind::KillWorker, link: None, started_at: t(-19_990), ended_at: t(-19_990), at_accepted: 1, kills_a_worker: true, detail: serde_json::Value::Null });
        let v = check(&inputs);
        assert!(v.passed, "{:?}", v.failures);
        assert_eq!(v.duplicates.total, 2);
        assert_eq!(v.duplicates.window_8_lost_response, 1);
        assert_eq!(v.duplicates.window_8_worker_killed, 1);

        // Without the kill, the second one is unexplained.
        inputs.faults.clear();
        let v = check(&inputs);
        assert!(!v.passed);
        assert_eq!(v.duplicates.unexplained, 1);
    }

    #[test]
    fn a_request_cut_by_a_process_stop_that_lasted_is_window_8_anywhere_in_the_stop() {
        // On inline, slot_invalidation stops the whole process: its shutdown grace ran from
        // -27 s to -20 s, and cut a request the receiver had answered at -20.7 s, 6.3 s after
        // the stop began (the quick inline run of the seventeenth session).
        let (mut inputs, deliveries) = base();
        inputs.arrivals.push(arrival(deliveries[1], -20_700, 200));
        inputs.faults.push(FaultRecord { kind: FaultKind::SlotInvalidation, link: None, started_at: t(-27_000), ended_at: t(-20_000), at_accepted: 1, kills_a_worker: true, detail: serde_json::Value::Null });
        let v = check(&inputs);
        assert!(v.passed, "{:?}", v.failures);
        assert_eq!((v.duplicates.total, v.duplicates.window_8_worker_killed), (1, 1));

        // On Kafka the same fault stops only the relays: the duplicate is unexplained.
        inputs.faults[0].kills_a_worker = false;
        let v = check(&inputs);
        assert!(!v.passed);
        assert_eq!(v.duplicates.unexplained, 1);
    }

    #[test]
    fn a_claim_forgotten_by_a_crash_is_window_8_but_two_numbered_successes_are_not() {
        // Attempt 1 succeeded at 1 s, but Postgres crashed at 1.2 s and forgot its claim: the
        // Delivery went again, and its Attempt 1 (the same number) succeeded at 8 s.
        let crash = |from: i64, to: i64| FaultRecord { kind: FaultKind::PostgresCrash, link: None, started_at: t(from), ended_at: t(to), at_accepted: 1, kills_a_worker: false, detail: serde_json::Value::Null };
        let (mut inputs, deliveries) = base();
        inputs.attempts.push(attempt(deliveries[0], 1, 8000, 20, "success"));
        inputs.arrivals.push(arrival(deliveries[0], 8010, 200));
        inputs.faults.push(crash(1200, 3000));
        let v = check(&inputs);
        assert!(v.passed, "{:?}", v.failures);
        assert_eq!((v.duplicates.total, v.duplicates.window_8_forgotten_claim), (1, 1));

        // Without the crash, two SUCCESS Attempts of one number explain nothing.
        inputs.faults.clear();
        let v = check(&inputs);
        assert!(!v.passed);
        assert_eq!(v.duplicates.unexplained, 1);

        // A crash long before the first Attempt does not explain it either.
        inputs.faults.push(crash(-60_000, -58_000));
        assert_eq!(check(&inputs).duplicates.unexplained, 1);
    }

    #[test]
    fn stuck_and_strays_fail() {
        let (mut inputs, _) = base();
        inputs.deliveries[0].status = "PROCESSING".into();
        inputs.events_in_postgres.push(Uuid::now_v7());
        let v = check(&inputs);
        assert!(!v.passed);
        assert_eq!(v.stuck, 1);
        assert_eq!(v.events_in_postgres_not_accepted, 1);
    }

    /// One ordered Subscription on its own Endpoint (the unordered one of [`base`] on another),
    /// `n` events of type `o.x`, each Delivery numbered 1..n, attempted and answered 2xx once
    /// in order, 100 ms apart from t(10 s). Returns the inputs and the ordered Deliveries.
    fn ordered(n: usize) -> (Inputs, Vec<Uuid>) {
        let (mut inputs, _) = base();
        let sub = SubscriptionSpec { id: Uuid::now_v7(), endpoint_id: Uuid::now_v7(), pattern: "o.*".into(), timeout_seconds: 2, ordering: true };
        inputs.subscriptions.push(sub.clone());
        let mut ids = Vec::new();
        for k in 0..n {
            let (event, delivery) = (Uuid::now_v7(), Uuid::now_v7());
            inputs.planned_events += 1;
            inputs.accepted.push(AcceptedEvent { index: 2 + k, id: event, event_type: "o.x".into(), accepted_at: t(9_000) });
            inputs.events_in_postgres.push(event);
            inputs.deliveries.push(DeliveryRow {
                id: delivery,
                event_id: event,
                endpoint_id: sub.endpoint_id,
                subscription_id: Some(sub.id),
                status: "SUCCESS".into(),
                attempt_count: 1,
                sequence_number: Some(k as i64 + 1),
                created_at: Some(t(9_000)),
            });
            let at = 10_000 + 100 * k as i64;
            inputs.attempts.push(attempt(delivery, 1, at, 20, "success"));
            inputs.arrivals.push(ordered_arrival(delivery, k as i64 + 1, at + 10, 200));
            ids.push(delivery);
        }
        (inputs, ids)
    }

    fn ordered_arrival(delivery: Uuid, seq: i64, at: i64, status: u16) -> Arrival {
        Arrival { sequence: Some(seq), endpoint: 1, ..arrival(delivery, at, status) }
    }

    #[test]
    fn ordered_deliveries_applied_in_order_pass() {
        let (inputs, _) = ordered(5);
        let v = check(&inputs);
        assert!(v.passed, "{:?}", v.failures);
        let o = &v.ordering;
        assert_eq!((o.ordered_endpoints, o.ordered_deliveries, o.applied, o.out_of_order), (1, 5, 5, 0));
        assert_eq!((o.sequence_problems, o.header_mismatches, o.gap_timeouts), (0, 0, 0));
    }

    #[test]
    fn an_out_of_order_arrival_fails() {
        let (mut inputs, ids) = ordered(5);
        // #3 is applied before #2: the receiver's log has 1, 3, 2, 4, 5.
        inputs.arrivals.swap(3, 4);
        let v = check(&inputs);
        assert!(!v.passed, "an out-of-order arrival must fail the run");
        assert_eq!(v.ordering.out_of_order, 1);
        assert!(v.failures.iter().any(|f| f.contains("out of order")), "{:?}", v.failures);
        let example = &v.ordering.out_of_order_examples[0];
        assert!(example.contains(&delivery_text(ids[1])) && example.contains("#2") && example.contains("#3"), "{example}");

        // The last one applied first: every other one is out of order.
        let (mut inputs, _) = ordered(4);
        let last = inputs.arrivals.pop().unwrap();
        inputs.arrivals.insert(2, last);
        let v = check(&inputs);
        assert!(!v.passed);
        assert_eq!(v.ordering.out_of_order, 3);
    }

    #[test]
    fn duplicates_and_failed_arrivals_are_not_out_of_order() {
        let (mut inputs, ids) = ordered(4);
        // #2 arrives again after #4, answered 200 while a timed-out Attempt was in flight
        // (window 8, a lost response): already applied, so not out of order.
        inputs.attempts.push(attempt(ids[1], 2, 20_000, 2000, "timeout"));
        inputs.arrivals.push(ordered_arrival(ids[1], 2, 20_010, 200));
        // #3 was first answered 500 before #2 arrived (a failed request is not applied).
        inputs.arrivals.insert(2, ordered_arrival(ids[2], 3, 10_050, 500));
        let v = check(&inputs);
        assert!(v.passed, "{:?}", v.failures);
        assert_eq!((v.ordering.out_of_order, v.duplicates.window_8_lost_response), (0, 1));
        assert_eq!(v.ordering.applied, 4);
    }

    #[test]
    fn unsound_sequence_numbers_fail() {
        // A gap: 1, 2, 4.
        let (mut inputs, _) = ordered(3);
        inputs.deliveries.last_mut().unwrap().sequence_number = Some(4);
        inputs.arrivals.last_mut().unwrap().sequence = Some(4);
        let v = check(&inputs);
        assert!(!v.passed);
        assert_eq!(v.ordering.sequence_problems, 1);

        // An unordered Delivery with a number, an ordered one without.
        let (mut inputs, _) = ordered(2);
        inputs.deliveries[0].sequence_number = Some(1);
        inputs.deliveries[2].sequence_number = None;
        let v = check(&inputs);
        assert_eq!(v.ordering.sequence_problems, 3, "{:?}", v.ordering.sequence_problem_examples);

        // A request whose X-Sequence-Number is not its Delivery's.
        let (mut inputs, _) = ordered(2);
        inputs.arrivals.last_mut().unwrap().sequence = Some(7);
        let v = check(&inputs);
        assert!(!v.passed);
        assert_eq!(v.ordering.header_mismatches, 1);
    }

    #[test]
    fn a_gap_timeout_fails_unless_allowed() {
        let (mut inputs, _) = ordered(2);
        inputs.gap_timeouts = 1;
        let v = check(&inputs);
        assert!(!v.passed);
        assert!(v.failures.iter().any(|f| f.contains("gap timeout")), "{:?}", v.failures);
        inputs.gap_timeouts_allowed = true;
        assert!(check(&inputs).passed);
    }

    #[test]
    fn ordered_deliveries_in_flight_at_each_fault_are_counted() {
        let (mut inputs, _) = ordered(5);
        // Before any was created; while #3..#5 were not applied (#2 applied at 10.11 s); after.
        for at in [5_000, 10_150, 20_000] {
            inputs.faults.push(FaultRecord { kind: FaultKind::KafkaRestart, link: None, started_at: t(at), ended_at: t(at + 100), at_accepted: 1, kills_a_worker: false, detail: serde_json::Value::Null });
        }
        let v = check(&inputs);
        assert!(v.passed, "{:?}", v.failures);
        let counts: Vec<usize> = v.ordering.in_flight_at_faults.iter().map(|f| f.ordered_in_flight).collect();
        assert_eq!(counts, vec![0, 3, 0]);
    }
}
