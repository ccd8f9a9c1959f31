//! The set form of the ingest (`events::batch::INGEST_BATCH_SQL`, the Kafka source's batches)
//! writes what the single statement of `POST /v1/events` writes, one Event after another: the
//! same Events, Deliveries (Subscriptions matched by pattern, disabled ones left out, each
//! Subscription's ladder), ordered Deliveries announced in the Events' order (their Sequence
//! Numbers come at the claim, in that order: migration 0035), announcements with
//! their trace contexts, and the same outcome for each Event (created, a replay of a key, a
//! key reused), including keys repeated inside the batch and keys stored before it.

use railhook_core::pattern::{candidate_patterns, EventType};
use railhook_core::{ProjectId, TraceContext, TraceParent};
use railhook_store::events::{self, Caller, IngestOutcome, NewEvent};
use railhook_store::lifecycle::announce::{self, Via};
use railhook_store::{endpoints as ep, subscriptions as subs, tenancy};
use railhook_testkit::TestDb;
use tokio_postgres::Client;

/// One Project: an ordered `**` Subscription and an unordered `order.*` one on Endpoint a,
/// an `invoice.paid` one with its own ladder on Endpoint b, a disabled Subscription on b,
/// and a disabled Endpoint c subscribed to `**`.
async fn fixture(client: &Client) -> ProjectId {
    let org = tenancy::create_organization(client, "batch").await.unwrap();
    let project = tenancy::create_project(client, org.id, "batch").await.unwrap().unwrap();
    let headers = ep::EndpointHeaders::new();
    let mut endpoints = Vec::new();
    for (url, enabled) in [("http://127.0.0.1:9/a", true), ("http://127.0.0.1:9/b", true), ("http://127.0.0.1:9/c", false)] {
        let secret = railhook_core::signing::EndpointSecret::generate();
        let new = ep::NewEndpoint { url, description: "", enabled, rate_limit_per_second: None, headers: &headers, secret: secret.as_str() };
        endpoints.push(ep::create_endpoint(client, project.id, new).await.unwrap().id);
    }
    let ladder = [7, 70];
    let specs: [(usize, &str, bool, Option<&[i32]>, bool); 5] =
        [(0, "**", true, None, true), (0, "order.*", false, None, true), (1, "invoice.paid", false, Some(&ladder), true), (1, "**", false, None, false), (2, "**", false, None, true)];
    for (endpoint, pattern, ordering, retry_delays, enabled) in specs {
        let sub = subs::NewSubscription { endpoint_id: endpoints[endpoint], event_type_pattern: pattern, ordering, max_attempts: 4, timeout_seconds: 9, retry_delays, enabled };
        subs::create_subscription(client, project.id, sub).await.unwrap().unwrap();
    }
    project.id
}

/// One Event to ingest: type, payload, key, trace.
struct Input {
    event_type: &'static str,
    payload: serde_json::Value,
    key: Option<&'static str>,
    trace: Option<TraceContext>,
}

fn trace(n: u8) -> TraceContext {
    let parent = TraceParent::parse(format!("00-{:032x}-{:016x}-01", u128::from(n) + 1, u64::from(n) + 1).as_bytes()).unwrap();
    TraceContext { parent, state: (n % 2 == 0).then(|| format!("vendor=v{n}")) }
}

fn inputs() -> Vec<Input> {
    let json = |n: u32| serde_json::json!({"n": n, "text": "x".repeat(n as usize)});
    vec![
        Input { event_type: "order.created", payload: json(1), key: Some("k1"), trace: Some(trace(1)) },
        Input { event_type: "invoice.paid", payload: json(2), key: None, trace: None },
        Input { event_type: "user.deleted", payload: json(3), key: Some("k3"), trace: Some(trace(2)) },
        // The same key and request as the first: a replay of it, inside the batch.
        Input { event_type: "order.created", payload: json(1), key: Some("k1"), trace: None },
        // The same key with another payload: reused.
        Input { event_type: "order.created", payload: json(99), key: Some("k3"), trace: None },
        // A key stored before the batch: a replay of that Event; and one reused.
        Input { event_type: "order.paid", payload: json(5), key: Some("before"), trace: None },
        Input { event_type: "order.paid", payload: json(6), key: Some("before-other"), trace: None },
        Input { event_type: "order.created", payload: json(7), key: None, trace: Some(trace(4)) },
        Input { event_type: "invoice.paid", payload: json(8), key: Some("k8"), trace: None },
    ]
}

fn new_event<'a>(project: ProjectId, i: &'a Input, patterns: &'a [String]) -> NewEvent<'a> {
    NewEvent {
        caller: Caller::Project(project),
        event_type: i.event_type,
        payload: &i.payload,
        idempotency_key: i.key,
        request_sha256: events::request_sha256(i.event_type, &i.payload),
        candidate_patterns: patterns.to_vec(),
        trace: i.trace.clone(),
    }
}

/// A database with the fixture and the two Events stored before the batch.
async fn prepared(via: Via) -> (TestDb, railhook_store::Pool, ProjectId) {
    let db = TestDb::new().await;
    let client = db.client().await;
    announce::set_via(&client, via).await.unwrap();
    let project = fixture(&client).await;
    let config = railhook_testkit::test_config(&db);
    let pool = railhook_store::build_pool(&config.database).unwrap();
    let pooled = pool.get().await.unwrap();
    for (ty, payload, key) in [("order.paid", serde_json::json!({"n": 5, "text": "xxxxx"}), "before"), ("order.paid", serde_json::json!({"n": 0}), "before-other")] {
        let patterns = candidate_patterns(&EventType::parse(ty).unwrap());
        let input = Input { event_type: ty, payload, key: Some(key), trace: None };
        assert!(matches!(events::ingest(&pooled, new_event(project, &input, &patterns)).await.unwrap(), IngestOutcome::Created(_)));
    }
    drop(pooled);
    (db, pool, project)
}

fn kind(o: &IngestOutcome) -> String {
    match o {
        IngestOutcome::Created(e) => format!("created with {} deliveries", e.deliveries.as_ref().map_or(0, Vec::len)),
        IngestOutcome::Replayed(e) => format!("replayed {} with {} deliveries", e.event_type, e.deliveries.as_ref().map_or(0, Vec::len)),
        IngestOutcome::KeyReused => "key reused".into(),
        IngestOutcome::Unauthenticated => "unauthenticated".into(),
    }
}

/// Everything the ingests wrote, without ids: Events by payload, their Deliveries and
/// announcements by Endpoint URL and Subscription pattern, the Endpoints' sequence counters,
/// and the ordered Deliveries' Events (`n`) in announcement order.
async fn written(client: &Client) -> Vec<String> {
    let queries = [
        "SELECT concat_ws(' | ', event_type, payload::text, idempotency_key, encode(request_sha256, 'hex'), traceparent, tracestate) FROM events",
        "SELECT concat_ws(' | ', e.payload::text, en.url, s.event_type_pattern, d.ordered, d.sequence_number, d.max_attempts, d.retry_delays::text, d.timeout_seconds, d.status::text, d.attempt_count)
         FROM deliveries d JOIN events e ON e.id = d.event_id JOIN endpoints en ON en.id = d.endpoint_id JOIN subscriptions s ON s.id = d.subscription_id",
        "SELECT concat_ws(' | ', 'outbox', e.payload::text, en.url, s.event_type_pattern, o.reason, o.routing_id = d.endpoint_id, o.traceparent, o.tracestate)
         FROM outbox o JOIN deliveries d ON d.id = o.delivery_id JOIN events e ON e.id = d.event_id JOIN endpoints en ON en.id = d.endpoint_id JOIN subscriptions s ON s.id = d.subscription_id",
        "SELECT concat_ws(' | ', 'counter', url, last_sequence) FROM endpoints",
        "SELECT concat_ws(' | ', 'ordered announcements', string_agg(e.payload->>'n', ',' ORDER BY o.id)) FROM outbox o JOIN deliveries d ON d.id = o.delivery_id JOIN events e ON e.id = d.event_id WHERE d.ordered",
        "SELECT concat_ws(' | ', 'open', count(*)) FROM open_deliveries",
    ];
    let mut rows = Vec::new();
    for q in queries {
        let mut part: Vec<String> = client.query(q, &[]).await.unwrap().iter().map(|r| r.get::<_, Option<String>>(0).unwrap_or_default()).collect();
        part.sort();
        rows.extend(part);
    }
    rows
}

#[tokio::test]
async fn a_batch_writes_what_one_post_per_event_writes() {
    let inputs = inputs();
    let patterns: Vec<Vec<String>> = inputs.iter().map(|i| candidate_patterns(&EventType::parse(i.event_type).unwrap())).collect();

    let (one_db, one_pool, one_project) = prepared(Via::Outbox).await;
    let client = one_pool.get().await.unwrap();
    let mut one_by_one = Vec::new();
    for (i, p) in inputs.iter().zip(&patterns) {
        one_by_one.push(kind(&events::ingest(&client, new_event(one_project, i, p)).await.unwrap()));
    }

    let (batch_db, batch_pool, batch_project) = prepared(Via::Outbox).await;
    let mut client = batch_pool.get().await.unwrap();
    let news: Vec<NewEvent<'_>> = inputs.iter().zip(&patterns).map(|(i, p)| new_event(batch_project, i, p)).collect();
    let batched: Vec<String> = events::ingest_batch(&mut client, &news).await.unwrap().iter().map(kind).collect();

    assert_eq!(
        one_by_one,
        [
            "created with 2 deliveries",
            "created with 2 deliveries",
            "created with 1 deliveries",
            "replayed order.created with 2 deliveries",
            "key reused",
            "replayed order.paid with 2 deliveries",
            "key reused",
            "created with 2 deliveries",
            "created with 2 deliveries",
        ],
        "the single statement, Event after Event"
    );
    assert_eq!(batched, one_by_one, "the same outcome for each Event");
    let (one, batch) = (written(&one_db.client().await).await, written(&batch_db.client().await).await);
    assert!(one.iter().any(|r| r == "ordered announcements | 5,0,1,2,3,7,8"), "seven ordered Deliveries (two before the batch), announced in order: {one:#?}");
    assert!(one.iter().any(|r| r == "counter | http://127.0.0.1:9/a | 0"), "no number handed out before a claim: {one:#?}");
    assert!(one.iter().any(|r| r.contains("vendor=v2")), "a trace state kept: {one:#?}");
    assert_eq!(batch, one, "the same rows");
}

/// In CDC mode the batch is ONE logical decoding message, its lines in the Events' order,
/// each with its Event's trace context.
#[tokio::test]
async fn a_batch_is_one_announcement_message_in_event_order() {
    let (db, pool, project) = prepared(Via::Message).await;
    let admin = db.client().await;
    let slot = format!("rh_batch_{}", uuid::Uuid::new_v4().simple());
    admin.execute("SELECT pg_create_logical_replication_slot($1, 'test_decoding')", &[&slot]).await.unwrap();
    let inputs = inputs();
    let patterns: Vec<Vec<String>> = inputs.iter().map(|i| candidate_patterns(&EventType::parse(i.event_type).unwrap())).collect();
    let news: Vec<NewEvent<'_>> = inputs.iter().zip(&patterns).map(|(i, p)| new_event(project, i, p)).collect();
    let mut client = pool.get().await.unwrap();
    let outcomes = events::ingest_batch(&mut client, &news).await.unwrap();
    let changes: Vec<String> = admin
        .query("SELECT data FROM pg_logical_slot_get_changes($1, NULL, NULL) WHERE data LIKE 'message:%'", &[&slot])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    admin.execute("SELECT pg_drop_replication_slot($1)", &[&slot]).await.unwrap();
    assert_eq!(changes.len(), 1, "one message for the batch: {changes:#?}");
    let content = changes[0].split_once("content:").expect("a message's content").1.trim();
    // (Delivery id, its Event's position, its Event's traceparent) for every Delivery made.
    let mut made = Vec::new();
    for (n, (o, i)) in outcomes.iter().zip(&inputs).enumerate() {
        if let IngestOutcome::Created(e) = o {
            for d in e.deliveries.as_ref().unwrap() {
                made.push((d.id.0.to_string(), n, i.trace.as_ref().map(TraceContext::traceparent)));
            }
        }
    }
    let mut announced: Vec<(String, usize, Option<String>)> = content
        .lines()
        .map(|l| {
            let words: Vec<&str> = l.split(' ').collect();
            assert_eq!((words[0], words[3]), ("d", "created"), "{l}");
            let n = made.iter().find(|m| m.0 == words[1]).unwrap_or_else(|| panic!("announced a Delivery not made: {l}")).1;
            (words[1].to_string(), n, words.iter().find_map(|w| w.strip_prefix("tp=")).map(str::to_string))
        })
        .collect();
    assert_eq!(announced.len(), 9, "{content}");
    let positions: Vec<usize> = announced.iter().map(|a| a.1).collect();
    assert!(positions.windows(2).all(|w| w[0] <= w[1]), "announced in the Events' order: {positions:?}");
    announced.sort();
    made.sort();
    assert_eq!(announced, made, "each Delivery once, with its Event's traceparent");
}
