//! The worker end to end, against the real Postgres, Kafka and HTTP: ingest through the
//! store, the CDC relay, the worker, and a receiver on 127.0.0.1 that verifies signatures
//! with its own implementation of the Standard Webhooks scheme.

mod common;

use std::collections::HashMap;

use std::time::{Duration, Instant};

use common::*;
use railhook_core::DeferralReason;
use railhook_testkit::eventually;
use railhook_testkit::relay::Fixture;


#[tokio::test]
async fn the_happy_path_is_signed_and_verifies() {
    let (receiver, base) = Receiver::start(|_, _| Act::Status(200)).await;
    let sys = System::start(|_| {}).await;
    let (fixture, secrets) = Fixture::create_with(&sys.client, &[format!("{base}/ok")], &spec(&[1], 3, 5)).await;
    let delivery = fixture.ingest(&sys.pool, "order.created").await.remove(0);
    assert_eq!(sys.wait_status(&delivery, "SUCCESS", Duration::from_secs(30)).await, 1);
    let hits = receiver.hits("/ok");
    assert_eq!(hits.len(), 1, "exactly one arrival");
    let hit = &hits[0];
    assert!(verifies(&secrets[0], &hit.headers, &hit.body), "signature verifies: {:?}", hit.headers);
    assert_eq!(hit.headers["webhook-id"], delivery.as_str());
    assert_eq!(hit.headers["content-type"], "application/json");
    assert!(hit.headers["user-agent"].to_str().unwrap().starts_with("Railhook/"));
    assert!(hit.headers["x-event-id"].to_str().unwrap().starts_with("evt_"));
    let body: serde_json::Value = serde_json::from_slice(&hit.body).unwrap();
    assert_eq!(body["type"], "order.created");
    assert!(body["data"]["n"].is_string());
    assert_eq!(sys.attempts(&delivery).await, vec![(1, Some(200), "success".to_string())]);
    assert_eq!(sys.worker.metrics.claims_won.get(), 1);
    // Every latency stage of the chain was observed once, by the process that sees it
    // (railhook_telemetry::stages): the relay's two, then the worker's.
    use railhook_telemetry::stages::Stage;
    for stage in [Stage::CommitToRead, Stage::ReadToAck] {
        assert_eq!(sys.relay_metrics.stats.stages.count(stage), 1, "{}", stage.as_str());
    }
    for stage in [Stage::ReadToPoll, Stage::PollToClaim, Stage::ClaimToSend, Stage::Request, Stage::ResponseToFinalise] {
        assert_eq!(sys.worker.metrics.stages.count(stage), 1, "{}", stage.as_str());
    }
    sys.stop().await;
}

#[tokio::test]
async fn a_500_then_a_200_retries_along_the_ladder() {
    let (receiver, base) = Receiver::start(|_, n| if n < 2 { Act::Status(500) } else { Act::Status(200) }).await;
    let sys = System::start(|_| {}).await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/flaky")], &spec(&[1, 1], 5, 5)).await;
    let delivery = fixture.ingest(&sys.pool, "order.created").await.remove(0);
    assert_eq!(sys.wait_status(&delivery, "SUCCESS", Duration::from_secs(30)).await, 3);
    let hits = receiver.hits("/flaky");
    assert_eq!(hits.len(), 3);
    // The ladder's 1 s, jittered to 0.5-1.5 s, plus the scheduler's interval.
    for pair in hits.windows(2) {
        let gap = pair[1].at - pair[0].at;
        assert!(gap >= Duration::from_millis(450) && gap < Duration::from_millis(3000), "gap {gap:?}");
        assert_eq!(pair[0].headers["webhook-id"], pair[1].headers["webhook-id"], "same webhook-id across retries");
    }
    let attempts = sys.attempts(&delivery).await;
    assert_eq!(attempts.iter().map(|a| (a.0, a.1)).collect::<Vec<_>>(), vec![(1, Some(500)), (2, Some(500)), (3, Some(200))]);
    sys.stop().await;
}

#[tokio::test]
async fn gone_bad_request_and_redirects_go_straight_to_failed_messages() {
    let (receiver, base) = Receiver::start(|path, _| match path {
        "/gone" => Act::Status(410),
        "/bad" => Act::Status(400),
        _ => Act::Redirect,
    })
    .await;
    let sys = System::start(|_| {}).await;
    let urls = [format!("{base}/gone"), format!("{base}/bad"), format!("{base}/moved")];
    let (fixture, _) = Fixture::create_with(&sys.client, &urls, &spec(&[1], 5, 5)).await;
    let deliveries = fixture.ingest(&sys.pool, "order.created").await;
    assert_eq!(deliveries.len(), 3);
    for d in &deliveries {
        assert_eq!(sys.wait_status(d, "FAILED", Duration::from_secs(30)).await, 1);
    }
    for path in ["/gone", "/bad", "/moved"] {
        assert_eq!(receiver.hits(path).len(), 1, "{path}: one arrival, no retry");
    }
    assert!(receiver.hits("/elsewhere").is_empty(), "the redirect was not followed");
    sys.stop().await;
}

#[tokio::test]
async fn a_timeout_is_retried() {
    let (receiver, base) = Receiver::start(|_, n| if n == 0 { Act::Hang } else { Act::Status(200) }).await;
    let sys = System::start(|_| {}).await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/slow")], &spec(&[1], 3, 1)).await;
    let delivery = fixture.ingest(&sys.pool, "order.created").await.remove(0);
    assert_eq!(sys.wait_status(&delivery, "SUCCESS", Duration::from_secs(30)).await, 2);
    assert_eq!(receiver.hits("/slow").len(), 2);
    let attempts = sys.attempts(&delivery).await;
    assert_eq!(attempts[0].2, "timeout");
    assert_eq!(attempts[1].1, Some(200));
    sys.stop().await;
}

/// Duplicate windows 4 and 5: the relay replays an announcement after a crash, or Kafka
/// redelivers one. Here the same announcement is produced again, twice, after the Delivery
/// succeeded, and a retry-path announcement with a stale scheduler token is produced too:
/// the Claim matches nothing, so the receiver sees exactly one request.
#[tokio::test]
async fn replayed_and_redelivered_announcements_claim_nothing() {
    let (receiver, base) = Receiver::start(|_, _| Act::Status(200)).await;
    let sys = System::start_kafka(|_| {}).await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/once")], &spec(&[1], 3, 5)).await;
    let delivery = fixture.ingest(&sys.pool, "order.created").await.remove(0);
    sys.wait_status(&delivery, "SUCCESS", Duration::from_secs(30)).await;
    let producer = railhook_kafka::idempotent_producer(&sys.config.kafka, 100).unwrap();
    let endpoint = fixture.endpoints[0].to_string();
    let replay = serde_json::json!({"v": 1, "delivery_id": delivery, "reason": "created", "outbox_id": 1, "created_at": "x"}).to_string();
    let stale = serde_json::json!({"v": 1, "delivery_id": delivery, "reason": "retry", "outbox_id": 2, "created_at": "x", "claim_token": uuid::Uuid::new_v4().to_string()}).to_string();
    for value in [&replay, &replay, &stale] {
        producer
            .send(rdkafka::producer::FutureRecord::to(&sys.config.deliveries_topic()).key(&endpoint).payload(value), Duration::from_secs(10))
            .await
            .unwrap();
    }
    let won = sys.worker.metrics.claims_won.get();
    eventually(Duration::from_secs(30), "the three duplicates to be consumed", || async {
        (sys.worker.metrics.claims_lost.get() >= 3).then_some(())
    })
    .await;
    assert_eq!(sys.worker.metrics.claims_won.get(), won);
    assert_eq!(receiver.hits("/once").len(), 1, "exactly one arrival");
    sys.stop().await;
}

/// A hint can overtake its own commit: Postgres flushes a commit record (which the walsender
/// may decode and the relay announce) before the transaction is visible to other snapshots.
/// Here the hint is produced while the Delivery's transaction is still open: the worker's
/// claim does not see the row, claims again, and delivers it once the commit is visible,
/// instead of dropping the hint (which would leave it to the stranded sweep, an hour later).
#[tokio::test]
async fn a_hint_that_overtakes_its_commit_is_claimed_once_the_commit_is_visible() {
    let (receiver, base) = Receiver::start(|_, _| Act::Status(200)).await;
    let sys = System::start_kafka(|_| {}).await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/late")], &spec(&[1], 3, 5)).await;
    let first = fixture.ingest(&sys.pool, "order.created").await.remove(0);
    sys.wait_status(&first, "SUCCESS", Duration::from_secs(30)).await;

    let writer = sys.db.client().await;
    writer.batch_execute("BEGIN").await.unwrap();
    let late = uuid::Uuid::new_v4();
    let first_id: railhook_core::DeliveryId = first.parse().unwrap();
    railhook_testkit::relay::insert_delivery_copy(&writer, late, first_id.0).await;
    let late_text = railhook_core::DeliveryId(late).to_string();
    let hint = serde_json::json!({"v": 1, "delivery_id": late_text, "reason": "created", "outbox_id": 1, "created_at": "x"}).to_string();
    let producer = railhook_kafka::idempotent_producer(&sys.config.kafka, 100).unwrap();
    let endpoint = fixture.endpoints[0].to_string();
    producer
        .send(rdkafka::producer::FutureRecord::to(&sys.config.deliveries_topic()).key(&endpoint).payload(&hint), Duration::from_secs(10))
        .await
        .unwrap();
    eventually(Duration::from_secs(30), "a claim that did not see the Delivery", || async {
        (sys.worker.metrics.claims_unseen.get() >= 1).then_some(())
    })
    .await;
    assert_eq!(receiver.hits("/late").len(), 1, "nothing sent for the uncommitted Delivery");
    writer.batch_execute("COMMIT").await.unwrap();
    // Had the hint been dropped, nothing would announce the late Delivery for an hour (the
    // stranded sweep): arriving within 30 s is the proof. (`claims_lost` is no proof either
    // way: the relay may announce the first Delivery twice, and its second hint claims
    // nothing.)
    sys.wait_status(&late_text, "SUCCESS", Duration::from_secs(30)).await;
    assert_eq!(receiver.hits("/late").len(), 2, "the first Delivery and the late one, once each");
    sys.stop().await;
}

/// Duplicate window 7: a stalled Attempt's Delivery is swept back to PENDING and delivered
/// by another run; when the stalled one finally finishes (with a 500), its finalise finds
/// the Claim gone and queues no successor. Two arrivals (window 8: the receiver dedupes by
/// webhook-id), one outcome, no third request.
#[tokio::test]
async fn a_swept_attempt_that_finishes_late_queues_no_successor() {
    // The sweep's timeout (2 s) is the margin every claim-to-finalise must stay within, or
    // the sweep takes that run too (with 1 s a loaded CI machine once swept run after run
    // for 30 s); the stall (6 s) outlasts the timeout and the next sweep round.
    let (receiver, base) = Receiver::start(|_, n| if n == 0 { Act::Slow(Duration::from_secs(6), 500) } else { Act::Status(200) }).await;
    let sys = System::start(|c| c.worker.processing_timeout_seconds = 2).await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/stall")], &spec(&[1], 5, 10)).await;
    let delivery = fixture.ingest(&sys.pool, "order.created").await.remove(0);
    let succeeded = tokio::time::timeout(Duration::from_secs(30), sys.wait_status(&delivery, "SUCCESS", Duration::from_secs(31))).await;
    if succeeded.is_err() {
        let swept = sys.worker.metrics.swept.with_label_values(&["processing_timeout"]).get();
        panic!(
            "not SUCCESS within 30 s: {:?}, attempts {:?}, {} requests, {swept} swept, {} fences lost",
            sys.status(&delivery).await,
            sys.attempts(&delivery).await,
            receiver.hits("/stall").len(),
            sys.worker.metrics.fence_lost.get()
        );
    }
    eventually(Duration::from_secs(30), "the stalled Attempt to finish and lose its fence", || async {
        (sys.worker.metrics.fence_lost.get() == 1).then_some(())
    })
    .await;
    let (status, attempt_count) = sys.status(&delivery).await;
    assert_eq!((status.as_str(), attempt_count), ("SUCCESS", 1), "the late 500 changed nothing");
    let id: railhook_core::DeliveryId = delivery.parse().unwrap();
    let next: Option<chrono::DateTime<chrono::Utc>> = sys.client.query_one("SELECT next_retry_at FROM deliveries WHERE id = $1", &[&id.0]).await.unwrap().get(0);
    assert_eq!(next, None, "no successor queued");
    let hits = receiver.hits("/stall");
    assert_eq!(hits.len(), 2);
    assert_eq!(hits[0].headers["webhook-id"], hits[1].headers["webhook-id"]);
    // Both Attempts are on record: the late 500 and the 200.
    let mut codes: Vec<Option<i32>> = sys.attempts(&delivery).await.iter().map(|a| a.1).collect();
    codes.sort();
    assert_eq!(codes, vec![Some(200), Some(500)]);
    sys.stop().await;
}

/// 6.6: an endpoint that never answers shares the only partition with a healthy one; the
/// healthy endpoint's deliveries are not held up behind it.
#[tokio::test]
async fn a_dead_endpoint_does_not_delay_a_healthy_one_on_its_partition() {
    let (receiver, base) = Receiver::start(|path, _| if path == "/dead" { Act::Hang } else { Act::Status(200) }).await;
    let sys = System::start(|_| {}).await;
    let urls = [format!("{base}/dead"), format!("{base}/healthy")];
    let (fixture, _) = Fixture::create_with(&sys.client, &urls, &spec(&[60], 3, 10)).await;
    let mut healthy = Vec::new();
    let mut created = HashMap::new();
    for _ in 0..20 {
        let started = Instant::now();
        let ids = fixture.ingest(&sys.pool, "order.created").await;
        for d in ids {
            created.insert(d.clone(), started);
            healthy.push(d);
        }
    }
    // Every healthy Delivery arrives while the dead endpoint's 20 Attempts hang.
    eventually(Duration::from_secs(30), "the healthy endpoint's 20 deliveries", || async {
        (receiver.hits("/healthy").len() >= 20).then_some(())
    })
    .await;
    let dead_hits = receiver.hits("/dead");
    // Each healthy Delivery's delay: from its event's ingest to its arrival.
    let delays: Vec<Duration> = receiver
        .hits("/healthy")
        .iter()
        .map(|h| h.at - created[h.headers["webhook-id"].to_str().unwrap()])
        .collect();
    let worst = delays.iter().max().copied().unwrap();
    let mut sorted = delays.clone();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    eprintln!("isolation: healthy endpoint delay median {median:?}, worst {worst:?}, while {} Attempts to the dead endpoint on the same partition hung", dead_hits.len());
    assert!(dead_hits.len() >= 10, "the dead endpoint's Attempts were running meanwhile");
    assert!(worst < Duration::from_secs(2), "a healthy delivery waited {worst:?}");
    sys.stop().await;
}


/// 6.4: at most `worker.endpoint_concurrency` Attempts per endpoint and
/// `worker.project_concurrency` per project at once, with two worker processes sharing the
/// work; the Deferrals spend no Attempt.
#[tokio::test]
async fn concurrency_limits_hold_across_two_workers_and_spend_no_attempt() {
    let (receiver, base) = Receiver::start(|_, _| Act::Slow(Duration::from_millis(300), 200)).await;
    let sys = System::start_kafka(|c| {
        c.kafka.partitions = 4;
        c.worker.endpoint_concurrency = 2;
        c.worker.project_concurrency = 3;
    })
    .await;
    let second = Worker::start(&sys.config);
    let urls: Vec<String> = (0..4).map(|i| format!("{base}/ep{i}")).collect();
    let (fixture, _) = Fixture::create_with(&sys.client, &urls, &spec(&[1], 3, 10)).await;
    let mut deliveries = Vec::new();
    for _ in 0..6 {
        deliveries.extend(fixture.ingest(&sys.pool, "order.created").await);
    }
    assert_eq!(deliveries.len(), 24);
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(&sys.client, "SELECT count(*) FROM deliveries WHERE status <> 'SUCCESS'").await > 0 {
        if Instant::now() > deadline {
            let rows = sys
                .client
                .query("SELECT id::text, status::text, attempt_count, next_retry_at::text, claim_token::text, last_announced_at::text, now()::text FROM deliveries WHERE status <> 'SUCCESS'", &[])
                .await
                .unwrap();
            let rows: Vec<Vec<Option<String>>> = rows.iter().map(|r| (0..7).map(|i| if i == 2 { Some(r.get::<_, i32>(2).to_string()) } else { r.get(i) }).collect()).collect();
            // Where are the stuck Deliveries' announcements, and what did the group commit?
            use rdkafka::consumer::{BaseConsumer, Consumer};
            use rdkafka::Message;
            let topic = sys.config.deliveries_topic();
            let reader: BaseConsumer = railhook_kafka::client_config(&sys.config.kafka).set("group.id", format!("dbg{}", uuid::Uuid::new_v4().simple())).set("auto.offset.reset", "earliest").create().unwrap();
            reader.subscribe(&[&topic]).unwrap();
            let stuck: Vec<String> = rows.iter().map(|r| railhook_core::DeliveryId(r[0].as_ref().unwrap().parse().unwrap()).to_string()).collect();
            let mut found = Vec::new();
            let until = Instant::now() + Duration::from_secs(10);
            while Instant::now() < until {
                if let Some(Ok(m)) = reader.poll(Duration::from_millis(200)) {
                    let v = String::from_utf8_lossy(m.payload().unwrap_or_default()).to_string();
                    if stuck.iter().any(|d| v.contains(d.as_str())) {
                        found.push((m.partition(), m.offset(), v));
                    }
                }
            }
            let group: BaseConsumer = railhook_kafka::client_config(&sys.config.kafka).set("group.id", &sys.config.worker.group_id).create().unwrap();
            let mut tpl = rdkafka::TopicPartitionList::new();
            for p in 0..4 {
                tpl.add_partition(&topic, p);
            }
            let committed = group.committed_offsets(tpl, Duration::from_secs(5)).map(|t| t.elements().iter().map(|e| (e.partition(), format!("{:?}", e.offset()))).collect::<Vec<_>>());
            let activity = sys.client.query("SELECT state, wait_event_type, wait_event, left(query, 80) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()", &[]).await.unwrap();
            let activity: Vec<Vec<Option<String>>> = activity.iter().map(|r| (0..4).map(|i| r.get(i)).collect()).collect();
            panic!(
                "unsettled: {rows:?}; their announcements {found:?}; committed {committed:?}; scheduled {} + {}; in flight {} + {}; bad {} + {}; activity {activity:?}",
                sys.worker.metrics.scheduled.get(),
                second.metrics.scheduled.get(),
                sys.worker.metrics.in_flight.get(),
                second.metrics.in_flight.get(),
                sys.worker.metrics.bad_messages.get(),
                second.metrics.bad_messages.get()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deferred: u64 = [&sys.worker.metrics, &second.metrics].iter().map(|m| m.deferrals.with_label_values(&["project_concurrency"]).get() + m.deferrals.with_label_values(&["endpoint_concurrency"]).get()).sum();
    let busy: u64 = [&sys.worker.metrics, &second.metrics].iter().map(|m| m.claims_busy.with_label_values(&["project_concurrency"]).get() + m.claims_busy.with_label_values(&["endpoint_concurrency"]).get()).sum();
    let (_, most) = receiver.concurrency("*");
    let per_endpoint: Vec<usize> = (0..4).map(|i| receiver.concurrency(&format!("/ep{i}")).1).collect();
    eprintln!("concurrency: at most {most} at once in the project, {per_endpoint:?} per endpoint; {deferred} deferrals, {busy} busy claims");
    assert!(most <= 3, "project limit: {most} at once");
    assert!(per_endpoint.iter().all(|&m| m <= 2), "endpoint limit: {per_endpoint:?}");
    // The limits were waited out in the workers' per-Endpoint queues, not deferred through
    // the retry path: the project limit (shared by both workers) answered busy claims.
    assert!(busy > 0, "the project limit bit");
    assert_eq!(deferred, 0, "a limit that bites is waited out, not deferred");
    assert_eq!(receiver.all_hits(), 24, "one request per Delivery");
    assert_eq!(count(&sys.client, "SELECT count(*) FROM attempts").await, 24, "Deferrals spent no Attempt");
    assert_eq!(count(&sys.client, "SELECT coalesce(sum(attempt_count), 0)::bigint FROM deliveries").await, 24);
    second.stop().await;
    sys.stop().await;
}

/// Every worker connection names itself, so an operator can tell its load apart in
/// `pg_stat_activity`.
#[tokio::test]
async fn the_worker_connections_show_their_application_name() {
    let (_receiver, base) = Receiver::start(|_, _| Act::Status(200)).await;
    let sys = System::start(|_| {}).await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/named")], &spec(&[1], 3, 10)).await;
    let d = fixture.ingest(&sys.pool, "order.created").await.remove(0);
    sys.wait_status(&d, "SUCCESS", Duration::from_secs(30)).await;
    let named = count(&sys.client, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'railhook-worker'").await;
    assert!(named >= 1, "no connection named railhook-worker");
    sys.stop().await;
}

/// A hot endpoint under its concurrency limit: every Delivery waits in the worker's queue
/// for a free slot, never more than the limit at once at the receiver, and not one Deferral.
#[tokio::test]
async fn a_hot_endpoint_waits_in_its_queue_at_the_limit_without_deferrals() {
    let (receiver, base) = Receiver::start(|_, _| Act::Slow(Duration::from_millis(20), 200)).await;
    let sys = System::start(|c| c.worker.endpoint_concurrency = 3).await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/hot")], &spec(&[1], 3, 10)).await;
    let mut deliveries = Vec::new();
    for _ in 0..150 {
        deliveries.extend(fixture.ingest(&sys.pool, "order.created").await);
    }
    for d in &deliveries {
        sys.wait_status(d, "SUCCESS", Duration::from_secs(60)).await;
    }
    let (_, most) = receiver.concurrency("/hot");
    let m = &sys.worker.metrics;
    let deferred: u64 = DeferralReason::ALL.iter().map(|r| m.deferrals.with_label_values(&[r.as_str()]).get()).sum();
    eprintln!("hot endpoint: at most {most} at once; {deferred} deferrals; {} busy claims", m.claims_busy.with_label_values(&["endpoint_concurrency"]).get());
    assert!(most <= 3, "the limit held: {most} at once");
    assert!(most >= 2, "the limit was used, not serialised: {most} at once");
    assert_eq!(deferred, 0, "waited in the queue, not deferred");
    assert_eq!(receiver.hits("/hot").len(), 150, "one request per Delivery");
    assert_eq!(m.queue_waiting.get(), 0, "the queue drained");
    sys.stop().await;
}

/// The Project's concurrency waits in the worker as well (issue 30): once a claim of each
/// Endpoint told the worker its Project, a burst to four Endpoints of one Project has at most
/// `worker.project_concurrency` requests at once and not one claim comes back busy from
/// Postgres: the worker holds the rest in its queues instead of claiming them.
#[tokio::test]
async fn a_project_at_its_limit_waits_in_the_worker_without_busy_claims() {
    let (receiver, base) = Receiver::start(|_, _| Act::Slow(Duration::from_millis(20), 200)).await;
    let sys = System::start(|c| c.worker.project_concurrency = 3).await;
    let urls: Vec<String> = (0..4).map(|i| format!("{base}/p{i}")).collect();
    let (fixture, _) = Fixture::create_with(&sys.client, &urls, &spec(&[1], 3, 10)).await;
    // One Delivery to each Endpoint first: their claims tell the worker the Project.
    for d in fixture.ingest(&sys.pool, "order.created").await {
        sys.wait_status(&d, "SUCCESS", Duration::from_secs(30)).await;
    }
    let m = &sys.worker.metrics;
    let busy = || m.claims_busy.with_label_values(&["project_concurrency"]).get();
    let busy_before = busy();
    let mut deliveries = Vec::new();
    for _ in 0..40 {
        deliveries.extend(fixture.ingest(&sys.pool, "order.created").await);
    }
    for d in &deliveries {
        sys.wait_status(d, "SUCCESS", Duration::from_secs(60)).await;
    }
    let (_, most) = receiver.concurrency("*");
    let deferred: u64 = DeferralReason::ALL.iter().map(|r| m.deferrals.with_label_values(&[r.as_str()]).get()).sum();
    eprintln!("one project, four endpoints: at most {most} at once; {} busy claims in the burst; {deferred} deferrals", busy() - busy_before);
    assert!(most <= 3, "the project's limit held: {most} at once");
    assert!(most >= 2, "the limit was used, not serialised: {most} at once");
    assert_eq!(busy() - busy_before, 0, "the worker waited for the project's slots instead of claiming over them");
    assert_eq!(deferred, 0, "waited in the queues, not deferred");
    assert_eq!(receiver.all_hits(), 164, "one request per Delivery");
    sys.stop().await;
}

/// The endpoint's `rate_limit_per_second`: 8 Deliveries at 2 per second need 4 one-second
/// windows, so the first and the last arrive more than 2 s apart.
#[tokio::test]
async fn the_endpoint_rate_limit_spaces_attempts() {
    let (receiver, base) = Receiver::start(|_, _| Act::Status(200)).await;
    let sys = System::start(|_| {}).await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/rated")], &spec(&[1], 3, 10)).await;
    sys.client.execute("UPDATE endpoints SET rate_limit_per_second = 2", &[]).await.unwrap();
    let mut deliveries = Vec::new();
    for _ in 0..8 {
        deliveries.extend(fixture.ingest(&sys.pool, "order.created").await);
    }
    for d in &deliveries {
        sys.wait_status(d, "SUCCESS", Duration::from_secs(60)).await;
    }
    let hits = receiver.hits("/rated");
    assert_eq!(hits.len(), 8);
    let spread = hits.iter().map(|h| h.at).max().unwrap() - hits.iter().map(|h| h.at).min().unwrap();
    eprintln!("rate limit 2/s: 8 deliveries spread over {spread:?}");
    assert!(spread >= Duration::from_millis(1_900), "8 at 2/s arrived within {spread:?}");
    assert!(sys.worker.metrics.claims_busy.with_label_values(&["endpoint_rate"]).get() > 0, "the rate window was waited out");
    assert_eq!(sys.worker.metrics.deferrals.with_label_values(&["endpoint_rate"]).get(), 0, "not deferred through the retry path");
    assert_eq!(count(&sys.client, "SELECT count(*) FROM attempts").await, 8);
    sys.stop().await;
}

/// The circuit breaker: three failures in a row open it (min volume 3, ratio 0.5); during
/// the cool-down nothing is sent; then one probe; a failed probe reopens it, a successful
/// one closes it.
#[tokio::test]
async fn the_circuit_opens_defers_probes_and_closes() {
    let (receiver, base) = Receiver::start(|_, n| if n < 4 { Act::Status(500) } else { Act::Status(200) }).await;
    let sys = System::start(|c| {
        c.worker.endpoint_concurrency = 1;
        c.worker.circuit_min_requests = 3;
        c.worker.circuit_failure_ratio = 0.5;
        c.worker.circuit_cooldown_seconds = 2;
    })
    .await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/breaker")], &spec(&[1], 10, 10)).await;
    let mut deliveries = Vec::new();
    for _ in 0..3 {
        deliveries.extend(fixture.ingest(&sys.pool, "order.created").await);
    }
    let m = &sys.worker.metrics;
    let change = |c: &str| m.circuit_changes.with_label_values(&[c]).get();
    eventually(Duration::from_secs(30), "the circuit to open", || async { (change("opened") == 1).then_some(()) }).await;
    let at_open = receiver.hits("/breaker").len();
    assert_eq!(at_open, 3, "opened after the third failure");
    eventually(Duration::from_secs(30), "the failed probe to reopen it", || async { (change("reopened") == 1).then_some(()) }).await;
    assert_eq!(receiver.hits("/breaker").len(), 4, "exactly one probe after the cool-down");
    eventually(Duration::from_secs(30), "the next probe to close it", || async { (change("closed") == 1).then_some(()) }).await;
    // The fifth request was the probe that closed it (the receiver answers 200 from the
    // fifth on); once closed, a Delivery waiting in the endpoint's queue may follow at once.
    let hits = receiver.hits("/breaker");
    assert!(hits.len() >= 5, "{} requests", hits.len());
    assert!(hits[3].at - hits[2].at >= Duration::from_millis(1_900), "the cool-down held: {:?}", hits[3].at - hits[2].at);
    assert!(m.deferrals.with_label_values(&["circuit_open"]).get() > 0, "retries were deferred while open");
    for d in &deliveries {
        sys.wait_status(d, "SUCCESS", Duration::from_secs(60)).await;
    }
    sys.stop().await;
}

/// 9: SIGTERM lets Attempts in flight finish within the grace period, and releases the
/// Claims of those that outlive it: no Attempt spent, nothing left PROCESSING.
#[tokio::test]
async fn shutdown_finishes_in_flight_attempts_then_releases_the_rest() {
    let (receiver, base) = Receiver::start(|path, _| if path == "/slow" { Act::Slow(Duration::from_millis(800), 200) } else { Act::Hang }).await;
    let sys = System::start(|c| c.worker.shutdown_grace_ms = 3_000).await;
    let urls = [format!("{base}/slow"), format!("{base}/hang")];
    let (fixture, _) = Fixture::create_with(&sys.client, &urls, &spec(&[60], 3, 20)).await;
    let deliveries = fixture.ingest(&sys.pool, "order.created").await;
    eventually(Duration::from_secs(30), "both requests in flight", || async { (receiver.concurrency("*").0 == 2).then_some(()) }).await;
    let started = Instant::now();
    let System { db, config, client, pool, relay, relay_metrics, worker } = sys;
    worker.stop().await;
    let took = started.elapsed();
    let sys = System { db, config, client, pool, relay, relay_metrics, worker: Worker::start_paused() };
    eprintln!("shutdown: drained in {took:?}");
    assert!(took >= Duration::from_millis(2_500) && took < Duration::from_secs(10), "waited the grace period: {took:?}");
    let statuses: Vec<(String, i32)> = futures::future::join_all(deliveries.iter().map(|d| sys.status(d))).await;
    let slow = statuses[0].clone();
    let hang = statuses[1].clone();
    assert_eq!(slow, ("SUCCESS".to_string(), 1), "the slow Attempt finished within the grace period");
    assert_eq!(hang, ("PENDING".to_string(), 0), "the hanging one was released, no Attempt spent");
    assert_eq!(count(&sys.client, "SELECT count(*) FROM deliveries WHERE status = 'PROCESSING'").await, 0);
    assert_eq!(count(&sys.client, "SELECT count(*) FROM attempts").await, 1);
    // Released due now: the next worker's retry scheduler sends it again at once (its hint's
    // offset was stored at the claim, so no hint brings it back), not the stranded sweep an
    // hour later.
    let due: bool = sys.client.query_one("SELECT next_retry_at <= now() FROM deliveries WHERE id = $1", &[&deliveries[1].parse::<railhook_core::DeliveryId>().unwrap()]).await.unwrap().get::<_, Option<bool>>(0).unwrap_or(false);
    assert!(due, "the released Delivery is due");
    if transport_from_env() == railhook_config::TransportKind::Kafka {
        // (On inline a worker's announcements come from its own process's relay: a second
        // worker here would hear nothing.)
        let System { db, config, client, pool, relay, relay_metrics, worker: _ } = sys;
        let sys = System { worker: Worker::start(&config), db, config, client, pool, relay, relay_metrics };
        eventually(Duration::from_secs(30), "the released Delivery sent again", || async { (receiver.hits("/hang").len() == 2).then_some(()) }).await;
        sys.stop().await;
    } else {
        sys.stop().await;
    }
}

/// 6.4 sweeps: a stranded PENDING Delivery (announcement lost) is announced again and
/// delivered; the hard caps send an outgoing Delivery past 96 h and an incoming Forward past
/// 24 h to Failed Messages, while younger ones stay.
#[tokio::test]
async fn sweeps_reannounce_stranded_deliveries_and_apply_the_hard_caps() {
    let (receiver, base) = Receiver::start(|_, _| Act::Status(200)).await;
    let sys = System::start(|c| c.worker.stranded_after_seconds = 2).await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/stranded")], &spec(&[1], 3, 5)).await;
    // A Delivery whose announcement was lost: written with no outbox row.
    let delivery = fixture.ingest(&sys.pool, "order.created").await.remove(0);
    sys.wait_status(&delivery, "SUCCESS", Duration::from_secs(30)).await;
    let id: railhook_core::DeliveryId = delivery.parse().unwrap();
    sys.client
        .execute("UPDATE deliveries SET status = 'PENDING', attempt_count = 0, completed_at = NULL, last_announced_at = now() - interval '1 hour' WHERE id = $1", &[&id.0])
        .await
        .unwrap();
    sys.wait_status(&delivery, "SUCCESS", Duration::from_secs(30)).await;
    assert_eq!(receiver.hits("/stranded").len(), 2, "announced again by the sweep and delivered");

    // The outgoing cap: one Delivery whose ladder started 97 h ago, waiting for a retry.
    let old = fixture.ingest(&sys.pool, "order.created").await.remove(0);
    sys.wait_status(&old, "SUCCESS", Duration::from_secs(30)).await;
    let old_id: railhook_core::DeliveryId = old.parse().unwrap();
    sys.client
        .execute(
            "UPDATE deliveries SET status = 'PENDING', next_retry_at = now() + interval '1 hour', completed_at = NULL, ladder_started_at = now() - interval '97 hours' WHERE id = $1",
            &[&old_id.0],
        )
        .await
        .unwrap();
    sys.wait_status(&old, "FAILED", Duration::from_secs(30)).await;

    // The incoming cap, on Forwards (25 h old fails, 1 h old stays).
    let project = fixture.project.0;
    sys.client
        .batch_execute(&format!(
            "INSERT INTO sources (id, project_id, name, provider, secret, ingress_token) VALUES ('00000000-0000-7000-8000-000000000001', '{project}', 's', 'stripe', 'x', 'tok-{project}');
             INSERT INTO destinations (id, project_id, source_id, url) VALUES ('00000000-0000-7000-8000-000000000002', '{project}', '00000000-0000-7000-8000-000000000001', 'http://127.0.0.1:9/');
             INSERT INTO incoming_events (id, project_id, source_id, provider_event_id, method, headers, body) VALUES
               ('00000000-0000-7000-8000-000000000003', '{project}', '00000000-0000-7000-8000-000000000001', 'a', 'POST', '{{}}', ''),
               ('00000000-0000-7000-8000-000000000004', '{project}', '00000000-0000-7000-8000-000000000001', 'b', 'POST', '{{}}', '');
             INSERT INTO forwards (id, project_id, incoming_event_id, destination_id, max_attempts, retry_delays, timeout_seconds, next_retry_at, ladder_started_at) VALUES
               ('00000000-0000-7000-8000-000000000005', '{project}', '00000000-0000-7000-8000-000000000003', '00000000-0000-7000-8000-000000000002', 5, '{{60}}', 30, now() + interval '1 hour', now() - interval '25 hours'),
               ('00000000-0000-7000-8000-000000000006', '{project}', '00000000-0000-7000-8000-000000000004', '00000000-0000-7000-8000-000000000002', 5, '{{60}}', 30, now() + interval '1 hour', now() - interval '1 hour');"
        ))
        .await
        .unwrap();
    eventually(Duration::from_secs(30), "the 25 h old Forward to fail", || async {
        let s: String = sys.client.query_one("SELECT status::text FROM forwards WHERE id = '00000000-0000-7000-8000-000000000005'", &[]).await.unwrap().get(0);
        (s == "FAILED").then_some(())
    })
    .await;
    let young: String = sys.client.query_one("SELECT status::text FROM forwards WHERE id = '00000000-0000-7000-8000-000000000006'", &[]).await.unwrap().get(0);
    assert_eq!(young, "PENDING");
    assert!(sys.worker.metrics.swept.with_label_values(&["stranded"]).get() >= 1);
    assert_eq!(sys.worker.metrics.swept.with_label_values(&["hard_cap_incoming"]).get(), 1);
    sys.stop().await;
}

/// `worker.project_rate_limit_per_second` across the project's endpoints: 8 Deliveries to
/// two endpoints at 2 per second need 4 one-second windows.
#[tokio::test]
async fn the_project_rate_limit_spans_its_endpoints() {
    let (receiver, base) = Receiver::start(|_, _| Act::Status(200)).await;
    let sys = System::start(|c| c.worker.project_rate_limit_per_second = 2).await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/a"), format!("{base}/b")], &spec(&[1], 3, 10)).await;
    let mut deliveries = Vec::new();
    for _ in 0..4 {
        deliveries.extend(fixture.ingest(&sys.pool, "order.created").await);
    }
    assert_eq!(deliveries.len(), 8);
    for d in &deliveries {
        sys.wait_status(d, "SUCCESS", Duration::from_secs(60)).await;
    }
    let hits: Vec<Instant> = receiver.hits.lock().unwrap().iter().map(|h| h.at).collect();
    assert_eq!(hits.len(), 8);
    let spread = *hits.iter().max().unwrap() - *hits.iter().min().unwrap();
    eprintln!("project rate limit 2/s over 2 endpoints: 8 deliveries spread over {spread:?}");
    assert!(spread >= Duration::from_millis(1_900), "8 at 2/s arrived within {spread:?}");
    assert!(sys.worker.metrics.claims_busy.with_label_values(&["project_rate"]).get() > 0, "the rate window was waited out");
    assert_eq!(sys.worker.metrics.deferrals.with_label_values(&["project_rate"]).get(), 0, "not deferred through the retry path");
    sys.stop().await;
}
