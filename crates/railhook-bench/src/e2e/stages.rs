//! Where a phase's time went: the relay's and the worker's
//! `railhook_delivery_stage_seconds{stage}` histograms (`railhook_telemetry::stages`) read
//! before and after a phase, and the difference turned into each stage's count, mean, p50 and
//! p99 over the phase alone. The quantiles are read off the buckets (linear inside the
//! bucket that holds them), so they are as fine as the buckets: 0.1-0.5 ms steps below 5 ms.
//!
//! Also the cluster's WAL over the phase (`pg_current_wal_lsn()` before and after), per
//! Delivery: cluster-wide, so anything else writing to the same Postgres counts too.

use std::collections::HashMap;

use railhook_telemetry::stages::{Stage, METRIC};

use crate::http::get_text;
use crate::stack::Stack;

/// Cumulative bucket counts by stage and bound, with each stage's sum and count.
#[derive(Default, Clone)]
pub struct Snapshot {
    buckets: HashMap<(String, String), f64>,
    sums: HashMap<String, f64>,
    counts: HashMap<String, f64>,
    wal_lsn: Option<u64>,
}

/// Reads the stage histograms of every process of the stack (relay and worker; a process
/// that does not answer counts as empty) and the cluster's WAL position.
pub async fn snapshot(stack: &Stack) -> Snapshot {
    let mut s = Snapshot::default();
    let mut listens = vec![stack.config.relay.ops_listen, stack.config.worker.ops_listen];
    // `railhook all` (Stack::start_all): both are the API's, read once.
    listens.dedup();
    for listen in listens {
        let text = get_text(&format!("http://{listen}/metrics")).await.unwrap_or_default();
        s.add(&text);
    }
    s.wal_lsn = wal_lsn(stack).await;
    s
}

async fn wal_lsn(stack: &Stack) -> Option<u64> {
    let client = stack.db.client().await;
    let row = client.query_one("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8", &[]).await.ok()?;
    row.try_get::<_, f64>(0).ok().map(|v| v as u64)
}

impl Snapshot {
    /// Adds one process's metrics text (the same series from two processes add up).
    fn add(&mut self, text: &str) {
        for line in text.lines().filter(|l| l.starts_with(METRIC)) {
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let Ok(value) = value.parse::<f64>() else { continue };
            let Some(stage) = label(series, "stage") else { continue };
            if series.starts_with(&format!("{METRIC}_bucket")) {
                let Some(le) = label(series, "le") else { continue };
                *self.buckets.entry((stage, le)).or_default() += value;
            } else if series.starts_with(&format!("{METRIC}_sum")) {
                *self.sums.entry(stage).or_default() += value;
            } else if series.starts_with(&format!("{METRIC}_count")) {
                *self.counts.entry(stage).or_default() += value;
            }
        }
    }
}

fn label(series: &str, name: &str) -> Option<String> {
    let start = series.find(&format!("{name}=\""))? + name.len() + 2;
    let end = series[start..].find('"')? + start;
    Some(series[start..end].to_string())
}

/// One stage over a phase.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageFigures {
    pub count: f64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// The quantile `q` of a histogram given as (upper bound, cumulative count) sorted by bound,
/// in the bound's unit; linear inside its bucket; the last finite bound if it falls in +Inf.
pub fn quantile(buckets: &[(f64, f64)], q: f64) -> f64 {
    let Some(total) = buckets.last().map(|b| b.1) else { return 0.0 };
    if total <= 0.0 {
        return 0.0;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for &(bound, cumulative) in buckets {
        if cumulative >= rank {
            if bound.is_infinite() {
                return lower;
            }
            let inside = cumulative - below;
            let fraction = if inside > 0.0 { (rank - below) / inside } else { 1.0 };
            return lower + (bound - lower) * fraction;
        }
        lower = bound;
        below = cumulative;
    }
    lower
}

/// Each stage over the phase between `before` and `after` (stages without observations left
/// out), and the WAL per Delivery.
pub fn delta(before: &Snapshot, after: &Snapshot, deliveries: usize) -> serde_json::Value {
    let mut stages = serde_json::Map::new();
    for stage in Stage::ALL.map(Stage::as_str) {
        if let Some(f) = stage_delta(before, after, stage) {
            stages.insert(
                stage.into(),
                serde_json::json!({"count": f.count, "mean_ms": round3(f.mean_ms), "p50_ms": round3(f.p50_ms), "p99_ms": round3(f.p99_ms)}),
            );
        }
    }
    let wal = match (before.wal_lsn, after.wal_lsn) {
        (Some(b), Some(a)) if a >= b => Some(a - b),
        _ => None,
    };
    serde_json::json!({
        "stages": stages,
        "wal_bytes": wal,
        "wal_bytes_per_delivery": wal.filter(|_| deliveries > 0).map(|w| (w as f64 / deliveries as f64).round()),
    })
}

fn stage_delta(before: &Snapshot, after: &Snapshot, stage: &str) -> Option<StageFigures> {
    let count = after.counts.get(stage).copied().unwrap_or(0.0) - before.counts.get(stage).copied().unwrap_or(0.0);
    if count <= 0.0 {
        return None;
    }
    let sum = after.sums.get(stage).copied().unwrap_or(0.0) - before.sums.get(stage).copied().unwrap_or(0.0);
    let mut buckets: Vec<(f64, f64)> = after
        .buckets
        .iter()
        .filter(|((s, _), _)| s == stage)
        .filter_map(|((s, le), v)| {
            let bound = if le == "+Inf" { f64::INFINITY } else { le.parse::<f64>().ok()? };
            Some((bound * 1000.0, v - before.buckets.get(&(s.clone(), le.clone())).copied().unwrap_or(0.0)))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    Some(StageFigures { count, mean_ms: sum / count * 1000.0, p50_ms: quantile(&buckets, 0.5), p99_ms: quantile(&buckets, 0.99) })
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// One line per phase: each stage's p50/p99 in ms.
pub fn describe(figures: &serde_json::Value) -> String {
    let Some(stages) = figures["stages"].as_object() else { return String::new() };
    let mut parts: Vec<String> = Stage::ALL
        .iter()
        .filter_map(|s| stages.get(s.as_str()).map(|f| format!("{} {:.2}/{:.2}", s.as_str(), f["p50_ms"].as_f64().unwrap_or(0.0), f["p99_ms"].as_f64().unwrap_or(0.0))))
        .collect();
    if let Some(w) = figures["wal_bytes_per_delivery"].as_f64() {
        parts.push(format!("WAL {w:.0} B/delivery"));
    }
    format!("stages p50/p99 ms: {}", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_inside_their_bucket() {
        // 100 observations: 50 in (0, 1], 40 in (1, 2], 10 in (2, 4].
        let b = [(1.0, 50.0), (2.0, 90.0), (4.0, 100.0), (f64::INFINITY, 100.0)];
        assert_eq!(quantile(&b, 0.5), 1.0);
        assert!((quantile(&b, 0.7) - 1.5).abs() < 1e-9);
        assert!((quantile(&b, 0.99) - 3.8).abs() < 1e-9);
        assert_eq!(quantile(&[(1.0, 0.0), (f64::INFINITY, 5.0)], 0.5), 1.0, "in +Inf: the last finite bound");
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn a_phase_is_the_difference_of_two_readings_summed_over_processes() {
        let relay = "railhook_delivery_stage_seconds_bucket{stage=\"commit_to_read\",le=\"0.001\"} 4\n\
                     railhook_delivery_stage_seconds_bucket{stage=\"commit_to_read\",le=\"0.002\"} 10\n\
                     railhook_delivery_stage_seconds_bucket{stage=\"commit_to_read\",le=\"+Inf\"} 10\n\
                     railhook_delivery_stage_seconds_sum{stage=\"commit_to_read\"} 0.012\n\
                     railhook_delivery_stage_seconds_count{stage=\"commit_to_read\"} 10\n";
        let mut before = Snapshot::default();
        before.add(&relay.replace("} 4", "} 2").replace("} 10", "} 4").replace("} 0.012", "} 0.004"));
        let mut after = Snapshot::default();
        after.add(relay);
        after.add("railhook_delivery_stage_seconds_count{stage=\"request\"} 0\n");
        let d = delta(&before, &after, 6);
        let f = &d["stages"]["commit_to_read"];
        assert_eq!(f["count"], 6.0);
        assert!((f["mean_ms"].as_f64().unwrap() - 8.0 / 6.0).abs() < 1e-3);
        // 2 of 6 in (0, 1 ms], 4 in (1, 2 ms]: the median is at 1.25 ms.
        assert!((f["p50_ms"].as_f64().unwrap() - 1.25).abs() < 1e-9, "{d}");
        assert!(d["stages"].get("request").is_none(), "no observations, no figures");
    }
}
