//! The decoder against bytes the running Postgres produces now, not only the fixtures.

use railhook_relay::outbox::Relations;
use railhook_relay::pgoutput::{decode, Message};
use railhook_testkit::{test_config, TestDb};

#[tokio::test]
async fn decodes_what_the_server_emits_for_outbox_inserts() {
    let db = TestDb::new().await;
    let slot = test_config(&db).relay.slot_name;
    let client = db.client().await;
    client.batch_execute("CREATE PUBLICATION live_pub FOR TABLE outbox WITH (publish = 'insert')").await.unwrap();
    client.query_one("SELECT 1 FROM pg_create_logical_replication_slot($1, 'pgoutput')", &[&slot]).await.unwrap();

    let project = uuid::Uuid::now_v7();
    let endpoint = uuid::Uuid::now_v7();
    let mut expected = Vec::new();
    for txn in 0..3 {
        let tx_rows: Vec<uuid::Uuid> = (0..(txn + 1) * 50).map(|_| uuid::Uuid::now_v7()).collect();
        client
            .execute(
                "INSERT INTO outbox (project_id, delivery_id, routing_id, reason) SELECT $1, d, $2, 'created' FROM unnest($3::uuid[]) d",
                &[&project, &endpoint, &tx_rows],
            )
            .await
            .unwrap();
        expected.extend(tx_rows);
    }
    // An update and a delete must not reach an insert-only publication.
    client.batch_execute("UPDATE outbox SET poll_status = 'PUBLISHED' WHERE id = 1; DELETE FROM outbox WHERE id = 2").await.unwrap();

    let rows = client
        .query(
            "SELECT data FROM pg_logical_slot_get_binary_changes($1, NULL, NULL, 'proto_version', '1', 'publication_names', 'live_pub')",
            &[&slot],
        )
        .await
        .unwrap();
    let mut relations = Relations::default();
    let (mut begins, mut commits) = (0, 0);
    let mut got = Vec::new();
    let mut last_end = railhook_core::Lsn::ZERO;
    for row in &rows {
        let data: Vec<u8> = row.get(0);
        match decode(&data).unwrap() {
            Message::Begin { .. } => begins += 1,
            Message::Commit { end_lsn, .. } => {
                assert!(end_lsn > last_end, "commit end LSNs increase");
                last_end = end_lsn;
                commits += 1;
            }
            Message::Relation(rel) => relations.insert(&rel).unwrap(),
            Message::Insert { relation_id, tuple } => got.push(relations.row(relation_id, &tuple).unwrap().delivery_id.unwrap().0),
            other => panic!("unexpected {other:?}"),
        }
    }
    client.query_one("SELECT pg_drop_replication_slot($1)", &[&slot]).await.unwrap();
    assert_eq!(got, expected, "every insert, in commit order");
    assert_eq!(begins, commits);
    assert!(commits >= 3);
}
