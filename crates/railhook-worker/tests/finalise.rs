//! `store::finalise_batch` against the real Postgres: in one batch, each Attempt is on
//! record whatever its fence, only the Deliveries whose Claim held change, each outcome
//! counts once in its endpoint's circuit (in order, so a batch can open one), and two
//! batches over the same endpoints at once do not deadlock.

use chrono::Utc;
use railhook_testkit::relay::Fixture;
use railhook_testkit::TestDb;
use railhook_core::ClaimToken;
use railhook_store::lifecycle::{self as store, AttemptRecord, Circuit, ClaimRequest, ClaimResult, Claimed, FinaliseRequest, Limits, Next};
use uuid::Uuid;

const LIMITS: Limits = Limits { endpoint_concurrency: 1000, project_concurrency: 1000, project_rate: 0, circuit_cooldown_s: 30.0, probe_timeout_s: 300.0, ordering_gap_s: 60.0, synchronous_commit: false };

fn record(code: i32) -> AttemptRecord {
    AttemptRecord {
        started_at: Utc::now(),
        duration_ms: 3,
        status_code: Some(code),
        result: "http_response".into(),
        error_message: None,
        request_headers: serde_json::json!({"webhook-id": "dlv_test"}),
        response_headers: serde_json::json!({"content-type": "text/plain"}),
        response_body: format!("answer {code}"),
        response_truncated: false,
    }
}

async fn setup(endpoints: usize, events: usize) -> (TestDb, railhook_store::Pool, Vec<Claimed>) {
    let (db, pool, fixture) = Fixture::in_fresh_db(endpoints).await;
    let mut requests = Vec::new();
    for _ in 0..events {
        for d in fixture.ingest(&pool, "order.created").await {
            let id: railhook_core::DeliveryId = d.parse().unwrap();
            requests.push(ClaimRequest { delivery: id, token: ClaimToken::new(), hint: None, wait: false, announced_at: None, position: None });
        }
    }
    let pooled = pool.get().await.unwrap();
    let claimed = store::claim_batch(&pooled, &requests, &LIMITS)
        .await
        .unwrap()
        .into_iter()
        .map(|r| match r {
            ClaimResult::Claimed(c) => *c,
            other => panic!("expected a claim, got {other:?}"),
        })
        .collect();
    drop(pooled);
    (db, pool, claimed)
}

#[tokio::test]
async fn a_batch_writes_every_attempt_and_changes_only_the_deliveries_it_holds() {
    let (db, pool, claimed) = setup(2, 2).await;
    assert_eq!(claimed.len(), 4);
    let client = db.client().await;
    // The third Claim is lost before the finalise (as after a sweep and a new claim).
    client.execute("UPDATE deliveries SET claim_token = gen_random_uuid() WHERE id = $1", &[&claimed[2].id]).await.unwrap();
    let retry_at = Utc::now() + chrono::Duration::seconds(60);
    let requests = vec![
        FinaliseRequest::new(&claimed[0], Next::Success, None, record(200), true),
        FinaliseRequest::new(&claimed[1], Next::RetryAt(retry_at), Some("HTTP 503".into()), record(503), false),
        FinaliseRequest::new(&claimed[2], Next::Success, None, record(200), true),
        FinaliseRequest::new(&claimed[3], Next::Failed, Some("HTTP 410".into()), record(410), true),
    ];
    let circuit = Circuit { window_s: 60.0, min_volume: 100, ratio: 0.5 };
    let out = store::finalise_batch(&pool.get().await.unwrap(), &requests, &circuit).await.unwrap();
    let wrote: Vec<bool> = out.iter().map(|f| f.wrote).collect();
    assert_eq!(wrote, vec![true, true, false, true], "answers in the order of the requests");

    for (c, (status, attempts, code)) in claimed.iter().zip([("SUCCESS", 1, 200), ("PENDING", 1, 503), ("PROCESSING", 0, 200), ("FAILED", 1, 410)]) {
        let row = client
            .query_one("SELECT status::text, attempt_count, claim_token IS NULL, last_error FROM deliveries WHERE id = $1", &[&c.id])
            .await
            .unwrap();
        assert_eq!((row.get::<_, String>(0).as_str(), row.get::<_, i32>(1)), (status, attempts), "delivery {}", c.id);
        assert_eq!(row.get::<_, bool>(2), status != "PROCESSING", "the fenced-out row keeps the other Claim");
        // Every Attempt is on record, the fenced-out one too, numbered from the claim.
        let a = client.query_one("SELECT attempt_number, status_code, response_body FROM attempts WHERE delivery_id = $1", &[&c.id]).await.unwrap();
        assert_eq!((a.get::<_, i32>(0), a.get::<_, Option<i32>>(1)), (1, Some(code)));
        assert_eq!(a.get::<_, String>(2), format!("answer {code}"));
    }
    let next: Option<chrono::DateTime<Utc>> = client.query_one("SELECT next_retry_at FROM deliveries WHERE id = $1", &[&claimed[1].id]).await.unwrap().get(0);
    assert_eq!(next.map(|t| t.timestamp_millis()), Some(retry_at.timestamp_millis()));
    // Three outcomes counted (the fenced-out one is not), on the endpoints they belong to.
    let counted: Vec<(Uuid, i32, i32)> = client
        .query("SELECT endpoint_id, successes, failures FROM circuits ORDER BY endpoint_id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let expected = |e: Uuid| {
        let mine = |i: usize| claimed[i].endpoint_id.0 == e;
        let s = [0, 3].iter().filter(|i| mine(**i)).count() as i32;
        let f = [1].iter().filter(|i| mine(**i)).count() as i32;
        (e, s, f)
    };
    assert_eq!(counted, counted.iter().map(|(e, _, _)| expected(*e)).collect::<Vec<_>>());
    assert_eq!(counted.iter().map(|(_, s, f)| s + f).sum::<i32>(), 3);
}

#[tokio::test]
async fn failures_in_one_batch_open_the_circuit_once() {
    let (_db, pool, claimed) = setup(1, 4).await;
    let circuit = Circuit { window_s: 60.0, min_volume: 3, ratio: 0.5 };
    let at = Utc::now() + chrono::Duration::seconds(60);
    let requests: Vec<FinaliseRequest> = claimed.iter().map(|c| FinaliseRequest::new(c, Next::RetryAt(at), Some("HTTP 500".into()), record(500), false)).collect();
    let out = store::finalise_batch(&pool.get().await.unwrap(), &requests, &circuit).await.unwrap();
    let changes: Vec<Option<String>> = out.iter().map(|f| f.circuit.map(|c| c.to_string())).collect();
    // The endpoint's four failures are recorded at once (one circuit update per endpoint and
    // batch): past the minimum volume, it opens, reported once, on the endpoint's last row.
    assert_eq!(changes, vec![None, None, None, Some("opened".to_string())]);
    let state: String = pool.get().await.unwrap().query_one("SELECT state FROM circuits", &[]).await.unwrap().get(0);
    assert_eq!(state, "open");
    assert!(out.iter().all(|f| f.wrote));
}

/// A circuit that has its row and is closed counts each batch's outcomes in one statement
/// (rules.sql): the counts add up across batches, an expired window starts again from the
/// batch's own outcomes, and the batch that crosses the ratio opens it.
#[tokio::test]
async fn a_closed_circuit_counts_across_batches_and_the_batch_over_the_ratio_opens_it() {
    let (db, pool, claimed) = setup(1, 8).await;
    let circuit = Circuit { window_s: 60.0, min_volume: 5, ratio: 0.5 };
    let at = Utc::now() + chrono::Duration::seconds(60);
    let ok = |c: &Claimed| FinaliseRequest::new(c, Next::Success, None, record(200), true);
    let bad = |c: &Claimed| FinaliseRequest::new(c, Next::RetryAt(at), Some("HTTP 500".into()), record(500), false);
    let conn = pool.get().await.unwrap();
    let counts = || async {
        let r = db.client().await.query_one("SELECT state, successes, failures FROM circuits", &[]).await.unwrap();
        (r.get::<_, String>(0), r.get::<_, i32>(1), r.get::<_, i32>(2))
    };
    let changes = |out: &[store::Finalised]| out.iter().map(|f| f.circuit.map(|c| c.to_string())).collect::<Vec<_>>();
    // The first batch makes the row; the ones after go the short way.
    let out = store::finalise_batch(&conn, &[ok(&claimed[0]), ok(&claimed[1])], &circuit).await.unwrap();
    assert_eq!(changes(&out), vec![None, None]);
    let out = store::finalise_batch(&conn, &[bad(&claimed[2])], &circuit).await.unwrap();
    assert_eq!(changes(&out), vec![None], "3 outcomes, under the minimum volume");
    assert_eq!(counts().await, ("closed".to_string(), 2, 1));
    // An expired window: the counts start again from this batch's.
    db.client().await.execute("UPDATE circuits SET window_start = now() - interval '2 minutes'", &[]).await.unwrap();
    let out = store::finalise_batch(&conn, &[ok(&claimed[3])], &circuit).await.unwrap();
    assert_eq!(changes(&out), vec![None]);
    assert_eq!(counts().await, ("closed".to_string(), 1, 0));
    let out = store::finalise_batch(&conn, &[bad(&claimed[4]), bad(&claimed[5])], &circuit).await.unwrap();
    assert_eq!(changes(&out), vec![None, None], "3 outcomes in the window");
    assert_eq!(counts().await, ("closed".to_string(), 1, 2));
    // 3 failures of 5: the ratio and the volume reached; reported on the batch's last row.
    let out = store::finalise_batch(&conn, &[bad(&claimed[6]), ok(&claimed[7])], &circuit).await.unwrap();
    assert_eq!(changes(&out), vec![None, Some("opened".to_string())]);
    assert_eq!(counts().await, ("open".to_string(), 0, 0));
}

#[tokio::test]
async fn concurrent_batches_over_the_same_endpoints_finish() {
    let (_db, pool, claimed) = setup(8, 16).await;
    let circuit = Circuit { window_s: 60.0, min_volume: 1000, ratio: 0.5 };
    // Two batches, each over every endpoint, in opposite orders: without the sort by
    // endpoint they would lock the circuit rows in opposite orders.
    let (a, b) = claimed.split_at(claimed.len() / 2);
    let batch = |cs: &[Claimed], reverse: bool| {
        let mut r: Vec<FinaliseRequest> = cs.iter().map(|c| FinaliseRequest::new(c, Next::Success, None, record(200), true)).collect();
        if reverse {
            r.reverse();
        }
        r
    };
    let (ra, rb) = (batch(a, false), batch(b, true));
    let (ca, cb) = (pool.get().await.unwrap(), pool.get().await.unwrap());
    let (x, y) = tokio::join!(store::finalise_batch(&ca, &ra, &circuit), store::finalise_batch(&cb, &rb, &circuit));
    let (x, y) = (x.expect("batch a"), y.expect("batch b"));
    assert!(x.iter().chain(y.iter()).all(|f| f.wrote));
    drop((ca, cb));
    let client = pool.get().await.unwrap();
    let done: i64 = client.query_one("SELECT count(*) FROM deliveries WHERE status = 'SUCCESS'", &[]).await.unwrap().get(0);
    assert_eq!(done as usize, claimed.len());
    let counted: i64 = client.query_one("SELECT sum(successes) FROM circuits", &[]).await.unwrap().get(0);
    assert_eq!(counted as usize, claimed.len());
}

#[tokio::test]
async fn an_attempt_whose_delivery_is_gone_fails_nothing_and_a_repeat_records_nothing_twice() {
    let (db, pool, claimed) = setup(1, 3).await;
    let client = db.client().await;
    // Deleted while its request was in flight (as with its endpoint).
    client.execute("DELETE FROM deliveries WHERE id = $1", &[&claimed[1].id]).await.unwrap();
    let circuit = Circuit { window_s: 60.0, min_volume: 100, ratio: 0.5 };
    let requests: Vec<FinaliseRequest> = claimed.iter().map(|c| FinaliseRequest::new(c, Next::Success, None, record(200), true)).collect();
    let conn = pool.get().await.unwrap();
    let out = store::finalise_batch(&conn, &requests, &circuit).await.unwrap();
    assert_eq!(out.iter().map(|f| f.wrote).collect::<Vec<_>>(), vec![true, false, true]);
    // The same batch again (a reply lost after the commit): no second Attempt, no fence.
    let again = store::finalise_batch(&conn, &requests, &circuit).await.unwrap();
    assert!(again.iter().all(|f| !f.wrote));
    let attempts: i64 = client.query_one("SELECT count(*) FROM attempts", &[]).await.unwrap().get(0);
    assert_eq!(attempts, 2);
}

/// The worker's Finaliser: a batch that Postgres refuses because of one request (here an
/// Attempt whose error text holds a NUL byte, which Postgres' text refuses) is made again
/// request by request, so only that request fails.
#[tokio::test]
async fn a_refused_batch_is_made_again_one_by_one() {
    let (db, pool, claimed) = setup(1, 3).await;
    let metrics = railhook_worker::WorkerMetrics::new();
    let circuit = Circuit { window_s: 60.0, min_volume: 100, ratio: 0.5 };
    let finaliser = railhook_worker::runner::finaliser(pool.clone(), circuit, metrics.clone(), 16);
    let mut requests: Vec<FinaliseRequest> = claimed.iter().map(|c| FinaliseRequest::new(c, Next::Success, None, record(200), true)).collect();
    requests[1].attempt.error_message = Some("a NUL \u{0} byte".into());
    // Sent together, so the three form one batch.
    let (a, b, c) = tokio::join!(finaliser.call(requests[0].clone()), finaliser.call(requests[1].clone()), finaliser.call(requests[2].clone()));
    assert!(a.expect("first").wrote);
    assert!(b.is_err(), "the bad request fails: {b:?}");
    assert!(c.expect("third").wrote);
    assert_eq!(metrics.finalise_batch_size.get_sample_count(), 4, "one batch of three, then three alone");
    assert_eq!(metrics.finalise_batch_size.get_sample_sum(), 6.0);
    let client = db.client().await;
    let statuses: Vec<String> = client.query("SELECT status::text FROM deliveries ORDER BY id", &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(statuses.iter().filter(|s| *s == "SUCCESS").count(), 2);
    assert_eq!(statuses.iter().filter(|s| *s == "PROCESSING").count(), 1, "the bad one is left for the sweep");
}

/// A batch over two Endpoints with circuit rows: the one this batch opens goes the long way
/// and reports it on its own last row; the other's outcomes are counted with the batch's
/// statement for every closed circuit (rules.sql), and neither Endpoint's counts leak into
/// the other's.
#[tokio::test]
async fn one_batch_opens_one_circuit_and_counts_the_other() {
    let (db, pool, claimed) = setup(2, 4).await;
    let circuit = Circuit { window_s: 60.0, min_volume: 4, ratio: 0.5 };
    let at = Utc::now() + chrono::Duration::seconds(60);
    let ok = |c: &Claimed| FinaliseRequest::new(c, Next::Success, None, record(200), true);
    let bad = |c: &Claimed| FinaliseRequest::new(c, Next::RetryAt(at), Some("HTTP 500".into()), record(500), false);
    let (a, b) = (claimed[0].endpoint_id, claimed.iter().find(|c| c.endpoint_id != claimed[0].endpoint_id).unwrap().endpoint_id);
    let of = |e| claimed.iter().filter(move |c| c.endpoint_id == e).collect::<Vec<_>>();
    let (ca, cb) = (of(a), of(b));
    let conn = pool.get().await.unwrap();
    // Rows for both circuits.
    store::finalise_batch(&conn, &[ok(ca[0]), ok(cb[0])], &circuit).await.unwrap();
    // A: 1 success and 3 failures (4 outcomes, 3 of 4 failed: opens). B: 3 successes.
    let batch = vec![bad(ca[1]), ok(cb[1]), bad(ca[2]), ok(cb[2]), bad(ca[3]), ok(cb[3])];
    let out = store::finalise_batch(&conn, &batch, &circuit).await.unwrap();
    let changes: Vec<Option<String>> = out.iter().map(|f| f.circuit.map(|c| c.to_string())).collect();
    assert_eq!(changes.iter().filter(|c| c.is_some()).count(), 1, "{changes:?}");
    let opened_at = changes.iter().position(|c| c.as_deref() == Some("opened")).expect("A opened");
    assert_eq!(batch[opened_at].endpoint_id, a, "reported on one of A's rows");
    let state = |e: railhook_core::EndpointId| {
        let client = &db;
        async move {
            let r = client.client().await.query_one("SELECT state, successes, failures FROM circuits WHERE target_id = $1", &[&e]).await.unwrap();
            (r.get::<_, String>(0), r.get::<_, i32>(1), r.get::<_, i32>(2))
        }
    };
    assert_eq!(state(a).await, ("open".to_string(), 0, 0));
    assert_eq!(state(b).await, ("closed".to_string(), 4, 0));
}

/// The Attempts' insert checks that each Delivery still exists by primary key, whatever the
/// size `deliveries` had when the session's generic plan was made (the function forces
/// generic plans). As a semi-join, the plan made on a small table hashed every Delivery of
/// the table (through an index, seqscan being off) on each finalise: 34,000 rows a batch at
/// the end of a saturation bench (seventeenth session). The rows read are counted in the
/// transaction's own statistics (`pg_stat_xact_user_tables`).
async fn claim_one(conn: &deadpool_postgres::Object, delivery: String) -> Claimed {
    let request = [ClaimRequest { delivery: delivery.parse().unwrap(), token: ClaimToken::new(), hint: None, wait: false, announced_at: None, position: None }];
    match store::claim_batch(conn, &request, &LIMITS).await.unwrap().remove(0) {
        ClaimResult::Claimed(c) => *c,
        other => panic!("expected a claim, got {other:?}"),
    }
}

#[tokio::test]
async fn the_attempts_insert_reads_its_deliveries_by_key() {
    let (db, pool, fixture) = Fixture::in_fresh_db(1).await;
    let circuit = Circuit { window_s: 60.0, min_volume: 100, ratio: 0.5 };
    let mut conn = pool.get().await.unwrap();
    // The session's plan, made while the table holds one Delivery.
    let first = claim_one(&conn, fixture.ingest(&pool, "order.created").await.remove(0)).await;
    assert!(store::finalise_batch(&conn, &[FinaliseRequest::new(&first, Next::Success, None, record(200), true)], &circuit).await.unwrap()[0].wrote);
    // The table grows (no ANALYZE: the plan stays), then one more is finalised.
    let mut more = Vec::new();
    for _ in 0..400 {
        more.extend(fixture.ingest(&pool, "order.created").await);
    }
    let last = claim_one(&conn, more.pop().unwrap()).await;
    let tx = conn.transaction().await.unwrap();
    let read = "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables WHERE relname = 'deliveries'";
    let before: i64 = tx.query_one(read, &[]).await.unwrap().get(0);
    let out = store::finalise_batch(&tx, &[FinaliseRequest::new(&last, Next::Success, None, record(200), true)], &circuit).await.unwrap();
    let after: i64 = tx.query_one(read, &[]).await.unwrap().get(0);
    tx.commit().await.unwrap();
    assert!(out[0].wrote);
    let client = db.client().await;
    let total: i64 = client.query_one("SELECT count(*) FROM deliveries", &[]).await.unwrap().get(0);
    eprintln!("a finalise of one read {} rows of deliveries ({total} in the table)", after - before);
    assert_eq!(total, 401);
    assert!(after - before < 20, "the finalise of one Delivery read {} rows of deliveries ({total} in the table)", after - before);
    let attempts: i64 = client.query_one("SELECT count(*) FROM attempts", &[]).await.unwrap().get(0);
    assert_eq!(attempts, 2, "both Attempts on record");
}
