//! The fault controller: injects the planned faults in order, one at a time, each once the
//! paced stream reached its point and the fault before it ended, in the middle of an ordered
//! burst and an incoming burst (so every fault hits ordered Deliveries and Forwards in
//! flight). It records what it did and saw of each ([`FaultRecord`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use railhook_testkit::kafka::KafkaBroker;
use railhook_testkit::pg::PgCluster;
use serde_json::json;

use crate::network::{Toxic, Toxiproxy};
use crate::options::Options;
use crate::plan::{FaultKind, PlannedFault};
use crate::receiver::Receiver;
use crate::record::FaultRecord;
use crate::stack::Stack;
use crate::{client, incoming, wait_for};

/// The value of `RAILHOOK_FAILPOINT_TASK_PANIC` for `task_panic`: the probability that an
/// attempt task panics.
pub const TASK_PANIC_PROBABILITY: &str = "0.05";
const TASK_PANIC_FAILPOINT: &str = "RAILHOOK_FAILPOINT_TASK_PANIC";
/// The relay's one log line when it recovered from a lost slot (its beginning; the text of
/// `railhook_relay::stream::SLOT_LOST`).
pub const SLOT_LOST_LINE: &str = "the replication slot was lost and has been recreated";

/// The ordered bursts: before each fault, `types[k]` (a burst per ordered Endpoint, and one
/// of unordered events to a healthy Endpoint, which fills its concurrency) is sent as fast
/// as the API takes it, and the fault is injected once half of it was accepted.
pub struct Bursts {
    pub api: client::Api,
    pub key: String,
    pub run: String,
    pub types: Vec<Vec<String>>,
    /// Event index of the first burst event (after the paced stream's).
    pub first_index: usize,
    pub incoming: IncomingBursts,
}

/// The incoming bursts: before each fault, `size` provider events to the ingress.
pub struct IncomingBursts {
    pub tenancy: Arc<incoming::IncomingTenancy>,
    pub sending: Arc<incoming::IncomingSending>,
    pub size: usize,
    /// Request index of the first burst request (after the stream's).
    pub first_index: usize,
}

/// What the faults act on.
pub struct Targets<'a> {
    pub stack: &'a mut Stack,
    pub pg: &'a mut PgCluster,
    /// None on the inline transport (no broker).
    pub kafka: Option<&'a mut KafkaBroker>,
    pub proxy: Option<&'a Toxiproxy>,
    pub receiver: Arc<tokio::sync::Mutex<Receiver>>,
    /// The superuser's URL of the private cluster's `postgres` database (not proxied).
    pub admin_url: String,
    pub slot_name: String,
    pub http: reqwest::Client,
}

/// Injects `plan` in order; returns the faults and how many burst events were sent, once
/// every burst is accepted.
pub async fn inject(plan: &[PlannedFault], opts: &Options, t: &mut Targets<'_>, sending: &Arc<client::Sending>, client_done: &tokio_util::sync::CancellationToken, bursts: &Bursts) -> (Vec<FaultRecord>, usize) {
    let mut records = Vec::new();
    let mut burst_tasks = Vec::new();
    let mut next_index = bursts.first_index;
    for (fault_no, fault) in plan.iter().enumerate() {
        // Spacing: the fault waits for its point in the send phase (not past the client's end).
        while sending.accepted_count.load(Ordering::SeqCst) < fault.at_accepted && !client_done.is_cancelled() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The bursts, and the fault once half of them is accepted (or after 15 s regardless).
        // A full disk and the panicking worker get theirs while they last instead: what they
        // must show (the ingest's 503s, tasks that panic) needs requests during the fault,
        // also when the paced stream has ended before it.
        let during = matches!(fault.kind, FaultKind::DiskFull | FaultKind::TaskPanic);
        if !during {
            let (tasks, half) = launch_bursts(bursts, opts, sending, fault_no, &mut next_index);
            burst_tasks.extend(tasks);
            let _ = wait_for(Duration::from_secs(15), "half of the ordered and incoming bursts", || half()).await;
        }
        let at_accepted = sending.accepted_count.load(Ordering::SeqCst);
        let link = fault.link.map(|l| l.name()).unwrap_or_default();
        eprintln!("railhook-chaos: {} {link} at {at_accepted} accepted", fault.kind.name());
        let started_at = Utc::now();
        let injected = if fault.kind == FaultKind::DiskFull {
            let launch = async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                launch_bursts(bursts, opts, sending, fault_no, &mut next_index).0
            };
            let (injected, tasks) = tokio::join!(one(fault, opts, t), launch);
            burst_tasks.extend(tasks);
            injected
        } else {
            let injected = one(fault, opts, t).await;
            if during {
                burst_tasks.extend(launch_bursts(bursts, opts, sending, fault_no, &mut next_index).0);
            }
            injected
        };
        let (started_at, detail) = match injected {
            Ok((at, detail)) => (at.unwrap_or(started_at), detail),
            Err(e) => {
                eprintln!("railhook-chaos: {} could not be injected: {e:#}", fault.kind.name());
                (started_at, json!({"error": format!("{e:#}")}))
            }
        };
        records.push(FaultRecord { kind: fault.kind, link: fault.link, started_at, ended_at: Utc::now(), at_accepted, kills_a_worker: fault.kind.kills_a_worker(opts.transport), detail });
    }
    for task in burst_tasks {
        let _ = task.await;
    }
    (records, next_index - bursts.first_index)
}

/// Sends fault `fault_no`'s bursts (events `next_index..`, then provider events); returns
/// their tasks and a test of whether half of each was accepted.
fn launch_bursts(bursts: &Bursts, opts: &Options, sending: &Arc<client::Sending>, fault_no: usize, next_index: &mut usize) -> (Vec<tokio::task::JoinHandle<()>>, impl Fn() -> std::future::Ready<bool>) {
    let mut tasks = Vec::new();
    let progress = Arc::new(AtomicUsize::new(0));
    let mut burst_size = 0;
    for types in &bursts.types {
        let (api, key, run, types, first) = (bursts.api.clone(), bursts.key.clone(), bursts.run.clone(), types.clone(), *next_index);
        *next_index += types.len();
        burst_size += types.len();
        let (sending, progress, concurrency) = (sending.clone(), progress.clone(), opts.concurrency);
        tasks.push(tokio::spawn(async move {
            client::send_burst(&api, &key, &run, first, types, concurrency, Duration::from_secs(900), sending, progress).await;
        }));
    }
    let incoming_progress = Arc::new(AtomicUsize::new(0));
    tasks.push(incoming_burst(bursts, opts, fault_no, incoming_progress.clone()));
    let incoming_size = bursts.incoming.size;
    let half = move || std::future::ready(progress.load(Ordering::SeqCst) * 2 >= burst_size && incoming_progress.load(Ordering::SeqCst) * 2 >= incoming_size);
    (tasks, half)
}

/// One fault, start to end. Returns when it started, if not now (a kill: when the signal
/// went), and what it saw.
async fn one(fault: &PlannedFault, opts: &Options, t: &mut Targets<'_>) -> anyhow::Result<(Option<chrono::DateTime<Utc>>, serde_json::Value)> {
    let none = serde_json::Value::Null;
    Ok(match fault.kind {
        FaultKind::KillApi => (Some(t.stack.apis[0].kill().await), none),
        FaultKind::KillWorker => (Some(t.stack.workers[0].kill().await), none),
        FaultKind::KillAll => {
            // With two, the standby: the streaming one's kill is `relay_standby_takeover`.
            let i = match t.stack.alls.len() {
                0 => anyhow::bail!("kill_all needs the inline transport's `railhook all` processes"),
                1 => 0,
                _ => t.stack.active_relay(&t.http).await.map_or(0, |streaming| (streaming + 1) % t.stack.alls.len()),
            };
            let killed_at = t.stack.alls[i].kill().await;
            let streaming = streaming_relay(t, Duration::from_secs(90)).await;
            let back_ms = streaming.map(|_| (Utc::now() - killed_at).num_milliseconds());
            (Some(killed_at), json!({"killed": t.stack.alls[i].name, "streaming_again_ms": back_ms}))
        }
        FaultKind::KillRelay => {
            let i = t.stack.active_relay(&t.http).await.unwrap_or(0);
            (Some(t.stack.relays[i].kill().await), json!({"killed": t.stack.relays[i].name}))
        }
        FaultKind::RelayStandbyTakeover => return takeover(t).await,
        FaultKind::KafkaRestart => {
            t.kafka.as_mut().ok_or_else(|| anyhow::anyhow!("no Kafka broker on the inline transport"))?.restart().await;
            (None, none)
        }
        FaultKind::PostgresRestart => {
            // A clean stop that does not end within 60 s fails the kind (by_kind); the run
            // then ends the server with `pg_ctl -m immediate` (its shutdown checkpoint is
            // written by then: what it waits for is its walsenders) and goes on.
            let started = Utc::now();
            let stopped = t.pg.try_stop().await;
            if stopped.is_err() {
                t.pg.stop_immediate().await;
            }
            t.pg.start_again().await;
            let down_ms = (Utc::now() - started).num_milliseconds();
            match stopped {
                Ok(()) => (Some(started), json!({"down_ms": down_ms})),
                Err(e) => (Some(started), json!({"down_ms": down_ms, "clean_stop_failed": e})),
            }
        }
        FaultKind::PostgresCrash => {
            let started = Utc::now();
            t.pg.crash().await;
            t.pg.start_again().await;
            (Some(started), json!({"down_ms": (Utc::now() - started).num_milliseconds(), "how": "kill -9 of the postmaster"}))
        }
        FaultKind::ReceiverOutage => {
            t.receiver.lock().await.go_away().await;
            let gone = Utc::now();
            tokio::time::sleep(opts.outage).await;
            t.receiver.lock().await.come_back().await?;
            (Some(gone), none)
        }
        FaultKind::NetLatency | FaultKind::NetBlackhole | FaultKind::NetReset => {
            let proxy = t.proxy.ok_or_else(|| anyhow::anyhow!("no proxy: toxiproxy-server did not start"))?;
            let link = fault.link.ok_or_else(|| anyhow::anyhow!("a network fault without a link"))?;
            let (toxic, lasts) = match fault.kind {
                FaultKind::NetLatency => (Toxic::Latency { ms: 200 }, opts.net_fault),
                FaultKind::NetBlackhole => (Toxic::Blackhole, opts.blackhole),
                _ => (Toxic::Reset, opts.net_fault),
            };
            let started = Utc::now();
            proxy.add(link, toxic).await?;
            tokio::time::sleep(lasts).await;
            proxy.remove(link, toxic).await?;
            (Some(started), json!({"link": link.name(), "toxic": format!("{toxic:?}")}))
        }
        FaultKind::SlotInvalidation => return slot_invalidation(t).await,
        FaultKind::DiskFull => {
            anyhow::ensure!(t.pg.is_on_tmpfs(), "Postgres' data directory is not on a tmpfs (the run is not root)");
            let started = Utc::now();
            t.pg.fill_disk();
            let free = t.pg.disk_free();
            tokio::time::sleep(opts.disk_full).await;
            t.pg.free_disk();
            (Some(started), json!({"free_bytes_while_full": free}))
        }
        FaultKind::ClockSkew => return clock_skew(opts, t).await,
        FaultKind::TaskPanic => {
            // Kafka: the second worker (the first is the kills'). Inline: every `all` process,
            // since only the one streaming from the slot gets tasks, and restarting one hands
            // the slot to the other.
            let chosen: Vec<usize> = if opts.inline() { (0..t.stack.workers.len()).collect() } else { vec![if t.stack.workers.len() > 1 { 1 } else { 0 }] };
            let mut workers = Vec::new();
            for w in chosen {
                let worker = &t.stack.workers[w];
                workers.push(json!([worker.name, worker.log_len()]));
                worker.respawn_with(vec![(TASK_PANIC_FAILPOINT.into(), TASK_PANIC_PROBABILITY.into())]).await;
                // Ready again (its consumer in the group) before its burst is sent.
                ready(t, w, "the panicking worker's /readyz").await;
            }
            if opts.inline() {
                let _ = streaming_relay(t, Duration::from_secs(90)).await;
            }
            (None, json!({"workers": workers, "failpoint": format!("{TASK_PANIC_FAILPOINT}={TASK_PANIC_PROBABILITY}")}))
        }
    })
}

/// Worker `w`'s `/readyz` answers (within a minute; the fault goes on regardless).
async fn ready(t: &Targets<'_>, w: usize, what: &str) {
    let ready = format!("http://127.0.0.1:{}/readyz", t.stack.ports.worker_ops[w]);
    let http = t.http.clone();
    let _ = wait_for(Duration::from_secs(60), what, || {
        let (http, ready) = (http.clone(), ready.clone());
        async move { matches!(http.get(&ready).send().await, Ok(r) if r.status().is_success()) }
    })
    .await;
}

/// Inline: every `railhook all` process restarted with its clock [`crate::stack::CLOCK_AHEAD_MS`]
/// ahead, so that whichever streams from the slot sends (and times the retries of) every
/// Delivery for `opts.clock_skew`; then restarted with the clock right. There is no process
/// that could join beside them and take the work (the slot's one stream decides who gets the
/// announcements), so the skewed process is the run's own.
async fn clock_skew_inline(opts: &Options, t: &mut Targets<'_>) -> anyhow::Result<(Option<chrono::DateTime<Utc>>, serde_json::Value)> {
    let clock = ("RAILHOOK_FAILPOINT_CLOCK_AHEAD_MS".to_string(), crate::stack::CLOCK_AHEAD_MS.to_string());
    let started = Utc::now();
    for w in 0..t.stack.alls.len() {
        t.stack.alls[w].respawn_with(vec![clock.clone()]).await;
        ready(t, w, "the skewed all process's /readyz").await;
    }
    let streaming = streaming_relay(t, Duration::from_secs(90)).await;
    let alone = Utc::now();
    tokio::time::sleep(opts.clock_skew).await;
    for w in 0..t.stack.alls.len() {
        t.stack.alls[w].respawn_without(&[clock.0.as_str()]).await;
        ready(t, w, "the all process's /readyz").await;
    }
    let _ = streaming_relay(t, Duration::from_secs(90)).await;
    Ok((Some(started), json!({"clock_ahead_ms": crate::stack::CLOCK_AHEAD_MS, "alone_s": (Utc::now() - alone).num_seconds(), "streaming": streaming.map(|i| t.stack.alls[i].name)})))
}

/// A worker whose clock runs 30 s ahead (`RAILHOOK_FAILPOINT_CLOCK_AHEAD_MS`) joins; once it is ready, the other workers stop
/// (SIGTERM) so that it takes every partition and sends (and times the retries of) all the
/// Deliveries for `opts.clock_skew`; then they start again and it stops.
async fn clock_skew(opts: &Options, t: &mut Targets<'_>) -> anyhow::Result<(Option<chrono::DateTime<Utc>>, serde_json::Value)> {
    if opts.inline() {
        return clock_skew_inline(opts, t).await;
    }
    t.stack.start_skewed();
    let ready = format!("http://127.0.0.1:{}/readyz", t.stack.ports.skewed_ops);
    let http = t.http.clone();
    wait_for(Duration::from_secs(60), "the skewed worker's /readyz", || {
        let (http, ready) = (http.clone(), ready.clone());
        async move { matches!(http.get(&ready).send().await, Ok(r) if r.status().is_success()) }
    })
    .await?;
    let started = Utc::now();
    for w in &t.stack.workers {
        w.hold().await;
    }
    let alone = Utc::now();
    tokio::time::sleep(opts.clock_skew).await;
    for w in &t.stack.workers {
        w.resume().await;
    }
    for port in t.stack.ports.worker_ops.clone() {
        let ready = format!("http://127.0.0.1:{port}/readyz");
        let _ = wait_for(Duration::from_secs(60), "the workers' /readyz", || {
            let (http, ready) = (http.clone(), ready.clone());
            async move { matches!(http.get(&ready).send().await, Ok(r) if r.status().is_success()) }
        })
        .await;
    }
    t.stack.stop_skewed().await;
    Ok((Some(started), json!({"clock_ahead_ms": crate::stack::CLOCK_AHEAD_MS, "alone_s": (Utc::now() - alone).num_seconds()})))
}

/// Kills the streaming relay; returns once a relay streams again (the standby, or the
/// killed one restarted if it won the slot first).
async fn takeover(t: &mut Targets<'_>) -> anyhow::Result<(Option<chrono::DateTime<Utc>>, serde_json::Value)> {
    let i = streaming_relay(t, Duration::from_secs(30)).await.ok_or_else(|| anyhow::anyhow!("no relay was streaming"))?;
    let killed_at = t.stack.relays[i].kill().await;
    let taken_by = streaming_relay(t, Duration::from_secs(90)).await;
    let takeover_ms = taken_by.map(|_| (Utc::now() - killed_at).num_milliseconds());
    let names = |j: Option<usize>| j.map(|j| t.stack.relays[j].name);
    Ok((Some(killed_at), json!({"killed": names(Some(i)), "taken_over_by": names(taken_by), "takeover_ms": takeover_ms})))
}

/// The relay streaming from the slot, once one does (polled every 50 ms), within `within`.
async fn streaming_relay(t: &Targets<'_>, within: Duration) -> Option<usize> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(i) = t.stack.active_relay(&t.http).await {
            return Some(i);
        }
        if tokio::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Stops the relays, writes WAL past a small `max_slot_wal_keep_size` until the slot is
/// lost, and starts them again; returns once one streams and has said what happened.
async fn slot_invalidation(t: &mut Targets<'_>) -> anyhow::Result<(Option<chrono::DateTime<Utc>>, serde_json::Value)> {
    let started = Utc::now();
    let log_from: Vec<u64> = t.stack.relays.iter().map(|r| r.log_len()).collect();
    for r in &t.stack.relays {
        r.hold().await;
    }
    // Whatever happens, the relays start again.
    let invalidated = invalidate_slot(&t.admin_url, &t.slot_name).await;
    let down_ms = (Utc::now() - started).num_milliseconds();
    for r in &t.stack.relays {
        r.resume().await;
    }
    let status = invalidated?;
    // Until a relay streams and its one line about the lost slot is there.
    let count_lines = |stack: &Stack| -> usize {
        stack.relays.iter().zip(&log_from).map(|(r, from)| r.log_since(*from).lines().filter(|l| l.contains(SLOT_LOST_LINE)).count()).sum()
    };
    let _ = wait_for(Duration::from_secs(90), "the relay's line about the lost slot", || {
        let stack = &*t.stack;
        async move { count_lines(stack) > 0 }
    })
    .await;
    // A second line, had the relay written one, would follow within moments.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lines = count_lines(t.stack);
    let text: Vec<String> = t.stack.relays.iter().zip(&log_from).flat_map(|(r, from)| r.log_since(*from).lines().filter(|l| l.contains(SLOT_LOST_LINE)).map(without_ansi).collect::<Vec<_>>()).collect();
    let lost_total = t.stack.relay_metric(&t.http, "railhook_relay_slot_lost_total").await;
    Ok((
        Some(started),
        json!({
            "wal_status": status,
            "relays_down_ms": down_ms,
            "operator_log_lines": lines,
            "operator_log": text.first(),
            "slot_lost_total": lost_total as u64,
        }),
    ))
}

/// With the relays stopped: `max_slot_wal_keep_size` set to 1 MB, WAL segments switched
/// and checkpoints made until the slot is lost (at most a minute), the setting reset.
/// Returns the slot's last `wal_status`.
async fn invalidate_slot(admin_url: &str, slot_name: &str) -> anyhow::Result<String> {
    let db = railhook_testkit::connect(admin_url).await?;
    // One statement each: ALTER SYSTEM refuses to run in the implicit transaction of a batch.
    db.batch_execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'").await?;
    db.batch_execute("SELECT pg_reload_conf()").await?;
    let mut status = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::time::Instant::now() < deadline {
        // Each switch starts a new 16 MB segment; the checkpoint removes what no slot may
        // keep beyond the limit, and invalidates the slot that needed it.
        for _ in 0..4 {
            db.batch_execute("SELECT pg_logical_emit_message(false, 'railhook.chaos', 'filler')").await?;
            db.batch_execute("SELECT pg_switch_wal()").await?;
        }
        db.batch_execute("CHECKPOINT").await?;
        status = db
            .query_opt("SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", &[&slot_name])
            .await?
            .and_then(|r| r.get::<_, Option<String>>(0))
            .unwrap_or_else(|| "missing".into());
        if status == "lost" {
            break;
        }
    }
    db.batch_execute("ALTER SYSTEM RESET max_slot_wal_keep_size").await?;
    db.batch_execute("SELECT pg_reload_conf()").await?;
    Ok(status)
}

/// A log line without its terminal colour codes.
fn without_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ ... letter
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Fault `fault_no`'s incoming burst, spawned.
fn incoming_burst(bursts: &Bursts, opts: &Options, fault_no: usize, progress: Arc<AtomicUsize>) -> tokio::task::JoinHandle<()> {
    let b = &bursts.incoming;
    let (api, run, tenancy, sending) = (bursts.api.clone(), bursts.run.clone(), b.tenancy.clone(), b.sending.clone());
    let (first, n, concurrency) = (b.first_index + fault_no * b.size, b.size, opts.concurrency);
    tokio::spawn(async move {
        incoming::send_burst(&api, &tenancy, &run, first, n, concurrency, Duration::from_secs(900), &sending, &progress).await;
    })
}
