//! The retention job (issue 17) against the real Postgres: old final rows go with their
//! children, young and unfinished ones stay, a Failed Message is kept `failed_days`, a
//! Project's override wins, two workers' runs never overlap (the advisory lock), batches are
//! bounded, and every foreign key a retention delete sets off has an index.
//!
//! Rows are written by SQL with the times a test needs (created or finished hours ago), so
//! no test waits for time to pass.

mod common;

use std::time::Instant;

use common::count;
use railhook_config::RetentionConfig;
use railhook_core::{EndpointId, ProjectId};
use railhook_store::retention as store;
use railhook_testkit::relay::{Fixture, SubscriptionSpec};
use railhook_worker::retention::{run_once, Outcome, Report, RetentionMetrics, Sizer};
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Events kept 1 hour, Failed Messages 1 day.
fn config() -> RetentionConfig {
    RetentionConfig { events_days: 1.0 / 24.0, failed_days: 1.0, pause_ms: 0, max_busy_percent: 100, max_rows_per_second: 0, ..RetentionConfig::default() }
}

async fn run(pool: &railhook_store::Pool, config: &RetentionConfig) -> Report {
    let mut sizer = Sizer::new(config);
    match run_once(pool, config, &RetentionMetrics::new(), &mut sizer, &CancellationToken::new()).await.unwrap() {
        Outcome::Ran(r) => r,
        Outcome::Skipped => panic!("nothing else holds the lock"),
    }
}

/// A UUIDv7-like id whose time is `ago` before now, as rows made then have.
const ID_AT: &str = "(lpad(to_hex((extract(epoch FROM now() - $1::text::interval) * 1000)::bigint), 12, '0') || substr(replace(gen_random_uuid()::text, '-', ''), 13))::uuid";

/// An Event created `ago` (a Postgres interval such as '2 hours').
async fn event(db: &Client, project: ProjectId, ago: &str) -> Uuid {
    db.query_one(
        &format!("INSERT INTO events (id, project_id, event_type, payload, created_at) VALUES ({ID_AT}, $2, 'order.paid', '{{}}', now() - $1::text::interval) RETURNING id"),
        &[&ago, &project],
    )
    .await
    .unwrap()
    .get(0)
}

/// A Delivery of `event` in `status`, finished `done_ago` (None: unfinished), with one Attempt.
async fn delivery(db: &Client, project: ProjectId, event: Uuid, endpoint: EndpointId, status: &str, done_ago: Option<&str>) -> Uuid {
    let id: Uuid = db
        .query_one(
            "INSERT INTO deliveries (id, project_id, event_id, endpoint_id, status, max_attempts, retry_delays, timeout_seconds, completed_at, updated_at, created_at)
             SELECT railhook_uuid_v7(), $1, $2, $3, $4::text::delivery_status, 7, '{60}', 30, now() - $5::text::interval, coalesce(now() - $5::text::interval, now()), e.created_at
             FROM events e WHERE e.id = $2
             RETURNING id",
            &[&project, &event, &endpoint, &status, &done_ago],
        )
        .await
        .unwrap()
        .get(0);
    db.execute(
        "INSERT INTO attempts (id, project_id, delivery_id, attempt_number, started_at, duration_ms, result)
         SELECT railhook_uuid_v7(), $1, id, 1, coalesce(completed_at, now()) - interval '1 second', 5, 'success' FROM deliveries WHERE id = $2",
        &[&project, &id],
    )
    .await
    .unwrap();
    id
}

/// A Source and a Destination of `project`.
async fn destination(db: &Client, project: ProjectId) -> Uuid {
    let source: Uuid = db
        .query_one(
            "INSERT INTO sources (id, project_id, name, provider, secret, ingress_token) VALUES (gen_random_uuid(), $1, 'gh', 'github', 's', gen_random_uuid()::text) RETURNING id",
            &[&project],
        )
        .await
        .unwrap()
        .get(0);
    db.query_one("INSERT INTO destinations (id, project_id, source_id, url) VALUES (gen_random_uuid(), $1, $2, 'http://127.0.0.1:9/') RETURNING id", &[&project, &source])
        .await
        .unwrap()
        .get(0)
}

/// An Incoming Event received `ago` with one Forward in `status`, finished `done_ago`, and
/// one Attempt.
async fn incoming(db: &Client, project: ProjectId, destination: Uuid, ago: &str, status: &str, done_ago: Option<&str>) -> Uuid {
    let id: Uuid = db
        .query_one(
            &format!(
                "INSERT INTO incoming_events (id, project_id, source_id, provider_event_id, method, headers, body, received_at)
                 SELECT {ID_AT}, $2, d.source_id, gen_random_uuid()::text, 'POST', '{{}}', '\\x7b7d', now() - $1::text::interval FROM destinations d WHERE d.id = $3
                 RETURNING id"
            ),
            &[&ago, &project, &destination],
        )
        .await
        .unwrap()
        .get(0);
    let forward: Uuid = db
        .query_one(
            "INSERT INTO forwards (id, project_id, incoming_event_id, destination_id, status, max_attempts, retry_delays, timeout_seconds, completed_at, updated_at, created_at)
             SELECT railhook_uuid_v7(), $1, $2, $3, $4::text::delivery_status, 5, '{60}', 30, now() - $5::text::interval, coalesce(now() - $5::text::interval, now()), i.received_at
             FROM incoming_events i WHERE i.id = $2
             RETURNING id",
            &[&project, &id, &destination, &status, &done_ago],
        )
        .await
        .unwrap()
        .get(0);
    db.execute(
        "INSERT INTO attempts (id, project_id, forward_id, attempt_number, started_at, duration_ms, result)
         SELECT railhook_uuid_v7(), $1, id, 1, coalesce(completed_at, now()) - interval '1 second', 5, 'success' FROM forwards WHERE id = $2",
        &[&project, &forward],
    )
    .await
    .unwrap();
    id
}

async fn exists(db: &Client, table: &str, id: Uuid) -> bool {
    db.query_one(&format!("SELECT count(*) FROM {table} WHERE id = $1"), &[&id]).await.unwrap().get::<_, i64>(0) == 1
}

#[tokio::test]
async fn old_final_rows_go_and_young_unfinished_and_failed_ones_stay() {
    let (db, pool, fixture) = Fixture::in_fresh_db(2).await;
    let c = db.client().await;
    let (p, e1, e2) = (fixture.project, fixture.endpoints[0], fixture.endpoints[1]);

    // Go: delivered to both Endpoints 2 hours ago; no Delivery at all; failed 2 days ago.
    let delivered = event(&c, p, "3 hours").await;
    delivery(&c, p, delivered, e1, "SUCCESS", Some("2 hours")).await;
    delivery(&c, p, delivered, e2, "SUCCESS", Some("2 hours")).await;
    let unsubscribed = event(&c, p, "2 hours").await;
    let failed_long_ago = event(&c, p, "3 days").await;
    delivery(&c, p, failed_long_ago, e1, "FAILED", Some("2 days")).await;
    // Stay: one Delivery still PENDING or PROCESSING; failed 2 hours ago (a Failed Message a
    // person may retry for a day); delivered 10 minutes ago (a late retry); young.
    let half_done = event(&c, p, "3 hours").await;
    delivery(&c, p, half_done, e1, "SUCCESS", Some("2 hours")).await;
    delivery(&c, p, half_done, e2, "PENDING", None).await;
    let processing = event(&c, p, "3 hours").await;
    delivery(&c, p, processing, e1, "PROCESSING", None).await;
    let failed_recently = event(&c, p, "3 hours").await;
    delivery(&c, p, failed_recently, e1, "SUCCESS", Some("2 hours")).await;
    delivery(&c, p, failed_recently, e2, "FAILED", Some("2 hours")).await;
    let retried_late = event(&c, p, "3 hours").await;
    delivery(&c, p, retried_late, e1, "SUCCESS", Some("10 minutes")).await;
    let young = event(&c, p, "10 minutes").await;
    delivery(&c, p, young, e1, "SUCCESS", Some("5 minutes")).await;

    // The incoming direction likewise.
    let dest = destination(&c, p).await;
    let in_gone = incoming(&c, p, dest, "3 hours", "SUCCESS", Some("2 hours")).await;
    let in_failed_long_ago = incoming(&c, p, dest, "3 days", "FAILED", Some("2 days")).await;
    let in_pending = incoming(&c, p, dest, "3 hours", "PENDING", None).await;
    let in_failed = incoming(&c, p, dest, "3 hours", "FAILED", Some("2 hours")).await;
    let in_young = incoming(&c, p, dest, "10 minutes", "SUCCESS", Some("5 minutes")).await;

    // A finished Replay with nothing left, and one whose Delivery is still there.
    for _ in 0..2 {
        c.execute(
            "INSERT INTO replays (id, project_id, state, range_from, range_to, total, cursor_created_at, created_at, updated_at, finished_at)
             VALUES (gen_random_uuid(), $1, 'completed', now() - interval '5 days', now() - interval '4 days', 0, now() - interval '5 days',
                     now() - interval '3 days', now() - interval '3 days', now() - interval '3 days')",
            &[&p],
        )
        .await
        .unwrap();
    }
    c.execute("UPDATE deliveries SET replay_id = (SELECT min(id::text)::uuid FROM replays) WHERE event_id = $1", &[&retried_late]).await.unwrap();

    let before_attempts = count(&c, "SELECT count(*) FROM attempts").await;
    let r = run(&pool, &config()).await;
    assert_eq!((r.events, r.deliveries), (3, 3), "{r:?}");
    assert_eq!((r.incoming_events, r.forwards), (2, 2), "{r:?}");
    assert_eq!(r.attempts, 5, "each deleted Delivery's and Forward's Attempt: {r:?}");
    assert_eq!(r.replays, 1, "{r:?}");
    assert_eq!(count(&c, "SELECT count(*) FROM attempts").await, before_attempts - 5);

    for gone in [delivered, unsubscribed, failed_long_ago] {
        assert!(!exists(&c, "events", gone).await);
    }
    for kept in [half_done, processing, failed_recently, retried_late, young] {
        assert!(exists(&c, "events", kept).await);
    }
    assert_eq!(count(&c, "SELECT count(*) FROM deliveries").await, 7, "the kept Events keep all their Deliveries");
    for gone in [in_gone, in_failed_long_ago] {
        assert!(!exists(&c, "incoming_events", gone).await);
    }
    for kept in [in_pending, in_failed, in_young] {
        assert!(exists(&c, "incoming_events", kept).await);
    }
    assert_eq!(count(&c, "SELECT count(*) FROM forwards").await, 3);
    assert_eq!(count(&c, "SELECT count(*) FROM replays").await, 1, "the Replay whose Delivery is kept stays");

    // A second run finds nothing more.
    let again = run(&pool, &config()).await;
    assert_eq!((again.events, again.incoming_events, again.attempts), (0, 0, 0), "{again:?}");
}

#[tokio::test]
async fn a_projects_override_wins_both_ways() {
    let (db, pool, fixture) = Fixture::in_fresh_db(1).await;
    let c = db.client().await;
    let (longer, _) = Fixture::create_with(&c, &["http://127.0.0.1:9/b".to_string()], &SubscriptionSpec::default()).await;
    let (shorter, _) = Fixture::create_with(&c, &["http://127.0.0.1:9/c".to_string()], &SubscriptionSpec::default()).await;
    // Default: Events 1 hour, Failed Messages 1 day. `longer` keeps Events 1 day and Failed
    // Messages 10 days; `shorter` keeps Events 10 minutes and Failed Messages 1 hour.
    let pc = pool.get().await.unwrap();
    assert!(store::set_overrides(&pc, longer.project, Some(1.0), Some(10.0)).await.unwrap());
    assert!(store::set_overrides(&pc, shorter.project, Some(10.0 / 1440.0), Some(1.0 / 24.0)).await.unwrap());
    assert!(!store::set_overrides(&pc, ProjectId(Uuid::nil()), Some(1.0), None).await.unwrap(), "no such Project");

    let mut made = Vec::new();
    for f in [&fixture, &longer, &shorter] {
        let delivered = event(&c, f.project, "3 hours").await;
        delivery(&c, f.project, delivered, f.endpoints[0], "SUCCESS", Some("2 hours")).await;
        let young = event(&c, f.project, "30 minutes").await;
        delivery(&c, f.project, young, f.endpoints[0], "SUCCESS", Some("20 minutes")).await;
        let failed = event(&c, f.project, "3 days").await;
        delivery(&c, f.project, failed, f.endpoints[0], "FAILED", Some("2 days")).await;
        let failed_hours_ago = event(&c, f.project, "3 hours").await;
        delivery(&c, f.project, failed_hours_ago, f.endpoints[0], "FAILED", Some("2 hours")).await;
        made.push([delivered, young, failed, failed_hours_ago]);
    }
    let r = run(&pool, &config()).await;
    let kept = |ids: [Uuid; 4]| {
        let c = &c;
        async move {
            let mut v = Vec::new();
            for id in ids {
                v.push(exists(c, "events", id).await);
            }
            v
        }
    };
    assert_eq!(kept(made[0]).await, [false, true, false, true], "the defaults");
    assert_eq!(kept(made[1]).await, [true, true, true, true], "a longer override keeps them");
    assert_eq!(kept(made[2]).await, [false, false, false, false], "a shorter override deletes sooner");
    assert_eq!(r.events, 6, "{r:?}");
}

#[tokio::test]
async fn two_workers_never_run_at_once() {
    let (db, pool, fixture) = Fixture::in_fresh_db(1).await;
    let c = db.client().await;
    let (p, e) = (fixture.project, fixture.endpoints[0]);
    c.execute(
        "WITH ev AS (
             INSERT INTO events (id, project_id, event_type, payload, created_at)
             SELECT railhook_uuid_v7(), $1, 'order.paid', '{}', now() - interval '3 hours' FROM generate_series(1, 600) RETURNING id)
         INSERT INTO deliveries (id, project_id, event_id, endpoint_id, status, max_attempts, retry_delays, timeout_seconds, completed_at)
         SELECT railhook_uuid_v7(), $1, ev.id, $2, 'SUCCESS', 7, '{60}', 30, now() - interval '2 hours' FROM ev",
        &[&p, &e],
    )
    .await
    .unwrap();

    // Another process holds the lock: a run does nothing.
    c.execute("SELECT pg_advisory_lock($1)", &[&railhook_store::locks::RETENTION.key]).await.unwrap();
    let mut sizer = Sizer::new(&config());
    let outcome = run_once(&pool, &config(), &RetentionMetrics::new(), &mut sizer, &CancellationToken::new()).await.unwrap();
    assert_eq!(outcome, Outcome::Skipped);
    assert_eq!(count(&c, "SELECT count(*) FROM events").await, 600);
    c.execute("SELECT pg_advisory_unlock($1)", &[&railhook_store::locks::RETENTION.key]).await.unwrap();

    // Two workers (two pools, as two processes) start together; batches of 10 with a pause
    // make a run last 60 batches of at least 20 ms, so the second finds the first's lock.
    let slow = RetentionConfig { batch_rows: 10, pause_ms: 20, ..config() };
    let other = railhook_store::build_pool(&railhook_testkit::test_config(&db).database).unwrap();
    let metrics = RetentionMetrics::new();
    let (a, b) = tokio::join!(
        async {
            let mut s = Sizer::new(&slow);
            run_once(&pool, &slow, &metrics, &mut s, &CancellationToken::new()).await.unwrap()
        },
        async {
            let mut s = Sizer::new(&slow);
            run_once(&other, &slow, &metrics, &mut s, &CancellationToken::new()).await.unwrap()
        }
    );
    let ran: Vec<&Outcome> = [&a, &b].into_iter().filter(|o| matches!(o, Outcome::Ran(_))).collect();
    assert_eq!(ran.len(), 1, "exactly one ran: {a:?} {b:?}");
    assert_eq!(metrics.runs.with_label_values(&["skipped"]).get(), 1);
    let Outcome::Ran(r) = ran[0] else { unreachable!() };
    assert_eq!(r.events, 600);
    assert!(r.batches >= 60, "{r:?}");
    assert_eq!(count(&c, "SELECT count(*) FROM events").await, 0);
    // The lock went with the run: a third run gets it.
    assert!(matches!(run_once(&other, &slow, &metrics, &mut Sizer::new(&slow), &CancellationToken::new()).await.unwrap(), Outcome::Ran(_)));
}

/// Bounded batches: no batch reads more than `retention.batch_rows`, and the size adapts to
/// `batch_target_ms`. Prints the measured batch durations (docs/RELIABILITY.md quotes them).
#[tokio::test]
async fn batches_are_bounded_and_adapt_to_their_target() {
    let (db, pool, fixture) = Fixture::in_fresh_db(3).await;
    let c = db.client().await;
    let p = fixture.project;
    // 20,000 old Events, each delivered to 3 Endpoints with one Attempt each: 140,000 rows.
    for _ in 0..4 {
        c.execute(
            "WITH ev AS (
                 INSERT INTO events (id, project_id, event_type, payload, created_at)
                 SELECT railhook_uuid_v7(), $1, 'order.paid', '{\"order\": 1, \"amount\": 4200, \"currency\": \"EUR\"}', now() - interval '3 hours'
                 FROM generate_series(1, 5000) RETURNING id),
             d AS (
                 INSERT INTO deliveries (id, project_id, event_id, endpoint_id, status, max_attempts, retry_delays, timeout_seconds, completed_at, updated_at, created_at)
                 SELECT railhook_uuid_v7(), $1, ev.id, ep, 'SUCCESS', 7, '{60}', 30, now() - interval '2 hours', now() - interval '2 hours', now() - interval '3 hours'
                 FROM ev, unnest($2::uuid[]) ep RETURNING id)
             INSERT INTO attempts (id, project_id, delivery_id, attempt_number, started_at, duration_ms, status_code, result, response_body)
             SELECT railhook_uuid_v7(), $1, d.id, 1, now() - interval '2 hours 1 second', 12, 200, 'success', 'ok' FROM d",
            &[&p, &fixture.endpoints.iter().map(|e| e.0).collect::<Vec<_>>()],
        )
        .await
        .unwrap();
    }
    c.batch_execute("VACUUM ANALYZE events, deliveries, attempts").await.unwrap();

    let config = RetentionConfig { batch_rows: 1_000, batch_target_ms: 50, ..config() };
    let metrics = RetentionMetrics::new();
    let mut sizer = Sizer::new(&config);
    let started = Instant::now();
    let Outcome::Ran(r) = run_once(&pool, &config, &metrics, &mut sizer, &CancellationToken::new()).await.unwrap() else { panic!("skipped") };
    let took = started.elapsed();
    assert_eq!((r.events, r.deliveries, r.attempts), (20_000, 60_000, 60_000), "{r:?}");
    assert!(r.max_batch_rows <= 1_000, "{r:?}");
    let h = metrics.batch_seconds.get_sample_sum() / metrics.batch_seconds.get_sample_count() as f64;
    use prometheus::core::Collector;
    let families = metrics.batch_seconds.collect();
    let proto = &families[0].get_metric()[0];
    let within_100ms = proto.get_histogram().get_bucket().iter().find(|b| b.upper_bound() == 0.1).map(|b| b.cumulative_count()).unwrap_or(0);
    println!(
        "retention: 20,000 Events x 3 Deliveries x 1 Attempt in {took:?}: {} batches, mean {:.1} ms, longest {:?}, {} over 100 ms, final batch size {}",
        r.batches,
        h * 1000.0,
        r.max_batch,
        r.batches - within_100ms,
        sizer.rows
    );

    // A target far below what a batch can do shrinks the batches to the minimum.
    for _ in 0..2 {
        c.execute(
            "WITH ev AS (INSERT INTO events (id, project_id, event_type, payload, created_at)
                 SELECT railhook_uuid_v7(), $1, 'order.paid', '{}', now() - interval '3 hours' FROM generate_series(1, 500) RETURNING id)
             INSERT INTO deliveries (id, project_id, event_id, endpoint_id, status, max_attempts, retry_delays, timeout_seconds, completed_at)
             SELECT railhook_uuid_v7(), $1, ev.id, $2, 'SUCCESS', 7, '{60}', 30, now() - interval '2 hours' FROM ev",
            &[&p, &fixture.endpoints[0]],
        )
        .await
        .unwrap();
    }
    let tiny = RetentionConfig { batch_rows: 500, batch_target_ms: 1, ..config };
    let mut sizer = Sizer { rows: 500, ..Sizer::new(&tiny) };
    let Outcome::Ran(r) = run_once(&pool, &tiny, &metrics, &mut sizer, &CancellationToken::new()).await.unwrap() else { panic!("skipped") };
    assert_eq!(r.events, 1_000);
    assert!(sizer.rows < 500, "the size came down from 500: {}", sizer.rows);
    assert!(r.batches > 2, "{r:?}");
}

/// Every foreign key that a retention delete sets off (into events, deliveries,
/// incoming_events, forwards) has an index led by its column, so no cascade or SET NULL
/// scans a table per deleted row.
#[tokio::test]
async fn every_foreign_key_into_a_trimmed_table_is_indexed() {
    let db = railhook_testkit::TestDb::new().await;
    let c = db.client().await;
    let rows = c
        .query(
            "SELECT con.conname, con.conrelid::regclass::text
             FROM pg_constraint con
             WHERE con.contype = 'f'
               AND con.confrelid IN ('events'::regclass, 'deliveries'::regclass, 'incoming_events'::regclass, 'forwards'::regclass, 'replays'::regclass)
               AND con.conparentid = 0
               AND NOT EXISTS (
                   SELECT 1 FROM pg_index i
                   WHERE i.indrelid = con.conrelid AND i.indkey[0] = con.conkey[1])",
            &[],
        )
        .await
        .unwrap();
    let missing: Vec<String> = rows.iter().map(|r| format!("{} on {}", r.get::<_, String>(0), r.get::<_, String>(1))).collect();
    assert!(missing.is_empty(), "foreign keys without an index: {missing:?}");
}

/// Attempts older than `retention.attempts_days` go a daily partition at a time; the
/// partitions of younger days stay, and the drop is counted.
#[tokio::test]
async fn old_attempt_partitions_are_dropped_whole() {
    let (db, pool, _fixture) = Fixture::in_fresh_db(1).await;
    let c = db.client().await;
    let now = chrono::Utc::now();
    railhook_store::attempts::ensure_partitions(&c, now - chrono::Duration::days(10), 12).await.unwrap();
    let days_before = |n: i64| railhook_store::attempts::partition_name((now - chrono::Duration::days(n)).date_naive());
    assert!(partition_names(&c).await.contains(&days_before(10)));

    let metrics = RetentionMetrics::new();
    let config = RetentionConfig { attempts_days: 3.0, ..config() };
    let Outcome::Ran(r) = run_once(&pool, &config, &metrics, &mut Sizer::new(&config), &CancellationToken::new()).await.unwrap() else { panic!("skipped") };
    let left = partition_names(&c).await;
    for n in 4..=10 {
        assert!(!left.contains(&days_before(n)), "{} dropped: {left:?}", days_before(n));
    }
    for n in 0..=2 {
        assert!(left.contains(&days_before(n)), "{} kept: {left:?}", days_before(n));
    }
    assert!(left.contains(&"attempts_default".to_string()));
    assert!(r.partitions_dropped >= 7, "{r:?}");
    assert_eq!(metrics.partitions_dropped.get(), r.partitions_dropped);
}

async fn partition_names(c: &Client) -> Vec<String> {
    c.query("SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'attempts'::regclass", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect()
}

/// With `attempts_days` at least a day and at most the events period (the defaults), an
/// Event's Attempts are left to the drop of their daily partition (a third fewer rows per
/// Event); with `attempts_days` under a day (or a Project that keeps Events for less time)
/// they go with their Delivery.
#[tokio::test]
async fn attempts_go_with_their_delivery_only_where_no_partition_drop_takes_them_soon() {
    let (db, pool, fixture) = Fixture::in_fresh_db(1).await;
    let c = db.client().await;
    let (p, e1) = (fixture.project, fixture.endpoints[0]);
    let attempts_of = |d: Uuid| {
        let c = &c;
        async move { c.query_one("SELECT count(*) FROM attempts WHERE delivery_id = $1", &[&d]).await.unwrap().get::<_, i64>(0) }
    };

    // The defaults' shape: events 2 days, attempts 2 days.
    let left = event(&c, p, "3 days").await;
    let left_delivery = delivery(&c, p, left, e1, "SUCCESS", Some("3 days")).await;
    let config_days = RetentionConfig { events_days: 2.0, attempts_days: 2.0, ..config() };
    let r = run(&pool, &config_days).await;
    assert_eq!((r.events, r.deliveries, r.attempts), (1, 1, 0), "{r:?}");
    assert!(!exists(&c, "events", left).await);
    assert_eq!(attempts_of(left_delivery).await, 1, "left to its partition's drop");

    // Attempts kept for less than a day: no daily partition can, so they go with the Delivery.
    let with = event(&c, p, "3 days").await;
    let with_delivery = delivery(&c, p, with, e1, "SUCCESS", Some("3 days")).await;
    let config_hours = RetentionConfig { events_days: 2.0, attempts_days: 0.5, ..config() };
    let r = run(&pool, &config_hours).await;
    assert_eq!((r.events, r.deliveries, r.attempts), (1, 1, 1), "{r:?}");
    assert_eq!(attempts_of(with_delivery).await, 0);
    assert_eq!(attempts_of(left_delivery).await, 1, "not a Delivery's any more: its partition's");
}
