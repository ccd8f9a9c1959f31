//! Deleting an Endpoint, a Subscription, a Destination or a Source (issue 31,
//! `railhook_store::deletion`, migration 0027): everything behind it goes, and every row is
//! found through an index: the deletes and their foreign keys' cascades scan no table of
//! Deliveries, Forwards or Incoming Events. Run with `enable_seqscan = off`, so that a table
//! scan happens only where no index can serve, whatever the tables' sizes here. The same
//! deletes with a million Deliveries under a light load are
//! `railhook-worker/tests/delete_under_load.rs` (scripts/delete-under-load).

use railhook_core::{DestinationId, EndpointId, ProjectId, SourceId, SubscriptionId};
use railhook_store::{endpoints, sources, subscriptions};
use railhook_testkit::TestDb;
use tokio_postgres::Client;
use uuid::Uuid;

/// Owners per kind, and the history of each.
const OWNERS: i64 = 10;
const PER_OWNER: i64 = 200;
/// The first Endpoint and Destination have more than one batch's worth.
const BIG: i64 = 2_500;

struct Seeded {
    project: ProjectId,
    endpoints: Vec<EndpointId>,
    subscriptions: Vec<SubscriptionId>,
    source: SourceId,
    other_source: SourceId,
    destinations: Vec<DestinationId>,
}

/// One project; `OWNERS` Endpoints each with a Subscription and its Deliveries; two Sources
/// with `OWNERS` Destinations between them, each with its Incoming Events' Forwards.
async fn seed(c: &Client) -> Seeded {
    let project = Uuid::now_v7();
    c.batch_execute(&format!(
        "INSERT INTO organizations (id, name) VALUES ('{o}', 'o');
         INSERT INTO projects (id, organization_id, name) VALUES ('{project}', '{o}', 'p');
         INSERT INTO endpoints (id, project_id, url) SELECT railhook_uuid_v7(), '{project}', 'https://example.com/' || n FROM generate_series(1, {OWNERS}) n;
         INSERT INTO subscriptions (id, project_id, endpoint_id, event_type_pattern) SELECT railhook_uuid_v7(), '{project}', id, '**' FROM endpoints;
         WITH ep AS (SELECT e.id, s.id AS sub, row_number() OVER (ORDER BY e.id) AS k FROM endpoints e JOIN subscriptions s ON s.endpoint_id = e.id),
              ev AS (INSERT INTO events (id, project_id, event_type, payload) SELECT railhook_uuid_v7(), '{project}', 'a.b', '{{}}' FROM generate_series(1, {PER_OWNER} * ({OWNERS} - 1) + {BIG}) RETURNING id),
              evn AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM ev)
         INSERT INTO deliveries (id, project_id, event_id, endpoint_id, subscription_id, status, max_attempts, retry_delays, timeout_seconds)
         SELECT railhook_uuid_v7(), '{project}', evn.id, ep.id, ep.sub, 'SUCCESS', 7, '{{60}}', 30
         FROM evn JOIN ep ON ep.k = CASE WHEN evn.n <= {BIG} THEN 1 ELSE 2 + (evn.n - {BIG}) % ({OWNERS} - 1) END;
         INSERT INTO sources (id, project_id, name, provider, secret, ingress_token)
         SELECT railhook_uuid_v7(), '{project}', 's' || n, 'github', 'secret', 'token-{project}-' || n FROM generate_series(1, 2) n;
         INSERT INTO destinations (id, project_id, source_id, url)
         SELECT railhook_uuid_v7(), '{project}', (SELECT id FROM sources ORDER BY id LIMIT 1 OFFSET (n % 2)), 'https://example.com/in/' || n FROM generate_series(1, {OWNERS}) n;
         WITH ds AS (SELECT id, source_id, row_number() OVER (ORDER BY id) AS k FROM destinations),
              ie AS (INSERT INTO incoming_events (id, project_id, source_id, provider_event_id, method, headers, body)
                     SELECT railhook_uuid_v7(), '{project}', ds.source_id, 'e' || n, 'POST', '[]', 'x'
                     FROM generate_series(1, {PER_OWNER} * ({OWNERS} - 1) + {BIG}) n
                     JOIN ds ON ds.k = CASE WHEN n <= {BIG} THEN 1 ELSE 2 + (n - {BIG}) % ({OWNERS} - 1) END
                     RETURNING id, source_id, provider_event_id),
              ien AS (SELECT ie.id, ie.source_id, substr(ie.provider_event_id, 2)::bigint AS n FROM ie)
         INSERT INTO forwards (id, project_id, incoming_event_id, destination_id, status, max_attempts, retry_delays, timeout_seconds)
         SELECT railhook_uuid_v7(), '{project}', ien.id, ds.id, 'SUCCESS', 5, '{{60}}', 30
         FROM ien JOIN ds ON ds.k = CASE WHEN ien.n <= {BIG} THEN 1 ELSE 2 + (ien.n - {BIG}) % ({OWNERS} - 1) END;
         ANALYZE;",
        o = Uuid::now_v7(),
    ))
    .await
    .unwrap();
    let ids = |sql: &'static str| async move { c.query(sql, &[]).await.unwrap().iter().map(|r| r.get::<_, Uuid>(0)).collect::<Vec<_>>() };
    let sources = ids("SELECT id FROM sources ORDER BY id").await;
    // The Source of the first (big) Destination, and the other one.
    let first_source: Uuid = c.query_one("SELECT source_id FROM destinations ORDER BY id LIMIT 1", &[]).await.unwrap().get(0);
    let other = *sources.iter().find(|s| **s != first_source).unwrap();
    Seeded {
        project: ProjectId(project),
        endpoints: ids("SELECT id FROM endpoints ORDER BY id").await.into_iter().map(EndpointId).collect(),
        subscriptions: ids("SELECT s.id FROM subscriptions s JOIN endpoints e ON e.id = s.endpoint_id ORDER BY e.id").await.into_iter().map(SubscriptionId).collect(),
        source: SourceId(first_source),
        other_source: SourceId(other),
        destinations: ids("SELECT id FROM destinations ORDER BY id").await.into_iter().map(DestinationId).collect(),
    }
}

async fn count(c: &Client, sql: &str, id: Uuid) -> i64 {
    c.query_one(sql, &[&id]).await.unwrap().get(0)
}

/// Table scans of the history tables not yet flushed to the cumulative statistics: within
/// one transaction the difference of two readings is what ran in between (Postgres 15 keeps
/// a backend's counts pending across transactions until it reports them, at most once a
/// second, so a reading at the start is not zero).
async fn scans(c: &impl tokio_postgres::GenericClient) -> std::collections::BTreeMap<String, i64> {
    c.query("SELECT relname::text, seq_scan FROM pg_stat_xact_user_tables WHERE relname IN ('deliveries', 'forwards', 'incoming_events')", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// The tables `during` scanned more often than `before`.
fn scanned(before: &std::collections::BTreeMap<String, i64>, during: &std::collections::BTreeMap<String, i64>) -> Vec<String> {
    during.iter().filter(|(t, n)| **n > before.get(*t).copied().unwrap_or(0)).map(|(t, n)| format!("{t} ({n})")).collect()
}

/// A transaction in which the planner scans a table only where no index serves.
async fn indexes_only(c: &mut Client) -> tokio_postgres::Transaction<'_> {
    let tx = c.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL enable_seqscan = off").await.unwrap();
    tx
}

/// Each delete runs in a transaction here, so that `pg_stat_xact_user_tables` shows what it
/// read (its batches are then one transaction: the rows it finds and the plans are the same).
#[tokio::test]
async fn deletes_take_everything_behind_them_and_scan_no_history_table() {
    let db = TestDb::new().await;
    let mut c = db.client().await;
    let s = seed(&c).await;
    let (big_endpoint, big_destination) = (s.endpoints[0], s.destinations[0]);
    assert_eq!(count(&c, "SELECT count(*) FROM deliveries WHERE endpoint_id = $1", big_endpoint.0).await, BIG);
    assert_eq!(count(&c, "SELECT count(*) FROM forwards WHERE destination_id = $1", big_destination.0).await, BIG);

    // An Endpoint with more than a batch of Deliveries: all gone, with its Subscription.
    let tx = indexes_only(&mut c).await;
    let before = scans(&tx).await;
    assert!(endpoints::delete_endpoint(&tx, s.project, big_endpoint).await.unwrap());
    assert_eq!(scanned(&before, &scans(&tx).await), Vec::<String>::new(), "deleting an Endpoint scanned a table");
    tx.commit().await.unwrap();
    assert_eq!(count(&c, "SELECT count(*) FROM deliveries WHERE endpoint_id = $1", big_endpoint.0).await, 0);
    assert_eq!(count(&c, "SELECT count(*) FROM subscriptions WHERE endpoint_id = $1", big_endpoint.0).await, 0);
    assert_eq!(count(&c, "SELECT count(*) FROM endpoints WHERE id = $1", big_endpoint.0).await, 0);

    // A Subscription: its Deliveries stay, with its id.
    let (sub, its_endpoint) = (s.subscriptions[1], s.endpoints[1]);
    let tx = indexes_only(&mut c).await;
    let before = scans(&tx).await;
    assert!(subscriptions::delete_subscription(&tx, s.project, sub).await.unwrap());
    assert_eq!(scanned(&before, &scans(&tx).await), Vec::<String>::new(), "deleting a Subscription scanned a table");
    tx.commit().await.unwrap();
    assert_eq!(count(&c, "SELECT count(*) FROM deliveries WHERE subscription_id = $1", sub.0).await, PER_OWNER);
    assert_eq!(count(&c, "SELECT count(*) FROM deliveries WHERE endpoint_id = $1", its_endpoint.0).await, PER_OWNER);

    // A Destination with more than a batch of Forwards.
    let tx = indexes_only(&mut c).await;
    let before = scans(&tx).await;
    assert!(sources::delete_destination(&tx, s.project, s.source, big_destination).await.unwrap());
    assert_eq!(scanned(&before, &scans(&tx).await), Vec::<String>::new(), "deleting a Destination scanned a table");
    tx.commit().await.unwrap();
    assert_eq!(count(&c, "SELECT count(*) FROM forwards WHERE destination_id = $1", big_destination.0).await, 0);
    assert_eq!(count(&c, "SELECT count(*) FROM destinations WHERE id = $1", big_destination.0).await, 0);

    // A Source: its Destinations, Incoming Events and their Forwards.
    let forwards_before: i64 = c.query_one("SELECT count(*) FROM forwards", &[]).await.unwrap().get(0);
    let theirs = count(&c, "SELECT count(*) FROM forwards f JOIN destinations d ON d.id = f.destination_id WHERE d.source_id = $1", s.other_source.0).await;
    assert!(theirs > 0);
    let tx = indexes_only(&mut c).await;
    let before = scans(&tx).await;
    assert!(sources::delete_source(&tx, s.project, s.other_source).await.unwrap());
    assert_eq!(scanned(&before, &scans(&tx).await), Vec::<String>::new(), "deleting a Source scanned a table");
    tx.commit().await.unwrap();
    assert_eq!(count(&c, "SELECT count(*) FROM incoming_events WHERE source_id = $1", s.other_source.0).await, 0);
    assert_eq!(count(&c, "SELECT count(*) FROM destinations WHERE source_id = $1", s.other_source.0).await, 0);
    let forwards_after: i64 = c.query_one("SELECT count(*) FROM forwards", &[]).await.unwrap().get(0);
    assert_eq!(forwards_after, forwards_before - theirs, "only that Source's Forwards went");

    // Not the project's: nothing happens.
    assert!(!endpoints::delete_endpoint(&c, ProjectId::new(), s.endpoints[2]).await.unwrap());
    assert_eq!(count(&c, "SELECT count(*) FROM deliveries WHERE endpoint_id = $1", s.endpoints[2].0).await, PER_OWNER);
}

/// The statements the foreign keys' cascades run (and the batches' lookups) are planned on
/// the indexes of migrations 0026 and 0027.
#[tokio::test]
async fn the_cascades_lookups_are_planned_on_their_indexes() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let s = seed(&c).await;
    c.batch_execute("SET enable_seqscan = off").await.unwrap();
    let uuid_of = |id: Uuid| format!("'{id}'::uuid");
    for (sql, index) in [
        (format!("DELETE FROM deliveries WHERE endpoint_id = {}", uuid_of(s.endpoints[3].0)), "deliveries_endpoint_idx"),
        (format!("SELECT id FROM deliveries WHERE endpoint_id = {} LIMIT 1000", uuid_of(s.endpoints[3].0)), "deliveries_endpoint_idx"),
        (format!("DELETE FROM forwards WHERE destination_id = {}", uuid_of(s.destinations[3].0)), "forwards_destination_idx"),
        (format!("DELETE FROM incoming_events WHERE source_id = {}", uuid_of(s.source.0)), "incoming_events_source"),
        (format!("DELETE FROM circuits WHERE destination_id = {}", uuid_of(s.destinations[3].0)), "circuits_destination_idx"),
        (format!("DELETE FROM circuits WHERE endpoint_id = {}", uuid_of(s.endpoints[3].0)), "circuits_endpoint_idx"),
        (format!("DELETE FROM deliveries WHERE replay_of = {}", uuid_of(Uuid::now_v7())), "deliveries_replay_of_idx"),
    ] {
        let plan: String = c.query(&format!("EXPLAIN {sql}"), &[]).await.unwrap().iter().map(|r| r.get::<_, String>(0) + "\n").collect();
        assert!(plan.contains(index) && !plan.contains("Seq Scan"), "{sql}: not planned on {index}:\n{plan}");
    }
}

