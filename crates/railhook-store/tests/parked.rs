//! Parked now against once parked (migration 0037): a Delivery the Ordering Buffer parked,
//! then claimed behind its predecessor and failed, is back on its own Retry Ladder. Its
//! predecessor's finalise does not make it due before its retry delay; the gauges, the API
//! and its successor's claim do not take it for parked; and a Delivery parked now still is
//! all of these (released at once, counted, shown, waited for without a gap timeout).

use chrono::{DateTime, Duration, Utc};
use railhook_core::{ClaimToken, DeliveryId};
use railhook_store::lifecycle::{self as store, AttemptRecord, Circuit, ClaimRequest, ClaimResult, Claimed, FinaliseRequest, Limits, Next};
use railhook_testkit::relay::{Fixture, SubscriptionSpec};
use railhook_testkit::TestDb;

const CIRCUIT: Circuit = Circuit { window_s: 60.0, min_volume: 1000, ratio: 0.5 };

fn limits() -> Limits {
    Limits { endpoint_concurrency: 0, project_concurrency: 0, project_rate: 0, circuit_cooldown_s: 30.0, probe_timeout_s: 300.0, ordering_gap_s: 60.0, synchronous_commit: false }
}

fn request(id: &str, position: i64) -> ClaimRequest {
    ClaimRequest { delivery: id.parse::<DeliveryId>().unwrap(), token: ClaimToken::new(), hint: None, wait: false, announced_at: None, position: Some((0, position)) }
}

fn record(code: i32) -> AttemptRecord {
    AttemptRecord {
        started_at: Utc::now(),
        duration_ms: 3,
        status_code: Some(code),
        result: "http_response".into(),
        error_message: None,
        request_headers: serde_json::json!({}),
        response_headers: serde_json::json!({}),
        response_body: String::new(),
        response_truncated: false,
    }
}

async fn claim(pool: &railhook_store::Pool, request: ClaimRequest, mine: &[ClaimToken]) -> ClaimResult {
    let client = pool.get().await.unwrap();
    store::claim_batch_finishing(&client, &[request], &limits(), &[], mine).await.unwrap().remove(0)
}

fn claimed(result: ClaimResult, what: &str) -> Claimed {
    match result {
        ClaimResult::Claimed(c) => *c,
        other => panic!("{what}: expected a claim, got {other:?}"),
    }
}

/// `(parked, next_retry_at)` of a Delivery.
async fn state(db: &TestDb, id: &str) -> (bool, Option<DateTime<Utc>>) {
    let r = db.client().await.query_one("SELECT parked, next_retry_at FROM deliveries WHERE id = $1", &[&id.parse::<DeliveryId>().unwrap()]).await.unwrap();
    (r.get(0), r.get(1))
}

#[tokio::test]
async fn a_once_parked_delivery_back_on_its_ladder_is_not_parked() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let ordered = SubscriptionSpec { ordering: true, ..SubscriptionSpec::default() };
    let (fixture, _) = Fixture::create_with(&client, &["http://127.0.0.1:9/ordered".to_string()], &ordered).await;
    let pool = railhook_store::build_pool(&railhook_testkit::test_config(&db).database).unwrap();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.extend(fixture.ingest(&pool, "order.paid").await);
    }
    let (a, b, c) = (&ids[0], &ids[1], &ids[2]);

    // A in flight; B's claim parks it behind A.
    let a_claim = claimed(claim(&pool, request(a, 0), &[]).await, "A");
    assert_eq!(a_claim.sequence_number, Some(1));
    let parked = claim(&pool, request(b, 1), &[]).await;
    assert!(matches!(parked, ClaimResult::Deferred(r) if r.as_str() == "ordering"), "B: {parked:?}");
    assert!(state(&db, b).await.0, "B is parked");
    let gauges = store::queue_gauges(&client).await.unwrap();
    assert_eq!(gauges.parked, 1, "the gauge counts B");
    // Due again (as a release makes it), B is claimed behind A, which this worker holds.
    client.execute("UPDATE deliveries SET next_retry_at = now() WHERE id = $1", &[&b.parse::<DeliveryId>().unwrap()]).await.unwrap();
    let b_claim = claimed(claim(&pool, request(b, 1), &[a_claim.token]).await, "B behind A");
    assert!(b_claim.behind);
    assert!(!state(&db, b).await.0, "a claimed Delivery is not parked");

    // B's Attempt fails: back on its ladder, an hour from now. Then A succeeds.
    let retry_at = Utc::now() + Duration::hours(1);
    let finalise = |c: &Claimed, next: Next, code: i32| FinaliseRequest::new(c, next, None, record(code), code < 500);
    let out = store::finalise_batch(&pool.get().await.unwrap(), &[finalise(&b_claim, Next::RetryAt(retry_at), 503)], &CIRCUIT).await.unwrap();
    assert!(out[0].wrote);
    let out = store::finalise_batch(&pool.get().await.unwrap(), &[finalise(&a_claim, Next::Success, 200)], &CIRCUIT).await.unwrap();
    assert!(out[0].wrote);
    assert_eq!(out[0].released, None, "A's finalise released B, which is on its own ladder");
    let (b_parked, b_next) = state(&db, b).await;
    assert!(!b_parked);
    let b_next = b_next.expect("B is due later");
    assert!((b_next - retry_at).num_milliseconds().abs() < 5, "B's retry moved from {retry_at} to {b_next}");
    assert_eq!(store::queue_gauges(&client).await.unwrap().parked, 0, "the gauge counts B as parked");

    // C behind B, which is PENDING on its own ladder: C parks with its gap timeout (due at
    // its first park plus 60 s), not the wait without one that a parked B would give.
    let c_result = claim(&pool, request(c, 2), &[]).await;
    assert!(matches!(c_result, ClaimResult::Deferred(r) if r.as_str() == "ordering"), "C: {c_result:?}");
    let row = client.query_one("SELECT parked FROM deliveries WHERE id = $1", &[&c.parse::<DeliveryId>().unwrap()]).await.unwrap();
    assert!(row.get::<_, bool>(0));
    // Once its gap timeout is over, C goes without B ('claimed:gap'); behind a parked B it
    // would have been parked again.
    client.execute("UPDATE deliveries SET parked_at = now() - interval '61 seconds', next_retry_at = now() WHERE id = $1", &[&c.parse::<DeliveryId>().unwrap()]).await.unwrap();
    let c_claim = claimed(claim(&pool, request(c, 2), &[]).await, "C at its gap timeout");
    assert!(c_claim.gap_timeout, "C was claimed, but not at its gap timeout");
}
