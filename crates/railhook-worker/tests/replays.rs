//! The Replay runner (issue 17) against the real Postgres: a cancel half-way stops it short;
//! a runner stopped and started again (and two runners at once) make each (replay, event,
//! endpoint) exactly once; and end to end through the relay, Kafka and a worker, replayed
//! Deliveries arrive at a real local receiver with new `webhook-id`s and the same
//! `X-Event-Id`s.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use chrono::Utc;
use common::{count, spec, verifies, Act, Receiver, System};
use railhook_config::ReplayConfig;
use railhook_core::ProjectId;
use railhook_store::replays::{self, CancelOutcome, CreateOutcome, ReplayFilter, ReplayState};
use railhook_testkit::eventually;
use railhook_testkit::relay::Fixture;
use tokio_util::sync::CancellationToken;

/// `n` Events of type `order.paid` stored in the last hour, in one statement.
async fn store_events(client: &tokio_postgres::Client, project: ProjectId, n: i64) {
    client
        .execute(
            "INSERT INTO events (id, project_id, event_type, payload, created_at)
             SELECT railhook_uuid_v7(), $1, 'order.paid', jsonb_build_object('n', i), now() - interval '1 hour' + i * interval '1 ms'
             FROM generate_series(1, $2::bigint) i",
            &[&project, &n],
        )
        .await
        .unwrap();
}

fn last_two_hours() -> ReplayFilter {
    ReplayFilter { from: Utc::now() - chrono::Duration::hours(2), to: Utc::now(), event_types: None, endpoint_ids: None }
}

/// Counts and starts a Replay of the last two hours; its id.
async fn start_replay(pool: &railhook_store::Pool, project: ProjectId) -> (railhook_core::ReplayId, i64) {
    let client = pool.get().await.unwrap();
    let filter = last_two_hours();
    let total = replays::count(&client, project, &filter).await.unwrap();
    match replays::create(&client, project, &filter, total).await.unwrap() {
        CreateOutcome::Created(r) => (r.id, r.total),
        CreateOutcome::AlreadyRunning(_) => panic!("nothing else runs"),
    }
}

struct Runner(CancellationToken, tokio::task::JoinHandle<()>);

impl Runner {
    /// A runner with no pace to speak of (a cap far above what a test makes).
    fn start(pool: &railhook_store::Pool, batch_size: i64) -> Runner {
        Runner::paced(pool, batch_size, 100_000.0)
    }

    fn paced(pool: &railhook_store::Pool, batch_size: i64, max_deliveries_per_second: f64) -> Runner {
        let stop = CancellationToken::new();
        let config = ReplayConfig { batch_size, pause_ms: 5, max_deliveries_per_second, max_range_days: 30 };
        Runner(stop.clone(), tokio::spawn(railhook_worker::replays::run(pool.clone(), config, stop)))
    }

    async fn stop(self) {
        self.0.cancel();
        self.1.await.unwrap();
    }
}

async fn progress(pool: &railhook_store::Pool, project: ProjectId, id: railhook_core::ReplayId) -> (ReplayState, i64) {
    let r = replays::get(&pool.get().await.unwrap(), project, id).await.unwrap().unwrap();
    (r.state, r.made)
}

#[tokio::test]
async fn a_cancel_half_way_leaves_made_below_total() {
    let (db, pool, fixture) = Fixture::in_fresh_db(1).await;
    let client = db.client().await;
    store_events(&client, fixture.project, 2_000).await;
    let (id, total) = start_replay(&pool, fixture.project).await;
    assert_eq!(total, 2_000);
    let runner = Runner::start(&pool, 50);
    eventually(Duration::from_secs(60), "half the replay made", || async {
        (progress(&pool, fixture.project, id).await.1 >= 1_000).then_some(())
    })
    .await;
    match replays::cancel(&pool.get().await.unwrap(), fixture.project, id).await.unwrap() {
        CancelOutcome::Cancelled(r) => assert_eq!(r.state, ReplayState::Cancelled),
        _ => panic!("it was running"),
    }
    let (_, made_at_cancel) = progress(&pool, fixture.project, id).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (state, made) = progress(&pool, fixture.project, id).await;
    runner.stop().await;
    assert_eq!(state, ReplayState::Cancelled);
    assert_eq!(made, made_at_cancel, "nothing is made after the cancel answered");
    assert!((1_000..2_000).contains(&made), "made {made} of {total}");
    assert_eq!(count(&client, "SELECT count(*) FROM deliveries WHERE replay_id IS NOT NULL").await, made);
    assert_eq!(count(&client, "SELECT count(*) FROM outbox WHERE reason = 'replay'").await, made);
}

#[tokio::test]
async fn a_runner_stopped_and_started_again_makes_each_delivery_once() {
    let (db, pool, fixture) = Fixture::in_fresh_db(2).await;
    let client = db.client().await;
    store_events(&client, fixture.project, 2_000).await;
    let (id, total) = start_replay(&pool, fixture.project).await;
    assert_eq!(total, 4_000);
    let first = Runner::start(&pool, 40);
    eventually(Duration::from_secs(60), "part of the replay made", || async {
        (progress(&pool, fixture.project, id).await.1 >= 800).then_some(())
    })
    .await;
    first.stop().await;
    let (state, made) = progress(&pool, fixture.project, id).await;
    assert_eq!(state, ReplayState::Running);
    assert!(made < total, "stopped before the end: {made}");
    assert_eq!(count(&client, "SELECT count(*) FROM deliveries WHERE replay_id IS NOT NULL").await, made, "the cursor moved with its batch");
    // Two runners (two worker processes) take it on from the cursor.
    let (a, b) = (Runner::start(&pool, 40), Runner::start(&pool, 40));
    eventually(Duration::from_secs(120), "the replay completed", || async {
        (progress(&pool, fixture.project, id).await.0 == ReplayState::Completed).then_some(())
    })
    .await;
    a.stop().await;
    b.stop().await;
    assert_eq!(progress(&pool, fixture.project, id).await.1, 4_000);
    let once = "SELECT count(*) FROM (SELECT DISTINCT replay_id, event_id, endpoint_id FROM deliveries WHERE replay_id IS NOT NULL) x";
    assert_eq!(count(&client, once).await, 4_000);
    assert_eq!(count(&client, "SELECT count(*) FROM deliveries WHERE replay_id IS NOT NULL").await, 4_000);
    assert_eq!(count(&client, "SELECT count(*) FROM outbox WHERE reason = 'replay'").await, 4_000);
}

/// Two runners (two worker processes) share one pace: all Replays together make at most
/// `replay.max_deliveries_per_second`. Without the shared pace, each runner would go at its
/// own pause and the two together would finish this replay in well under a second.
#[tokio::test]
async fn two_runners_together_keep_to_the_replay_cap() {
    const RATE: f64 = 400.0;
    const EVENTS: i64 = 1_200;
    let (db, pool, fixture) = Fixture::in_fresh_db(1).await;
    let client = db.client().await;
    store_events(&client, fixture.project, EVENTS).await;
    let (id, total) = start_replay(&pool, fixture.project).await;
    assert_eq!(total, EVENTS);
    // Stands in for the workers' sending: replayed Deliveries leave PENDING as they come, so
    // the runner's backlog check never holds it and the pace alone sets the rate.
    let drain_stop = CancellationToken::new();
    let drain = {
        let (pool, stop) = (pool.clone(), drain_stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let c = pool.get().await.unwrap();
                c.execute("UPDATE deliveries SET status = 'SUCCESS', completed_at = now() WHERE replay_id IS NOT NULL AND status = 'PENDING'", &[]).await.unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let started = std::time::Instant::now();
    let (a, b) = (Runner::paced(&pool, 100, RATE), Runner::paced(&pool, 100, RATE));
    eventually(Duration::from_secs(60), "the replay completed", || async {
        (progress(&pool, fixture.project, id).await.0 == ReplayState::Completed).then_some(())
    })
    .await;
    let took = started.elapsed().as_secs_f64();
    a.stop().await;
    b.stop().await;
    drain_stop.cancel();
    drain.await.unwrap();
    assert_eq!(progress(&pool, fixture.project, id).await.1, EVENTS);
    // The first batch (a tenth of a second's worth: 40 Events) is free; the rest is paced.
    let least = (EVENTS as f64 - RATE / 10.0) / RATE;
    assert!(took >= least * 0.95, "{EVENTS} Deliveries at most {RATE}/s take at least {least:.2} s; took {took:.2} s");
    assert!(took <= least * 3.0 + 5.0, "the pace must not starve the replay: {took:.2} s for {least:.2} s of work");
    // Smooth, not bursts: no batch made more than a tenth of a second's worth.
    let biggest = count(&client, "SELECT max(n) FROM (SELECT count(*) AS n FROM deliveries WHERE replay_id IS NOT NULL GROUP BY created_at) b").await;
    assert!(biggest <= (RATE / 10.0) as i64, "a batch made {biggest} Deliveries");
}

#[tokio::test]
async fn replayed_deliveries_arrive_with_new_ids_and_the_same_event_ids() {
    let (receiver, base) = Receiver::start(|_, _| Act::Status(200)).await;
    let sys = System::start(|c| c.replay.pause_ms = 10).await;
    let (fixture, secrets) = Fixture::create_with(&sys.client, &[format!("{base}/replayed")], &spec(&[1], 3, 5)).await;
    let mut originals = Vec::new();
    for _ in 0..3 {
        originals.extend(fixture.ingest(&sys.pool, "order.created").await);
    }
    for d in &originals {
        sys.wait_status(d, "SUCCESS", Duration::from_secs(30)).await;
    }
    let (id, total) = start_replay(&sys.pool, fixture.project).await;
    assert_eq!(total, 3);
    eventually(Duration::from_secs(30), "the replayed Deliveries to arrive", || async { (receiver.hits("/replayed").len() >= 6).then_some(()) }).await;
    let hits = receiver.hits("/replayed");
    assert_eq!(hits.len(), 6);
    let header = |h: &common::Hit, n: &str| h.headers[n].to_str().unwrap().to_string();
    let (first, replayed) = hits.split_at(3);
    let ids: HashSet<String> = hits.iter().map(|h| header(h, "webhook-id")).collect();
    assert_eq!(ids.len(), 6, "every replayed Delivery has a new webhook-id");
    assert!(first.iter().all(|h| originals.contains(&header(h, "webhook-id"))));
    let events = |hs: &[common::Hit]| hs.iter().map(|h| header(h, "x-event-id")).collect::<HashSet<_>>();
    assert_eq!(events(first), events(replayed), "the same X-Event-Ids");
    assert!(replayed.iter().all(|h| verifies(&secrets[0], &h.headers, &h.body)));
    assert_eq!(progress(&sys.pool, fixture.project, id).await, (ReplayState::Completed, 3));
    sys.stop().await;
}
