//! `store::claim_batch` against the real Postgres: a batch decides each claim as a claim on
//! its own would, in order (limits count the batch's earlier claims), a Delivery twice in a
//! batch is claimed once, hints must match, and concurrent batches of one endpoint never
//! exceed its concurrency between them.

use railhook_testkit::relay::Fixture;
use railhook_testkit::TestDb;
use railhook_core::{ClaimToken, DeliveryId};
use railhook_store::lifecycle::{self as store, ClaimRequest, ClaimResult, Limits};
use uuid::Uuid;

fn limits(endpoint: i32, project: i32) -> Limits {
    Limits { endpoint_concurrency: endpoint, project_concurrency: project, project_rate: 0, circuit_cooldown_s: 30.0, probe_timeout_s: 300.0, ordering_gap_s: 60.0, synchronous_commit: false }
}

fn first(delivery: &str) -> ClaimRequest {
    let id: railhook_core::DeliveryId = delivery.parse().unwrap();
    ClaimRequest { delivery: id, token: ClaimToken::new(), hint: None, wait: false, announced_at: None, position: None }
}

fn kinds(results: &[ClaimResult]) -> Vec<String> {
    results
        .iter()
        .map(|r| match r {
            ClaimResult::Claimed(_) => "claimed".to_string(),
            ClaimResult::Nothing => "none".to_string(),
            ClaimResult::Missing => "missing".to_string(),
            ClaimResult::Behind => "busy:ordering".to_string(),
            ClaimResult::Deferred(reason) => reason.to_string(),
            ClaimResult::Busy(reason) => format!("busy:{reason}"),
        })
        .collect()
}

async fn setup(endpoints: usize) -> (TestDb, railhook_store::Pool, Fixture) {
    Fixture::in_fresh_db(endpoints).await
}

#[tokio::test]
async fn a_batch_counts_its_own_claims_against_the_limits() {
    let (_db, pool, fixture) = setup(2).await;
    let mut requests = Vec::new();
    for _ in 0..5 {
        // Each event has one Delivery per endpoint: [endpoint 0, endpoint 1] in some order.
        for d in fixture.ingest(&pool, "order.created").await {
            requests.push(first(&d));
        }
    }
    let client = pool.get().await.unwrap();
    // Endpoint limit 2 and project limit 3: at most 2 per endpoint, 3 in all.
    let results = store::claim_batch(&client, &requests, &limits(2, 3)).await.unwrap();
    let k = kinds(&results);
    assert_eq!(k.iter().filter(|r| *r == "claimed").count(), 3, "{k:?}");
    assert_eq!(k.iter().filter(|r| r.ends_with("_concurrency")).count(), 7, "{k:?}");
    let mut per_endpoint = std::collections::HashMap::new();
    for r in &results {
        if let ClaimResult::Claimed(c) = r {
            *per_endpoint.entry(c.endpoint_id).or_insert(0) += 1;
            assert_eq!(c.project_id, fixture.project);
            assert!(c.payload.contains("\"n\""), "the claim returns what the Attempt needs: {}", c.payload);
        }
    }
    assert!(per_endpoint.values().all(|n| *n <= 2), "{per_endpoint:?}");
    let processing: i64 = client.query_one("SELECT count(*) FROM deliveries WHERE status = 'PROCESSING'", &[]).await.unwrap().get(0);
    assert_eq!(processing, 3);
    // The deferred ones stay PENDING, untokened, due later; no Attempt was spent.
    let deferred: i64 = client
        .query_one("SELECT count(*) FROM deliveries WHERE status = 'PENDING' AND claim_token IS NULL AND next_retry_at > now() AND attempt_count = 0", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(deferred, 7);
}

#[tokio::test]
async fn a_delivery_twice_in_a_batch_is_claimed_once_and_hints_must_match() {
    let (_db, pool, fixture) = setup(1).await;
    let d = fixture.ingest(&pool, "order.created").await.remove(0);
    let other = fixture.ingest(&pool, "order.created").await.remove(0);
    let client = pool.get().await.unwrap();
    let a = first(&d);
    let b = first(&d);
    // A hint carrying a token the row does not have claims nothing.
    let wrong_hint = ClaimRequest { hint: Some(ClaimToken::new()), ..first(&other) };
    let results = store::claim_batch(&client, &[a, b, wrong_hint], &limits(0, 0)).await.unwrap();
    assert_eq!(kinds(&results), ["claimed", "none", "none"]);
    let ClaimResult::Claimed(c) = &results[0] else { unreachable!() };
    assert_eq!(c.token, a.token, "the claim holds the first request's token");
    let token: Uuid = client.query_one("SELECT claim_token FROM deliveries WHERE id = $1", &[&a.delivery]).await.unwrap().get(0);
    assert_eq!(token, a.token.0);
    assert!(store::claim_batch(&client, &[], &limits(0, 0)).await.unwrap().is_empty());
}

/// Batches racing on other connections: the endpoint's limit holds between them (the locks
/// serialise the decisions), and every Delivery is decided exactly once.
#[tokio::test]
async fn concurrent_batches_share_the_limits() {
    let (_db, pool, fixture) = setup(1).await;
    let mut all = Vec::new();
    for _ in 0..40 {
        all.extend(fixture.ingest(&pool, "order.created").await.into_iter().map(|d| first(&d)));
    }
    let mut tasks = Vec::new();
    for chunk in all.chunks(10) {
        let (pool, chunk) = (pool.clone(), chunk.to_vec());
        tasks.push(tokio::spawn(async move {
            let client = pool.get().await.unwrap();
            store::claim_batch(&client, &chunk, &limits(7, 0)).await.unwrap()
        }));
    }
    let mut k = Vec::new();
    for t in tasks {
        k.extend(kinds(&t.await.unwrap()));
    }
    assert_eq!(k.len(), 40);
    assert_eq!(k.iter().filter(|r| *r == "claimed").count(), 7, "{k:?}");
    assert_eq!(k.iter().filter(|r| *r == "endpoint_concurrency").count(), 33, "{k:?}");
}

/// A Delivery the claim cannot see (here: inserted by a transaction not yet committed, as
/// when a hint overtakes its commit's visibility) is 'missing', not 'none'; once committed
/// it is claimed. A Delivery that is there but done is 'none'.
#[tokio::test]
async fn an_invisible_delivery_is_missing_until_its_commit_is_visible() {
    let (db, pool, fixture) = setup(1).await;
    let done = fixture.ingest(&pool, "order.created").await.remove(0);
    let client = pool.get().await.unwrap();
    let claimed = store::claim_batch(&client, &[first(&done)], &limits(0, 0)).await.unwrap();
    assert_eq!(kinds(&claimed), ["claimed"]);

    let writer = db.client().await;
    writer.batch_execute("BEGIN").await.unwrap();
    let late = Uuid::new_v4();
    let done_id: railhook_core::DeliveryId = done.parse().unwrap();
    railhook_testkit::relay::insert_delivery_copy(&writer, late, done_id.0).await;
    let late_request = ClaimRequest { delivery: DeliveryId(late), token: ClaimToken::new(), hint: None, wait: false, announced_at: None, position: None };
    let results = store::claim_batch(&client, &[late_request, first(&done), ClaimRequest { delivery: DeliveryId::new(), token: ClaimToken::new(), hint: None, wait: false, announced_at: None, position: None }], &limits(0, 0)).await.unwrap();
    assert_eq!(kinds(&results), ["missing", "none", "missing"]);
    writer.batch_execute("COMMIT").await.unwrap();
    let results = store::claim_batch(&client, &[late_request], &limits(0, 0)).await.unwrap();
    assert_eq!(kinds(&results), ["claimed"]);
}

/// The waiting mode (the worker's per-Endpoint queue): over a concurrency limit the claim
/// answers busy and writes nothing, so the same hint claims the row once a slot frees; the
/// Deferral mode still defers.
#[tokio::test]
async fn a_claim_in_the_waiting_mode_is_busy_and_writes_nothing() {
    let (_db, pool, fixture) = setup(1).await;
    let mut requests = Vec::new();
    for _ in 0..3 {
        requests.extend(fixture.ingest(&pool, "order.created").await.iter().map(|d| ClaimRequest { wait: true, ..first(d) }));
    }
    let client = pool.get().await.unwrap();
    let results = store::claim_batch(&client, &requests, &limits(1, 0)).await.unwrap();
    assert_eq!(kinds(&results), ["claimed", "busy:endpoint_concurrency", "busy:endpoint_concurrency"]);
    let untouched: i64 = client
        .query_one("SELECT count(*) FROM deliveries WHERE status = 'PENDING' AND next_retry_at IS NULL AND claim_token IS NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(untouched, 2, "a busy claim leaves the row as it was");
    // The slot frees: the same hint (a new token) claims it.
    let ClaimResult::Claimed(c) = &results[0] else { unreachable!() };
    client.execute("UPDATE deliveries SET status = 'SUCCESS', claim_token = NULL WHERE id = $1", &[&c.id]).await.unwrap();
    let again = store::claim_batch(&client, &[ClaimRequest { token: ClaimToken::new(), ..requests[1] }], &limits(1, 0)).await.unwrap();
    assert_eq!(kinds(&again), ["claimed"]);
    // The Deferral mode defers over the limit, as before the queues.
    let deferred = store::claim_batch(&client, &[ClaimRequest { wait: false, ..requests[2] }], &limits(1, 0)).await.unwrap();
    assert_eq!(kinds(&deferred), ["endpoint_concurrency"]);
}

/// A worker's own Claims whose request has ended (`finishing`, waiting for their finalise) do
/// not count against the concurrency limits; every other PROCESSING row does, a token that is
/// not a PROCESSING row's frees nothing, and the project limit leaves them out the same way.
#[tokio::test]
async fn claims_whose_request_ended_do_not_count_against_the_limits() {
    let (_db, pool, fixture) = setup(1).await;
    let mut requests = Vec::new();
    for _ in 0..4 {
        requests.extend(fixture.ingest(&pool, "order.created").await.iter().map(|d| ClaimRequest { wait: true, ..first(d) }));
    }
    let client = pool.get().await.unwrap();
    let held = store::claim_batch(&client, &requests[..2], &limits(2, 0)).await.unwrap();
    assert_eq!(kinds(&held), ["claimed", "claimed"]);
    let tokens: Vec<ClaimToken> = held.iter().map(|r| match r {
        ClaimResult::Claimed(c) => c.token,
        other => panic!("{other:?}"),
    }).collect();

    // Both slots in use: busy, whatever a stranger's token says.
    let busy = store::claim_batch_finishing(&client, &requests[2..3], &limits(2, 0), &[ClaimToken::new()], &[]).await.unwrap();
    assert_eq!(kinds(&busy), ["busy:endpoint_concurrency"]);
    // One of them is finishing: one slot for the next claim, not two.
    let next = store::claim_batch_finishing(&client, &requests[2..4], &limits(2, 0), &tokens[..1], &[]).await.unwrap();
    assert_eq!(kinds(&next), ["claimed", "busy:endpoint_concurrency"]);
    // The project's limit (3: three PROCESSING now) leaves them out too.
    let project = store::claim_batch_finishing(&client, &requests[3..4], &limits(0, 3), &tokens, &[]).await.unwrap();
    assert_eq!(kinds(&project), ["claimed"]);
    let processing: i64 = client.query_one("SELECT count(*) FROM deliveries WHERE status = 'PROCESSING'", &[]).await.unwrap().get(0);
    assert_eq!(processing, 4);
}

/// `worker.claim_synchronous_commit`: off (the default), the claim's transaction commits
/// without waiting for the WAL flush (`synchronous_commit = off`, local to it: seen here
/// inside an explicit transaction, gone after it); on, the server's setting stays. Either way
/// the claim is the same claim.
#[tokio::test]
async fn a_claim_commits_without_waiting_for_the_flush_unless_configured() {
    let (_db, pool, fixture) = setup(1).await;
    let mut client = pool.get().await.unwrap();
    for (synchronous, expected) in [(false, "off"), (true, "on")] {
        let delivery = fixture.ingest(&pool, "order.created").await.remove(0);
        let limits = Limits { synchronous_commit: synchronous, ..limits(10, 100) };
        let tx = client.transaction().await.unwrap();
        let results = store::claim_batch(&tx, &[first(&delivery)], &limits).await.unwrap();
        assert_eq!(kinds(&results), ["claimed"], "synchronous_commit {synchronous}");
        let setting: String = tx.query_one("SHOW synchronous_commit", &[]).await.unwrap().get(0);
        assert_eq!(setting, expected, "claim_synchronous_commit = {synchronous}");
        tx.commit().await.unwrap();
        let after: String = client.query_one("SHOW synchronous_commit", &[]).await.unwrap().get(0);
        assert_eq!(after, "on", "the setting is local to the claim's transaction");
        let status: String = client
            .query_one("SELECT status::text FROM deliveries WHERE id = $1", &[&delivery.parse::<DeliveryId>().unwrap()])
            .await
            .unwrap()
            .get(0);
        assert_eq!(status, "PROCESSING");
    }
}

/// The batch's fast path (every row claimable: one UPDATE for the batch, `rules.sql`) counts
/// what is PROCESSING already, not only the batch: at the limit the whole batch is claimed,
/// one over it the batch goes row by row and the limit holds.
#[tokio::test]
async fn a_whole_batch_is_claimed_only_within_what_is_processing_already() {
    let (_db, pool, fixture) = setup(2).await;
    let mut events = Vec::new();
    for _ in 0..3 {
        // One Delivery per endpoint per event, in the order the claim decides them (by
        // Delivery id, without Kafka positions): which of a batch fits under a limit is then
        // the first. (The fixture returns them in no particular order: this test failed once
        // in scripts/test on that.)
        let mut requests = fixture.ingest(&pool, "order.created").await.into_iter().map(|d| first(&d)).collect::<Vec<_>>();
        requests.sort_by_key(|r| r.delivery.0);
        events.push(requests);
    }
    let client = pool.get().await.unwrap();
    // Nothing PROCESSING: both claimed.
    assert_eq!(kinds(&store::claim_batch(&client, &events[0], &limits(2, 0)).await.unwrap()), ["claimed", "claimed"]);
    // One PROCESSING per endpoint, limit 1: one more each would be two.
    assert_eq!(
        kinds(&store::claim_batch(&client, &events[1], &limits(1, 0)).await.unwrap()),
        ["endpoint_concurrency", "endpoint_concurrency"]
    );
    // Project limit 3 with 2 PROCESSING: the batch of two does not fit, its first row does.
    assert_eq!(kinds(&store::claim_batch(&client, &events[2], &limits(0, 3)).await.unwrap()), ["claimed", "project_concurrency"]);
    // Two PROCESSING on one endpoint and one on the other; the three left (due again) take
    // both to a limit of 3 exactly: the batch is claimed whole.
    let processing: i64 = client.query_one("SELECT count(*) FROM deliveries WHERE status = 'PROCESSING'", &[]).await.unwrap().get(0);
    assert_eq!(processing, 3);
    client.execute("UPDATE deliveries SET next_retry_at = NULL WHERE status = 'PENDING'", &[]).await.unwrap();
    let rest: Vec<ClaimRequest> = client
        .query("SELECT id FROM deliveries WHERE status = 'PENDING' ORDER BY endpoint_id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| ClaimRequest { delivery: DeliveryId(r.get::<_, Uuid>(0)), ..first(&events[0][0].delivery.to_string()) })
        .collect();
    assert_eq!(rest.len(), 3);
    let k = kinds(&store::claim_batch(&client, &rest, &limits(3, 0)).await.unwrap());
    assert_eq!(k, ["claimed", "claimed", "claimed"]);
    let over: i64 = client
        .query_one("SELECT count(*) FROM (SELECT endpoint_id FROM deliveries WHERE status = 'PROCESSING' GROUP BY endpoint_id HAVING count(*) > 3) o", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(over, 0);
}

/// Each statement of the claim reads its rows by key, whatever the size `deliveries` had
/// when the session's generic plans were made (the claim forces generic plans; the
/// finalise's Attempts insert once hashed the whole table that way, tests/finalise.rs
/// `the_attempts_insert_reads_its_deliveries_by_key`). Both paths: the fast path, and the
/// loop (a project rate sends every batch through it). The rows read are counted in the
/// transaction's own statistics.
#[tokio::test]
async fn a_claim_reads_its_deliveries_by_key_however_the_table_grew() {
    let (_db, pool, fixture) = setup(1).await;
    let mut conn = pool.get().await.unwrap();
    // No autovacuum ANALYZE between the plans and the claims: with fresh statistics of a
    // 402-row table (a few pages, one Endpoint) the planner rightly reads it whole, which is
    // not what this test is about (a full `scripts/test` once hit that: 1,214 rows read).
    conn.batch_execute("ALTER TABLE deliveries SET (autovacuum_enabled = false)").await.unwrap();
    let fast = limits(100, 100);
    let looped = Limits { project_rate: 100_000, ..limits(100, 100) };
    // The session's plans, made while the table holds two Deliveries.
    for l in [&fast, &looped] {
        let d = fixture.ingest(&pool, "order.created").await;
        assert_eq!(kinds(&store::claim_batch(&conn, &[first(&d[0])], l).await.unwrap()), ["claimed"]);
    }
    let mut more = Vec::new();
    for _ in 0..400 {
        more.extend(fixture.ingest(&pool, "order.created").await);
    }
    let read = "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables WHERE relname = 'deliveries'";
    for (path, l) in [("fast path", &fast), ("loop", &looped)] {
        let d = more.pop().unwrap();
        let tx = conn.transaction().await.unwrap();
        let before: i64 = tx.query_one(read, &[]).await.unwrap().get(0);
        let out = store::claim_batch(&tx, &[first(&d)], l).await.unwrap();
        let after: i64 = tx.query_one(read, &[]).await.unwrap().get(0);
        tx.commit().await.unwrap();
        eprintln!("{path}: a claim of one read {} rows of deliveries (402 in the table)", after - before);
        assert_eq!(kinds(&out), ["claimed"], "{path}");
        assert!(after - before < 20, "{path}: a claim of one Delivery read {} rows of deliveries (402 in the table)", after - before);
    }
}
