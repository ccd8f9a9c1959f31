//! What a run recorded about its faults and Attempts, and how a duplicate arrival is
//! explained by duplicate window 8 (DESIGN.md section 4): shared by the Deliveries' checker
//! ([`crate::checker`]) and the Forwards' ([`crate::forwards`]).

use std::collections::HashSet;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::plan::{FaultKind, Link};
use crate::receiver::Arrival;

/// Slack around an Attempt's recorded window when matching an arrival to it (clocks are the
/// same machine's; the Attempt's start is taken just before the request is sent).
const MATCH_SLACK_MS: i64 = 500;
/// How long after an arrival an Attempt's record may still be written: the request's
/// timeout plus the finalise's retries (about 6.3 s) and scheduling slack.
const RECORD_HORIZON_EXTRA_S: i64 = 12;

/// One injected fault.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FaultRecord {
    pub kind: FaultKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<Link>,
    pub started_at: DateTime<Utc>,
    pub ended_at: DateTime<Utc>,
    /// Accepted events of the paced stream when it was injected.
    pub at_accepted: usize,
    /// Whether it ended a worker's process ([`FaultKind::kills_a_worker`] on the run's
    /// transport): its Attempts in flight were never recorded (window 8).
    #[serde(default)]
    pub kills_a_worker: bool,
    /// What the injection saw, by kind (the standby's takeover time, the slot's state, ...).
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub detail: serde_json::Value,
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

/// Why a 2xx arrival happened, as far as the record shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Explanation {
    /// A SUCCESS Attempt was in flight when it arrived.
    SuccessAttempt,
    /// Window 8: a failed Attempt (timeout, error) was in flight: the response was lost.
    LostResponse,
    /// Window 8: no Attempt on record; a worker was killed (or its attempt task panicked)
    /// before it could write one.
    WorkerKilled,
    /// Window 8: no Attempt on record; Postgres was restarting, crashed, full, or out of
    /// the worker's reach when it should have been written (the finalise gave up; the sweep
    /// handed the Delivery out again).
    PostgresUnreachable,
    /// Window 8: its SUCCESS Attempt is on record, but a Postgres crash forgot the claim it
    /// was made under (another Attempt has its number): the outcome never reached the
    /// Delivery, which went again.
    ForgottenClaim,
    /// No Attempt on record and no fault to explain why.
    Unrecorded,
}

impl Explanation {
    pub fn is_window_8(self) -> bool {
        matches!(self, Explanation::LostResponse | Explanation::WorkerKilled | Explanation::PostgresUnreachable | Explanation::ForgottenClaim)
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DuplicateSummary {
    pub total: usize,
    pub window_8: usize,
    pub window_8_lost_response: usize,
    pub window_8_worker_killed: usize,
    pub window_8_postgres_unreachable: usize,
    pub window_8_forgotten_claim: usize,
    pub unexplained: usize,
}

impl DuplicateSummary {
    pub fn count(&mut self, e: Explanation) {
        self.total += 1;
        match e {
            Explanation::LostResponse => self.window_8_lost_response += 1,
            Explanation::WorkerKilled => self.window_8_worker_killed += 1,
            Explanation::PostgresUnreachable => self.window_8_postgres_unreachable += 1,
            Explanation::ForgottenClaim => self.window_8_forgotten_claim += 1,
            Explanation::SuccessAttempt | Explanation::Unrecorded => self.unexplained += 1,
        }
        if e.is_window_8() {
            self.window_8 += 1;
        }
    }
}

/// The faults as the explanations need them.
#[derive(Debug, Clone, Default)]
pub struct FaultTimes {
    /// When a worker's process was ended: from the fault's start to its end. A kill is an
    /// instant; on inline, `slot_invalidation` and the relay's kill stop the whole `railhook
    /// all` process, whose shutdown grace runs for seconds before it cuts what is still in
    /// flight (a quick inline run saw a request answered 0.7 s before that cut and 7 s after
    /// the fault's start: taking the start alone left it unexplained). `clock_skew` stops
    /// workers at its start and at its end, two instants.
    pub kills: Vec<(DateTime<Utc>, DateTime<Utc>)>,
    /// When the workers could not write to Postgres.
    pub postgres_unreachable: Vec<(DateTime<Utc>, DateTime<Utc>)>,
    /// When Postgres crashed (until it was up again).
    pub crashes: Vec<(DateTime<Utc>, DateTime<Utc>)>,
    /// When a worker's attempt tasks could panic (`task_panic`): a task that died after its
    /// request wrote no Attempt, as a killed worker.
    pub panics: Vec<(DateTime<Utc>, DateTime<Utc>)>,
}

impl FaultTimes {
    pub fn new(faults: &[FaultRecord]) -> FaultTimes {
        FaultTimes {
            // A clock skew stops workers twice: when the skewed one takes over and when it
            // hands back.
            kills: faults
                .iter()
                .filter(|f| f.kills_a_worker)
                .flat_map(|f| match f.kind {
                    FaultKind::ClockSkew => vec![(f.started_at, f.started_at), (f.ended_at, f.ended_at)],
                    _ => vec![(f.started_at, f.ended_at)],
                })
                .collect(),
            postgres_unreachable: faults.iter().filter(|f| f.kind.postgres_unreachable(f.link)).map(|f| (f.started_at, f.ended_at)).collect(),
            crashes: faults.iter().filter(|f| f.kind == FaultKind::PostgresCrash).map(|f| (f.started_at, f.ended_at)).collect(),
            panics: faults.iter().filter(|f| f.kind == FaultKind::TaskPanic).map(|f| (f.started_at, f.ended_at)).collect(),
        }
    }
}

/// (Delivery or Forward, Attempt number) pairs that more than one Attempt carries: each but
/// the last was made under a claim that a Postgres crash forgot.
pub fn repeated_attempt_numbers(attempts: &[AttemptRow]) -> HashSet<(Uuid, i32)> {
    let mut seen = HashSet::new();
    let mut repeated = HashSet::new();
    for a in attempts {
        if !seen.insert((a.delivery_id, a.attempt_number)) {
            repeated.insert((a.delivery_id, a.attempt_number));
        }
    }
    repeated
}

/// Why arrival `a` happened, given the Attempts of its Delivery (or Forward), its timeout,
/// the faults, and the repeated Attempt numbers ([`repeated_attempt_numbers`]).
pub fn explain(a: &Arrival, tried: &[&AttemptRow], timeout_s: i64, faults: &FaultTimes, repeated: &HashSet<(Uuid, i32)>) -> Explanation {
    let slack = Duration::milliseconds(MATCH_SLACK_MS);
    let covering: Vec<&&AttemptRow> = tried
        .iter()
        .filter(|t| t.started_at - slack <= a.received_at && a.received_at <= t.started_at + Duration::milliseconds(i64::from(t.duration_ms)) + slack)
        .collect();
    let horizon = Duration::seconds(timeout_s + RECORD_HORIZON_EXTRA_S);
    let near_crash = |t: &AttemptRow| {
        let (from, until) = (t.started_at - Duration::seconds(2), t.started_at + Duration::milliseconds(i64::from(t.duration_ms)) + horizon);
        faults.crashes.iter().any(|(s, e)| *s <= until && from <= *e)
    };
    if let Some(success) = covering.iter().find(|t| t.result == "success") {
        if repeated.contains(&(success.delivery_id, success.attempt_number)) && near_crash(success) {
            // The later Attempt of that number is the one the Delivery's outcome records.
            let later = tried.iter().any(|t| t.attempt_number == success.attempt_number && t.started_at > success.started_at);
            if later {
                return Explanation::ForgottenClaim;
            }
        }
        return Explanation::SuccessAttempt;
    }
    if !covering.is_empty() {
        return Explanation::LostResponse;
    }
    let from = a.received_at - Duration::seconds(1);
    let until = a.received_at + horizon;
    if faults.kills.iter().any(|(s, e)| *s <= until && from <= *e) || faults.panics.iter().any(|(s, e)| *s <= until && from <= *e) {
        return Explanation::WorkerKilled;
    }
    if faults.postgres_unreachable.iter().any(|(s, e)| *s <= until && from <= *e) {
        return Explanation::PostgresUnreachable;
    }
    Explanation::Unrecorded
}
