//! The fault-injection suite's quick mode (docs/RELIABILITY.md): about 500 events over 5
//! Endpoints (3 flaky), one SIGKILL of the api, the relay and the worker, a Kafka restart, a
//! Postgres crash (kill -9 of the postmaster) and a fast restart, connection resets on the
//! worker's link to Postgres (Toxiproxy) and a receiver outage, each at a fixed number of
//! accepted events, with a fixed seed. Private Postgres and Kafka servers, the real
//! `railhook` binary. The report has an entry per fault kind; each must have passed.
//! Two Endpoints (a healthy and a flaky one) also have an ordered Subscription, and each
//! fault is injected in the middle of a burst of events to them (issue 15: "kill -9 of the
//! worker in the middle of an ordered burst, and a relay restart: order and completeness
//! hold").
//! It passes only when nothing accepted was lost, every duplicate arrival is explained by
//! window 8 of DESIGN.md section 4, no Delivery is left PENDING or PROCESSING, the receiver
//! applied every ordered Endpoint's Deliveries in Sequence Number order, and no ordering gap
//! timeout fired (the run's is set above anything a fault can hold a Delivery).
//! Provider requests to the ingress (Standard Webhooks Sources, one or two Destinations each on
//! the receiver, some flaky) run through every fault too, with resends of accepted provider
//! events (issue 16: "kill -9 of the worker during Forwards loses nothing"): every accepted
//! request's Forward reaches each Destination, resends make no Forward, duplicates are window
//! 8, nothing is stuck.
//! The same quick mode runs on both transports (issue 32): on Kafka (separate api, relay and
//! worker processes, a private broker) and on inline (one `railhook all` process, no Kafka at
//! all: its SIGKILL, the Postgres crash and restart, resets on its link to Postgres, a lost
//! replication slot and the receiver's absence; the Kafka restart and the single components'
//! kills do not apply and are listed as such in the report).
//! The full run is `scripts/chaos` (`scripts/chaos --transport inline` for inline).

use std::path::PathBuf;

use railhook_chaos::options::TransportKind;

/// The two runs one after the other: each starts its own Postgres (and Kafka) and a dozen
/// processes, and its timings (the faults' points, the drain) are set for a machine it does
/// not share with another run.
static ONE_RUN_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_chaos_run_loses_nothing_accepted() {
    quick_run(TransportKind::Kafka, &["postgres_crash", "net_reset", "kill_worker", "kafka_restart"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_chaos_run_on_the_inline_transport_loses_nothing_accepted() {
    let report = quick_run(TransportKind::Inline, &["kill_all", "postgres_crash", "postgres_restart", "net_reset", "slot_invalidation", "receiver_outage"]).await;
    let text = railhook_chaos::render(&report);
    assert!(report.topology.all == 1 && !report.topology.kafka, "one railhook all process and no Kafka:\n{text}");
    // What does not apply on inline is named, with the reason, not silently dropped.
    for kind in ["kafka_restart", "kill_api", "kill_relay", "kill_worker"] {
        assert!(report.faults_skipped.iter().any(|s| s.starts_with(&format!("{kind}:"))), "{kind} listed as not injected:\n{text}");
        assert!(!report.kinds.contains_key(kind), "{kind} injected on inline:\n{text}");
    }
}

/// One quick run on `transport`; each of `kinds` injected once and passed, and every
/// invariant held. Returns the report.
async fn quick_run(transport: TransportKind, kinds: &[&str]) -> railhook_chaos::Report {
    let _turn = ONE_RUN_AT_A_TIME.lock().await;
    let mut opts = railhook_chaos::Options::quick(PathBuf::from(env!("CARGO_BIN_EXE_railhook")));
    opts.transport = transport;
    let report = railhook_chaos::run(&opts).await.expect("the chaos run could be carried out");
    let text = railhook_chaos::render(&report);
    eprintln!("{text}");
    let out = std::env::temp_dir().join(format!("railhook-chaos-quick-{}-{}.json", transport.as_str(), std::process::id()));
    railhook_chaos::write_json(&report, &out).expect("write the report");
    assert_eq!(report.transport, transport.as_str(), "the report names its transport:\n{text}");
    let v = &report.verdict;
    for kind in kinds {
        let k = report.kinds.get(*kind).unwrap_or_else(|| panic!("no {kind} entry:\n{text}"));
        assert!(k.injected == 1 && k.passed, "{kind}: {:?}\n{text}", k.failures);
    }
    assert_eq!(report.lost, 0, "lost:\n{text}");
    // Every planned fault was injected: the quick mode is only worth its name if it is.
    assert_eq!(report.faults.len(), report.faults_planned.len(), "every planned fault was injected:\n{text}");
    assert_eq!(v.accepted, v.planned_events, "the client had every event accepted in the end:\n{text}");
    assert!(report.burst_events > 0, "ordered bursts were sent:\n{text}");
    let o = &v.ordering;
    assert!(o.ordered_endpoints >= 2 && o.applied > 0, "ordered Deliveries were applied:\n{text}");
    // Every fault hit ordered Deliveries in flight (created, not yet applied).
    for f in &o.in_flight_at_faults {
        assert!(f.ordered_in_flight > 0, "{:?} hit no ordered Delivery in flight:\n{text}", f.kind);
    }
    assert_eq!(o.out_of_order, 0, "ordered Deliveries applied out of order:\n{text}");
    assert_eq!(o.gap_timeouts, 0, "an ordering gap timeout fired:\n{text}");
    assert!(v.delivered > 0, "something was delivered:\n{text}");
    assert_eq!(v.lost, 0, "lost events:\n{text}");
    assert_eq!(v.duplicates.unexplained, 0, "unexplained duplicates:\n{text}");
    assert_eq!(v.stuck, 0, "stuck deliveries:\n{text}");
    // The incoming direction (issue 16): Forwards under the same faults.
    let f = &report.forwards;
    assert_eq!(f.accepted, f.planned, "every incoming request was accepted in the end:\n{text}");
    // Every fault (the worker's kill -9 first) hit Forwards in flight (created, not yet answered 2xx).
    for x in &f.in_flight_at_faults {
        assert!(x.forwards_in_flight > 0, "{:?} hit no Forward in flight:\n{text}", x.kind);
    }
    assert!(f.resends > 0 && f.resends_200 == f.resends, "every resend was answered 200 with the first id:\n{text}");
    assert!(f.expected > 0 && f.delivered == f.expected, "every Forward reached its Destination:\n{text}");
    assert_eq!(f.lost, 0, "lost Forwards:\n{text}");
    assert_eq!(f.unexpected, 0, "Forwards beyond one per Incoming Event and Destination:\n{text}");
    assert_eq!(f.duplicates.unexplained, 0, "unexplained Forward duplicates:\n{text}");
    assert_eq!(f.stuck, 0, "stuck Forwards:\n{text}");
    assert!(v.passed && report.passed, "verdict:\n{text}");
    report
}
