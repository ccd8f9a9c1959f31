//! Sequence Numbers are handed out by the claim (migration 0035, `railhook_claim_batch` in
//! `lifecycle/rules.sql`), not by the ingest: ordered ingests to one Endpoint no longer wait
//! for each other's commits. What the numbers must still be (DESIGN.md 6.5): consecutive per
//! Endpoint from 1, in the order of the hints (the announcements' order), never burned by a
//! rollback, never handed out twice, and durable before anyone can send them (the claim that
//! numbers waits for its WAL flush even where claims do not).

use railhook_core::{ClaimToken, DeliveryId};
use railhook_store::lifecycle::{self as store, ClaimRequest, ClaimResult, Limits};
use railhook_testkit::relay::{Fixture, SubscriptionSpec};
use railhook_testkit::TestDb;

fn limits() -> Limits {
    Limits { endpoint_concurrency: 0, project_concurrency: 0, project_rate: 0, circuit_cooldown_s: 30.0, probe_timeout_s: 300.0, ordering_gap_s: 60.0, synchronous_commit: false }
}

fn request(id: &str) -> ClaimRequest {
    ClaimRequest { delivery: id.parse::<DeliveryId>().unwrap(), token: ClaimToken::new(), hint: None, wait: false, announced_at: None, position: None }
}

/// Hints at Kafka positions in the order given (a batch is decided in its hints' order).
fn requests<'a>(ids: impl IntoIterator<Item = &'a String>) -> Vec<ClaimRequest> {
    ids.into_iter().enumerate().map(|(i, id)| ClaimRequest { position: Some((0, i as i64)), ..request(id) }).collect()
}

/// A fresh database with one ordered Endpoint and one unordered one.
async fn setup() -> (TestDb, railhook_store::Pool, Fixture, Fixture) {
    let db = TestDb::new().await;
    let client = db.client().await;
    let ordered = SubscriptionSpec { ordering: true, ..SubscriptionSpec::default() };
    let (a, _) = Fixture::create_with(&client, &["http://127.0.0.1:9/ordered".to_string()], &ordered).await;
    let (b, _) = Fixture::create_with(&client, &["http://127.0.0.1:9/unordered".to_string()], &SubscriptionSpec::default()).await;
    let pool = railhook_store::build_pool(&railhook_testkit::test_config(&db).database).unwrap();
    (db, pool, a, b)
}

/// `(delivery id, sequence number)` of every Delivery, in id order.
async fn numbers(db: &TestDb) -> Vec<(String, Option<i64>)> {
    db.client()
        .await
        .query("SELECT id, sequence_number FROM deliveries ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (DeliveryId(r.get(0)).to_string(), r.get(1)))
        .collect()
}

/// `n` Events ingested one after another to `fixture`: their Delivery ids, in that order.
async fn ingest_one_by_one(pool: &railhook_store::Pool, fixture: &Fixture, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.extend(fixture.ingest(pool, "order.paid").await);
    }
    ids
}

/// `deliveries`' updates and HOT updates so far (n_tup_upd, n_tup_hot_upd), read on a
/// connection of its own after flushing its statistics.
async fn update_counts(db: &TestDb) -> (i64, i64) {
    let c = railhook_testkit::connect(&db.url).await.unwrap();
    c.batch_execute("SELECT pg_stat_force_next_flush()").await.unwrap();
    let r = c.query_one("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'deliveries'", &[]).await.unwrap();
    (r.get::<_, i64>(0), r.get::<_, i64>(1))
}

fn number_of(all: &[(String, Option<i64>)], id: &str) -> Option<i64> {
    all.iter().find(|(d, _)| d == id).and_then(|(_, n)| *n)
}

#[tokio::test]
async fn the_claim_numbers_in_the_hints_order_consecutively_and_once() {
    let (db, pool, ordered, _) = setup().await;
    // Twenty ordered ingests at once: none waits for another's number, none gets one.
    let ingests = (0..20).map(|_| ordered.ingest(&pool, "order.paid"));
    let ids: Vec<String> = futures::future::join_all(ingests).await.into_iter().flatten().collect();
    assert_eq!(ids.len(), 20);
    assert!(numbers(&db).await.iter().all(|(_, n)| n.is_none()), "the ingest hands out no number");
    let counter = |db: &TestDb| {
        let db = db.url.clone();
        async move {
            let c = railhook_testkit::connect(&db).await.unwrap();
            c.query_one("SELECT last_sequence FROM endpoints WHERE url LIKE '%/ordered'", &[]).await.unwrap().get::<_, i64>(0)
        }
    };
    assert_eq!(counter(&db).await, 0);

    // Hints in an order of our own (reversed): the numbers follow it, not the ids.
    let hints: Vec<String> = ids.iter().rev().cloned().collect();
    let client = pool.get().await.unwrap();

    // A claim that rolls back burns no number.
    {
        let mut raw = pool.get().await.unwrap();
        let tx = raw.transaction().await.unwrap();
        let reqs = requests(&hints[..5]);
        let results = store::claim_batch(&tx, &reqs, &limits()).await.unwrap();
        assert!(results.iter().all(|r| matches!(r, ClaimResult::Claimed(c) if c.sequence_number.is_some())), "{results:?}");
        tx.rollback().await.unwrap();
    }
    assert_eq!(counter(&db).await, 0, "a rolled-back claim takes its numbers back");
    assert!(numbers(&db).await.iter().all(|(_, n)| n.is_none()));

    // The same Delivery hinted twice in one batch takes one number.
    let reqs = requests(hints[..5].iter().chain([&hints[0]]));
    let results = store::claim_batch(&client, &reqs, &limits()).await.unwrap();
    let seqs: Vec<Option<i64>> = results[..5].iter().map(|r| if let ClaimResult::Claimed(c) = r { c.sequence_number } else { None }).collect();
    assert_eq!(seqs, vec![Some(1), Some(2), Some(3), Some(4), Some(5)], "{results:?}");
    assert!(matches!(results[5], ClaimResult::Nothing), "the second hint claims nothing: {:?}", results[5]);
    assert_eq!(counter(&db).await, 5);

    // The rest in batches of four, with the claims of earlier numbers still PROCESSING.
    for chunk in hints[5..].chunks(4) {
        let reqs = requests(chunk);
        for r in store::claim_batch(&client, &reqs, &limits()).await.unwrap() {
            assert!(matches!(r, ClaimResult::Claimed(_) | ClaimResult::Deferred(_)), "{r:?}");
        }
    }
    let all = numbers(&db).await;
    let in_hint_order: Vec<Option<i64>> = hints.iter().map(|d| number_of(&all, d)).collect();
    assert_eq!(in_hint_order, (1..=20).map(Some).collect::<Vec<_>>(), "consecutive from 1, in the hints' order");
    assert_eq!(counter(&db).await, 20);
}

#[tokio::test]
async fn nothing_is_numbered_behind_a_hint_not_visible_yet() {
    let (db, pool, ordered, unordered) = setup().await;
    let a = ordered.ingest(&pool, "order.paid").await.remove(0);
    let b = ordered.ingest(&pool, "order.paid").await.remove(0);
    let plain = unordered.ingest(&pool, "order.paid").await.remove(0);
    let client = pool.get().await.unwrap();
    // A hint whose row this snapshot cannot see (its commit not visible yet), then two
    // ordered Deliveries and an unordered one.
    let unseen = DeliveryId::new().to_string();
    let reqs = requests([&a, &unseen, &b, &plain]);
    let results = store::claim_batch(&client, &reqs, &limits()).await.unwrap();
    let ClaimResult::Claimed(first) = &results[0] else { panic!("{:?}", results[0]) };
    assert_eq!(first.sequence_number, Some(1));
    assert!(matches!(results[1], ClaimResult::Missing), "{:?}", results[1]);
    assert!(matches!(results[2], ClaimResult::Missing), "ordered, behind the unseen hint: not numbered, claimed again: {:?}", results[2]);
    assert!(matches!(&results[3], ClaimResult::Claimed(c) if c.sequence_number.is_none()), "unordered goes: {:?}", results[3]);
    assert_eq!(number_of(&numbers(&db).await, &b), None);
    // Claimed again without the unseen hint: the next number.
    // (Behind the first, which this claimer holds.)
    let results = store::claim_batch_finishing(&client, &[request(&b)], &limits(), &[], &[first.token]).await.unwrap();
    assert!(matches!(&results[0], ClaimResult::Claimed(c) if c.sequence_number == Some(2) && c.behind), "{:?}", results[0]);
}

/// Claims commit without waiting for their WAL flush (`worker.claim_synchronous_commit =
/// false`), except one that handed out numbers: a number a receiver saw must survive a
/// Postgres crash, or it could be handed out again to another Event.
#[tokio::test]
async fn a_claim_that_numbers_waits_for_its_flush() {
    let (db, pool, ordered, unordered) = setup().await;
    let ordered_id = ordered.ingest(&pool, "order.paid").await.remove(0);
    let plain = unordered.ingest(&pool, "order.paid").await.remove(0);
    let mut raw = pool.get().await.unwrap();
    for (id, expected) in [(&plain, "off"), (&ordered_id, "on")] {
        let tx = raw.transaction().await.unwrap();
        let results = store::claim_batch(&tx, &[request(id)], &limits()).await.unwrap();
        assert!(matches!(results[0], ClaimResult::Claimed(_)), "{results:?}");
        let mode: String = tx.query_one("SHOW synchronous_commit", &[]).await.unwrap().get(0);
        assert_eq!(mode, expected, "the claim of {id} commits with synchronous_commit = {expected}");
        // The claim's generic plans (rules.sql) end with it, and leave the flag above alone.
        let plans: String = tx.query_one("SHOW plan_cache_mode", &[]).await.unwrap().get(0);
        assert_eq!(plans, "auto", "the claim puts plan_cache_mode back");
        let seqscan: String = tx.query_one("SHOW enable_seqscan", &[]).await.unwrap().get(0);
        assert_eq!(seqscan, "on", "and enable_seqscan");
        tx.commit().await.unwrap();
    }
    // Numbered already: claimed again (a retry), it numbers nothing and commits without.
    db.client().await.execute("UPDATE deliveries SET status = 'PENDING', claim_token = NULL WHERE sequence_number IS NOT NULL", &[]).await.unwrap();
    let tx = raw.transaction().await.unwrap();
    let results = store::claim_batch(&tx, &[request(&ordered_id)], &limits()).await.unwrap();
    assert!(matches!(&results[0], ClaimResult::Claimed(c) if c.sequence_number == Some(1)), "{results:?}");
    let mode: String = tx.query_one("SHOW synchronous_commit", &[]).await.unwrap().get(0);
    assert_eq!(mode, "off");
    tx.commit().await.unwrap();
}

/// The numbering changes no indexed column of `deliveries` (migration 0036), and the claim's
/// own UPDATE writes the number (issue 30): one HOT update per claimed Delivery, no second row
/// version; the Ordering Buffer finds a number through `delivery_sequence`.
#[tokio::test]
async fn numbering_is_a_hot_update_and_indexed_beside() {
    let (db, pool, ordered, _) = setup().await;
    let ids = ingest_one_by_one(&pool, &ordered, 10).await;
    let client = pool.get().await.unwrap();
    client.batch_execute("SELECT pg_stat_force_next_flush()").await.unwrap();
    let before = update_counts(&db).await;
    let results = store::claim_batch(&client, &requests(&ids), &limits()).await.unwrap();
    assert!(results.iter().all(|r| matches!(r, ClaimResult::Claimed(_))), "{results:?}");
    client.batch_execute("SELECT pg_stat_force_next_flush()").await.unwrap();
    let after = update_counts(&db).await;
    let (updates, hot) = (after.0 - before.0, after.1 - before.1);
    assert_eq!(updates, 10, "one UPDATE per Delivery: the claim's, with its number");
    assert_eq!(hot, updates, "every one HOT");
    let indexed: Vec<(i64, String)> = db
        .client()
        .await
        .query("SELECT q.sequence_number, q.delivery_id::text FROM delivery_sequence q ORDER BY 1", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let expected: Vec<(i64, String)> = ids.iter().enumerate().map(|(i, d)| (i as i64 + 1, d.parse::<DeliveryId>().unwrap().0.to_string())).collect();
    assert_eq!(indexed, expected, "each number indexed with its Delivery");
}

/// A number handed out is written to its row whatever the claim then decides: the claim's
/// UPDATE carries it, a Deferral's too, and a row the batch left alone (a busy answer in the
/// waiting mode writes nothing) gets it at the end. Never a number in `delivery_sequence`
/// that its row lacks.
#[tokio::test]
async fn a_number_handed_out_reaches_its_row_when_the_claim_does_not_take_it() {
    let (db, pool, ordered, _) = setup().await;
    let ids = ingest_one_by_one(&pool, &ordered, 4).await;
    // One request a second to the Endpoint: the first claim takes the window, the next one
    // in the waiting mode answers busy (nothing written), the last two are Deferrals.
    db.client().await.execute("UPDATE endpoints SET rate_limit_per_second = 1 WHERE url LIKE '%/ordered'", &[]).await.unwrap();
    let client = pool.get().await.unwrap();
    let mut reqs = requests(&ids);
    reqs[1].wait = true;
    let results = store::claim_batch(&client, &reqs, &limits()).await.unwrap();
    assert!(matches!(&results[0], ClaimResult::Claimed(c) if c.sequence_number == Some(1)), "{:?}", results[0]);
    assert!(matches!(results[1], ClaimResult::Busy(_)), "{:?}", results[1]);
    assert!(matches!(results[2], ClaimResult::Deferred(_)), "{:?}", results[2]);
    assert!(matches!(results[3], ClaimResult::Deferred(_)), "{:?}", results[3]);
    let all = numbers(&db).await;
    let got: Vec<Option<i64>> = ids.iter().map(|d| number_of(&all, d)).collect();
    assert_eq!(got, vec![Some(1), Some(2), Some(3), Some(4)], "every number handed out is on its row");
    let indexed: i64 = db
        .client()
        .await
        .query_one("SELECT count(*) FROM delivery_sequence q JOIN deliveries d ON d.id = q.delivery_id AND d.sequence_number = q.sequence_number", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(indexed, 4, "delivery_sequence and the rows agree");
}

/// What an ordered claim batch answers (the Ordering Buffer, DESIGN.md 6.5): a batch whose
/// every row is behind its predecessor (held by this claimer, `p_mine`, or earlier in the
/// batch) is claimed behind, numbered, each with its Claim's row and one HOT update; a batch
/// whose first predecessor this claimer does not hold is parked row by row; one whose first
/// predecessor has ended is claimed, the first not behind, the rest behind it. (Written for
/// an ordered fast path of `railhook_claim_batch` tried in the twenty-first session, which
/// had to answer exactly as the row-by-row loop does; it passed on both. The fast path was
/// not kept: docs/BENCHMARKS.md "Issue 30, twenty-first session".)
#[tokio::test]
async fn an_ordered_batch_is_claimed_behind_only_what_this_claimer_holds() {
    let (db, pool, ordered, _) = setup().await;
    let ids = ingest_one_by_one(&pool, &ordered, 13).await;
    let client = pool.get().await.unwrap();
    let claimed = |r: &ClaimResult| match r {
        ClaimResult::Claimed(c) => Some((c.sequence_number, c.behind)),
        _ => None,
    };
    let first = match &store::claim_batch(&client, &requests(&ids[..1]), &limits()).await.unwrap()[0] {
        ClaimResult::Claimed(c) => c.token,
        other => panic!("{other:?}"),
    };

    // Behind the first, which this claimer holds: all four behind, numbered 2 to 5.
    client.batch_execute("SELECT pg_stat_force_next_flush()").await.unwrap();
    let before = update_counts(&db).await;
    let results = store::claim_batch_finishing(&client, &requests(&ids[1..5]), &limits(), &[], &[first]).await.unwrap();
    client.batch_execute("SELECT pg_stat_force_next_flush()").await.unwrap();
    let after = update_counts(&db).await;
    let got: Vec<_> = results.iter().map(claimed).collect();
    assert_eq!(got, (2..=5).map(|n| Some((Some(n), true))).collect::<Vec<_>>(), "{results:?}");
    assert_eq!((after.0 - before.0, after.1 - before.1), (4, 4), "one HOT update per Delivery");
    let claims: i64 = db
        .client()
        .await
        .query_one("SELECT count(*) FROM delivery_claims c JOIN deliveries d ON d.id = c.delivery_id AND d.claim_token = c.claim_token AND d.status = 'PROCESSING'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(claims, 5, "each Claim with its row");

    // Behind the fifth, which this claimer does not say it holds: parked, each behind the one
    // before it, and numbered all the same.
    let results = store::claim_batch_finishing(&client, &requests(&ids[5..9]), &limits(), &[], &[first]).await.unwrap();
    assert!(results.iter().all(|r| matches!(r, ClaimResult::Deferred(_))), "{results:?}");
    let all = numbers(&db).await;
    assert_eq!(ids[5..9].iter().map(|d| number_of(&all, d)).collect::<Vec<_>>(), (6..=9).map(Some).collect::<Vec<_>>());

    // Behind a predecessor that ended: the first is claimed as any Delivery, the rest behind it.
    db.client().await.execute("UPDATE deliveries SET status = 'SUCCESS', claim_token = NULL WHERE sequence_number <= 9", &[]).await.unwrap();
    let results = store::claim_batch_finishing(&client, &requests(&ids[9..13]), &limits(), &[], &[]).await.unwrap();
    let got: Vec<_> = results.iter().map(claimed).collect();
    assert_eq!(got, vec![Some((Some(10), false)), Some((Some(11), true)), Some((Some(12), true)), Some((Some(13), true))], "{results:?}");
}
