//! Deleting an Endpoint with a million Deliveries behind it while a light load runs on
//! another Endpoint of the same Project: the load's p99 (ingest to arrival at the receiver)
//! while the delete runs stays within twice its p99 before (issue 31).
//!
//! Not part of `cargo test` (a million rows take a minute to seed): `scripts/delete-under-load`
//! runs it (`--rows N` to size it). The always-run check that the deletes read through
//! indexes is `railhook-store`'s `tests/deletes.rs`.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{spec, Act, Receiver, System};
use railhook_testkit::relay::Fixture;

/// The light load: Events a second to the live Endpoint (the e2e benchmark's light rate is
/// 200/s over 32 connections; one connection here).
const RATE: u64 = 100;
const BASELINE: Duration = Duration::from_secs(20);
/// After the delete returned: what its commit may still hold up (the relay decoding it).
const TAIL: Duration = Duration::from_secs(5);

fn p99(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get((samples.len() * 99).div_ceil(100).saturating_sub(1)).copied().unwrap_or_default()
}

#[tokio::test]
#[ignore = "a million rows: run by scripts/delete-under-load"]
async fn deleting_an_endpoint_with_a_million_deliveries_keeps_the_light_loads_p99_within_2x() {
    let rows: i64 = std::env::var("RAILHOOK_DELETE_UNDER_LOAD_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let (receiver, base) = Receiver::start(|_, _| Act::Status(204)).await;
    let sys = System::start(|_| {}).await;
    let (fixture, _) = Fixture::create_with(&sys.client, &[format!("{base}/live")], &spec(&[1], 5, 10)).await;

    // The Endpoint to delete: its own Subscription (to events the load does not send) and
    // `rows` delivered Events, as months of history leave them.
    let doomed = railhook_core::EndpointId::new();
    let seeded = Instant::now();
    sys.client
        .batch_execute(&format!(
            "INSERT INTO endpoints (id, project_id, url) VALUES ('{d}', '{p}', '{base}/doomed');
             INSERT INTO subscriptions (id, project_id, endpoint_id, event_type_pattern) VALUES (railhook_uuid_v7(), '{p}', '{d}', 'history.*');
             WITH ev AS (
                 INSERT INTO events (id, project_id, event_type, payload, created_at)
                 SELECT railhook_uuid_v7(), '{p}', 'history.made', '{{\"n\": 1}}', now() - interval '30 days' FROM generate_series(1, {rows})
                 RETURNING id, created_at
             )
             INSERT INTO deliveries (id, project_id, event_id, endpoint_id, subscription_id, status, attempt_count, max_attempts, retry_delays,
                                     timeout_seconds, created_at, completed_at)
             SELECT railhook_uuid_v7(), '{p}', ev.id, '{d}', (SELECT id FROM subscriptions WHERE endpoint_id = '{d}'), 'SUCCESS', 1, 7, '{{60}}',
                    30, ev.created_at, ev.created_at
             FROM ev;",
            d = doomed.0,
            p = fixture.project.0,
        ))
        .await
        .unwrap();
    // Each on its own (VACUUM refuses a transaction block): the history as it would be after
    // autovacuum, and its writes out of the way of the measured windows.
    for sql in ["VACUUM ANALYZE events", "VACUUM ANALYZE deliveries", "CHECKPOINT"] {
        sys.client.batch_execute(sql).await.unwrap();
    }
    println!("seeded {rows} Deliveries in {:?}", seeded.elapsed());

    // The load, until told to stop: each Event's ingest start by its Delivery.
    let started: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let stop = tokio_util::sync::CancellationToken::new();
    let load = {
        let (started, stop, pool) = (started.clone(), stop.clone(), sys.pool.clone());
        let fixture = Fixture { project: fixture.project, endpoints: fixture.endpoints.clone() };
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            while !stop.is_cancelled() {
                tick.tick().await;
                let at = Instant::now();
                for d in fixture.ingest(&pool, "order.created").await {
                    started.lock().unwrap().insert(d, at);
                }
            }
        })
    };
    let load_start = Instant::now();
    tokio::time::sleep(BASELINE).await;
    let delete_start = Instant::now();
    let client = sys.pool.get().await.unwrap();
    assert!(railhook_store::endpoints::delete_endpoint(&**client, fixture.project, doomed).await.unwrap());
    let delete_took = delete_start.elapsed();
    tokio::time::sleep(TAIL).await;
    let window_end = Instant::now();
    stop.cancel();
    load.await.unwrap();

    // Every Event of the load arrived; its latency by the window it was ingested in.
    let started = started.lock().unwrap().clone();
    railhook_testkit::eventually(Duration::from_secs(60), "every Event of the load to arrive", || async {
        (receiver.hits("/live").len() >= started.len()).then_some(())
    })
    .await;
    let (mut before, mut during) = (Vec::new(), Vec::new());
    for hit in receiver.hits("/live") {
        let id = hit.headers.get("webhook-id").and_then(|v| v.to_str().ok()).unwrap_or_default();
        let Some(at) = started.get(id) else { continue };
        let latency = hit.at.saturating_duration_since(*at);
        // The first seconds warm the worker's connections up: not the baseline.
        if *at >= load_start + Duration::from_secs(5) && *at < delete_start {
            before.push(latency);
        } else if *at >= delete_start && *at < window_end {
            during.push(latency);
        }
    }
    let left: i64 = sys.client.query_one("SELECT count(*) FROM deliveries WHERE endpoint_id = $1", &[&doomed.0]).await.unwrap().get(0);
    assert_eq!(left, 0, "the Endpoint's Deliveries went with it");
    let (n_before, n_during) = (before.len(), during.len());
    let (p_before, p_during) = (p99(before), p99(during));
    println!(
        "delete of an Endpoint with {rows} Deliveries took {delete_took:?}; light load {RATE}/s: p99 {p_before:?} before ({n_before} Events), \
         {p_during:?} during the delete and {TAIL:?} after ({n_during} Events), ratio {:.2}",
        p_during.as_secs_f64() / p_before.as_secs_f64().max(1e-6)
    );
    assert!(n_during as u64 >= RATE, "the load ran through the delete: {n_during} Events");
    assert!(p_during <= 2 * p_before, "p99 {p_during:?} during the delete against {p_before:?} before");
    sys.stop().await;
}
