//! Forwards over real HTTP and Postgres: the failed Forwards (list, filters, bulk retry), the
//! retry of one, and the replay of an Incoming Event; the 4xx answers naming the field;
//! another project's Forwards and Incoming Events are 404. Requests arrive through
//! `POST /ingress/{token}`, signed in the test; a Forward fails as the worker would leave it
//! (status, attempts, completed_at), written in SQL since no worker runs here.

mod common;

use common::{hmac_sha256_hex, Api, TestProject};
use railhook_core::ForwardId;
use serde_json::{json, Value};

struct Setup {
    project: TestProject,
    source: String,
    destinations: Vec<String>,
    path: String,
}

/// A Stripe Source with two Destinations (and one disabled).
async fn setup(api: &Api) -> Setup {
    let project = api.project().await;
    let (status, src) = api.post(&project.key, "/v1/sources", json!({"provider": "stripe", "secret": "whsec_test"})).await;
    assert_eq!(status, 201, "{src}");
    let source = src["id"].as_str().unwrap().to_string();
    let mut destinations = Vec::new();
    for (n, enabled) in [(0, true), (1, true), (2, false)] {
        let body = json!({"url": format!("http://127.0.0.1:9/d{n}"), "enabled": enabled});
        let (status, d) = api.post(&project.key, &format!("/v1/sources/{source}/destinations"), body).await;
        assert_eq!(status, 201, "{d}");
        destinations.push(d["id"].as_str().unwrap().to_string());
    }
    Setup { project, source, destinations, path: src["ingress_path"].as_str().unwrap().to_string() }
}

/// One signed Stripe request through the ingress; its Incoming Event id.
async fn receive(api: &Api, s: &Setup, n: usize) -> String {
    let body = format!(r#"{{"id": "evt_{n}_{}", "type": "charge.succeeded"}}"#, uuid::Uuid::new_v4().simple());
    let t = chrono::Utc::now().timestamp();
    let sig = hmac_sha256_hex(b"whsec_test", &[t.to_string().as_bytes(), b".", body.as_bytes()]);
    let resp = api.http.post(api.url(&s.path)).header("Stripe-Signature", format!("t={t},v1={sig}")).header("Content-Type", "application/json").body(body).send().await.unwrap();
    assert_eq!(resp.status(), 202);
    resp.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string()
}

async fn forwards_of(api: &Api, key: &str, ine: &str) -> Vec<Value> {
    let (status, ev) = api.get(key, &format!("/v1/incoming-events/{ine}")).await;
    assert_eq!(status, 200);
    ev["forwards"].as_array().unwrap().clone()
}

/// Leaves the Forward as the worker leaves a failed one.
async fn fail(api: &Api, id: &str) {
    let uuid = id.parse::<ForwardId>().unwrap().0;
    let client = api.db.client().await;
    client
        .execute("UPDATE forwards SET status = 'FAILED', attempt_count = 5, completed_at = now(), last_error = 'HTTP 500' WHERE id = $1", &[&uuid])
        .await
        .unwrap();
}

async fn outbox(api: &Api, reason: &str) -> i64 {
    let client = api.db.client().await;
    client.query_one("SELECT count(*) FROM outbox WHERE forward_id IS NOT NULL AND reason = $1", &[&reason]).await.unwrap().get(0)
}

fn error(body: &Value) -> (&str, &str) {
    (body["error"]["code"].as_str().unwrap_or(""), body["error"]["field"].as_str().unwrap_or(""))
}

#[tokio::test]
async fn a_failed_forward_is_listed_and_retried_once_and_in_bulk() {
    let api = Api::start().await;
    let s = setup(&api).await;
    let key = &s.project.key;
    let ine = receive(&api, &s, 1).await;
    let mut forwards = forwards_of(&api, key, &ine).await;
    assert_eq!(forwards.len(), 2, "one per enabled Destination");
    // In the Destinations' order, whatever order their Forwards were made in.
    forwards.sort_by_key(|f| s.destinations.iter().position(|d| f["destination_id"] == d.as_str()));
    let id = forwards[0]["id"].as_str().unwrap().to_string();

    let (status, body) = api.post(key, &format!("/v1/forwards/{id}/retry"), json!({})).await;
    assert_eq!((status, error(&body)), (409, ("not_failed", "")), "{body}");
    fail(&api, &id).await;
    let (status, list) = api.get(key, "/v1/failed-forwards").await;
    assert_eq!(status, 200);
    assert_eq!(list["data"].as_array().unwrap().iter().map(|f| f["id"].as_str().unwrap()).collect::<Vec<_>>(), [id.as_str()]);
    assert_eq!(list["data"][0]["source_id"], s.source.as_str());
    assert_eq!(list["data"][0]["last_error"], "HTTP 500");
    let (_, other) = api.get(key, &format!("/v1/failed-forwards?destination_id={}", s.destinations[1])).await;
    assert_eq!(other["data"].as_array().unwrap().len(), 0);

    let (status, body) = api.post(key, &format!("/v1/forwards/{id}/retry"), json!({"extra_attempts": 3})).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!((body["status"].as_str(), body["max_attempts"].as_i64(), body["attempt_count"].as_i64()), (Some("PENDING"), Some(8), Some(5)));
    assert_eq!(outbox(&api, "manual_retry").await, 1, "announced in the same statement");
    let (status, body) = api.post(key, &format!("/v1/forwards/{id}/retry"), json!({})).await;
    assert_eq!((status, error(&body)), (409, ("not_failed", "")));

    // In bulk: by ids (with reasons for those skipped), then by filter.
    fail(&api, &id).await;
    let unknown = ForwardId::new().to_string();
    let other_forward = forwards[1]["id"].as_str().unwrap();
    let (status, body) = api.post(key, "/v1/failed-forwards/retry", json!({"ids": [id, other_forward, unknown]})).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["ids"], json!([id]));
    assert_eq!(body["skipped"], json!([{"id": other_forward, "reason": "not_failed", "status": "PENDING"}, {"id": unknown, "reason": "not_found"}]));
    fail(&api, &id).await;
    fail(&api, other_forward).await;
    let filter = json!({"filter": {"destination_id": s.destinations[1]}, "limit": 10});
    let (status, body) = api.post(key, "/v1/failed-forwards/retry", filter).await;
    assert_eq!((status, body["ids"].clone()), (202, json!([other_forward])), "{body}");
    let (status, body) = api.post(key, "/v1/failed-forwards/retry", json!({"filter": {}})).await;
    assert_eq!((status, body["retried"].as_i64()), (202, Some(1)), "{body}");
    assert_eq!(outbox(&api, "manual_retry").await, 4);
}

#[tokio::test]
async fn a_replay_makes_new_forwards_announced() {
    let api = Api::start().await;
    let s = setup(&api).await;
    let key = &s.project.key;
    let ine = receive(&api, &s, 1).await;
    let before: Vec<String> = forwards_of(&api, key, &ine).await.iter().map(|f| f["id"].as_str().unwrap().to_string()).collect();

    let resp = api.http.post(api.url(&format!("/v1/incoming-events/{ine}/replay"))).bearer_auth(key).send().await.unwrap();
    assert_eq!(resp.status(), 202, "no body: every enabled Destination");
    let body: Value = resp.json().await.unwrap();
    let replayed = body["forwards"].as_array().unwrap();
    assert_eq!(replayed.len(), 2);
    for f in replayed {
        assert!(!before.contains(&f["id"].as_str().unwrap().to_string()), "a new Forward");
        assert_eq!(f["status"], "PENDING");
        assert_eq!(f["incoming_event_id"], ine.as_str());
        assert_eq!(f["max_attempts"], 5);
    }
    let (status, body) = api.post(key, &format!("/v1/incoming-events/{ine}/replay"), json!({"destination_id": s.destinations[0]})).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["forwards"][0]["destination_id"], s.destinations[0].as_str());
    assert_eq!(forwards_of(&api, key, &ine).await.len(), 5, "a replay adds Forwards even to a Destination that has one");
    assert_eq!(outbox(&api, "replay").await, 3);

    let (status, body) = api.post(key, &format!("/v1/incoming-events/{ine}/replay"), json!({"destination_id": s.destinations[2]})).await;
    assert_eq!((status, error(&body)), (409, ("destination_disabled", "destination_id")), "{body}");
    let stranger = common::uuid_of(&s.destinations[0]);
    let other = railhook_core::DestinationId(uuid::Uuid::from_u128(stranger.as_u128() ^ 1)).to_string();
    let (status, body) = api.post(key, &format!("/v1/incoming-events/{ine}/replay"), json!({"destination_id": other})).await;
    assert_eq!((status, error(&body)), (404, ("not_found", "destination_id")), "{body}");
    let (status, body) = api.post(key, &format!("/v1/incoming-events/{ine}/replay"), json!({"destination_id": "ep_nope"})).await;
    assert_eq!((status, error(&body).1), (422, "destination_id"), "{body}");
    assert_eq!(outbox(&api, "replay").await, 3, "refused replays write nothing");
}

#[tokio::test]
async fn bad_input_is_a_4xx_naming_the_field_and_other_projects_are_404() {
    let api = Api::start().await;
    let s = setup(&api).await;
    let key = &s.project.key;
    let ine = receive(&api, &s, 1).await;
    let id = forwards_of(&api, key, &ine).await[0]["id"].as_str().unwrap().to_string();
    fail(&api, &id).await;

    let unknown = format!("/v1/forwards/{}/retry", ForwardId::new());
    let cases: Vec<(&str, Value, u16, &str, &str)> = vec![
        ("/v1/forwards/fwd_nope/retry", json!({}), 400, "invalid_id", "id"),
        ("/v1/forwards/dlv_00000000000000000000000000/retry", json!({}), 400, "invalid_id", "id"),
        (&unknown, json!({}), 404, "not_found", ""),
        ("/v1/failed-forwards/retry", json!({}), 400, "ids_or_filter", "ids"),
        ("/v1/failed-forwards/retry", json!({"ids": [id], "filter": {}}), 400, "ids_or_filter", "filter"),
        ("/v1/failed-forwards/retry", json!({"ids": []}), 422, "invalid_field", "ids"),
        ("/v1/failed-forwards/retry", json!({"ids": [id], "limit": 3}), 422, "invalid_field", "limit"),
        ("/v1/failed-forwards/retry", json!({"filter": {}, "limit": 0}), 422, "invalid_field", "limit"),
        ("/v1/failed-forwards/retry", json!({"filter": {"completed_after": "yesterday"}}), 422, "invalid_field", "filter.completed_after"),
        ("/v1/failed-forwards/retry", json!({"filter": {"source_id": "dst_x"}}), 422, "invalid_field", "filter.source_id"),
        ("/v1/failed-forwards/retry", json!({"filter": {}, "extra_attempts": 21}), 422, "invalid_field", "extra_attempts"),
        ("/v1/failed-forwards/retry", json!({"filter": {}, "bogus": 1}), 422, "invalid_field", ""),
        ("/v1/incoming-events/ine_nope/replay", json!({}), 400, "invalid_id", "id"),
    ];
    let retry = format!("/v1/forwards/{id}/retry");
    let more = [(retry.as_str(), json!({"extra_attempts": 0}), 422, "invalid_field", "extra_attempts")];
    for (path, body, want, code, field) in cases.iter().map(|(p, b, w, c, f)| (*p, b.clone(), *w, *c, *f)).chain(more) {
        let (status, got) = api.post(key, path, body.clone()).await;
        assert_eq!(status, want, "{path} {body}: {got}");
        assert_eq!(error(&got).0, code, "{path} {body}: {got}");
        if !field.is_empty() {
            assert_eq!(error(&got).1, field, "{path} {body}: {got}");
        }
    }
    for (query, field) in [("destination_id=src_x", "destination_id"), ("completed_after=nope", "completed_after"), ("limit=0", "limit"), ("what=1", "what")] {
        let (status, got) = api.get(key, &format!("/v1/failed-forwards?{query}")).await;
        assert_eq!(status, 400, "{query}: {got}");
        assert_eq!(error(&got).1, field, "{query}: {got}");
    }
    let range = "/v1/failed-forwards?completed_after=2026-02-01T00:00:00Z&completed_before=2026-01-01T00:00:00Z";
    assert_eq!(error(&api.get(key, range).await.1).1, "completed_before");

    // Another project sees none of it.
    let stranger = api.project().await;
    let (status, _) = api.post(&stranger.key, &retry, json!({})).await;
    assert_eq!(status, 404);
    let (status, _) = api.post(&stranger.key, &format!("/v1/incoming-events/{ine}/replay"), json!({})).await;
    assert_eq!(status, 404);
    let (_, list) = api.get(&stranger.key, "/v1/failed-forwards").await;
    assert_eq!(list["data"].as_array().unwrap().len(), 0);
    let (status, body) = api.post(&stranger.key, "/v1/failed-forwards/retry", json!({"ids": [id]})).await;
    assert_eq!((status, body["skipped"][0]["reason"].as_str()), (202, Some("not_found")));
    let (status, _) = api.post(key, &retry, json!({})).await;
    assert_eq!(status, 202, "still FAILED for its own project");
}
