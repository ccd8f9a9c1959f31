//! The fault-injection suite's quick mode (docs/RELIABILITY.md): about 500 events over 5
//! Endpoints (3 flaky), one SIGKILL of the api, the relay and the worker, a Kafka restart, a
//! Postgres fast restart and a receiver outage, each at a fixed number of accepted events,
//! with a fixed seed. Private Postgres and Kafka servers, the real `railhook` binary.
//! It passes only when nothing accepted was lost, every duplicate arrival is explained by
//! window 8 of DESIGN.md section 4, and no Delivery is left PENDING or PROCESSING.
//! The full run is `scripts/chaos`.

use std::path::PathBuf;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_chaos_run_loses_nothing_accepted() {
    let opts = railhook_chaos::Options::quick(PathBuf::from(env!("CARGO_BIN_EXE_railhook")));
    let report = railhook_chaos::run(&opts).await.expect("the chaos run could be carried out");
    let text = railhook_chaos::render(&report);
    eprintln!("{text}");
    let out = std::env::temp_dir().join(format!("railhook-chaos-quick-{}.json", std::process::id()));
    railhook_chaos::write_json(&report, &out).expect("write the report");
    let v = &report.verdict;
    // Every planned fault was injected: the quick mode is only worth its name if it is.
    assert_eq!(report.faults.len(), report.faults_planned.len(), "every planned fault was injected:\n{text}");
    assert_eq!(v.accepted, opts.events, "the client had every event accepted in the end:\n{text}");
    assert!(v.delivered > 0, "something was delivered:\n{text}");
    assert_eq!(v.lost, 0, "lost events:\n{text}");
    assert_eq!(v.duplicates.unexplained, 0, "unexplained duplicates:\n{text}");
    assert_eq!(v.stuck, 0, "stuck deliveries:\n{text}");
    assert!(v.passed, "verdict:\n{text}");
}
