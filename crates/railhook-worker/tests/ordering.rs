//! Ordered delivery per Endpoint (DESIGN.md 6.5) end to end, against the real Postgres, Kafka
//! and HTTP: Sequence Numbers in commit order, the Ordering Buffer (a Delivery waits for its
//! predecessor), release at once when the predecessor ends, and the gap timeout.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use railhook_testkit::eventually;
use railhook_testkit::relay::{Fixture, SubscriptionSpec};

fn ordered(delays: &[i32], max_attempts: i16) -> SubscriptionSpec {
    SubscriptionSpec { ordering: true, ..spec(delays, max_attempts, 10) }
}

fn sequence(hit: &Hit) -> u64 {
    hit.headers["x-sequence-number"].to_str().unwrap().parse().unwrap()
}

/// The Sequence Numbers of the requests that were answered 2xx, in arrival order: the order
/// the receiver applied them in.
fn applied(receiver: &Receiver, path: &str, failed: &HashSet<usize>) -> Vec<u64> {
    receiver.hits(path).iter().enumerate().filter(|(n, _)| !failed.contains(n)).map(|(_, h)| sequence(h)).collect()
}

/// A burst of 500 ordered events to one endpoint whose receiver fails every 7th request once:
/// the receiver applies 1..500 in order, each once.
#[tokio::test]
async fn a_burst_arrives_in_order_through_failures() {
    // Every 7th request (by arrival) answers 500 once; its Delivery retries 1 s later.
    let (receiver, base) = Receiver::start(|_, n| if n % 7 == 6 { Act::Status(500) } else { Act::Status(200) }).await;
    let sys = System::start(|c| c.worker.ordering_gap_timeout_seconds = 120).await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/ordered")], &ordered(&[1], 5)).await;
    let mut deliveries = Vec::new();
    for _ in 0..500 {
        deliveries.extend(fixture.ingest(&sys.pool, "order.updated").await);
    }
    for d in &deliveries {
        sys.wait_status(d, "SUCCESS", Duration::from_secs(180)).await;
    }
    let hits = receiver.hits("/ordered");
    let failed: HashSet<usize> = (0..hits.len()).filter(|n| n % 7 == 6).collect();
    let order = applied(&receiver, "/ordered", &failed);
    assert_eq!(order, (1..=500).collect::<Vec<u64>>(), "applied out of order or twice");
    let m = &sys.worker.metrics;
    assert_eq!(m.ordering_gap_timeouts.get(), 0);
    assert!(m.ordering_released.get() > 0, "successors were released by their predecessors' finalise");
    // Every parked Delivery was released by its predecessor's finalise, none at its 120 s park
    // deadline (a release that missed its park: the claim read the predecessor in flight
    // while the finalise did not yet see the park).
    let parked: i64 = sys.client.query_one("SELECT count(*) FROM deliveries WHERE parked_at IS NOT NULL", &[]).await.unwrap().get(0);
    assert!(parked > 0);
    assert_eq!(m.ordering_released.get(), parked as u64, "a parked Delivery was not released by its predecessor");
    eprintln!(
        "ordered burst: 500 events, {} requests ({} failed once), {} released at once, {} parked",
        hits.len(),
        failed.len(),
        m.ordering_released.get(),
        m.deferrals.with_label_values(&["ordering"]).get()
    );
    let cursor: i64 = sys.client.query_one("SELECT cursor FROM endpoint_ordering", &[]).await.unwrap().get(0);
    assert_eq!(cursor, 500);
    sys.stop().await;
}

/// A poisoned event (its Delivery answers 500 forever) holds its successors for the gap
/// timeout, then they go, counted once; an unordered Subscription on the same endpoint is
/// never held back.
#[tokio::test]
async fn a_poisoned_event_holds_its_successors_for_the_gap_timeout_only() {
    let (receiver, base) = Receiver::start(|_, _| Act::Status(200)).await;
    // The poisoned event: every request carrying it answers 500.
    receiver.poison.lock().unwrap().push("\"type\":\"order.paid\"".into());
    let sys = System::start(|c| c.worker.ordering_gap_timeout_seconds = 3).await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/ordered")], &ordered(&[1], 20)).await;
    let endpoint = fixture.endpoints[0];
    // An unordered Subscription on the same endpoint for another event type.
    sys.client
        .execute(
            "INSERT INTO subscriptions (id, project_id, endpoint_id, event_type_pattern, ordering, max_attempts, timeout_seconds, retry_delays)
             SELECT gen_random_uuid(), project_id, id, 'user.created', false, 5, 10, '{1}' FROM endpoints WHERE id = $1",
            &[&endpoint.0],
        )
        .await
        .unwrap();
    sys.client.execute("UPDATE subscriptions SET event_type_pattern = 'order.*' WHERE endpoint_id = $1 AND ordering", &[&endpoint.0]).await.unwrap();
    let first = fixture.ingest(&sys.pool, "order.created").await.remove(0);
    sys.wait_status(&first, "SUCCESS", Duration::from_secs(30)).await;
    let poisoned = fixture.ingest(&sys.pool, "order.paid").await.remove(0);
    let is_poisoned = |h: &Hit| String::from_utf8_lossy(&h.body).contains("order.paid");
    eventually(Duration::from_secs(30), "the poisoned Delivery's first failure", || async { receiver.hits("/ordered").iter().any(is_poisoned).then_some(()) }).await;
    // Its successors, and an unordered event meanwhile.
    let started = std::time::Instant::now();
    let mut successors = Vec::new();
    for _ in 0..3 {
        successors.extend(fixture.ingest(&sys.pool, "order.shipped").await);
    }
    let unordered = fixture.ingest(&sys.pool, "user.created").await.remove(0);
    sys.wait_status(&unordered, "SUCCESS", Duration::from_secs(10)).await;
    let unordered_after = started.elapsed();
    assert!(unordered_after < Duration::from_secs(2), "the unordered Delivery waited {unordered_after:?}");
    for d in &successors {
        sys.wait_status(d, "SUCCESS", Duration::from_secs(60)).await;
    }
    let held = started.elapsed();
    assert!(held >= Duration::from_millis(2_500), "successors went after {held:?}, before the 3 s gap timeout");
    assert_eq!(sys.status(&poisoned).await.0, "PENDING", "the poisoned Delivery is still retrying");
    assert_eq!(sys.worker.metrics.ordering_gap_timeouts.get(), 1, "one gap timeout: the direct successor's; the rest followed it");
    // The successors arrived in order among themselves.
    let seqs: Vec<u64> = receiver.hits("/ordered").iter().filter(|h| h.headers.contains_key("x-sequence-number") && !is_poisoned(h)).map(sequence).collect();
    assert_eq!(seqs, vec![1, 3, 4, 5], "the first event, then the successors of the poisoned 2 in order");
    sys.stop().await;
}

/// The Delivery API shows the Sequence Number and whether, and since when, it is parked: a
/// Delivery whose predecessor another worker holds (here, the test itself) parks in Postgres.
#[tokio::test]
async fn a_parked_delivery_shows_when_it_was_parked() {
    let (_receiver, base) = Receiver::start(|_, _| Act::Hang).await;
    let sys = System::start_kafka(|c| c.worker.ordering_gap_timeout_seconds = 600).await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/slow")], &ordered(&[1], 5)).await;
    // The first Delivery is claimed by someone else than the worker: the worker is stopped
    // meanwhile, and started again once the claim is made.
    sys.worker.shutdown.cancel();
    eventually(Duration::from_secs(30), "the worker to stop", || async { sys.worker.task.is_finished().then_some(()) }).await;
    let a = fixture.ingest(&sys.pool, "order.created").await.remove(0);
    let limits = railhook_store::lifecycle::Limits { endpoint_concurrency: 0, project_concurrency: 0, project_rate: 0, circuit_cooldown_s: 30.0, probe_timeout_s: 300.0, ordering_gap_s: 600.0, synchronous_commit: true };
    let request = railhook_store::lifecycle::ClaimRequest { delivery: a.parse().unwrap(), token: railhook_core::ClaimToken::new(), hint: None, wait: false, announced_at: None, position: None };
    let claimed = railhook_store::lifecycle::claim_batch(&sys.pool.get().await.unwrap(), &[request], &limits).await.unwrap();
    assert!(matches!(claimed[0], railhook_store::lifecycle::ClaimResult::Claimed(_)), "{claimed:?}");
    let worker = Worker::start(&sys.config);
    let b = fixture.ingest(&sys.pool, "order.paid").await.remove(0);
    let b_id: railhook_core::DeliveryId = b.parse().unwrap();
    let parked: chrono::DateTime<chrono::Utc> = eventually(Duration::from_secs(30), "the second Delivery to be parked", || async {
        sys.client.query_one("SELECT parked_at FROM deliveries WHERE id = $1", &[&b_id.0]).await.unwrap().get::<_, Option<chrono::DateTime<chrono::Utc>>>(0)
    })
    .await;
    let project = fixture.project;
    let delivery = railhook_store::deliveries::get_delivery(&sys.client, project, b_id).await.unwrap().unwrap();
    assert_eq!(delivery.sequence_number, Some(2));
    assert_eq!(delivery.parked_since, Some(parked));
    assert_eq!(sys.status(&a).await.0, "PROCESSING");
    assert_eq!(worker.metrics.ordering_held.get(), 0, "not held: its predecessor is not this worker's");
    worker.stop().await;
    sys.stop().await;
}

/// The worker's Ordering Buffer (issue 30): an ordered burst is claimed ahead, behind the
/// predecessors the worker holds, and each is sent the moment its predecessor was answered,
/// not parked in Postgres and released by the predecessor's finalise. A predecessor that goes
/// back on its ladder stops what was held behind it: parked in Postgres (no Attempt spent),
/// then released by its predecessor's finalise, in order.
#[tokio::test]
async fn an_ordered_burst_is_held_in_the_worker_and_sent_in_order() {
    // Each answer takes 5 ms, so the burst queues up behind the Endpoint; the 151st request
    // fails once (a 500): Sequence Number 151 goes back on its 1 s ladder. What was held
    // behind it is parked, and from there each is released by its predecessor's finalise
    // (the Postgres path, one at a time).
    let (receiver, base) = Receiver::start(|_, n| if n == 150 { Act::Status(500) } else { Act::Slow(Duration::from_millis(5), 200) }).await;
    let sys = System::start(|c| c.worker.ordering_gap_timeout_seconds = 600).await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/held")], &ordered(&[1], 5)).await;
    let mut deliveries = Vec::new();
    for _ in 0..200 {
        deliveries.extend(fixture.ingest(&sys.pool, "order.updated").await);
    }
    for d in &deliveries {
        sys.wait_status(d, "SUCCESS", Duration::from_secs(60)).await;
    }
    let failed: HashSet<usize> = [150].into();
    let order = applied(&receiver, "/held", &failed);
    assert_eq!(order, (1..=200).collect::<Vec<u64>>(), "applied in order, each once");
    let m = &sys.worker.metrics;
    assert!(m.ordering_held.get() >= 100, "most of the burst went behind a held predecessor: {}", m.ordering_held.get());
    assert!(m.deferrals.with_label_values(&["ordering"]).get() >= 1, "what was held behind the failed one was parked");
    assert_eq!(m.ordering_gap_timeouts.get(), 0);
    let attempts: i64 = sys.client.query_one("SELECT count(*) FROM attempts", &[]).await.unwrap().get(0);
    assert_eq!(attempts, 201, "one Attempt each, and one more for the retried one: parking spends none");
    sys.stop().await;
}

/// An ordered Delivery waiting in the Ordering Buffer behind its predecessor uses no
/// connection of the receiver: the claim neither checks nor counts it against the concurrency
/// limits, and once an Endpoint's claims come back behind, the worker lets them run a claim
/// batch ahead of its request slots (`worker.endpoint_concurrency`, 2 here;
/// `queues::ORDERED_AHEAD`). While the first request of a burst is held at the receiver, far
/// more than two of the Endpoint's Deliveries are claimed ahead, with no Deferral and no busy
/// claim; the receiver still sees one request at a time, in order. (Before, the slots capped
/// the claims in flight, and a claim batch was about half of them.)
#[tokio::test]
async fn an_ordered_endpoint_claims_ahead_of_its_request_slots() {
    let (receiver, base) = Receiver::start(|_, n| if n == 0 { Act::Slow(Duration::from_secs(4), 200) } else { Act::Status(200) }).await;
    let sys = System::start(|c| {
        c.worker.endpoint_concurrency = 2;
        c.worker.ordering_gap_timeout_seconds = 600;
    })
    .await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/slots")], &ordered(&[1], 5)).await;
    let endpoint = fixture.endpoints[0].0;
    let mut deliveries = Vec::new();
    for _ in 0..20 {
        deliveries.extend(fixture.ingest(&sys.pool, "order.updated").await);
    }
    // While the first request is held (4 s), the rest is claimed behind it.
    let claimed = eventually(Duration::from_secs(30), "most of the burst claimed behind the held request", || async {
        let n: i64 = sys
            .client
            .query_one("SELECT count(*) FROM deliveries WHERE endpoint_id = $1 AND status = 'PROCESSING'", &[&endpoint])
            .await
            .unwrap()
            .get(0);
        (n >= 10).then_some(n)
    })
    .await;
    assert_eq!(receiver.hits("/slots").len(), 1, "nothing sent past the held request");
    for d in &deliveries {
        sys.wait_status(d, "SUCCESS", Duration::from_secs(60)).await;
    }
    let order = applied(&receiver, "/slots", &HashSet::new());
    assert_eq!(order, (1..=20).collect::<Vec<u64>>(), "applied in order, each once");
    assert_eq!(receiver.concurrency("/slots").1, 1, "one request at a time");
    let m = &sys.worker.metrics;
    assert_eq!(m.deferrals.with_label_values(&["endpoint_concurrency"]).get(), 0);
    assert_eq!(m.deferrals.with_label_values(&["ordering"]).get(), 0);
    assert_eq!(m.claims_busy.with_label_values(&["endpoint_concurrency"]).get(), 0, "the claims ahead were not counted");
    eprintln!("claimed ahead of one held request with 2 slots: {claimed}");
    sys.stop().await;
}

/// Two workers: a second one joins in the middle of an ordered burst, the consumer group
/// rebalances and the Endpoint's partition may move between them; the first then stops. The
/// receiver still applies 1..n in order (the order is decided in Postgres, under the
/// Endpoint's claim lock, not by whichever worker holds the partition).
#[tokio::test]
async fn the_order_holds_while_the_partition_moves_between_two_workers() {
    let (receiver, base) = Receiver::start(|_, _| Act::Slow(Duration::from_millis(2), 200)).await;
    let sys = System::start_kafka(|c| {
        c.kafka.partitions = 4;
        c.worker.ordering_gap_timeout_seconds = 600;
    })
    .await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/moving")], &ordered(&[1], 5)).await;
    let mut deliveries = Vec::new();
    for _ in 0..100 {
        deliveries.extend(fixture.ingest(&sys.pool, "order.updated").await);
    }
    let second = Worker::start(&sys.config);
    for _ in 0..100 {
        deliveries.extend(fixture.ingest(&sys.pool, "order.updated").await);
    }
    // The first worker leaves mid-stream (its Attempts drain): the partition moves to the second.
    eventually(Duration::from_secs(60), "some of the burst delivered", || async { (receiver.hits("/moving").len() >= 50).then_some(()) }).await;
    sys.worker.shutdown.cancel();
    for _ in 0..50 {
        deliveries.extend(fixture.ingest(&sys.pool, "order.updated").await);
    }
    for d in &deliveries {
        sys.wait_status(d, "SUCCESS", Duration::from_secs(120)).await;
    }
    let order = applied(&receiver, "/moving", &HashSet::new());
    let expected: Vec<u64> = (1..=250).collect();
    // Window 8 aside (a Delivery the leaving worker sent but did not finalise), each number
    // is applied once, in order: keep the first arrival of each.
    let mut seen = HashSet::new();
    let firsts: Vec<u64> = order.into_iter().filter(|n| seen.insert(*n)).collect();
    assert_eq!(firsts, expected, "applied out of order across the move");
    assert_eq!(second.metrics.ordering_gap_timeouts.get() + sys.worker.metrics.ordering_gap_timeouts.get(), 0);
    assert!(second.metrics.claims_won.get() > 0, "the second worker delivered part of the burst");
    second.stop().await;
    sys.stop().await;
}
