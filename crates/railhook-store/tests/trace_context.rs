//! Issue 33: every announcement of an Event's Deliveries, and of an Incoming Event's
//! Forwards, carries the trace context the ingest continued, whoever announces it: the
//! ingest itself, a Replay's batch (a new Delivery of the Event), a Forward's retry from the
//! scheduler, a person's retry of a failed Forward, and a replay of the Incoming Event. Read
//! from the outbox rows (the polling relay's form; the message form carries the same fields,
//! `lifecycle/announce.sql`).

use railhook_core::{ForwardId, TraceContext, TraceParent};
use railhook_store::incoming::{self, NewIncomingEvent, Received};
use railhook_store::lifecycle::{forward, replay};
use railhook_store::sources::{self, DestinationAuth, NewDestination, NewSource};
use railhook_testkit::relay::Fixture;

fn context() -> TraceContext {
    TraceContext { parent: TraceParent::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap(), state: Some("vendor=x".into()) }
}

/// The (traceparent, tracestate) of the outbox rows with `reason`.
async fn announced(db: &tokio_postgres::Client, reason: &str) -> Vec<(Option<String>, Option<String>)> {
    db.query("SELECT traceparent, tracestate FROM outbox WHERE reason = $1 ORDER BY id", &[&reason])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test]
async fn a_replays_deliveries_are_announced_in_their_events_trace() {
    let (db, pool, fixture) = Fixture::in_fresh_db(2).await;
    let client = db.client().await;
    let ty = railhook_core::pattern::EventType::parse("order.paid").unwrap();
    let payload = serde_json::json!({"n": 1});
    let patterns = railhook_core::pattern::candidate_patterns(&ty);
    let mut ids = Vec::new();
    for trace in [Some(context()), None] {
        let new = railhook_store::events::NewEvent {
            caller: railhook_store::events::Caller::Project(fixture.project),
            event_type: "order.paid",
            payload: &payload,
            idempotency_key: None,
            request_sha256: vec![0; 32],
            candidate_patterns: patterns.clone(),
            trace,
        };
        let pooled = pool.get().await.unwrap();
        let railhook_store::events::IngestOutcome::Created(event) = railhook_store::events::ingest(&pooled, new).await.unwrap() else { panic!("created") };
        ids.push(event);
    }
    let traced = (Some(context().traceparent()), Some("vendor=x".to_string()));
    assert_eq!(announced(&client, "created").await, vec![traced.clone(), traced.clone(), (None, None), (None, None)]);

    let pooled = pool.get().await.unwrap();
    let filter = railhook_store::replays::ReplayFilter { from: chrono::Utc::now() - chrono::Duration::hours(1), to: chrono::Utc::now(), event_types: None, endpoint_ids: None };
    let total = railhook_store::replays::ReplayCount { deliveries: 4, events: 2, capped: false };
    let railhook_store::replays::CreateOutcome::Created(r) = railhook_store::replays::create(&pooled, fixture.project, &filter, total).await.unwrap() else { panic!("created") };
    let mut targets = Vec::new();
    for event in &ids {
        for d in event.deliveries.as_ref().unwrap() {
            targets.push(replay::ReplayTarget { event: event.id, endpoint: d.endpoint_id, subscription: d.subscription_id.unwrap() });
        }
    }
    assert_eq!(replay::insert_batch(&pooled, r.id, fixture.project, &targets).await.unwrap(), 4);
    let mut replayed = announced(&client, "replay").await;
    replayed.sort();
    assert_eq!(replayed, vec![(None, None), (None, None), traced.clone(), traced], "each replayed Delivery in its Event's trace, if it has one");
}

#[tokio::test]
async fn a_forwards_retries_and_replays_are_announced_in_the_ingress_trace() {
    let (db, pool, fixture) = Fixture::in_fresh_db(0).await;
    let client = db.client().await;
    let pooled = pool.get().await.unwrap();
    let new = NewSource { name: "gh", provider: "github", config: None, secret: "s3cret", enabled: true, rate_limit_per_second: None };
    let source = sources::create_source(&**pooled, fixture.project, new).await.unwrap();
    let dest = NewDestination { url: "http://127.0.0.1:9/in", auth: &DestinationAuth::None, enabled: true, rate_limit_per_second: None };
    sources::create_destination(&**pooled, fixture.project, source.id, dest).await.unwrap().unwrap();
    let new = NewIncomingEvent { project: fixture.project, source: source.id, provider_event_id: Some("evt_1"), method: "POST", headers: &[], body: b"{}", content_type: None, trace: Some(context()) };
    let Received::Stored { id, forwards, .. } = incoming::receive(&pooled, new).await.unwrap() else { panic!("stored") };
    let forward: ForwardId = forwards[0].0;
    let traced = (Some(context().traceparent()), Some("vendor=x".to_string()));
    assert_eq!(announced(&client, "created").await, vec![traced.clone()], "the ingress's own announcement");

    // The scheduler's retry: due, unannounced.
    client.execute("UPDATE forwards SET attempt_count = 1, next_retry_at = now() - interval '1 s' WHERE id = $1", &[&forward.0]).await.unwrap();
    assert_eq!(forward::schedule_due(&client, 100, 100, 100, 60.0).await.unwrap(), 1);
    assert_eq!(announced(&client, "retry").await, vec![traced.clone()], "the scheduler's retry");

    // A person's retry of the failed Forward.
    client.execute("UPDATE forwards SET status = 'FAILED', claim_token = NULL, next_retry_at = NULL, completed_at = now() WHERE id = $1", &[&forward.0]).await.unwrap();
    assert!(matches!(forward::retry(&client, fixture.project, forward, 3).await.unwrap(), forward::ForwardRetryOutcome::Retried(_)));
    assert_eq!(announced(&client, "manual_retry").await, vec![traced.clone()], "a person's retry");

    // A replay of the Incoming Event: a new Forward, made and announced in one statement.
    assert!(matches!(forward::replay(&client, fixture.project, id, None).await.unwrap(), forward::ReplayOutcome::Replayed(f) if f.len() == 1));
    assert_eq!(announced(&client, "replay").await, vec![traced], "the replay");
}
