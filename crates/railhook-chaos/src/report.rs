//! The run's report: the Deliveries' and the Forwards' verdicts, the report by fault kind,
//! and how the run went; as text ([`render`]) and as JSON ([`write_json`]), whose top level
//! has `events`, `lost` and one entry per fault kind injected (`postgres_crash`, ...).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::by_kind::KindReport;
use crate::checker::Verdict;
use crate::forwards::ForwardsVerdict;
use crate::plan::PlannedFault;
use crate::procs::ProcessStats;
use crate::record::FaultRecord;
use crate::{client, incoming};

/// How the run counted ordering gap timeouts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GapTimeoutCount {
    /// `railhook_ordering_gap_timeout_total` summed over the last process of each worker,
    /// read just before they stopped (a killed worker's count is gone with it; hence the log).
    pub worker_metric: Option<u64>,
    /// "ordering gap timeout" lines in the workers' logs (every process of the run).
    pub worker_log: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Timings {
    pub setup_s: f64,
    pub send_s: f64,
    pub drain_s: f64,
    pub check_s: f64,
    pub total_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Topology {
    /// `railhook all` processes (the inline transport; 0 on Kafka): each an api, a relay and
    /// a worker. With two, one streams from the slot and the other's relay is its hot standby.
    pub all: usize,
    /// Separate processes (the Kafka transport; 0 on inline).
    pub apis: usize,
    /// One streams; the others wait as hot standbys.
    pub relays: usize,
    pub workers: usize,
    /// Whether the run started a Kafka broker (never on inline).
    pub kafka: bool,
    /// How the processes reach Postgres and Kafka: `toxiproxy` (one proxy per link) or
    /// `direct`.
    pub network: &'static str,
    /// Postgres' data directory on a tmpfs of its own (for `disk_full`).
    pub postgres_data_on_tmpfs: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub mode: &'static str,
    /// How announcements went from the relay to the workers: `kafka` or `inline`.
    pub transport: &'static str,
    pub seed: u64,
    /// Events of the paced stream (the bursts' are `burst_events`).
    pub events: usize,
    /// Deliveries and Forwards lost: must be 0.
    pub lost: usize,
    pub passed: bool,
    /// Every failure: the Deliveries', the Forwards', and the faults' (`<kind>: ...`).
    pub failures: Vec<String>,
    pub endpoints: usize,
    pub flaky_endpoints: usize,
    pub topology: Topology,
    /// Endpoints (by index) with an ordered Subscription.
    pub ordered_endpoints: Vec<usize>,
    /// Events sent in the bursts around the faults (on top of `events`).
    pub burst_events: usize,
    pub ordering_gap_timeout_seconds: u64,
    pub gap_timeouts: GapTimeoutCount,
    pub started_at: DateTime<Utc>,
    /// The Deliveries' verdict.
    pub verdict: Verdict,
    /// The incoming direction's verdict.
    pub forwards: ForwardsVerdict,
    /// One entry per fault kind injected, by its name, at the top level.
    #[serde(flatten)]
    pub kinds: BTreeMap<String, KindReport>,
    /// Before the first fault.
    pub baseline: KindReport,
    /// The most requests one Endpoint had in flight at the receiver at once.
    pub max_endpoint_concurrency: usize,
    pub endpoint_concurrency_limit: usize,
    pub faults_planned: Vec<PlannedFault>,
    pub faults: Vec<FaultRecord>,
    /// Planned faults that could not be injected on this machine, and why.
    pub faults_skipped: Vec<String>,
    pub processes: BTreeMap<String, ProcessStats>,
    pub client: client::SendStats,
    /// The incoming direction: Standard Webhooks Sources, their Destinations on the receiver.
    pub sources: usize,
    pub destinations: usize,
    pub flaky_destinations: usize,
    pub incoming_client: incoming::IncomingStats,
    /// Provider events sent in the bursts around the faults (on top of `Options::incoming`).
    pub incoming_burst_events: usize,
    pub drained: bool,
    pub timings: Timings,
    /// Logs, configuration and the receiver's log (kept when the run failed or `keep`).
    pub run_dir: Option<PathBuf>,
}

/// The report as text.
pub fn render(report: &Report) -> String {
    let v = &report.verdict;
    let d = &v.duplicates;
    let mut out = String::new();
    let mut line = |k: &str, val: String| out.push_str(&format!("  {k:<40} {val}\n"));
    line("mode", format!("{} (seed {}), transport {}", report.mode, report.seed, report.transport));
    let t = &report.topology;
    let processes = if t.all > 0 { format!("{} all (api, relay and worker in one process), no Kafka", t.all) } else { format!("{} api, {} relay, {} worker", t.apis, t.relays, t.workers) };
    line("processes", format!("{processes}; network {}{}", t.network, if t.postgres_data_on_tmpfs { "; Postgres data on a tmpfs" } else { "" }));
    line("events planned / accepted", format!("{} / {}", v.planned_events, v.accepted));
    line("endpoints (flaky)", format!("{} ({})", report.endpoints, report.flaky_endpoints));
    line("deliveries expected / in Postgres", format!("{} / {}", v.deliveries_expected, v.deliveries_in_postgres));
    line("delivered (answered 2xx)", v.delivered.to_string());
    line("failed for a reason (all attempts failed)", v.failed_legitimately.to_string());
    line("LOST (deliveries + forwards)", report.lost.to_string());
    line("duplicate arrivals", d.total.to_string());
    line("  window 8: lost response", d.window_8_lost_response.to_string());
    line("  window 8: worker killed / task panicked", d.window_8_worker_killed.to_string());
    line("  window 8: Postgres unreachable", d.window_8_postgres_unreachable.to_string());
    line("  window 8: claim forgotten by a crash", d.window_8_forgotten_claim.to_string());
    line("  UNEXPLAINED", d.unexplained.to_string());
    line("stuck (PENDING/PROCESSING)", v.stuck.to_string());
    let o = &v.ordering;
    line("ordered endpoints (index)", format!("{} {:?}, bursts of {} events in all", o.ordered_endpoints, report.ordered_endpoints, report.burst_events));
    line("ordered deliveries / applied", format!("{} / {}", o.ordered_deliveries, o.applied));
    line("OUT OF ORDER", o.out_of_order.to_string());
    line("sequence number problems", format!("{} (X-Sequence-Number mismatches {})", o.sequence_problems, o.header_mismatches));
    line(
        "GAP TIMEOUTS",
        format!(
            "{} (gap timeout {} s; worker log {}, last worker's /metrics {})",
            o.gap_timeouts,
            report.ordering_gap_timeout_seconds,
            report.gap_timeouts.worker_log,
            report.gap_timeouts.worker_metric.map_or("-".to_string(), |m| m.to_string())
        ),
    );
    line("max requests in flight per endpoint", format!("{} (limit {})", report.max_endpoint_concurrency, report.endpoint_concurrency_limit));
    line("accepted events missing in Postgres", v.accepted_missing_in_postgres.to_string());
    line("events in Postgres never accepted", v.events_in_postgres_not_accepted.to_string());
    line("deliveries without an accepted event", v.deliveries_without_accepted_event.to_string());
    line("bad signatures", v.bad_signatures.to_string());
    line("attempts", format!("{} {:?}", v.attempts_total, v.attempts_by_result));
    line("arrivals (2xx)", format!("{} ({}) {:?}", v.arrivals_total, v.arrivals_2xx, v.arrivals_by_behaviour));
    line("client", format!("{} requests, {} x 201, {} x 200 replay, {} conn-error retries, {} 5xx retries", report.client.requests, report.client.created_201, report.client.replayed_200, report.client.retried_connection_errors, report.client.retried_5xx));
    render_forwards(report, &mut line);
    for (name, p) in &report.processes {
        line(&format!("process {name}"), format!("{} starts, {} kills, {} unexpected exits", p.starts, p.kills, p.unexpected_exits.len()));
    }
    for (name, k) in report.kinds.iter().map(|(n, k)| (n.as_str(), k)).chain([("baseline", &report.baseline)]) {
        let c = &k.clients_saw;
        line(
            &format!("{name} x{}", k.injected),
            format!(
                "{}: lost {}, dup w8 {}, unexplained {}, stuck {}, longest accepted->arrival {} (across {}), clients 5xx {} (503 {}) timeouts {} conn {}, max in flight {}{}",
                if k.passed { "ok" } else { "FAILED" },
                k.lost + k.lost_forwards,
                k.duplicates_window_8,
                k.duplicates_unexplained,
                k.stuck,
                k.longest_accepted_to_arrival_ms.map_or("-".into(), |ms| format!("{:.1} s", ms as f64 / 1000.0)),
                k.longest_across_ms.map_or("-".into(), |ms| format!("{:.1} s", ms as f64 / 1000.0)),
                c.answered_5xx,
                c.answered_503,
                c.timeouts,
                c.connection_errors,
                k.max_endpoint_concurrency,
                if k.figures.is_empty() { String::new() } else { format!("; {}", serde_json::to_string(&k.figures).unwrap_or_default()) },
            ),
        );
    }
    for f in &report.faults {
        let in_flight = v.ordering.in_flight_at_faults.iter().find(|o| o.kind == f.kind && o.started_at == f.started_at).map_or(0, |o| o.ordered_in_flight);
        line(
            "fault",
            format!(
                "{} {}at {} accepted, {:.1} s, {in_flight} ordered in flight{}",
                f.kind.name(),
                f.link.map(|l| format!("{} ", l.name())).unwrap_or_default(),
                f.at_accepted,
                (f.ended_at - f.started_at).num_milliseconds() as f64 / 1000.0,
                if f.detail.is_null() { String::new() } else { format!(" {}", f.detail) },
            ),
        );
    }
    for skipped in &report.faults_skipped {
        line("fault not injected", skipped.clone());
    }
    let t = &report.timings;
    line("time", format!("setup {:.0} s, send {:.0} s, drain {:.0} s, total {:.0} s", t.setup_s, t.send_s, t.drain_s, t.total_s));
    for example in v.lost_examples.iter().take(5) {
        line("lost example", example.clone());
    }
    for example in v.stuck_examples.iter().take(5) {
        line("stuck example", example.clone());
    }
    for example in v.ordering.out_of_order_examples.iter().take(5) {
        line("out of order", example.clone());
    }
    for example in v.ordering.sequence_problem_examples.iter().take(5) {
        line("sequence problem", example.clone());
    }
    for dup in v.duplicate_details.iter().filter(|d| d.window != "8").take(5) {
        line("unexplained duplicate", format!("{} {:?} at {}", dup.delivery_id, dup.explanation, dup.received_at));
    }
    if let Some(dir) = &report.run_dir {
        line("run folder (logs)", dir.display().to_string());
    }
    let verdict = if report.passed { "PASSED".to_string() } else { format!("FAILED: {}", report.failures.join("; ")) };
    format!("railhook chaos report\n{out}  {verdict}\n")
}

/// The incoming direction's lines of the report.
fn render_forwards(report: &Report, line: &mut impl FnMut(&str, String)) {
    let f = &report.forwards;
    let c = &report.incoming_client;
    line("sources / destinations (flaky)", format!("{} / {} ({})", report.sources, report.destinations, report.flaky_destinations));
    line("incoming planned / accepted", format!("{} / {} ({} in bursts; refused {})", f.planned, f.accepted, report.incoming_burst_events, f.refused));
    line("incoming answers", format!("{} x 202, {} x 200; {} requests, {} conn-error retries, {} 5xx retries", c.stored_202, c.duplicate_200, c.requests, c.retried_connection_errors, c.retried_5xx));
    line("resends answered 200 (same id) / sent", format!("{} / {} (WRONG {}, id mismatches {})", f.resends_200, f.resends, f.resends_wrong, f.id_mismatches));
    line("incoming events in Postgres", format!("{} (accepted missing {}, never accepted {})", f.incoming_in_postgres, f.accepted_missing_in_postgres, f.incoming_not_accepted));
    line("forwards expected / in Postgres", format!("{} / {} (UNEXPECTED {})", f.expected, f.in_postgres, f.unexpected));
    line("forwards delivered (2xx)", format!("{} (failed for a reason {})", f.delivered, f.failed_legitimately));
    line("FORWARDS LOST", f.lost.to_string());
    let d = &f.duplicates;
    line(
        "forward duplicate arrivals",
        format!(
            "{} (window 8: lost response {}, worker killed {}, Postgres unreachable {}, forgotten claim {}; UNEXPLAINED {})",
            d.total, d.window_8_lost_response, d.window_8_worker_killed, d.window_8_postgres_unreachable, d.window_8_forgotten_claim, d.unexplained
        ),
    );
    line("forwards stuck (PENDING/PROCESSING)", f.stuck.to_string());
    line("forward header mismatches / bad signatures", format!("{} / {}", f.header_mismatches, f.bad_signatures));
    line("forward arrivals (2xx)", format!("{} ({}); attempts {:?}", f.arrivals_total, f.arrivals_2xx, f.attempts_by_result));
    let in_flight: Vec<String> = f.in_flight_at_faults.iter().map(|x| format!("{} {}", x.kind.name(), x.forwards_in_flight)).collect();
    line("forwards in flight at the faults", in_flight.join(", "));
    for example in f.lost_examples.iter().chain(&f.stuck_examples).chain(&f.header_examples).take(5) {
        line("forward problem", example.clone());
    }
    for example in f.duplicate_examples.iter().take(5) {
        line("forward duplicate", example.clone());
    }
}

/// Writes the report as pretty JSON, creating the folder.
pub fn write_json(report: &Report, path: &Path) -> anyhow::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(report)? + "\n").with_context(|| format!("write {}", path.display()))
}
