//! A table of malformed requests across the routes. Each gets its exact status and error
//! code (and field, where one is at fault), and none of them writes anything.

mod common;

use common::Api;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

struct Case {
    name: &'static str,
    method: &'static str,
    path: String,
    auth: Auth,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    headers: Vec<(&'static str, HeaderValue)>,
    status: u16,
    code: &'static str,
    field: Option<&'static str>,
}

#[derive(Clone)]
enum Auth {
    None,
    Key,
    XApiKey,
    Raw(&'static str),
    Admin,
}

fn case(name: &'static str, method: &'static str, path: impl Into<String>, auth: Auth, body: &str, status: u16, code: &'static str, field: Option<&'static str>) -> Case {
    Case {
        name,
        method,
        path: path.into(),
        auth,
        content_type: if body.is_empty() { None } else { Some("application/json") },
        body: body.as_bytes().to_vec(),
        headers: vec![],
        status,
        code,
        field,
    }
}

async fn written(api: &Api) -> i64 {
    api.count(
        "SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM deliveries) + (SELECT count(*) FROM outbox)
              + (SELECT count(*) FROM api_keys) + (SELECT count(*) FROM organizations) + (SELECT count(*) FROM projects)
              + (SELECT count(*) FROM api_keys WHERE revoked_at IS NOT NULL)",
    )
    .await
}

#[tokio::test]
async fn malformed_requests_get_precise_errors_and_write_nothing() {
    let api = Api::start().await;
    let p = api.project().await;
    let org_id: String = {
        let client = api.db.client().await;
        let id: uuid::Uuid = client.query_one("SELECT id FROM organizations", &[]).await.unwrap().get(0);
        railhook_core::OrganizationId(id).to_string()
    };
    let big = format!(r#"{{"type":"a.b","payload":{{"x":"{}"}}}}"#, "x".repeat(1024 * 1024 + 10));
    let deep = format!(r#"{{"type":"a.b","payload":{}{}}}"#, "[".repeat(5000), "]".repeat(5000));
    let long_type = format!(r#"{{"type":"{}","payload":{{}}}}"#, "a".repeat(201));
    let long_name = format!(r#"{{"name":"{}"}}"#, "n".repeat(201));
    let missing = railhook_core::EventId::new().to_string();
    let missing_key = railhook_core::ApiKeyId::new().to_string();
    let missing_org = railhook_core::OrganizationId::new().to_string();
    let ev = r#"{"type":"order.paid","payload":{}}"#;

    let mut cases = vec![
        case("no credentials", "POST", "/v1/events", Auth::None, ev, 401, "unauthorized", None),
        case("unknown key", "POST", "/v1/events", Auth::Raw("Bearer rhk_not-a-key"), ev, 401, "unauthorized", None),
        case("not a bearer", "POST", "/v1/events", Auth::Raw("Basic dXNlcjpwdw=="), ev, 401, "unauthorized", None),
        // The ingest looks its key up in its own statement; any other refusal waits for the
        // key's lookup, so an unknown key is still a 401 before the body's error.
        case("key without the prefix", "POST", "/v1/events", Auth::Raw("Bearer not-a-key"), ev, 401, "unauthorized", None),
        case("unknown key, invalid json", "POST", "/v1/events", Auth::Raw("Bearer rhk_not-a-key"), "{", 401, "unauthorized", None),
        case("unknown key, invalid type", "POST", "/v1/events", Auth::Raw("Bearer rhk_not-a-key"), &long_type, 401, "unauthorized", None),
        case("empty bearer", "GET", "/v1/events", Auth::Raw("Bearer "), "", 401, "unauthorized", None),
        case("invalid json", "POST", "/v1/events", Auth::Key, "{", 400, "invalid_json", Some("body")),
        case("trailing bytes", "POST", "/v1/events", Auth::Key, r#"{"type":"a.b","payload":{}} x"#, 400, "invalid_json", Some("body")),
        case("nesting too deep", "POST", "/v1/events", Auth::Key, &deep, 400, "invalid_json", Some("body")),
        case("array body", "POST", "/v1/events", Auth::Key, "[]", 422, "invalid_field", Some("body")),
        case("missing type", "POST", "/v1/events", Auth::Key, r#"{"payload":{}}"#, 422, "invalid_field", Some("type")),
        case("missing payload", "POST", "/v1/events", Auth::Key, r#"{"type":"a.b"}"#, 422, "invalid_field", Some("payload")),
        case("type is a number", "POST", "/v1/events", Auth::Key, r#"{"type":7,"payload":{}}"#, 422, "invalid_field", Some("type")),
        case("payload is a string", "POST", "/v1/events", Auth::Key, r#"{"type":"a.b","payload":"x"}"#, 422, "invalid_field", Some("payload")),
        case("payload is null", "POST", "/v1/events", Auth::Key, r#"{"type":"a.b","payload":null}"#, 422, "invalid_field", Some("payload")),
        case("type upper case", "POST", "/v1/events", Auth::Key, r#"{"type":"Order.Paid","payload":{}}"#, 422, "invalid_field", Some("type")),
        case("type with wildcard", "POST", "/v1/events", Auth::Key, r#"{"type":"order.*","payload":{}}"#, 422, "invalid_field", Some("type")),
        case("type empty segment", "POST", "/v1/events", Auth::Key, r#"{"type":"order..paid","payload":{}}"#, 422, "invalid_field", Some("type")),
        case("type too long", "POST", "/v1/events", Auth::Key, &long_type, 422, "invalid_field", Some("type")),
        case("unknown field", "POST", "/v1/events", Auth::Key, r#"{"type":"a.b","payload":{},"extra":1}"#, 422, "invalid_field", Some("extra")),
        case("payload over the limit", "POST", "/v1/events", Auth::Key, &big, 413, "payload_too_large", Some("body")),
        case("event id malformed", "GET", "/v1/events/evt_nope", Auth::Key, "", 400, "invalid_id", Some("id")),
        case("event id of another kind", "GET", format!("/v1/events/{missing_key}"), Auth::Key, "", 400, "invalid_id", Some("id")),
        case("event id unknown", "GET", format!("/v1/events/{missing}"), Auth::Key, "", 404, "not_found", None),
        case("limit zero", "GET", "/v1/events?limit=0", Auth::Key, "", 400, "invalid_query", Some("limit")),
        case("limit not a number", "GET", "/v1/events?limit=ten", Auth::Key, "", 400, "invalid_query", Some("limit")),
        case("limit too big", "GET", "/v1/events?limit=100000", Auth::Key, "", 400, "invalid_query", Some("limit")),
        case("bad from", "GET", "/v1/events?from=yesterday", Auth::Key, "", 400, "invalid_query", Some("from")),
        case("bad cursor", "GET", "/v1/events?cursor=zzz", Auth::Key, "", 400, "invalid_query", Some("cursor")),
        case("bad type filter", "GET", "/v1/events?type=A.B", Auth::Key, "", 400, "invalid_query", Some("type")),
        case("unknown query parameter", "GET", "/v1/events?colour=red", Auth::Key, "", 400, "invalid_query", None),
        case("revoke malformed id", "DELETE", "/v1/api-keys/key_x", Auth::Key, "", 400, "invalid_id", Some("id")),
        case("revoke unknown key", "DELETE", format!("/v1/api-keys/{missing_key}"), Auth::Key, "", 404, "not_found", None),
        case("api key name too long", "POST", "/v1/api-keys", Auth::Key, &long_name, 422, "invalid_field", Some("name")),
        case("api key name a number", "POST", "/v1/api-keys", Auth::XApiKey, r#"{"name":5}"#, 422, "invalid_field", Some("name")),
        case("admin without token", "POST", "/v1/admin/organizations", Auth::None, r#"{"name":"x"}"#, 401, "unauthorized", None),
        case("admin with wrong token", "POST", "/v1/admin/organizations", Auth::Raw("Bearer wrong-token-wrong-token"), r#"{"name":"x"}"#, 401, "unauthorized", None),
        case("admin with a project key", "POST", "/v1/admin/organizations", Auth::Key, r#"{"name":"x"}"#, 401, "unauthorized", None),
        case("admin empty name", "POST", "/v1/admin/organizations", Auth::Admin, r#"{"name":"  "}"#, 422, "invalid_field", Some("name")),
        case("admin project in malformed org", "POST", "/v1/admin/organizations/org_x/projects", Auth::Admin, r#"{"name":"x"}"#, 400, "invalid_id", Some("org_id")),
        case("admin project in unknown org", "POST", format!("/v1/admin/organizations/{missing_org}/projects"), Auth::Admin, r#"{"name":"x"}"#, 404, "not_found", None),
        case("admin project without name", "POST", format!("/v1/admin/organizations/{org_id}/projects"), Auth::Admin, "{}", 422, "invalid_field", Some("name")),
        case("endpoint url not http", "POST", "/v1/endpoints", Auth::Key, r#"{"url":"ftp://example.com/x"}"#, 422, "invalid_url", Some("url")),
        case("endpoint url with credentials", "POST", "/v1/endpoints", Auth::Key, r#"{"url":"http://u:p@127.0.0.1/"}"#, 422, "invalid_url", Some("url")),
        case("endpoint url to metadata", "POST", "/v1/endpoints", Auth::Key, r#"{"url":"http://169.254.169.254/latest"}"#, 422, "url_not_allowed", Some("url")),
        case("endpoint url missing", "POST", "/v1/endpoints", Auth::Key, r#"{"description":"x"}"#, 422, "invalid_field", Some("url")),
        case("endpoint hop-by-hop header", "POST", "/v1/endpoints", Auth::Key, r#"{"url":"http://127.0.0.1:9/","headers":{"Connection":"close"}}"#, 422, "invalid_field", Some("headers.Connection")),
        case("endpoint bad secret", "POST", "/v1/endpoints", Auth::Key, r#"{"url":"http://127.0.0.1:9/","secret":"hunter2"}"#, 422, "invalid_field", Some("secret")),
        case("endpoint rate limit negative", "POST", "/v1/endpoints", Auth::Key, r#"{"url":"http://127.0.0.1:9/","rate_limit_per_second":-1}"#, 422, "invalid_field", Some("rate_limit_per_second")),
        case("endpoint id malformed", "GET", "/v1/endpoints/ep_", Auth::Key, "", 400, "invalid_id", Some("id")),
        case("endpoint patch unknown field", "PATCH", format!("/v1/endpoints/{}", railhook_core::EndpointId::new()), Auth::Key, r#"{"colour":"red"}"#, 422, "invalid_field", Some("colour")),
        case("subscription bad pattern", "POST", "/v1/subscriptions", Auth::Key, &format!(r#"{{"endpoint_id":"{}","event_type":"order.*.paid"}}"#, railhook_core::EndpointId::new()), 422, "invalid_field", Some("event_type")),
        case("subscription endpoint id malformed", "POST", "/v1/subscriptions", Auth::Key, r#"{"endpoint_id":"sub_x","event_type":"**"}"#, 422, "invalid_field", Some("endpoint_id")),
        case("subscription list bad filter", "GET", "/v1/subscriptions?endpoint_id=nope", Auth::Key, "", 400, "invalid_query", Some("endpoint_id")),
        case("subscription id unknown", "DELETE", format!("/v1/subscriptions/{}", railhook_core::SubscriptionId::new()), Auth::Key, "", 404, "not_found", None),
        case("wrong method", "PUT", "/v1/events", Auth::Key, ev, 405, "method_not_allowed", None),
        case("unknown route", "GET", "/v1/nothing-here", Auth::Key, "", 404, "route_not_found", None),
    ];

    let mut text_plain = case("text/plain body", "POST", "/v1/events", Auth::Key, ev, 415, "unsupported_media_type", Some("content-type"));
    text_plain.content_type = Some("text/plain");
    cases.push(text_plain);
    let mut no_type = case("no content type", "POST", "/v1/events", Auth::Key, ev, 415, "unsupported_media_type", Some("content-type"));
    no_type.content_type = None;
    cases.push(no_type);
    let mut bad_utf8 = case("invalid utf-8", "POST", "/v1/events", Auth::Key, "", 400, "invalid_json", Some("body"));
    bad_utf8.body = b"{\"type\":\"a.b\",\"payload\":{\"x\":\"\xff\xfe\"}}".to_vec();
    bad_utf8.content_type = Some("application/json");
    cases.push(bad_utf8);
    let mut long_key = case("idempotency key too long", "POST", "/v1/events", Auth::Key, ev, 400, "invalid_idempotency_key", Some("idempotency-key"));
    long_key.headers.push(("idempotency-key", HeaderValue::from_str(&"k".repeat(256)).unwrap()));
    cases.push(long_key);
    let mut latin_key = case("idempotency key not ascii", "POST", "/v1/events", Auth::Key, ev, 400, "invalid_idempotency_key", Some("idempotency-key"));
    latin_key.headers.push(("idempotency-key", HeaderValue::from_bytes(b"cl\xe9").unwrap()));
    cases.push(latin_key);
    let mut spaced_key = case("idempotency key with spaces", "POST", "/v1/events", Auth::Key, ev, 400, "invalid_idempotency_key", Some("idempotency-key"));
    spaced_key.headers.push(("idempotency-key", HeaderValue::from_static("a b")));
    cases.push(spaced_key);

    assert!(cases.len() >= 30, "{} cases", cases.len());
    let before = written(&api).await;
    let mut failures = Vec::new();
    for c in &cases {
        let mut headers = HeaderMap::new();
        match &c.auth {
            Auth::None => {}
            Auth::Key => {
                headers.insert("authorization", HeaderValue::from_str(&format!("Bearer {}", p.key)).unwrap());
            }
            Auth::XApiKey => {
                headers.insert("x-api-key", HeaderValue::from_str(&p.key).unwrap());
            }
            Auth::Raw(v) => {
                headers.insert("authorization", HeaderValue::from_static(v));
            }
            Auth::Admin => {
                headers.insert("authorization", HeaderValue::from_str(&format!("Bearer {}", api.config.api.admin_token)).unwrap());
            }
        }
        if let Some(ct) = c.content_type {
            headers.insert("content-type", HeaderValue::from_static(ct));
        }
        for (k, v) in &c.headers {
            headers.insert(HeaderName::from_static(k), v.clone());
        }
        let method = reqwest::Method::from_bytes(c.method.as_bytes()).unwrap();
        let resp = api.http.request(method, api.url(&c.path)).headers(headers).body(c.body.clone()).send().await.unwrap();
        let status = resp.status().as_u16();
        let body: serde_json::Value = resp.json().await.unwrap_or(serde_json::Value::Null);
        let code = body["error"]["code"].as_str().unwrap_or("");
        let field = body["error"]["field"].as_str();
        if status != c.status || code != c.code || (c.field.is_some() && field != c.field) {
            failures.push(format!("{}: expected {} {} {:?}, got {} {}", c.name, c.status, c.code, c.field, status, body));
        }
        assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{}: no message in {body}", c.name);
    }
    assert!(failures.is_empty(), "{} of {} cases wrong:\n{}", failures.len(), cases.len(), failures.join("\n"));
    assert_eq!(written(&api).await, before, "a malformed request wrote something");
}
