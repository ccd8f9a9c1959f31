//! Deliveries, Attempts and Failed Messages against the real Postgres over real HTTP:
//! listing and filters, Attempts in order, manual retry (single, bulk by ids, bulk by
//! filter) with its Outbox row, concurrency, tenant isolation and a bad-input table.
//!
//! Deliveries come from `POST /v1/events`; failure is simulated in SQL (status FAILED with
//! Attempt rows), since no worker runs here.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{uuid_of, Api};
use reqwest::header::{HeaderMap, HeaderValue};
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

/// Posts an Event; its id and its Deliveries' ids by endpoint id.
async fn event(api: &Api, t: &Tenant, event_type: &str) -> (String, Vec<(String, String)>) {
    let (s, ev) = api.post(&t.key, "/v1/events", json!({"type": event_type, "payload": {"n": 1}})).await;
    assert_eq!(s, 201, "{ev}");
    let deliveries = ev["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["id"].as_str().unwrap().to_string(), d["endpoint_id"].as_str().unwrap().to_string()))
        .collect();
    (ev["id"].as_str().unwrap().to_string(), deliveries)
}

/// The Delivery of `event` to `endpoint`.
fn to(deliveries: &[(String, String)], endpoint: &str) -> String {
    deliveries.iter().find(|(_, ep)| ep == endpoint).map(|(d, _)| d.clone()).unwrap()
}

/// What a worker would have left after `attempts` failed Attempts: FAILED, completed at
/// `completed_at`, the ladder started five days ago, a stale Claim, and the Attempt rows.
async fn fail(api: &Api, delivery: &str, attempts: i32, completed_at: &str) {
    let client = api.db.client().await;
    let id = uuid_of(delivery);
    for n in 1..=attempts {
        client
            .execute(
                "INSERT INTO attempts (id, project_id, delivery_id, attempt_number, started_at, duration_ms, status_code, result, error_message)
                 SELECT $1, project_id, id, $2, now(), 12, 503, 'http_status', 'HTTP 503' FROM deliveries WHERE id = $3",
                &[&uuid::Uuid::now_v7(), &n, &id],
            )
            .await
            .unwrap();
    }
    let n = client
        .execute(
            "UPDATE deliveries SET status = 'FAILED', attempt_count = $2, completed_at = $3::text::timestamptz,
                    last_error = 'HTTP 503', claim_token = gen_random_uuid(), claimed_at = now() - interval '1 hour',
                    next_retry_at = now() + interval '1 hour', ladder_started_at = now() - interval '5 days'
             WHERE id = $1",
            &[&id, &attempts, &completed_at],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
}

fn ids(list: &Value) -> Vec<String> {
    list["data"].as_array().unwrap_or_else(|| panic!("not a list: {list}")).iter().map(|d| d["id"].as_str().or(d["delivery_id"].as_str()).unwrap().to_string()).collect()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

async fn post_raw(api: &Api, key: &str, path: &str, content_type: Option<&str>, body: &str) -> (u16, Value) {
    let mut req = api.http.post(api.url(path)).bearer_auth(key).body(body.to_string());
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Every Delivery and Outbox row as text, to show that something changed nothing.
async fn snapshot(api: &Api) -> Vec<String> {
    let client = api.db.client().await;
    let mut out = Vec::new();
    for sql in ["SELECT d::text FROM deliveries d ORDER BY id", "SELECT o::text FROM outbox o ORDER BY id", "SELECT a::text FROM attempts a ORDER BY id"] {
        for row in client.query(sql, &[]).await.unwrap() {
            out.push(row.get::<_, String>(0));
        }
    }
    out
}

#[tokio::test]
async fn deliveries_are_listed_with_filters_and_pages() {
    let api = Api::start().await;
    let t = tenant(&api).await;
    let (ev1, d1) = event(&api, &t, "order.paid").await;
    let (_, d2) = event(&api, &t, "order.shipped").await;
    let (_, d3) = event(&api, &t, "user.created").await;
    assert_eq!((d1.len(), d2.len(), d3.len()), (2, 2, 1));
    let all: Vec<String> = sorted(d1.iter().chain(&d2).chain(&d3).map(|(d, _)| d.clone()).collect());

    let (s, list) = api.get(&t.key, "/v1/deliveries").await;
    assert_eq!(s, 200, "{list}");
    assert_eq!(ids(&list), all, "every Delivery, in id order");
    assert!(list["next_cursor"].is_null());
    let first = &list["data"][0];
    assert_eq!(first["status"], "PENDING");
    assert_eq!(first["event_type"], "order.paid");
    assert_eq!(first["event_id"], ev1.as_str());
    assert_eq!(first["attempt_count"], 0);
    assert_eq!(first["max_attempts"], 7);
    assert_eq!(first["retry_delays"], json!([60, 300, 900, 3600, 21600, 86400]));
    assert!(first["ladder_started_at"].is_string() && first["completed_at"].is_null(), "{first}");

    // Filters, each alone and together.
    fail(&api, &to(&d2, &t.ep2), 3, "2026-01-02T00:00:00Z").await;
    let (_, failed) = api.get(&t.key, "/v1/deliveries?status=FAILED").await;
    assert_eq!(ids(&failed), vec![to(&d2, &t.ep2)]);
    assert_eq!(failed["data"][0]["attempt_count"], 3);
    assert_eq!(failed["data"][0]["last_error"], "HTTP 503");
    let (_, pending) = api.get(&t.key, "/v1/deliveries?status=pending").await;
    assert_eq!(pending["data"].as_array().unwrap().len(), 4, "status is case-insensitive: {pending}");
    let (_, succeeded) = api.get(&t.key, "/v1/deliveries?status=SUCCESS").await;
    assert_eq!(ids(&succeeded), Vec::<String>::new());
    let (_, on_ep1) = api.get(&t.key, &format!("/v1/deliveries?endpoint_id={}", t.ep1)).await;
    assert_eq!(ids(&on_ep1), sorted(vec![to(&d1, &t.ep1), to(&d2, &t.ep1)]));
    let (_, of_ev1) = api.get(&t.key, &format!("/v1/deliveries?event_id={ev1}")).await;
    assert_eq!(ids(&of_ev1), sorted(d1.iter().map(|(d, _)| d.clone()).collect()));
    let (_, both) = api.get(&t.key, &format!("/v1/deliveries?event_id={ev1}&endpoint_id={}&status=PENDING", t.ep2)).await;
    assert_eq!(ids(&both), vec![to(&d1, &t.ep2)]);

    // Time range [created_after, created_before).
    let client = api.db.client().await;
    for (i, d) in all.iter().enumerate() {
        client
            .execute("UPDATE deliveries SET created_at = '2026-03-01T00:00:00Z'::timestamptz + make_interval(hours => $2) WHERE id = $1", &[&uuid_of(d), &(i as i32)])
            .await
            .unwrap();
    }
    let (_, window) = api.get(&t.key, "/v1/deliveries?created_after=2026-03-01T01:00:00Z&created_before=2026-03-01T03:00:00Z").await;
    assert_eq!(ids(&window), all[1..3].to_vec(), "after is inclusive, before exclusive");
    let (_, offset) = api.get(&t.key, "/v1/deliveries?created_after=2026-03-01T04:00:00%2B01:00").await;
    assert_eq!(ids(&offset), all[3..].to_vec(), "offsets are honoured: {offset}");

    // Pages of 2 cover everything once.
    let mut seen = Vec::new();
    let mut path = "/v1/deliveries?limit=2".to_string();
    loop {
        let (s, page) = api.get(&t.key, &path).await;
        assert_eq!(s, 200, "{page}");
        let got = ids(&page);
        assert!(got.len() <= 2);
        seen.extend(got);
        match page["next_cursor"].as_str() {
            Some(c) => path = format!("/v1/deliveries?limit=2&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen, all);

    // One Delivery.
    let id = to(&d2, &t.ep2);
    let (s, one) = api.get(&t.key, &format!("/v1/deliveries/{id}")).await;
    assert_eq!(s, 200, "{one}");
    assert_eq!(one["id"], id.as_str());
    assert_eq!(one["status"], "FAILED");
    assert_eq!(one["endpoint_id"], t.ep2.as_str());
    assert_eq!(one["event_type"], "order.shipped");
    assert_eq!(one["completed_at"], "2026-01-02T00:00:00Z");
    let (s, missing) = api.get(&t.key, &format!("/v1/deliveries/{}", railhook_core::DeliveryId::new())).await;
    assert_eq!((s, missing["error"]["code"].as_str()), (404, Some("not_found")));
}

#[tokio::test]
async fn attempts_are_listed_in_attempt_order() {
    let api = Api::start().await;
    let t = tenant(&api).await;
    let (_, d) = event(&api, &t, "order.paid").await;
    let (with, without) = (to(&d, &t.ep1), to(&d, &t.ep2));
    let client = api.db.client().await;
    // Inserted out of order, and number 2 twice (a swept worker records its Attempt too).
    let mut inserted = Vec::new();
    for (n, code) in [(3, Some(500)), (1, None), (2, Some(503)), (2, Some(502))] {
        let id = uuid::Uuid::now_v7();
        client
            .execute(
                "INSERT INTO attempts (id, project_id, delivery_id, attempt_number, started_at, duration_ms, status_code, result,
                                       error_message, response_headers, response_body, response_truncated)
                 SELECT $1, project_id, id, $2, now(), 40, $3::int, CASE WHEN $3::int IS NULL THEN 'timeout' ELSE 'http_status' END,
                        'boom', '{\"content-type\": \"text/plain\"}'::jsonb, 'oops', true FROM deliveries WHERE id = $4",
                &[&id, &n, &code, &uuid_of(&with)],
            )
            .await
            .unwrap();
        inserted.push((n, id));
    }
    let (s, list) = api.get(&t.key, &format!("/v1/deliveries/{with}/attempts")).await;
    assert_eq!(s, 200, "{list}");
    let numbers: Vec<i64> = list["data"].as_array().unwrap().iter().map(|a| a["attempt_number"].as_i64().unwrap()).collect();
    assert_eq!(numbers, vec![1, 2, 2, 3]);
    let codes: Vec<Value> = list["data"].as_array().unwrap().iter().map(|a| a["status_code"].clone()).collect();
    assert_eq!(codes, vec![Value::Null, json!(503), json!(502), json!(500)], "ties in number go by id");
    let a = &list["data"][0];
    assert!(a["id"].as_str().unwrap().starts_with("att_"), "{a}");
    assert_eq!(a["delivery_id"], with.as_str());
    assert_eq!(a["result"], "timeout");
    assert_eq!(a["response_headers"]["content-type"], "text/plain");
    assert_eq!((a["response_body"].as_str(), a["response_truncated"].as_bool()), (Some("oops"), Some(true)));

    // Pages of 3, then the rest.
    let (_, p1) = api.get(&t.key, &format!("/v1/deliveries/{with}/attempts?limit=3")).await;
    assert_eq!(p1["data"].as_array().unwrap().len(), 3);
    let cursor = p1["next_cursor"].as_str().unwrap();
    let (_, p2) = api.get(&t.key, &format!("/v1/deliveries/{with}/attempts?limit=3&cursor={cursor}")).await;
    assert_eq!(p2["data"].as_array().unwrap().len(), 1);
    assert_eq!(p2["data"][0]["attempt_number"], 3);
    assert!(p2["next_cursor"].is_null());

    // No Attempts yet: an empty list, not a 404; an unknown Delivery: a 404.
    let (s, empty) = api.get(&t.key, &format!("/v1/deliveries/{without}/attempts")).await;
    assert_eq!((s, empty["data"].as_array().map(Vec::len)), (200, Some(0)), "{empty}");
    let (s, body) = api.get(&t.key, &format!("/v1/deliveries/{}/attempts", railhook_core::DeliveryId::new())).await;
    assert_eq!((s, body["error"]["code"].as_str()), (404, Some("not_found")));
}

#[tokio::test]
async fn failed_messages_filter_by_endpoint_event_type_and_time() {
    let api = Api::start().await;
    let t = tenant(&api).await;
    let (ev_a, a) = event(&api, &t, "order.paid").await;
    let (_, b) = event(&api, &t, "order.shipped").await;
    let (_, c) = event(&api, &t, "user.created").await;
    let (_, pending) = event(&api, &t, "order.paid").await;
    fail(&api, &to(&a, &t.ep1), 7, "2026-01-01T10:00:00Z").await;
    fail(&api, &to(&a, &t.ep2), 2, "2026-01-01T11:00:00Z").await;
    fail(&api, &to(&b, &t.ep1), 4, "2026-01-01T12:00:00Z").await;
    fail(&api, &to(&c, &t.ep2), 1, "2026-01-01T13:00:00Z").await;
    let failed_ids = sorted(vec![to(&a, &t.ep1), to(&a, &t.ep2), to(&b, &t.ep1), to(&c, &t.ep2)]);

    let (s, list) = api.get(&t.key, "/v1/failed-messages").await;
    assert_eq!(s, 200, "{list}");
    assert_eq!(ids(&list), failed_ids, "FAILED only, in id order");
    for (d, _) in &pending {
        assert!(!list.to_string().contains(d.as_str()), "a PENDING delivery is listed");
    }
    let item = list["data"].as_array().unwrap().iter().find(|i| i["delivery_id"] == to(&a, &t.ep1).as_str()).unwrap().clone();
    assert_eq!(
        item,
        json!({"delivery_id": to(&a, &t.ep1), "event_id": ev_a, "event_type": "order.paid", "endpoint_id": t.ep1,
               "attempt_count": 7, "last_error": "HTTP 503", "completed_at": "2026-01-01T10:00:00Z"})
    );

    let cases: Vec<(String, Vec<String>)> = vec![
        (format!("endpoint_id={}", t.ep1), vec![to(&a, &t.ep1), to(&b, &t.ep1)]),
        ("event_type=order.paid".into(), vec![to(&a, &t.ep1), to(&a, &t.ep2)]),
        ("event_type=order.refunded".into(), vec![]),
        ("completed_after=2026-01-01T11:00:00Z".into(), vec![to(&a, &t.ep2), to(&b, &t.ep1), to(&c, &t.ep2)]),
        ("completed_before=2026-01-01T11:00:00Z".into(), vec![to(&a, &t.ep1)]),
        ("completed_after=2026-01-01T11:00:00Z&completed_before=2026-01-01T13:00:00Z".into(), vec![to(&a, &t.ep2), to(&b, &t.ep1)]),
        (format!("endpoint_id={}&event_type=user.created&completed_after=2026-01-01T12:30:00Z", t.ep2), vec![to(&c, &t.ep2)]),
    ];
    for (query, want) in cases {
        let (s, got) = api.get(&t.key, &format!("/v1/failed-messages?{query}")).await;
        assert_eq!(s, 200, "{query}: {got}");
        assert_eq!(ids(&got), sorted(want), "{query}");
    }

    // Pages of 3, then the rest.
    let (_, p1) = api.get(&t.key, "/v1/failed-messages?limit=3").await;
    let cursor = p1["next_cursor"].as_str().unwrap();
    let (_, p2) = api.get(&t.key, &format!("/v1/failed-messages?limit=3&cursor={cursor}")).await;
    assert_eq!([ids(&p1), ids(&p2)].concat(), failed_ids);
    assert!(p2["next_cursor"].is_null());
}

#[tokio::test]
async fn a_retry_puts_a_failed_delivery_back_on_the_ladder_and_announces_it() {
    let api = Api::start().await;
    let t = tenant(&api).await;
    let (_, d) = event(&api, &t, "order.paid").await;
    let id = to(&d, &t.ep1);
    fail(&api, &id, 7, "2026-01-01T10:00:00Z").await;
    let client = api.db.client().await;
    let outbox_before = api.count("SELECT count(*) FROM outbox").await;

    let (s, body) = api.post(&t.key, &format!("/v1/deliveries/{id}/retry"), json!({"extra_attempts": 3})).await;
    assert_eq!(s, 202, "{body}");
    assert_eq!(body["id"], id.as_str());
    assert_eq!(body["status"], "PENDING");
    assert_eq!((body["attempt_count"].as_i64(), body["max_attempts"].as_i64()), (Some(7), Some(10)));
    assert!(body["completed_at"].is_null() && body["next_retry_at"].is_null(), "{body}");
    assert_eq!(body["last_error"], "HTTP 503", "the last error stays on record");
    assert_eq!(body["event_type"], "order.paid");

    let row = client
        .query_one(
            "SELECT status::text, max_attempts, next_retry_at IS NULL, claim_token IS NULL, claimed_at IS NULL, completed_at IS NULL,
                    ladder_started_at > now() - interval '1 minute', updated_at > now() - interval '1 minute',
                    last_announced_at > now() - interval '1 minute'
             FROM deliveries WHERE id = $1",
            &[&uuid_of(&id)],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "PENDING");
    assert_eq!(row.get::<_, i32>(1), 10);
    for (i, what) in ["next_retry_at cleared", "claim_token cleared", "claimed_at cleared", "completed_at cleared", "ladder_started_at moved to now", "updated_at moved", "last_announced_at moved"].iter().enumerate() {
        assert!(row.get::<_, bool>(i + 2), "{what}");
    }
    // Exactly one new Outbox row, for this Delivery, routed by its endpoint.
    assert_eq!(api.count("SELECT count(*) FROM outbox").await, outbox_before + 1);
    let ob = client.query_one("SELECT project_id, delivery_id, routing_id, reason, claim_token IS NULL FROM outbox ORDER BY id DESC LIMIT 1", &[]).await.unwrap();
    let project: uuid::Uuid = client.query_one("SELECT project_id FROM deliveries WHERE id = $1", &[&uuid_of(&id)]).await.unwrap().get(0);
    assert_eq!(ob.get::<_, uuid::Uuid>(0), project);
    assert_eq!(ob.get::<_, uuid::Uuid>(1), uuid_of(&id));
    assert_eq!(ob.get::<_, uuid::Uuid>(2), uuid_of(&t.ep1));
    assert_eq!(ob.get::<_, String>(3), "manual_retry");
    assert!(ob.get::<_, bool>(4));
    // It left Failed Messages; its Attempts are still there.
    let (_, failed) = api.get(&t.key, "/v1/failed-messages").await;
    assert_eq!(ids(&failed), Vec::<String>::new());
    let (_, attempts) = api.get(&t.key, &format!("/v1/deliveries/{id}/attempts")).await;
    assert_eq!(attempts["data"].as_array().unwrap().len(), 7);

    // Not FAILED any more: 409 with the status, and nothing written.
    let before = snapshot(&api).await;
    let (s, body) = api.post(&t.key, &format!("/v1/deliveries/{id}/retry"), json!({})).await;
    assert_eq!(s, 409, "{body}");
    assert_eq!(body["error"]["code"], "not_failed");
    assert!(body["error"]["message"].as_str().unwrap().contains("PENDING"), "{body}");
    for status in ["PROCESSING", "SUCCESS"] {
        client.execute("UPDATE deliveries SET status = $2::text::delivery_status WHERE id = $1", &[&uuid_of(&id), &status]).await.unwrap();
        let (s, body) = api.post(&t.key, &format!("/v1/deliveries/{id}/retry"), json!({})).await;
        assert_eq!(s, 409, "{body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(status), "{body}");
    }
    client.execute("UPDATE deliveries SET status = 'PENDING' WHERE id = $1", &[&uuid_of(&id)]).await.unwrap();
    assert_eq!(snapshot(&api).await, before, "a refused retry wrote something");

    // Without a body (and with `{}`): one extra Attempt.
    let other = to(&d, &t.ep2);
    fail(&api, &other, 2, "2026-01-01T10:00:00Z").await;
    let resp = api.http.post(api.url(&format!("/v1/deliveries/{other}/retry"))).bearer_auth(&t.key).send().await.unwrap();
    assert_eq!(resp.status(), 202);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["max_attempts"], 3);
    fail(&api, &other, 3, "2026-01-01T10:00:00Z").await;
    let (s, body) = api.post(&t.key, &format!("/v1/deliveries/{other}/retry"), json!({})).await;
    assert_eq!((s, body["max_attempts"].as_i64()), (202, Some(4)));
    assert_eq!(api.count("SELECT count(*) FROM outbox WHERE reason = 'manual_retry'").await, 3);
}

#[tokio::test]
async fn concurrent_retries_of_one_delivery_retry_it_once() {
    let api = Api::start().await;
    let t = tenant(&api).await;
    let (_, d) = event(&api, &t, "order.paid").await;
    let id = to(&d, &t.ep1);
    fail(&api, &id, 7, "2026-01-01T10:00:00Z").await;
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let (http, url, key) = (api.http.clone(), api.url(&format!("/v1/deliveries/{id}/retry")), t.key.clone());
        tasks.push(tokio::spawn(async move { http.post(url).bearer_auth(key).json(&json!({"extra_attempts": 2})).send().await.unwrap().status().as_u16() }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    statuses.sort();
    assert_eq!(statuses, [vec![202], vec![409; 9]].concat());
    assert_eq!(api.count("SELECT count(*) FROM outbox WHERE reason = 'manual_retry'").await, 1);
    assert_eq!(api.count("SELECT max_attempts::bigint FROM deliveries WHERE status = 'PENDING' AND attempt_count = 7").await, 9);
}

#[tokio::test]
async fn a_retry_waits_for_a_concurrent_writer_and_answers_with_its_outcome() {
    let api = Api::start().await;
    let t = tenant(&api).await;
    let (_, d) = event(&api, &t, "order.paid").await;
    let id = to(&d, &t.ep1);
    fail(&api, &id, 7, "2026-01-01T10:00:00Z").await;

    // Another writer holds the row and turns it to SUCCESS (say, a late finalise).
    let mut locker = api.db.client().await;
    let tx = locker.transaction().await.unwrap();
    tx.execute("SELECT 1 FROM deliveries WHERE id = $1 FOR UPDATE", &[&uuid_of(&id)]).await.unwrap();
    let (http, url, key) = (api.http.clone(), api.url(&format!("/v1/deliveries/{id}/retry")), t.key.clone());
    let retry = tokio::spawn(async move {
        let resp = http.post(url).bearer_auth(key).json(&json!({})).send().await.unwrap();
        (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
    });
    let observer = api.db.client().await;
    railhook_testkit::eventually(Duration::from_secs(10), "the retry to wait on the row lock", || async {
        let n: i64 = observer
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'", &[])
            .await
            .unwrap()
            .get(0);
        (n == 1).then_some(())
    })
    .await;
    tx.execute("UPDATE deliveries SET status = 'SUCCESS' WHERE id = $1", &[&uuid_of(&id)]).await.unwrap();
    tx.commit().await.unwrap();
    let (s, body) = retry.await.unwrap();
    assert_eq!(s, 409, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("SUCCESS"), "the committed status, not the stale one: {body}");
    assert_eq!(api.count("SELECT count(*) FROM outbox WHERE reason = 'manual_retry'").await, 0);

    // A bulk retry does not wait: a row another transaction holds is skipped as busy.
    let other = to(&d, &t.ep2);
    fail(&api, &other, 7, "2026-01-01T10:00:00Z").await;
    let tx = locker.transaction().await.unwrap();
    tx.execute("SELECT 1 FROM deliveries WHERE id = $1 FOR UPDATE", &[&uuid_of(&other)]).await.unwrap();
    let (s, body) = api.post(&t.key, "/v1/failed-messages/retry", json!({"ids": [other]})).await;
    assert_eq!(s, 202, "{body}");
    assert_eq!(body, json!({"retried": 0, "ids": [], "skipped": [{"id": other, "reason": "busy"}]}));
    let (s, body) = api.post(&t.key, "/v1/failed-messages/retry", json!({"filter": {}})).await;
    assert_eq!((s, body["retried"].as_i64()), (202, Some(0)), "{body}");
    tx.rollback().await.unwrap();
    let (_, body) = api.post(&t.key, "/v1/failed-messages/retry", json!({"filter": {}})).await;
    assert_eq!(body["ids"], json!([other]));
}

#[tokio::test]
async fn bulk_retry_by_ids_retries_the_failed_and_reports_the_rest() {
    let api = Api::start().await;
    let t = tenant(&api).await;
    let stranger = tenant(&api).await;
    let (_, a) = event(&api, &t, "order.paid").await;
    let (_, b) = event(&api, &t, "order.paid").await;
    let (_, foreign) = event(&api, &stranger, "order.paid").await;
    let failed = sorted(vec![to(&a, &t.ep1), to(&a, &t.ep2), to(&b, &t.ep1)]);
    for id in &failed {
        fail(&api, id, 4, "2026-01-01T10:00:00Z").await;
    }
    let foreign_id = to(&foreign, &stranger.ep1);
    fail(&api, &foreign_id, 4, "2026-01-01T10:00:00Z").await;
    let pending = to(&b, &t.ep2);
    let unknown = railhook_core::DeliveryId::new().to_string();
    let foreign_before = api.db.client().await.query_one("SELECT d::text FROM deliveries d WHERE id = $1", &[&uuid_of(&foreign_id)]).await.unwrap().get::<_, String>(0);

    let given = json!([failed[2], pending, unknown, failed[0], foreign_id, failed[1], failed[0]]);
    let (s, body) = api.post(&t.key, "/v1/failed-messages/retry", json!({"ids": given, "extra_attempts": 5})).await;
    assert_eq!(s, 202, "{body}");
    assert_eq!(
        body,
        json!({
            "retried": 3,
            "ids": failed,
            "skipped": [
                {"id": pending, "reason": "not_failed", "status": "PENDING"},
                {"id": unknown, "reason": "not_found"},
                {"id": foreign_id, "reason": "not_found"},
            ],
        }),
        "a foreign id looks exactly like an unknown one"
    );
    for id in &failed {
        let (_, d) = api.get(&t.key, &format!("/v1/deliveries/{id}")).await;
        assert_eq!((d["status"].as_str(), d["max_attempts"].as_i64()), (Some("PENDING"), Some(9)), "{d}");
    }
    let announced: Vec<uuid::Uuid> = api
        .db
        .client()
        .await
        .query("SELECT delivery_id FROM outbox WHERE reason = 'manual_retry' ORDER BY delivery_id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(announced, failed.iter().map(|d| uuid_of(d)).collect::<Vec<_>>(), "one Outbox row each");
    let foreign_after = api.db.client().await.query_one("SELECT d::text FROM deliveries d WHERE id = $1", &[&uuid_of(&foreign_id)]).await.unwrap().get::<_, String>(0);
    assert_eq!(foreign_after, foreign_before, "another project's Delivery changed");

    // The same ids again: all skipped now, nothing written.
    let before = snapshot(&api).await;
    let (s, body) = api.post(&t.key, "/v1/failed-messages/retry", json!({"ids": failed})).await;
    assert_eq!((s, body["retried"].as_i64()), (202, Some(0)), "{body}");
    assert_eq!(body["skipped"].as_array().unwrap().len(), 3);
    assert!(body["skipped"].as_array().unwrap().iter().all(|s| s["reason"] == "not_failed" && s["status"] == "PENDING"), "{body}");
    assert_eq!(snapshot(&api).await, before);

    // The limit: 1000 ids are fine.
    let mut many: Vec<String> = (0..999).map(|_| railhook_core::DeliveryId::new().to_string()).collect();
    many.push(to(&foreign, &stranger.ep2));
    let (s, body) = api.post(&t.key, "/v1/failed-messages/retry", json!({"ids": many})).await;
    assert_eq!((s, body["retried"].as_i64(), body["skipped"].as_array().map(Vec::len)), (202, Some(0), Some(1000)), "{}", body["error"]);
}

#[tokio::test]
async fn bulk_retry_by_filter_takes_the_matching_failed_up_to_the_limit() {
    let api = Api::start().await;
    let t = tenant(&api).await;
    let stranger = tenant(&api).await;
    let mut on_ep1_paid = Vec::new();
    for hour in 10..15 {
        let (_, d) = event(&api, &t, "order.paid").await;
        let id = to(&d, &t.ep1);
        fail(&api, &id, 7, &format!("2026-01-01T{hour}:00:00Z")).await;
        on_ep1_paid.push(id);
    }
    let (_, s1) = event(&api, &t, "order.shipped").await;
    let shipped = to(&s1, &t.ep1);
    fail(&api, &shipped, 7, "2026-01-01T12:30:00Z").await;
    let (_, u1) = event(&api, &t, "user.created").await;
    let on_ep2 = to(&u1, &t.ep2);
    fail(&api, &on_ep2, 7, "2026-01-01T12:45:00Z").await;
    let (_, f1) = event(&api, &stranger, "order.paid").await;
    let foreign = to(&f1, &stranger.ep1);
    fail(&api, &foreign, 7, "2026-01-01T12:00:00Z").await;

    let post = |body: Value| {
        let api = &api;
        let key = t.key.clone();
        async move {
            let (s, body) = api.post(&key, "/v1/failed-messages/retry", body).await;
            assert_eq!(s, 202, "{body}");
            assert!(body["skipped"].as_array().unwrap().is_empty(), "{body}");
            body["ids"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect::<Vec<_>>()
        }
    };
    // A time range and an event type, together.
    let got = post(json!({"filter": {"event_type": "order.paid", "completed_after": "2026-01-01T11:00:00Z", "completed_before": "2026-01-01T13:00:00Z"}})).await;
    assert_eq!(got, on_ep1_paid[1..3].to_vec());
    // One endpoint, two at a time, oldest first, until none are left.
    let filter = json!({"endpoint_id": t.ep1});
    assert_eq!(post(json!({"filter": filter, "limit": 2, "extra_attempts": 4})).await, vec![on_ep1_paid[0].clone(), on_ep1_paid[3].clone()]);
    assert_eq!(post(json!({"filter": filter, "limit": 2})).await, sorted(vec![on_ep1_paid[4].clone(), shipped.clone()]));
    assert_eq!(post(json!({"filter": filter, "limit": 2})).await, Vec::<String>::new());
    assert_eq!(api.get(&t.key, &format!("/v1/deliveries/{}", on_ep1_paid[0])).await.1["max_attempts"], 11);
    // `{}` takes everything left in this project, and nothing of another's.
    assert_eq!(post(json!({"filter": {}})).await, vec![on_ep2.clone()]);
    assert_eq!(api.count("SELECT count(*) FROM outbox WHERE reason = 'manual_retry'").await, 7);
    let foreign_status: String =
        api.db.client().await.query_one("SELECT status::text FROM deliveries WHERE id = $1", &[&uuid_of(&foreign)]).await.unwrap().get(0);
    assert_eq!(foreign_status, "FAILED");
}

#[tokio::test]
async fn a_foreign_key_gets_404_and_empty_lists_and_changes_nothing() {
    let api = Api::start().await;
    let a = tenant(&api).await;
    let b = tenant(&api).await;
    let (ev, d) = event(&api, &a, "order.paid").await;
    let id = to(&d, &a.ep1);
    fail(&api, &id, 3, "2026-01-01T10:00:00Z").await;
    let before = snapshot(&api).await;

    for (method, path, body) in [
        ("GET", format!("/v1/deliveries/{id}"), None),
        ("GET", format!("/v1/deliveries/{id}/attempts"), None),
        ("POST", format!("/v1/deliveries/{id}/retry"), Some(json!({"extra_attempts": 2}))),
        ("POST", format!("/v1/deliveries/{id}/retry"), None),
    ] {
        let mut req = api.http.request(method.parse().unwrap(), api.url(&path)).bearer_auth(&b.key);
        if let Some(body) = &body {
            req = req.json(body);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap_or_default();
        assert_eq!((status, body["error"]["code"].as_str()), (404, Some("not_found")), "{method} {path}: {body}");
    }
    for path in [
        "/v1/deliveries".to_string(),
        format!("/v1/deliveries?event_id={ev}"),
        format!("/v1/deliveries?endpoint_id={}", a.ep1),
        "/v1/deliveries?status=FAILED".to_string(),
        "/v1/failed-messages".to_string(),
        format!("/v1/failed-messages?endpoint_id={}", a.ep1),
    ] {
        let (s, list) = api.get(&b.key, &path).await;
        assert_eq!(s, 200, "{path}: {list}");
        assert_eq!(list["data"].as_array().map(Vec::len), Some(0), "{path} shows another project's rows: {list}");
    }
    let (s, body) = api.post(&b.key, "/v1/failed-messages/retry", json!({"ids": [id]})).await;
    assert_eq!((s, body["retried"].as_i64()), (202, Some(0)), "{body}");
    assert_eq!(body["skipped"], json!([{"id": id, "reason": "not_found"}]));
    for filter in [json!({}), json!({"endpoint_id": a.ep1}), json!({"event_type": "order.paid"})] {
        let (s, body) = api.post(&b.key, "/v1/failed-messages/retry", json!({"filter": filter})).await;
        assert_eq!((s, body["retried"].as_i64()), (202, Some(0)), "{filter}: {body}");
    }
    assert_eq!(snapshot(&api).await, before, "a foreign key changed something");
    // A still sees and retries its own.
    let (s, _) = api.post(&a.key, &format!("/v1/deliveries/{id}/retry"), json!({})).await;
    assert_eq!(s, 202);
}

/// (name, method, path, body (JSON unless empty), status, code, field)
type Case = (&'static str, &'static str, String, String, u16, &'static str, Option<&'static str>);

#[tokio::test]
async fn malformed_requests_to_the_delivery_routes_get_precise_errors_and_write_nothing() {
    let api = Api::start().await;
    let t = tenant(&api).await;
    let (ev, d) = event(&api, &t, "order.paid").await;
    let failed = to(&d, &t.ep1);
    fail(&api, &failed, 2, "2026-01-01T10:00:00Z").await;
    let pending = to(&d, &t.ep2);
    let unknown = railhook_core::DeliveryId::new().to_string();
    let att = railhook_core::AttemptId::new().to_string();
    let ids_1001 = json!({"ids": (0..1001).map(|_| railhook_core::DeliveryId::new().to_string()).collect::<Vec<_>>()}).to_string();
    let retry = format!("/v1/deliveries/{failed}/retry");
    let bulk = "/v1/failed-messages/retry";
    let range = "created_after=2026-02-01T00:00:00Z&created_before=2026-01-01T00:00:00Z";

    let cases: Vec<Case> = vec![
        ("list: unknown status", "GET", "/v1/deliveries?status=DONE".into(), "".into(), 400, "invalid_query", Some("status")),
        ("list: endpoint id malformed", "GET", "/v1/deliveries?endpoint_id=nope".into(), "".into(), 400, "invalid_query", Some("endpoint_id")),
        ("list: endpoint id of another kind", "GET", format!("/v1/deliveries?endpoint_id={ev}"), "".into(), 400, "invalid_query", Some("endpoint_id")),
        ("list: event id of another kind", "GET", format!("/v1/deliveries?event_id={}", t.ep1), "".into(), 400, "invalid_query", Some("event_id")),
        ("list: created_after not a time", "GET", "/v1/deliveries?created_after=yesterday".into(), "".into(), 400, "invalid_query", Some("created_after")),
        ("list: created_before no zone", "GET", "/v1/deliveries?created_before=2026-01-01T00:00:00".into(), "".into(), 400, "invalid_query", Some("created_before")),
        ("list: empty range", "GET", format!("/v1/deliveries?{range}"), "".into(), 400, "invalid_range", Some("created_before")),
        ("list: limit zero", "GET", "/v1/deliveries?limit=0".into(), "".into(), 400, "invalid_query", Some("limit")),
        ("list: limit too big", "GET", "/v1/deliveries?limit=201".into(), "".into(), 400, "invalid_query", Some("limit")),
        ("list: cursor of another kind", "GET", format!("/v1/deliveries?cursor={ev}"), "".into(), 400, "invalid_query", Some("cursor")),
        ("list: unknown parameter", "GET", "/v1/deliveries?colour=red".into(), "".into(), 400, "invalid_query", Some("colour")),
        ("list: repeated parameter", "GET", "/v1/deliveries?status=FAILED&status=SUCCESS".into(), "".into(), 400, "invalid_query", Some("status")),
        ("get: malformed id", "GET", "/v1/deliveries/dlv_nope".into(), "".into(), 400, "invalid_id", Some("id")),
        ("get: id of another kind", "GET", format!("/v1/deliveries/{ev}"), "".into(), 400, "invalid_id", Some("id")),
        ("get: unknown id", "GET", format!("/v1/deliveries/{unknown}"), "".into(), 404, "not_found", None),
        ("attempts: malformed id", "GET", "/v1/deliveries/x/attempts".into(), "".into(), 400, "invalid_id", Some("id")),
        ("attempts: unknown id", "GET", format!("/v1/deliveries/{unknown}/attempts"), "".into(), 404, "not_found", None),
        ("attempts: cursor of another kind", "GET", format!("/v1/deliveries/{failed}/attempts?cursor={failed}"), "".into(), 400, "invalid_query", Some("cursor")),
        ("attempts: limit not a number", "GET", format!("/v1/deliveries/{failed}/attempts?limit=ten"), "".into(), 400, "invalid_query", Some("limit")),
        ("attempts: unknown parameter", "GET", format!("/v1/deliveries/{failed}/attempts?status=FAILED"), "".into(), 400, "invalid_query", Some("status")),
        ("retry: malformed id", "POST", "/v1/deliveries/dlv_/retry".into(), "{}".into(), 400, "invalid_id", Some("id")),
        ("retry: attempt id", "POST", format!("/v1/deliveries/{att}/retry"), "{}".into(), 400, "invalid_id", Some("id")),
        ("retry: unknown id", "POST", format!("/v1/deliveries/{unknown}/retry"), "{}".into(), 404, "not_found", None),
        ("retry: not failed", "POST", format!("/v1/deliveries/{pending}/retry"), "{}".into(), 409, "not_failed", None),
        ("retry: extra_attempts zero", "POST", retry.clone(), r#"{"extra_attempts":0}"#.into(), 422, "invalid_field", Some("extra_attempts")),
        ("retry: extra_attempts 21", "POST", retry.clone(), r#"{"extra_attempts":21}"#.into(), 422, "invalid_field", Some("extra_attempts")),
        ("retry: extra_attempts negative", "POST", retry.clone(), r#"{"extra_attempts":-3}"#.into(), 422, "invalid_field", Some("extra_attempts")),
        ("retry: extra_attempts a string", "POST", retry.clone(), r#"{"extra_attempts":"2"}"#.into(), 422, "invalid_field", Some("extra_attempts")),
        ("retry: extra_attempts a fraction", "POST", retry.clone(), r#"{"extra_attempts":1.5}"#.into(), 422, "invalid_field", Some("extra_attempts")),
        ("retry: extra_attempts huge", "POST", retry.clone(), r#"{"extra_attempts":99999999999999999999}"#.into(), 422, "invalid_field", Some("extra_attempts")),
        ("retry: unknown field", "POST", retry.clone(), r#"{"attempts":2}"#.into(), 422, "invalid_field", Some("attempts")),
        ("retry: array body", "POST", retry.clone(), "[]".into(), 422, "invalid_field", Some("body")),
        ("retry: invalid json", "POST", retry.clone(), "{".into(), 400, "invalid_json", Some("body")),
        ("failed: endpoint id malformed", "GET", "/v1/failed-messages?endpoint_id=ep_1".into(), "".into(), 400, "invalid_query", Some("endpoint_id")),
        ("failed: bad event type", "GET", "/v1/failed-messages?event_type=Order.Paid".into(), "".into(), 400, "invalid_query", Some("event_type")),
        ("failed: wildcard event type", "GET", "/v1/failed-messages?event_type=order.*".into(), "".into(), 400, "invalid_query", Some("event_type")),
        ("failed: completed_after not a time", "GET", "/v1/failed-messages?completed_after=1700000000".into(), "".into(), 400, "invalid_query", Some("completed_after")),
        ("failed: empty range", "GET", "/v1/failed-messages?completed_after=2026-01-01T00:00:00Z&completed_before=2026-01-01T00:00:00Z".into(), "".into(), 400, "invalid_range", Some("completed_before")),
        ("failed: cursor malformed", "GET", "/v1/failed-messages?cursor=abc".into(), "".into(), 400, "invalid_query", Some("cursor")),
        ("failed: status is not a filter", "GET", "/v1/failed-messages?status=FAILED".into(), "".into(), 400, "invalid_query", Some("status")),
        ("bulk: neither ids nor filter", "POST", bulk.into(), "{}".into(), 400, "ids_or_filter", Some("ids")),
        ("bulk: both null", "POST", bulk.into(), r#"{"ids":null,"filter":null}"#.into(), 400, "ids_or_filter", Some("ids")),
        ("bulk: both ids and filter", "POST", bulk.into(), format!(r#"{{"ids":["{failed}"],"filter":{{}}}}"#), 400, "ids_or_filter", Some("filter")),
        ("bulk: empty ids", "POST", bulk.into(), r#"{"ids":[]}"#.into(), 422, "invalid_field", Some("ids")),
        ("bulk: 1001 ids", "POST", bulk.into(), ids_1001, 422, "invalid_field", Some("ids")),
        ("bulk: malformed id", "POST", bulk.into(), format!(r#"{{"ids":["{failed}","nope"]}}"#), 422, "invalid_field", Some("ids[1]")),
        ("bulk: id of another kind", "POST", bulk.into(), format!(r#"{{"ids":["{ev}"]}}"#), 422, "invalid_field", Some("ids[0]")),
        ("bulk: ids not a list", "POST", bulk.into(), format!(r#"{{"ids":"{failed}"}}"#), 422, "invalid_field", Some("ids")),
        ("bulk: limit with ids", "POST", bulk.into(), format!(r#"{{"ids":["{failed}"],"limit":5}}"#), 422, "invalid_field", Some("limit")),
        ("bulk: limit zero", "POST", bulk.into(), r#"{"filter":{},"limit":0}"#.into(), 422, "invalid_field", Some("limit")),
        ("bulk: limit 1001", "POST", bulk.into(), r#"{"filter":{},"limit":1001}"#.into(), 422, "invalid_field", Some("limit")),
        ("bulk: extra_attempts 21", "POST", bulk.into(), r#"{"filter":{},"extra_attempts":21}"#.into(), 422, "invalid_field", Some("extra_attempts")),
        ("bulk: extra_attempts with ids", "POST", bulk.into(), format!(r#"{{"ids":["{failed}"],"extra_attempts":0}}"#), 422, "invalid_field", Some("extra_attempts")),
        ("bulk: filter endpoint malformed", "POST", bulk.into(), r#"{"filter":{"endpoint_id":"ep_x"}}"#.into(), 422, "invalid_field", Some("filter.endpoint_id")),
        ("bulk: filter event type bad", "POST", bulk.into(), r#"{"filter":{"event_type":"order..paid"}}"#.into(), 422, "invalid_field", Some("filter.event_type")),
        ("bulk: filter time bad", "POST", bulk.into(), r#"{"filter":{"completed_after":"noon"}}"#.into(), 422, "invalid_field", Some("filter.completed_after")),
        ("bulk: filter time a number", "POST", bulk.into(), r#"{"filter":{"completed_before":5}}"#.into(), 422, "invalid_field", Some("filter.completed_before")),
        ("bulk: filter empty range", "POST", bulk.into(), r#"{"filter":{"completed_after":"2026-01-02T00:00:00Z","completed_before":"2026-01-01T00:00:00Z"}}"#.into(), 422, "invalid_range", Some("filter.completed_before")),
        ("bulk: filter unknown field", "POST", bulk.into(), r#"{"filter":{"status":"FAILED"}}"#.into(), 422, "invalid_field", Some("filter.status")),
        ("bulk: filter not an object", "POST", bulk.into(), r#"{"filter":"all"}"#.into(), 422, "invalid_field", Some("filter")),
        ("bulk: unknown field", "POST", bulk.into(), r#"{"filter":{},"dry_run":true}"#.into(), 422, "invalid_field", Some("dry_run")),
        ("bulk: no body", "POST", bulk.into(), "".into(), 415, "unsupported_media_type", Some("content-type")),
        ("bulk: invalid json", "POST", bulk.into(), r#"{"ids":["#.into(), 400, "invalid_json", Some("body")),
        ("wrong method on failed messages", "DELETE", "/v1/failed-messages".into(), "".into(), 405, "method_not_allowed", None),
        ("wrong method on a delivery", "PATCH", format!("/v1/deliveries/{failed}"), "{}".into(), 405, "method_not_allowed", None),
        ("retry with GET", "GET", retry.clone(), "".into(), 405, "method_not_allowed", None),
    ];

    let before = snapshot(&api).await;
    let mut failures = Vec::new();
    for (name, method, path, body, status, code, field) in &cases {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", HeaderValue::from_str(&format!("Bearer {}", t.key)).unwrap());
        if !body.is_empty() {
            headers.insert("content-type", HeaderValue::from_static("application/json"));
        }
        let resp = api.http.request(method.parse().unwrap(), api.url(path)).headers(headers).body(body.clone()).send().await.unwrap();
        let got_status = resp.status().as_u16();
        let got: Value = resp.json().await.unwrap_or(Value::Null);
        let got_code = got["error"]["code"].as_str().unwrap_or("");
        let got_field = got["error"]["field"].as_str();
        if got_status != *status || got_code != *code || got_field != *field {
            failures.push(format!("{name}: expected {status} {code} {field:?}, got {got_status} {got}"));
        }
        if got["error"]["message"].as_str().is_none_or(str::is_empty) {
            failures.push(format!("{name}: no message in {got}"));
        }
    }
    // Without credentials and with a text body.
    for path in ["/v1/deliveries".to_string(), format!("/v1/deliveries/{failed}"), "/v1/failed-messages".to_string()] {
        let resp = api.http.get(api.url(&path)).send().await.unwrap();
        if resp.status() != 401 {
            failures.push(format!("{path} without a key: {}", resp.status()));
        }
    }
    let (s, body) = post_raw(&api, &t.key, &retry, Some("text/plain"), r#"{"extra_attempts":2}"#).await;
    if (s, body["error"]["code"].as_str()) != (415, Some("unsupported_media_type")) {
        failures.push(format!("retry with text/plain: {s} {body}"));
    }
    assert!(failures.is_empty(), "{} of {} cases wrong:\n{}", failures.len(), cases.len() + 4, failures.join("\n"));
    assert_eq!(snapshot(&api).await, before, "a malformed request wrote something");
    let still: BTreeSet<String> = ids(&api.get(&t.key, "/v1/failed-messages").await.1).into_iter().collect();
    assert!(still.contains(&failed));
}
