//! Migrations against the real Postgres: idempotent, checksummed, refusing edits.

use railhook_store::{Migration, Migrator, StoreError};
use railhook_testkit::TestDb;

#[tokio::test]
async fn template_clone_has_the_schema_and_migrate_is_a_no_op() {
    let db = TestDb::new().await;
    let mut client = db.client().await;
    let report = Migrator::embedded().run(&mut client).await.unwrap();
    assert!(report.applied.is_empty(), "a cloned database is already migrated: {:?}", report.applied);
    assert_eq!(report.already_applied, Migrator::embedded().migrations().len());
    for table in ["organizations", "projects", "api_keys", "endpoints", "endpoint_secrets", "subscriptions", "events", "deliveries", "attempts", "outbox", "sources", "destinations", "incoming_events", "forwards"] {
        let n: i64 = client
            .query_one("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public' AND table_name = $1", &[&table])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 1, "table {table} is missing");
    }
}

#[tokio::test]
async fn fresh_database_migrates_in_order_and_records_checksums() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client.batch_execute("CREATE SCHEMA fresh; SET search_path = fresh").await.unwrap();
    // A second connection whose default search path is the empty schema.
    let url = format!("{}?options=-csearch_path%3Dfresh", db.url);
    let mut fresh = railhook_testkit::connect(&url).await.unwrap();
    let report = Migrator::embedded().run(&mut fresh).await.unwrap();
    let migrator = Migrator::embedded();
    let names: Vec<&str> = migrator.migrations().iter().map(|m| m.name.as_str()).collect();
    assert_eq!(report.applied, names.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    let rows = fresh.query("SELECT name, checksum FROM fresh.railhook_migrations ORDER BY version", &[]).await.unwrap();
    assert_eq!(rows.len(), names.len());
    for (row, m) in rows.iter().zip(Migrator::embedded().migrations()) {
        assert_eq!(row.get::<_, String>(1), m.checksum());
    }
    let again = Migrator::embedded().run(&mut fresh).await.unwrap();
    assert!(again.applied.is_empty());
}

#[tokio::test]
async fn an_edited_migration_is_refused() {
    let db = TestDb::new().await;
    let mut client = db.client().await;
    let mut migrations: Vec<Migration> = Migrator::embedded().migrations().to_vec();
    migrations[1].sql.push_str("\n-- edited\n");
    let err = Migrator::new(migrations).run(&mut client).await.unwrap_err();
    match err {
        StoreError::MigrationTampered { name, .. } => assert_eq!(name, Migrator::embedded().migrations()[1].name),
        other => panic!("expected MigrationTampered, got {other}"),
    }
}

#[tokio::test]
async fn a_database_newer_than_the_build_is_refused() {
    let db = TestDb::new().await;
    let mut client = db.client().await;
    let mut migrations: Vec<Migration> = Migrator::embedded().migrations().to_vec();
    migrations.pop();
    let err = Migrator::new(migrations).run(&mut client).await.unwrap_err();
    assert!(matches!(err, StoreError::MigrationUnknown(_)), "{err}");
}

#[tokio::test]
async fn a_failing_migration_leaves_nothing_behind() {
    let db = TestDb::new().await;
    let mut client = db.client().await;
    let mut migrations: Vec<Migration> = Migrator::embedded().migrations().to_vec();
    migrations.push(Migration { version: 9999, name: "9999_broken".into(), sql: "CREATE TABLE half_done (x int); SELECT no_such_function();".into() });
    assert!(Migrator::new(migrations).run(&mut client).await.is_err());
    let n: i64 = client.query_one("SELECT count(*) FROM pg_tables WHERE tablename = 'half_done'", &[]).await.unwrap().get(0);
    assert_eq!(n, 0, "the failed migration's transaction must roll back");
    let recorded: i64 = client.query_one("SELECT count(*) FROM railhook_migrations WHERE version = 9999", &[]).await.unwrap().get(0);
    assert_eq!(recorded, 0);
}

#[tokio::test]
async fn each_test_gets_its_own_database() {
    let (a, b) = tokio::join!(TestDb::new(), TestDb::new());
    assert_ne!(a.name, b.name);
    let ca = a.client().await;
    let cb = b.client().await;
    ca.batch_execute("INSERT INTO organizations (id, name) VALUES (gen_random_uuid(), 'only in a')").await.unwrap();
    let n: i64 = cb.query_one("SELECT count(*) FROM organizations", &[]).await.unwrap().get(0);
    assert_eq!(n, 0);
    let n: i64 = ca.query_one("SELECT count(*) FROM organizations", &[]).await.unwrap().get(0);
    assert_eq!(n, 1);
}

#[tokio::test]
async fn server_is_configured_for_logical_replication() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let facts = railhook_store::server::server_facts(&client).await.unwrap();
    facts.check_logical_replication().unwrap();
    assert!(facts.max_replication_slots >= 16, "parallel tests need slots: {}", facts.max_replication_slots);
    assert!(facts.max_slot_wal_keep_size_mb > 0, "max_slot_wal_keep_size must be bounded");
}

#[tokio::test]
async fn a_repeatable_migration_is_applied_again_only_when_its_text_changes() {
    let db = TestDb::new().await;
    let mut client = db.client().await;
    let repeatable = |body: &str| Migration {
        version: 0,
        name: "test_rule".into(),
        sql: format!("CREATE OR REPLACE FUNCTION rh_test_rule() RETURNS text LANGUAGE sql AS $$ SELECT '{body}' $$;"),
    };
    let migrator = |body: &str| Migrator::new(Migrator::embedded().migrations().to_vec()).with_repeatables(vec![repeatable(body)]);

    let first = migrator("one").run(&mut client).await.unwrap();
    assert_eq!(first.repeatables_applied, vec!["test_rule".to_string()]);
    assert_eq!(rule(&client).await, "one");
    let same = migrator("one").run(&mut client).await.unwrap();
    assert!(same.repeatables_applied.is_empty(), "unchanged text is not applied again");
    let edited = migrator("two").run(&mut client).await.unwrap();
    assert_eq!(edited.repeatables_applied, vec!["test_rule".to_string()]);
    assert_eq!(rule(&client).await, "two", "the edited rule is in force");
    let recorded: String = client.query_one("SELECT checksum FROM railhook_repeatables WHERE name = 'test_rule'", &[]).await.unwrap().get(0);
    assert_eq!(recorded, repeatable("two").checksum());
}

#[tokio::test]
async fn the_lifecycle_rules_are_applied_and_recorded() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let (name, sql) = railhook_store::lifecycle::REPEATABLES[0];
    let recorded: String = client.query_one("SELECT checksum FROM railhook_repeatables WHERE name = $1", &[&name]).await.unwrap().get(0);
    assert_eq!(recorded, Migration { version: 0, name: name.into(), sql: sql.into() }.checksum());
    // rules.sql is what the claim runs: its disabled-endpoint rule is in the function body.
    let body: String = client.query_one("SELECT prosrc FROM pg_proc WHERE proname = 'railhook_claim_batch' AND pronargs = 13", &[]).await.unwrap().get(0);
    assert!(body.contains("endpoint_disabled"));
    // The signatures before `p_finishing` and before `p_announced`/`p_mine` stay, for
    // workers of previous builds, and call it.
    for nargs in [10i16, 11] {
        let wrapper: String = client.query_one("SELECT prosrc FROM pg_proc WHERE proname = 'railhook_claim_batch' AND pronargs = $1", &[&nargs]).await.unwrap().get(0);
        assert!(wrapper.contains("railhook_claim_batch("), "{wrapper}");
    }
}

async fn rule(client: &tokio_postgres::Client) -> String {
    client.query_one("SELECT rh_test_rule()", &[]).await.unwrap().get(0)
}
