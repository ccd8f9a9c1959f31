//! The relay (`/ui/relay`, operator only): the replication slot as `railhook slot status`
//! reads it (`railhook_relay::health::slot_health`, one query on `pg_replication_slots`),
//! the server's walsenders (the relay's stream and any physical standby), and the slot's lag
//! and retained WAL over the last hour, drawn as an inline SVG on the server (no script).
//!
//! The history is a bounded ring in this process ([`History`]): a sample every
//! [`SAMPLE_EVERY`], [`CAPACITY`] of them (one hour). It starts with the process, so after a
//! restart the chart starts empty; the relay's Prometheus gauges are the durable record.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use axum::extract::State;
use axum::response::Html;
use chrono::{DateTime, Utc};
use maud::{html, Markup};
use railhook_relay::health::{slot_health, SlotHealth};
use railhook_store::Pool;

use crate::error::{UiError, UiResult};
use crate::page;
use crate::query::{self, Walsender};
use crate::viewer::{Role, Viewer};
use crate::UiState;

pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// One hour of samples.
pub const CAPACITY: usize = 720;

#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub at: DateTime<Utc>,
    pub lag_bytes: Option<i64>,
    pub retained_bytes: Option<i64>,
}

/// The last hour of slot samples, oldest first; bounded to [`CAPACITY`].
#[derive(Default)]
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    pub fn push(&self, s: Sample) {
        let mut q = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() == CAPACITY {
            q.pop_front();
        }
        q.push_back(s);
    }

    pub fn snapshot(&self) -> Vec<Sample> {
        self.samples.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().collect()
    }
}

/// Samples the slot into `history` every [`SAMPLE_EVERY`] while the dashboard's state lives
/// (the task holds only a weak reference and ends when the router is dropped).
pub fn spawn_sampler(pool: Pool, slot: String, history: &Arc<History>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak: Weak<History> = Arc::downgrade(history);
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(history) = weak.upgrade() else { return };
            match sample(&pool, &slot).await {
                Ok(h) => history.push(Sample { at: Utc::now(), lag_bytes: h.lag_bytes, retained_bytes: h.retained_bytes }),
                Err(e) => tracing::debug!(error = %e, "ui: slot sample failed"),
            }
        }
    });
}

async fn sample(pool: &Pool, slot: &str) -> Result<SlotHealth, String> {
    let client = pool.get().await.map_err(|e| e.to_string())?;
    slot_health(&client, slot).await.map_err(|e| e.to_string())
}

/// `GET /ui/relay`
pub async fn page(viewer: Viewer, State(state): State<UiState>) -> UiResult<Html<String>> {
    if viewer.role != Role::Operator {
        return Err(UiError::forbidden("Only the operator sees the relay; a project key shows its own project."));
    }
    let client = state.pool.get().await?;
    let health = slot_health(&client, &state.config.relay.slot_name).await?;
    let walsenders = query::walsenders(&**client).await?;
    let samples = state.relay.snapshot();
    let body = html! {
        h1 { "Relay" }
        p.hint { "The replication slot the CDC relay reads the outbox from, as " code { "railhook slot status" } " shows it. Reloading the page reads it again." }
        (slot_facts(&health))
        h2 { "Lag, up to the last hour" }
        (chart(&samples, Utc::now()))
        h2 { "Walsenders" }
        (walsender_table(&walsenders, health.active_pid))
    };
    Ok(page::frame(&viewer, "/ui/relay", "Relay", body))
}

/// Bytes for people: B, KiB, MiB, GiB.
pub fn bytes(n: i64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v.abs() >= 1024.0 && u < units.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{n} B") } else { format!("{v:.1} {}", units[u]) }
}

fn opt_bytes(n: Option<i64>) -> Markup {
    html! { @match n { Some(n) => { (bytes(n)) " " span.hint { "(" (n) ")" } } None => { span.muted { "—" } } } }
}

fn wal_status(s: &str) -> Markup {
    let class = match s {
        "reserved" => "ok",
        "extended" => "wait",
        _ => "bad",
    };
    html! { span class={ "badge " (class) } { (s) } }
}

fn slot_facts(h: &SlotHealth) -> Markup {
    html! {
        dl.facts {
            dt { "Slot" } dd { code { (h.slot) } @if let Some(db) = &h.database { " on " code { (db) } } }
            dt { "Exists" } dd { @if h.exists { "yes" } @else { span.badge.bad { "no: the relay creates it when it starts" } } }
            dt { "Active" } dd {
                @if h.active { span.badge.ok { "active" } @if let Some(pid) = h.active_pid { " · walsender PID " (pid) } }
                @else { span.badge.bad { "inactive" } " · no relay streams from it" }
            }
            dt { "wal_status" } dd { (wal_status(&h.wal_status)) }
            dt { "confirmed_flush_lsn" } dd { code { (h.confirmed_flush_lsn.as_deref().unwrap_or("—")) } }
            dt { "Current WAL LSN" } dd { code #current-lsn { (h.current_wal_lsn) } }
            dt { "Lag" } dd #lag-bytes data-bytes=[h.lag_bytes] { (opt_bytes(h.lag_bytes)) }
            dt { "Retained WAL" } dd { (opt_bytes(h.retained_bytes)) }
            dt { "safe_wal_size" } dd {
                @if h.max_slot_wal_keep_size_bytes < 0 { "unlimited (max_slot_wal_keep_size = -1)" } @else { (opt_bytes(h.safe_wal_size_bytes)) }
            }
            dt { "Last feedback" } dd { @match h.last_feedback_age_seconds { Some(s) => { (format!("{s:.1}")) " s ago" } None => { span.muted { "no walsender attached" } } } }
        }
    }
}

fn walsender_table(rows: &[Walsender], slot_pid: Option<i32>) -> Markup {
    html! {
        @if rows.is_empty() { p { "No walsender: neither a relay nor a standby server is connected." } }
        @else {
            table {
                caption { "Walsenders (pg_stat_replication)" }
                thead { tr { th scope="col" { "PID" } th scope="col" { "Role" } th scope="col" { "Application" } th scope="col" { "Client" } th scope="col" { "State" } th scope="col" { "Replay lag" } } }
                tbody {
                    @for w in rows {
                        tr {
                            td { (w.pid) }
                            td { @if Some(w.pid) == slot_pid { "the relay's stream" } @else { "standby or other slot" } }
                            td { (w.application_name) }
                            td { (w.client.as_deref().unwrap_or("local")) }
                            td { (w.state.as_deref().unwrap_or("—")) }
                            td { (opt_bytes(w.replay_lag_bytes)) }
                        }
                    }
                }
            }
        }
        p.hint { "A relay waiting as a hot standby holds no walsender; it shows as " code { "railhook_relay_standby 1" } " in its own metrics." }
    }
}

const W: f64 = 600.0;
const H: f64 = 160.0;

/// Where the chart's time axis starts: an hour ago, or the first sample when the ring holds
/// less than an hour (a young process).
fn axis_start(samples: &[Sample], now: DateTime<Utc>) -> DateTime<Utc> {
    let hour_ago = now - chrono::Duration::hours(1);
    samples.first().map_or(hour_ago, |s| s.at.max(hour_ago)).min(now - chrono::Duration::seconds(1))
}

/// "1 hour ago", "12 min ago", "40 s ago".
fn ago(from: DateTime<Utc>, now: DateTime<Utc>) -> String {
    match (now - from).num_seconds() {
        s if s >= 3590 => "1 hour ago".into(),
        s if s >= 120 => format!("{} min ago", s / 60),
        s => format!("{s} s ago"),
    }
}

/// `points` for a polyline of one series from `start` to `now`.
fn points(samples: &[Sample], start: DateTime<Utc>, now: DateTime<Utc>, max: f64, value: impl Fn(&Sample) -> Option<i64>) -> String {
    let span = (now - start).num_milliseconds().max(1) as f64;
    samples
        .iter()
        .filter_map(|s| {
            let v = value(s)? as f64;
            let x = (s.at - start).num_milliseconds() as f64 / span * W;
            Some(format!("{:.1},{:.1}", x.clamp(0.0, W), H - (v / max).clamp(0.0, 1.0) * H))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Lag and retained WAL of the last hour as an SVG (attributes only: the CSP forbids inline
/// styles), with the same figures as text for screen readers.
pub fn chart(samples: &[Sample], now: DateTime<Utc>) -> Markup {
    if samples.is_empty() {
        return html! { p #lag-chart-empty { "No sample yet: the dashboard samples the slot every " (SAMPLE_EVERY.as_secs()) " s." } };
    }
    let series = |s: &Sample| [s.lag_bytes, s.retained_bytes];
    let max = samples.iter().flat_map(series).flatten().max().unwrap_or(0).max(1) as f64;
    let last = samples[samples.len() - 1];
    let start = axis_start(samples, now);
    let summary = format!(
        "{} samples; now: lag {}, retained {}; the highest {}",
        samples.len(),
        last.lag_bytes.map(bytes).unwrap_or_else(|| "unknown".into()),
        last.retained_bytes.map(bytes).unwrap_or_else(|| "unknown".into()),
        bytes(max as i64)
    );
    html! {
        figure.chart {
            svg #lag-chart role="img" aria-label=(summary) viewBox={ "0 0 " (W) " " (H + 20.0) } width=(W) height=(H + 20.0) data-samples=(samples.len()) {
                line.axis x1="0" y1=(H) x2=(W) y2=(H) {}
                polyline.retained fill="none" points=(points(samples, start, now, max, |s| s.retained_bytes)) {}
                polyline.lag fill="none" points=(points(samples, start, now, max, |s| s.lag_bytes)) {}
                text x="2" y="12" { (bytes(max as i64)) }
                text x="2" y=(H + 16.0) { (ago(start, now)) }
                text x=(W - 2.0) y=(H + 16.0) text-anchor="end" { "now" }
            }
            figcaption { span.legend-lag { "— lag" } " · " span.legend-retained { "— retained WAL" } " · " (summary) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_last_hour_only() {
        let h = History::default();
        for i in 0..(CAPACITY as i64 + 10) {
            h.push(Sample { at: Utc::now(), lag_bytes: Some(i), retained_bytes: None });
        }
        let s = h.snapshot();
        assert_eq!(s.len(), CAPACITY);
        assert_eq!(s[0].lag_bytes, Some(10));
    }

    #[test]
    fn the_chart_is_markup_without_style_and_scales_into_its_box() {
        let now = Utc::now();
        let samples = [
            Sample { at: now - chrono::Duration::minutes(90), lag_bytes: Some(5), retained_bytes: Some(10) },
            Sample { at: now, lag_bytes: Some(2048), retained_bytes: Some(4096) },
        ];
        let svg = chart(&samples, now).into_string();
        assert!(!svg.contains("style"));
        assert!(svg.contains("0.0,159.8 600.0,80.0") && svg.contains("600.0,0.0"), "{svg}");
        assert_eq!(bytes(1536), "1.5 KiB");
    }
}
