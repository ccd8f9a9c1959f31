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
//!   - no Attempt covers it and a worker was killed after it arrived, within the time the
//!     Attempt's record would have taken (its timeout plus the finalise's retries); or
//!   - likewise, Postgres was restarting then (the finalise could not reach it and gave up;
//!     the sweep handed the Delivery out again).
//!
//!   A second 2xx that has a SUCCESS Attempt of its own, or one that nothing explains, is
//!   unexplained.
//! - **stuck**: a Delivery still PENDING or PROCESSING after the drain.
//!
//! It passes when every accepted event is in Postgres and nothing else is, lost = 0, every
//! duplicate is window 8, nothing is stuck, and every signature verified.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Duration, Utc};
use railhook_core::pattern::{EventType, EventTypePattern};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::receiver::Arrival;

/// Slack around an Attempt's recorded window when matching an arrival to it (clocks are the
/// same machine's; the Attempt's start is taken just before the request is sent).
const MATCH_SLACK_MS: i64 = 500;
/// How long after an arrival an Attempt's record may still be written: the request's
/// timeout plus the finalise's retries (about 6.3 s) and scheduling slack.
const RECORD_HORIZON_EXTRA_S: i64 = 12;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AcceptedEvent {
    pub index: usize,
    pub id: Uuid,
    pub event_type: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubscriptionSpec {
    pub id: Uuid,
    pub endpoint_id: Uuid,
    pub pattern: String,
    pub timeout_seconds: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeliveryRow {
    pub id: Uuid,
    pub event_id: Uuid,
    pub endpoint_id: Uuid,
    pub subscription_id: Option<Uuid>,
    pub status: String,
    pub attempt_count: i32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttemptRow {
    pub delivery_id: Uuid,
    pub attempt_number: i32,
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    pub result: String,
    pub status_code: Option<i32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    KillApi,
    KillRelay,
    KillWorker,
    KafkaRestart,
    PostgresRestart,
    ReceiverOutage,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FaultRecord {
    pub kind: FaultKind,
    pub started_at: DateTime<Utc>,
    pub ended_at: DateTime<Utc>,
    /// Accepted events when it was injected.
    pub at_accepted: usize,
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
}

/// Why a 2xx arrival happened, as far as the record shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Explanation {
    /// A SUCCESS Attempt was in flight when it arrived.
    SuccessAttempt,
    /// Window 8: a failed Attempt (timeout, error) was in flight: the response was lost.
    LostResponse,
    /// Window 8: no Attempt on record; a worker was killed before it could write one.
    WorkerKilled,
    /// Window 8: no Attempt on record; Postgres was restarting when it should have been written.
    PostgresRestart,
    /// No Attempt on record and no fault to explain why.
    Unrecorded,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Duplicate {
    pub delivery_id: String,
    pub endpoint_id: Uuid,
    pub arrivals_2xx: usize,
    pub received_at: DateTime<Utc>,
    pub explanation: Explanation,
    /// "8" or "unexplained".
    pub window: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DuplicateSummary {
    pub total: usize,
    pub window_8: usize,
    pub window_8_lost_response: usize,
    pub window_8_worker_killed: usize,
    pub window_8_postgres_restart: usize,
    pub unexplained: usize,
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
        if v.lost_examples.len() < EXAMPLES {
            v.lost_examples.push(format!("{}: {} with {} attempts, never answered 2xx", delivery_text(d.id), d.status, tried.len()));
        }
    }

    // Duplicates.
    let kills: Vec<DateTime<Utc>> = inputs.faults.iter().filter(|f| f.kind == FaultKind::KillWorker).map(|f| f.started_at).collect();
    let pg_restarts: Vec<(DateTime<Utc>, DateTime<Utc>)> =
        inputs.faults.iter().filter(|f| f.kind == FaultKind::PostgresRestart).map(|f| (f.started_at, f.ended_at)).collect();
    for d in &inputs.deliveries {
        let Some(list) = arrivals.get(&d.id) else { continue };
        let mut ok: Vec<&Arrival> = list.iter().copied().filter(|a| a.answered_2xx()).collect();
        if ok.len() < 2 {
            continue;
        }
        ok.sort_by_key(|a| a.received_at);
        let tried = attempts.get(&d.id).map(Vec::as_slice).unwrap_or_default();
        let timeout = d.subscription_id.and_then(|s| timeouts.get(&s).copied()).unwrap_or(30);
        let explained: Vec<Explanation> = ok.iter().map(|a| explain(a, tried, timeout, &kills, &pg_restarts)).collect();
        // The one that is not a duplicate: the first with a SUCCESS Attempt of its own, else
        // the first.
        let primary = explained.iter().position(|e| *e == Explanation::SuccessAttempt).unwrap_or(0);
        for (i, (a, e)) in ok.iter().zip(&explained).enumerate() {
            if i == primary {
                continue;
            }
            let window_8 = matches!(e, Explanation::LostResponse | Explanation::WorkerKilled | Explanation::PostgresRestart);
            v.duplicates.total += 1;
            match e {
                Explanation::LostResponse => v.duplicates.window_8_lost_response += 1,
                Explanation::WorkerKilled => v.duplicates.window_8_worker_killed += 1,
                Explanation::PostgresRestart => v.duplicates.window_8_postgres_restart += 1,
                _ => v.duplicates.unexplained += 1,
            }
            if window_8 {
                v.duplicates.window_8 += 1;
            }
            v.duplicate_details.push(Duplicate {
                delivery_id: delivery_text(d.id),
                endpoint_id: d.endpoint_id,
                arrivals_2xx: ok.len(),
                received_at: a.received_at,
                explanation: *e,
                window: if window_8 { "8".into() } else { "unexplained".into() },
            });
        }
    }
    // Unexplained first, then by time.
    v.duplicate_details.sort_by_key(|d| (d.window != "unexplained", d.received_at));

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
    v.passed = v.failures.is_empty();
    v
}

fn explain(a: &Arrival, tried: &[&AttemptRow], timeout_s: i64, kills: &[DateTime<Utc>], pg_restarts: &[(DateTime<Utc>, DateTime<Utc>)]) -> Explanation {
    let slack = Duration::milliseconds(MATCH_SLACK_MS);
    let covering: Vec<&&AttemptRow> = tried
        .iter()
        .filter(|t| t.started_at - slack <= a.received_at && a.received_at <= t.started_at + Duration::milliseconds(i64::from(t.duration_ms)) + slack)
        .collect();
    if covering.iter().any(|t| t.result == "success") {
        return Explanation::SuccessAttempt;
    }
    if !covering.is_empty() {
        return Explanation::LostResponse;
    }
    let from = a.received_at - Duration::seconds(1);
    let until = a.received_at + Duration::seconds(timeout_s + RECORD_HORIZON_EXTRA_S);
    if kills.iter().any(|k| from <= *k && *k <= until) {
        return Explanation::WorkerKilled;
    }
    if pg_restarts.iter().any(|(s, e)| *s <= until && from <= *e) {
        return Explanation::PostgresRestart;
    }
    Explanation::Unrecorded
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
    }

    fn arrival(delivery: Uuid, at: i64, status: u16) -> Arrival {
        Arrival {
            webhook_id: delivery_text(delivery),
            endpoint: 0,
            received_at: t(at),
            answered_at: Some(t(at + 5)),
            status: Some(status),
            behaviour: "ok".into(),
            verified: true,
        }
    }

    fn attempt(delivery: Uuid, n: i32, at: i64, ms: i32, result: &str) -> AttemptRow {
        AttemptRow { delivery_id: delivery, attempt_number: n, started_at: t(at), duration_ms: ms, result: result.into(), status_code: None }
    }

    /// Two events for one endpoint subscribed to `a.*`, both delivered once.
    fn base() -> (Inputs, [Uuid; 2]) {
        let sub = SubscriptionSpec { id: Uuid::now_v7(), endpoint_id: Uuid::now_v7(), pattern: "a.*".into(), timeout_seconds: 2 };
        let events = [Uuid::now_v7(), Uuid::now_v7()];
        let deliveries = [Uuid::now_v7(), Uuid::now_v7()];
        let mut inputs = Inputs { planned_events: 2, subscriptions: vec![sub.clone()], ..Inputs::default() };
        for i in 0..2 {
            inputs.accepted.push(AcceptedEvent { index: i, id: events[i], event_type: "a.b".into() });
            inputs.events_in_postgres.push(events[i]);
            inputs.deliveries.push(DeliveryRow {
                id: deliveries[i],
                event_id: events[i],
                endpoint_id: sub.endpoint_id,
                subscription_id: Some(sub.id),
                status: "SUCCESS".into(),
                attempt_count: 1,
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
        inputs.faults.push(FaultRecord { kind: FaultKind::KillWorker, started_at: t(-19_990), ended_at: t(-19_990), at_accepted: 1 });
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
    fn stuck_and_strays_fail() {
        let (mut inputs, _) = base();
        inputs.deliveries[0].status = "PROCESSING".into();
        inputs.events_in_postgres.push(Uuid::now_v7());
        let v = check(&inputs);
        assert!(!v.passed);
        assert_eq!(v.stuck, 1);
        assert_eq!(v.events_in_postgres_not_accepted, 1);
    }
}
