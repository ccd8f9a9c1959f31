//! The claim and the finalise of a first Attempt are HOT updates (migration 0032): no index
//! of `deliveries` uses a column either changes, and the page has room for the new row
//! version (`fillfactor`). Measured through the real functions (`claim_batch`,
//! `finalise_batch`) with Postgres' own counters, `n_tup_upd` and `n_tup_hot_upd` of
//! `pg_stat_user_tables`; and the sets the readers need (`open_deliveries`,
//! `delivery_claims`, `failed_at`) stay in step with `status` along the way.

use railhook_core::{ClaimToken, DeliveryId};
use railhook_store::lifecycle::{self as store, AttemptRecord, Circuit, ClaimRequest, ClaimResult, FinaliseRequest, Limits, Next};
use railhook_testkit::relay::Fixture;
use tokio_postgres::GenericClient;

fn limits() -> Limits {
    Limits { endpoint_concurrency: 0, project_concurrency: 0, project_rate: 0, circuit_cooldown_s: 30.0, probe_timeout_s: 300.0, ordering_gap_s: 60.0, synchronous_commit: false }
}

const CIRCUIT: Circuit = Circuit { window_s: 60.0, min_volume: 0, ratio: 1.0 };

fn attempt() -> AttemptRecord {
    AttemptRecord {
        started_at: chrono::Utc::now(),
        duration_ms: 3,
        status_code: Some(200),
        result: "success".into(),
        error_message: None,
        request_headers: serde_json::json!({}),
        response_headers: serde_json::json!({}),
        response_body: "{\"received\":true}".into(),
        response_truncated: false,
    }
}

/// `(n_tup_upd, n_tup_hot_upd)` of `deliveries`, after this backend flushed its counters.
async fn updates(db: &impl GenericClient) -> (i64, i64) {
    db.batch_execute("SELECT pg_stat_force_next_flush()").await.unwrap();
    db.batch_execute("SELECT 1").await.unwrap();
    let r = db.query_one("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'deliveries'", &[]).await.unwrap();
    (r.get(0), r.get(1))
}

/// Claims and finalises (SUCCESS, or `next`) the given Deliveries on `db`, in batches of
/// `batch` as the worker does; how many it claimed.
async fn deliver(db: &deadpool_postgres::Object, ids: &[String], batch: usize, next: impl Fn(usize) -> Next) -> usize {
    let mut claimed_n = 0;
    for (b, chunk) in ids.chunks(batch).enumerate() {
        let requests: Vec<ClaimRequest> = chunk
            .iter()
            .map(|d| ClaimRequest { delivery: d.parse::<DeliveryId>().unwrap(), token: ClaimToken::new(), hint: None, wait: false, announced_at: None, position: None })
            .collect();
        let results = store::claim_batch(db, &requests, &limits()).await.unwrap();
        let finalise: Vec<FinaliseRequest> = results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                ClaimResult::Claimed(c) => Some(FinaliseRequest::new(c, next(b * batch + i), None, attempt(), true)),
                _ => None,
            })
            .collect();
        claimed_n += finalise.len();
        let done = store::finalise_batch(db, &finalise, &CIRCUIT).await.unwrap();
        assert!(done.iter().all(|f| f.wrote), "every finalise held its Claim");
    }
    claimed_n
}

async fn count(db: &impl GenericClient, sql: &str) -> i64 {
    db.query_one(sql, &[]).await.unwrap().get(0)
}

/// `open_deliveries` holds exactly the PENDING and PROCESSING Deliveries, `delivery_claims`
/// exactly the PROCESSING ones under their tokens, and `failed_at` is set exactly on FAILED.
async fn assert_sets_in_step(db: &impl GenericClient) {
    let open_without_row = count(db, "SELECT count(*) FROM deliveries d WHERE d.status IN ('PENDING', 'PROCESSING')
        AND NOT EXISTS (SELECT 1 FROM open_deliveries o WHERE o.delivery_id = d.id)").await;
    assert_eq!(open_without_row, 0, "an open Delivery without its open_deliveries row");
    let ended_with_row = count(db, "SELECT count(*) FROM open_deliveries o
        WHERE NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.id = o.delivery_id AND d.status IN ('PENDING', 'PROCESSING'))").await;
    assert_eq!(ended_with_row, 0, "an open_deliveries row whose Delivery ended");
    let processing_without_claim = count(db, "SELECT count(*) FROM deliveries d WHERE d.status = 'PROCESSING'
        AND NOT EXISTS (SELECT 1 FROM delivery_claims c WHERE c.delivery_id = d.id AND c.claim_token = d.claim_token
                        AND c.project_id = d.project_id AND c.endpoint_id = d.endpoint_id)").await;
    assert_eq!(processing_without_claim, 0, "a PROCESSING Delivery without its Claim's row");
    let claim_without_processing = count(db, "SELECT count(*) FROM delivery_claims c
        WHERE NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.id = c.delivery_id AND d.status = 'PROCESSING' AND d.claim_token = c.claim_token)").await;
    assert_eq!(claim_without_processing, 0, "a Claim's row without its PROCESSING Delivery");
    let failed_at_wrong = count(db, "SELECT count(*) FROM deliveries WHERE (status = 'FAILED') <> (failed_at IS NOT NULL)").await;
    assert_eq!(failed_at_wrong, 0, "failed_at out of step with FAILED");
}

/// The worker's steady state: a few Deliveries arrive, are claimed and finalised, again and
/// again (batches as the hints come, here 4 Events to 2 Endpoints). At least 90 % of the
/// claim's and finalise's updates are HOT (every one, in practice: the page the ingest is
/// filling has the room `fillfactor` keeps, and Postgres prunes the dead versions of the
/// rows finished before).
#[tokio::test]
async fn the_claim_and_the_finalise_of_a_first_attempt_are_hot() {
    let (_db, pool, fixture) = Fixture::in_fresh_db(2).await;
    let worker = pool.get().await.unwrap();
    let before = updates(&**worker).await;
    let mut n = 0;
    for _ in 0..100 {
        let mut ids = Vec::new();
        for _ in 0..4 {
            ids.extend(fixture.ingest(&pool, "order.created").await);
        }
        n += deliver(&worker, &ids, 64, |_| Next::Success).await;
    }
    assert_eq!(n, 800);
    let after = updates(&**worker).await;
    let (upd, hot) = (after.0 - before.0, after.1 - before.1);
    eprintln!("steady: {upd} updates of deliveries, {hot} HOT ({:.1} %)", 100.0 * hot as f64 / upd as f64);
    assert_eq!(upd, 2 * 800, "one update per claim and one per finalise");
    assert!(hot * 10 >= upd * 9, "{hot} of {upd} updates HOT");
    assert_sets_in_step(&**worker).await;
    assert_eq!(count(&**worker, "SELECT count(*) FROM open_deliveries").await, 0);
    assert_eq!(count(&**worker, "SELECT count(*) FROM delivery_claims").await, 0);
}

/// A backlog (1,000 Deliveries waiting) claimed and finalised in the worker's largest
/// batches (64): the claim updates up to 64 neighbouring rows in one transaction, so only as
/// many of a page's rows as its free space holds are HOT until the next transaction can
/// prune; the finalise's updates follow the claim's commit and find the claim's old
/// versions prunable. A tenth fails for good and a tenth goes back on its ladder (not HOT
/// by design: `failed_at` and `next_retry_at` are indexed). Measured: 86 % HOT at
/// fillfactor 50 (migration 0032), 57 % at 70, 14 % at 100.
#[tokio::test]
async fn a_backlog_in_full_batches_is_mostly_hot() {
    let (_db, pool, fixture) = Fixture::in_fresh_db(2).await;
    let worker = pool.get().await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..500 {
        ids.extend(fixture.ingest(&pool, "order.created").await);
    }
    let before = updates(&**worker).await;
    // Every tenth fails for good, every tenth but one goes back on its ladder: the rare paths
    // keep the sets in step too.
    let n = deliver(&worker, &ids, 64, |i| match i % 10 {
        3 => Next::Failed,
        7 => Next::RetryAt(chrono::Utc::now() + chrono::Duration::hours(1)),
        _ => Next::Success,
    })
    .await;
    assert_eq!(n, 1000);
    let after = updates(&**worker).await;
    let (upd, hot) = (after.0 - before.0, after.1 - before.1);
    eprintln!("backlog: {upd} updates of deliveries, {hot} HOT ({:.1} %)", 100.0 * hot as f64 / upd as f64);
    assert_eq!(upd, 2 * 1000);
    assert!(hot * 100 >= upd * 80, "{hot} of {upd} updates HOT");
    assert_sets_in_step(&**worker).await;
    assert_eq!(count(&**worker, "SELECT count(*) FROM open_deliveries").await, 100, "the retries are open");
    assert_eq!(count(&**worker, "SELECT count(*) FROM deliveries WHERE failed_at IS NOT NULL").await, 100);
}
