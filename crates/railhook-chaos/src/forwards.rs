//! The incoming direction's invariants (issue 16): what the chaos client's provider requests
//! to `POST /ingress/{token}` were answered, what Postgres holds (Incoming Events, Forwards,
//! their Attempts), what the receiver recorded at the Destinations and when each fault
//! happened, in; a [`ForwardsVerdict`] out. A pure function, tested on hand-made inputs.
//!
//! - **accepted**: a provider event (one provider event id of one Source) whose request was
//!   answered `202` (stored) or, when the first answer was cut off by a fault and the client
//!   asked again, `200` (duplicate) naming the stored Incoming Event.
//! - **resends**: the client sends some accepted provider events again, once their first
//!   answer came back: each must be answered `200` with the first answer's id and make no
//!   Forward (every answer of one provider event names one Incoming Event; every Incoming
//!   Event has exactly one Forward per Destination of its Source).
//! - **expected**: accepted provider events x the Destinations of their Source.
//! - **delivered**: the Destination answered a 2xx to a request whose `Idempotency-Key` (and
//!   Standard Webhooks `webhook-id`) is the Forward id.
//! - **lost**: expected, never answered 2xx, and not FAILED with every Attempt a failure. A
//!   missing Forward row is lost too.
//! - **duplicate**: each 2xx for one `Idempotency-Key` beyond its first, explained by window 8
//!   exactly as the Deliveries' are ([`crate::record::explain`]), or unexplained.
//! - **headers**: `Idempotency-Key` = `webhook-id` = the Forward id, `X-Incoming-Event-Id`
//!   = its Incoming Event, `X-Forward-Attempt` between 1 and its Attempts.
//! - **stuck**: a Forward still PENDING or PROCESSING after the drain.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::plan::FaultKind;
use crate::receiver::Arrival;
use crate::record::{explain, repeated_attempt_numbers, AttemptRow, DuplicateSummary, Explanation, FaultRecord, FaultTimes};

const EXAMPLES: usize = 20;

/// One provider request the client had answered (`202` or `200`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IncomingRequest {
    /// The Source (its index in the run).
    pub source: usize,
    pub provider_event_id: String,
    /// A deliberate resend of an already accepted provider event.
    pub resend: bool,
    pub status: u16,
    /// The Incoming Event the answer named.
    pub id: Uuid,
    /// When the client had the answer.
    #[serde(default = "epoch")]
    pub answered_at: DateTime<Utc>,
}

fn epoch() -> DateTime<Utc> {
    DateTime::UNIX_EPOCH
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DestinationSpec {
    pub id: Uuid,
    /// The Source (its index in the run).
    pub source: usize,
    /// The receiver's endpoint index.
    pub endpoint: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForwardRow {
    pub id: Uuid,
    pub incoming_event_id: Uuid,
    pub destination_id: Uuid,
    pub status: String,
    pub attempt_count: i32,
    pub timeout_seconds: i32,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Default)]
pub struct ForwardInputs {
    /// Provider events the client meant to have accepted (resends not counted).
    pub planned: usize,
    pub requests: Vec<IncomingRequest>,
    /// Requests the client gave up on or that were refused.
    pub refused: Vec<String>,
    pub destinations: Vec<DestinationSpec>,
    pub incoming_in_postgres: Vec<Uuid>,
    pub forwards: Vec<ForwardRow>,
    /// The Forwards' Attempts (`delivery_id` holds the Forward id).
    pub attempts: Vec<AttemptRow>,
    /// The arrivals at the Destinations' receiver endpoints.
    pub arrivals: Vec<Arrival>,
    pub faults: Vec<FaultRecord>,
}

/// How many Forwards were in flight (created, not yet answered 2xx) when a fault began.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForwardsInFlight {
    pub kind: FaultKind,
    pub started_at: DateTime<Utc>,
    pub forwards_in_flight: usize,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ForwardsVerdict {
    pub planned: usize,
    pub accepted: usize,
    pub refused: usize,
    pub answered_202: usize,
    pub answered_200: usize,
    pub resends: usize,
    pub resends_200: usize,
    /// Resends answered otherwise than `200` with the first answer's id.
    pub resends_wrong: usize,
    /// Provider events whose answers name more than one Incoming Event.
    pub id_mismatches: usize,
    pub incoming_in_postgres: usize,
    pub accepted_missing_in_postgres: usize,
    pub incoming_not_accepted: usize,
    pub expected: usize,
    pub in_postgres: usize,
    /// Forward rows beyond one per Incoming Event and Destination, or of an unknown pair.
    pub unexpected: usize,
    pub delivered: usize,
    pub failed_legitimately: usize,
    pub lost: usize,
    pub lost_examples: Vec<String>,
    pub duplicates: DuplicateSummary,
    pub duplicate_examples: Vec<String>,
    pub stuck: usize,
    pub stuck_examples: Vec<String>,
    pub header_mismatches: usize,
    pub header_examples: Vec<String>,
    pub bad_signatures: usize,
    pub arrivals_total: usize,
    pub arrivals_2xx: usize,
    pub attempts_by_result: BTreeMap<String, usize>,
    pub in_flight_at_faults: Vec<ForwardsInFlight>,
    pub failures: Vec<String>,
    /// The Incoming Events of the lost and of the stuck Forwards, and for each duplicate when
    /// the Forward had arrived twice, with its explanation (for the report by fault kind).
    #[serde(skip)]
    pub lost_incoming: Vec<Uuid>,
    #[serde(skip)]
    pub stuck_incoming: Vec<Uuid>,
    #[serde(skip)]
    pub duplicate_arrivals: Vec<(DateTime<Utc>, Explanation)>,
}

fn fwd(id: Uuid) -> String {
    railhook_core::ForwardId(id).to_string()
}

fn push(examples: &mut Vec<String>, text: String) {
    if examples.len() < EXAMPLES {
        examples.push(text);
    }
}

pub fn check(inputs: &ForwardInputs) -> ForwardsVerdict {
    let mut v = ForwardsVerdict { planned: inputs.planned, refused: inputs.refused.len(), ..ForwardsVerdict::default() };
    let accepted = check_answers(inputs, &mut v);
    let by_id: HashMap<Uuid, &ForwardRow> = inputs.forwards.iter().map(|f| (f.id, f)).collect();
    let arrivals = arrivals_by_forward(inputs, &by_id, &mut v);
    let mut attempts: HashMap<Uuid, Vec<&AttemptRow>> = HashMap::new();
    for a in &inputs.attempts {
        attempts.entry(a.delivery_id).or_default().push(a);
        *v.attempts_by_result.entry(a.result.clone()).or_default() += 1;
    }
    check_forwards(inputs, &accepted, &arrivals, &attempts, &mut v);
    check_duplicates(inputs, &arrivals, &attempts, &mut v);
    in_flight(inputs, &arrivals, &mut v);
    verdict(&mut v);
    v
}

/// The client's answers: accepted provider events (source, provider event id) -> Incoming
/// Event, resends, and Incoming Events against Postgres.
fn check_answers(inputs: &ForwardInputs, v: &mut ForwardsVerdict) -> HashMap<Uuid, usize> {
    let mut named: HashMap<(usize, &str), HashSet<Uuid>> = HashMap::new();
    let mut first: HashMap<(usize, &str), Uuid> = HashMap::new();
    for r in inputs.requests.iter().filter(|r| !r.resend) {
        first.entry((r.source, r.provider_event_id.as_str())).or_insert(r.id);
    }
    for r in &inputs.requests {
        named.entry((r.source, r.provider_event_id.as_str())).or_default().insert(r.id);
        match r.status {
            202 => v.answered_202 += 1,
            _ => v.answered_200 += 1,
        }
        if r.resend {
            v.resends += 1;
            let right = r.status == 200 && first.get(&(r.source, r.provider_event_id.as_str())) == Some(&r.id);
            if right {
                v.resends_200 += 1;
            } else {
                v.resends_wrong += 1;
            }
        }
    }
    v.id_mismatches = named.values().filter(|ids| ids.len() > 1).count();
    let accepted: HashMap<Uuid, usize> = named.iter().flat_map(|((source, _), ids)| ids.iter().map(|id| (*id, *source))).collect();
    v.accepted = named.len();
    let in_pg: HashSet<Uuid> = inputs.incoming_in_postgres.iter().copied().collect();
    v.incoming_in_postgres = in_pg.len();
    v.accepted_missing_in_postgres = accepted.keys().filter(|id| !in_pg.contains(id)).count();
    v.incoming_not_accepted = in_pg.iter().filter(|id| !accepted.contains_key(id)).count();
    accepted
}

/// The Destinations' arrivals by Forward; counts them and checks the Forward headers.
fn arrivals_by_forward<'a>(inputs: &'a ForwardInputs, by_id: &HashMap<Uuid, &ForwardRow>, v: &mut ForwardsVerdict) -> HashMap<Uuid, Vec<&'a Arrival>> {
    let mut out: HashMap<Uuid, Vec<&Arrival>> = HashMap::new();
    for a in &inputs.arrivals {
        v.arrivals_total += 1;
        v.arrivals_2xx += usize::from(a.answered_2xx());
        if !a.verified {
            v.bad_signatures += 1;
            continue;
        }
        let forward = a.webhook_id.parse::<railhook_core::ForwardId>().ok().and_then(|id| by_id.get(&id.0).copied());
        match forward {
            Some(f) => {
                if let Some(problem) = header_problem(a, f) {
                    v.header_mismatches += 1;
                    push(&mut v.header_examples, format!("{}: {problem}", fwd(f.id)));
                }
                out.entry(f.id).or_default().push(a);
            }
            None => {
                v.header_mismatches += 1;
                push(&mut v.header_examples, format!("webhook-id {:?} is no Forward", a.webhook_id));
            }
        }
    }
    out
}

fn header_problem(a: &Arrival, f: &ForwardRow) -> Option<String> {
    if a.idempotency_key.as_deref() != Some(a.webhook_id.as_str()) {
        return Some(format!("Idempotency-Key {:?} is not the webhook-id", a.idempotency_key));
    }
    let incoming = railhook_core::IncomingEventId(f.incoming_event_id).to_string();
    if a.incoming_event_id.as_deref() != Some(incoming.as_str()) {
        return Some(format!("X-Incoming-Event-Id {:?}, its Incoming Event is {incoming}", a.incoming_event_id));
    }
    match a.forward_attempt {
        Some(n) if n >= 1 && n <= f.attempt_count.max(1) => None,
        other => Some(format!("X-Forward-Attempt {other:?} with {} Attempts", f.attempt_count)),
    }
}

/// Expected Forwards against the rows: delivered, failed for a reason, lost, unexpected, stuck.
fn check_forwards(
    inputs: &ForwardInputs,
    accepted: &HashMap<Uuid, usize>,
    arrivals: &HashMap<Uuid, Vec<&Arrival>>,
    attempts: &HashMap<Uuid, Vec<&AttemptRow>>,
    v: &mut ForwardsVerdict,
) {
    let mut rows: HashMap<(Uuid, Uuid), Vec<&ForwardRow>> = HashMap::new();
    for f in &inputs.forwards {
        rows.entry((f.incoming_event_id, f.destination_id)).or_default().push(f);
        if f.status == "PENDING" || f.status == "PROCESSING" {
            v.stuck += 1;
            v.stuck_incoming.push(f.incoming_event_id);
            push(&mut v.stuck_examples, format!("{} {} (attempts {})", fwd(f.id), f.status, f.attempt_count));
        }
    }
    v.in_postgres = inputs.forwards.len();
    let mut expected_pairs = 0;
    for (incoming, source) in accepted {
        for d in inputs.destinations.iter().filter(|d| d.source == *source) {
            expected_pairs += 1;
            let Some(found) = rows.get(&(*incoming, d.id)) else {
                v.lost += 1;
                v.lost_incoming.push(*incoming);
                push(&mut v.lost_examples, format!("{}/{}: no Forward in Postgres", railhook_core::IncomingEventId(*incoming), railhook_core::DestinationId(d.id)));
                continue;
            };
            v.unexpected += found.len() - 1;
            judge(found[0], arrivals, attempts, v);
        }
    }
    v.expected = expected_pairs;
    let known: usize = rows.iter().filter(|((i, d), _)| accepted.contains_key(i) && inputs.destinations.iter().any(|x| x.id == *d)).map(|(_, r)| r.len()).sum();
    v.unexpected += inputs.forwards.len() - known;
}

fn judge(f: &ForwardRow, arrivals: &HashMap<Uuid, Vec<&Arrival>>, attempts: &HashMap<Uuid, Vec<&AttemptRow>>, v: &mut ForwardsVerdict) {
    if arrivals.get(&f.id).is_some_and(|a| a.iter().any(|a| a.answered_2xx())) {
        v.delivered += 1;
        return;
    }
    let tried = attempts.get(&f.id).map(Vec::as_slice).unwrap_or_default();
    if f.status == "FAILED" && !tried.is_empty() && tried.iter().all(|a| a.result != "success") {
        v.failed_legitimately += 1;
        return;
    }
    v.lost += 1;
    v.lost_incoming.push(f.incoming_event_id);
    push(&mut v.lost_examples, format!("{}: {} with {} attempts, never answered 2xx", fwd(f.id), f.status, tried.len()));
}

/// Every 2xx for one Forward beyond the first, explained as the Deliveries' are.
fn check_duplicates(inputs: &ForwardInputs, arrivals: &HashMap<Uuid, Vec<&Arrival>>, attempts: &HashMap<Uuid, Vec<&AttemptRow>>, v: &mut ForwardsVerdict) {
    let fault_times = FaultTimes::new(&inputs.faults);
    let repeated = repeated_attempt_numbers(&inputs.attempts);
    for f in &inputs.forwards {
        let mut ok: Vec<&Arrival> = arrivals.get(&f.id).into_iter().flatten().copied().filter(|a| a.answered_2xx()).collect();
        if ok.len() < 2 {
            continue;
        }
        ok.sort_by_key(|a| a.received_at);
        let tried = attempts.get(&f.id).map(Vec::as_slice).unwrap_or_default();
        let explained: Vec<Explanation> = ok.iter().map(|a| explain(a, tried, i64::from(f.timeout_seconds), &fault_times, &repeated)).collect();
        let primary = explained.iter().position(|e| *e == Explanation::SuccessAttempt).unwrap_or(0);
        for (i, (a, e)) in ok.iter().zip(&explained).enumerate().filter(|(i, _)| *i != primary) {
            v.duplicates.count(*e);
            v.duplicate_arrivals.push((a.received_at.max(ok[primary].received_at), *e));
            let text = format!("{} 2xx #{} of {} at {} (X-Forward-Attempt {:?}): {e:?}", fwd(f.id), i + 1, ok.len(), a.received_at.format("%H:%M:%S%.3f"), a.forward_attempt);
            push(&mut v.duplicate_examples, text);
        }
    }
}

/// What each fault hit: Forwards created before it began and not yet answered 2xx.
fn in_flight(inputs: &ForwardInputs, arrivals: &HashMap<Uuid, Vec<&Arrival>>, v: &mut ForwardsVerdict) {
    let first_2xx: HashMap<Uuid, DateTime<Utc>> =
        arrivals.iter().filter_map(|(id, list)| list.iter().filter(|a| a.answered_2xx()).map(|a| a.received_at).min().map(|at| (*id, at))).collect();
    for fault in &inputs.faults {
        let forwards_in_flight = inputs
            .forwards
            .iter()
            .filter(|f| f.created_at <= fault.started_at && first_2xx.get(&f.id).is_none_or(|at| *at > fault.started_at))
            .count();
        v.in_flight_at_faults.push(ForwardsInFlight { kind: fault.kind, started_at: fault.started_at, forwards_in_flight });
    }
}

fn verdict(v: &mut ForwardsVerdict) {
    let mut failures = Vec::new();
    let mut fail = |cond: bool, what: String| {
        if cond {
            failures.push(what);
        }
    };
    fail(v.accepted < v.planned, format!("{} of {} incoming requests were never accepted", v.planned - v.accepted.min(v.planned), v.planned));
    fail(v.id_mismatches > 0, format!("{} provider events were answered with more than one Incoming Event", v.id_mismatches));
    fail(v.resends_wrong > 0, format!("{} resends were not answered 200 with the first answer's id", v.resends_wrong));
    fail(v.accepted_missing_in_postgres > 0, format!("{} accepted Incoming Events are not in Postgres", v.accepted_missing_in_postgres));
    fail(v.incoming_not_accepted > 0, format!("{} Incoming Events in Postgres were never accepted", v.incoming_not_accepted));
    fail(v.unexpected > 0, format!("{} Forwards beyond one per Incoming Event and Destination", v.unexpected));
    fail(v.lost > 0, format!("{} Forwards lost", v.lost));
    fail(v.duplicates.unexplained > 0, format!("{} duplicate Forward arrivals are not window 8", v.duplicates.unexplained));
    fail(v.stuck > 0, format!("{} Forwards stuck in a non-terminal state", v.stuck));
    fail(v.header_mismatches > 0, format!("{} Forward requests with wrong headers", v.header_mismatches));
    fail(v.bad_signatures > 0, format!("{} Forward requests failed signature verification", v.bad_signatures));
    v.failures = failures;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
    }

    const DST: Uuid = Uuid::from_u128(0xd5);

    fn arrival(f: &ForwardRow, at: i64, status: u16, attempt: i32) -> Arrival {
        Arrival {
            webhook_id: fwd(f.id),
            endpoint: 5,
            received_at: t(at),
            answered_at: Some(t(at + 5)),
            status: Some(status),
            behaviour: "ok".into(),
            verified: true,
            sequence: None,
            idempotency_key: Some(fwd(f.id)),
            incoming_event_id: Some(railhook_core::IncomingEventId(f.incoming_event_id).to_string()),
            forward_attempt: Some(attempt),
            sent_timestamp: t(at).timestamp(),
        }
    }

    fn attempt(f: &ForwardRow, n: i32, at: i64, result: &str) -> AttemptRow {
        AttemptRow { delivery_id: f.id, attempt_number: n, started_at: t(at), duration_ms: 20, result: result.into(), status_code: None }
    }

    /// Two provider events of Source 0 (one Destination), the second resent; both delivered.
    fn base() -> ForwardInputs {
        let mut inputs = ForwardInputs { planned: 2, destinations: vec![DestinationSpec { id: DST, source: 0, endpoint: 5 }], ..ForwardInputs::default() };
        for n in 0..2u128 {
            let (incoming, id) = (Uuid::from_u128(0x100 + n), Uuid::from_u128(0x200 + n));
            inputs.requests.push(IncomingRequest { source: 0, provider_event_id: format!("msg_{n}"), resend: false, status: 202, id: incoming, answered_at: t(0) });
            inputs.incoming_in_postgres.push(incoming);
            let f = ForwardRow { id, incoming_event_id: incoming, destination_id: DST, status: "SUCCESS".into(), attempt_count: 1, timeout_seconds: 30, created_at: t(0) };
            inputs.attempts.push(attempt(&f, 1, 10_000, "success"));
            inputs.arrivals.push(arrival(&f, 10_010, 200, 1));
            inputs.forwards.push(f);
        }
        inputs.requests.push(IncomingRequest { source: 0, provider_event_id: "msg_1".into(), resend: true, status: 200, id: Uuid::from_u128(0x101), answered_at: t(0) });
        inputs
    }

    #[test]
    fn delivered_forwards_and_a_resend_answered_200_pass() {
        let v = check(&base());
        assert!(v.failures.is_empty(), "{:?}", v.failures);
        assert_eq!((v.accepted, v.expected, v.delivered, v.resends, v.resends_200), (2, 2, 2, 1, 1));
    }

    #[test]
    fn a_forward_without_a_2xx_or_without_a_row_is_lost() {
        let mut inputs = base();
        inputs.arrivals[0].status = Some(500);
        inputs.forwards.remove(1);
        let v = check(&inputs);
        assert_eq!(v.lost, 2, "{v:?}");
        assert!(v.failures.iter().any(|f| f.contains("lost")));
    }

    #[test]
    fn a_resend_that_stored_again_fails() {
        let mut inputs = base();
        inputs.requests[2] = IncomingRequest { status: 202, id: Uuid::from_u128(0x999), ..inputs.requests[2].clone() };
        let v = check(&inputs);
        assert_eq!((v.resends_wrong, v.id_mismatches), (1, 1), "{v:?}");
    }

    #[test]
    fn a_second_forward_for_one_incoming_event_is_unexpected() {
        let mut inputs = base();
        let extra = ForwardRow { id: Uuid::from_u128(0x300), ..inputs.forwards[0].clone() };
        inputs.arrivals.push(arrival(&extra, 120, 200, 1));
        inputs.forwards.push(extra);
        let v = check(&inputs);
        assert_eq!(v.unexpected, 1, "{v:?}");
    }

    #[test]
    fn duplicates_are_window_8_after_a_worker_kill_and_unexplained_without_one() {
        let mut inputs = base();
        let f = inputs.forwards[0].clone();
        // A 2xx without an Attempt of its own: the worker died before writing it.
        inputs.arrivals.push(arrival(&f, 5_000, 200, 1));
        let v = check(&inputs);
        assert_eq!((v.duplicates.total, v.duplicates.unexplained), (1, 1), "{v:?}");
        inputs.faults.push(FaultRecord { kind: FaultKind::KillWorker, link: None, started_at: t(6_000), ended_at: t(6_000), at_accepted: 1, kills_a_worker: true, detail: serde_json::Value::Null });
        let v = check(&inputs);
        assert_eq!((v.duplicates.window_8_worker_killed, v.duplicates.unexplained), (1, 0), "{v:?}");
        // Created before the kill and not answered 2xx by then: the second Forward only.
        assert_eq!(v.in_flight_at_faults[0].forwards_in_flight, 1);
    }

    #[test]
    fn wrong_forward_headers_and_stuck_forwards_fail() {
        let mut inputs = base();
        inputs.arrivals[0].idempotency_key = Some("fwd_other".into());
        inputs.arrivals[1].forward_attempt = Some(3);
        inputs.forwards[1].status = "PROCESSING".into();
        let v = check(&inputs);
        assert_eq!((v.header_mismatches, v.stuck), (2, 1), "{v:?}");
    }
}
