//! The axum extractor over real HTTP: a router served on 127.0.0.1:0, requests from reqwest.


use std::time::{SystemTime, UNIX_EPOCH};

use axum::routing::post;
use axum::Router;
use railhook_receiver::{Secret, VerifiedWebhook, Verifier};
use serde_json::Value;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const NEW_SECRET: &str = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYX";

async fn hook(webhook: VerifiedWebhook) -> String {
    let body: Value = webhook.json().unwrap_or(Value::Null);
    format!("{} {} {}", webhook.id, webhook.timestamp, body["n"])
}

async fn serve(verifier: Verifier) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().route("/hook", post(hook)).with_state(verifier);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/hook")
}

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

async fn send(url: &str, headers: &[(&str, String)], body: &str) -> (u16, String) {
    let mut req = reqwest::Client::new().post(url).body(body.to_string());
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}

fn signed(secrets: &[&str], id: &str, ts: i64, body: &str) -> Vec<(&'static str, String)> {
    let sig = secrets.iter().map(|s| s.parse::<Secret>().unwrap().sign(id, ts, body.as_bytes())).collect::<Vec<_>>().join(" ");
    vec![("webhook-id", id.to_string()), ("webhook-timestamp", ts.to_string()), ("webhook-signature", sig)]
}

/// Headers, body, then the expected status, error code and header at fault.
type Case<'a> = (Vec<(&'a str, String)>, &'a str, u16, &'a str, Option<&'a str>);

fn error(text: &str) -> (String, Option<String>) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (v["error"]["code"].as_str().unwrap().to_string(), v["error"]["header"].as_str().map(str::to_string))
}

#[tokio::test]
async fn accepts_authentic_requests_and_names_what_is_wrong_with_others() {
    let url = serve(Verifier::new([SECRET.parse().unwrap()])).await;
    let body = r#"{"n": 7}"#;
    let ts = now();

    let (status, text) = send(&url, &signed(&[SECRET], "dlv_1", ts, body), body).await;
    assert_eq!((status, text), (200, format!("dlv_1 {ts} 7")));
    // A rotation header with the old and the new secret's signatures.
    let (status, _) = send(&url, &signed(&[NEW_SECRET, SECRET], "dlv_2", ts, body), body).await;
    assert_eq!(status, 200);

    let cases: Vec<Case> = vec![
        (signed(&[SECRET], "dlv_1", ts, body), r#"{"n": 8}"#, 401, "no_matching_signature", Some("webhook-signature")),
        (signed(&[NEW_SECRET], "dlv_1", ts, body), body, 401, "no_matching_signature", Some("webhook-signature")),
        (signed(&[SECRET], "dlv_1", ts - 301, body), body, 401, "timestamp_too_old", Some("webhook-timestamp")),
        (signed(&[SECRET], "dlv_1", ts + 400, body), body, 401, "timestamp_too_new", Some("webhook-timestamp")),
        (signed(&[SECRET], "dlv_1", ts, body)[1..].to_vec(), body, 400, "missing_header", Some("webhook-id")),
        (signed(&[SECRET], "dlv_1", ts, body)[..2].to_vec(), body, 400, "missing_header", Some("webhook-signature")),
        (vec![("webhook-id", "dlv_1".into()), ("webhook-timestamp", "yesterday".into()), ("webhook-signature", "v1,AAAA".into())], body, 400, "invalid_timestamp", Some("webhook-timestamp")),
        (vec![("webhook-id", "dlv_1".into()), ("webhook-timestamp", ts.to_string()), ("webhook-signature", "v1,***".into())], body, 400, "malformed_signature", Some("webhook-signature")),
    ];
    for (headers, body, want_status, want_code, want_header) in cases {
        let (status, text) = send(&url, &headers, body).await;
        assert_eq!(status, want_status, "{want_code}: {text}");
        assert_eq!(error(&text), (want_code.to_string(), want_header.map(str::to_string)), "{text}");
    }
}

#[tokio::test]
async fn a_receiver_holding_both_secrets_during_a_rotation() {
    let url = serve(Verifier::new([SECRET.parse().unwrap(), NEW_SECRET.parse().unwrap()])).await;
    let body = "{}";
    for secret in [SECRET, NEW_SECRET] {
        let (status, text) = send(&url, &signed(&[secret], "dlv_r", now(), body), body).await;
        assert_eq!(status, 200, "{text}");
    }
    let stranger = "whsec_//79/Pv6+fj39vX08/Lx8O/u7ezr6uno5+bl5OPi4eA=";
    let (status, _) = send(&url, &signed(&[stranger], "dlv_r", now(), body), body).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn a_receiver_without_secrets_answers_500() {
    let url = serve(Verifier::new([])).await;
    let (status, text) = send(&url, &signed(&[SECRET], "dlv_1", now(), "{}"), "{}").await;
    assert_eq!(status, 500);
    assert_eq!(error(&text).0, "no_secrets");
}
