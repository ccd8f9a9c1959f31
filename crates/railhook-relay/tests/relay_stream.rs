//! The CDC relay against the real Postgres and Kafka, in process.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use railhook_testkit::relay::{all_announced, current_lsn, insert_outbox, slot, Announcements, Fixture};
use railhook_relay::setup::{prepare, SlotPolicy};
use railhook_relay::RelayError;
use railhook_testkit::{eventually, test_config, TestDb};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

mod common;
use common::Relay;

async fn wait_streaming(client: &tokio_postgres::Client, name: &str) -> i32 {
    eventually(Duration::from_secs(30), "the slot to be streamed from", || async move {
        slot(client, name).await.and_then(|(_, pid)| pid)
    })
    .await
}

/// Drops the slot once its walsender (of a relay just stopped) has gone.
async fn drop_slot(client: &tokio_postgres::Client, name: &str) {
    eventually(Duration::from_secs(30), "the slot to be dropped", || async move {
        client
            .execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", &[&name])
            .await
            .ok()
            .map(|_| ())
    })
    .await
}

/// Drops the slot under a streaming relay, as an operator would: its walsender terminated
/// first, then the drop, until both went through before the relay reconnected.
async fn terminate_and_drop_slot(client: &tokio_postgres::Client, name: &str) {
    eventually(Duration::from_secs(30), "the slot to be dropped", || async move {
        client.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active", &[&name]).await.ok()?;
        client.execute("SELECT pg_drop_replication_slot($1)", &[&name]).await.ok().map(|_| ())
    })
    .await
}

#[tokio::test]
async fn relays_committed_inserts_in_order_per_key_and_confirms_after_acks() {
    let db = TestDb::new().await;
    let config = Arc::new(test_config(&db));
    let client = db.client().await;
    let relay = Relay::start(&config);
    let name = config.relay.slot_name.clone();
    relay.live().await;
    // Its connections name themselves for pg_stat_activity (the walsender's, and the ones the
    // marker, the health sampler and the cleanup open).
    eventually(Duration::from_secs(20), "a connection named railhook-relay", || async {
        let n: i64 = client
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'railhook-relay' AND backend_type = 'client backend'", &[])
            .await
            .unwrap()
            .get(0);
        (n > 0).then_some(())
    })
    .await;

    let project = Uuid::now_v7();
    let endpoints: Vec<Uuid> = (0..4).map(|_| Uuid::now_v7()).collect();
    let mut expected: HashMap<String, Vec<String>> = HashMap::new();
    let mut order = Vec::new();
    let mut txn_lsns = Vec::new();
    for txn in 0..20 {
        let routes: Vec<Uuid> = (0..25).map(|i| endpoints[(txn + i) % 4]).collect();
        let deliveries = insert_outbox(&client, project, &routes).await;
        txn_lsns.push(current_lsn(&client).await);
        order.extend(deliveries.iter().map(|d| railhook_core::DeliveryId(*d).to_string()));
        for (d, r) in deliveries.iter().zip(&routes) {
            expected.entry(railhook_core::EndpointId(*r).to_string()).or_default().push(railhook_core::DeliveryId(*d).to_string());
        }
    }
    let last_commit = current_lsn(&client).await;

    let mut seen = Announcements::subscribe(&config, &config.deliveries_topic());
    if let Err(e) = seen.try_until(Duration::from_secs(20), "500 announcements", |s| s.len() >= 500).await {
        let got: std::collections::HashSet<String> = seen.seen.iter().filter_map(|a| a.delivery_id.clone()).collect();
        let missing: Vec<usize> = order.iter().enumerate().filter(|(_, d)| !got.contains(*d)).map(|(i, _)| i / 25).collect();
        let mut missing_txns = missing.clone();
        missing_txns.dedup();
        eprintln!("missing rows {} in txns {missing_txns:?}; txn end LSNs {txn_lsns:X?}", missing.len());
        let su = railhook_testkit::connect(&railhook_testkit::admin_url().replace("railhook@", "postgres@")).await.unwrap();
        let client = &su;
        let row = client
            .query_one(
                "SELECT r.sent_lsn::text, r.write_lsn::text, r.flush_lsn::text, pg_current_wal_lsn()::text, r.state FROM pg_replication_slots s LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1",
                &[&name],
            )
            .await
            .unwrap();
        let cols: Vec<Option<String>> = (0..5).map(|i| row.get(i)).collect();
        panic!(
            "{e}; relay read {} produced {} errors {} confirmed {:?}; finished {}; sent/write/flush/current/state {cols:?}; last commit {last_commit:X}",
            relay.stats().read.load(Ordering::Relaxed),
            relay.stats().produced.load(Ordering::Relaxed),
            relay.stats().produce_errors.load(Ordering::Relaxed),
            railhook_core::Lsn(relay.stats().confirmed_lsn.load(Ordering::Relaxed)).to_string(),
            relay.task.is_finished(),
        );
    }
    let mut got: HashMap<String, Vec<String>> = HashMap::new();
    for a in &seen.seen {
        assert_eq!(a.reason, "created");
        assert!(a.commit_lsn.is_some(), "commit_lsn header");
        got.entry(a.key.clone()).or_default().push(a.delivery_id.clone().unwrap());
    }
    assert_eq!(got, expected, "every row once, in commit order per key");

    // The slot advances to (at least) the last commit once everything is acknowledged.
    eventually(Duration::from_secs(30), "the slot to confirm the last commit", || {
        let (client, name) = (&client, &name);
        async move { (slot(client, name).await?.0 >= last_commit).then_some(()) }
    })
    .await;
    assert_eq!(relay.stats().produced.load(Ordering::Relaxed), 500);
    assert!(relay.stats().commit_to_ack.get_sample_count() == 500);
    relay.stop().await;
    drop_slot(&client, &name).await;
}

#[tokio::test]
async fn refuses_a_publication_that_publishes_updates() {
    let db = TestDb::new().await;
    let config = Arc::new(test_config(&db));
    let client = db.client().await;
    client.batch_execute(&format!("CREATE PUBLICATION {} FOR TABLE outbox", config.relay.publication_name)).await.unwrap();
    let relay = Relay::start(&config);
    let err = relay.task.await.unwrap().unwrap_err();
    let text = err.to_string();
    assert!(text.contains("publish inserts only") && text.contains("ALTER PUBLICATION"), "{text}");
}

/// WAL written by other tables (here a scratch table; in the cluster also every other
/// test's database) must not pin WAL behind an idle outbox: the heartbeat moves the slot.
#[tokio::test]
async fn an_idle_outbox_does_not_accumulate_lag() {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.relay.status_interval_ms = 200;
    let config = Arc::new(config);
    let client = db.client().await;
    let relay = Relay::start(&config);
    let name = config.relay.slot_name.clone();
    relay.live().await;

    client.batch_execute("CREATE TABLE scratch (id bigint, pad text)").await.unwrap();
    let before = current_lsn(&client).await;
    // About 8 MiB of WAL that the publication does not cover.
    client.batch_execute("INSERT INTO scratch SELECT g, repeat('x', 200) FROM generate_series(1, 30000) g").await.unwrap();
    let written = current_lsn(&client).await - before;
    assert!(written > 4 << 20, "wrote {written} bytes of WAL");
    let started = Instant::now();
    let lag = eventually(Duration::from_secs(30), "the slot lag to drop below 512 KiB", || {
        let (client, name) = (&client, &name);
        async move {
            let confirmed = slot(client, name).await?.0;
            let lag = current_lsn(client).await.saturating_sub(confirmed);
            (lag < 512 << 10).then_some(lag)
        }
    })
    .await;
    eprintln!("idle outbox: {written} bytes of other WAL; lag {lag} bytes after {:?}", started.elapsed());
    relay.stop().await;
    drop_slot(&client, &name).await;
}

/// The slot is dropped under load (its walsender terminated first, as an operator would);
/// the relay recreates it and re-announces the Deliveries still PENDING: every Delivery
/// reaches Kafka.
#[tokio::test]
async fn a_dropped_slot_is_recreated_and_nothing_is_lost() {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.relay.status_interval_ms = 200;
    let config = Arc::new(config);
    let client = db.client().await;
    let pool = railhook_store::build_pool(&config.database).unwrap();
    let fixture = Fixture::create(&client, 3).await;
    let relay = Relay::start(&config);
    let name = config.relay.slot_name.clone();
    relay.live().await;

    let stop_load = CancellationToken::new();
    let load = {
        let (pool, stop) = (pool.clone(), stop_load.clone());
        let fixture = Fixture { project: fixture.project, endpoints: fixture.endpoints.clone() };
        tokio::spawn(async move {
            let mut ids = Vec::new();
            while !stop.is_cancelled() {
                ids.extend(fixture.ingest(&pool, "order.created").await);
            }
            ids
        })
    };
    eventually(Duration::from_secs(30), "some announcements before the drop", || async {
        (relay.stats().produced.load(Ordering::Relaxed) >= 300).then_some(())
    })
    .await;
    // Terminate the walsender and drop the slot before the relay reconnects.
    terminate_and_drop_slot(&client, &name).await;
    eventually(Duration::from_secs(30), "the relay to recreate the slot", || async {
        (relay.metrics.slot_lost.get() == 1).then_some(())
    })
    .await;
    wait_streaming(&client, &name).await;
    // More load after the recovery, then stop.
    let after = relay.stats().produced.load(Ordering::Relaxed);
    eventually(Duration::from_secs(30), "announcements after the recovery", || async {
        (relay.stats().produced.load(Ordering::Relaxed) >= after + 100).then_some(())
    })
    .await;
    stop_load.cancel();
    let ids = load.await.unwrap();
    let pending: i64 = client.query_one("SELECT count(*) FROM deliveries WHERE status = 'PENDING'", &[]).await.unwrap().get(0);
    assert_eq!(pending as usize, ids.len(), "no worker runs: every Delivery is still PENDING");

    let mut seen = Announcements::subscribe(&config, &config.deliveries_topic());
    seen.until(Duration::from_secs(60), "every Delivery announced", |s| s.len() >= ids.len() && all_announced(s, &ids)).await;
    let reannounced = seen.seen.iter().filter(|a| a.reason == "reannounce").count();
    assert!(reannounced > 0, "the recovery re-announced PENDING Deliveries");
    eprintln!("slot drop: {} deliveries, {} announcements, {reannounced} re-announced", ids.len(), seen.seen.len());
    relay.stop().await;
    drop_slot(&client, &name).await;
}

/// A relay that created the slot keeps the setup lock until its stream is live: another
/// relay's setup, waiting on that lock, finds the slot streamed (and waits as a standby)
/// rather than free, so it cannot win START_REPLICATION and leave the re-announcement the
/// creator owes with a standby. Here the other relay's setup is this test's, made again and
/// again (not creating the slot) from before the relay starts.
#[tokio::test]
async fn a_setup_beside_the_relay_that_created_the_slot_finds_it_streamed() {
    let db = TestDb::new().await;
    let config = Arc::new(test_config(&db));
    let name = config.relay.slot_name.clone();
    let client = db.client().await;
    let setup = db.client().await;
    let policy = SlotPolicy { create_missing: false, known: false, recreate_lost: false };
    let relay = Relay::start(&config);
    let deadline = Instant::now() + Duration::from_secs(60);
    let state = loop {
        match prepare(&setup, &config.relay, policy).await {
            Ok(state) => break state,
            // The slot (or the publication) is not there yet.
            Err(RelayError::Misconfigured(_)) if Instant::now() < deadline => continue,
            Err(e) => panic!("setup beside the relay: {e}"),
        }
    };
    assert!(!state.created, "{state:?}");
    assert!(state.active_pid.is_some(), "the first setup to find the slot finds it streamed by its creator: {state:?}");
    relay.live().await;
    relay.stop().await;
    drop_slot(&client, &name).await;
}

/// A setup's session that holds the lock and goes silent (its relay vanished behind a network
/// that drops everything) is ended by Postgres after `setup::SETUP_IDLE_TIMEOUT`, so another
/// relay's setup gets the lock within its own wait (15 s) instead of timing out for as long as
/// the silent session lasts.
#[tokio::test]
async fn a_silent_setup_session_gives_the_lock_up() {
    let db = TestDb::new().await;
    let config = Arc::new(test_config(&db));
    let name = config.relay.slot_name.clone();
    let client = db.client().await;
    let silent = db.client().await;
    let created = prepare(&silent, &config.relay, SlotPolicy::from_config(&config.relay, false)).await.expect("the first setup");
    // It created the slot, so it keeps the lock; and it says nothing more from here on.
    assert!(created.created, "{created:?}");
    let started = Instant::now();
    let other = db.client().await;
    let state = prepare(&other, &config.relay, SlotPolicy::from_config(&config.relay, true)).await.expect("the other setup gets the lock");
    let waited = started.elapsed();
    assert!(!state.created && state.loss.is_none(), "{state:?}");
    assert!(waited >= railhook_relay::setup::SETUP_IDLE_TIMEOUT - Duration::from_secs(1), "it waited for the silent session ({waited:?})");
    eprintln!("the silent session's lock came free after {waited:?}");
    assert!(silent.is_closed() || silent.simple_query("SELECT 1").await.is_err(), "Postgres ended the silent session");
    drop((silent, other));
    drop_slot(&client, &name).await;
}

/// Two relays on one slot (one streaming, one standby) when the slot is dropped: exactly one
/// recreates it, and that one streams and re-announces the PENDING work. Then both are
/// started together on a missing slot. The relay that created the slot holds the setup lock
/// until its stream is live, so the other cannot win START_REPLICATION and leave the
/// re-announcement with a standby (it would then wait for the worker's stranded sweep, an
/// hour).
#[tokio::test]
async fn two_relays_on_a_dropped_slot_recreate_and_reannounce_once() {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.relay.status_interval_ms = 100;
    let config = Arc::new(config);
    let client = db.client().await;
    let pool = railhook_store::build_pool(&config.database).unwrap();
    let fixture = Fixture::create(&client, 2).await;
    let name = config.relay.slot_name.clone();
    let first = Relay::start(&config);
    first.live().await;
    let second = Relay::start(&config);
    eventually(Duration::from_secs(30), "the second relay to wait as a standby", || async {
        (second.metrics.standby.get() == 1).then_some(())
    })
    .await;
    let mut ids = Vec::new();
    for _ in 0..20 {
        ids.extend(fixture.ingest(&pool, "order.created").await);
    }
    let mut seen = Announcements::subscribe(&config, &config.deliveries_topic());
    seen.until(Duration::from_secs(60), "the Deliveries announced", |s| all_announced(s, &ids)).await;

    terminate_and_drop_slot(&client, &name).await;
    let lost = || first.metrics.slot_lost.get() + second.metrics.slot_lost.get();
    eventually(Duration::from_secs(30), "a relay to recreate the slot", || async { (lost() >= 1).then_some(()) }).await;
    // Every Delivery (still PENDING: no worker runs) is announced again, by the relay that
    // recreated the slot, from its own stream.
    seen.until(Duration::from_secs(60), "the PENDING Deliveries re-announced", |s| {
        ids.iter().all(|id| s.iter().any(|a| a.reason == "reannounce" && a.delivery_id.as_deref() == Some(id.as_str())))
    })
    .await;
    wait_streaming(&client, &name).await;
    eventually(Duration::from_secs(30), "the other relay to wait as a standby", || async {
        (first.metrics.standby.get() + second.metrics.standby.get() == 1).then_some(())
    })
    .await;
    assert_eq!(lost(), 1, "one relay recreated the slot and said so");
    first.stop().await;
    second.stop().await;

    // Both stopped, the slot dropped, both started at once (as after a deployment): fresh
    // processes take the missing slot for a first start. One creates it; it must be the one
    // that streams, since the re-announcement is its own stream's to make.
    drop_slot(&client, &name).await;
    let (first, second) = (Relay::start(&config), Relay::start(&config));
    seen.until(Duration::from_secs(60), "the PENDING Deliveries re-announced after the restart", |s| {
        ids.iter().all(|id| s.iter().filter(|a| a.reason == "reannounce" && a.delivery_id.as_deref() == Some(id.as_str())).count() >= 2)
    })
    .await;
    eventually(Duration::from_secs(30), "one relay streaming, the other a standby", || async {
        (first.metrics.standby.get() + second.metrics.standby.get() == 1 && (first.stats().live.load(Ordering::Relaxed) || second.stats().live.load(Ordering::Relaxed))).then_some(())
    })
    .await;
    first.stop().await;
    second.stop().await;
    drop_slot(&client, &name).await;
}

/// Under continuous inserts, outbox rows past the retention are deleted in batches, so the
/// table stays bounded instead of growing with the load.
#[tokio::test]
async fn the_outbox_stays_bounded_under_continuous_load() {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.relay.outbox_retention_seconds = 1;
    config.relay.outbox_cleanup_interval_ms = 200;
    let config = Arc::new(config);
    let client = db.client().await;
    let relay = Relay::start(&config);
    let name = config.relay.slot_name.clone();
    relay.live().await;

    let project = Uuid::now_v7();
    let routes: Vec<Uuid> = (0..20).map(|_| Uuid::now_v7()).collect();
    let started = Instant::now();
    let mut inserted = 0usize;
    let mut largest = 0i64;
    while started.elapsed() < Duration::from_secs(6) {
        insert_outbox(&client, project, &routes).await;
        inserted += routes.len();
        let rows: i64 = client.query_one("SELECT count(*) FROM outbox", &[]).await.unwrap().get(0);
        largest = largest.max(rows);
    }
    eprintln!("outbox retention: inserted {inserted} rows in 6 s, the table held at most {largest}");
    assert!(inserted > 2_000, "the load inserted {inserted} rows");
    // 1 s retention, 200 ms cleanup interval: about 1.2 s of inserts, so well under half.
    assert!((largest as usize) < inserted / 2, "the table held {largest} of {inserted} rows");
    let mut seen = Announcements::subscribe(&config, &config.deliveries_topic());
    seen.until(Duration::from_secs(60), "every row announced", |s| s.len() >= inserted).await;
    relay.stop().await;
    drop_slot(&client, &name).await;
}

/// The startup checks refuse a misconfigured server and say how to fix it.
#[tokio::test]
async fn refuses_a_publication_without_the_outbox_a_foreign_plugin_and_a_missing_slot() {
    // A publication that does not cover the outbox.
    let db = TestDb::new().await;
    let config = Arc::new(test_config(&db));
    let client = db.client().await;
    client
        .batch_execute(&format!("CREATE TABLE other (id int); CREATE PUBLICATION {} FOR TABLE other WITH (publish = 'insert')", config.relay.publication_name))
        .await
        .unwrap();
    let err = Relay::start(&config).task.await.unwrap().unwrap_err().to_string();
    assert!(err.contains("does not include the outbox table") && err.contains("ADD TABLE outbox"), "{err}");

    // A slot of another plugin.
    let db = TestDb::new().await;
    let config = Arc::new(test_config(&db));
    let client = db.client().await;
    client.execute("SELECT pg_create_logical_replication_slot($1, 'test_decoding')", &[&config.relay.slot_name]).await.unwrap();
    let err = Relay::start(&config).task.await.unwrap().unwrap_err().to_string();
    assert!(err.contains("uses plugin test_decoding") && err.contains("slot drop"), "{err}");
    drop_slot(&client, &config.relay.slot_name).await;

    // No slot, and not allowed to create one.
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.relay.create_slot = false;
    let config = Arc::new(config);
    let client = db.client().await;
    client.batch_execute(&format!("CREATE PUBLICATION {} FOR TABLE outbox WITH (publish = 'insert')", config.relay.publication_name)).await.unwrap();
    let err = Relay::start(&config).task.await.unwrap().unwrap_err().to_string();
    assert!(err.contains("does not exist") && err.contains("pg_create_logical_replication_slot"), "{err}");
}

/// Issue 30: once the stream is live the relay switches announcements to logical decoding
/// messages; an ingest then writes no outbox row, one message announces every Delivery of
/// the statement, a rolled-back announcement is never produced, and the polling relay
/// switches back to rows and announces again what is PENDING.
#[tokio::test]
async fn announcements_are_logical_decoding_messages_while_the_cdc_relay_streams() {
    use railhook_store::lifecycle::announce::{via, Via};
    let db = TestDb::new().await;
    let config = Arc::new(test_config(&db));
    let client = db.client().await;
    let pool = railhook_store::build_pool(&config.database).unwrap();
    assert_eq!(via(&client).await.unwrap(), Via::Outbox, "rows until a relay says otherwise");
    let relay = Relay::start(&config);
    relay.live().await;
    eventually(Duration::from_secs(20), "the switch to say message", || async { (via(&client).await.unwrap() == Via::Message).then_some(()) }).await;

    let fixture = Fixture::create(&client, 3).await;
    let mut deliveries = Vec::new();
    for _ in 0..5 {
        deliveries.extend(fixture.ingest(&pool, "order.paid").await);
    }
    assert_eq!(deliveries.len(), 15, "three Endpoints, five events");
    let rows: i64 = client.query_one("SELECT count(*) FROM outbox", &[]).await.unwrap().get(0);
    assert_eq!(rows, 0, "no outbox row while announcements are messages");

    // A transaction that announces and rolls back announces nothing.
    let ghost = Uuid::now_v7();
    client.batch_execute("BEGIN").await.unwrap();
    client
        .execute("SELECT railhook_announce('d', ARRAY[$1::uuid], ARRAY[$2::uuid], ARRAY[$3::uuid], 'created')", &[&fixture.project.0, &ghost, &fixture.endpoints[0].0])
        .await
        .unwrap();
    client.batch_execute("ROLLBACK").await.unwrap();
    let after = fixture.ingest(&pool, "order.paid").await;
    deliveries.extend(after.clone());

    let mut seen = Announcements::subscribe(&config, &config.deliveries_topic());
    seen.until(Duration::from_secs(60), "every Delivery announced", |s| all_announced(s, &deliveries)).await;
    let counts = seen.delivery_counts();
    assert!(deliveries.iter().all(|d| counts[d] == 1), "each once: {counts:?}");
    assert!(!counts.contains_key(&railhook_core::DeliveryId(ghost).to_string()), "the rolled-back announcement never went out");
    for a in &seen.seen {
        assert_eq!((a.outbox_id, a.reason.as_str()), (0, "created"), "{a:?}");
        assert!(a.commit_lsn.is_some(), "the commit's LSN travels as with rows: {a:?}");
        let endpoint: railhook_core::EndpointId = a.key.parse().unwrap();
        assert!(fixture.endpoints.contains(&endpoint), "keyed by the Endpoint");
    }
    relay.stop().await;

    // The poller reads rows: it switches back and announces the PENDING Deliveries again.
    railhook_relay::poll::announce_by_outbox(&client).await.unwrap();
    assert_eq!(via(&client).await.unwrap(), Via::Outbox);
    let reannounced: i64 = client.query_one("SELECT count(*) FROM outbox WHERE reason = 'reannounce'", &[]).await.unwrap().get(0);
    assert_eq!(reannounced, deliveries.len() as i64, "every PENDING Delivery, as a row");
    railhook_relay::poll::announce_by_outbox(&client).await.unwrap();
    let again: i64 = client.query_one("SELECT count(*) FROM outbox", &[]).await.unwrap().get(0);
    assert_eq!(again, reannounced, "already rows: nothing announced again");
    drop_slot(&client, &config.relay.slot_name).await;
}
