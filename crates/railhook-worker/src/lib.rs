//! `railhook worker`: consumes Delivery announcements from Kafka, claims each Delivery in
//! Postgres, runs one Attempt over HTTP, and records its outcome; plus the retry scheduler
//! and the sweeps (DESIGN.md section 6).
//!
//! Modules: [`consumer`] (offsets, hints), [`runner`] (the Attempt Runner and its
//! invariants), [`http`] (the request, SSRF guard, classification, signing headers),
//! [`ladder`] (waits, jitter, caps), [`error`] (the one error type), [`metrics`]. Every
//! statement on `deliveries` is `railhook_store::lifecycle`'s.

use std::sync::Arc;
use std::time::Duration;

use railhook_config::Config;
use railhook_core::EndpointId;
use railhook_store::lifecycle;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::Headers;
use rdkafka::Message;
use railhook_telemetry::stages::Stage;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub mod clock;
pub mod consumer;
pub mod error;
pub mod failpoint;
pub mod forwards;
pub mod http;
pub mod ladder;
pub mod metrics;
pub mod ordering;
pub mod partitions;
pub mod queues;
pub mod replays;
pub mod retention;
pub mod runner;
pub mod vacuum;

pub use error::{ErrorKind, WorkerError};
pub use metrics::WorkerMetrics;
use runner::Runner;

/// Scheduler batch bounds: per statement, per endpoint, per project.
pub const SCHEDULE_BATCH: i64 = 500;
pub const SCHEDULE_PER_ENDPOINT: i64 = 50;
pub const SCHEDULE_PER_PROJECT: i64 = 200;
/// Rows per sweep statement.
pub const SWEEP_BATCH: i64 = 1_000;

/// Runs the consumer, the retry scheduler and the sweeps until `shutdown`, then drains: it
/// stops consuming, lets Attempts in flight finish for `worker.shutdown_grace_ms`, releases
/// the Claims of those that did not, and commits offsets.
///
/// Shutdown order: the consumer stops first (no new hints), then its Attempts drain, then
/// the scheduler and sweeps stop (they own no in-flight work), then the Batchers end with
/// the last Runner handle.
pub async fn run(config: Arc<Config>, metrics: WorkerMetrics, shutdown: CancellationToken) -> Result<(), WorkerError> {
    run_with(config, metrics, None, shutdown).await
}

/// [`run`], with the transport: `inline` takes the announcements of this process's relay
/// from its channel (`railhook_kafka::inline`) instead of Kafka, and acknowledges each one
/// when its claim step is over (where it would store its Kafka offset). `railhook all` makes
/// the channel.
pub async fn run_with(config: Arc<Config>, metrics: WorkerMetrics, inline: Option<railhook_kafka::inline::InlineReceivers>, shutdown: CancellationToken) -> Result<(), WorkerError> {
    let runner = Arc::new(runner_for(&config, &metrics)?);
    let task_panic = failpoint::TaskPanic::from_env()?.map(Arc::new);
    let topic = config.deliveries_topic();
    let (inline_deliveries, inline_forwards) = match inline {
        Some(r) => (Some(r.deliveries), Some(r.forwards)),
        None => (None, None),
    };
    while inline_deliveries.is_none() {
        match railhook_kafka::ensure_topics(&config.kafka, &[topic.clone(), config.forwards_topic()]).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(error = %e, "worker: Kafka not ready, retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }

    let background = shutdown.child_token();
    let mut jobs = JoinSet::new();
    // Retries are timed on the database's clock (crate::clock): measured before the first
    // Attempt, then kept up to date.
    if let Ok(client) = runner.pool.get().await {
        if let Err(e) = runner.clock.sample(&**client).await {
            tracing::debug!(error = %e, "database clock sample");
        }
    }
    warm_pool(&runner.pool, &config).await;
    jobs.spawn(runner.clock.clone().sample_loop(runner.pool.clone(), background.clone()));
    jobs.spawn(scheduler_loop(runner.pool.clone(), config.clone(), metrics.clone(), background.clone()));
    jobs.spawn(sweep_loop(runner.pool.clone(), config.clone(), metrics.clone(), background.clone()));
    // The Claims' and open Deliveries' tables, vacuumed at the worker's pace (crate::vacuum).
    jobs.spawn(vacuum::run(runner.pool.clone(), config.worker.claims_vacuum_interval_ms, background.clone()));
    // The attempt log's daily partitions, made a week ahead (crate::partitions).
    jobs.spawn(partitions::run(runner.pool.clone(), background.clone()));
    // Replays (the Time Machine): bounded batches below live traffic (crate::replays).
    jobs.spawn(replays::run(runner.pool.clone(), config.replay.clone(), background.clone()));
    // Retention: one run at a time across workers, in bounded batches (crate::retention).
    jobs.spawn(retention::run(runner.pool.clone(), config.retention.clone(), metrics.retention.clone(), background.clone()));
    // The incoming direction: its own consume loop (crate::forwards). The two consumers stop
    // together: a Forwards consumer that stops on an error stops the Deliveries' (drained as
    // at shutdown) and the worker, so a supervisor sees it, as it would for the Deliveries'.
    // Ingest pacing's signal: the consume loop measures, this task tells the API processes.
    let (wait_tx, wait_rx) = tokio::sync::watch::channel((Duration::ZERO, 0u32));
    jobs.spawn(pacing_loop(runner.pool.clone(), wait_rx, background.clone()));
    let consumers = shutdown.child_token();
    let mut incoming = tokio::spawn(forwards::serve(config.clone(), runner.pool.clone(), runner.sender.clone(), runner.clock.clone(), metrics.clone(), inline_forwards, consumers.clone()));
    let outgoing = consume(&config, &topic, runner, wait_tx, task_panic, inline_deliveries, consumers.clone());
    tokio::pin!(outgoing);
    let result = tokio::select! {
        result = &mut outgoing => {
            consumers.cancel();
            let ended = (&mut incoming).await;
            result.and(forwards_ended(ended))
        }
        ended = &mut incoming => {
            consumers.cancel();
            let result = outgoing.await;
            forwards_ended(ended).and(result)
        }
    };
    background.cancel();
    while jobs.join_next().await.is_some() {}
    result
}

/// How the Forwards consumer's task ended, as the worker's result.
fn forwards_ended(ended: Result<Result<(), WorkerError>, tokio::task::JoinError>) -> Result<(), WorkerError> {
    match ended {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            tracing::error!(error = %error::chain(&e), "the Forwards consumer stopped");
            Err(e)
        }
        Err(e) => Err(WorkerError::new(error::ErrorKind::Misconfigured, "the Forwards consumer's task failed", Some(Arc::new(e)))),
    }
}

fn runner_for(config: &Config, metrics: &WorkerMetrics) -> Result<Runner, WorkerError> {
    let w = &config.worker;
    let pool = railhook_store::build_pool_as(&config.database, railhook_store::application::WORKER).map_err(|e| WorkerError::misconfigured("database", e))?;
    let sender = http::Sender::from_config(&config.network)?;
    let finishing = runner::Finishing::default();
    let ordering = ordering::OrderingBuffer::default();
    let claimer = runner::claimer(pool.clone(), lifecycle::Limits::from_config(w), metrics.clone(), w.max_in_flight, finishing.clone(), ordering.clone());
    let circuit = lifecycle::Circuit { window_s: w.circuit_window_seconds as f64, min_volume: w.circuit_min_requests, ratio: w.circuit_failure_ratio };
    let finaliser = runner::finaliser(pool.clone(), circuit, metrics.clone(), w.max_in_flight);
    Ok(Runner { settings: runner::AttemptSettings::from_config(w), pool, sender, metrics: metrics.clone(), claimer, finaliser, finishing, ordering, clock: clock::DbClock::default() })
}

/// The Deliveries consumer's context: sets `railhook_worker_consumer_joined` at its first
/// assignment. Until then the consumer reads nothing (its group's join, then its positions),
/// and a burst that starts meanwhile waits in Kafka: measured in issue 30, a hot Endpoint's
/// burst begun as `/readyz` answered (before this check) had 800-1,500 Events accepted before
/// the first reached the worker, and a p99 of 415-450 ms against 99-105 ms once the join was
/// over.
pub struct JoinContext {
    joined: prometheus::IntGauge,
}

impl rdkafka::ClientContext for JoinContext {}

impl rdkafka::consumer::ConsumerContext for JoinContext {
    fn post_rebalance(&self, _: &rdkafka::consumer::BaseConsumer<Self>, rebalance: &rdkafka::consumer::Rebalance<'_>) {
        if let rdkafka::consumer::Rebalance::Assign(partitions) = rebalance {
            tracing::info!(partitions = partitions.count(), "worker: Deliveries consumer assigned");
            self.joined.set(1);
        }
    }
}

/// The Deliveries consumer.
type DeliveriesConsumer = StreamConsumer<JoinContext>;

fn subscribe(config: &Config, topic: &str, joined: prometheus::IntGauge) -> Result<DeliveriesConsumer, WorkerError> {
    let consumer: DeliveriesConsumer = railhook_kafka::consumer_config(&config.kafka, &config.worker.group_id)
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        // Find a topic created moments ago without waiting for the 5-minute refresh.
        .set("topic.metadata.refresh.interval.ms", "10000")
        .create_with_context(JoinContext { joined })
        .map_err(|e| WorkerError::misconfigured("cannot create the Kafka consumer", e))?;
    consumer.subscribe(&[topic]).map_err(|e| WorkerError::misconfigured(format!("cannot subscribe to {topic}"), e))?;
    Ok(consumer)
}

/// The consumer's offsets: each message's offset is stored once its claim step finished,
/// over a contiguous prefix per partition (`consumer::OffsetTracker`). With the inline
/// transport there is no consumer: a hint's place is (0, its sequence number in the channel)
/// and its claim step's end sends its acknowledgement to the relay instead.
struct Offsets<'a> {
    consumer: Option<&'a DeliveriesConsumer>,
    topic: &'a str,
    tracker: consumer::OffsetTracker,
    acks: railhook_kafka::inline::Pending,
}

impl Offsets<'_> {
    fn done(&mut self, partition: i32, offset: i64) {
        let Some(consumer) = self.consumer else {
            self.acks.done(offset);
            return;
        };
        let Some(next) = self.tracker.done(partition, offset) else { return };
        // `rd_kafka_offsets_store` stores the offset as given: the next one to read.
        // (`Consumer::store_offset` wraps the legacy `rd_kafka_offset_store`, which stores
        // offset + 1; passing it the next offset skipped one message after a rebalance.)
        let mut tpl = rdkafka::TopicPartitionList::new();
        let stored = tpl
            .add_partition_offset(self.topic, partition, rdkafka::Offset::Offset(next))
            .and_then(|()| consumer.store_offsets(&tpl));
        if let Err(e) = stored {
            tracing::debug!(error = %e, partition, "cannot store offset (partition revoked?)");
        }
    }
}

/// What a hint's task tells the consume loop.
enum TaskEvent {
    /// The claim step of this message is over: its offset may be stored.
    Claimed { partition: i32, offset: i64 },
    /// The task's HTTP request ended (its finalise follows): the Endpoint's slot is free.
    Sent { endpoint: EndpointId },
    /// The claim told the Endpoint's Project, which the queues did not know
    /// (`queues::Start::knows_project`).
    Project { endpoint: EndpointId, project: railhook_core::ProjectId },
    /// The task's Delivery was claimed behind its predecessor: the Endpoint is ordered
    /// (`queues::EndpointQueues::ordered`).
    Ordered { endpoint: EndpointId },
    /// The task ended; `busy` returns its hint to the Endpoint's queue. Otherwise its claim
    /// step is over too (told again here in case `Claimed` did not fit in the channel).
    /// `slot_freed`: `Sent` was told, so the Endpoint's slot is free already.
    Finished { endpoint: EndpointId, place: Option<(i32, i64)>, busy: Option<(queues::Queued, queues::BusyOn)>, released: Option<railhook_core::DeliveryId>, slot_freed: bool },
}

/// The consume loop's state: the Kafka consumer's offsets, the per-Endpoint queues and the
/// running tasks. One task owns it all.
struct Consuming<'a> {
    runner: Arc<Runner>,
    offsets: Offsets<'a>,
    queues: queues::EndpointQueues,
    permits: Arc<Semaphore>,
    events_tx: tokio::sync::mpsc::Sender<TaskEvent>,
    tasks: JoinSet<()>,
    hard_stop: CancellationToken,
    /// `RAILHOOK_FAILPOINT_TASK_PANIC` (crate::failpoint): off unless a test sets it.
    task_panic: Option<Arc<failpoint::TaskPanic>>,
}

impl Consuming<'_> {
    /// A message from Kafka: parsed, then run or queued by its Endpoint (the message key).
    fn message(&mut self, message: &rdkafka::message::BorrowedMessage<'_>) {
        let (partition, offset) = (message.partition(), message.offset());
        let received = tokio::time::Instant::now();
        let stamp = message.headers().map(|h| railhook_kafka::Stamp::from_headers(h.iter().map(|h| (h.key, h.value)))).unwrap_or_default();
        self.offsets.tracker.started(partition, offset);
        // The relay keys every Delivery announcement by its Endpoint: the queue it waits in.
        let mut parsed = consumer::parse_hint(message.key().unwrap_or_default(), message.payload().unwrap_or_default());
        if let (Some((_, hint)), Some(headers)) = (parsed.as_mut(), message.headers()) {
            hint.trace = railhook_kafka::Announcement::trace_from_headers(headers.iter().map(|h| (h.key, h.value)));
        }
        self.hint(partition, offset, received, stamp, parsed);
    }

    /// An announcement from this process's relay (the inline transport): the same as a
    /// message, its place (0, `seq`), its acknowledgement sent when its claim step is over.
    fn inline(&mut self, inline: railhook_kafka::inline::InlineHint, seq: i64) {
        let received = tokio::time::Instant::now();
        self.offsets.acks.taken(seq, inline.ack);
        let parsed = match inline.announcement.target {
            railhook_kafka::Target::Delivery { delivery, endpoint } => {
                Some((endpoint, consumer::Hint { delivery, claim_token: inline.announcement.claim_token, announced_at: None, position: None, trace: inline.announcement.trace }))
            }
            railhook_kafka::Target::Forward { .. } => None,
        };
        self.hint(0, seq, received, inline.stamp, parsed);
    }

    /// A hint at its place: run or queued by its Endpoint.
    fn hint(&mut self, partition: i32, offset: i64, received: tokio::time::Instant, stamp: railhook_kafka::Stamp, parsed: Option<(EndpointId, consumer::Hint)>) {
        if let Some(read_us) = stamp.relay_read_us {
            self.runner.metrics.stages.observe_since_unix_micros(Stage::ReadToPoll, read_us);
        }
        let Some((endpoint, mut hint)) = parsed else {
            self.runner.metrics.bad_messages.inc();
            self.offsets.done(partition, offset);
            return;
        };
        hint.announced_at = stamp.commit_time_us.and_then(chrono::DateTime::from_timestamp_micros);
        hint.position = Some((partition, offset));
        let queued = queues::Queued { hint, place: Some((partition, offset)), received: Some(received) };
        if let Some(start) = self.queues.offer(endpoint, queued, tokio::time::Instant::now()) {
            self.start(start);
        }
        self.runner.metrics.queue_waiting.set(self.queues.waiting() as i64);
    }

    fn event(&mut self, event: TaskEvent) {
        match event {
            TaskEvent::Claimed { partition, offset } => self.offsets.done(partition, offset),
            TaskEvent::Project { endpoint, project } => self.queues.project(endpoint, project),
            TaskEvent::Ordered { endpoint } => {
                if self.queues.ordered(endpoint) {
                    self.pump(endpoint, tokio::time::Instant::now());
                }
            }
            TaskEvent::Sent { endpoint } => {
                let now = tokio::time::Instant::now();
                self.queues.sent(endpoint);
                for endpoint in self.queues.finished(endpoint, None, now) {
                    self.pump(endpoint, now);
                }
            }
            TaskEvent::Finished { endpoint, place, busy, released, slot_freed } => {
                if let (None, Some((partition, offset))) = (&busy, place) {
                    self.offsets.done(partition, offset);
                }
                let now = tokio::time::Instant::now();
                let pump = if slot_freed { vec![endpoint] } else { self.queues.finished(endpoint, busy, now) };
                if let Some(delivery) = released {
                    // The ordered successor this Attempt's finalise released: claimed now,
                    // in the same Endpoint's queue (it has no Kafka offset of its own).
                    let queued = queues::Queued { hint: consumer::Hint { delivery, claim_token: None, announced_at: None, position: None, trace: None }, place: None, received: None };
                    if let Some(start) = self.queues.offer_front(endpoint, queued, now) {
                        if self.permits.available_permits() > 0 {
                            self.start(start);
                        } else {
                            // No permit: the scheduler announces it (it is due now).
                            self.queues.finished(endpoint, None, now);
                        }
                    }
                }
                for endpoint in pump {
                    self.pump(endpoint, now);
                }
            }
        }
    }

    /// Starts what waited for a free permit, in turn, while permits are free.
    fn serve_backlog(&mut self) {
        if self.queues.has_backlog() && self.permits.available_permits() > 0 {
            for start in self.queues.from_backlog(self.permits.available_permits(), tokio::time::Instant::now()) {
                self.start(start);
            }
        }
    }

    /// Starts what `endpoint` may run now, within the free permits.
    fn pump(&mut self, endpoint: EndpointId, now: tokio::time::Instant) {
        for start in self.queues.ready(endpoint, self.permits.available_permits(), now) {
            self.start(start);
        }
        self.runner.metrics.queue_waiting.set(self.queues.waiting() as i64);
    }

    fn start(&mut self, start: queues::Start) {
        let permit = self.permits.clone().try_acquire_owned().expect("a permit is free: the loop reads and starts only with free permits");
        let (events, runner, hard_stop) = (self.events_tx.clone(), self.runner.clone(), self.hard_stop.clone());
        self.tasks.spawn(attempt_task(runner, start, events, permit, hard_stop, self.task_panic.clone()));
    }
}

async fn consume(
    config: &Config, topic: &str, runner: Arc<Runner>, wait: tokio::sync::watch::Sender<(Duration, u32)>, task_panic: Option<Arc<failpoint::TaskPanic>>,
    mut inline: Option<tokio::sync::mpsc::Receiver<railhook_kafka::inline::InlineHint>>, shutdown: CancellationToken,
) -> Result<(), WorkerError> {
    let consumer = match inline {
        None => {
            let consumer = subscribe(config, topic, runner.metrics.consumer_joined.clone())?;
            tracing::info!(topic, group = %config.worker.group_id, "worker consuming");
            Some(consumer)
        }
        Some(_) => {
            tracing::info!("worker taking announcements from this process's relay (transport inline)");
            None
        }
    };
    // The inline channel's sequence numbers (a hint's place), and whether the relay's side
    // closed (the process is stopping).
    let (mut seq, mut inline_open) = (0i64, inline.is_some());
    let max = config.worker.max_in_flight;
    // Each task waits (holding its permit) only to send its last event, `Finished`, while
    // the channel is full; the others go without waiting (`Claimed` and `Sent` are told again
    // by `Finished`, a `Project` by a later claim). The loop never waits on a task, so this
    // bound cannot deadlock.
    let (events_tx, mut events_rx) = tokio::sync::mpsc::channel::<TaskEvent>(3 * max);
    let limits = queues::QueueLimits::from_config(&config.worker);
    runner.metrics.queue_waiting_max.set(limits.waiting_total as i64);
    let mut c = Consuming {
        runner,
        offsets: Offsets { consumer: consumer.as_ref(), topic, tracker: consumer::OffsetTracker::default(), acks: Default::default() },
        queues: queues::EndpointQueues::new(limits),
        permits: Arc::new(Semaphore::new(max)),
        events_tx,
        tasks: JoinSet::new(),
        hard_stop: CancellationToken::new(),
        task_panic,
    };
    let mut measure = tokio::time::interval(PACING_INTERVAL);
    measure.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        // Permits freed since (a task ended): what waited for one goes before new messages.
        c.serve_backlog();
        let wakeup = c.queues.next_wakeup();
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            // Before the task events: under load those are always ready, and the measure
            // would starve behind them.
            _ = measure.tick() => {
                let w = c.queues.measure(tokio::time::Instant::now());
                c.runner.metrics.delivery_wait.set(w.as_secs_f64());
                // The rate rounded up: a queue draining at all is never reported as rate 0.
                wait.send_replace((w, c.queues.drain_per_s().ceil().min(f64::from(u32::MAX)) as u32));
            }
            Some(event) = events_rx.recv() => c.event(event),
            Some(_) = c.tasks.join_next(), if !c.tasks.is_empty() => {}
            _ = tokio::time::sleep_until(wakeup.unwrap_or_else(tokio::time::Instant::now)), if wakeup.is_some() => {
                let now = tokio::time::Instant::now();
                for endpoint in c.queues.woken(now) {
                    c.pump(endpoint, now);
                }
            }
            message = async { consumer.as_ref().expect("guarded").recv().await }, if consumer.is_some() && c.permits.available_permits() > 0 => match message {
                Ok(m) => c.message(&m),
                Err(e) => tracing::warn!(error = %e, "Kafka consumer error"),
            },
            hint = async { inline.as_mut().expect("guarded").recv().await }, if inline_open && c.permits.available_permits() > 0 => match hint {
                Some(h) => {
                    c.inline(h, seq);
                    seq += 1;
                }
                None => inline_open = false,
            },
        }
    }
    // Hints still waiting are dropped: their offsets were never stored, so they are read
    // again after the restart.
    drain(config, &mut c.tasks, &mut events_rx, &mut c.offsets, &c.hard_stop).await;
    drop(c);
    let Some(consumer) = consumer else {
        tracing::info!("worker stopped");
        return Ok(());
    };
    if let Err(e) = consumer.commit_consumer_state(CommitMode::Async) {
        tracing::warn!(error = %e, "final offset commit failed");
    }
    // Closing the consumer blocks until it left the group.
    tokio::task::spawn_blocking(move || drop(consumer)).await.ok();
    tracing::info!("worker stopped");
    Ok(())
}

/// One hint's task: its claim and Attempt, under a permit of `worker.max_in_flight`.
async fn attempt_task(
    runner: Arc<Runner>, start: queues::Start, events: tokio::sync::mpsc::Sender<TaskEvent>, permit: tokio::sync::OwnedSemaphorePermit,
    hard_stop: CancellationToken, task_panic: Option<Arc<failpoint::TaskPanic>>,
) {
    runner.metrics.in_flight.inc();
    let queues::Start { endpoint, queued, mode, past_claim, knows_project } = start;
    let (delivery, place) = (queued.hint.delivery, queued.place);
    // Counted among the Endpoint's slots past their claim from the claim's end to the
    // request's (ingest pacing's signal, `queues::EndpointQueues::measure`); a panic leaves too.
    let past_claim = queues::PastClaim::new(past_claim);
    // Told without waiting, like `Claimed`: if the channel is full, the slot frees with
    // `Finished` instead.
    let slot_freed = std::sync::atomic::AtomicBool::new(false);
    // The Claim's token, known here so that a task that panics can give its Claim back.
    let token = railhook_core::ClaimToken::new();
    // Should this task panic, its permit, gauge, Endpoint slot and Claim are given back on the
    // way out.
    let mut unfinished = Unfinished { endpoint, place: queued.place, slot_freed: &slot_freed, events: events.clone(), permit: Some(permit), runner: runner.clone(), claim: (delivery, token) };
    let claimed_events = events.clone();
    let notify = |project: Option<railhook_core::ProjectId>| {
        past_claim.enter();
        if let (false, Some(project)) = (knows_project, project) {
            // Without waiting: if the channel is full, a later claim tells it.
            let _ = claimed_events.try_send(TaskEvent::Project { endpoint, project });
        }
        // Sent from inside the task, before the HTTP request, without waiting: if the channel
        // is full the offset is stored when the task's `Finished` arrives instead.
        if let Some((partition, offset)) = queued.place {
            let _ = claimed_events.try_send(TaskEvent::Claimed { partition, offset });
        }
        if task_panic.as_ref().is_some_and(|f| f.fires()) {
            panic!("{} fired for Delivery {delivery}", failpoint::TASK_PANIC_ENV);
        }
    };
    let sent_events = events.clone();
    let sent = || {
        past_claim.leave();
        if sent_events.try_send(TaskEvent::Sent { endpoint }).is_ok() {
            slot_freed.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    };
    let ordered_events = events.clone();
    let behind = || {
        let _ = ordered_events.try_send(TaskEvent::Ordered { endpoint });
    };
    let (busy, released) = match runner.run(queued.hint.clone(), token, queued.received, mode, notify, behind, sent, hard_stop).await {
        Ok(runner::Outcome { ran: runner::Ran::Busy(on), .. }) => (Some((queued, on)), None),
        Ok(outcome) => {
            tracing::debug!(%delivery, ran = ?outcome.ran, "announcement handled");
            (None, outcome.released)
        }
        // The hint is dropped; the Delivery stays as it was and the sweeps find it
        // (PROCESSING after 5 min, PENDING after an hour).
        Err(e) => {
            tracing::warn!(error = %error::chain(&e), %delivery, "announcement failed");
            (None, None)
        }
    };
    past_claim.leave();
    runner.metrics.in_flight.dec();
    // The permit goes back before the loop hears of the end, so that the Endpoint's next hint
    // can start at once.
    drop(unfinished.permit.take());
    let slot_freed = slot_freed.load(std::sync::atomic::Ordering::Relaxed);
    let _ = events.send(TaskEvent::Finished { endpoint, place, busy, released, slot_freed }).await;
}

/// The drop guard of an attempt task that did not reach its end (it panicked, or was
/// aborted): gives back its permit and in-flight gauge, tells the consume loop that it
/// finished, which frees its Endpoint's slot and stores its offset, and gives its Claim back
/// to PENDING ([`Runner::give_back`]; a no-op when the claim had not won, or its finalise had
/// committed). Should that release fail, the Delivery is treated as after a failed
/// announcement: the sweeps find it. Disarmed by taking `permit`.
struct Unfinished<'a> {
    endpoint: EndpointId,
    place: Option<(i32, i64)>,
    slot_freed: &'a std::sync::atomic::AtomicBool,
    events: tokio::sync::mpsc::Sender<TaskEvent>,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    runner: Arc<Runner>,
    /// The Delivery and the token its claim was made with.
    claim: (railhook_core::DeliveryId, railhook_core::ClaimToken),
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else { return };
        drop(permit);
        self.runner.metrics.in_flight.dec();
        self.runner.metrics.task_panics.inc();
        tracing::error!(endpoint = %self.endpoint, delivery = %self.claim.0, "an attempt task ended without finishing (panicked); its Endpoint slot and its Claim are given back");
        let slot_freed = self.slot_freed.load(std::sync::atomic::Ordering::Relaxed);
        let event = TaskEvent::Finished { endpoint: self.endpoint, place: self.place, busy: None, released: None, slot_freed };
        // Without waiting (this is a drop): the release, and the event if the channel is full,
        // in a task of their own.
        let full = match self.events.try_send(event) {
            Err(tokio::sync::mpsc::error::TrySendError::Full(event)) => Some(event),
            _ => None,
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (events, runner, (delivery, token)) = (self.events.clone(), self.runner.clone(), self.claim);
            runtime.spawn(async move {
                runner.give_back(delivery, token).await;
                if let Some(event) = full {
                    let _ = events.send(event).await;
                }
            });
        }
    }
}

/// No more messages; Attempts in flight get the grace period, then are cut short (their
/// Claims released, no Attempt spent).
async fn drain(config: &Config, tasks: &mut JoinSet<()>, events: &mut tokio::sync::mpsc::Receiver<TaskEvent>, offsets: &mut Offsets<'_>, hard_stop: &CancellationToken) {
    tracing::info!(in_flight = tasks.len(), "worker stopping: draining Attempts in flight");
    let grace = tokio::time::sleep(Duration::from_millis(config.worker.shutdown_grace_ms));
    tokio::pin!(grace);
    let mut cut = false;
    let record = |event: TaskEvent, offsets: &mut Offsets<'_>| match event {
        TaskEvent::Claimed { partition, offset } | TaskEvent::Finished { place: Some((partition, offset)), busy: None, .. } => offsets.done(partition, offset),
        // A hint given back while stopping stays unclaimed: its offset is not stored. A
        // released successor not claimed now is due: the scheduler announces it.
        TaskEvent::Finished { .. } | TaskEvent::Sent { .. } | TaskEvent::Ordered { .. } | TaskEvent::Project { .. } => {}
    };
    while !tasks.is_empty() {
        tokio::select! {
            Some(event) = events.recv() => record(event, offsets),
            _ = tasks.join_next() => {}
            _ = &mut grace, if !cut => {
                tracing::warn!(in_flight = tasks.len(), "shutdown grace over: releasing the Claims of Attempts still running");
                hard_stop.cancel();
                cut = true;
            }
        }
    }
    while let Ok(event) = events.try_recv() {
        record(event, offsets);
    }
}

/// The connections a starting worker readies for the delivery path at most (`warm_pool`).
const WARM_CONNECTIONS: usize = 8;

/// Opens up to [`WARM_CONNECTIONS`] of the pool's connections at once (held together, so they
/// are distinct) and readies each for the claim and the finalise
/// (`railhook_store::lifecycle::warm`): measured in issue 30, a first burst after a start
/// otherwise paid the connections' set-up and the claim functions' compilation in its first
/// claims. A failure is only logged: the delivery path makes its connections as before.
async fn warm_pool(pool: &railhook_store::Pool, config: &Config) {
    let limits = lifecycle::Limits::from_config(&config.worker);
    let n = config.database.max_connections.clamp(1, WARM_CONNECTIONS);
    let warmed = futures::future::join_all((0..n).map(|_| async {
        let client = pool.get().await.map_err(|e| e.to_string())?;
        lifecycle::warm(&client, &limits).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(client)
    }))
    .await;
    let failed: Vec<String> = warmed.into_iter().filter_map(Result::err).collect();
    if let Some(e) = failed.first() {
        tracing::debug!(error = %e, failed = failed.len(), "warming the worker's connections");
    }
}

/// How often the consume loop measures its delivery wait (the pacing loop reports each).
const PACING_INTERVAL: Duration = Duration::from_millis(50);

/// Reports this worker's delivery wait to the API processes (ingest pacing,
/// `railhook_store::pacing`) as the consume loop measures it (every [`PACING_INTERVAL`])
/// while it is above zero, and once when it falls back to zero, with the rate at which its
/// requests end (`queues::EndpointQueues::drain_per_s`). A failed report is skipped: the next follows.
async fn pacing_loop(pool: railhook_store::Pool, mut wait: tokio::sync::watch::Receiver<(Duration, u32)>, shutdown: CancellationToken) {
    let instance = uuid::Uuid::new_v4().simple().to_string();
    let mut last = Duration::ZERO;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = wait.changed() => if changed.is_err() { return },
        }
        let (now, per_s) = *wait.borrow_and_update();
        if now.is_zero() && last.is_zero() {
            continue;
        }
        let reported = match pool.get().await {
            Ok(client) => railhook_store::pacing::publish(&client, &instance, now, per_s).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match reported {
            Ok(()) => last = now,
            Err(e) => tracing::debug!(error = %e, "pacing report failed"),
        }
    }
}

/// Claims due retries every `worker.scheduler_interval_ms` (at once again while batches come
/// back full) and announces them through the outbox.
async fn scheduler_loop(pool: railhook_store::Pool, config: Arc<Config>, metrics: WorkerMetrics, shutdown: CancellationToken) {
    let every = Duration::from_millis(config.worker.scheduler_interval_ms);
    let reannounce_after_s = config.worker.retry_reannounce_after_seconds as f64;
    loop {
        let mut full = false;
        match pool.get().await {
            Ok(client) => {
                match lifecycle::schedule_due(&**client, SCHEDULE_BATCH, SCHEDULE_PER_ENDPOINT, SCHEDULE_PER_PROJECT, reannounce_after_s).await {
                    Ok(n) => {
                        metrics.scheduled.inc_by(n as u64);
                        full = n as i64 == SCHEDULE_BATCH;
                    }
                    Err(e) => tracing::warn!(error = %e, "retry scheduler failed"),
                }
                // Due Forwards too (crate::forwards).
                full |= forwards::schedule(&client, &config, &metrics).await;
            }
            Err(e) => tracing::warn!(error = %e, "retry scheduler: no connection"),
        }
        if full && !shutdown.is_cancelled() {
            continue;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// The sweeps of 6.4, a singleton across processes (advisory lock), and the queue gauges.
async fn sweep_loop(pool: railhook_store::Pool, config: Arc<Config>, metrics: WorkerMetrics, shutdown: CancellationToken) {
    let w = &config.worker;
    // A quarter of the shortest sweep threshold, between 250 ms and 30 s.
    let every = Duration::from_millis((w.processing_timeout_seconds.min(w.stranded_after_seconds) * 1000 / 4).clamp(250, 30_000));
    let limits = lifecycle::SweepLimits {
        processing_timeout_s: w.processing_timeout_seconds as f64,
        stranded_s: w.stranded_after_seconds as f64,
        outgoing_max_age_s: w.outgoing_max_age_seconds as f64,
        incoming_max_age_s: w.incoming_max_age_seconds as f64,
        batch: SWEEP_BATCH,
    };
    // The server start this loop has seen; a new one means Postgres restarted (see
    // `lifecycle::reannounce_after_restart`). `None`: this process has not looked yet, so the
    // first round looks too (the worker may have restarted with Postgres).
    let mut server_started = None;
    loop {
        match pool.get().await {
            Ok(mut client) => {
                server_started = after_restart(&client, server_started, &metrics).await;
                match lifecycle::sweep(&mut client, &limits).await {
                    Ok(Some(s)) => record_sweep(&metrics, &s),
                    Ok(None) => {}
                    Err(e) => tracing::warn!(error = %e, "sweep failed"),
                }
                match lifecycle::queue_gauges(&**client).await {
                    Ok(g) => {
                        metrics.queue_depth.set(g.due);
                        metrics.oldest_pending_age.set(g.oldest_due_age_s);
                        metrics.ordering_parked.set(g.parked);
                    }
                    Err(e) => tracing::debug!(error = %e, "queue gauges"),
                }
            }
            Err(e) => tracing::warn!(error = %e, "sweeps: no connection"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// Once per Postgres server start: the Deliveries whose claim a crash may have forgotten are
/// announced again at once, instead of at the stranded sweep (docs/RELIABILITY.md, "Claims
/// and the WAL flush"). Returns the start it has dealt with (unchanged when it could not).
async fn after_restart(client: &deadpool_postgres::Object, seen: Option<chrono::DateTime<chrono::Utc>>, metrics: &WorkerMetrics) -> Option<chrono::DateTime<chrono::Utc>> {
    let started = match lifecycle::server_started_at(&***client).await {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!(error = %e, "server start time");
            return seen;
        }
    };
    if seen == Some(started) {
        return seen;
    }
    match lifecycle::restore_claims(&***client).await {
        Ok(0) => {}
        Ok(n) => tracing::warn!(deliveries = n, "PROCESSING Deliveries without a Claim's row in delivery_claims: restored (the stuck sweep reads them)"),
        Err(e) => {
            tracing::warn!(error = %e, "restoring Claims' rows failed; retrying");
            return seen;
        }
    }
    match lifecycle::reannounce_after_restart(&***client, SWEEP_BATCH).await {
        Ok(n) => {
            metrics.swept.with_label_values(&["after_restart"]).inc_by(n);
            if n > 0 {
                tracing::warn!(deliveries = n, server_started = %started, "Postgres restarted: re-announced the PENDING Deliveries last announced before it started (claims a crash may have forgotten)");
            }
            Some(started)
        }
        Err(e) => {
            tracing::warn!(error = %e, "re-announcement after a Postgres restart failed; retrying");
            seen
        }
    }
}

fn record_sweep(metrics: &WorkerMetrics, s: &lifecycle::Swept) {
    metrics.swept.with_label_values(&["processing_timeout"]).inc_by(s.stuck);
    metrics.swept.with_label_values(&["stranded"]).inc_by(s.stranded);
    metrics.swept.with_label_values(&["hard_cap"]).inc_by(s.capped);
    metrics.swept.with_label_values(&["hard_cap_incoming"]).inc_by(s.capped_forwards);
    if s.stuck + s.stranded + s.capped + s.capped_forwards > 0 {
        tracing::info!(stuck = s.stuck, stranded = s.stranded, capped = s.capped, capped_forwards = s.capped_forwards, "sweeps moved Deliveries and Forwards");
    }
}
