//! `RAILHOOK_FAILPOINT_TASK_PANIC` (crate::failpoint): attempt tasks that panic right after
//! their claim give their Endpoint slot back, so the Endpoint keeps delivering at its
//! concurrency, and give their Claim back, so the Deliveries they held are sent again at once
//! (not after the stuck sweep's five minutes). Its own test binary: the failpoint is read from
//! the process environment when the worker starts.

mod common;

use std::time::Duration;

use common::{spec, Act, Receiver, System};
use railhook_testkit::relay::Fixture;

#[tokio::test]
async fn a_panicking_attempt_task_gives_its_endpoint_slot_back() {
    // Set before the worker starts (it reads the failpoint once); the only test here.
    std::env::set_var(railhook_worker::failpoint::TASK_PANIC_ENV, "every:4");
    let (receiver, base) = Receiver::start(|_, _| Act::Slow(Duration::from_millis(50), 200)).await;
    let sys = System::start(|c| {
        c.worker.endpoint_concurrency = 2;
        // Far beyond the waits below: the stuck sweep cannot be what sends the Deliveries
        // whose task panicked again; their given-back Claims must.
        c.worker.processing_timeout_seconds = 600;
    })
    .await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/hot")], &spec(&[1], 10, 10)).await;
    let m = &sys.worker.metrics;

    // Every fourth task panics: with two slots, two leaked slots would stop the Endpoint for
    // good after the eighth task.
    let mut first = Vec::new();
    for _ in 0..24 {
        first.extend(fixture.ingest(&sys.pool, "order.created").await);
    }
    for d in &first {
        sys.wait_status(d, "SUCCESS", Duration::from_secs(90)).await;
    }
    let panics = m.task_panics.get();
    assert!(panics >= 6, "every fourth task panicked: {panics} panics");
    // Each panic here is past a won claim (the failpoint fires in the claim step's end).
    // (Counted just after the release commits, so awaited.)
    railhook_testkit::eventually(Duration::from_secs(5), "every panicked task's Claim given back", || async {
        (m.claims_given_back.get() == m.task_panics.get()).then_some(())
    })
    .await;

    // Afterwards: still both slots, and never more (the failpoint still fires).
    receiver.concurrency.lock().unwrap().clear();
    let mut second = Vec::new();
    for _ in 0..24 {
        second.extend(fixture.ingest(&sys.pool, "order.created").await);
    }
    for d in &second {
        sys.wait_status(d, "SUCCESS", Duration::from_secs(90)).await;
    }
    let (_, most) = receiver.concurrency("/hot");
    eprintln!("{} panics in all; after the first {panics}, at most {most} requests at once", m.task_panics.get());
    assert_eq!(most, 2, "the Endpoint delivered at its concurrency after the panics");
    assert!(m.task_panics.get() > panics, "the failpoint kept firing");
    assert_eq!(m.in_flight.get(), 0, "the in-flight gauge came back");
    assert_eq!(m.claims_given_back.get(), m.task_panics.get(), "every panicked task's Claim was given back");
    assert_eq!(m.queue_waiting.get(), 0, "nothing left waiting");
    sys.stop().await;
}
