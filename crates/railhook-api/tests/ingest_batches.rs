//! `POST /v1/events` in batches (issue 30, `railhook_api::ingest`): the POSTs that arrive
//! while every ingest lane is busy share the next statement, and each still gets its own
//! answer; a batch the database refuses is ingested one POST at a time. The lane is held
//! busy by a real table lock on `events`, so which POSTs share a statement is decided, not
//! raced.

mod common;

use std::time::Duration;

use common::{endpoint_with, metric, uuid_of, Api};
use railhook_testkit::{eventually, test_config, TestDb};
use serde_json::{json, Value};

/// One lane: a POST that finds it busy waits for the next batch.
async fn start() -> Api {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.api.ingest_lanes = 1;
    config.api.ingest_batch_max = 64;
    Api::start_with(db, config).await
}

type Post = tokio::task::JoinHandle<(u16, Value)>;

fn post(api: &Api, key: &str, idempotency_key: Option<&str>, body: Value) -> Post {
    let (http, url, key, idem) = (api.http.clone(), api.url("/v1/events"), key.to_string(), idempotency_key.map(str::to_string));
    tokio::spawn(async move {
        let mut request = http.post(url).bearer_auth(key).json(&body);
        if let Some(k) = idem {
            request = request.header("Idempotency-Key", k);
        }
        let resp = request.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    })
}

/// Holds the only lane: a transaction locks `events` against inserts and one POST's
/// statement waits for it. Returns that transaction's client (roll it back to release) and
/// the POST.
async fn hold_the_lane(api: &Api, key: &str) -> (tokio_postgres::Client, Post) {
    let locker = api.db.client().await;
    locker.batch_execute("BEGIN; LOCK TABLE events IN EXCLUSIVE MODE").await.unwrap();
    let first = post(api, key, None, json!({"type": "order.first", "payload": {}}));
    let probe = api.db.client().await;
    eventually(Duration::from_secs(10), "the first POST's statement to wait for the lock", || async {
        let waiting: i64 = probe
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO events%'", &[])
            .await
            .unwrap()
            .get(0);
        (waiting == 1).then_some(())
    })
    .await;
    (locker, first)
}

async fn queued(api: &Api, n: usize) {
    eventually(Duration::from_secs(10), "the POSTs to wait for the lane", || async {
        (metric(api, "railhook_api_ingest_queued").await == n as f64).then_some(())
    })
    .await;
}

#[tokio::test]
async fn posts_that_arrive_together_share_one_statement_and_each_gets_its_own_answer() {
    let api = start().await;
    let p = api.project().await;
    let q = api.project().await;
    endpoint_with(&api, &p.id, &[("order.*", false)]).await;
    endpoint_with(&api, &q.id, &[("order.*", false)]).await;
    let (status, original) = post(&api, &p.key, Some("k-replay"), json!({"type": "order.paid", "payload": {"n": 0}})).await.unwrap();
    assert_eq!(status, 201, "{original}");

    let (locker, first) = hold_the_lane(&api, &p.key).await;
    let plain: Vec<Post> = (1..=5).map(|n| post(&api, &p.key, None, json!({"type": "order.paid", "payload": {"n": n}}))).collect();
    let other_project = post(&api, &q.key, None, json!({"type": "order.paid", "payload": {}}));
    let unknown_key = post(&api, "rh_live_unknownunknownunknownunknown", None, json!({"type": "order.paid", "payload": {}}));
    let replay = post(&api, &p.key, Some("k-replay"), json!({"type": "order.paid", "payload": {"n": 0}}));
    let reused = post(&api, &p.key, Some("k-replay"), json!({"type": "order.paid", "payload": {"n": 99}}));
    let twins: Vec<Post> = (0..2).map(|_| post(&api, &p.key, Some("k-twin"), json!({"type": "order.paid", "payload": {"twin": true}}))).collect();
    // Everything above waits for the lane, then goes in one statement.
    queued(&api, 11).await;
    locker.batch_execute("ROLLBACK").await.unwrap();

    let (status, body) = first.await.unwrap();
    assert_eq!(status, 201, "{body}");
    let mut ids = std::collections::HashSet::new();
    for (n, post) in (1..=5).zip(plain) {
        let (status, body) = post.await.unwrap();
        assert_eq!(status, 201, "{body}");
        assert_eq!(body["deliveries"].as_array().unwrap().len(), 1, "its own Delivery: {body}");
        let id = body["id"].as_str().unwrap().to_string();
        assert!(ids.insert(id.clone()), "each POST its own Event: {body}");
        // The answer is this POST's Event, not a neighbour's.
        let (status, got) = api.get(&p.key, &format!("/v1/events/{id}")).await;
        assert_eq!((status, &got["payload"]["n"]), (200, &json!(n)), "{got}");
    }
    let (status, body) = other_project.await.unwrap();
    assert_eq!(status, 201, "{body}");
    let (status, body) = unknown_key.await.unwrap();
    assert_eq!(status, 401, "{body}");
    let (status, body) = replay.await.unwrap();
    assert_eq!((status, &body["id"]), (200, &original["id"]), "the replay answers the first Event: {body}");
    assert_eq!(body["deliveries"].as_array().unwrap().len(), 1, "{body}");
    let (status, body) = reused.await.unwrap();
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("idempotency_key_reused")), "{body}");
    let mut twin_answers = Vec::new();
    for post in twins {
        twin_answers.push(post.await.unwrap());
    }
    twin_answers.sort_by_key(|(status, _)| *status);
    assert_eq!((twin_answers[0].0, twin_answers[1].0), (200, 201), "{twin_answers:?}");
    assert_eq!(twin_answers[0].1["id"], twin_answers[1].1["id"], "one Event for one key: {twin_answers:?}");

    // Three statements: the first Event, the held POST, then the eleven together.
    assert_eq!(metric(&api, "railhook_api_ingest_batch_events_count").await, 3.0);
    assert_eq!(metric(&api, "railhook_api_ingest_batch_events_sum").await, 13.0);
    assert_eq!(metric(&api, "railhook_api_ingest_batches_refused_total").await, 0.0);
    let project_events = |id: &str| format!("SELECT count(*) FROM events WHERE project_id = '{}'", uuid_of(id));
    assert_eq!(api.count(&project_events(&p.id)).await, 8, "the key's Event, the held one, five, one twin");
    assert_eq!(api.count(&project_events(&q.id)).await, 1);
    assert_eq!(api.count("SELECT count(*) FROM deliveries").await, 9);
}

#[tokio::test]
async fn a_batch_the_database_refuses_is_ingested_one_post_at_a_time() {
    let api = start().await;
    let p = api.project().await;
    endpoint_with(&api, &p.id, &[("order.*", false)]).await;
    // A refusal no request check makes: the database's own.
    api.db
        .client()
        .await
        .batch_execute("ALTER TABLE events ADD CONSTRAINT refused_for_the_test CHECK (event_type <> 'order.refused')")
        .await
        .unwrap();

    let (locker, first) = hold_the_lane(&api, &p.key).await;
    let good: Vec<Post> = (1..=4).map(|n| post(&api, &p.key, None, json!({"type": "order.paid", "payload": {"n": n}}))).collect();
    let refused = post(&api, &p.key, None, json!({"type": "order.refused", "payload": {}}));
    queued(&api, 5).await;
    locker.batch_execute("ROLLBACK").await.unwrap();

    assert_eq!(first.await.unwrap().0, 201);
    for post in good {
        let (status, body) = post.await.unwrap();
        assert_eq!(status, 201, "a neighbour's refusal is not this POST's: {body}");
    }
    let (status, body) = refused.await.unwrap();
    assert_eq!(status, 500, "{body}");
    assert_eq!(metric(&api, "railhook_api_ingest_batches_refused_total").await, 1.0);
    assert_eq!(api.count("SELECT count(*) FROM events").await, 5);
    assert_eq!(api.count("SELECT count(*) FROM deliveries").await, 5);
}
