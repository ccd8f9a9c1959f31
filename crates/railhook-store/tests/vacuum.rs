//! The worker's vacuum of the Claims' table (`lifecycle::vacuum_claims`, issue 30): a
//! Project's count of its Claims reads the dead index entries of every Claim finalised since
//! the last vacuum, and after the vacuum only the live ones.

use railhook_store::lifecycle as store;
use railhook_testkit::relay::Fixture;

/// Shared buffers the count of a Project's Claims reads (a bitmap scan, as the claim's
/// counts may be planned: it never marks dead index entries, so each count reads them all).
async fn count_reads(client: &tokio_postgres::Client, project: uuid::Uuid) -> i64 {
    client.batch_execute("SET enable_seqscan = off; SET enable_indexscan = off; SET enable_indexonlyscan = off").await.unwrap();
    let plan: serde_json::Value = client
        .query_one("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT count(*) FROM delivery_claims WHERE project_id = $1", &[&project])
        .await
        .unwrap()
        .get(0);
    client.batch_execute("RESET enable_seqscan; RESET enable_indexscan; RESET enable_indexonlyscan").await.unwrap();
    plan[0]["Plan"]["Shared Hit Blocks"].as_i64().unwrap() + plan[0]["Plan"]["Shared Read Blocks"].as_i64().unwrap()
}

#[tokio::test]
async fn the_vacuum_leaves_the_claims_count_only_the_live_claims_to_read() {
    let (_db, pool, fixture) = Fixture::in_fresh_db(2).await;
    let client = pool.get().await.unwrap();
    let project = fixture.project.0;
    let endpoint = fixture.endpoints[0].0;
    // 20,000 Claims made and finalised (their rows removed), then 5 in flight.
    let claim_rows = "INSERT INTO delivery_claims (project_id, endpoint_id, delivery_id, claim_token) \
                      SELECT $1, $2, gen_random_uuid(), gen_random_uuid() FROM generate_series(1, $3::int)";
    client.execute(claim_rows, &[&project, &endpoint, &20_000i32]).await.unwrap();
    client.execute("DELETE FROM delivery_claims", &[]).await.unwrap();
    client.execute(claim_rows, &[&project, &endpoint, &5i32]).await.unwrap();
    let before = count_reads(&client, project).await;
    store::vacuum_claims(&**client).await.unwrap();
    let after = count_reads(&client, project).await;
    eprintln!("count of a Project's Claims: {before} buffers before the vacuum, {after} after");
    assert!(before >= 50, "the dead entries are read before the vacuum: {before} buffers");
    assert!(after <= 20, "only the live Claims' pages after it: {after} buffers");
    let live: i64 = client.query_one("SELECT count(*) FROM delivery_claims", &[]).await.unwrap().get(0);
    assert_eq!(live, 5, "the Claims in flight are kept");
}
