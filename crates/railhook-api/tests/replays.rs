//! Replays (issue 17) over real HTTP against the real Postgres: validation (4xx naming the
//! field), the dry-run count, one running Replay per project (409), the runner's batches to
//! completion (driven here by `railhook_store::replays::run_batch`: no worker runs), cancel,
//! and tenancy.

mod common;

use chrono::{Duration, Utc};
use common::Api;
use serde_json::{json, Value};

struct Tenant {
    key: String,
    /// Subscribed to `order.*`.
    ep1: String,
    /// Subscribed to `**`.
    ep2: String,
}

async fn tenant(api: &Api) -> Tenant {
    let p = api.project().await;
    let mut eps = Vec::new();
    for pattern in ["order.*", "**"] {
        let (s, ep) = api.post(&p.key, "/v1/endpoints", json!({"url": "http://127.0.0.1:9/hook"})).await;
        assert_eq!(s, 201, "{ep}");
        let id = ep["id"].as_str().unwrap().to_string();
        let (s, sub) = api.post(&p.key, "/v1/subscriptions", json!({"endpoint_id": id, "event_type": pattern})).await;
        assert_eq!(s, 201, "{sub}");
        eps.push(id);
    }
    Tenant { key: p.key, ep2: eps.pop().unwrap(), ep1: eps.pop().unwrap() }
}

/// Three `order.paid` and two `user.created` Events: 8 Deliveries (3 x 2 + 2 x 1).
async fn events(api: &Api, t: &Tenant) {
    for ty in ["order.paid", "order.paid", "order.paid", "user.created", "user.created"] {
        let (s, ev) = api.post(&t.key, "/v1/events", json!({"type": ty, "payload": {"n": 1}})).await;
        assert_eq!(s, 201, "{ev}");
    }
}

fn range() -> Value {
    json!({"from": (Utc::now() - Duration::hours(1)).to_rfc3339(), "to": (Utc::now() + Duration::minutes(1)).to_rfc3339()})
}

fn with(mut body: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Runs the Replay runner's batches (size 2) until none is left.
async fn run_all(api: &Api) {
    let pool = railhook_store::connect_pool(&api.config.database).await.unwrap();
    let mut client = pool.get().await.unwrap();
    for _ in 0..100 {
        match railhook_store::replays::run_batch(&mut client, 2).await.unwrap() {
            Some(_) => continue,
            None => return,
        }
    }
    panic!("the replay did not finish in 100 batches");
}

#[tokio::test]
async fn bad_input_is_a_4xx_naming_the_field() {
    let api = Api::start().await;
    let t = tenant(&api).await;
    let other = tenant(&api).await;
    let now = Utc::now();
    let day = |d: i64| (now - Duration::days(d)).to_rfc3339();
    let cases: Vec<(Value, u16, &str)> = vec![
        (json!({"to": day(0)}), 422, "from"),
        (json!({"from": day(1)}), 422, "to"),
        (json!({"from": "yesterday", "to": day(0)}), 422, "from"),
        (json!({"from": day(1), "to": day(2)}), 422, "to"),
        (json!({"from": day(1), "to": day(1)}), 422, "to"),
        (json!({"from": day(31), "to": day(0)}), 422, "to"),
        (json!({"from": (now + Duration::hours(1)).to_rfc3339(), "to": (now + Duration::hours(2)).to_rfc3339()}), 422, "from"),
        (with(range(), json!({"event_types": []})), 422, "event_types"),
        (with(range(), json!({"event_types": ["order.*.x"]})), 422, "event_types"),
        (with(range(), json!({"event_types": "order.*"})), 422, "event_types"),
        (with(range(), json!({"endpoint_ids": ["sub_00000000000000000000000000"]})), 422, "endpoint_ids"),
        (with(range(), json!({"endpoint_ids": [other.ep1]})), 404, "endpoint_ids"),
        (with(range(), json!({"endpoint_ids": []})), 422, "endpoint_ids"),
        (with(range(), json!({"dry_run": "yes"})), 422, "dry_run"),
        (with(range(), json!({"speed": 11})), 422, ""),
    ];
    for (body, status, field) in cases {
        let (s, err) = api.post(&t.key, "/v1/replays", body.clone()).await;
        assert_eq!(s, status, "{body} -> {err}");
        if !field.is_empty() {
            assert_eq!(err["error"]["field"], field, "{body} -> {err}");
        }
    }
    // 30 days exactly is allowed (dry run: nothing is created).
    let (s, body) = api.post(&t.key, "/v1/replays", json!({"from": day(30), "to": day(0), "dry_run": true})).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(api.count("SELECT count(*) FROM replays").await, 0);
    let (s, _) = api.get(&t.key, "/v1/replays/evt_00000000000000000000000000").await;
    assert_eq!(s, 400);
}

#[tokio::test]
async fn dry_run_counts_what_a_replay_would_make() {
    let api = Api::start().await;
    let t = tenant(&api).await;
    events(&api, &t).await;
    let dry = |extra: Value| with(with(range(), json!({"dry_run": true})), extra);
    let cases = [
        (dry(json!({})), 8, 5),
        (dry(json!({"event_types": ["order.*"]})), 6, 3),
        (dry(json!({"event_types": ["user.created", "order.paid"]})), 8, 5),
        (dry(json!({"event_types": ["invoice.**"]})), 0, 0),
        (dry(json!({"endpoint_ids": [t.ep1]})), 3, 3),
        (dry(json!({"endpoint_ids": [t.ep2], "event_types": ["user.*"]})), 2, 2),
        (dry(json!({"from": (Utc::now() - Duration::hours(2)).to_rfc3339(), "to": (Utc::now() - Duration::hours(1)).to_rfc3339()})), 0, 0),
    ];
    for (body, deliveries, events) in cases {
        let (s, answer) = api.post(&t.key, "/v1/replays", body.clone()).await;
        assert_eq!(s, 200, "{body} -> {answer}");
        assert_eq!(answer["dry_run"], true);
        assert_eq!(answer["deliveries"], deliveries, "{body} -> {answer}");
        assert_eq!(answer["events"], events, "{body} -> {answer}");
        assert_eq!(answer["capped"], false);
    }
    assert_eq!(api.count("SELECT count(*) FROM replays").await, 0);
    assert_eq!(api.count("SELECT count(*) FROM deliveries WHERE replay_id IS NOT NULL").await, 0);
}

#[tokio::test]
async fn one_running_replay_per_project_runs_to_completion_and_cancels() {
    let api = Api::start().await;
    let t = tenant(&api).await;
    events(&api, &t).await;
    let (s, r) = api.post(&t.key, "/v1/replays", range()).await;
    assert_eq!(s, 202, "{r}");
    let id = r["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("rpl_"));
    assert_eq!((r["state"].as_str(), r["total"].as_i64(), r["made"].as_i64()), (Some("running"), Some(8), Some(0)));

    let (s, err) = api.post(&t.key, "/v1/replays", range()).await;
    assert_eq!(s, 409, "{err}");
    assert_eq!(err["error"]["code"], "replay_running");
    assert!(err["error"]["message"].as_str().unwrap().contains(&id));
    // Another project is not blocked.
    let b = tenant(&api).await;
    let (s, other) = api.post(&b.key, "/v1/replays", range()).await;
    assert_eq!(s, 202, "{other}");

    run_all(&api).await;
    let (s, done) = api.get(&t.key, &format!("/v1/replays/{id}")).await;
    assert_eq!(s, 200);
    assert_eq!((done["state"].as_str(), done["made"].as_i64(), done["events_done"].as_i64()), (Some("completed"), Some(8), Some(5)), "{done}");
    assert!(done["finished_at"].is_string());
    let rid = id.parse::<railhook_core::ReplayId>().unwrap().0;
    let q = |sql: &str| sql.replace("$R", &format!("'{rid}'"));
    assert_eq!(api.count(&q("SELECT count(*) FROM deliveries WHERE replay_id = $R")).await, 8);
    assert_eq!(api.count(&q("SELECT count(*) FROM deliveries WHERE replay_id = $R AND replay_of IS NOT NULL AND status = 'PENDING'")).await, 8);
    assert_eq!(api.count(&q("SELECT count(*) FROM outbox o JOIN deliveries d ON d.id = o.delivery_id WHERE d.replay_id = $R AND o.reason = 'replay'")).await, 8);
    assert_eq!(api.count("SELECT count(*) FROM deliveries WHERE replay_id IS NULL").await, 8, "the originals are untouched");

    // Completed: a new one may start, and be cancelled once.
    let (s, next) = api.post(&t.key, "/v1/replays", with(range(), json!({"event_types": ["user.*"]}))).await;
    assert_eq!(s, 202, "{next}");
    let next_id = next["id"].as_str().unwrap();
    let (s, c) = api.post(&t.key, &format!("/v1/replays/{next_id}/cancel"), json!({})).await;
    assert_eq!(s, 200, "{c}");
    assert_eq!(c["state"], "cancelled");
    let (s, err) = api.post(&t.key, &format!("/v1/replays/{next_id}/cancel"), json!({})).await;
    assert_eq!(s, 409, "{err}");
    assert_eq!(err["error"]["code"], "not_running");

    let (s, list) = api.get(&t.key, "/v1/replays?limit=1").await;
    assert_eq!(s, 200);
    assert_eq!(list["data"][0]["id"], id.as_str());
    let cursor = list["next_cursor"].as_str().unwrap();
    let (_, rest) = api.get(&t.key, &format!("/v1/replays?limit=1&cursor={cursor}")).await;
    assert_eq!(rest["data"][0]["id"], next_id);
    assert!(rest["next_cursor"].is_null());
}

#[tokio::test]
async fn another_projects_replay_is_not_found() {
    let api = Api::start().await;
    let a = tenant(&api).await;
    let b = tenant(&api).await;
    let (s, r) = api.post(&a.key, "/v1/replays", range()).await;
    assert_eq!(s, 202, "{r}");
    let id = r["id"].as_str().unwrap();
    let (s, _) = api.get(&b.key, &format!("/v1/replays/{id}")).await;
    assert_eq!(s, 404);
    let (s, _) = api.post(&b.key, &format!("/v1/replays/{id}/cancel"), json!({})).await;
    assert_eq!(s, 404);
    let (_, list) = api.get(&b.key, "/v1/replays").await;
    assert_eq!(list["data"].as_array().unwrap().len(), 0);
    let (s, still) = api.get(&a.key, &format!("/v1/replays/{id}")).await;
    assert_eq!((s, still["state"].as_str()), (200, Some("running")));
    let (s, _) = api.get(&a.key, "/v1/replays/rpl_00000000000000000000000000").await;
    assert_eq!(s, 404);
}

#[tokio::test]
async fn an_ordered_subscription_gets_new_sequence_numbers_in_event_order() {
    let api = Api::start().await;
    let p = api.project().await;
    let (_, ep) = api.post(&p.key, "/v1/endpoints", json!({"url": "http://127.0.0.1:9/hook"})).await;
    let ep = ep["id"].as_str().unwrap().to_string();
    let (s, sub) = api.post(&p.key, "/v1/subscriptions", json!({"endpoint_id": ep, "event_type": "**", "ordering": true})).await;
    assert_eq!(s, 201, "{sub}");
    for _ in 0..3 {
        let (s, ev) = api.post(&p.key, "/v1/events", json!({"type": "order.paid", "payload": {}})).await;
        assert_eq!(s, 201, "{ev}");
    }
    // Numbers come with the first claim (migration 0035): the originals', then the Replay's.
    let pool = railhook_store::connect_pool(&api.config.database).await.unwrap();
    railhook_testkit::relay::claim_announced(&pool).await;
    let (s, r) = api.post(&p.key, "/v1/replays", range()).await;
    assert_eq!(s, 202, "{r}");
    run_all(&api).await;
    railhook_testkit::relay::claim_announced(&pool).await;
    let client = api.db.client().await;
    let rows = client
        .query("SELECT d.sequence_number, o.sequence_number FROM deliveries d JOIN deliveries o ON o.id = d.replay_of WHERE d.replay_id IS NOT NULL ORDER BY d.sequence_number", &[])
        .await
        .unwrap();
    let pairs: Vec<(i64, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(pairs, vec![(4, 1), (5, 2), (6, 3)], "new numbers after the originals, in the originals' order");
}

#[tokio::test]
async fn of_concurrent_starts_exactly_one_runs() {
    let api = Api::start().await;
    let t = tenant(&api).await;
    let starts = (0..6).map(|_| api.post(&t.key, "/v1/replays", range()));
    let answers = futures::future::join_all(starts).await;
    let mut codes: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
    codes.sort();
    assert_eq!(codes, vec![202, 409, 409, 409, 409, 409], "{answers:?}");
    assert_eq!(api.count("SELECT count(*) FROM replays WHERE state = 'running'").await, 1);
}
