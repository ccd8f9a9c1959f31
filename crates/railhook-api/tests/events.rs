//! Ingest against the real Postgres over real HTTP: the transactional outbox, matching,
//! idempotency, ordering numbers, and key revocation.

mod common;

use common::{endpoint_with, uuid_of, Api};
use serde_json::json;

#[tokio::test]
async fn ingest_writes_event_deliveries_and_outbox_in_one_transaction() {
    let api = Api::start().await;
    let p = api.project().await;
    let ep = endpoint_with(&api, &p.id, &[("order.paid", false), ("order.*", false), ("order.**", false), ("**", false), ("invoice.*", false), ("order.paid.*", false)]).await;

    let (status, body) = api.post(&p.key, "/v1/events", json!({"type": "order.paid", "payload": {"amount": 42}})).await;
    assert_eq!(status, 201, "{body}");
    assert!(body["id"].as_str().unwrap().starts_with("evt_"));
    assert_eq!(body["type"], "order.paid");
    let deliveries = body["deliveries"].as_array().unwrap();
    assert_eq!(deliveries.len(), 4, "order.paid, order.*, order.** and ** match: {body}");
    for d in deliveries {
        assert_eq!(d["status"], "PENDING");
        assert_eq!(uuid_of(d["endpoint_id"].as_str().unwrap()), ep);
    }
    assert_eq!(api.count("SELECT count(*) FROM outbox WHERE reason = 'created'").await, 4);
    assert_eq!(api.count("SELECT count(*) FROM outbox o JOIN deliveries d ON d.id = o.delivery_id AND d.endpoint_id = o.routing_id").await, 4);

    let (_, deeper) = api.post(&p.key, "/v1/events", json!({"type": "order.paid.v2", "payload": {}})).await;
    assert_eq!(deeper["deliveries"].as_array().unwrap().len(), 3, "order.**, ** and order.paid.*: {deeper}");
    let (_, other) = api.post(&p.key, "/v1/events", json!({"type": "customer.created", "payload": {}})).await;
    assert_eq!(other["deliveries"].as_array().unwrap().len(), 1, "only **: {other}");

    // Reading back.
    let id = body["id"].as_str().unwrap();
    let (status, got) = api.get(&p.key, &format!("/v1/events/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(got["payload"]["amount"], 42);
    assert_eq!(got["deliveries"].as_array().unwrap().len(), 4);
    let (_, listed) = api.get(&p.key, "/v1/events?type=order.paid").await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 1);
    let (_, page1) = api.get(&p.key, "/v1/events?limit=2").await;
    assert_eq!(page1["data"].as_array().unwrap().len(), 2);
    let cursor = page1["next_cursor"].as_str().unwrap();
    let (_, page2) = api.get(&p.key, &format!("/v1/events?limit=2&cursor={cursor}")).await;
    assert_eq!(page2["data"].as_array().unwrap().len(), 1);
    assert!(page2["next_cursor"].is_null());
}

#[tokio::test]
async fn disabled_endpoints_and_subscriptions_get_no_deliveries() {
    let api = Api::start().await;
    let p = api.project().await;
    let ep = endpoint_with(&api, &p.id, &[("order.paid", false)]).await;
    let client = api.db.client().await;
    client.execute("UPDATE endpoints SET enabled = false WHERE id = $1", &[&ep]).await.unwrap();
    let (status, body) = api.post(&p.key, "/v1/events", json!({"type": "order.paid", "payload": {}})).await;
    assert_eq!(status, 201);
    assert_eq!(body["deliveries"].as_array().unwrap().len(), 0);
    assert_eq!(api.count("SELECT count(*) FROM outbox").await, 0);
}

#[tokio::test]
async fn a_failure_after_the_deliveries_are_written_leaves_nothing() {
    let api = Api::start().await;
    let p = api.project().await;
    endpoint_with(&api, &p.id, &[("order.paid", true), ("**", false)]).await;
    // Inject the failure in the last write of the ingest: the outbox insert.
    let client = api.db.client().await;
    client
        .batch_execute(
            "CREATE FUNCTION fail_outbox() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'injected'; END $$;
             CREATE TRIGGER fail_outbox BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION fail_outbox();",
        )
        .await
        .unwrap();
    let (status, body) = api.post(&p.key, "/v1/events", json!({"type": "order.paid", "payload": {"n": 1}})).await;
    assert_eq!(status, 500, "{body}");
    assert_eq!(body["error"]["code"], "internal");
    assert!(!body.to_string().contains("injected"), "database messages must not leak: {body}");
    assert_eq!(api.count("SELECT count(*) FROM events").await, 0);
    assert_eq!(api.count("SELECT count(*) FROM deliveries").await, 0);
    assert_eq!(api.count("SELECT count(*) FROM outbox").await, 0);
    assert_eq!(api.count("SELECT max(last_sequence) FROM endpoints").await, 0, "no sequence number burned");

    client.batch_execute("DROP TRIGGER fail_outbox ON outbox").await.unwrap();
    let (status, body) = api.post(&p.key, "/v1/events", json!({"type": "order.paid", "payload": {"n": 1}})).await;
    assert_eq!(status, 201);
    assert!(body["deliveries"].as_array().unwrap().iter().all(|d| d["sequence_number"].is_null()), "numbered at the first claim: {body}");
    let pool = railhook_store::connect_pool(&api.config.database).await.unwrap();
    let ordered: Vec<i64> = railhook_testkit::relay::claim_announced(&pool)
        .await
        .iter()
        .filter_map(|r| match r {
            railhook_store::lifecycle::ClaimResult::Claimed(c) => c.sequence_number,
            _ => None,
        })
        .collect();
    assert_eq!(ordered, vec![1], "the ordered subscription's first number is 1");
}

#[tokio::test]
async fn ordered_subscriptions_get_consecutive_sequence_numbers() {
    let api = Api::start().await;
    let p = api.project().await;
    endpoint_with(&api, &p.id, &[("order.*", true)]).await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let http = api.http.clone();
        let url = api.url("/v1/events");
        let key = p.key.clone();
        tasks.push(tokio::spawn(async move {
            http.post(url).bearer_auth(key).json(&json!({"type": "order.paid", "payload": {"i": i}})).send().await.unwrap().status().as_u16()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 201);
    }
    assert_eq!(api.count("SELECT count(*) FROM deliveries WHERE ordered AND sequence_number IS NULL").await, 20, "numbered at the first claim");
    // Claimed in the announcements' order (the commits' order), numbered in that order.
    let pool = railhook_store::connect_pool(&api.config.database).await.unwrap();
    railhook_testkit::relay::claim_announced(&pool).await;
    let client = api.db.client().await;
    let rows = client.query("SELECT d.sequence_number FROM outbox o JOIN deliveries d ON d.id = o.delivery_id ORDER BY o.id", &[]).await.unwrap();
    let seqs: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(seqs, (1..=20).collect::<Vec<i64>>());
}

#[tokio::test]
async fn idempotency_key_replays_and_conflicts() {
    let api = Api::start().await;
    let p = api.project().await;
    endpoint_with(&api, &p.id, &[("**", false)]).await;
    let send = |body: serde_json::Value, key: &'static str| {
        api.http.post(api.url("/v1/events")).bearer_auth(&p.key).header("Idempotency-Key", key).json(&body).send()
    };
    let first = send(json!({"type": "order.paid", "payload": {"a": 1, "b": 2}}), "k-1").await.unwrap();
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first: serde_json::Value = first.json().await.unwrap();

    // Same request, keys in another order: a replay.
    let again = send(json!({"payload": {"b": 2, "a": 1}, "type": "order.paid"}), "k-1").await.unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again: serde_json::Value = again.json().await.unwrap();
    assert_eq!(again["id"], first["id"]);
    assert_eq!(again["deliveries"], first["deliveries"]);

    let conflict = send(json!({"type": "order.paid", "payload": {"a": 2}}), "k-1").await.unwrap();
    assert_eq!(conflict.status(), 409);
    let conflict: serde_json::Value = conflict.json().await.unwrap();
    assert_eq!(conflict["error"]["code"], "idempotency_key_reused");
    let conflict = send(json!({"type": "order.refunded", "payload": {"a": 1, "b": 2}}), "k-1").await.unwrap();
    assert_eq!(conflict.status(), 409);

    assert_eq!(api.count("SELECT count(*) FROM events").await, 1);
    assert_eq!(api.count("SELECT count(*) FROM outbox").await, 1);

    // The key is per project: another project may use it.
    let other = api.project().await;
    let resp = api.http.post(api.url("/v1/events")).bearer_auth(&other.key).header("Idempotency-Key", "k-1")
        .json(&json!({"type": "order.paid", "payload": {"a": 1, "b": 2}})).send().await.unwrap();
    assert_eq!(resp.status(), 201);
}

#[tokio::test]
async fn concurrent_posts_with_one_key_create_exactly_one_event() {
    let api = Api::start().await;
    let p = api.project().await;
    endpoint_with(&api, &p.id, &[("**", false), ("order.*", false)]).await;
    const N: usize = 24;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(N));
    let mut tasks = Vec::new();
    for _ in 0..N {
        let (http, url, key, barrier) = (api.http.clone(), api.url("/v1/events"), p.key.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let resp = http.post(url).bearer_auth(key).header("Idempotency-Key", "race")
                .json(&json!({"type": "order.paid", "payload": {"x": 1}})).send().await.unwrap();
            let status = resp.status().as_u16();
            let body: serde_json::Value = resp.json().await.unwrap();
            (status, body["id"].as_str().unwrap().to_string())
        }));
    }
    let mut ids = std::collections::HashSet::new();
    let mut created = 0;
    for t in tasks {
        let (status, id) = t.await.unwrap();
        assert!(status == 201 || status == 200, "{status}");
        created += (status == 201) as usize;
        ids.insert(id);
    }
    assert_eq!(created, 1, "exactly one POST created the event");
    assert_eq!(ids.len(), 1, "every POST returned the same event id");
    assert_eq!(api.count("SELECT count(*) FROM events").await, 1);
    assert_eq!(api.count("SELECT count(*) FROM deliveries").await, 2);
    assert_eq!(api.count("SELECT count(*) FROM outbox").await, 2);
}

#[tokio::test]
async fn revoked_keys_stop_working_at_once() {
    let api = Api::start().await;
    let p = api.project().await;
    let (status, created) = api.post(&p.key, "/v1/api-keys", json!({"name": "ci"})).await;
    assert_eq!(status, 201);
    let second = created["secret"].as_str().unwrap().to_string();
    let key_id = created["id"].as_str().unwrap().to_string();
    assert!(second.starts_with("rhk_"));

    // Both header forms work.
    let resp = api.http.get(api.url("/v1/api-keys")).header("X-API-Key", &second).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let listed: serde_json::Value = resp.json().await.unwrap();
    let keys = listed["data"].as_array().unwrap();
    assert_eq!(keys.len(), 2);
    assert!(!listed.to_string().contains(&second), "secrets are never listed");
    assert!(!listed.to_string().contains(&p.key));
    // Only a hash is stored.
    assert_eq!(api.count(&format!("SELECT count(*) FROM api_keys WHERE display_prefix = '{second}' OR encode(secret_sha256, 'escape') LIKE '%{second}%'")).await, 0);

    let resp = api.http.delete(api.url(&format!("/v1/api-keys/{key_id}"))).bearer_auth(&p.key).send().await.unwrap();
    assert_eq!(resp.status(), 204);
    let (status, body) = api.get(&second, "/v1/api-keys").await;
    assert_eq!(status, 401);
    assert_eq!(body["error"]["code"], "unauthorized");
    let (status, _) = api.post(&second, "/v1/events", json!({"type": "a.b", "payload": {}})).await;
    assert_eq!(status, 401);
    // Revoking twice is a 404; the first key still works.
    let resp = api.http.delete(api.url(&format!("/v1/api-keys/{key_id}"))).bearer_auth(&p.key).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    assert_eq!(api.get(&p.key, "/v1/api-keys").await.0, 200);
}
