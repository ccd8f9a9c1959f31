//! `POST /ingress/{token}` end to end over HTTP: requests signed in the test from each
//! provider's documented algorithm, what is stored (and what is not), dedupe including
//! concurrent resends, and the answers for unknown, disabled, rate-limited, oversized and
//! unavailable.

mod common;

use base64::Engine;
use common::{hmac_sha256_hex, Api, TestProject};
use railhook_testkit::{test_config, TestDb};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A Source of `provider` with `destinations` enabled Destinations; its ingress path.
async fn source(api: &Api, p: &TestProject, body: Value, destinations: usize) -> (String, String) {
    let (status, src) = api.post(&p.key, "/v1/sources", body).await;
    assert_eq!(status, 201, "{src}");
    let id = src["id"].as_str().unwrap().to_string();
    for n in 0..destinations {
        let (status, d) = api.post(&p.key, &format!("/v1/sources/{id}/destinations"), json!({"url": format!("http://127.0.0.1:9/d{n}")})).await;
        assert_eq!(status, 201, "{d}");
    }
    (id, src["ingress_path"].as_str().unwrap().to_string())
}

async fn send(api: &Api, path: &str, headers: &[(&str, String)], body: impl Into<reqwest::Body>) -> (u16, Value) {
    let mut request = api.http.post(api.url(path)).body(body);
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let resp = request.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn stored(api: &Api) -> (i64, i64, i64) {
    (
        api.count("SELECT count(*) FROM incoming_events").await,
        api.count("SELECT count(*) FROM forwards").await,
        api.count("SELECT count(*) FROM outbox WHERE forward_id IS NOT NULL").await,
    )
}

fn github_headers(secret: &str, body: &[u8], delivery: &str) -> Vec<(&'static str, String)> {
    vec![
        ("X-Hub-Signature-256", format!("sha256={}", hmac_sha256_hex(secret.as_bytes(), &[body]))),
        ("X-GitHub-Delivery", delivery.to_string()),
        ("X-GitHub-Event", "push".to_string()),
        ("Content-Type", "application/json".to_string()),
    ]
}

fn stripe_headers(secret: &str, body: &[u8], t: i64) -> Vec<(&'static str, String)> {
    let sig = hmac_sha256_hex(secret.as_bytes(), &[t.to_string().as_bytes(), b".", body]);
    vec![("Stripe-Signature", format!("t={t},v1={sig}")), ("Content-Type", "application/json".to_string())]
}

async fn metrics(api: &Api) -> String {
    api.http.get(api.url("/metrics")).send().await.unwrap().text().await.unwrap()
}

#[tokio::test]
async fn stripe_end_to_end_stores_the_request_with_a_forward_and_announcement_per_enabled_destination() {
    let api = Api::start().await;
    let p = api.project().await;
    let (id, path) = source(&api, &p, json!({"provider": "stripe", "secret": "whsec_test"}), 2).await;
    // A disabled Destination gets no Forward.
    let (_, off) = api.post(&p.key, &format!("/v1/sources/{id}/destinations"), json!({"url": "http://127.0.0.1:9/off", "enabled": false})).await;

    let body = br#"{"id": "evt_1NG8Du2eZvKYlo2CUI79vXWy", "object": "event", "type": "charge.succeeded"}"#;
    let (status, accepted) = send(&api, &path, &stripe_headers("whsec_test", body, now()), body.to_vec()).await;
    assert_eq!(status, 202, "{accepted}");
    assert_eq!(accepted["status"], "stored");
    let ine = accepted["id"].as_str().unwrap();
    assert_eq!(stored(&api).await, (1, 2, 2));
    let off_id = common::uuid_of(off["id"].as_str().unwrap());
    assert_eq!(api.count(&format!("SELECT count(*) FROM forwards WHERE destination_id = '{off_id}'")).await, 0);
    // Each outbox row announces its Forward, keyed by its Destination, as 'created'.
    assert_eq!(
        api.count("SELECT count(*) FROM outbox o JOIN forwards f ON f.id = o.forward_id WHERE o.routing_id = f.destination_id AND o.reason = 'created' AND o.delivery_id IS NULL").await,
        2
    );
    assert_eq!(api.count("SELECT count(*) FROM forwards WHERE status = 'PENDING' AND max_attempts = 5 AND retry_delays = '{60,300,900,3600}'").await, 2);

    let (status, event) = api.get(&p.key, &format!("/v1/incoming-events/{ine}")).await;
    assert_eq!(status, 200, "{event}");
    assert_eq!(event["provider_event_id"], "evt_1NG8Du2eZvKYlo2CUI79vXWy");
    assert_eq!(event["source_id"], id.as_str());
    assert_eq!((event["method"].as_str(), event["content_type"].as_str()), (Some("POST"), Some("application/json")));
    assert_eq!(event["body"].as_str().unwrap().as_bytes(), body, "the raw bytes, not re-serialised JSON");
    assert_eq!(event["body_sha256"], hex::encode(Sha256::digest(body)));
    assert_eq!(event["body_size"], body.len());
    let headers = event["headers"].as_array().unwrap();
    assert!(headers.iter().any(|h| h["name"] == "stripe-signature"), "{headers:?}");
    let forwards = event["forwards"].as_array().unwrap();
    assert_eq!(forwards.len(), 2);
    assert!(forwards.iter().all(|f| f["status"] == "PENDING" && f["attempts"] == json!([])), "{forwards:?}");

    let (_, list) = api.get(&p.key, &format!("/v1/incoming-events?source_id={id}&provider_event_id=evt_1NG8Du2eZvKYlo2CUI79vXWy")).await;
    assert_eq!(list["data"].as_array().unwrap().len(), 1);
    assert!(list["data"][0].get("body").is_none(), "lists carry no bodies");
    let (_, none) = api.get(&p.key, "/v1/incoming-events?received_after=2999-01-01T00:00:00Z").await;
    assert_eq!(none["data"], json!([]));
    assert_eq!(api.get(&p.key, "/v1/incoming-events?received_after=yesterday").await.0, 400);

    // Stripe-specific refusals store nothing and are counted.
    let old = now() - 3600;
    let (status, err) = send(&api, &path, &stripe_headers("whsec_test", body, old), body.to_vec()).await;
    assert_eq!((status, err["error"]["code"].as_str()), (401, Some("timestamp_out_of_tolerance")));
    let (status, err) = send(&api, &path, &stripe_headers("whsec_other", body, now()), body.to_vec()).await;
    assert_eq!((status, err["error"]["code"].as_str()), (401, Some("bad_signature")));
    assert_eq!(stored(&api).await, (1, 2, 2));
    let text = metrics(&api).await;
    assert!(text.contains(r#"railhook_ingress_refused_total{provider="stripe",reason="bad_signature"} 1"#), "{text}");
    assert!(text.contains(r#"railhook_ingress_refused_total{provider="stripe",reason="timestamp_out_of_tolerance"} 1"#), "{text}");
}

#[tokio::test]
async fn github_tampered_missing_and_wrong_secret_are_refused_and_store_nothing() {
    let api = Api::start().await;
    let p = api.project().await;
    let (_, path) = source(&api, &p, json!({"provider": "github", "secret": "It's a Secret to Everybody"}), 1).await;
    let body = br#"{"ref": "refs/heads/main"}"#;
    let signed = github_headers("It's a Secret to Everybody", body, "72d3162e-cc78-11e3-81ab-4c9367dc0958");

    let tampered = br#"{"ref": "refs/heads/evil"}"#;
    let (status, err) = send(&api, &path, &signed, tampered.to_vec()).await;
    assert_eq!(status, 401);
    assert_eq!(err["error"]["code"], "bad_signature", "only the reason code: {err}");
    assert!(err["error"].get("field").is_none());
    let (status, err) = send(&api, &path, &github_headers("wrong secret", body, "x"), body.to_vec()).await;
    assert_eq!((status, err["error"]["code"].as_str()), (401, Some("bad_signature")));
    let (status, err) = send(&api, &path, &[("X-GitHub-Delivery", "x".to_string())], body.to_vec()).await;
    assert_eq!((status, err["error"]["code"].as_str()), (401, Some("missing_header")));
    assert_eq!(stored(&api).await, (0, 0, 0), "a refused request stores nothing");
    assert!(metrics(&api).await.contains(r#"railhook_ingress_refused_total{provider="github",reason="bad_signature"} 2"#));

    let (status, accepted) = send(&api, &path, &signed, body.to_vec()).await;
    assert_eq!(status, 202, "{accepted}");
    let (status, again) = send(&api, &path, &signed, body.to_vec()).await;
    assert_eq!((status, &again["id"], again["status"].as_str()), (200, &accepted["id"], Some("duplicate")), "a resend is 200 with the same Incoming Event");
    assert_eq!(stored(&api).await, (1, 1, 1), "a resend writes nothing");
    let (status, _) = send(&api, &path, &github_headers("It's a Secret to Everybody", body, "another-delivery"), body.to_vec()).await;
    assert_eq!(status, 202, "another delivery id is another event");
    assert_eq!(stored(&api).await, (2, 2, 2));
}

#[tokio::test]
async fn concurrent_resends_make_one_incoming_event_and_one_set_of_forwards() {
    let api = Api::start().await;
    let p = api.project().await;
    let (_, path) = source(&api, &p, json!({"provider": "github", "secret": "s"}), 3).await;
    let body = br#"{"zen": "Keep it logically awesome."}"#;
    let headers = github_headers("s", body, "d6f1f6a0-0000-4000-8000-000000000001");
    for round in 0..3 {
        let delivery = format!("round-{round}");
        let headers: Vec<_> = headers.iter().map(|(n, v)| (*n, if *n == "X-GitHub-Delivery" { delivery.clone() } else { v.clone() })).collect();
        let sends = (0..8).map(|_| send(&api, &path, &headers, body.to_vec()));
        let answers = futures::future::join_all(sends).await;
        let statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
        assert_eq!(statuses.iter().filter(|s| **s == 202).count(), 1, "{statuses:?}");
        assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 7, "{statuses:?}");
        let ids: std::collections::HashSet<&str> = answers.iter().map(|(_, b)| b["id"].as_str().unwrap()).collect();
        assert_eq!(ids.len(), 1, "every answer names the one Incoming Event");
    }
    assert_eq!(stored(&api).await, (3, 9, 9));
}

#[tokio::test]
async fn generic_hmac_with_timestamp_and_event_id_keeps_any_content_type() {
    let api = Api::start().await;
    let p = api.project().await;
    let config = json!({"header": "X-Signature", "algorithm": "sha512", "encoding": "base64", "prefix": "sha512=", "timestamp_header": "X-Timestamp", "event_id_header": "X-Event-Id"});
    let (_, path) = source(&api, &p, json!({"provider": "generic_hmac", "secret": "k3y", "config": config}), 1).await;
    let body = b"amount=10&currency=eur&note=caf%C3%A9";
    let sign = |ts: i64, body: &[u8]| {
        use hmac::Mac;
        let mut mac = hmac::Hmac::<sha2::Sha512>::new_from_slice(b"k3y").unwrap();
        mac.update(ts.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("sha512={}", base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes()))
    };
    let t = now();
    let headers = vec![
        ("X-Signature", sign(t, body)),
        ("X-Timestamp", t.to_string()),
        ("X-Event-Id", "ord-42".to_string()),
        ("Content-Type", "application/x-www-form-urlencoded".to_string()),
    ];
    let (status, accepted) = send(&api, &path, &headers, body.to_vec()).await;
    assert_eq!(status, 202, "{accepted}");
    let (status, _) = send(&api, &path, &headers, body.to_vec()).await;
    assert_eq!(status, 200, "X-Event-Id dedupes");
    let (_, event) = api.get(&p.key, &format!("/v1/incoming-events/{}", accepted["id"].as_str().unwrap())).await;
    assert_eq!((event["content_type"].as_str(), event["provider_event_id"].as_str()), (Some("application/x-www-form-urlencoded"), Some("ord-42")));
    assert_eq!(event["body"].as_str().unwrap().as_bytes(), body);

    let mut tampered = headers.clone();
    tampered[1].1 = (t + 1).to_string();
    let (status, err) = send(&api, &path, &tampered, body.to_vec()).await;
    assert_eq!((status, err["error"]["code"].as_str()), (401, Some("bad_signature")), "the timestamp is signed");
    let stale = t - 600;
    let old = vec![("X-Signature", sign(stale, body)), ("X-Timestamp", stale.to_string()), ("X-Event-Id", "ord-43".to_string())];
    let (status, err) = send(&api, &path, &old, body.to_vec()).await;
    assert_eq!((status, err["error"]["code"].as_str()), (401, Some("timestamp_out_of_tolerance")));
    assert_eq!(stored(&api).await, (1, 1, 1));
}

#[tokio::test]
async fn bodies_that_are_not_utf8_or_empty_are_kept_byte_for_byte_and_oversized_ones_are_413() {
    let api = Api::start().await;
    let p = api.project().await;
    let (_, path) = source(&api, &p, json!({"provider": "github", "secret": "s"}), 1).await;

    let binary: Vec<u8> = vec![0xff, 0xfe, 0x00, 0x80, b'{', 0xc3, 0x28];
    let (status, accepted) = send(&api, &path, &github_headers("s", &binary, "bin"), binary.clone()).await;
    assert_eq!(status, 202, "{accepted}");
    let (_, event) = api.get(&p.key, &format!("/v1/incoming-events/{}", accepted["id"].as_str().unwrap())).await;
    assert!(event["body"].is_null(), "not UTF-8: no text form");
    assert_eq!(base64::engine::general_purpose::STANDARD.decode(event["body_base64"].as_str().unwrap()).unwrap(), binary);
    assert_eq!(event["body_sha256"], hex::encode(Sha256::digest(&binary)));
    let stored_sha: Vec<u8> = api.db.client().await.query_one("SELECT body_sha256 FROM incoming_events", &[]).await.unwrap().get(0);
    assert_eq!(stored_sha, Sha256::digest(&binary).to_vec());

    let (status, accepted) = send(&api, &path, &github_headers("s", b"", "empty"), Vec::new()).await;
    assert_eq!(status, 202, "{accepted}");
    let (_, event) = api.get(&p.key, &format!("/v1/incoming-events/{}", accepted["id"].as_str().unwrap())).await;
    assert_eq!((event["body_size"].as_i64(), event["body"].as_str()), (Some(0), Some("")));

    // A header that is not UTF-8 is kept as base64.
    let mut headers = github_headers("s", b"x", "odd-header");
    headers.push(("X-Odd", String::new()));
    let mut request = api.http.post(api.url(&path)).body(b"x".to_vec());
    for (n, v) in headers.iter().filter(|(n, _)| *n != "X-Odd") {
        request = request.header(*n, v);
    }
    let odd = reqwest::header::HeaderValue::from_bytes(b"caf\xe9").unwrap();
    let resp = request.header("X-Odd", odd).send().await.unwrap();
    assert_eq!(resp.status(), 202);
    let accepted: Value = resp.json().await.unwrap();
    let (_, event) = api.get(&p.key, &format!("/v1/incoming-events/{}", accepted["id"].as_str().unwrap())).await;
    let odd = event["headers"].as_array().unwrap().iter().find(|h| h["name"] == "x-odd").unwrap().clone();
    assert_eq!(odd, json!({"name": "x-odd", "value_base64": base64::engine::general_purpose::STANDARD.encode(b"caf\xe9")}));

    let limit = api.config.ingress.max_body_bytes;
    let big = vec![b'a'; limit + 1];
    let (status, err) = send(&api, &path, &github_headers("s", &big, "big"), big.clone()).await;
    assert_eq!((status, err["error"]["code"].as_str()), (413, Some("payload_too_large")));
    let fits = vec![b'a'; limit];
    let (status, _) = send(&api, &path, &github_headers("s", &fits, "fits"), fits).await;
    assert_eq!(status, 202, "exactly the limit is accepted");
    assert_eq!(api.count("SELECT count(*) FROM incoming_events WHERE provider_event_id = 'big'").await, 0);
    assert_eq!(stored(&api).await.0, 4);
}

#[tokio::test]
async fn unknown_disabled_rate_limited_and_slack_challenge_answers() {
    let api = Api::start().await;
    let p = api.project().await;
    let body = b"{}";

    let (status, err) = send(&api, "/ingress/not-a-token", &github_headers("s", body, "a"), body.to_vec()).await;
    assert_eq!((status, err["error"]["code"].as_str()), (404, Some("not_found")));
    let (status, _) = send(&api, &format!("/ingress/{}", "x".repeat(500)), &[], body.to_vec()).await;
    assert_eq!(status, 404);

    let (id, path) = source(&api, &p, json!({"provider": "github", "secret": "s"}), 1).await;
    let (status, _) = api.post(&p.key, &format!("/v1/sources/{id}/disable"), Value::Null).await;
    assert_eq!(status, 200);
    let (status, err) = send(&api, &path, &github_headers("s", body, "a"), body.to_vec()).await;
    assert_eq!((status, err["error"]["code"].as_str()), (410, Some("source_disabled")));
    assert_eq!(stored(&api).await, (0, 0, 0));

    // One request per second: of three sent at once, at most the first passes.
    let (_, limited) = source(&api, &p, json!({"provider": "github", "secret": "s", "rate_limit_per_second": 1}), 0).await;
    let mut statuses = Vec::new();
    for n in 0..3 {
        statuses.push(send(&api, &limited, &github_headers("s", body, &format!("r{n}")), body.to_vec()).await.0);
    }
    assert_eq!(statuses[0], 202, "{statuses:?}");
    assert!(statuses.contains(&429), "{statuses:?}");

    // Slack's url_verification: answered with the challenge, nothing stored.
    let (_, slack) = source(&api, &p, json!({"provider": "slack", "secret": "8f742231b10e8888abcd99yyyzzz85a5"}), 1).await;
    let challenge = br#"{"token": "Jhj5dZrVaK7ZwHHjRyZWjbDl", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P", "type": "url_verification"}"#;
    let ts = now().to_string();
    let sig = hmac_sha256_hex(b"8f742231b10e8888abcd99yyyzzz85a5", &[b"v0:", ts.as_bytes(), b":", challenge]);
    let resp = api
        .http
        .post(api.url(&slack))
        .header("X-Slack-Signature", format!("v0={sig}"))
        .header("X-Slack-Request-Timestamp", ts)
        .header("Content-Type", "application/json")
        .body(challenge.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P");
    assert_eq!(api.count("SELECT count(*) FROM incoming_events WHERE provider_event_id IS NULL").await, 0);
}

#[tokio::test]
async fn a_rotated_out_secret_verifies_during_the_overlap_only() {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.ingress.public_url = "https://hooks.example.com/".into();
    let api = Api::start_with(db, config).await;
    let p = api.project().await;
    let (status, src) = api.post(&p.key, "/v1/sources", json!({"provider": "github", "secret": "old"})).await;
    assert_eq!(status, 201);
    let path = src["ingress_path"].as_str().unwrap();
    assert_eq!(src["ingress_url"].as_str().unwrap(), format!("https://hooks.example.com{path}"));
    let id = src["id"].as_str().unwrap();
    let (status, _) = api.post(&p.key, &format!("/v1/sources/{id}/rotate-secret"), json!({"secret": "new"})).await;
    assert_eq!(status, 200);
    let body = b"{}";
    assert_eq!(send(&api, path, &github_headers("old", body, "1"), body.to_vec()).await.0, 202, "old secret within the overlap");
    assert_eq!(send(&api, path, &github_headers("new", body, "2"), body.to_vec()).await.0, 202);
    // The overlap ends.
    api.db.client().await.execute("UPDATE source_retired_secrets SET expires_at = now() - interval '1 second'", &[]).await.unwrap();
    assert_eq!(send(&api, path, &github_headers("old", body, "3"), body.to_vec()).await.0, 401);
    assert_eq!(send(&api, path, &github_headers("new", body, "4"), body.to_vec()).await.0, 202);
}

#[tokio::test]
async fn postgres_unavailable_is_503() {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.database.url = "postgres://railhook@127.0.0.1:1/railhook".into();
    config.database.acquire_timeout_ms = 500;
    // A pool that connects lazily, so the API starts while Postgres is away.
    let pool = railhook_store::build_pool(&config.database).unwrap();
    let state = railhook_api::AppState::new(std::sync::Arc::new(config), pool, railhook_telemetry::Metrics::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    tokio::spawn(railhook_api::run(state, listener, shutdown.clone()));
    let body = b"{}";
    let mut request = reqwest::Client::new().post(format!("http://{addr}/ingress/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")).body(body.to_vec());
    for (name, value) in github_headers("s", body, "a") {
        request = request.header(name, value);
    }
    let resp = request.send().await.unwrap();
    assert_eq!(resp.status(), 503);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "unavailable");
    shutdown.cancel();
}

/// The server's limits hold for the ingress too: a body trickled (or stalled) past
/// `api.body_read_timeout_ms` is a 408 with the connection closed, headers over the server's
/// bound are refused, and neither stores anything; a normal request is served afterwards.
#[tokio::test]
async fn slow_bodies_and_huge_headers_at_the_ingress_are_refused_and_store_nothing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.api.body_read_timeout_ms = 1000;
    let api = Api::start_with(db, config).await;
    let p = api.project().await;
    let (_, path) = source(&api, &p, json!({"provider": "github", "secret": "s"}), 1).await;

    let body = vec![b'a'; 1000];
    let mut head = format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n");
    for (name, value) in github_headers("s", &body, "slow") {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\naaaaaaaaaa");
    let mut stream = tokio::net::TcpStream::connect(api.addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(20), stream.read_to_end(&mut got)).await.expect("never closed").ok();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"request_timeout\""), "{text}");

    let mut headers = github_headers("s", b"x", "huge");
    let huge = "a".repeat(512 * 1024);
    headers.push(("X-Huge", huge));
    let refused = api.http.post(api.url(&path)).body(b"x".to_vec());
    let refused = headers.iter().fold(refused, |r, (n, v)| r.header(*n, v)).send().await;
    match refused {
        Ok(resp) => assert_eq!(resp.status().as_u16(), 431),
        // The server may close the connection before the client finished writing.
        Err(e) => assert!(e.is_request() || e.is_connect() || e.is_body(), "{e}"),
    }
    assert_eq!(stored(&api).await, (0, 0, 0));

    let (status, _) = send(&api, &path, &github_headers("s", b"ok", "ok"), b"ok".to_vec()).await;
    assert_eq!(status, 202);
    assert_eq!(stored(&api).await, (1, 1, 1));
}
