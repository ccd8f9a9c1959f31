//! `POST /v1/events` in batches (issue 30): the POSTs that arrive together share one ingest
//! statement and one commit.
//!
//! At most `api.ingest_lanes` statements run at once. A POST joins a queue; when a lane is
//! free it starts one at once with whatever waits (up to `api.ingest_batch_max` POSTs), so
//! a POST alone is its own statement, as before, and nothing waits for a batch to fill.
//! Only while every lane is busy do POSTs gather, and the next free lane takes them all:
//! the batch grows with the load, as a group commit does. A POST alone goes with the
//! statement for one Event (`events::INGEST_SQL`, cheaper for one). A batch is the set form of the
//! ingest statement (`railhook_store::events::batch::INGEST_BATCH_SQL`), which looks each
//! POST's API key up itself, so a batch is one round trip. Each POST gets its own answer:
//! an unknown key, a replayed or reused `Idempotency-Key` concern its POST alone.
//!
//! A batch the database refuses (an error the server sent: the statement was its own
//! transaction, so nothing of it was written) is ingested again one POST at a time, each
//! with the single statement, so one POST's fault is its own answer and not its
//! neighbours'. A connection lost mid-statement is every POST's 503, as it was for one.
//!
//! The lanes are tasks of their own: a client that goes away does not cut a batch short.
//! Queued POSTs are bounded (a semaphore of `2 x lanes x batch_max` permits; a POST waits
//! for one before it joins).

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use futures::FutureExt as _;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge};
use railhook_core::TraceContext;
use railhook_store::events::{self, batch, Caller, IngestOutcome, NewEvent};
use railhook_store::{Pool, StoreError};
use railhook_telemetry::Metrics;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

/// One POST's Event, owned, so that it can wait in the queue.
pub struct Pending {
    pub api_key: String,
    pub event_type: String,
    pub payload: serde_json::Value,
    pub idempotency_key: Option<String>,
    pub candidate_patterns: Vec<String>,
    pub trace: Option<TraceContext>,
}

impl Pending {
    fn event(&self) -> NewEvent<'_> {
        NewEvent {
            caller: Caller::ApiKey(&self.api_key),
            event_type: &self.event_type,
            payload: &self.payload,
            idempotency_key: self.idempotency_key.as_deref(),
            request_sha256: events::request_sha256(&self.event_type, &self.payload),
            candidate_patterns: self.candidate_patterns.clone(),
            trace: self.trace.clone(),
        }
    }
}

struct Job {
    pending: Pending,
    reply: oneshot::Sender<Result<IngestOutcome, ApiError>>,
    /// Released when the job is answered (or dropped), not when its POST goes away.
    _room: OwnedSemaphorePermit,
}

/// The queue and its lanes. Cloned into every request's state.
#[derive(Clone)]
pub struct Ingest {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    queue: Mutex<Queue>,
    room: Arc<Semaphore>,
    lanes: usize,
    batch_max: usize,
    batch_events: Histogram,
    refused_batches: IntCounter,
    queued: IntGauge,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Lanes running now.
    running: usize,
}

impl Ingest {
    pub fn new(pool: Pool, lanes: usize, batch_max: usize, metrics: &Metrics) -> Ingest {
        let (lanes, batch_max) = (lanes.max(1), batch_max.max(1));
        let batch_events = Histogram::with_opts(
            HistogramOpts::new("railhook_api_ingest_batch_events", "POST /v1/events per ingest statement (api.ingest_lanes, api.ingest_batch_max).")
                .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]),
        )
        .expect("valid metric");
        let refused_batches = IntCounter::new(
            "railhook_api_ingest_batches_refused_total",
            "Ingest batches the database refused, then ingested one POST at a time.",
        )
        .expect("valid metric");
        let queued = IntGauge::new("railhook_api_ingest_queued", "POST /v1/events waiting for a free ingest lane.").expect("valid metric");
        for m in [Box::new(batch_events.clone()) as Box<dyn prometheus::core::Collector>, Box::new(refused_batches.clone()), Box::new(queued.clone())] {
            // A second AppState on the same registry (tests) finds them registered.
            if let Err(e) = metrics.registry().register(m) {
                tracing::debug!(error = %e, "ingest batch metric not registered");
            }
        }
        Ingest {
            inner: Arc::new(Inner {
                pool,
                queue: Mutex::new(Queue::default()),
                room: Arc::new(Semaphore::new(2 * lanes * batch_max)),
                lanes,
                batch_max,
                batch_events,
                refused_batches,
                queued,
            }),
        }
    }

    /// Ingests one POST's Event, in a batch with the POSTs that wait beside it.
    pub async fn ingest(&self, pending: Pending) -> Result<IngestOutcome, ApiError> {
        let room = self.inner.room.clone().acquire_owned().await.map_err(|_| ApiError::unavailable())?;
        let (reply, answer) = oneshot::channel();
        let start_lane = {
            let mut queue = self.inner.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            queue.jobs.push_back(Job { pending, reply, _room: room });
            self.inner.queued.set(queue.jobs.len() as i64);
            let start = queue.running < self.inner.lanes;
            if start {
                queue.running += 1;
            }
            start
        };
        if start_lane {
            tokio::spawn(lane(self.inner.clone()));
        }
        // Dropped without an answer: the lane's batch panicked.
        answer.await.unwrap_or_else(|_| Err(ApiError::internal()))
    }
}

/// Takes what waits, a batch at a time, until nothing does. Pushing a job and deciding to
/// start a lane happen under the queue's lock, as does a lane's decision to end, so no job
/// is left without a lane.
async fn lane(inner: Arc<Inner>) {
    loop {
        let jobs: Vec<Job> = {
            let mut queue = inner.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let n = queue.jobs.len().min(inner.batch_max);
            if n == 0 {
                queue.running -= 1;
                return;
            }
            let jobs = queue.jobs.drain(..n).collect();
            inner.queued.set(queue.jobs.len() as i64);
            jobs
        };
        // A panic answers this batch's POSTs (their senders are dropped: 500) and the lane
        // goes on.
        if AssertUnwindSafe(run(&inner, jobs)).catch_unwind().await.is_err() {
            tracing::error!("an ingest batch panicked; its POSTs were answered 500");
        }
    }
}

async fn run(inner: &Inner, mut jobs: Vec<Job>) {
    inner.batch_events.observe(jobs.len() as f64);
    // Keyed POSTs first, by key: two batches then insert the keys they share in the same
    // order, so neither waits for the other's key while holding one the other waits for (a
    // deadlock, which Postgres breaks only after deadlock_timeout). The POSTs of a batch
    // were in flight together: no order between them is lost.
    jobs.sort_by(|a, b| match (&a.pending.idempotency_key, &b.pending.idempotency_key) {
        (Some(x), Some(y)) => x.cmp(y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    });
    let client = match inner.pool.get().await {
        Ok(client) => client,
        Err(e) => return answer_all(jobs, &ApiError::from(StoreError::from(e))),
    };
    let events: Vec<NewEvent<'_>> = jobs.iter().map(|j| j.pending.event()).collect();
    // A POST alone: the statement for one Event, which costs Postgres less than the set
    // form of one (light rate, BENCHMARKS "Issue 30, eighteenth session").
    if let [event] = &events[..] {
        let answer = events::ingest(&client, event.clone()).await.map_err(ApiError::from);
        drop(events);
        if let Some(job) = jobs.into_iter().next() {
            let _ = job.reply.send(answer);
        }
        return;
    }
    let mut inserted = match batch::insert_set(&client, &events).await {
        Ok(inserted) => inserted,
        // Refused by the server: the statement (its own transaction) wrote nothing.
        Err(StoreError::Db(e)) if jobs.len() > 1 && e.as_db_error().is_some() => {
            inner.refused_batches.inc();
            tracing::warn!(error = %railhook_store::error::error_chain(&e), posts = jobs.len(), "ingest batch refused; ingesting its POSTs one at a time");
            let mut answers = Vec::with_capacity(jobs.len());
            for event in events {
                answers.push(events::ingest(&client, event).await.map_err(ApiError::from));
            }
            for (job, answer) in jobs.into_iter().zip(answers) {
                let _ = job.reply.send(answer);
            }
            return;
        }
        Err(e) => return answer_all(jobs, &ApiError::from(e)),
    };
    // The Events whose key existed are read back; what was inserted is answered whatever
    // that read does.
    let failed = inserted.resolve(&client, &events).await.err().map(ApiError::from);
    drop(events);
    for (job, outcome) in jobs.into_iter().zip(inserted.outcomes) {
        let answer = match (outcome, &failed) {
            (Some(outcome), _) => Ok(outcome),
            (None, Some(e)) => Err(e.clone()),
            (None, None) => {
                tracing::error!("ingest batch: an Event neither inserted nor read back by its key");
                Err(ApiError::internal())
            }
        };
        let _ = job.reply.send(answer);
    }
}

fn answer_all(jobs: Vec<Job>, error: &ApiError) {
    for job in jobs {
        let _ = job.reply.send(Err(error.clone()));
    }
}
