//! SSRF at creation: `POST /v1/endpoints` refuses every URL that leads to a private,
//! loopback, link-local or metadata address, in every spelling, with 422 naming `url` and the
//! reason; also host names whose DNS answers do. Names other than `localhost` get fixed
//! answers through the API's resolver seam (`AppState::resolver`), because the system
//! resolver cannot be pointed at a test nameserver; `localhost` goes through the real one.

mod common;

use std::net::IpAddr;

use common::Api;
use railhook_core::address::fixed_resolver;
use railhook_testkit::{test_config, TestDb};
use serde_json::json;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Names and their fixed DNS answers.
fn answers() -> Vec<(String, Vec<IpAddr>)> {
    [
        ("private.test", vec!["10.1.2.3"]),
        ("private6.test", vec!["fd12:3456::1"]),
        ("loopback.test", vec!["127.0.0.1"]),
        ("linklocal.test", vec!["169.254.7.7"]),
        ("metadata.test", vec!["169.254.169.254"]),
        ("metadata6.test", vec!["fd00:ec2::254"]),
        ("mapped.test", vec!["::ffff:127.0.0.1"]),
        ("mapped-metadata.test", vec!["::ffff:169.254.169.254"]),
        // One public and one private answer: the connection could go to either.
        ("mixed.test", vec!["93.184.216.34", "10.0.0.1"]),
        ("public.test", vec!["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"]),
    ]
    .into_iter()
    .map(|(name, ips)| (name.to_string(), ips.into_iter().map(ip).collect()))
    .collect()
}

async fn api(allow: &[&str]) -> Api {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.network.allow_cidrs = allow.iter().map(|s| s.to_string()).collect();
    Api::start_resolving(db, config, Some(fixed_resolver(answers()))).await
}

/// `(url, words the reason must contain)`.
fn refused_cases() -> Vec<(&'static str, &'static str)> {
    vec![
        // private
        ("http://10.0.0.1/", "private address (10.0.0.1)"),
        ("http://172.16.5.4/", "private address (172.16.5.4)"),
        ("http://192.168.1.10/", "private address (192.168.1.10)"),
        ("http://100.64.0.1/", "private address"),
        ("http://[fd12::1]/", "private address (fd12::1)"),
        // loopback
        ("http://127.0.0.1:9/", "loopback address (127.0.0.1)"),
        ("http://127.9.9.9/", "loopback address (127.9.9.9)"),
        ("http://[::1]/", "loopback address (::1)"),
        // link-local
        ("http://169.254.1.1/", "link-local address (169.254.1.1)"),
        ("http://[fe80::1]/", "link-local address (fe80::1)"),
        // metadata
        ("http://169.254.169.254/latest/meta-data/", "cloud metadata address (169.254.169.254)"),
        ("http://[fd00:ec2::254]/", "cloud metadata address (fd00:ec2::254)"),
        ("http://169.254.170.2/v2/credentials", "cloud metadata address"),
        // IPv4-mapped and other embedding IPv6 forms
        ("http://[::ffff:127.0.0.1]/", "loopback address (::ffff:127.0.0.1)"),
        ("http://[::ffff:169.254.169.254]/", "cloud metadata address (::ffff:169.254.169.254)"),
        ("http://[::ffff:a9fe:a9fe]/", "cloud metadata address (::ffff:169.254.169.254)"),
        ("http://[::ffff:10.0.0.1]/", "private address"),
        ("http://[::ffff:0:127.0.0.1]/", "loopback address"),
        ("http://[64:ff9b::a9fe:a9fe]/", "cloud metadata address"),
        ("http://[2002:7f00:1::]/", "loopback address"),
        // IPv4 in decimal, octal, hex and short forms
        ("http://2130706433/", "loopback address (127.0.0.1)"),
        ("http://0177.0.0.1/", "loopback address (127.0.0.1)"),
        ("http://0x7f000001/", "loopback address (127.0.0.1)"),
        ("http://0x7f.0.0.1/", "loopback address (127.0.0.1)"),
        ("http://127.1/", "loopback address (127.0.0.1)"),
        ("http://017700000001/", "loopback address (127.0.0.1)"),
        ("http://2852039166/", "cloud metadata address (169.254.169.254)"),
        ("http://0xa9fea9fe/", "cloud metadata address (169.254.169.254)"),
        ("http://0251.0376.0251.0376/", "cloud metadata address (169.254.169.254)"),
        ("http://167772161/", "private address (10.0.0.1)"),
        ("http://0/", "unspecified address (0.0.0.0)"),
        // host names whose DNS answers are refused
        ("http://private.test/", "private address (10.1.2.3)"),
        ("http://private6.test/", "private address (fd12:3456::1)"),
        ("http://loopback.test/", "loopback address (127.0.0.1)"),
        ("http://linklocal.test/", "link-local address (169.254.7.7)"),
        ("http://metadata.test/", "cloud metadata address (169.254.169.254)"),
        ("http://metadata6.test/", "cloud metadata address (fd00:ec2::254)"),
        ("http://mapped.test/", "loopback address (::ffff:127.0.0.1)"),
        ("http://mapped-metadata.test/", "cloud metadata address (::ffff:169.254.169.254)"),
        ("http://mixed.test/", "private address (10.0.0.1)"),
        ("http://Metadata.TEST./", "cloud metadata address"),
    ]
}

#[tokio::test]
async fn every_refused_address_is_a_422_naming_url_and_the_reason() {
    let api = api(&[]).await;
    let p = api.project().await;
    let mut failures = Vec::new();
    let cases = refused_cases();
    for (url, reason) in &cases {
        let (status, body) = api.post(&p.key, "/v1/endpoints", json!({"url": url})).await;
        let message = body["error"]["message"].as_str().unwrap_or("");
        if status != 422 || body["error"]["code"] != "url_not_allowed" || body["error"]["field"] != "url" || !message.contains(reason) {
            failures.push(format!("{url}: expected 422 url_not_allowed on url with {reason:?}, got {status} {body}"));
        }
        if !message.contains("network.allow_cidrs") {
            failures.push(format!("{url}: the message does not say how to permit it: {message}"));
        }
    }
    // PATCH refuses the same, and leaves the URL as it was.
    let (status, ep) = api.post(&p.key, "/v1/endpoints", json!({"url": "http://public.test/hook"})).await;
    assert_eq!(status, 201, "{ep}");
    let id = ep["id"].as_str().unwrap();
    for (url, reason) in &cases {
        let resp = api.http.patch(api.url(&format!("/v1/endpoints/{id}"))).bearer_auth(&p.key).json(&json!({"url": url})).send().await.unwrap();
        let status = resp.status().as_u16();
        let body: serde_json::Value = resp.json().await.unwrap();
        if status != 422 || body["error"]["field"] != "url" || !body["error"]["message"].as_str().unwrap_or("").contains(reason) {
            failures.push(format!("PATCH {url}: got {status} {body}"));
        }
    }
    assert!(failures.is_empty(), "{} of {} wrong:\n{}", failures.len(), cases.len() * 2, failures.join("\n"));
    assert_eq!(api.count("SELECT count(*) FROM endpoints").await, 1);
    let (_, still) = api.get(&p.key, &format!("/v1/endpoints/{id}")).await;
    assert_eq!(still["url"], "http://public.test/hook");
}

/// `localhost` through the real system resolver (/etc/hosts).
#[tokio::test]
async fn localhost_is_refused_through_the_system_resolver() {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.network.allow_cidrs = vec![];
    let api = Api::start_with(db, config).await;
    let p = api.project().await;
    for url in ["http://localhost/", "http://LOCALHOST:8080/x"] {
        let (status, body) = api.post(&p.key, "/v1/endpoints", json!({"url": url})).await;
        assert_eq!((status, body["error"]["code"].as_str(), body["error"]["field"].as_str()), (422, Some("url_not_allowed"), Some("url")), "{url}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains("loopback address"), "{url}: {body}");
    }
}

/// Loopback on the allow-list is admitted in all its spellings (and names resolving to it);
/// everything else stays refused, and metadata needs an exact entry.
#[tokio::test]
async fn the_allow_list_admits_loopback_and_nothing_else() {
    let api = api(&["127.0.0.0/8", "::1/128"]).await;
    let p = api.project().await;
    for url in [
        "http://127.0.0.1:9/",
        "http://[::1]:9/",
        "http://2130706433/",
        "http://0177.0.0.1/",
        "http://0x7f000001/",
        "http://127.1/",
        "http://[::ffff:127.0.0.1]/",
        "http://loopback.test/",
        "http://mapped.test/",
        "http://public.test/",
    ] {
        let (status, body) = api.post(&p.key, "/v1/endpoints", json!({"url": url})).await;
        assert_eq!(status, 201, "{url}: {body}");
    }
    for (url, reason) in refused_cases() {
        if reason.starts_with("loopback") {
            continue;
        }
        let (status, body) = api.post(&p.key, "/v1/endpoints", json!({"url": url})).await;
        assert_eq!((status, body["error"]["field"].as_str()), (422, Some("url")), "{url}: {body}");
    }
    // A broad link-local entry does not admit the metadata address; an exact one does.
    let broad = api_exact(&["169.254.0.0/16"]).await;
    let p2 = broad.project().await;
    assert_eq!(broad.post(&p2.key, "/v1/endpoints", json!({"url": "http://169.254.1.1/"})).await.0, 201);
    assert_eq!(broad.post(&p2.key, "/v1/endpoints", json!({"url": "http://169.254.169.254/"})).await.0, 422);
    let exact = api_exact(&["169.254.169.254/32"]).await;
    let p3 = exact.project().await;
    assert_eq!(exact.post(&p3.key, "/v1/endpoints", json!({"url": "http://169.254.169.254/"})).await.0, 201);
}

async fn api_exact(allow: &[&str]) -> Api {
    api(allow).await
}

/// A name that does not resolve is refused too (nothing to check, nothing to deliver to).
#[tokio::test]
async fn unresolvable_names_are_refused() {
    let api = api(&[]).await;
    let p = api.project().await;
    let (status, body) = api.post(&p.key, "/v1/endpoints", json!({"url": "http://nowhere.test/"})).await;
    assert_eq!((status, body["error"]["code"].as_str(), body["error"]["field"].as_str()), (422, Some("url_unresolvable"), Some("url")), "{body}");
}
