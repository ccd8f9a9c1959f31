//! Tenancy: a key of project B can neither read nor change anything of project A. Every
//! route that takes an id answers 404 for A's ids, every list shows none of A's rows, and
//! nothing of A changes.

mod common;

use common::Api;
use serde_json::json;

#[tokio::test]
async fn a_foreign_key_walks_every_route_and_gets_404() {
    let api = Api::start().await;
    let a = api.project().await;
    let b = api.project().await;

    let (s, ep) = api.post(&a.key, "/v1/endpoints", json!({"url": "http://127.0.0.1:9/hook"})).await;
    assert_eq!(s, 201, "{ep}");
    let ep_id = ep["id"].as_str().unwrap().to_string();
    let (s, sub) = api.post(&a.key, "/v1/subscriptions", json!({"endpoint_id": ep_id, "event_type": "order.*"})).await;
    assert_eq!(s, 201, "{sub}");
    let sub_id = sub["id"].as_str().unwrap().to_string();
    let (s, ev) = api.post(&a.key, "/v1/events", json!({"type": "order.paid", "payload": {"n": 1}})).await;
    assert_eq!(s, 201, "{ev}");
    let ev_id = ev["id"].as_str().unwrap().to_string();
    let (s, key) = api.post(&a.key, "/v1/api-keys", json!({"name": "a2"})).await;
    assert_eq!(s, 201);
    let key_id = key["id"].as_str().unwrap().to_string();
    let before = snapshot(&api).await;

    // (method, path, body) with A's ids, sent with B's key.
    let walk: Vec<(&str, String, Option<serde_json::Value>)> = vec![
        ("GET", format!("/v1/events/{ev_id}"), None),
        ("GET", format!("/v1/endpoints/{ep_id}"), None),
        ("PATCH", format!("/v1/endpoints/{ep_id}"), Some(json!({"description": "taken"}))),
        ("DELETE", format!("/v1/endpoints/{ep_id}"), None),
        ("POST", format!("/v1/endpoints/{ep_id}/rotate-secret"), Some(json!({}))),
        ("GET", format!("/v1/endpoints/{ep_id}/secret"), None),
        ("GET", format!("/v1/subscriptions/{sub_id}"), None),
        ("PATCH", format!("/v1/subscriptions/{sub_id}"), Some(json!({"enabled": false}))),
        ("DELETE", format!("/v1/subscriptions/{sub_id}"), None),
        ("DELETE", format!("/v1/api-keys/{key_id}"), None),
    ];
    for (method, path, body) in &walk {
        let mut req = api.http.request(method.parse().unwrap(), api.url(path)).bearer_auth(&b.key);
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let body: serde_json::Value = resp.json().await.unwrap_or_default();
        assert_eq!(status, 404, "{method} {path} with a foreign key: {body}");
        assert_eq!(body["error"]["code"], "not_found", "{method} {path}");
    }
    // Creating a subscription on A's endpoint is refused as for an id that names nothing
    // (404 naming the field), without revealing it exists.
    let (s, body) = api.post(&b.key, "/v1/subscriptions", json!({"endpoint_id": ep_id, "event_type": "**"})).await;
    assert_eq!(s, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found", "{body}");
    assert_eq!(body["error"]["field"], "endpoint_id");
    // Lists show none of A's rows.
    for path in ["/v1/events", "/v1/endpoints", "/v1/subscriptions", "/v1/api-keys"] {
        let (s, list) = api.get(&b.key, path).await;
        assert_eq!(s, 200, "{path}");
        let text = list.to_string();
        for id in [&ev_id, &ep_id, &sub_id, &key_id] {
            assert!(!text.contains(id.as_str()), "{path} leaks {id}: {text}");
        }
    }
    let (_, filtered) = api.get(&b.key, &format!("/v1/subscriptions?endpoint_id={ep_id}")).await;
    assert_eq!(filtered["data"].as_array().map(Vec::len), Some(0), "{filtered}");
    // B's events do not reach A's subscriptions.
    let (s, evb) = api.post(&b.key, "/v1/events", json!({"type": "order.paid", "payload": {}})).await;
    assert_eq!(s, 201);
    assert_eq!(evb["deliveries"].as_array().unwrap().len(), 0);

    let after = snapshot(&api).await;
    assert_eq!(after.len(), before.len() + 1, "only B's own event was added");
    // A's rows are exactly as they were.
    for line in &before {
        assert!(after.contains(line), "A's row changed: {line}");
    }
    // And A still sees everything.
    assert_eq!(api.get(&a.key, &format!("/v1/endpoints/{ep_id}")).await.0, 200);
    assert_eq!(api.get(&a.key, &format!("/v1/subscriptions/{sub_id}")).await.0, 200);
}

/// Every row of A's kinds as text, to compare before and after.
async fn snapshot(api: &Api) -> Vec<String> {
    let client = api.db.client().await;
    let mut out = Vec::new();
    for (kind, sql) in [
        ("endpoint", "SELECT e::text FROM endpoints e"),
        ("secret", "SELECT s::text FROM endpoint_secrets s"),
        ("subscription", "SELECT s::text FROM subscriptions s"),
        ("event", "SELECT e::text FROM events e"),
        ("delivery", "SELECT d::text FROM deliveries d"),
        ("key", "SELECT k.id::text || coalesce(k.revoked_at::text, '') FROM api_keys k"),
    ] {
        for row in client.query(sql, &[]).await.unwrap() {
            out.push(format!("{kind} {}", row.get::<_, String>(0)));
        }
    }
    out
}

#[tokio::test]
async fn editing_a_subscription_does_not_change_deliveries_in_flight() {
    let api = Api::start().await;
    let a = api.project().await;
    let (_, ep) = api.post(&a.key, "/v1/endpoints", json!({"url": "http://127.0.0.1:9/hook"})).await;
    let (s, sub) = api
        .post(&a.key, "/v1/subscriptions", json!({"endpoint_id": ep["id"], "event_type": "**", "max_attempts": 3, "timeout_seconds": 5, "retry_delays": [1, 2]}))
        .await;
    assert_eq!(s, 201, "{sub}");
    let (_, ev) = api.post(&a.key, "/v1/events", json!({"type": "a.b", "payload": {}})).await;
    let sub_id = sub["id"].as_str().unwrap();
    let resp = api.http.patch(api.url(&format!("/v1/subscriptions/{sub_id}"))).bearer_auth(&a.key)
        .json(&json!({"max_attempts": 9, "timeout_seconds": 50, "retry_delays": [100]})).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let client = api.db.client().await;
    let row = client.query_one("SELECT max_attempts, timeout_seconds, retry_delays FROM deliveries", &[]).await.unwrap();
    assert_eq!((row.get::<_, i32>(0), row.get::<_, i32>(1), row.get::<_, Vec<i32>>(2)), (3, 5, vec![1, 2]));
    assert_eq!(ev["deliveries"].as_array().unwrap().len(), 1);
    // A Delivery of a subscription without its own ladder gets the default one.
    let (_, sub2) = api.post(&a.key, "/v1/subscriptions", json!({"endpoint_id": ep["id"], "event_type": "x.y"})).await;
    assert!(sub2["retry_delays"].is_null());
    api.post(&a.key, "/v1/events", json!({"type": "x.y", "payload": {}})).await;
    let row = client.query_one("SELECT max_attempts, retry_delays FROM deliveries WHERE subscription_id <> $1", &[&common::uuid_of(sub_id)]).await.unwrap();
    assert_eq!((row.get::<_, i32>(0), row.get::<_, Vec<i32>>(1)), (7, vec![60, 300, 900, 3600, 21600, 86400]));
}

#[tokio::test]
async fn the_payload_limit_is_configurable() {
    let db = railhook_testkit::TestDb::new().await;
    let mut config = railhook_testkit::test_config(&db);
    config.api.max_body_bytes = 4096;
    let api = Api::start_with(db, config).await;
    let a = api.project().await;
    let (s, _) = api.post(&a.key, "/v1/events", json!({"type": "a.b", "payload": {"x": "y".repeat(3000)}})).await;
    assert_eq!(s, 201);
    let (s, body) = api.post(&a.key, "/v1/events", json!({"type": "a.b", "payload": {"x": "y".repeat(5000)}})).await;
    assert_eq!(s, 413, "{body}");
    assert_eq!(body["error"]["code"], "payload_too_large");
}
