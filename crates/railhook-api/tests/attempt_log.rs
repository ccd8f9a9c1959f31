//! The attempt log over real HTTP and Postgres (issue 17): `GET /v1/deliveries/{id}/attempts`
//! and an Incoming Event's `forwards[].attempts` show each Attempt's request headers, the
//! response's status, headers and body (a large body comes back whole from Postgres'
//! compressed storage), duration and error class; the OpenAPI document describes them.
//! Attempts are written in SQL as the worker's finalise writes them, since no worker runs here
//! (`railhook-worker/tests/attempt_log.rs` covers the worker's side).

mod common;

use common::{hmac_sha256_hex, uuid_of, Api};
use serde_json::{json, Value};

fn big_body() -> String {
    (0..800).map(|i| format!("{{\"line\":{i},\"error\":\"upstream timed out\"}}\n")).collect()
}

async fn insert_attempt(api: &Api, parent: &str, parent_id: uuid::Uuid, n: i32, code: i32, body: &str) {
    let client = api.db.client().await;
    let sql = format!(
        "INSERT INTO attempts (id, project_id, {parent}, attempt_number, started_at, duration_ms, status_code, result, error_message,
                               request_headers, response_headers, response_body, response_truncated)
         SELECT $1, project_id, id, $2, now(), 41, $3, CASE WHEN $3 = 200 THEN 'success' ELSE 'http_status' END, NULL,
                '{{\"webhook-id\": \"x\", \"webhook-signature\": \"v1,c2lnbmF0dXJl\", \"authorization\": \"<redacted>\"}}',
                '{{\"content-type\": \"application/json\", \"x-request-id\": \"r-1\"}}', $4, false
         FROM {table} WHERE id = $5",
        table = if parent == "delivery_id" { "deliveries" } else { "forwards" },
    );
    let n_rows = client.execute(&sql, &[&uuid::Uuid::now_v7(), &n, &code, &body, &parent_id]).await.unwrap();
    assert_eq!(n_rows, 1);
}

#[tokio::test]
async fn a_deliverys_attempts_show_request_headers_and_the_whole_response() {
    let api = Api::start().await;
    let p = api.project().await;
    let (s, ep) = api.post(&p.key, "/v1/endpoints", json!({"url": "http://127.0.0.1:9/hook"})).await;
    assert_eq!(s, 201, "{ep}");
    let (s, sub) = api.post(&p.key, "/v1/subscriptions", json!({"endpoint_id": ep["id"], "event_type": "**"})).await;
    assert_eq!(s, 201, "{sub}");
    let (s, ev) = api.post(&p.key, "/v1/events", json!({"type": "order.paid", "payload": {"n": 1}})).await;
    assert_eq!(s, 201, "{ev}");
    let delivery = ev["deliveries"][0]["id"].as_str().unwrap().to_string();
    let body = big_body();
    insert_attempt(&api, "delivery_id", uuid_of(&delivery), 1, 503, &body).await;
    insert_attempt(&api, "delivery_id", uuid_of(&delivery), 2, 200, r#"{"received":true}"#).await;

    let (s, list) = api.get(&p.key, &format!("/v1/deliveries/{delivery}/attempts")).await;
    assert_eq!(s, 200, "{list}");
    let data = list["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    let a = &data[0];
    assert_eq!((a["attempt_number"].as_i64(), a["status_code"].as_i64(), a["result"].as_str()), (Some(1), Some(503), Some("http_status")));
    assert_eq!(a["duration_ms"], 41);
    assert_eq!(a["request_headers"]["webhook-signature"], "v1,c2lnbmF0dXJl");
    assert_eq!(a["request_headers"]["authorization"], "<redacted>");
    assert_eq!(a["response_headers"]["x-request-id"], "r-1");
    assert_eq!(a["response_body"].as_str(), Some(body.as_str()), "the whole body back from compressed storage");
    assert_eq!(data[1]["response_body"], r#"{"received":true}"#);

    // Stored compressed: the row is far smaller than the body.
    let client = api.db.client().await;
    let (stored, method): (i32, Option<String>) = {
        let r = client
            .query_one("SELECT pg_column_size(response_body), pg_column_compression(response_body) FROM attempts WHERE attempt_number = 1", &[])
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(method.as_deref(), Some("lz4"));
    assert!((stored as usize) * 4 < body.len(), "{stored} bytes stored for {}", body.len());
}

#[tokio::test]
async fn a_forwards_attempts_show_request_and_response_headers() {
    let api = Api::start().await;
    let p = api.project().await;
    let (s, src) = api.post(&p.key, "/v1/sources", json!({"provider": "stripe", "secret": "whsec_test"})).await;
    assert_eq!(s, 201, "{src}");
    let (s, d) = api.post(&p.key, &format!("/v1/sources/{}/destinations", src["id"].as_str().unwrap()), json!({"url": "http://127.0.0.1:9/d"})).await;
    assert_eq!(s, 201, "{d}");
    let body = r#"{"id": "evt_1", "type": "charge.succeeded"}"#;
    let t = chrono::Utc::now().timestamp();
    let sig = hmac_sha256_hex(b"whsec_test", &[t.to_string().as_bytes(), b".", body.as_bytes()]);
    let resp = api
        .http
        .post(api.url(src["ingress_path"].as_str().unwrap()))
        .header("Stripe-Signature", format!("t={t},v1={sig}"))
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let ine = resp.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    let (_, event) = api.get(&p.key, &format!("/v1/incoming-events/{ine}")).await;
    let forward = event["forwards"][0]["id"].as_str().unwrap().to_string();
    let forward_uuid = forward.parse::<railhook_core::ForwardId>().unwrap().0;
    insert_attempt(&api, "forward_id", forward_uuid, 1, 500, "<html>oops</html>").await;

    let (s, event) = api.get(&p.key, &format!("/v1/incoming-events/{ine}")).await;
    assert_eq!(s, 200, "{event}");
    let a = &event["forwards"][0]["attempts"][0];
    assert_eq!(a["status_code"], 500);
    assert_eq!(a["request_headers"]["authorization"], "<redacted>");
    assert_eq!(a["response_headers"]["content-type"], "application/json");
    assert_eq!(a["response_body"], "<html>oops</html>");
}

#[tokio::test]
async fn the_openapi_document_describes_the_attempt_log() {
    let api = Api::start().await;
    let doc: Value = api.http.get(api.url("/openapi.json")).send().await.unwrap().json().await.unwrap();
    for schema in ["Attempt", "ForwardAttempt"] {
        let props = &doc["components"]["schemas"][schema]["properties"];
        for field in ["request_headers", "response_headers", "response_body", "response_truncated", "status_code", "duration_ms", "result"] {
            assert!(props.get(field).is_some(), "{schema}.{field} missing: {props}");
        }
    }
}
