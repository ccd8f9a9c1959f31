//! The Delivery lifecycle's owner against the real Postgres: the advisory-lock registry (the
//! sweep no longer waits on `railhook migrate`), and admission decided in the claim alone (a
//! disabled endpoint is a Deferral of the claim statement, not a claim released afterwards).

use railhook_core::{ClaimToken, DeferralReason, DeliveryId};
use railhook_store::lifecycle::{self, ClaimRequest, ClaimResult, Limits, SweepLimits};
use railhook_store::locks;
use railhook_testkit::relay::Fixture;

const LIMITS: Limits = Limits { endpoint_concurrency: 0, project_concurrency: 0, project_rate: 0, circuit_cooldown_s: 30.0, probe_timeout_s: 300.0, ordering_gap_s: 60.0, synchronous_commit: false };

#[tokio::test]
async fn the_sweep_runs_while_migrate_holds_its_lock() {
    let (db, pool, _fixture) = Fixture::in_fresh_db(1).await;
    // `railhook migrate` holds its session-level lock for the whole run.
    let migrating = db.client().await;
    migrating.execute("SELECT pg_advisory_lock($1)", &[&locks::MIGRATE.key]).await.unwrap();
    let limits = SweepLimits { processing_timeout_s: 300.0, stranded_s: 3600.0, outgoing_max_age_s: 345_600.0, incoming_max_age_s: 86_400.0, batch: 10 };
    let mut client = pool.get().await.unwrap();
    let swept = lifecycle::sweep(&mut client, &limits).await.unwrap();
    assert!(swept.is_some(), "the sweep found its lock taken: it shares a key with the migrator");
    // And the sweep still excludes a second sweeper.
    let holder = db.client().await;
    holder.batch_execute("BEGIN").await.unwrap();
    holder.execute("SELECT pg_advisory_xact_lock($1)", &[&locks::SWEEP.key]).await.unwrap();
    assert!(lifecycle::sweep(&mut client, &limits).await.unwrap().is_none(), "a second sweeper ran beside the first");
    holder.batch_execute("ROLLBACK").await.unwrap();
}

#[tokio::test]
async fn a_disabled_endpoint_is_deferred_by_the_claim_itself() {
    let (db, pool, fixture) = Fixture::in_fresh_db(2).await;
    let admin = db.client().await;
    let deliveries = fixture.ingest(&pool, "order.created").await;
    // Disabled after the ingest made its Delivery (the ingest skips disabled endpoints).
    admin.execute("UPDATE endpoints SET enabled = false WHERE id = $1", &[&fixture.endpoints[0].0]).await.unwrap();
    let requests: Vec<ClaimRequest> = deliveries
        .iter()
        .map(|d| ClaimRequest { delivery: d.parse::<DeliveryId>().unwrap(), token: ClaimToken::new(), hint: None, wait: false, announced_at: None, position: None })
        .collect();
    let results = lifecycle::claim_batch(&pool.get().await.unwrap(), &requests, &LIMITS).await.unwrap();
    let mut deferred = 0;
    for (request, result) in requests.iter().zip(&results) {
        let row = admin
            .query_one("SELECT endpoint_id, status::text, EXTRACT(EPOCH FROM next_retry_at - now())::float8 FROM deliveries WHERE id = $1", &[&request.delivery])
            .await
            .unwrap();
        let (endpoint, status, due_in): (uuid::Uuid, String, Option<f64>) = (row.get(0), row.get(1), row.get(2));
        if endpoint == fixture.endpoints[0].0 {
            assert!(matches!(result, ClaimResult::Deferred(DeferralReason::EndpointDisabled)), "{result:?}");
            assert_eq!(status, "PENDING", "a Deferral leaves the Delivery PENDING");
            let due_in = due_in.expect("due again later");
            assert!((50.0..=61.0).contains(&due_in), "due again in about a minute, not {due_in}");
            deferred += 1;
        } else {
            assert!(matches!(result, ClaimResult::Claimed(_)), "{result:?}");
            assert_eq!(status, "PROCESSING");
        }
    }
    assert_eq!(deferred, 1);
    let attempts: i64 = admin.query_one("SELECT count(*) FROM attempts", &[]).await.unwrap().get(0);
    assert_eq!(attempts, 0, "a Deferral spends no Attempt");
}

/// After a Postgres crash a claim committed without its WAL flush may be forgotten: its
/// Delivery is PENDING, unclaimed, and its hint was consumed. Such rows were last announced
/// before the server started; the worker announces them again once per server start
/// (`reannounce_after_restart`), and leaves alone what was announced since, what holds a
/// token and what is due later.
#[tokio::test]
async fn deliveries_announced_before_the_server_started_are_announced_again_once() {
    let (db, pool, fixture) = Fixture::in_fresh_db(4).await;
    let admin = db.client().await;
    let deliveries: Vec<uuid::Uuid> = fixture.ingest(&pool, "order.created").await.iter().map(|d| d.parse::<DeliveryId>().unwrap().0).collect();
    assert_eq!(deliveries.len(), 4);
    let before_start = "pg_postmaster_start_time() - interval '1 minute'";
    // 0: a forgotten claim (announced before the start, PENDING, unclaimed, due).
    // 1: announced before the start but holding the scheduler's token (the scheduler's).
    // 2: announced before the start, due only later (a retry's wait).
    // 3: announced after the start (the ingest's own announcement).
    admin.execute(&format!("UPDATE deliveries SET last_announced_at = {before_start} WHERE id = ANY($1)"), &[&deliveries[..3].to_vec()]).await.unwrap();
    admin.execute("UPDATE deliveries SET claim_token = gen_random_uuid() WHERE id = $1", &[&deliveries[1]]).await.unwrap();
    admin.execute("UPDATE deliveries SET next_retry_at = now() + interval '1 hour' WHERE id = $1", &[&deliveries[2]]).await.unwrap();
    let outbox = |id: uuid::Uuid| {
        let admin = &admin;
        async move { admin.query_one("SELECT count(*) FROM outbox WHERE delivery_id = $1 AND reason = 'reannounce'", &[&id]).await.unwrap().get::<_, i64>(0) }
    };
    let client = pool.get().await.unwrap();
    let n = lifecycle::reannounce_after_restart(&**client, 2).await.unwrap();
    assert_eq!(n, 1, "only the forgotten claim's Delivery is announced again");
    assert_eq!(outbox(deliveries[0]).await, 1);
    for other in &deliveries[1..] {
        assert_eq!(outbox(*other).await, 0, "{other} was not to be announced again");
    }
    let after_start: bool = admin
        .query_one("SELECT last_announced_at >= pg_postmaster_start_time() FROM deliveries WHERE id = $1", &[&deliveries[0]])
        .await
        .unwrap()
        .get(0);
    assert!(after_start, "marked as announced now");
    assert_eq!(lifecycle::reannounce_after_restart(&**client, 2).await.unwrap(), 0, "a second run finds nothing");
    let started = lifecycle::server_started_at(&**client).await.unwrap();
    assert!(started < chrono::Utc::now());
}

/// The Replays' pressure check (`replays::PRESSURE_SQL`) reads the open Deliveries
/// (`open_deliveries`, migration 0032), not `deliveries` whole, on a big database.
#[tokio::test]
async fn the_replays_pressure_check_keeps_an_index_plan_on_a_big_database() {
    use railhook_testkit::bigdb::{assert_index_plans, BigDb};
    let big = BigDb::new().await;
    let c = big.db.client().await;
    assert_index_plans(&c, "Replays' pressure", railhook_worker::replays::PRESSURE_SQL, "1100", &["open_deliveries", "deliveries_pkey"]).await;
}
