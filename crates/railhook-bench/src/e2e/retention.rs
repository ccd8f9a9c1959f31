//! The `retention` phase (issue 17: "a retention job running during the e2e benchmark changes
//! its p99 by less than 10 %"), on a clean stack of its own with `retention.interval_seconds`
//! 1 (so a run starts within a second of expired rows appearing) and every other setting at
//! its default (`events_days` 30, `batch_target_ms`, `pause_ms`, `max_busy_percent`,
//! `max_rows_per_second`):
//!
//! - Endpoint L (`bench.retention.live`) gets live Events at a fixed rate
//!   (`--retention-live-rate`, default 200/s, e2e's light rate; 32 connections), latency from
//!   the 201 to the receiver's arrival, as in e2e.
//! - Endpoint H (`bench.retention.history`) only has history: Events created 40 days ago, each
//!   with its SUCCESS Delivery to H and one Attempt (`attempts_default` on a fresh database: no
//!   daily partition is that old), 1 KiB payloads, inserted in bulk with SQL in one
//!   transaction, then `VACUUM (ANALYZE)` so they look like rows a month old, not fresh inserts.
//!   Before all: [`RETAINED_EVENTS`] an hour old (kept by the job), so that the tables are not
//!   small in the off windows.
//! - Alternating windows of [`WINDOW`] in two kinds of pairs. "off": no expired row exists
//!   (awaited in the database after the previous on window: the job deleted every one) and
//!   the job's runs find nothing. "on" comes in two kinds:
//!   - steady (`--retention-steady-pairs`, default 8; **the target's**): history expiring at
//!     the live rate from the window's first moment to its end, as a month of the same traffic
//!     leaves it ([`seed_steady`]: Events created `events_days` less [`STEADY_LEAD`] ago, one
//!     every 1/rate s; the window starts when the first one expires). The job does what it
//!     does day to day: each run (every second here) deletes what expired since the last one.
//!     Each such window records whether the job kept up (deleted at least 90 % of what
//!     expired in it, at most two seconds' worth left at its end). `--retention-control`
//!     shifts that history to expire [`CONTROL_SHIFT`] later, after the window: an A/A run of
//!     the phase's own procedure (seed, VACUUM, CHECKPOINT, settle) in which the job deletes
//!     nothing, whose ratio is the phase's bias.
//!   - catch-up (`--retention-pairs`, default 2): right before it a backlog is seeded and its
//!     first deletion awaited (the worker's `railhook_retention_deleted_rows_total`), sized
//!     from the delete rate measured so far so that the job is still deleting, at its caps,
//!     when the window ends (as after an outage, or a shorter retention period set): the
//!     worst case, reported beside the target. Each such window records whether expired rows
//!     remained at its end and in every sample of the worker's metrics within it (busy
//!     throughout) and how many rows the job deleted in it.
//! - Before every window: the relay caught up past the seed (a short unmeasured burst of live
//!   Events that must arrive: its outbox rows come after the seed's commit in the WAL) and no
//!   autovacuum worker running in the database. Before an off window, after the drain, an
//!   explicit `VACUUM (ANALYZE)` of the deleted rows, so that autovacuum does not do it within
//!   the off window (it did in every off window of one run before this): off has no retention
//!   work at all. Autovacuums that finish within a window are counted in its record; within an
//!   on window they are the job's (it made the dead rows) and stay in its figures. Then, before
//!   both kinds, a CHECKPOINT: the seed's bulk insert and the VACUUM would otherwise set off a
//!   checkpoint whose writes land in the window. Each window records the cluster's WAL
//!   (`pg_stat_wal`: bytes, full-page images) and the checkpoints that finished in it.
//! - Each window also records the relay's `railhook_relay_commit_to_ack_seconds` (an outbox
//!   row's commit to Kafka's acknowledgement): the shares of the window's announcements over
//!   2.5, 5 and 10 ms, the part of the live path the job's WAL goes through, and the CPU of
//!   the slot's walsender (from `/proc` of its pid).
//! - Figures, per kind: off and on samples pooled, p50/p95/p99/max each, p99 on/off (target
//!   < 1.1) and p50 on/off, the per-pair p99s (the noise) and their median, rows deleted per
//!   second in the on windows. `targets.met`: the steady kind's ratio < 1.1 with the job
//!   keeping up in every steady on window, and every live Event delivered.
//!   `--retention-batch-target-ms`, `--retention-pause-ms`, `--retention-max-busy-percent` and
//!   `--retention-max-rows-per-second` try other job settings.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use railhook_config::Config;
use tokio_postgres::Client;

use super::{accepted_deliveries, cpu_delta, cpu_snapshot, ms_between, one_type, plan, wait_arrivals};
use crate::http::{get_text, Receiver};
use crate::load;
use crate::stack::Stack;
use crate::{json, percentiles, Args, Percentiles};

pub const NAME: &str = "retention";
/// One measured window, off or on.
const WINDOW: Duration = Duration::from_secs(15);
/// The unmeasured window during which the first backlog's delete rate is measured.
const CALIBRATION_WINDOW: Duration = Duration::from_secs(5);
const CALIBRATION_EVENTS: i64 = 100_000;
/// Bounds of an on window's backlog (Events; each with one Delivery and one Attempt).
const MIN_SEED: i64 = 60_000;
const MAX_SEED: i64 = 400_000;
/// Backlog = this many times what the job deletes, at the fastest rate seen so far, from the
/// seed's commit to the window's end.
const SEED_MARGIN: f64 = 2.0;
/// Events per INSERT statement of a seed (all of a seed's statements in one transaction).
const SEED_STEP: i64 = 20_000;
/// How old the seeded history is (the default `retention.events_days` is 30).
const HISTORY_DAYS: f64 = 40.0;
/// History the job keeps (an hour old), inserted once at the start: the tables are as large as
/// a month of traffic leaves them in off windows too, not only the live traffic of the run
/// (with small tables, the live traffic's own changes set off autovacuum and autoanalyze in
/// nearly every off window, and in no on window, whose seed made the tables large).
const RETAINED_EVENTS: i64 = 300_000;
const RETAINED_DAYS: f64 = 0.05;
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
const DRAIN_CAP: Duration = Duration::from_secs(900);
const AUTOVACUUM_CAP: Duration = Duration::from_secs(120);
const LIVE_TYPE: &str = "bench.retention.live";
const HISTORY_TYPE: &str = "bench.retention.history";
/// Steady on windows: the first seeded Event expires this long after its seed began (time for
/// the seed, a CHECKPOINT and the settling burst), and Events go on expiring this long after
/// the window.
const STEADY_LEAD: Duration = Duration::from_secs(10);
const STEADY_TAIL: Duration = Duration::from_secs(3);
/// `--retention-control`: how much later than the window's start the steady history expires.
const CONTROL_SHIFT: Duration = Duration::from_secs(30);
/// The target: p99 with the job deleting under 1.1 times the p99 without.
const P99_RATIO_TARGET: f64 = 1.1;

/// The retention job's counters from the worker's /metrics.
#[derive(Debug, Clone, Copy, Default)]
struct JobCounters {
    events: f64,
    deliveries: f64,
    attempts: f64,
    batches: f64,
    batch_seconds: f64,
    batches_within_100ms: f64,
    runs_failed: f64,
}

impl JobCounters {
    async fn read(url: &str) -> anyhow::Result<JobCounters> {
        let text = get_text(url).await?;
        let m: HashMap<&str, f64> = text
            .lines()
            .filter(|l| l.starts_with("railhook_retention_"))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(k, v)| Some((k, v.parse::<f64>().ok()?))))
            .collect();
        let g = |k: &str| m.get(k).copied().unwrap_or(0.0);
        Ok(JobCounters {
            events: g("railhook_retention_deleted_rows_total{table=\"events\"}"),
            deliveries: g("railhook_retention_deleted_rows_total{table=\"deliveries\"}"),
            attempts: g("railhook_retention_deleted_rows_total{table=\"attempts\"}"),
            batches: g("railhook_retention_batch_seconds_count"),
            batch_seconds: g("railhook_retention_batch_seconds_sum"),
            batches_within_100ms: g("railhook_retention_batch_seconds_bucket{le=\"0.1\"}"),
            runs_failed: g("railhook_retention_runs_total{result=\"failed\"}"),
        })
    }

    fn minus(&self, b: &JobCounters) -> JobCounters {
        JobCounters {
            events: self.events - b.events,
            deliveries: self.deliveries - b.deliveries,
            attempts: self.attempts - b.attempts,
            batches: self.batches - b.batches,
            batch_seconds: self.batch_seconds - b.batch_seconds,
            batches_within_100ms: self.batches_within_100ms - b.batches_within_100ms,
            runs_failed: self.runs_failed - b.runs_failed,
        }
    }

    fn rows(&self) -> f64 {
        self.events + self.deliveries + self.attempts
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "events": self.events, "deliveries": self.deliveries, "attempts": self.attempts, "rows": self.rows(),
            "batches": self.batches,
            "mean_batch_ms": if self.batches > 0.0 { (self.batch_seconds / self.batches * 1000.0 * 100.0).round() / 100.0 } else { 0.0 },
            "batches_over_100ms": self.batches - self.batches_within_100ms,
            "runs_failed": self.runs_failed,
        })
    }
}

/// The relay's `railhook_relay_commit_to_ack_seconds` (an outbox row's commit to Kafka's
/// acknowledgement of its announcement): the live Events' time in the walsender, the relay and
/// Kafka, apart from the rest of their way. Cumulative bucket counts by upper bound.
#[derive(Debug, Clone, Default)]
struct RelayLag {
    buckets: Vec<(f64, f64)>,
    count: f64,
}

impl RelayLag {
    async fn read(url: &str) -> anyhow::Result<RelayLag> {
        let text = get_text(url).await?;
        let mut lag = RelayLag::default();
        for l in text.lines() {
            let Some((k, v)) = l.rsplit_once(' ') else { continue };
            let Ok(v) = v.parse::<f64>() else { continue };
            if let Some(le) = k.strip_prefix("railhook_relay_commit_to_ack_seconds_bucket{le=\"").and_then(|r| r.strip_suffix("\"}")) {
                if let Ok(le) = le.parse::<f64>() {
                    lag.buckets.push((le, v));
                }
            } else if k == "railhook_relay_commit_to_ack_seconds_count" {
                lag.count = v;
            }
        }
        Ok(lag)
    }

    fn minus(&self, b: &RelayLag) -> RelayLag {
        let before = |le: f64| b.buckets.iter().find(|(l, _)| *l == le).map(|(_, v)| *v).unwrap_or(0.0);
        RelayLag { buckets: self.buckets.iter().map(|(le, v)| (*le, v - before(*le))).collect(), count: self.count - b.count }
    }

    /// The share of announcements slower than `le` seconds (a bucket bound).
    fn over(&self, le: f64) -> f64 {
        let within = self.buckets.iter().find(|(l, _)| (*l - le).abs() < 1e-9).map(|(_, v)| *v).unwrap_or(self.count);
        if self.count > 0.0 {
            (self.count - within) / self.count
        } else {
            0.0
        }
    }

    /// Several windows' counts added up.
    fn sum<'a>(all: impl Iterator<Item = &'a RelayLag>) -> RelayLag {
        let mut total = RelayLag::default();
        for l in all {
            for (le, v) in &l.buckets {
                match total.buckets.iter_mut().find(|(t, _)| t == le) {
                    Some((_, t)) => *t += v,
                    None => total.buckets.push((*le, *v)),
                }
            }
            total.count += l.count;
        }
        total
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "announcements": self.count,
            "share_over_2_5_ms": self.over(0.0025), "share_over_5_ms": self.over(0.005), "share_over_10_ms": self.over(0.01),
            "share_over_25_ms": self.over(0.025),
        })
    }
}

/// Endpoint H's rows the seeds need.
struct History {
    project: uuid::Uuid,
    endpoint: uuid::Uuid,
    subscription: uuid::Uuid,
}

/// One seeded backlog.
#[derive(Debug, Clone, Copy)]
struct Seed {
    events: i64,
    insert_s: f64,
    vacuum_s: f64,
    /// From the commit to the job's first deletion seen in its metrics.
    job_started_after_s: f64,
    committed: Instant,
}

impl Seed {
    fn json(&self, lead_s: f64) -> serde_json::Value {
        serde_json::json!({
            "events": self.events, "insert_s": self.insert_s, "vacuum_analyze_s": self.vacuum_s,
            "job_started_after_s": self.job_started_after_s, "commit_to_window_s": lead_s,
        })
    }
}

/// One window's record.
struct Window {
    pair: usize,
    on: bool,
    ms: Vec<f64>,
    accepted: usize,
    refused: usize,
    delivered: usize,
    seconds: f64,
    job: JobCounters,
    /// Expired Events left in the database at the end of the load.
    remaining_at_end: i64,
    /// Seconds into the window at which the worker's metrics first showed no expired Event
    /// left (None: never within the window).
    drained_at: Option<f64>,
    samples: usize,
    autovacuums: i64,
    autovacuum_running: bool,
    /// WAL written and checkpoints finished within the window (the whole cluster's).
    wal: Wal,
    /// The relay's commit-to-ack times of the window's announcements.
    relay: RelayLag,
    /// CPU of the relay slot's walsender within the window, in cores.
    walsender_cores: f64,
    cpu: serde_json::Value,
    seed: Option<(Seed, f64)>,
    /// Part of a steady pair (history expiring at the live rate), not a catch-up pair.
    steady: bool,
    /// A steady on window of `--retention-control`: its history expires after it.
    control: bool,
    /// Steady on: the Events seeded to expire in it, and how late the window started after the
    /// first one expired (seconds).
    steady_seed: Option<(i64, f64)>,
    /// Off: the explicit VACUUM (ANALYZE) of the deleted rows before it.
    vacuum_before_s: Option<f64>,
    /// The explicit CHECKPOINT before it (both kinds; the first windows have none).
    checkpoint_before_s: Option<f64>,
}

/// The cluster's WAL and checkpoint counters (`pg_stat_wal`, `pg_stat_bgwriter`).
#[derive(Debug, Clone, Copy, Default)]
struct Wal {
    bytes: f64,
    records: i64,
    fpi: i64,
    checkpoints: i64,
    buffers_checkpoint: i64,
}

impl Wal {
    async fn read(db: &Client) -> anyhow::Result<Wal> {
        let row = db
            .query_one(
                "SELECT w.wal_bytes::float8, w.wal_records, w.wal_fpi, b.checkpoints_timed + b.checkpoints_req, b.buffers_checkpoint
                 FROM pg_stat_wal w, pg_stat_bgwriter b",
                &[],
            )
            .await?;
        Ok(Wal { bytes: row.get(0), records: row.get(1), fpi: row.get(2), checkpoints: row.get(3), buffers_checkpoint: row.get(4) })
    }

    fn minus(&self, b: &Wal) -> Wal {
        Wal {
            bytes: self.bytes - b.bytes,
            records: self.records - b.records,
            fpi: self.fpi - b.fpi,
            checkpoints: self.checkpoints - b.checkpoints,
            buffers_checkpoint: self.buffers_checkpoint - b.buffers_checkpoint,
        }
    }

    fn json(&self, seconds: f64) -> serde_json::Value {
        let s = seconds.max(0.001);
        serde_json::json!({
            "bytes": self.bytes, "mib_per_s": self.bytes / s / 1_048_576.0, "records": self.records, "full_page_images": self.fpi,
            "full_page_images_per_s": self.fpi as f64 / s, "checkpoints_finished": self.checkpoints,
            "buffers_written_by_checkpoints": self.buffers_checkpoint,
        })
    }
}

/// An explicit CHECKPOINT (the role needs `pg_checkpoint`; scripts/infra grants it): the
/// seed's bulk insert (hundreds of MiB of WAL) and the off window's VACUUM would otherwise set
/// off a checkpoint whose writes land in the next window. Returns the seconds it took.
async fn checkpoint(db: &Client) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    db.batch_execute("CHECKPOINT").await.context("CHECKPOINT (the bench's role needs pg_checkpoint)")?;
    Ok(t0.elapsed().as_secs_f64())
}

impl Window {
    fn p(&self) -> Percentiles {
        percentiles(self.ms.clone())
    }

    /// The job was deleting for the whole window.
    fn busy(&self) -> bool {
        self.remaining_at_end > 0 && self.drained_at.is_none() && self.job.events > 0.0
    }

    /// Steady: the job deleted at least 90 % of what expired within the window, and what was
    /// left expired at its end is at most two seconds' worth (the job runs every second).
    fn kept_up(&self, rate: f64) -> bool {
        let expired_in_window = rate * self.seconds;
        self.job.events >= 0.9 * expired_in_window && (self.remaining_at_end as f64) <= 2.0 * rate
    }

    /// Seconds the job had expired rows to delete within the window.
    fn busy_s(&self) -> f64 {
        self.drained_at.unwrap_or(self.seconds).max(0.001)
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "pair": self.pair, "kind": if self.on { "on" } else { "off" },
            "accepted": self.accepted, "refused": self.refused, "delivered": self.delivered, "seconds": self.seconds,
            "latency_201_to_arrival": json(&self.p()),
            "deleted": self.job.json(),
            "events_deleted_per_s": self.job.events / self.busy_s(), "rows_deleted_per_s": self.job.rows() / self.busy_s(),
            "expired_events_at_end": self.remaining_at_end, "drained_at_s": self.drained_at, "metric_samples": self.samples,
            "busy_throughout": self.busy(),
            "autovacuums_finished": self.autovacuums, "autovacuum_running_at_start_or_end": self.autovacuum_running,
            "wal": self.wal.json(self.seconds), "checkpoint_before_s": self.checkpoint_before_s,
            "relay_commit_to_ack": self.relay.json(), "walsender_cores": self.walsender_cores,
            "cpu_cores": self.cpu,
            "seed": self.seed.map(|(s, lead)| s.json(lead)),
            "steady": self.steady, "control": self.control,
            "steady_seed": self.steady_seed.map(|(n, late)| serde_json::json!({"events": n, "window_started_after_first_expiry_s": late})),
            "vacuum_before_s": self.vacuum_before_s,
        })
    }
}

/// Windows pooled.
fn pooled(ws: &[&Window]) -> (Percentiles, serde_json::Value) {
    let ms: Vec<f64> = ws.iter().flat_map(|w| w.ms.iter().copied()).collect();
    let p = percentiles(ms);
    let sum = |f: fn(&Window) -> usize| ws.iter().copied().map(f).sum::<usize>();
    let v = serde_json::json!({
        "windows": ws.len(), "accepted": sum(|w| w.accepted), "refused": sum(|w| w.refused), "delivered": sum(|w| w.delivered),
        "seconds": ws.iter().map(|w| w.seconds).sum::<f64>(), "latency_201_to_arrival": json(&p),
    });
    (p, v)
}

/// Live Events to L at `rate` for `duration`, the worker's retention counters sampled every
/// [`SAMPLE_EVERY`] meanwhile (`seeded`: every Event seeded so far, so that seeded less
/// deleted is what is left). Waits (at most 60 s) for every Delivery to arrive.
async fn window(stack: &mut Stack, db: &Client, rx: &Receiver, rate: f64, duration: Duration, seeded: i64) -> anyhow::Result<Window> {
    let metrics = format!("http://{}/metrics", stack.config.worker.ops_listen);
    let (av0, running0) = autovacuum(db).await?;
    let wal0 = Wal::read(db).await?;
    let relay_metrics = format!("http://{}/metrics", stack.config.relay.ops_listen);
    let relay0 = RelayLag::read(&relay_metrics).await?;
    let walsender: Option<i32> = db
        .query_one("SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", &[&stack.config.relay.slot_name])
        .await?
        .get(0);
    let walsender_cpu = || walsender.and_then(|p| u32::try_from(p).ok()).map(crate::procs::cpu_seconds).unwrap_or(0.0);
    let walsender0 = walsender_cpu();
    let job0 = JobCounters::read(&metrics).await?;
    let cpu0 = cpu_snapshot(stack);
    let p = plan(stack, stack.api_addr, Some(rate), duration, one_type(LIVE_TYPE));
    let t0 = Instant::now();
    let sampler = async {
        let mut samples = Vec::new();
        while t0.elapsed() < duration {
            if let Ok(c) = JobCounters::read(&metrics).await {
                samples.push((t0.elapsed().as_secs_f64(), seeded - c.events as i64));
            }
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
        samples
    };
    let (sent, samples) = tokio::join!(load::run(&p), sampler);
    let sent = sent?;
    let load_end = Instant::now();
    let seconds = t0.elapsed().as_secs_f64();
    let walsender_cores = (walsender_cpu() - walsender0) / seconds.max(0.001);
    let job = JobCounters::read(&metrics).await?.minus(&job0);
    let remaining_at_end = expired(db, stack.config.retention.events_days).await?;
    let (av1, running1) = autovacuum(db).await?;
    let wal = Wal::read(db).await?.minus(&wal0);
    let ids = accepted_deliveries(&sent);
    wait_arrivals(stack, rx, &ids, load_end + Duration::from_secs(60)).await?;
    // After the arrivals: every announcement of the window has been acknowledged.
    let relay = RelayLag::read(&relay_metrics).await?.minus(&relay0);
    let cpu = cpu_delta(stack, &cpu0, seconds);
    let arrivals = rx.arrivals_of(ids.iter().map(|(id, _)| *id));
    let ms: Vec<f64> = ids.iter().zip(arrivals).filter_map(|((_, done), at)| at.map(|at| ms_between(*done, at))).collect();
    Ok(Window {
        pair: 0,
        on: false,
        accepted: ids.len(),
        refused: sent.iter().filter(|s| s.status.as_u16() != 201).count(),
        delivered: ms.len(),
        ms,
        seconds,
        job,
        remaining_at_end,
        drained_at: samples.iter().find(|(_, left)| *left <= 0).map(|(t, _)| *t),
        samples: samples.len(),
        autovacuums: av1 - av0,
        autovacuum_running: running0 || running1,
        wal,
        relay,
        walsender_cores,
        cpu,
        seed: None,
        steady: false,
        control: false,
        steady_seed: None,
        vacuum_before_s: None,
        checkpoint_before_s: None,
    })
}

/// A short unmeasured burst of live Events that must all arrive: the relay has read the WAL
/// past everything committed before it (a seed's large transaction included).
async fn settle(stack: &mut Stack, db: &Client, rx: &Receiver, rate: f64, seeded: i64) -> anyhow::Result<()> {
    let w = window(stack, db, rx, rate, Duration::from_secs(1), seeded).await?;
    if w.delivered < w.accepted {
        bail!("retention: {} of {} settling Events did not arrive within 60 s", w.accepted - w.delivered, w.accepted);
    }
    Ok(())
}

/// Expired Events (older than `events_days`) in the database.
/// (One Project: the bench's; by it, so that the count is a range of
/// `events_project_created_idx`.)
async fn expired(db: &Client, events_days: f64) -> anyhow::Result<i64> {
    Ok(db
        .query_one(
            "SELECT count(*) FROM projects p JOIN LATERAL (
                 SELECT 1 FROM events e WHERE e.project_id = p.id AND e.created_at < now() - $1::float8 * interval '1 day') x ON true",
            &[&events_days],
        )
        .await?
        .get(0))
}

/// Autovacuums and autoanalyzes finished on the tables the job deletes from, and whether an
/// autovacuum worker is running in this database now.
async fn autovacuum(db: &Client) -> anyhow::Result<(i64, bool)> {
    let row = db
        .query_one(
            "SELECT (SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0)::bigint FROM pg_stat_user_tables
                     WHERE relname IN ('events', 'deliveries', 'attempts_default')),
                    EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_type = 'autovacuum worker' AND datname = current_database())",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// Waits until no autovacuum worker runs in this database (at most [`AUTOVACUUM_CAP`]);
/// returns the seconds waited.
async fn await_no_autovacuum(db: &Client) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    while autovacuum(db).await?.1 && t0.elapsed() < AUTOVACUUM_CAP {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// Waits until the job deleted every expired Event; returns the seconds waited.
/// With a `horizon`, also every Event that expires within it (a control run's history, which
/// would otherwise expire in the next window).
async fn await_drained(stack: &mut Stack, db: &Client, horizon: Duration) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    loop {
        let left = expired(db, stack.config.retention.events_days - horizon.as_secs_f64() / 86_400.0).await?;
        if left == 0 {
            return Ok(t0.elapsed().as_secs_f64());
        }
        if t0.elapsed() > DRAIN_CAP {
            bail!("retention: {left} expired Events still there after {} s", DRAIN_CAP.as_secs());
        }
        stack.check_running()?;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Inserts `events` Events created `days_ago`, `spacing_ms` apart from then on, each with its
/// SUCCESS Delivery to H (finished 40 ms after its Event) and one Attempt, in one
/// transaction; returns the seconds it took.
async fn insert_history(db: &mut Client, h: &History, events: i64, days_ago: f64, spacing_ms: f64) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    let tx = db.transaction().await?;
    for from in (0..events).step_by(SEED_STEP as usize) {
        let to = (from + SEED_STEP).min(events);
        tx.execute(
            "WITH ev AS (
                INSERT INTO events (id, project_id, event_type, payload, created_at)
                SELECT railhook_uuid_v7(), $1, $4, jsonb_build_object('n', n, 'note', repeat('x', 960)),
                       now() - $7::float8 * interval '1 day' + n * $8::float8 * interval '1 millisecond'
                FROM generate_series($2::bigint, $3::bigint - 1) n
                RETURNING id, created_at
            ), d AS (
                INSERT INTO deliveries (id, project_id, event_id, endpoint_id, subscription_id, status, attempt_count,
                                        max_attempts, retry_delays, timeout_seconds, created_at, updated_at, completed_at,
                                        ladder_started_at, last_announced_at)
                SELECT railhook_uuid_v7(), $1, ev.id, $5, $6, 'SUCCESS', 1, 7, '{60,300,900,3600,21600,86400}', 30,
                       ev.created_at, ev.created_at + interval '40 ms', ev.created_at + interval '40 ms', ev.created_at, ev.created_at
                FROM ev
                RETURNING id, created_at
            )
            INSERT INTO attempts (id, project_id, delivery_id, attempt_number, started_at, duration_ms, status_code, result,
                                  request_headers, response_headers, response_body)
            SELECT railhook_uuid_v7(), $1, d.id, 1, d.created_at + interval '5 ms', 30, 200, 'success',
                   '{\"content-type\": \"application/json\", \"user-agent\": \"railhook\", \"webhook-id\": \"x\", \"webhook-signature\": \"v1,x\"}'::jsonb,
                   '{\"content-type\": \"text/plain\", \"content-length\": \"2\"}'::jsonb, 'ok'
            FROM d",
            &[&h.project, &from, &to, &HISTORY_TYPE, &h.endpoint, &h.subscription, &days_ago, &spacing_ms],
        )
        .await
        .context("seeding history")?;
    }
    tx.commit().await?;
    Ok(t0.elapsed().as_secs_f64())
}

/// Seeds `events` expired Events ([`insert_history`], [`HISTORY_DAYS`] old); VACUUM (ANALYZE)
/// after; then waits for the job's first deletion.
async fn seed(stack: &mut Stack, db: &mut Client, h: &History, events: i64) -> anyhow::Result<Seed> {
    let metrics = format!("http://{}/metrics", stack.config.worker.ops_listen);
    let before = JobCounters::read(&metrics).await?.events;
    let insert_s = insert_history(db, h, events, HISTORY_DAYS, 1.0).await?;
    let committed = Instant::now();
    db.batch_execute("VACUUM (ANALYZE) events, deliveries, attempts_default").await?;
    let vacuum_s = committed.elapsed().as_secs_f64();
    loop {
        if JobCounters::read(&metrics).await?.events > before {
            break;
        }
        if committed.elapsed() > Duration::from_secs(60) {
            bail!("retention: the job deleted nothing within 60 s of the seed (retention.interval_seconds 1)");
        }
        stack.check_running()?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(Seed { events, insert_s, vacuum_s, job_started_after_s: committed.elapsed().as_secs_f64(), committed })
}

/// History for a steady on window: Events that expire one after another at `rate` per second
/// (as the live traffic of `events_days` ago would), the first [`STEADY_LEAD`] after the
/// seed's transaction began, the last [`STEADY_TAIL`] after the window's end if it starts
/// then; `VACUUM (ANALYZE)` after, as before an off window. Returns the moment the window
/// starts (when the first one expires) and the count. With `control` (an A/A check of the
/// phase itself) the same Events expire [`CONTROL_SHIFT`] later, after the window: the job
/// deletes nothing within it.
async fn seed_steady(db: &mut Client, h: &History, events_days: f64, rate: f64, control: bool) -> anyhow::Result<(Instant, i64)> {
    let events = (rate * (WINDOW + STEADY_TAIL).as_secs_f64()).ceil() as i64;
    // Read before the transaction begins, so the first expiry is at or after it.
    let began = Instant::now();
    let shift = if control { CONTROL_SHIFT } else { Duration::ZERO };
    let days_ago = events_days - (STEADY_LEAD + shift).as_secs_f64() / 86_400.0;
    insert_history(db, h, events, days_ago, 1000.0 / rate).await?;
    db.batch_execute("VACUUM (ANALYZE) events, deliveries, attempts_default").await?;
    // The Delivery finished 40 ms after its Event: the Event may go once both are past.
    Ok((began + STEADY_LEAD + Duration::from_millis(40), events))
}

/// The next backlog: the job's fastest rate so far times the time from commit to the window's
/// end, with the margin, in tens of thousands.
fn seed_size(rate: f64, lead_s: f64) -> i64 {
    let n = SEED_MARGIN * rate * (lead_s + WINDOW.as_secs_f64());
    (((n / 10_000.0).ceil() as i64) * 10_000).clamp(MIN_SEED, MAX_SEED)
}

pub async fn run(args: &Args) -> anyhow::Result<serde_json::Value> {
    let (rx, rx_addr) = Receiver::start().await?;
    let (target_ms, pause_ms) = (args.retention_batch_target_ms, args.retention_pause_ms);
    let (busy_percent, rows_per_second) = (args.retention_max_busy_percent, args.retention_max_rows_per_second);
    let tune = move |c: &mut Config| {
        c.retention.interval_seconds = 1.0;
        if let Some(b) = busy_percent {
            c.retention.max_busy_percent = b;
        }
        if let Some(r) = rows_per_second {
            c.retention.max_rows_per_second = r;
        }
        if let Some(t) = target_ms {
            c.retention.batch_target_ms = t;
        }
        if let Some(p) = pause_ms {
            c.retention.pause_ms = p;
        }
    };
    let mut stack = Stack::start(&args.bin()?, NAME, true, tune).await?;
    let rc = stack.config.retention.clone();
    stack.endpoint(&format!("http://{rx_addr}/retention/l"), LIVE_TYPE).await?;
    let h = stack.endpoint(&format!("http://{rx_addr}/retention/h"), HISTORY_TYPE).await?;
    let h: railhook_core::EndpointId = h.parse().map_err(|e| anyhow::anyhow!("endpoint id {h}: {e}"))?;
    let mut db = stack.db.client().await;
    let row = db.query_one("SELECT project_id, (SELECT id FROM subscriptions WHERE endpoint_id = $1 LIMIT 1) FROM endpoints WHERE id = $1", &[&h.0]).await?;
    let history = History { project: row.get(0), endpoint: h.0, subscription: row.get(1) };
    let rate = args.retention_live_rate;
    let (steady_pairs, backlog_pairs) = (args.retention_steady_pairs, args.retention_pairs);
    if steady_pairs + backlog_pairs == 0 {
        bail!("retention: --retention-steady-pairs and --retention-pairs are both 0");
    }
    let mut seeded = 0i64;
    let retained_s = insert_history(&mut db, &history, RETAINED_EVENTS, RETAINED_DAYS, 1.0).await?;
    db.batch_execute("VACUUM (ANALYZE) events, deliveries, attempts").await?;
    println!("retention: {RETAINED_EVENTS} Events of history the job keeps ({RETAINED_DAYS} days old) inserted in {retained_s:.1} s");

    // Warm-up, then the calibration: a first backlog, its delete rate under the live load.
    window(&mut stack, &db, &rx, rate, Duration::from_secs(3), seeded).await?;
    let cal_seed = seed(&mut stack, &mut db, &history, CALIBRATION_EVENTS).await?;
    seeded += cal_seed.events;
    let partition: String = db
        .query_one("SELECT coalesce(min(tableoid::regclass::text), '') FROM attempts WHERE started_at < now() - interval '35 days'", &[])
        .await?
        .get(0);
    settle(&mut stack, &db, &rx, rate, seeded).await?;
    let cal_lead = cal_seed.committed.elapsed().as_secs_f64();
    let mut cal = window(&mut stack, &db, &rx, rate, CALIBRATION_WINDOW, seeded).await?;
    cal.on = true;
    let mut delete_rate = cal.job.events / cal.busy_s();
    let mut lead_s = cal_lead;
    println!(
        "retention: calibration: {} expired Events (Attempts in {partition}) seeded in {:.1} s; the job deleted {:.0} Events/s ({:.0} rows/s) under the live load",
        cal_seed.events, cal_seed.insert_s, delete_rate, cal.job.rows() / cal.busy_s()
    );

    let mut windows: Vec<Window> = Vec::new();
    for pair in 1..=steady_pairs + backlog_pairs {
        let steady = pair <= steady_pairs;
        // off: nothing expired.
        let horizon = if args.retention_control { CONTROL_SHIFT + STEADY_LEAD + WINDOW + STEADY_TAIL } else { Duration::ZERO };
        let drain_s = await_drained(&mut stack, &db, horizon).await?;
        let av_s = await_no_autovacuum(&db).await?;
        // The vacuum of what the job deleted, now rather than by autovacuum within the off
        // window (whose launcher comes when it comes): off has no retention work at all.
        let vacuum_t0 = Instant::now();
        db.batch_execute("VACUUM (ANALYZE) events, deliveries, attempts_default").await?;
        let vacuum_s = vacuum_t0.elapsed().as_secs_f64();
        let off_checkpoint_s = checkpoint(&db).await?;
        settle(&mut stack, &db, &rx, rate, seeded).await?;
        let mut off = window(&mut stack, &db, &rx, rate, WINDOW, seeded).await?;
        (off.pair, off.steady) = (pair, steady);
        off.vacuum_before_s = Some(vacuum_s);
        off.checkpoint_before_s = Some(off_checkpoint_s);
        let av_on_s = await_no_autovacuum(&db).await?;
        let mut on = if steady {
            // on: history expiring at the live rate all window long, as a month of this
            // traffic leaves it: the job deletes each second what expired since its last run.
            let (first_expiry, n) = seed_steady(&mut db, &history, rc.events_days, rate, args.retention_control).await?;
            seeded += n;
            let on_checkpoint_s = checkpoint(&db).await?;
            settle(&mut stack, &db, &rx, rate, seeded).await?;
            // The window starts when the first seeded Event expires: a moment of the clock,
            // so a sleep, not a condition to await.
            let late = match first_expiry.checked_duration_since(Instant::now()) {
                Some(wait) => {
                    tokio::time::sleep(wait).await;
                    0.0
                }
                None => first_expiry.elapsed().as_secs_f64(),
            };
            let mut on = window(&mut stack, &db, &rx, rate, WINDOW, seeded).await?;
            on.checkpoint_before_s = Some(on_checkpoint_s);
            on.steady_seed = Some((n, late));
            on.control = args.retention_control;
            on
        } else {
            // on: a fresh backlog the job is deleting all window long.
            let s = seed(&mut stack, &mut db, &history, seed_size(delete_rate, lead_s)).await?;
            seeded += s.events;
            let on_checkpoint_s = checkpoint(&db).await?;
            settle(&mut stack, &db, &rx, rate, seeded).await?;
            lead_s = s.committed.elapsed().as_secs_f64();
            let mut on = window(&mut stack, &db, &rx, rate, WINDOW, seeded).await?;
            on.seed = Some((s, lead_s));
            on.checkpoint_before_s = Some(on_checkpoint_s);
            delete_rate = delete_rate.max(on.job.events / on.busy_s());
            on
        };
        (on.pair, on.on, on.steady) = (pair, true, steady);
        let (po, pn) = (off.p(), on.p());
        let seeded_note = match (&on.seed, on.steady_seed) {
            (Some((s, _)), _) => format!("a backlog of {} Events seeded ({:.1} s + vacuum {:.1} s)", s.events, s.insert_s, s.vacuum_s),
            (None, Some((n, late))) => format!("{n} Events expiring at {rate:.0}/s from the window's start (started {late:.2} s after the first expiry)"),
            (None, None) => String::new(),
        };
        let state = if on.control {
            if on.job.events == 0.0 { "control: nothing expired in it".to_string() } else { "  <- control, yet the job deleted".to_string() }
        } else if steady {
            if on.kept_up(rate) { "kept up".to_string() } else { "  <- did NOT keep up".to_string() }
        } else if on.busy() {
            "busy throughout".to_string()
        } else {
            "  <- NOT busy throughout".to_string()
        };
        println!(
            "retention: pair {pair} ({}): off p99 {:.1} ms (drained in {drain_s:.1} s, autovacuum wait {av_s:.1} s, vacuum {vacuum_s:.1} s), on p99 {:.1} ms, ratio {:.2}; on: {seeded_note}, autovacuum wait {av_on_s:.1} s; the job deleted {:.0} Events, {:.0} rows ({:.0}/s), {} expired left at the end, {state}; autovacuums off {} on {}",
            if steady { "steady" } else { "catch-up" },
            po.p99, pn.p99, pn.p99 / po.p99.max(0.001), on.job.events, on.job.rows(), on.job.rows() / on.busy_s(),
            on.remaining_at_end, off.autovacuums, on.autovacuums
        );
        println!(
            "retention: pair {pair}: WAL off {:.2} MiB/s ({:.0} full-page images/s, {} checkpoints finished), on {:.2} MiB/s ({:.0} full-page images/s, {} checkpoints finished)",
            off.wal.bytes / off.seconds / 1_048_576.0, off.wal.fpi as f64 / off.seconds, off.wal.checkpoints,
            on.wal.bytes / on.seconds / 1_048_576.0, on.wal.fpi as f64 / on.seconds, on.wal.checkpoints
        );
        println!(
            "retention: pair {pair}: the relay's commit to Kafka's ack: over 2.5 ms {:.2} % off, {:.2} % on; over 5 ms {:.2} % off, {:.2} % on; over 10 ms {:.2} % off, {:.2} % on; the walsender's CPU {:.3} cores off, {:.3} on",
            off.relay.over(0.0025) * 100.0, on.relay.over(0.0025) * 100.0, off.relay.over(0.005) * 100.0, on.relay.over(0.005) * 100.0,
            off.relay.over(0.01) * 100.0, on.relay.over(0.01) * 100.0, off.walsender_cores, on.walsender_cores
        );
        windows.push(off);
        windows.push(on);
        stack.check_running()?;
    }
    stack.check_running()?;
    stack.stop().await;

    println!();
    println!(
        "retention: live e2e to Endpoint L at {rate:.0} events/s, pairs of {} s windows, off (nothing expired) and on; retention.batch_target_ms {}, pause_ms {}, max_busy_percent {}, max_rows_per_second {}, interval_seconds {}",
        WINDOW.as_secs(), rc.batch_target_ms, rc.pause_ms, rc.max_busy_percent, rc.max_rows_per_second, rc.interval_seconds
    );
    let all_delivered = windows.iter().all(|w| w.delivered == w.accepted && w.refused == 0);
    let steady = (steady_pairs > 0).then(|| Kind::Steady.figures(&windows, rate));
    let catch_up = (backlog_pairs > 0).then(|| Kind::CatchUp.figures(&windows, rate));
    println!("live Events all delivered: {all_delivered}");
    println!();
    // The target is the steady state's: the job running as it does day to day, deleting what
    // expires; the catch-up (a backlog deleted at the job's caps) is reported beside it.
    let (met, headline) = match &steady {
        // A control run measures the phase, not the job: never "met".
        Some(f) => (f.met && all_delivered && !args.retention_control, f.json.clone()),
        None => (false, serde_json::Value::Null),
    };
    Ok(serde_json::json!({
        "name": NAME,
        "live_rate_per_s": rate,
        "window_s": WINDOW.as_secs(),
        "pairs": {"steady": steady_pairs, "catch_up": backlog_pairs},
        "retention_config": {
            "interval_seconds": rc.interval_seconds, "events_days": rc.events_days, "attempts_days": rc.attempts_days, "batch_rows": rc.batch_rows,
            "batch_target_ms": rc.batch_target_ms, "pause_ms": rc.pause_ms, "max_busy_percent": rc.max_busy_percent,
            "max_rows_per_second": rc.max_rows_per_second,
        },
        "figures": {
            "history_days": HISTORY_DAYS,
            "retained_events": RETAINED_EVENTS,
            "attempts_partition": partition,
            "calibration": {"seed": cal_seed.json(cal_lead), "window": cal.json()},
            "windows": windows.iter().map(Window::json).collect::<Vec<_>>(),
        },
        "steady": headline,
        "catch_up": catch_up.map(|f| f.json),
        "targets": {
            "p99_on_over_off_under": P99_RATIO_TARGET, "of": "steady", "control": args.retention_control, "all_delivered": all_delivered, "met": met,
        },
    }))
}

/// The two kinds of on window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// History expiring at the live rate: the job deletes what expired since its last run.
    Steady,
    /// A backlog the job deletes at its caps all window long.
    CatchUp,
}

/// One kind's figures: its pairs pooled and one by one.
struct KindFigures {
    met: bool,
    json: serde_json::Value,
}

impl Kind {
    fn figures(self, windows: &[Window], rate: f64) -> KindFigures {
        let steady = self == Kind::Steady;
        let name = if steady { "steady" } else { "catch-up" };
        let offs: Vec<&Window> = windows.iter().filter(|w| !w.on && w.steady == steady).collect();
        let ons: Vec<&Window> = windows.iter().filter(|w| w.on && w.steady == steady).collect();
        let ((o, off_json), (n, on_json)) = (pooled(&offs), pooled(&ons));
        let p99_ratio = n.p99 / o.p99.max(0.001);
        let p50_ratio = n.p50 / o.p50.max(0.001);
        // Steady: the job kept up with what expired; catch-up: it was deleting all window long.
        // (A control window works when the job deleted nothing in it.)
        let working = ons.iter().filter(|w| if w.control { w.job.events == 0.0 } else if steady { w.kept_up(rate) } else { w.busy() }).count();
        let on_s: f64 = ons.iter().map(|w| w.seconds).sum();
        let deleted = ons.iter().fold(JobCounters::default(), |a, w| JobCounters {
            events: a.events + w.job.events,
            deliveries: a.deliveries + w.job.deliveries,
            attempts: a.attempts + w.job.attempts,
            batches: a.batches + w.job.batches,
            batch_seconds: a.batch_seconds + w.job.batch_seconds,
            batches_within_100ms: a.batches_within_100ms + w.job.batches_within_100ms,
            runs_failed: a.runs_failed + w.job.runs_failed,
        });
        let off_deleted: f64 = offs.iter().map(|w| w.job.rows()).sum();
        let (relay_off, relay_on) = (RelayLag::sum(offs.iter().map(|w| &w.relay)), RelayLag::sum(ons.iter().map(|w| &w.relay)));
        let met = p99_ratio < P99_RATIO_TARGET && working == ons.len() && !ons.is_empty();
        let per_pair: Vec<serde_json::Value> = offs
            .iter()
            .zip(&ons)
            .map(|(f, n)| serde_json::json!({"pair": f.pair, "off_p99_ms": f.p().p99, "on_p99_ms": n.p().p99, "ratio": n.p().p99 / f.p().p99.max(0.001)}))
            .collect();
        // The median of the pairs' ratios: one noisy window (the shared machine) moves the
        // pooled p99 but not this.
        let mut ratios: Vec<f64> = per_pair.iter().filter_map(|v| v["ratio"].as_f64()).collect();
        ratios.sort_by(|a, b| a.total_cmp(b));
        let median_ratio = match ratios.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => ratios[n / 2],
            n => (ratios[n / 2 - 1] + ratios[n / 2]) / 2.0,
        };
        println!("{name}:");
        println!("{:<6} {:>10} {:>10} {:>7}", "pair", "off p99", "on p99", "ratio");
        for v in &per_pair {
            println!(
                "{:<6} {:>10.2} {:>10.2} {:>7.2}",
                v["pair"], v["off_p99_ms"].as_f64().unwrap_or(f64::NAN), v["on_p99_ms"].as_f64().unwrap_or(f64::NAN), v["ratio"].as_f64().unwrap_or(f64::NAN)
            );
        }
        println!("{:<10} {:>8} {:>8} {:>8} {:>8} {:>8}", "", "samples", "p50", "p95", "p99", "max");
        println!("{:<10} {:>8} {:>8.2} {:>8.2} {:>8.2} {:>8.1}", "off", o.count, o.p50, o.p95, o.p99, o.max);
        println!("{:<10} {:>8} {:>8.2} {:>8.2} {:>8.2} {:>8.1}", "on", n.count, n.p50, n.p95, n.p99, n.max);
        println!(
            "{name}: p99 on/off = {p99_ratio:.2} (target < {P99_RATIO_TARGET}: {}), p50 {p50_ratio:.2}, median of the pairs' p99 ratios {median_ratio:.2}; on windows {}: {working} of {}; the job deleted {:.0} rows/s in the on windows ({:.0} Events/s, {} batches, mean {:.1} ms, {} over 100 ms); rows deleted in off windows: {off_deleted:.0}",
            if met { "met" } else { "MISSED" },
            if steady { "in which the job kept up" } else { "busy throughout" },
            ons.len(),
            deleted.rows() / on_s.max(0.001),
            deleted.events / on_s.max(0.001),
            deleted.batches,
            if deleted.batches > 0.0 { deleted.batch_seconds / deleted.batches * 1000.0 } else { 0.0 },
            deleted.batches - deleted.batches_within_100ms
        );
        println!(
            "{name}: the relay's commit to Kafka's ack, pooled: over 2.5 ms {:.2} % off, {:.2} % on; over 5 ms {:.2} % off, {:.2} % on; over 10 ms {:.2} % off, {:.2} % on",
            relay_off.over(0.0025) * 100.0, relay_on.over(0.0025) * 100.0, relay_off.over(0.005) * 100.0, relay_on.over(0.005) * 100.0,
            relay_off.over(0.01) * 100.0, relay_on.over(0.01) * 100.0
        );
        println!();
        KindFigures {
            met,
            json: serde_json::json!({
                "off": off_json,
                "on": on_json,
                "ratio": {"p99_on_over_off": p99_ratio, "p50_on_over_off": p50_ratio, "per_pair": per_pair, "per_pair_p99_median": median_ratio},
                "on_windows_working": working,
                "deleted_in_on_windows": deleted.json(),
                "rows_deleted_per_s": deleted.rows() / on_s.max(0.001),
                "events_deleted_per_s": deleted.events / on_s.max(0.001),
                "rows_deleted_in_off_windows": off_deleted,
                "relay_commit_to_ack": {"off": relay_off.json(), "on": relay_on.json()},
                "met": met,
            }),
        }
    }
}
