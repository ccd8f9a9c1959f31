//! A starting worker readies its connections (`lifecycle::warm`, issue 30): the claim, its
//! read and the finalise are prepared on the connection, and the claim ran once, for a
//! Delivery that does not exist, without writing anything. (The counting query is itself
//! a prepared statement while it runs.)

use railhook_store::lifecycle::{self as store, Limits};
use railhook_testkit::relay::Fixture;

#[tokio::test]
async fn warming_a_connection_prepares_the_delivery_path_and_writes_nothing() {
    let (_db, pool, fixture) = Fixture::in_fresh_db(1).await;
    let pending = fixture.ingest(&pool, "order.created").await;
    assert_eq!(pending.len(), 1);
    let client = pool.get().await.unwrap();
    let prepared = |sql: &'static str| {
        let client = &client;
        async move { client.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) }
    };
    let before = prepared("SELECT count(*) FROM pg_prepared_statements").await;
    let limits = Limits { endpoint_concurrency: 10, project_concurrency: 100, project_rate: 0, circuit_cooldown_s: 30.0, probe_timeout_s: 300.0, ordering_gap_s: 60.0, synchronous_commit: false };
    store::warm(&client, &limits).await.unwrap();
    let names = prepared("SELECT count(*) FROM pg_prepared_statements WHERE statement NOT LIKE '%pg_prepared_statements%' AND (statement LIKE '%railhook_finalise_batch%' OR statement LIKE '%railhook_claim_batch%' OR statement LIKE '%railhook_claimed%')").await;
    assert_eq!(names, 3, "the finalise, the claim and its read are prepared");
    assert_eq!(prepared("SELECT count(*) FROM pg_prepared_statements").await, before + 3);
    // Nothing written: the one Delivery is as it was, no Claim, no Attempt.
    assert_eq!(prepared("SELECT count(*) FROM deliveries WHERE status = 'PENDING' AND claim_token IS NULL").await, 1);
    assert_eq!(prepared("SELECT count(*) FROM deliveries").await, 1);
    assert_eq!(prepared("SELECT count(*) FROM delivery_claims").await, 0);
    assert_eq!(prepared("SELECT count(*) FROM attempts").await, 0);
    // Again on the same connection: the statements are the cached ones.
    store::warm(&client, &limits).await.unwrap();
    assert_eq!(prepared("SELECT count(*) FROM pg_prepared_statements").await, before + 3);
}
