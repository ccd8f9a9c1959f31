//! Endpoints and Subscriptions against the real Postgres over real HTTP: CRUD, pagination,
//! secret rotation, URL and header refusals, Subscription validation and project isolation.

mod common;

use chrono::{DateTime, Utc};
use common::{uuid_of, Api, TestProject};
use railhook_testkit::{test_config, TestDb};
use reqwest::Method;
use serde_json::{json, Value};

async fn send(api: &Api, method: Method, key: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = api.http.request(method, api.url(path)).bearer_auth(key);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn patch(api: &Api, key: &str, path: &str, body: Value) -> (u16, Value) {
    send(api, Method::PATCH, key, path, Some(body)).await
}

async fn delete(api: &Api, key: &str, path: &str) -> (u16, Value) {
    send(api, Method::DELETE, key, path, None).await
}

async fn endpoint(api: &Api, p: &TestProject, url: &str) -> String {
    let (status, body) = api.post(&p.key, "/v1/endpoints", json!({"url": url})).await;
    assert_eq!(status, 201, "{body}");
    body["id"].as_str().unwrap().to_string()
}

#[track_caller]
fn assert_error(got: &(u16, Value), status: u16, code: &str, field: Option<&str>) {
    let (s, body) = got;
    assert_eq!(*s, status, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    if let Some(field) = field {
        assert_eq!(body["error"]["field"], field, "{body}");
    }
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
}

fn time(v: &Value) -> DateTime<Utc> {
    v.as_str().unwrap_or_else(|| panic!("not a time: {v}")).parse().unwrap()
}

/// An API whose allow-list is empty: loopback and private addresses are refused.
async fn api_without_allow_list() -> Api {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.network.allow_cidrs = Vec::new();
    Api::start_with(db, config).await
}

#[tokio::test]
async fn endpoint_crud_round_trip() {
    let api = Api::start().await;
    let p = api.project().await;

    let (status, created) = api
        .post(
            &p.key,
            "/v1/endpoints",
            json!({
                "url": "http://127.0.0.1:9/hook",
                "description": "orders service",
                "enabled": false,
                "rate_limit_per_second": 50,
                "headers": {"X-Tenant": "acme", "Authorization": "Bearer abc"}
            }),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    assert!(id.starts_with("ep_"), "{created}");
    assert_eq!(created["url"], "http://127.0.0.1:9/hook");
    assert_eq!(created["description"], "orders service");
    assert_eq!(created["enabled"], false);
    assert_eq!(created["rate_limit_per_second"], 50);
    assert_eq!(created["headers"], json!({"X-Tenant": "acme", "Authorization": "Bearer abc"}));
    assert_eq!(time(&created["created_at"]), time(&created["updated_at"]));
    assert!(created.get("secret").is_none(), "the endpoint JSON never carries the secret: {created}");
    // Ordering: nothing handed out, nothing ended yet.
    assert_eq!(created["last_sequence"], 0);
    assert_eq!(created["ordering_cursor"], 0);
    let keys: Vec<&String> = created.as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 10, "{created}");

    // A generated secret, stored as the one current secret.
    let (status, secret) = api.get(&p.key, &format!("/v1/endpoints/{id}/secret")).await;
    assert_eq!(status, 200, "{secret}");
    assert!(secret["secret"].as_str().unwrap().starts_with("whsec_"), "{secret}");
    assert_eq!(secret["previous_secrets"], json!([]));
    assert_eq!(api.count("SELECT count(*) FROM endpoint_secrets WHERE expires_at IS NULL").await, 1);

    let (status, got) = api.get(&p.key, &format!("/v1/endpoints/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(got, created);

    // Defaults.
    let (status, plain) = api.post(&p.key, "/v1/endpoints", json!({"url": "https://127.0.0.1/x"})).await;
    assert_eq!(status, 201, "{plain}");
    assert_eq!(plain["description"], "");
    assert_eq!(plain["enabled"], true);
    assert_eq!(plain["rate_limit_per_second"], Value::Null);
    assert_eq!(plain["headers"], json!({}));

    // PATCH: a subset changes, the rest stays; null clears the rate limit.
    let (status, changed) = patch(&api, &p.key, &format!("/v1/endpoints/{id}"), json!({"description": "v2", "enabled": true, "rate_limit_per_second": null})).await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["description"], "v2");
    assert_eq!(changed["enabled"], true);
    assert_eq!(changed["rate_limit_per_second"], Value::Null);
    assert_eq!(changed["url"], "http://127.0.0.1:9/hook");
    assert_eq!(changed["headers"], created["headers"]);
    assert_eq!(changed["created_at"], created["created_at"]);
    assert!(time(&changed["updated_at"]) > time(&created["updated_at"]));

    let (status, changed) = patch(&api, &p.key, &format!("/v1/endpoints/{id}"), json!({"url": "http://127.0.0.2:8080/other", "headers": {}, "rate_limit_per_second": 10000})).await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["url"], "http://127.0.0.2:8080/other");
    assert_eq!(changed["headers"], json!({}));
    assert_eq!(changed["rate_limit_per_second"], 10000);
    assert_eq!(changed["description"], "v2");

    assert_error(&patch(&api, &p.key, &format!("/v1/endpoints/{id}"), json!({"colour": "red"})).await, 422, "invalid_field", Some("colour"));
    assert_error(&patch(&api, &p.key, &format!("/v1/endpoints/{id}"), json!({"secret": "whsec_x"})).await, 422, "invalid_field", Some("secret"));
    assert_error(&patch(&api, &p.key, &format!("/v1/endpoints/{id}"), json!({"url": null})).await, 422, "invalid_field", Some("url"));
    assert_error(&patch(&api, &p.key, &format!("/v1/endpoints/{id}"), json!({"enabled": "yes"})).await, 422, "invalid_field", Some("enabled"));
    assert_error(&patch(&api, &p.key, &format!("/v1/endpoints/{id}"), json!({"rate_limit_per_second": 0})).await, 422, "invalid_field", Some("rate_limit_per_second"));
    assert_error(&patch(&api, &p.key, &format!("/v1/endpoints/{id}"), json!({"rate_limit_per_second": 10001})).await, 422, "invalid_field", Some("rate_limit_per_second"));
    assert_error(&api.post(&p.key, "/v1/endpoints", json!({"url": "http://127.0.0.1/", "rate_limit_per_second": -1})).await, 422, "invalid_field", Some("rate_limit_per_second"));
    assert_error(&api.post(&p.key, "/v1/endpoints", json!({"url": "http://127.0.0.1/", "description": "d".repeat(1001)})).await, 422, "invalid_field", Some("description"));
    assert_error(&api.post(&p.key, "/v1/endpoints", json!({"url": "http://127.0.0.1/", "secret": "not-a-secret"})).await, 422, "invalid_field", Some("secret"));
    assert_error(&api.post(&p.key, "/v1/endpoints", json!({"description": "no url"})).await, 422, "invalid_field", Some("url"));
    assert_error(&api.post(&p.key, "/v1/endpoints", json!({"url": "http://127.0.0.1/", "extra": 1})).await, 422, "invalid_field", Some("extra"));
    assert_error(&api.get(&p.key, "/v1/endpoints/ep_nope").await, 400, "invalid_id", Some("id"));
    assert_error(&api.get(&p.key, &format!("/v1/endpoints/{}", railhook_core::SubscriptionId::new())).await, 400, "invalid_id", Some("id"));

    // DELETE takes its secrets and Subscriptions with it.
    let (status, _) = api.post(&p.key, "/v1/subscriptions", json!({"endpoint_id": id, "event_type": "order.paid"})).await;
    assert_eq!(status, 201);
    let (status, _) = delete(&api, &p.key, &format!("/v1/endpoints/{id}")).await;
    assert_eq!(status, 204);
    assert_error(&api.get(&p.key, &format!("/v1/endpoints/{id}")).await, 404, "not_found", None);
    assert_error(&delete(&api, &p.key, &format!("/v1/endpoints/{id}")).await, 404, "not_found", None);
    assert_error(&patch(&api, &p.key, &format!("/v1/endpoints/{id}"), json!({"enabled": true})).await, 404, "not_found", None);
    assert_eq!(api.count(&format!("SELECT count(*) FROM endpoint_secrets WHERE endpoint_id = '{}'", uuid_of(id))).await, 0);
    assert_eq!(api.count("SELECT count(*) FROM subscriptions").await, 0);
    assert_eq!(api.count("SELECT count(*) FROM endpoints").await, 1);
}

#[tokio::test]
async fn endpoints_paginate_in_id_order() {
    let api = Api::start().await;
    let p = api.project().await;
    let mut created = Vec::new();
    for i in 0..7 {
        created.push(endpoint(&api, &p, &format!("http://127.0.0.1:9/{i}")).await);
    }

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/endpoints?limit=3&cursor={c}"),
            None => "/v1/endpoints?limit=3".to_string(),
        };
        let (status, page) = api.get(&p.key, &path).await;
        assert_eq!(status, 200, "{page}");
        let data = page["data"].as_array().unwrap();
        assert!(data.len() <= 3);
        seen.extend(data.iter().map(|e| e["id"].as_str().unwrap().to_string()));
        pages += 1;
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
        assert!(pages < 10, "pagination does not end");
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, created, "every endpoint once, in id order");

    let (_, all) = api.get(&p.key, "/v1/endpoints").await;
    assert_eq!(all["data"].as_array().unwrap().len(), 7);
    assert_eq!(all["next_cursor"], Value::Null);
    assert_error(&api.get(&p.key, "/v1/endpoints?limit=0").await, 400, "invalid_query", Some("limit"));
    assert_error(&api.get(&p.key, "/v1/endpoints?cursor=sub_x").await, 400, "invalid_query", Some("cursor"));
    assert_error(&api.get(&p.key, "/v1/endpoints?colour=red").await, 400, "invalid_query", None);
}

#[tokio::test]
async fn rotating_a_secret_keeps_the_previous_one_for_the_grace_period() {
    let api = Api::start().await;
    let p = api.project().await;
    let first = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let (status, ep) = api.post(&p.key, "/v1/endpoints", json!({"url": "http://127.0.0.1:9/", "secret": first})).await;
    assert_eq!(status, 201, "{ep}");
    let id = ep["id"].as_str().unwrap();
    let (_, secret) = api.get(&p.key, &format!("/v1/endpoints/{id}/secret")).await;
    assert_eq!(secret["secret"], first);

    // No body and no Content-Type: a generated secret.
    let resp = api.http.post(api.url(&format!("/v1/endpoints/{id}/rotate-secret"))).bearer_auth(&p.key).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let rotated: Value = resp.json().await.unwrap();
    let second = rotated["secret"].as_str().unwrap().to_string();
    assert!(second.starts_with("whsec_"), "{rotated}");
    assert_ne!(second, first);
    let grace = chrono::Duration::seconds(api.config.api.secret_rotation_grace_seconds as i64);
    assert_eq!(grace, chrono::Duration::hours(24));
    let expires = time(&rotated["previous_secret_expires_at"]);
    let expected = Utc::now() + grace;
    assert!((expires - expected).num_seconds().abs() < 60, "{expires} is not ~24 h ahead");

    let (status, secrets) = api.get(&p.key, &format!("/v1/endpoints/{id}/secret")).await;
    assert_eq!(status, 200);
    assert_eq!(secrets["secret"], second.as_str());
    let previous = secrets["previous_secrets"].as_array().unwrap();
    assert_eq!(previous.len(), 1, "{secrets}");
    assert_eq!(previous[0]["secret"], first);
    assert_eq!(time(&previous[0]["expires_at"]), expires);

    // A chosen secret, in a JSON body.
    let third = "whsec_dGhpcmQtc2VjcmV0LXRoaXJkLXNlY3JldC14eXo=";
    let (status, rotated) = api.post(&p.key, &format!("/v1/endpoints/{id}/rotate-secret"), json!({"secret": third})).await;
    assert_eq!(status, 200, "{rotated}");
    assert_eq!(rotated["secret"], third);
    let (_, secrets) = api.get(&p.key, &format!("/v1/endpoints/{id}/secret")).await;
    assert_eq!(secrets["secret"], third);
    let previous: Vec<&str> = secrets["previous_secrets"].as_array().unwrap().iter().map(|s| s["secret"].as_str().unwrap()).collect();
    assert_eq!(previous, vec![second.as_str(), first], "newest first");

    // An `{}` body rotates too; an expired secret is no longer listed.
    let (status, _) = api.post(&p.key, &format!("/v1/endpoints/{id}/rotate-secret"), json!({})).await;
    assert_eq!(status, 200);
    api.db
        .client()
        .await
        .execute("UPDATE endpoint_secrets SET expires_at = now() - interval '1 second' WHERE secret = $1", &[&first])
        .await
        .unwrap();
    let (_, secrets) = api.get(&p.key, &format!("/v1/endpoints/{id}/secret")).await;
    let previous: Vec<&str> = secrets["previous_secrets"].as_array().unwrap().iter().map(|s| s["secret"].as_str().unwrap()).collect();
    assert_eq!(previous, vec![third, second.as_str()]);
    assert_eq!(api.count("SELECT count(*) FROM endpoint_secrets WHERE expires_at IS NULL").await, 1);

    // Refusals.
    let rotate = format!("/v1/endpoints/{id}/rotate-secret");
    assert_error(&api.post(&p.key, &rotate, json!({"secret": "whsec_"})).await, 422, "invalid_field", Some("secret"));
    assert_error(&api.post(&p.key, &rotate, json!({"secret": "sk_abc"})).await, 422, "invalid_field", Some("secret"));
    assert_error(&api.post(&p.key, &rotate, json!({"grace": 5})).await, 422, "invalid_field", Some("grace"));
    let resp = api.http.post(api.url(&rotate)).bearer_auth(&p.key).body(r#"{"secret":"x"}"#).send().await.unwrap();
    assert_eq!(resp.status(), 415);
    let resp = api.http.post(api.url(&rotate)).bearer_auth(&p.key).header("content-type", "application/json").body("{").send().await.unwrap();
    assert_eq!(resp.status(), 400);
    let missing = railhook_core::EndpointId::new();
    assert_error(&api.post(&p.key, &format!("/v1/endpoints/{missing}/rotate-secret"), json!({})).await, 404, "not_found", None);
    assert_error(&api.get(&p.key, &format!("/v1/endpoints/{missing}/secret")).await, 404, "not_found", None);
    assert_error(&api.get(&p.key, "/v1/endpoints/ep_x/secret").await, 400, "invalid_id", Some("id"));
    assert_eq!(api.count("SELECT count(*) FROM endpoint_secrets").await, 4, "refused rotations wrote nothing");
}

/// Concurrent rotations of one Endpoint queue on its row lock: each succeeds, and exactly
/// one secret is current afterwards.
#[tokio::test]
async fn concurrent_rotations_leave_one_current_secret() {
    let api = Api::start().await;
    let p = api.project().await;
    let id = endpoint(&api, &p, "http://127.0.0.1:9/").await;
    let path = format!("/v1/endpoints/{id}/rotate-secret");
    let rotations = (0..12).map(|_| api.post(&p.key, &path, json!({})));
    let results = futures::future::join_all(rotations).await;
    let mut secrets: Vec<String> = results
        .iter()
        .map(|(status, body)| {
            assert_eq!(*status, 200, "{body}");
            body["secret"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(api.count("SELECT count(*) FROM endpoint_secrets WHERE expires_at IS NULL").await, 1);
    assert_eq!(api.count("SELECT count(*) FROM endpoint_secrets").await, 13);
    let (_, current) = api.get(&p.key, &format!("/v1/endpoints/{id}/secret")).await;
    assert!(secrets.contains(&current["secret"].as_str().unwrap().to_string()));
    assert_eq!(current["previous_secrets"].as_array().unwrap().len(), 12);
    secrets.sort();
    secrets.dedup();
    assert_eq!(secrets.len(), 12);
}

#[tokio::test]
async fn urls_to_private_addresses_are_refused_without_an_allow_list() {
    let api = api_without_allow_list().await;
    let p = api.project().await;
    let cases = [
        ("http://user:pw@127.0.0.1/", "invalid_url"),
        ("ftp://x", "invalid_url"),
        ("not a url", "invalid_url"),
        ("", "invalid_url"),
        ("http://10.0.0.1/", "url_not_allowed"),
        ("http://169.254.169.254/", "url_not_allowed"),
        ("http://[::1]/", "url_not_allowed"),
        ("http://2130706433/", "url_not_allowed"),
        ("http://127.0.0.1:9/", "url_not_allowed"),
        ("http://192.168.1.10/", "url_not_allowed"),
        ("http://localhost:9/", "url_not_allowed"),
        ("http://does-not-exist.invalid/", "url_unresolvable"),
    ];
    let mut failures = Vec::new();
    for (url, code) in cases {
        let (status, body) = api.post(&p.key, "/v1/endpoints", json!({"url": url})).await;
        if status != 422 || body["error"]["code"] != code || body["error"]["field"] != "url" {
            failures.push(format!("{url}: expected 422 {code}, got {status} {body}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(api.count("SELECT count(*) FROM endpoints").await, 0);

    // The same check on PATCH.
    let client = api.db.client().await;
    let ep = railhook_core::EndpointId::new();
    client
        .execute("INSERT INTO endpoints (id, project_id, url) VALUES ($1, $2, 'https://example.com/')", &[&ep.0, &uuid_of(&p.id)])
        .await
        .unwrap();
    assert_error(&patch(&api, &p.key, &format!("/v1/endpoints/{ep}"), json!({"url": "http://10.0.0.1/"})).await, 422, "url_not_allowed", Some("url"));
    assert_error(&patch(&api, &p.key, &format!("/v1/endpoints/{ep}"), json!({"url": "ftp://x"})).await, 422, "invalid_url", Some("url"));
    let (_, still) = api.get(&p.key, &format!("/v1/endpoints/{ep}")).await;
    assert_eq!(still["url"], "https://example.com/");
}

#[tokio::test]
async fn the_allow_list_admits_its_addresses_only() {
    let api = Api::start().await;
    assert_eq!(api.config.network.allow_cidrs, vec!["127.0.0.0/8".to_string()]);
    let p = api.project().await;
    let (status, body) = api.post(&p.key, "/v1/endpoints", json!({"url": "http://127.0.0.1:9/"})).await;
    assert_eq!(status, 201, "{body}");
    for url in ["http://10.0.0.1/", "http://169.254.169.254/latest/meta-data", "http://[::1]/"] {
        assert_error(&api.post(&p.key, "/v1/endpoints", json!({"url": url})).await, 422, "url_not_allowed", Some("url"));
    }

    // A name is admitted only if every address it resolves to is.
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.network.allow_cidrs = vec!["127.0.0.0/8".into(), "::1/128".into()];
    let api = Api::start_with(db, config).await;
    let p = api.project().await;
    let (status, body) = api.post(&p.key, "/v1/endpoints", json!({"url": "http://localhost:9/hook"})).await;
    assert_eq!(status, 201, "{body}");
}

#[tokio::test]
async fn custom_headers_are_validated() {
    let api = Api::start().await;
    let p = api.project().await;
    let too_many: serde_json::Map<String, Value> = (0..21).map(|i| (format!("x-h{i}"), json!("v"))).collect();
    let cases: Vec<(Value, &str)> = vec![
        (Value::Object(too_many), "headers"),
        (json!({"X Bad": "v"}), "headers.X Bad"),
        (json!({"X:Colon": "v"}), "headers.X:Colon"),
        (json!({"": "v"}), "headers."),
        (json!({"X-Newline": "a\r\nInjected: yes"}), "headers.X-Newline"),
        (json!({"X-Latin": "café"}), "headers.X-Latin"),
        (json!({"X-Tab": "a\tb"}), "headers.X-Tab"),
        (json!({"X-Padded": " v"}), "headers.X-Padded"),
        (json!({"Connection": "close"}), "headers.Connection"),
        (json!({"Keep-Alive": "1"}), "headers.Keep-Alive"),
        (json!({"Proxy-Authorization": "x"}), "headers.Proxy-Authorization"),
        (json!({"TE": "trailers"}), "headers.TE"),
        (json!({"Trailer": "x"}), "headers.Trailer"),
        (json!({"Transfer-Encoding": "chunked"}), "headers.Transfer-Encoding"),
        (json!({"Upgrade": "h2c"}), "headers.Upgrade"),
        (json!({"Host": "evil"}), "headers.Host"),
        (json!({"Content-Length": "1"}), "headers.Content-Length"),
        (json!({"Webhook-Signature": "v1,x"}), "headers.Webhook-Signature"),
        (json!({"webhook-id": "x"}), "headers.webhook-id"),
        (json!({"WEBHOOK-TIMESTAMP": "1"}), "headers.WEBHOOK-TIMESTAMP"),
        (json!({"Content-Type": "text/plain"}), "headers.Content-Type"),
        (json!({"User-Agent": "me"}), "headers.User-Agent"),
        (json!({"X-Event-Id": "x"}), "headers.X-Event-Id"),
        (json!({"x-sequence-number": "1"}), "headers.x-sequence-number"),
        (json!({"X-Num": 5}), "headers.X-Num"),
        (json!(["X-A"]), "headers"),
    ];
    let mut failures = Vec::new();
    for (headers, field) in &cases {
        let (status, body) = api.post(&p.key, "/v1/endpoints", json!({"url": "http://127.0.0.1:9/", "headers": headers})).await;
        if status != 422 || body["error"]["code"] != "invalid_field" || body["error"]["field"] != *field {
            failures.push(format!("{headers}: expected 422 field {field}, got {status} {body}"));
        }
    }
    // Header names are case-insensitive: the same header twice.
    let (status, body) = api.post(&p.key, "/v1/endpoints", json!({"url": "http://127.0.0.1:9/", "headers": {"X-A": "1", "x-a": "2"}})).await;
    if status != 422 || !body["error"]["field"].as_str().unwrap_or("").eq_ignore_ascii_case("headers.x-a") {
        failures.push(format!("duplicate: got {status} {body}"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(api.count("SELECT count(*) FROM endpoints").await, 0);

    let twenty: serde_json::Map<String, Value> = (0..20).map(|i| (format!("X-H{i}"), json!(format!("value {i}")))).collect();
    let (status, body) = api.post(&p.key, "/v1/endpoints", json!({"url": "http://127.0.0.1:9/", "headers": twenty})).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["headers"]["X-H7"], "value 7");
    let id = body["id"].as_str().unwrap();
    assert_error(&patch(&api, &p.key, &format!("/v1/endpoints/{id}"), json!({"headers": {"Host": "x"}})).await, 422, "invalid_field", Some("headers.Host"));
    assert_error(&patch(&api, &p.key, &format!("/v1/endpoints/{id}"), json!({"headers": null})).await, 422, "invalid_field", Some("headers"));
}

#[tokio::test]
async fn subscription_crud_round_trip() {
    let api = Api::start().await;
    let p = api.project().await;
    let ep = endpoint(&api, &p, "http://127.0.0.1:9/a").await;
    let other = endpoint(&api, &p, "http://127.0.0.1:9/b").await;

    let (status, sub) = api.post(&p.key, "/v1/subscriptions", json!({"endpoint_id": ep, "event_type": "order.*"})).await;
    assert_eq!(status, 201, "{sub}");
    let id = sub["id"].as_str().unwrap();
    assert!(id.starts_with("sub_"));
    assert_eq!(sub["endpoint_id"], ep.as_str());
    assert_eq!(sub["event_type"], "order.*");
    assert_eq!(sub["ordering"], false);
    assert_eq!(sub["max_attempts"], 7);
    assert_eq!(sub["timeout_seconds"], 30);
    assert_eq!(sub["retry_delays"], Value::Null);
    assert_eq!(sub["enabled"], true);
    assert_eq!(api.count("SELECT count(*) FROM subscriptions WHERE event_type_pattern = 'order.*'").await, 1);

    let (status, full) = api
        .post(
            &p.key,
            "/v1/subscriptions",
            json!({"endpoint_id": other, "event_type": "**", "ordering": true, "max_attempts": 20, "timeout_seconds": 60,
                   "retry_delays": [1, 604800], "enabled": false}),
        )
        .await;
    assert_eq!(status, 201, "{full}");
    assert_eq!(full["ordering"], true);
    assert_eq!(full["max_attempts"], 20);
    assert_eq!(full["timeout_seconds"], 60);
    assert_eq!(full["retry_delays"], json!([1, 604800]));
    assert_eq!(full["enabled"], false);

    let (status, got) = api.get(&p.key, &format!("/v1/subscriptions/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(got, sub);

    // The stored pattern is what ingest matches.
    let (status, event) = api.post(&p.key, "/v1/events", json!({"type": "order.paid", "payload": {}})).await;
    assert_eq!(status, 201, "{event}");
    let deliveries = event["deliveries"].as_array().unwrap();
    assert_eq!(deliveries.len(), 1, "the disabled ** subscription matches nothing: {event}");
    assert_eq!(deliveries[0]["subscription_id"], id);

    // Listing, all and per endpoint.
    let (_, all) = api.get(&p.key, "/v1/subscriptions").await;
    let ids: Vec<&str> = all["data"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec![id, full["id"].as_str().unwrap()]);
    let (_, only) = api.get(&p.key, &format!("/v1/subscriptions?endpoint_id={other}")).await;
    assert_eq!(only["data"].as_array().unwrap().len(), 1);
    assert_eq!(only["data"][0]["id"], full["id"]);
    let (_, page) = api.get(&p.key, "/v1/subscriptions?limit=1").await;
    assert_eq!(page["data"].as_array().unwrap().len(), 1);
    let cursor = page["next_cursor"].as_str().unwrap();
    let (_, rest) = api.get(&p.key, &format!("/v1/subscriptions?limit=1&cursor={cursor}")).await;
    assert_eq!(rest["data"][0]["id"], full["id"]);
    assert_error(&api.get(&p.key, "/v1/subscriptions?endpoint_id=sub_x").await, 400, "invalid_query", Some("endpoint_id"));

    // PATCH a subset; null retry_delays returns to the default ladder.
    let (status, changed) = patch(&api, &p.key, &format!("/v1/subscriptions/{}", full["id"].as_str().unwrap()), json!({"event_type": "order.**", "max_attempts": 3, "retry_delays": null, "enabled": true})).await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["event_type"], "order.**");
    assert_eq!(changed["max_attempts"], 3);
    assert_eq!(changed["retry_delays"], Value::Null);
    assert_eq!(changed["enabled"], true);
    assert_eq!(changed["ordering"], true);
    assert_eq!(changed["timeout_seconds"], 60);
    assert_eq!(changed["endpoint_id"], other.as_str());
    assert!(time(&changed["updated_at"]) > time(&full["updated_at"]));
    let (status, changed) = patch(&api, &p.key, &format!("/v1/subscriptions/{id}"), json!({"retry_delays": [5, 10], "ordering": true, "timeout_seconds": 1})).await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["retry_delays"], json!([5, 10]));
    assert_eq!(changed["ordering"], true);
    assert_eq!(changed["timeout_seconds"], 1);
    assert_eq!(changed["event_type"], "order.*");

    let (status, _) = delete(&api, &p.key, &format!("/v1/subscriptions/{id}")).await;
    assert_eq!(status, 204);
    assert_error(&api.get(&p.key, &format!("/v1/subscriptions/{id}")).await, 404, "not_found", None);
    assert_error(&delete(&api, &p.key, &format!("/v1/subscriptions/{id}")).await, 404, "not_found", None);
    assert_error(&patch(&api, &p.key, &format!("/v1/subscriptions/{id}"), json!({"enabled": false})).await, 404, "not_found", None);
    let kept = format!("SELECT count(*) FROM deliveries WHERE subscription_id = '{}'", uuid_of(id));
    assert_eq!(api.count(&kept).await, 1, "its Delivery stays, naming the Subscription that made it");
}

#[tokio::test]
async fn subscription_input_is_validated() {
    let api = Api::start().await;
    let p = api.project().await;
    let ep = endpoint(&api, &p, "http://127.0.0.1:9/").await;
    let missing = railhook_core::EndpointId::new().to_string();
    let twenty_one: Vec<i64> = vec![60; 21];
    let cases: Vec<(Value, &str)> = vec![
        (json!({"endpoint_id": ep, "event_type": "order.*.paid"}), "event_type"),
        (json!({"endpoint_id": ep, "event_type": "Order.Paid"}), "event_type"),
        (json!({"endpoint_id": ep, "event_type": ""}), "event_type"),
        (json!({"endpoint_id": ep}), "event_type"),
        (json!({"endpoint_id": ep, "event_type": 5}), "event_type"),
        (json!({"endpoint_id": ep, "event_type": "a", "max_attempts": 0}), "max_attempts"),
        (json!({"endpoint_id": ep, "event_type": "a", "max_attempts": 21}), "max_attempts"),
        (json!({"endpoint_id": ep, "event_type": "a", "max_attempts": 1.5}), "max_attempts"),
        (json!({"endpoint_id": ep, "event_type": "a", "timeout_seconds": 61}), "timeout_seconds"),
        (json!({"endpoint_id": ep, "event_type": "a", "timeout_seconds": 0}), "timeout_seconds"),
        (json!({"endpoint_id": ep, "event_type": "a", "retry_delays": []}), "retry_delays"),
        (json!({"endpoint_id": ep, "event_type": "a", "retry_delays": twenty_one}), "retry_delays"),
        (json!({"endpoint_id": ep, "event_type": "a", "retry_delays": [60, 0]}), "retry_delays[1]"),
        (json!({"endpoint_id": ep, "event_type": "a", "retry_delays": [604801]}), "retry_delays[0]"),
        (json!({"endpoint_id": ep, "event_type": "a", "retry_delays": ["60"]}), "retry_delays[0]"),
        (json!({"endpoint_id": ep, "event_type": "a", "ordering": "yes"}), "ordering"),
        (json!({"endpoint_id": ep, "event_type": "a", "pattern": "a"}), "pattern"),
        (json!({"endpoint_id": "ep_x", "event_type": "a"}), "endpoint_id"),
        (json!({"event_type": "a"}), "endpoint_id"),
    ];
    let mut failures = Vec::new();
    for (body, field) in &cases {
        let (status, got) = api.post(&p.key, "/v1/subscriptions", body.clone()).await;
        if status != 422 || got["error"]["code"] != "invalid_field" || got["error"]["field"] != *field {
            failures.push(format!("{body}: expected 422 field {field}, got {status} {got}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // A well-formed id of no Endpoint of this project: 404 naming the field.
    assert_error(&api.post(&p.key, "/v1/subscriptions", json!({"endpoint_id": missing, "event_type": "a"})).await, 404, "not_found", Some("endpoint_id"));
    assert_eq!(api.count("SELECT count(*) FROM subscriptions").await, 0);

    let (status, sub) = api.post(&p.key, "/v1/subscriptions", json!({"endpoint_id": ep, "event_type": "a", "max_attempts": 1, "timeout_seconds": 1, "retry_delays": [1]})).await;
    assert_eq!(status, 201, "{sub}");
    let path = format!("/v1/subscriptions/{}", sub["id"].as_str().unwrap());
    assert_error(&patch(&api, &p.key, &path, json!({"endpoint_id": ep})).await, 422, "invalid_field", Some("endpoint_id"));
    assert_error(&patch(&api, &p.key, &path, json!({"colour": "red"})).await, 422, "invalid_field", Some("colour"));
    assert_error(&patch(&api, &p.key, &path, json!({"event_type": "order.*.paid"})).await, 422, "invalid_field", Some("event_type"));
    assert_error(&patch(&api, &p.key, &path, json!({"event_type": null})).await, 422, "invalid_field", Some("event_type"));
    assert_error(&patch(&api, &p.key, &path, json!({"max_attempts": 21})).await, 422, "invalid_field", Some("max_attempts"));
    assert_error(&patch(&api, &p.key, &path, json!({"timeout_seconds": 61})).await, 422, "invalid_field", Some("timeout_seconds"));
    assert_error(&patch(&api, &p.key, &path, json!({"retry_delays": [0]})).await, 422, "invalid_field", Some("retry_delays[0]"));
    assert_error(&api.get(&p.key, "/v1/subscriptions/sub_x").await, 400, "invalid_id", Some("id"));
    assert_error(&api.get(&p.key, &format!("/v1/subscriptions/{ep}")).await, 400, "invalid_id", Some("id"));
    let (_, unchanged) = api.get(&p.key, &path).await;
    assert_eq!(unchanged, sub, "refused changes wrote nothing");
}

#[tokio::test]
async fn another_projects_key_sees_nothing() {
    let api = Api::start().await;
    let a = api.project().await;
    let b = api.project().await;
    let ep = endpoint(&api, &a, "http://127.0.0.1:9/").await;
    let (status, sub) = api.post(&a.key, "/v1/subscriptions", json!({"endpoint_id": ep, "event_type": "order.paid"})).await;
    assert_eq!(status, 201);
    let sub = sub["id"].as_str().unwrap().to_string();
    let (_, secret_before) = api.get(&a.key, &format!("/v1/endpoints/{ep}/secret")).await;
    let (_, ep_before) = api.get(&a.key, &format!("/v1/endpoints/{ep}")).await;
    let (_, sub_before) = api.get(&a.key, &format!("/v1/subscriptions/{sub}")).await;

    let k = &b.key;
    assert_error(&api.get(k, &format!("/v1/endpoints/{ep}")).await, 404, "not_found", None);
    assert_error(&patch(&api, k, &format!("/v1/endpoints/{ep}"), json!({"enabled": false})).await, 404, "not_found", None);
    assert_error(&delete(&api, k, &format!("/v1/endpoints/{ep}")).await, 404, "not_found", None);
    assert_error(&api.post(k, &format!("/v1/endpoints/{ep}/rotate-secret"), json!({})).await, 404, "not_found", None);
    assert_error(&api.get(k, &format!("/v1/endpoints/{ep}/secret")).await, 404, "not_found", None);
    assert_error(&api.get(k, &format!("/v1/subscriptions/{sub}")).await, 404, "not_found", None);
    assert_error(&patch(&api, k, &format!("/v1/subscriptions/{sub}"), json!({"enabled": false})).await, 404, "not_found", None);
    assert_error(&delete(&api, k, &format!("/v1/subscriptions/{sub}")).await, 404, "not_found", None);
    assert_error(&api.post(k, "/v1/subscriptions", json!({"endpoint_id": ep, "event_type": "**"})).await, 404, "not_found", Some("endpoint_id"));
    let (_, endpoints) = api.get(k, "/v1/endpoints").await;
    assert_eq!(endpoints["data"], json!([]));
    let (_, subs) = api.get(k, &format!("/v1/subscriptions?endpoint_id={ep}")).await;
    assert_eq!(subs["data"], json!([]));

    // Nothing of project A changed.
    assert_eq!(api.get(&a.key, &format!("/v1/endpoints/{ep}/secret")).await.1, secret_before);
    assert_eq!(api.get(&a.key, &format!("/v1/endpoints/{ep}")).await.1, ep_before);
    assert_eq!(api.get(&a.key, &format!("/v1/subscriptions/{sub}")).await.1, sub_before);
    assert_eq!(api.count("SELECT count(*) FROM subscriptions").await, 1);
    assert_eq!(api.count("SELECT count(*) FROM endpoint_secrets").await, 1);
}
