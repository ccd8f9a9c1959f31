//! Two relays set up one slot at the same moment, after Postgres invalidated it (a private
//! cluster: invalidating needs a tiny `max_slot_wal_keep_size`, which the shared server's
//! other tests must not get).
//!
//! Before the setup was serialised, the full chaos run saw this: one relay found the slot
//! lost and dropped it, the other (a fresh process) found no slot in between and created it
//! as on a first start, and the first then failed to create it. The PENDING work was
//! re-announced, but neither relay reported the loss. Now exactly one setup reports the
//! invalidation and the other finds the recreated slot.

use railhook_config::RelayConfig;
use railhook_relay::setup::{prepare, SlotLoss, SlotPolicy, SlotState};
use railhook_relay::RelayError;
use railhook_testkit::pg::PgCluster;

async fn connect(url: &str) -> tokio_postgres::Client {
    railhook_testkit::connect(url).await.expect("connect to the private Postgres")
}

/// Writes WAL past a 1 MB `max_slot_wal_keep_size` until the slot is lost (as the chaos
/// suite's `slot_invalidation`), then resets the setting.
async fn invalidate(admin: &tokio_postgres::Client, slot: &str) {
    admin.batch_execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'").await.unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    let mut status = String::new();
    for _ in 0..30 {
        for _ in 0..4 {
            admin.batch_execute("SELECT pg_logical_emit_message(false, 'railhook.test', 'filler')").await.unwrap();
            admin.batch_execute("SELECT pg_switch_wal()").await.unwrap();
        }
        admin.batch_execute("CHECKPOINT").await.unwrap();
        status = admin
            .query_one("SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", &[&slot])
            .await
            .unwrap()
            .get::<_, Option<String>>(0)
            .unwrap_or_default();
        if status == "lost" {
            break;
        }
    }
    admin.batch_execute("ALTER SYSTEM RESET max_slot_wal_keep_size").await.unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    assert_eq!(status, "lost", "the slot was invalidated");
}

#[tokio::test]
async fn two_relays_setting_up_a_lost_slot_report_the_loss_once() {
    let pg = PgCluster::start().await;
    let admin = connect(&pg.url("postgres")).await;
    admin.batch_execute("CREATE DATABASE railhook").await.expect("create database");
    let url = pg.url("railhook");
    let mut migrations = connect(&url).await;
    railhook_store::Migrator::embedded().run(&mut migrations).await.expect("migrate");
    drop(migrations);
    let config = RelayConfig::default();
    let slot = config.slot_name.clone();
    let admin = connect(&url).await;

    // A first start creates the publication and the slot.
    let first = prepare(&connect(&url).await, &config, SlotPolicy::from_config(&config, false)).await.expect("first setup");
    assert!(first.created && first.loss.is_none(), "a first start creates the slot: {first:?}");

    // Rounds, each a fresh invalidation and two setups started together: the relay that
    // streamed from the slot (known) and one just started beside it (not known).
    for round in 0..3 {
        invalidate(&admin, &slot).await;
        let (a, b) = (connect(&url).await, connect(&url).await);
        // Each closes its session when its setup is done, as the relay's supervisor does (the
        // one that created the slot later, once its stream is live; at once here).
        let shared = &config;
        let (known, fresh) = tokio::join!(
            async move { prepare(&a, shared, SlotPolicy::from_config(shared, true)).await },
            async move { prepare(&b, shared, SlotPolicy::from_config(shared, false)).await },
        );
        let results: Vec<Result<SlotState, RelayError>> = vec![known, fresh];
        let states: Vec<&SlotState> = results.iter().map(|r| r.as_ref().unwrap_or_else(|e| panic!("round {round}: a setup failed: {e}"))).collect();
        let invalidated = states.iter().filter(|s| matches!(s.loss, Some(SlotLoss::Invalidated { .. }))).count();
        let created = states.iter().filter(|s| s.created).count();
        assert_eq!(invalidated, 1, "round {round}: one setup reports the invalidation: {states:?}");
        assert_eq!(created, 1, "round {round}: the slot is recreated once, by the one that reports it: {states:?}");
        assert!(states.iter().all(|s| s.recovered == s.loss.is_some()), "round {round}: {states:?}");
        let status: Option<String> =
            admin.query_one("SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", &[&slot]).await.unwrap().get(0);
        assert_ne!(status.as_deref(), Some("lost"), "round {round}: the slot is usable again");
        // The setups' locks are gone with their sessions: a third setup goes through.
        let again = prepare(&connect(&url).await, &config, SlotPolicy::from_config(&config, true)).await.expect("a later setup");
        assert!(!again.created && again.loss.is_none(), "round {round}: {again:?}");
    }
}
