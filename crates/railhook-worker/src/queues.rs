//! The per-Endpoint queues: where a hint waits for a free slot of its Endpoint inside the
//! worker, first in, first out, instead of going through the retry path as a Deferral.
//!
//! One owner: the consume loop holds the only [`EndpointQueues`] and calls it from one task,
//! so the state needs no lock. Per Endpoint it keeps the slots taken here and the hints
//! waiting. A hint runs at once while the Endpoint has a free slot (`worker.endpoint_concurrency`
//! taken in this process); otherwise it waits, and the moment one of the Endpoint's slots
//! frees, the first waiting hint runs. A slot is taken from the claim to the end of the
//! HTTP request: the consume loop frees it when the task says its request ended
//! (`TaskEvent::Sent`), before the finalise, which the claim then leaves out of its counts
//! (`crate::runner::Finishing`).
//!
//! Postgres stays the truth across worker processes: every claim still counts the
//! Endpoint's and the Project's PROCESSING rows under their locks. A claim that finds the
//! slots taken elsewhere (another worker, the project's limit) or the rate window spent
//! answers `Busy` and writes nothing; its hint goes back to the front of the queue and the
//! Endpoint pauses for a short, growing wait (or until the next rate window). Only when the
//! Endpoint has been busy for longer than `worker.queue_busy_max_ms`, or its queue (or the
//! total) is full, is a hint claimed in the Deferral mode: over the limit it becomes a
//! Deferral through the retry path, as before the queues existed.
//!
//! Bounds: at most `worker.endpoint_queue_max` hints wait per Endpoint and
//! `worker.queue_max` in all (a dead Endpoint cannot take the worker's memory); both depths
//! are metrics. Crash safety: a waiting hint's offset is not stored until its claim step is
//! over (the consumer's contiguous-prefix rule), so a kill -9 redelivers it.
//!
//! The Project's concurrency is mirrored the same way (issue 30): once a claim of an Endpoint
//! has told the queues its Project, its hints take a slot of that Project in this process as
//! well, and wait here while `worker.project_concurrency` of them are taken. Without it, two
//! claim batches in a row of more than half the limit (a worker behind, its batches of 64)
//! made Postgres answer `Busy` for the rest of the second one, which paused their Endpoints
//! and sent the batch down the claim's slow path; that is what made the saturation search
//! hold 976/s in one run and 2,308/s in the next. Postgres still counts every worker's.
//!
//! This is also where ordering parks Deliveries (one type, one owner).

use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::cmp::Reverse;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use railhook_core::{EndpointId, ProjectId};
use tokio::time::Instant;

use crate::consumer::Hint;

/// How a hint's claim treats limits that bite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimMode {
    /// A concurrency or rate limit answers `Busy` and writes nothing: the hint waits here.
    Wait,
    /// A limit that bites is a Deferral through the retry path (queue full, busy too long).
    Defer,
}

/// The queues' bounds (`worker.*`).
#[derive(Debug, Clone, Copy)]
pub struct QueueLimits {
    /// Slots (claim and request) taken at once per Endpoint in this process (0: no limit).
    pub running_per_endpoint: usize,
    /// The same per Project, for the Endpoints whose Project a claim has told
    /// ([`EndpointQueues::project`]); `worker.project_concurrency` (0: no limit).
    pub running_per_project: usize,
    /// Hints waiting per Endpoint.
    pub waiting_per_endpoint: usize,
    /// Hints waiting in all.
    pub waiting_total: usize,
    /// How long an Endpoint may answer `Busy` before its hints are claimed as Deferrals.
    pub busy_max: Duration,
}

impl QueueLimits {
    pub fn from_config(w: &railhook_config::WorkerConfig) -> QueueLimits {
        QueueLimits {
            running_per_endpoint: usize::try_from(w.endpoint_concurrency).unwrap_or(0),
            running_per_project: usize::try_from(w.project_concurrency).unwrap_or(0),
            waiting_per_endpoint: w.endpoint_queue_max,
            waiting_total: w.queue_max,
            busy_max: Duration::from_millis(w.queue_busy_max_ms),
        }
    }
}

/// A hint with its place in Kafka (partition, offset: stored once its claim step is over);
/// none for a hint the worker made itself (an ordered successor its finalise released).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    pub hint: Hint,
    pub place: Option<(i32, i64)>,
    /// When the consumer received its Kafka message (the start of the `poll_to_claim`
    /// latency stage); `None` for a hint with no message (an ordered successor released by
    /// its predecessor's finalise).
    pub received: Option<tokio::time::Instant>,
}

/// A hint to run now, in this claim mode.
#[derive(Debug, Clone)]
pub struct Start {
    pub endpoint: EndpointId,
    pub queued: Queued,
    pub mode: ClaimMode,
    /// The Endpoint's slots past their claim (in their request): the task adds itself once
    /// its claim step is over and leaves when its request ended (or the task ended).
    pub past_claim: Arc<AtomicUsize>,
    /// Whether the queues know the Endpoint's Project: if not, the task tells it once its
    /// claim answers ([`EndpointQueues::project`]).
    pub knows_project: bool,
}

/// A task's place among its Endpoint's slots past their claim ([`Start::past_claim`]): in
/// from [`Self::enter`] to [`Self::leave`], and out again when dropped, so a task that
/// panics (or is aborted) between the two does not leave its Endpoint counted as busy in
/// its own requests for good (ingest pacing would then never see that Endpoint's queue).
/// Entering or leaving twice counts once.
#[derive(Debug)]
pub struct PastClaim {
    count: Arc<AtomicUsize>,
    counted: std::sync::atomic::AtomicBool,
}

impl PastClaim {
    pub fn new(count: Arc<AtomicUsize>) -> PastClaim {
        PastClaim { count, counted: std::sync::atomic::AtomicBool::new(false) }
    }

    pub fn enter(&self) {
        if !self.counted.swap(true, Ordering::Relaxed) {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn leave(&self) {
        if self.counted.swap(false, Ordering::Relaxed) {
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for PastClaim {
    fn drop(&mut self) {
        self.leave();
    }
}

/// What a `Busy` claim found taken, and so what the Endpoint waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusyOn {
    /// The Endpoint's slots, held by another worker: a short, growing pause.
    EndpointSlots,
    /// The Project's concurrency: the next Attempt of this worker that finishes frees a slot
    /// of some project; the Endpoints waiting on a project take turns at it.
    ProjectSlots,
    /// A spent rate window: until it opens, this long from now.
    RateWindow(Duration),
}

#[derive(Debug, Default)]
struct Endpoint {
    running: usize,
    /// Listed in the backlog: runnable, waiting only for a free permit.
    in_backlog: bool,
    /// With the moment each began to wait here.
    waiting: VecDeque<(Queued, Instant)>,
    /// Paused after a `Busy` claim until then.
    paused_until: Option<Instant>,
    /// Since when its claims have come back `Busy` without a claim in between.
    busy_since: Option<Instant>,
    /// The next pause after a `Busy` (doubles, reset by a claim that was not busy).
    backoff: Duration,
    /// Of its running slots, those past their claim (the tasks count themselves).
    past_claim: Arc<AtomicUsize>,
    /// Requests ended since the last [`EndpointQueues::measure`], and the rate at which they
    /// end (per second, a moving average of the measures): how fast its queue drains.
    sent: u32,
    drain_per_s: f64,
    /// A claim of it came back behind a predecessor this worker holds (an ordered Endpoint,
    /// [`EndpointQueues::ordered`]): its hints run up to [`ORDERED_AHEAD`] at once. Forgotten
    /// when it goes idle (its state is dropped).
    ordered: bool,
    /// Its Project, once a claim told it: its slots count in the Project's as well.
    project: Option<ProjectId>,
    /// Listed in [`EndpointQueues::project_waiting`]: waiting for a slot of its Project.
    on_project: bool,
}

/// The tasks an ordered Endpoint may run at once when `worker.endpoint_concurrency` is
/// lower: a claim batch's worth. Its Deliveries claimed behind a predecessor wait in the
/// Ordering Buffer without using a connection of the receiver (one request of an ordered
/// Endpoint is in flight at a time; the claim neither checks nor counts them against the
/// concurrency limits), so the limit on requests would only cap its claims ahead: the claims
/// of one Endpoint go one batch at a time, and a batch was about half its slots (4.9 of 10).
/// Still a cap: a slow ordered Endpoint holds at most this many of `worker.max_in_flight`.
pub const ORDERED_AHEAD: usize = crate::runner::BATCH;

impl Endpoint {
    fn idle(&self) -> bool {
        self.running == 0 && self.waiting.is_empty() && self.paused_until.is_none() && !self.in_backlog
    }
}

/// The weight of the latest measure in an Endpoint's drain rate (measures every 50 ms: about
/// the last quarter second counts).
const DRAIN_WEIGHT: f64 = 0.3;

/// The Endpoints whose Project the queues remember (about 40 bytes each).
const KNOWN_PROJECTS_MAX: usize = 100_000;

/// The shortest and longest pause after a `Busy` claim.
const BUSY_PAUSE_MIN: Duration = Duration::from_millis(5);
const BUSY_PAUSE_MAX: Duration = Duration::from_millis(250);

#[derive(Debug)]
pub struct EndpointQueues {
    limits: QueueLimits,
    endpoints: HashMap<EndpointId, Endpoint>,
    waiting: usize,
    /// Paused Endpoints by the time they may claim again (stale entries are skipped).
    wakeups: BinaryHeap<Reverse<(Instant, EndpointId)>>,
    /// Endpoints that could run a waiting hint but found no free permit (`worker.max_in_flight`
    /// reached): served first, in turn, as permits free.
    backlog: VecDeque<EndpointId>,
    /// Endpoints paused on their project's concurrency: one is let try again each time an
    /// Attempt of this worker finishes (a timer also wakes them, should nothing finish).
    project_blocked: VecDeque<EndpointId>,
    /// Each Project's slots taken here (its known Endpoints' `running`), and the Endpoints
    /// waiting for one, in turn: one is pumped each time one of the Project's slots frees.
    project_running: HashMap<ProjectId, usize>,
    project_waiting: HashMap<ProjectId, VecDeque<EndpointId>>,
    /// The Projects the claims told, by Endpoint; kept while the Endpoint's state is dropped
    /// (idle), forgotten all at once past [`KNOWN_PROJECTS_MAX`] Endpoints.
    known_projects: HashMap<EndpointId, ProjectId>,
    /// The last [`Self::measure`].
    measured: Option<Instant>,
    /// Requests ended since the last measure, every Endpoint's, and their rate (a moving
    /// average that, unlike an Endpoint's, is not forgotten when its queue goes idle).
    sent: u32,
    drain_per_s: f64,
    /// Whether the last measure returned a wait above zero.
    behind: bool,
}

impl EndpointQueues {
    pub fn new(limits: QueueLimits) -> EndpointQueues {
        EndpointQueues {
            limits,
            endpoints: HashMap::new(),
            waiting: 0,
            wakeups: BinaryHeap::new(),
            backlog: VecDeque::new(),
            project_blocked: VecDeque::new(),
            project_running: HashMap::new(),
            project_waiting: HashMap::new(),
            known_projects: HashMap::new(),
            measured: None,
            sent: 0,
            drain_per_s: 0.0,
            behind: false,
        }
    }

    /// A claim of `endpoint` came back behind a predecessor this worker holds
    /// (`TaskEvent::Ordered`): from now on (until it goes idle) it runs up to
    /// [`ORDERED_AHEAD`] hints at once. Returns whether that gave it more room (pump it).
    pub fn ordered(&mut self, endpoint: EndpointId) -> bool {
        match self.endpoints.get_mut(&endpoint) {
            Some(e) if !e.ordered => {
                e.ordered = true;
                self.limits.running_per_endpoint != 0 && self.limits.running_per_endpoint < ORDERED_AHEAD
            }
            _ => false,
        }
    }

    /// An Attempt of `endpoint` told its request ended (`TaskEvent::Sent`): counted for the
    /// rate its queue drains.
    pub fn sent(&mut self, endpoint: EndpointId) {
        self.sent += 1;
        if let Some(e) = self.endpoints.get_mut(&endpoint) {
            e.sent += 1;
        }
    }

    /// How long a hint queued now would wait for its slot, for the Endpoints that wait on
    /// this worker rather than on themselves; the largest of them. Ingest pacing's signal
    /// (`railhook_store::pacing`), measured by the consume loop every 50 ms.
    ///
    /// An Endpoint counts when its queue is not paused by a `Busy` claim (another worker, the
    /// project's concurrency or a rate window: limits, not load), at most half of its
    /// running slots are past their claim, and, if it waits for a slot of its Project here, at
    /// most half of the Project's slots are: the others wait for theirs, so its slots turn
    /// over at the pace of this worker's claims (and of Postgres), and a queue there means
    /// Railhook is behind. A slow or hanging Endpoint, whose slots are held by its own
    /// requests, does not count: one slow customer must not slow every producer down. Its
    /// wait is (hints waiting) / (the rate its requests end, a moving average), and at least
    /// as long as its first hint has waited already (a burst before its first requests
    /// ended, a stall of the claims).
    pub fn measure(&mut self, now: Instant) -> Duration {
        let secs = self.measured.map_or(0.0, |at| now.duration_since(at).as_secs_f64()).max(1e-3);
        self.measured = Some(now);
        let rate = f64::from(std::mem::take(&mut self.sent)) / secs;
        self.drain_per_s = if self.drain_per_s == 0.0 { rate } else { self.drain_per_s + DRAIN_WEIGHT * (rate - self.drain_per_s) };
        let mut wait = 0.0f64;
        // The slots of each Project past their claim, for the Endpoints that wait for a slot of
        // their Project: by the same rule, they count only while at most half of the Project's slots
        // here (`project_running`) are in their requests (its receivers are not what holds them).
        let mut past: HashMap<ProjectId, usize> = HashMap::new();
        if self.limits.running_per_project > 0 {
            for e in self.endpoints.values() {
                if let Some(project) = e.project {
                    *past.entry(project).or_default() += e.past_claim.load(Ordering::Relaxed);
                }
            }
        }
        let (limits, project_running) = (self.limits, &self.project_running);
        for e in self.endpoints.values_mut() {
            let rate = f64::from(std::mem::take(&mut e.sent)) / secs;
            e.drain_per_s = if e.drain_per_s == 0.0 { rate } else { e.drain_per_s + DRAIN_WEIGHT * (rate - e.drain_per_s) };
            let own = 2 * e.past_claim.load(Ordering::Relaxed) <= e.running;
            let project_own = e.project.is_none_or(|project| {
                Self::project_room(&limits, project_running, e) || 2 * past.get(&project).copied().unwrap_or(0) <= project_running.get(&project).copied().unwrap_or(0)
            });
            if e.waiting.is_empty() || e.busy_since.is_some() || e.paused_until.is_some() || !own || !project_own {
                continue;
            }
            let head = e.waiting.front().map_or(0.0, |(_, since)| now.duration_since(*since).as_secs_f64());
            let drained = if e.drain_per_s > 0.0 { e.waiting.len() as f64 / e.drain_per_s } else { 0.0 };
            wait = wait.max(drained).max(head);
        }
        self.behind = wait > 0.0;
        Duration::from_secs_f64(wait.min(86_400.0))
    }

    /// While the last [`Self::measure`] returned a wait, the rate at which this worker's
    /// requests end, every Endpoint's (per second, a moving average of the measures); 0
    /// otherwise. Reported beside the wait: the API adds what it accepted since the report at
    /// this rate. Not the waiting Endpoint's own rate: that one starts again from nothing each
    /// time its queue goes idle (its state is dropped), and a few measures of a cold start
    /// made it tens per second while the Endpoint took thousands (measured in issue 30). The
    /// worker's rate errs the other way (a queue drains at most as fast as all of them), so
    /// the API holds no more than it did without the rate.
    pub fn drain_per_s(&self) -> f64 {
        if self.behind {
            self.drain_per_s
        } else {
            0.0
        }
    }

    /// Hints waiting in all.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Endpoints with any state (running, waiting or paused).
    pub fn endpoints(&self) -> usize {
        self.endpoints.len()
    }

    /// A new hint for `endpoint`: run it now, or keep it waiting. A hint that does not fit
    /// (the Endpoint's queue or the total is full) runs now in the Deferral mode.
    pub fn offer(&mut self, endpoint: EndpointId, queued: Queued, now: Instant) -> Option<Start> {
        let limits = self.limits;
        let total_full = self.waiting >= limits.waiting_total;
        let e = Self::entry(&mut self.endpoints, &self.known_projects, endpoint);
        if e.waiting.is_empty() && Self::may_run(&limits, e, now) && Self::project_room(&limits, &self.project_running, e) {
            let mode = Self::mode(&limits, e, now);
            return Some(Self::take(endpoint, e, &mut self.project_running, queued, mode));
        }
        if total_full || e.waiting.len() >= limits.waiting_per_endpoint {
            return Some(Self::take(endpoint, e, &mut self.project_running, queued, ClaimMode::Defer));
        }
        e.waiting.push_back((queued, now));
        self.waiting += 1;
        self.wait_for_project(endpoint);
        None
    }

    /// [`EndpointQueues::offer`], but a hint that has to wait goes to the front of its
    /// Endpoint's queue: the ordered successor a finalise released, which everything queued
    /// behind it for that Endpoint waits for (at the back it would wait behind them, and the
    /// retry scheduler would announce it meanwhile under its own token).
    pub fn offer_front(&mut self, endpoint: EndpointId, queued: Queued, now: Instant) -> Option<Start> {
        let limits = self.limits;
        let e = Self::entry(&mut self.endpoints, &self.known_projects, endpoint);
        if e.waiting.is_empty() && Self::may_run(&limits, e, now) && Self::project_room(&limits, &self.project_running, e) {
            let mode = Self::mode(&limits, e, now);
            return Some(Self::take(endpoint, e, &mut self.project_running, queued, mode));
        }
        e.waiting.push_front((queued, now));
        self.waiting += 1;
        self.wait_for_project(endpoint);
        None
    }

    /// A claim of `endpoint` told its Project (once per Endpoint: [`Start::knows_project`]):
    /// from now on its slots count in the Project's, and it waits while they are all taken.
    pub fn project(&mut self, endpoint: EndpointId, project: ProjectId) {
        if self.known_projects.len() >= KNOWN_PROJECTS_MAX && !self.known_projects.contains_key(&endpoint) {
            self.known_projects.clear();
        }
        self.known_projects.insert(endpoint, project);
        if let Some(e) = self.endpoints.get_mut(&endpoint) {
            if e.project.is_none() {
                e.project = Some(project);
                if e.running > 0 {
                    *self.project_running.entry(project).or_default() += e.running;
                }
            }
        }
    }

    /// Slots of `project` taken in this process.
    pub fn project_running(&self, project: ProjectId) -> usize {
        self.project_running.get(&project).copied().unwrap_or(0)
    }

    /// An Attempt of `endpoint` started by this queue finished. `busy`: its claim found a
    /// limit taken (the hint goes back to the front) and which, or `None` when the claim step
    /// ended otherwise. Returns the Endpoints to pump now, in order: the first Endpoint
    /// waiting here for a slot of its Project, `endpoint` itself, and, when the claim was not busy, one
    /// Endpoint that Postgres answered busy on its project's concurrency.
    pub fn finished(&mut self, endpoint: EndpointId, busy: Option<(Queued, BusyOn)>, now: Instant) -> Vec<EndpointId> {
        let mut pump = vec![endpoint];
        let Some(e) = self.endpoints.get_mut(&endpoint) else { return pump };
        let freed = e.running > 0;
        e.running = e.running.saturating_sub(1);
        let project = e.project.filter(|_| freed);
        match busy {
            Some((queued, on)) => {
                e.waiting.push_front((queued, now));
                self.waiting += 1;
                e.busy_since.get_or_insert(now);
                e.backoff = (e.backoff * 2).clamp(BUSY_PAUSE_MIN, BUSY_PAUSE_MAX);
                let until = match on {
                    BusyOn::EndpointSlots => now + e.backoff,
                    BusyOn::RateWindow(left) => now + left.max(BUSY_PAUSE_MIN),
                    BusyOn::ProjectSlots => {
                        if !self.project_blocked.contains(&endpoint) {
                            self.project_blocked.push_back(endpoint);
                        }
                        now + BUSY_PAUSE_MAX
                    }
                };
                e.paused_until = Some(until);
                self.wakeups.push(Reverse((until, endpoint)));
            }
            None => {
                e.busy_since = None;
                e.backoff = Duration::ZERO;
                // A slot of some project freed: the longest-waiting Endpoint blocked on its
                // project's concurrency tries again now.
                if let Some(blocked) = self.project_blocked.pop_front() {
                    if let Some(b) = self.endpoints.get_mut(&blocked) {
                        b.paused_until = None;
                        pump.push(blocked);
                    }
                }
            }
        }
        if let Some(project) = project {
            if let Some(n) = self.project_running.get_mut(&project) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.project_running.remove(&project);
                }
            }
            // Before `endpoint` itself, which lists itself again behind the others if it has
            // more to run: the Endpoints waiting on one Project take its slots in turn.
            if let Some(next) = self.next_for_project(project, now).filter(|next| !pump.contains(next)) {
                pump.insert(0, next);
            }
        }
        pump
    }

    /// Starts from the backlog (Endpoints that waited for a free permit), in turn, at most
    /// `budget`.
    pub fn from_backlog(&mut self, mut budget: usize, now: Instant) -> Vec<Start> {
        let mut out = Vec::new();
        while budget > 0 {
            let Some(endpoint) = self.backlog.pop_front() else { break };
            if let Some(e) = self.endpoints.get_mut(&endpoint) {
                e.in_backlog = false;
            }
            let started = self.ready(endpoint, budget, now);
            budget -= started.len();
            out.extend(started);
        }
        out
    }

    pub fn has_backlog(&self) -> bool {
        !self.backlog.is_empty()
    }

    /// The hints of `endpoint` that may run now, at most `budget` (free permits), in order.
    pub fn ready(&mut self, endpoint: EndpointId, budget: usize, now: Instant) -> Vec<Start> {
        let limits = self.limits;
        let mut out = Vec::new();
        let Some(e) = self.endpoints.get_mut(&endpoint) else { return out };
        while out.len() < budget && Self::may_run(&limits, e, now) && Self::project_room(&limits, &self.project_running, e) {
            let Some((queued, _)) = e.waiting.pop_front() else { break };
            self.waiting -= 1;
            let mode = Self::mode(&limits, e, now);
            out.push(Self::take(endpoint, e, &mut self.project_running, queued, mode));
        }
        if out.len() == budget && !e.waiting.is_empty() && !e.in_backlog && Self::may_run(&limits, e, now) && Self::project_room(&limits, &self.project_running, e) {
            // Runnable, but no permit left: served first when one frees.
            e.in_backlog = true;
            self.backlog.push_back(endpoint);
        }
        if e.idle() {
            self.endpoints.remove(&endpoint);
        } else {
            self.wait_for_project(endpoint);
        }
        out
    }

    /// The Endpoint's state, made with its Project if a claim told it before.
    fn entry<'a>(endpoints: &'a mut HashMap<EndpointId, Endpoint>, known: &HashMap<EndpointId, ProjectId>, endpoint: EndpointId) -> &'a mut Endpoint {
        endpoints.entry(endpoint).or_insert_with(|| Endpoint { project: known.get(&endpoint).copied(), ..Endpoint::default() })
    }

    /// Takes a slot of the Endpoint (and of its Project, if known) for `queued`.
    fn take(endpoint: EndpointId, e: &mut Endpoint, project_running: &mut HashMap<ProjectId, usize>, queued: Queued, mode: ClaimMode) -> Start {
        e.running += 1;
        if let Some(project) = e.project {
            *project_running.entry(project).or_default() += 1;
        }
        Start { endpoint, queued, mode, past_claim: e.past_claim.clone(), knows_project: e.project.is_some() }
    }

    /// Whether a slot of the Endpoint's Project is free here (always, while it is unknown).
    fn project_room(limits: &QueueLimits, project_running: &HashMap<ProjectId, usize>, e: &Endpoint) -> bool {
        match (limits.running_per_project, e.project) {
            (0, _) | (_, None) => true,
            (cap, Some(project)) => project_running.get(&project).copied().unwrap_or(0) < cap,
        }
    }

    /// Lists `endpoint` among those waiting for a slot of its Project, if that is what its
    /// waiting hints wait for.
    fn wait_for_project(&mut self, endpoint: EndpointId) {
        let limits = self.limits;
        let Some(e) = self.endpoints.get_mut(&endpoint) else { return };
        let Some(project) = e.project else { return };
        if e.on_project || e.waiting.is_empty() || Self::project_room(&limits, &self.project_running, e) {
            return;
        }
        e.on_project = true;
        self.project_waiting.entry(project).or_default().push_back(endpoint);
    }

    /// The first Endpoint still waiting for a slot of `project` that may run now. Entries of
    /// Endpoints whose state was dropped or that ran since are skipped; so are Endpoints held
    /// by their own slots or a pause, which list themselves again when those free
    /// ([`Self::ready`]), so that the Project's slot goes to one that can take it.
    fn next_for_project(&mut self, project: ProjectId, now: Instant) -> Option<EndpointId> {
        let limits = self.limits;
        let queue = self.project_waiting.get_mut(&project)?;
        let mut next = None;
        while let Some(endpoint) = queue.pop_front() {
            if let Some(e) = self.endpoints.get_mut(&endpoint).filter(|e| e.on_project) {
                e.on_project = false;
                if Self::may_run(&limits, e, now) {
                    next = Some(endpoint);
                    break;
                }
            }
        }
        if queue.is_empty() {
            self.project_waiting.remove(&project);
        }
        next
    }

    /// The earliest time a paused Endpoint may claim again.
    pub fn next_wakeup(&self) -> Option<Instant> {
        self.wakeups.peek().map(|Reverse((at, _))| *at)
    }

    /// Endpoints whose pause is over (each once), to call [`Self::ready`] for.
    pub fn woken(&mut self, now: Instant) -> Vec<EndpointId> {
        let mut out = Vec::new();
        while let Some(Reverse((at, endpoint))) = self.wakeups.peek().copied() {
            if at > now {
                break;
            }
            self.wakeups.pop();
            if let Some(e) = self.endpoints.get_mut(&endpoint) {
                if e.paused_until.is_some_and(|until| until <= now) {
                    e.paused_until = None;
                    out.push(endpoint);
                }
            }
        }
        out
    }

    fn may_run(limits: &QueueLimits, e: &Endpoint, now: Instant) -> bool {
        let cap = match limits.running_per_endpoint {
            0 => 0,
            n if e.ordered => n.max(ORDERED_AHEAD),
            n => n,
        };
        let slot = cap == 0 || e.running < cap;
        slot && e.paused_until.is_none_or(|until| until <= now)
    }

    fn mode(limits: &QueueLimits, e: &Endpoint, now: Instant) -> ClaimMode {
        match e.busy_since {
            Some(since) if now.duration_since(since) >= limits.busy_max => ClaimMode::Defer,
            _ => ClaimMode::Wait,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use railhook_core::DeliveryId;

    fn limits(running: usize, waiting: usize, total: usize) -> QueueLimits {
        QueueLimits { running_per_endpoint: running, running_per_project: 0, waiting_per_endpoint: waiting, waiting_total: total, busy_max: Duration::from_secs(5) }
    }

    fn hint(offset: i64) -> Queued {
        Queued { hint: Hint { delivery: DeliveryId::new(), claim_token: None, announced_at: None, position: None, trace: None }, place: Some((0, offset)), received: None }
    }

    #[test]
    fn runs_up_to_the_limit_then_waits_in_order() {
        let now = Instant::now();
        let (a, b) = (EndpointId::new(), EndpointId::new());
        let mut q = EndpointQueues::new(limits(2, 10, 100));
        let started: Vec<_> = (0..5).filter_map(|o| q.offer(a, hint(o), now)).collect();
        assert_eq!(started.iter().map(|s| s.queued.place.unwrap().1).collect::<Vec<_>>(), vec![0, 1]);
        assert!(started.iter().all(|s| s.mode == ClaimMode::Wait));
        assert_eq!(q.waiting(), 3);
        // Another endpoint is not held up by a's queue.
        assert_eq!(q.offer(b, hint(9), now).map(|s| s.queued.place.unwrap().1), Some(9));
        // Nothing is ready while both of a's slots are taken.
        assert!(q.ready(a, 10, now).is_empty());
        q.finished(a, None, now);
        let next = q.ready(a, 10, now);
        assert_eq!(next.iter().map(|s| s.queued.place.unwrap().1).collect::<Vec<_>>(), vec![2], "one slot freed, the first waiting runs");
        q.finished(a, None, now);
        q.finished(a, None, now);
        assert_eq!(q.ready(a, 1, now).len(), 1, "the budget (free permits) bounds what starts");
        assert_eq!(q.waiting(), 1);
    }

    #[test]
    fn an_ordered_endpoint_runs_a_claim_batch_ahead_and_no_more() {
        let now = Instant::now();
        let (a, b) = (EndpointId::new(), EndpointId::new());
        let mut q = EndpointQueues::new(limits(2, 1_000, 1_000));
        let first: Vec<_> = (0..200).filter_map(|o| q.offer(a, hint(o), now)).collect();
        assert_eq!(first.len(), 2, "the request slots until a claim comes back behind");
        assert!(q.ordered(a), "more room: pump it");
        assert!(!q.ordered(a), "told once");
        let ahead = q.ready(a, 1_000, now);
        assert_eq!(ahead.len(), ORDERED_AHEAD - 2, "a claim batch's worth at once, in order");
        assert_eq!(ahead[0].queued.place.unwrap().1, 2);
        assert!(q.ready(a, 1_000, now).is_empty(), "and no more: a slow ordered Endpoint holds at most ORDERED_AHEAD tasks");
        // Another Endpoint keeps its request slots.
        assert_eq!((0..5).filter_map(|o| q.offer(b, hint(o), now)).count(), 2);
        // Idle, the Endpoint is forgotten, and ordered with it.
        let c = EndpointId::new();
        assert_eq!((0..2).filter_map(|o| q.offer(c, hint(o), now)).count(), 2);
        assert!(q.ordered(c));
        q.finished(c, None, now);
        q.finished(c, None, now);
        assert!(q.ready(c, 10, now).is_empty(), "nothing waits: idle, dropped");
        assert_eq!((0..5).filter_map(|o| q.offer(c, hint(o), now)).count(), 2, "its request slots again");
        let mut unlimited = EndpointQueues::new(limits(0, 10, 10));
        assert!(unlimited.offer(a, hint(0), now).is_some());
        assert!(!unlimited.ordered(a), "no limit: nothing to raise");
    }

    #[test]
    fn a_full_queue_runs_the_overflow_as_deferrals() {
        let now = Instant::now();
        let dead = EndpointId::new();
        let mut q = EndpointQueues::new(limits(1, 3, 1_000));
        let mut deferred = 0;
        for o in 0..50_000 {
            if let Some(s) = q.offer(dead, hint(o), now) {
                if s.mode == ClaimMode::Defer {
                    deferred += 1;
                    q.finished(dead, None, now);
                }
            }
        }
        assert_eq!(q.waiting(), 3, "bounded per endpoint");
        assert_eq!(deferred, 50_000 - 1 - 3);
        // The total bound holds across endpoints.
        let mut q = EndpointQueues::new(limits(1, 100, 10));
        for i in 0..20 {
            let e = EndpointId::new();
            q.offer(e, hint(i), now);
            q.offer(e, hint(i), now);
        }
        assert_eq!(q.waiting(), 10);
    }

    #[test]
    fn a_project_known_from_a_claim_waits_here_for_its_slots() {
        let now = Instant::now();
        let (a, b, c) = (EndpointId::new(), EndpointId::new(), EndpointId::new());
        let (p, other) = (ProjectId::new(), ProjectId::new());
        let mut q = EndpointQueues::new(QueueLimits { running_per_project: 3, ..limits(10, 100, 1_000) });
        // Unknown Project: only the Endpoint's own slots count.
        let first: Vec<_> = (0..2).filter_map(|o| q.offer(a, hint(o), now)).collect();
        assert_eq!(first.len(), 2);
        assert!(first.iter().all(|s| !s.knows_project), "the task tells the Project");
        q.project(a, p);
        assert_eq!(q.project_running(p), 2, "a's running slots count once its Project is known");
        let more: Vec<_> = (2..5).filter_map(|o| q.offer(a, hint(o), now)).collect();
        assert_eq!(more.len(), 1, "one slot of the Project's 3 left");
        assert!(more[0].knows_project);
        q.project(b, p);
        assert!(q.offer(b, hint(10), now).is_none(), "b waits for a slot of the same Project");
        assert!(q.offer(c, hint(20), now).is_some(), "another Endpoint, its Project unknown, runs");
        q.project(c, other);
        assert_eq!(q.project_running(other), 1);
        assert_eq!(q.waiting(), 3);
        // A slot of p frees: a waited for one first (its hints 3 and 4), so a is pumped.
        let pump = q.finished(a, None, now);
        assert_eq!(pump, vec![a], "a itself, which is also the first that waited for p");
        let started: Vec<_> = pump.iter().flat_map(|e| q.ready(*e, 10, now)).collect();
        assert_eq!(started.iter().map(|s| s.queued.place.unwrap().1).collect::<Vec<_>>(), vec![3], "one slot freed, one hint started");
        assert_eq!(q.project_running(p), 3);
        // The next slot goes to b, listed before a listed itself again: they take turns.
        let pump = q.finished(a, None, now);
        assert_eq!(pump, vec![b, a]);
        let started: Vec<_> = pump.iter().flat_map(|e| q.ready(*e, 10, now)).collect();
        assert_eq!(started.iter().map(|s| s.queued.place.unwrap().1).collect::<Vec<_>>(), vec![10]);
        let pump = q.finished(b, None, now);
        assert_eq!(pump, vec![a, b]);
        let started: Vec<_> = pump.iter().flat_map(|e| q.ready(*e, 10, now)).collect();
        assert_eq!(started.iter().map(|s| s.queued.place.unwrap().1).collect::<Vec<_>>(), vec![4]);
        // The Project is remembered while the Endpoint's state is dropped.
        q.finished(c, None, now);
        assert_eq!(q.project_running(other), 0);
        assert!(q.offer(c, hint(21), now).is_some_and(|s| s.knows_project));
        // Without a limit nothing waits on the Project.
        let mut free = EndpointQueues::new(limits(10, 100, 1_000));
        free.project(a, p);
        assert_eq!((0..10).filter_map(|o| free.offer(a, hint(o), now)).count(), 10);
    }

    #[test]
    fn busy_pauses_the_endpoint_then_defers_after_the_bound() {
        let t0 = Instant::now();
        let e = EndpointId::new();
        let mut q = EndpointQueues::new(limits(2, 10, 100));
        let first = q.offer(e, hint(0), t0).unwrap();
        q.offer(e, hint(1), t0).unwrap();
        q.finished(e, Some((first.queued, BusyOn::EndpointSlots)), t0);
        assert_eq!(q.waiting(), 1, "the busy hint is back in the queue");
        assert!(q.ready(e, 10, t0).is_empty(), "paused");
        let wake = q.next_wakeup().unwrap();
        assert!(wake > t0 && wake <= t0 + BUSY_PAUSE_MAX);
        assert_eq!(q.woken(wake), vec![e]);
        let again = q.ready(e, 10, wake);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].queued.place.unwrap().1, 0, "the busy hint keeps its place");
        assert_eq!(again[0].mode, ClaimMode::Wait);
        // Busy for longer than the bound: the next claim may defer.
        let late = t0 + Duration::from_secs(6);
        q.finished(e, Some((again[0].queued.clone(), BusyOn::RateWindow(Duration::from_millis(300)))), late);
        assert_eq!(q.next_wakeup(), Some(late + Duration::from_millis(300)), "a rate window's pause is kept");
        let woken = late + Duration::from_millis(300);
        assert_eq!(q.woken(woken), vec![e]);
        let deferred = q.ready(e, 10, woken);
        assert_eq!(deferred[0].mode, ClaimMode::Defer);
        // A claim that was not busy resets the bound.
        q.finished(e, None, woken);
        q.finished(e, None, woken);
        assert_eq!(q.offer(e, hint(5), woken).unwrap().mode, ClaimMode::Wait);
    }

    /// An Endpoint whose own Attempt finished while every permit was taken is not forgotten:
    /// it waits in the backlog and runs first when a permit frees.
    #[test]
    fn an_endpoint_out_of_permits_is_served_from_the_backlog() {
        let now = Instant::now();
        let (a, b) = (EndpointId::new(), EndpointId::new());
        let mut q = EndpointQueues::new(limits(1, 10, 100));
        q.offer(a, hint(0), now).unwrap();
        assert!(q.offer(a, hint(1), now).is_none());
        assert!(q.offer(a, hint(2), now).is_none());
        let pump = q.finished(a, None, now);
        assert_eq!(pump, vec![a]);
        assert!(q.ready(a, 0, now).is_empty(), "no permit free");
        assert!(q.has_backlog());
        // b runs meanwhile; then a permit frees and a is served first.
        q.offer(b, hint(9), now).unwrap();
        let started = q.from_backlog(1, now);
        assert_eq!(started.iter().map(|s| (s.endpoint, s.queued.place.unwrap().1)).collect::<Vec<_>>(), vec![(a, 1)]);
        assert!(!q.has_backlog(), "a's slot is taken again: it waits for its own Attempt now");
    }

    /// Endpoints blocked on their project's concurrency take turns: each finished Attempt
    /// lets the longest-waiting one try again at once, without waiting for a timer.
    #[test]
    fn a_finished_attempt_wakes_one_endpoint_blocked_on_its_project() {
        let now = Instant::now();
        let (a, b, c) = (EndpointId::new(), EndpointId::new(), EndpointId::new());
        let mut q = EndpointQueues::new(limits(5, 10, 100));
        let sa = q.offer(a, hint(0), now).unwrap();
        let sb = q.offer(b, hint(1), now).unwrap();
        q.offer(c, hint(2), now).unwrap();
        q.finished(a, Some((sa.queued, BusyOn::ProjectSlots)), now);
        q.finished(b, Some((sb.queued, BusyOn::ProjectSlots)), now);
        assert!(q.ready(a, 10, now).is_empty() && q.ready(b, 10, now).is_empty(), "both paused");
        let pump = q.finished(c, None, now);
        assert_eq!(pump, vec![c, a], "c's slot freed: a, blocked first, tries first");
        assert_eq!(q.ready(a, 10, now).len(), 1);
        assert!(q.ready(b, 10, now).is_empty(), "b waits for the next slot");
    }

    #[test]
    fn a_past_claim_place_counts_once_and_is_given_back_when_dropped() {
        let count = Arc::new(AtomicUsize::new(0));
        let place = PastClaim::new(count.clone());
        place.enter();
        place.enter();
        assert_eq!(count.load(Ordering::Relaxed), 1);
        place.leave();
        place.leave();
        assert_eq!(count.load(Ordering::Relaxed), 0);
        // A task that panics while counted: the unwinding drops its place.
        let panicking = PastClaim::new(count.clone());
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            panicking.enter();
            assert_eq!(count.load(Ordering::Relaxed), 1);
            panic!("the task panics past its claim");
        }));
        assert!(unwound.is_err());
        assert_eq!(Arc::strong_count(&place.count), 1, "the panicking task's place is gone");
        assert_eq!(place.count.load(Ordering::Relaxed), 0, "and it left the count");
    }

    /// One 100 ms window of an Endpoint in steady state: `n` requests end, as many waiting
    /// hints start and as many new ones queue.
    fn window(q: &mut EndpointQueues, e: EndpointId, n: usize, at: Instant) {
        for o in 0..n {
            q.sent(e);
            q.finished(e, None, at);
            assert_eq!(q.ready(e, 1, at).len(), 1);
            assert!(q.offer(e, hint(o as i64), at).is_none());
        }
    }

    /// Ingest pacing's signal: a queue behind this worker's own claims counts, a queue behind
    /// an Endpoint's own requests does not, nor one paused on a limit.
    #[test]
    fn the_delivery_wait_counts_queues_behind_the_workers_claims_only() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let tenth = |k: u32| t0 + ms(100) * k;
        let (fast, slow, limited) = (EndpointId::new(), EndpointId::new(), EndpointId::new());
        let mut q = EndpointQueues::new(limits(10, 10_000, 100_000));
        assert_eq!(q.measure(t0), Duration::ZERO, "nothing queued");
        let mut slots = std::collections::HashMap::new();
        for o in 0..1_010 {
            for e in [fast, slow, limited] {
                if let Some(start) = q.offer(e, hint(o), t0) {
                    slots.insert(e, start.past_claim);
                }
            }
        }
        // A burst before any request ended: the first hint's wait so far.
        assert_eq!(q.measure(tenth(1)), ms(100));
        // The slow Endpoint's ten slots are all in their requests, and so are the third's.
        slots[&slow].store(10, Ordering::Relaxed);
        slots[&limited].store(10, Ordering::Relaxed);
        // Then (waiting) / (the rate requests end): 50 per 100 ms, 500/s, is 2 s for 1,000.
        let mut wait = Duration::ZERO;
        for k in 2..40 {
            window(&mut q, fast, 50, tenth(k));
            window(&mut q, slow, 2, tenth(k));
            wait = q.measure(tenth(k));
        }
        assert!((1_990..=2_010).contains(&wait.as_millis()), "the fast Endpoint's 2 s, not the slow one's 50 s: {wait:?}");
        assert!((515.0..=525.0).contains(&q.drain_per_s()), "reported beside it, every Endpoint's rate (500/s + 20/s): {}", q.drain_per_s());
        // An Endpoint paused on a limit does not count, however long its queue, even with its
        // slots free of requests.
        slots[&limited].store(0, Ordering::Relaxed);
        let running = q.offer(EndpointId::new(), hint(0), t0).unwrap();
        q.finished(limited, Some((running.queued, BusyOn::RateWindow(ms(900)))), tenth(40));
        window(&mut q, fast, 50, tenth(40));
        window(&mut q, slow, 2, tenth(40));
        let wait = q.measure(tenth(40)).as_millis();
        assert!((1_990..=2_010).contains(&wait), "the limited Endpoint does not count: {wait}");
        // A stall (no request ends): the fast Endpoint's wait grows with its first hint's.
        let wait = q.measure(tenth(70));
        assert!(wait >= ms(4_000), "{wait:?}");
        // Once most of the fast Endpoint's slots are in their requests, its queue is its own.
        slots[&fast].store(6, Ordering::Relaxed);
        assert_eq!(q.measure(tenth(71)), Duration::ZERO);
        assert_eq!(q.drain_per_s(), 0.0, "no wait, no rate");
    }

    /// An Endpoint waiting for a slot of its Project counts in the delivery wait while the
    /// Project's slots are in their claims (this worker is behind), not while the Project's
    /// requests hold them (its receivers are slow: one customer must not pace every producer).
    #[test]
    fn a_project_held_by_its_requests_does_not_count_in_the_delivery_wait() {
        let t0 = Instant::now();
        let (a, b) = (EndpointId::new(), EndpointId::new());
        let project = ProjectId::new();
        let mut q = EndpointQueues::new(QueueLimits { running_per_project: 4, ..limits(10, 1_000, 1_000) });
        q.project(a, project);
        q.project(b, project);
        let running: Vec<_> = (0..4).filter_map(|o| q.offer(a, hint(o), t0)).collect();
        assert_eq!(running.len(), 4);
        assert!(q.offer(b, hint(10), t0).is_none(), "b waits for a slot of the Project");
        let later = t0 + Duration::from_millis(300);
        // a's slots in their claims: b's wait is this worker's.
        assert_eq!(q.measure(later), Duration::from_millis(300));
        // a's slots in their requests: b waits on the Project's receivers.
        running[0].past_claim.store(4, Ordering::Relaxed);
        assert_eq!(q.measure(later), Duration::ZERO);
    }

    #[test]
    fn no_limit_means_every_hint_runs() {
        let now = Instant::now();
        let e = EndpointId::new();
        let mut q = EndpointQueues::new(limits(0, 10, 100));
        assert!((0..1_000).all(|o| q.offer(e, hint(o), now).is_some()));
        assert_eq!(q.waiting(), 0);
    }
}
