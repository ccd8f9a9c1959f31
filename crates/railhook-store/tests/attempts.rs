//! The attempt log's daily partitions (migration 0017, `railhook_store::attempts`) against the
//! real Postgres: a finalised Attempt lands in its day's partition, one whose day has no
//! partition lands in the default one without failing the finalise and moves out when its
//! day's partition is made; retention drops the partitions before a cutoff and keeps the rest;
//! migration 0017 copies the Attempts of an existing database into partitions.

use chrono::{DateTime, Duration, Utc};
use railhook_core::pattern::{candidate_patterns, EventType};
use railhook_core::{ClaimToken, DeliveryId};
use railhook_store::attempts::{self, partition_name};
use railhook_store::lifecycle::{self, AttemptRecord, Circuit, ClaimRequest, ClaimResult, Claimed, FinaliseRequest, Limits, Next};
use railhook_store::{events, Migrator};
use railhook_testkit::relay::Fixture;
use railhook_testkit::TestDb;
use tokio_postgres::types::Json;
use tokio_postgres::Client;
use uuid::Uuid;

const LIMITS: Limits = Limits { endpoint_concurrency: 0, project_concurrency: 0, project_rate: 0, circuit_cooldown_s: 30.0, probe_timeout_s: 300.0, ordering_gap_s: 60.0, synchronous_commit: false };
const CIRCUIT: Circuit = Circuit { window_s: 60.0, min_volume: 1000, ratio: 0.5 };

/// One Event through the ingest's own statement (any client: the migration test's runs in
/// a schema of its own); its Deliveries, one per Endpoint.
async fn ingest(client: &Client, fixture: &Fixture) -> Vec<DeliveryId> {
    let ty = EventType::parse("order.paid").unwrap();
    let payload = serde_json::json!({"n": 1});
    let rows = client
        .query(
            events::INGEST_SQL,
            &[&Uuid::now_v7(), &fixture.project.0, &"order.paid", &Json(&payload), &None::<&str>, &vec![0u8; 32], &candidate_patterns(&ty), &events::DEFAULT_OUTGOING_DELAYS.to_vec(), &None::<Vec<u8>>, &None::<&str>, &None::<&str>],
        )
        .await
        .unwrap();
    assert!(!rows.is_empty());
    let event: Uuid = client.query_one("SELECT id FROM events ORDER BY created_at DESC, id DESC LIMIT 1", &[]).await.unwrap().get(0);
    client
        .query("SELECT id FROM deliveries WHERE event_id = $1 ORDER BY id", &[&event])
        .await
        .unwrap()
        .iter()
        .map(|r| DeliveryId(r.get(0)))
        .collect()
}

async fn claim(pool: &railhook_store::Pool, deliveries: &[DeliveryId]) -> Vec<Claimed> {
    let requests: Vec<ClaimRequest> = deliveries.iter().map(|d| ClaimRequest { delivery: *d, token: ClaimToken::new(), hint: None, wait: false, announced_at: None, position: None }).collect();
    lifecycle::claim_batch(&pool.get().await.unwrap(), &requests, &LIMITS)
        .await
        .unwrap()
        .into_iter()
        .map(|r| match r {
            ClaimResult::Claimed(c) => *c,
            other => panic!("expected a claim, got {other:?}"),
        })
        .collect()
}

fn record(started_at: DateTime<Utc>) -> AttemptRecord {
    AttemptRecord {
        started_at,
        duration_ms: 12,
        status_code: Some(500),
        result: "http_status".into(),
        error_message: Some("HTTP 500 Internal Server Error".into()),
        request_headers: serde_json::json!({"webhook-id": "dlv_x", "webhook-signature": "v1,abc=", "authorization": "<redacted>"}),
        response_headers: serde_json::json!({"content-type": "text/plain"}),
        response_body: "down".into(),
        response_truncated: false,
    }
}

/// The partition each Attempt of these Deliveries is in.
async fn partition_of(client: &Client, delivery: DeliveryId) -> Vec<String> {
    client
        .query("SELECT tableoid::regclass::text FROM attempts WHERE delivery_id = $1 ORDER BY started_at", &[&delivery.0])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test]
async fn attempts_land_in_their_day_and_a_day_without_a_partition_does_not_fail_the_finalise() {
    let (db, pool, fixture) = Fixture::in_fresh_db(3).await;
    let client = db.client().await;
    let now = Utc::now();
    let made = attempts::ensure_partitions(&client, now, 2).await.unwrap();
    // The template may be older than today: whatever was missing was made, and nothing twice.
    assert!(attempts::ensure_partitions(&client, now, 2).await.unwrap().is_empty(), "made again: {made:?}");
    let names: Vec<String> = attempts::partitions(&client).await.unwrap().into_iter().map(|p| p.name).collect();
    for day in 0..=2 {
        assert!(names.contains(&partition_name((now + Duration::days(day)).date_naive())), "{names:?}");
    }

    let deliveries = ingest(&client, &fixture).await;
    let claimed = claim(&pool, &deliveries).await;
    let pooled = pool.get().await.unwrap();
    let far = now + Duration::days(40);
    let times = [now, now + Duration::days(1), far];
    let requests: Vec<FinaliseRequest> = claimed
        .iter()
        .zip(times)
        .map(|(c, at)| FinaliseRequest::new(c, Next::RetryAt(now + Duration::seconds(60)), Some("HTTP 500".into()), record(at), false))
        .collect();
    let finalised = lifecycle::finalise_batch(&pooled, &requests, &CIRCUIT).await.unwrap();
    assert!(finalised.iter().all(|f| f.wrote), "every finalise held its Claim: {finalised:?}");
    assert_eq!(partition_of(&client, claimed[0].id).await, vec![partition_name(now.date_naive())]);
    assert_eq!(partition_of(&client, claimed[1].id).await, vec![partition_name((now + Duration::days(1)).date_naive())]);
    assert_eq!(partition_of(&client, claimed[2].id).await, vec!["attempts_default".to_string()], "no partition 40 days ahead: the default");

    // A finalise made again (lost reply) records nothing twice, in a partition or the default.
    let again = lifecycle::finalise_batch(&pooled, &requests, &CIRCUIT).await.unwrap();
    assert!(again.iter().all(|f| !f.wrote));
    let n: i64 = client.query_one("SELECT count(*) FROM attempts", &[]).await.unwrap().get(0);
    assert_eq!(n, 3);

    // The request headers are on record as given.
    let headers: serde_json::Value =
        client.query_one("SELECT request_headers FROM attempts WHERE delivery_id = $1", &[&claimed[0].id.0]).await.unwrap().get(0);
    assert_eq!(headers["webhook-signature"], "v1,abc=");

    // The next ensure makes the far day's partition and moves the row there.
    let made = attempts::ensure_partitions(&client, now, 2).await.unwrap();
    assert_eq!(made, vec![partition_name(far.date_naive())]);
    assert_eq!(partition_of(&client, claimed[2].id).await, vec![partition_name(far.date_naive())]);
    let left: i64 = client.query_one("SELECT count(*) FROM attempts_default", &[]).await.unwrap().get(0);
    assert_eq!(left, 0);
}

#[tokio::test]
async fn retention_drops_the_partitions_before_the_cutoff_and_keeps_the_rest() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let fixture = Fixture::create(&client, 1).await;
    let delivery = ingest(&client, &fixture).await[0];
    let now = Utc::now();
    attempts::ensure_partitions(&client, now - Duration::days(10), 12).await.unwrap();
    for (n, days_ago) in [(1, 10), (2, 9), (3, 0)] {
        client
            .execute(
                "INSERT INTO attempts (id, project_id, delivery_id, attempt_number, started_at, duration_ms, result)
                 VALUES ($1, $2, $3, $4, $5, 5, 'timeout')",
                &[&Uuid::now_v7(), &fixture.project.0, &delivery.0, &n, &(now - Duration::days(days_ago))],
            )
            .await
            .unwrap();
    }
    let ten = partition_name((now - Duration::days(10)).date_naive());
    let nine = partition_name((now - Duration::days(9)).date_naive());
    assert_eq!(partition_of(&client, delivery).await, vec![ten.clone(), nine.clone(), partition_name(now.date_naive())]);

    // The cutoff falls inside day -9: day -10 ends before it and goes; day -9 holds Attempts
    // after the cutoff and stays.
    let cutoff = now - Duration::days(9);
    let dropped = attempts::drop_partitions_before(&client, cutoff).await.unwrap();
    assert!(dropped.contains(&ten), "{dropped:?}");
    assert!(!dropped.contains(&nine), "{dropped:?}");
    let left = attempts::partitions(&client).await.unwrap();
    assert!(left.iter().all(|p| p.to > cutoff), "{left:?}");
    assert!(left.iter().any(|p| p.name == nine));
    let numbers: Vec<i32> = client
        .query("SELECT attempt_number FROM attempts WHERE delivery_id = $1 ORDER BY attempt_number", &[&delivery.0])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(numbers, vec![2, 3], "only day -10's Attempt went");
    assert!(attempts::drop_partitions_before(&client, cutoff).await.unwrap().is_empty(), "nothing left to drop");

    // Nothing but a daily partition of attempts can be dropped through the function.
    let refused = client.execute("SELECT railhook_attempt_partition_drop('deliveries', '1s')", &[]).await;
    assert!(refused.is_err());
}

#[tokio::test]
async fn migration_0017_copies_existing_attempts_into_daily_partitions() {
    let db = TestDb::new().await;
    let admin = db.client().await;
    admin.batch_execute("CREATE SCHEMA before17").await.unwrap();
    let url = format!("{}?options=-csearch_path%3Dbefore17", db.url);
    let mut client = railhook_testkit::connect(&url).await.unwrap();
    let up_to_16: Vec<_> = Migrator::embedded().migrations().iter().filter(|m| m.version < 17).cloned().collect();
    Migrator::new(up_to_16).run(&mut client).await.unwrap();

    // Today's ingest announces through `railhook_announce` (migration 0030 and its
    // repeatable); a database at 0016 has neither, so the rows' announcements are outbox rows
    // made by a stand-in, as the ingest of that time made them.
    client
        .batch_execute(
            "CREATE FUNCTION railhook_announce(p_kind \"char\", p_projects uuid[], p_ids uuid[], p_routing uuid[], p_reason text, p_tokens uuid[] DEFAULT NULL,
                                                p_traceparents text[] DEFAULT NULL, p_tracestates text[] DEFAULT NULL)
             RETURNS integer LANGUAGE sql AS $$
                 INSERT INTO outbox (project_id, delivery_id, routing_id, reason) SELECT * FROM unnest(p_projects, p_ids, p_routing) , LATERAL (SELECT p_reason) r;
                 SELECT coalesce(cardinality(p_ids), 0) $$;
             -- Today's ingest also writes the Event's trace context (migration 0033) and a
             -- Delivery's `ordered` (0035): the columns stand in for the ingest below and go
             -- again before the migrations run.
             ALTER TABLE events ADD COLUMN traceparent text, ADD COLUMN tracestate text;
             ALTER TABLE deliveries ADD COLUMN ordered boolean NOT NULL DEFAULT false;",
        )
        .await
        .unwrap();
    let fixture = Fixture::create(&client, 2).await;
    let deliveries = ingest(&client, &fixture).await;
    client
        .batch_execute("ALTER TABLE events DROP COLUMN traceparent, DROP COLUMN tracestate; ALTER TABLE deliveries DROP COLUMN ordered")
        .await
        .unwrap();
    let now = Utc::now();
    let three_days_ago = now - Duration::days(3);
    for (i, (delivery, at)) in deliveries.iter().zip([three_days_ago, now]).enumerate() {
        client
            .execute(
                "INSERT INTO attempts (id, project_id, delivery_id, attempt_number, started_at, duration_ms, status_code, result,
                                       response_headers, response_body)
                 VALUES ($1, $2, $3, 1, $4, 7, 200, 'success', '{\"server\": \"x\"}', $5)",
                &[&Uuid::now_v7(), &fixture.project.0, &delivery.0, &at, &format!("body {i}")],
            )
            .await
            .unwrap();
    }

    Migrator::embedded().run(&mut client).await.unwrap();
    let partitioned: bool = client
        .query_one("SELECT relkind = 'p' FROM pg_class WHERE oid = 'before17.attempts'::regclass", &[])
        .await
        .unwrap()
        .get(0);
    assert!(partitioned);
    assert_eq!(partition_of(&client, deliveries[0]).await, vec![partition_name(three_days_ago.date_naive())]);
    assert_eq!(partition_of(&client, deliveries[1]).await, vec![partition_name(now.date_naive())]);
    let row = client
        .query_one("SELECT response_body, response_headers, request_headers FROM attempts WHERE delivery_id = $1", &[&deliveries[0].0])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "body 0");
    assert_eq!(row.get::<_, serde_json::Value>(1), serde_json::json!({"server": "x"}));
    assert_eq!(row.get::<_, Option<serde_json::Value>>(2), None, "no request headers before 0017");
    // A week ahead is made by the migration.
    let names: Vec<String> = attempts::partitions(&client).await.unwrap().into_iter().map(|p| p.name).collect();
    assert!(names.contains(&partition_name((now + Duration::days(7)).date_naive())), "{names:?}");
    let old: i64 = client.query_one("SELECT count(*) FROM pg_tables WHERE tablename = 'attempts_before_0017'", &[]).await.unwrap().get(0);
    assert_eq!(old, 0);
}

/// A worker of the build before migration 0017 calls `railhook_finalise_batch` without
/// request headers: the old signature still finalises and records the Attempt (headers null).
#[tokio::test]
async fn the_previous_finalise_signature_still_records_the_attempt() {
    let (db, pool, fixture) = Fixture::in_fresh_db(1).await;
    let client = db.client().await;
    let deliveries = ingest(&client, &fixture).await;
    let claimed = claim(&pool, &deliveries).await;
    let c = &claimed[0];
    let row = client
        .query_one(
            "SELECT wrote FROM railhook_finalise_batch(ARRAY[$1::uuid], ARRAY[$2::uuid], ARRAY['SUCCESS'], ARRAY[NULL::timestamptz],
                 ARRAY[NULL::text], ARRAY[$3::uuid], ARRAY[$4::uuid], ARRAY[1], ARRAY[now()], ARRAY[9], ARRAY[200], ARRAY['success'],
                 ARRAY[NULL::text], ARRAY['{}'::jsonb], ARRAY['ok'], ARRAY[false], ARRAY[$5::uuid], ARRAY[true], 60.0::float8, 1000, 0.5::float8)",
            &[&c.id.0, &c.token.0, &Uuid::now_v7(), &c.project_id.0, &c.endpoint_id.0],
        )
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0));
    let r = client.query_one("SELECT response_body, request_headers IS NULL FROM attempts WHERE delivery_id = $1", &[&c.id.0]).await.unwrap();
    assert_eq!((r.get::<_, String>(0), r.get::<_, bool>(1)), ("ok".to_string(), true));
    let status: String = client.query_one("SELECT status::text FROM deliveries WHERE id = $1", &[&c.id.0]).await.unwrap().get(0);
    assert_eq!(status, "SUCCESS");
}

/// Migration 0020: `attempts` has no foreign key to `deliveries` or `forwards`, so making a
/// day's partition (whose ATTACH had to add the keys, locking both tables in SHARE ROW
/// EXCLUSIVE mode) no longer waits for the live traffic's writes there, nor holds them up
/// behind it. Before 0020 this call waited for the open transaction below and failed on its
/// 5 s `lock_timeout`.
#[tokio::test]
async fn making_a_partition_does_not_wait_for_writes_to_deliveries_or_forwards() {
    let db = TestDb::new().await;
    let mut live = db.client().await;
    let tx = live.transaction().await.unwrap();
    // What every claim, finalise and ingest takes on the tables it writes.
    tx.batch_execute("LOCK TABLE deliveries IN ROW EXCLUSIVE MODE; LOCK TABLE forwards IN ROW EXCLUSIVE MODE").await.unwrap();

    let client = db.client().await;
    let far = Utc::now() + Duration::days(40);
    let made = attempts::ensure_partitions(&client, far, 0).await.expect("a partition made while deliveries and forwards are being written");
    assert_eq!(made, vec![partition_name(far.date_naive())]);
    let dropped = attempts::drop_partitions_before(&client, far + Duration::days(1)).await.unwrap();
    assert!(dropped.contains(&partition_name(far.date_naive())), "{dropped:?}");
    let keys: i64 = client
        .query_one("SELECT count(*) FROM pg_constraint WHERE conrelid = 'attempts'::regclass AND contype = 'f'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(keys, 0, "no foreign keys at all (the key to projects went in migration 0031)");
    tx.rollback().await.unwrap();
}
