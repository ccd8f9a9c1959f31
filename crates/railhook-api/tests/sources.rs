//! `/v1/sources` and their Destinations: validation, CRUD, pagination and tenancy.

mod common;

use common::Api;
use serde_json::{json, Value};

async fn patch(api: &Api, key: &str, path: &str, body: Value) -> (u16, Value) {
    let resp = api.http.patch(api.url(path)).bearer_auth(key).json(&body).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn delete(api: &Api, key: &str, path: &str) -> u16 {
    api.http.delete(api.url(path)).bearer_auth(key).send().await.unwrap().status().as_u16()
}

#[tokio::test]
async fn sources_are_validated_created_listed_updated_rotated_and_deleted() {
    let api = Api::start().await;
    let p = api.project().await;

    // Refused input names the field.
    for (body, field) in [
        (json!({"provider": "paypal", "secret": "s"}), "provider"),
        (json!({"provider": "generic_hmac", "secret": "s"}), "config"),
        (json!({"provider": "generic_hmac", "secret": "s", "config": {"header": "X-Sig", "algorithm": "md5", "encoding": "hex"}}), "config.algorithm"),
        (json!({"provider": "stripe", "secret": "s", "config": {"header": "x"}}), "config"),
        (json!({"provider": "github", "secret": " padded "}), "secret"),
        (json!({"provider": "sendgrid", "secret": "not a key"}), "secret"),
        (json!({"provider": "standard_webhooks", "secret": "whsec_short"}), "secret"),
        (json!({"provider": "github", "secret": "s", "rate_limit_per_second": 0}), "rate_limit_per_second"),
    ] {
        let (status, err) = api.post(&p.key, "/v1/sources", body.clone()).await;
        assert_eq!((status, err["error"]["field"].as_str()), (422, Some(field)), "{body}: {err}");
    }
    let (status, _) = api.post(&p.key, "/v1/sources", json!({"provider": "github"})).await;
    assert_eq!(status, 422, "the secret is required");
    assert_eq!(api.count("SELECT count(*) FROM sources").await, 0);

    let (status, src) = api.post(&p.key, "/v1/sources", json!({"name": "gh", "provider": "github", "secret": "s3cret", "rate_limit_per_second": 5})).await;
    assert_eq!(status, 201, "{src}");
    assert!(src["id"].as_str().unwrap().starts_with("src_"));
    assert_eq!((src["provider"].as_str(), src["enabled"].as_bool(), src["rate_limit_per_second"].as_i64()), (Some("github"), Some(true), Some(5)));
    let token = src["ingress_path"].as_str().unwrap().strip_prefix("/ingress/").unwrap().to_string();
    assert_eq!(token.len(), 43, "256 random bits, base64url");
    assert!(src["ingress_url"].is_null(), "no ingress.public_url configured");
    assert!(!src.to_string().contains("s3cret"), "the secret is never shown: {src}");

    let (status, generic) = api
        .post(&p.key, "/v1/sources", json!({"provider": "generic_hmac", "secret": "k", "config": {"header": "X-Sig", "algorithm": "sha1", "encoding": "hex"}}))
        .await;
    assert_eq!(status, 201, "{generic}");
    assert_eq!(generic["name"], "generic_hmac", "the name defaults to the provider");
    assert_eq!(generic["config"], json!({"header": "X-Sig", "algorithm": "sha1", "encoding": "hex"}));
    let (status, _) = api.post(&p.key, "/v1/sources", json!({"provider": "stripe", "secret": "whsec_x"})).await;
    assert_eq!(status, 201);

    // Cursor pagination in creation order.
    let (status, first) = api.get(&p.key, "/v1/sources?limit=2").await;
    assert_eq!(status, 200);
    assert_eq!(first["data"].as_array().unwrap().len(), 2);
    assert_eq!(first["data"][0]["id"], src["id"]);
    let cursor = first["next_cursor"].as_str().unwrap();
    let (_, second) = api.get(&p.key, &format!("/v1/sources?limit=2&cursor={cursor}")).await;
    assert_eq!(second["data"].as_array().unwrap().len(), 1);
    assert!(second["next_cursor"].is_null());
    let (status, _) = api.get(&p.key, "/v1/sources?cursor=ep_nope").await;
    assert_eq!(status, 400);

    let id = src["id"].as_str().unwrap();
    let (status, got) = api.get(&p.key, &format!("/v1/sources/{id}")).await;
    assert_eq!((status, &got["ingress_path"]), (200, &src["ingress_path"]));
    let (status, changed) = patch(&api, &p.key, &format!("/v1/sources/{id}"), json!({"name": "renamed", "rate_limit_per_second": null})).await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!((changed["name"].as_str(), changed["rate_limit_per_second"].is_null()), (Some("renamed"), true));
    let (status, err) = patch(&api, &p.key, &format!("/v1/sources/{id}"), json!({"provider": "stripe"})).await;
    assert_eq!(status, 422, "the provider cannot change: {err}");
    let gid = generic["id"].as_str().unwrap();
    let (status, err) = patch(&api, &p.key, &format!("/v1/sources/{gid}"), json!({"config": {"header": "X Sig", "algorithm": "sha1", "encoding": "hex"}})).await;
    assert_eq!((status, err["error"]["field"].as_str()), (422, Some("config.header")));

    let (status, disabled) = api.post(&p.key, &format!("/v1/sources/{id}/disable"), Value::Null).await;
    assert_eq!((status, disabled["enabled"].as_bool()), (200, Some(false)));

    let (status, err) = api.post(&p.key, &format!("/v1/sources/{id}/rotate-secret"), json!({"secret": ""})).await;
    assert_eq!((status, err["error"]["field"].as_str()), (422, Some("secret")));
    let (status, rotated) = api.post(&p.key, &format!("/v1/sources/{id}/rotate-secret"), json!({"secret": "n3w"})).await;
    assert_eq!(status, 200, "{rotated}");
    let expires: chrono::DateTime<chrono::Utc> = rotated["previous_secret_expires_at"].as_str().unwrap().parse().unwrap();
    let overlap = expires - chrono::Utc::now();
    assert!(overlap > chrono::Duration::hours(23) && overlap <= chrono::Duration::hours(24), "{overlap}");
    assert_eq!(api.count("SELECT count(*) FROM source_retired_secrets WHERE secret = 's3cret'").await, 1);
    assert_eq!(api.count("SELECT count(*) FROM sources WHERE secret = 'n3w'").await, 1);

    assert_eq!(delete(&api, &p.key, &format!("/v1/sources/{id}")).await, 204);
    assert_eq!(api.get(&p.key, &format!("/v1/sources/{id}")).await.0, 404);
    assert_eq!(delete(&api, &p.key, &format!("/v1/sources/{id}")).await, 404);
    assert_eq!(api.get(&p.key, "/v1/sources/nonsense").await.0, 400);
}

#[tokio::test]
async fn destinations_follow_the_ssrf_rules_and_keep_credentials_write_only() {
    let api = Api::start().await;
    let p = api.project().await;
    let (_, src) = api.post(&p.key, "/v1/sources", json!({"provider": "github", "secret": "s"})).await;
    let base = format!("/v1/sources/{}/destinations", src["id"].as_str().unwrap());

    for (url, code) in [("http://169.254.169.254/latest", "url_not_allowed"), ("http://10.0.0.1/", "url_not_allowed"), ("ftp://127.0.0.1/", "invalid_url")] {
        let (status, err) = api.post(&p.key, &base, json!({"url": url})).await;
        assert_eq!((status, err["error"]["code"].as_str()), (422, Some(code)), "{url}: {err}");
    }
    for (auth, field) in [
        (json!({"type": "basic", "username": "a:b", "password": "p"}), "auth.username"),
        (json!({"type": "bearer", "token": ""}), "auth.token"),
        (json!({"type": "header", "name": "Content-Length", "value": "1"}), "auth.name"),
        (json!({"type": "standard_webhooks", "secret": "nope"}), "auth.secret"),
    ] {
        let (status, err) = api.post(&p.key, &base, json!({"url": "http://127.0.0.1:9/in", "auth": auth})).await;
        assert_eq!((status, err["error"]["field"].as_str()), (422, Some(field)), "{err}");
    }
    let (status, err) = api.post(&p.key, &base, json!({"url": "http://127.0.0.1:9/in", "auth": {"type": "kerberos"}})).await;
    assert_eq!(status, 422, "{err}");
    assert_eq!(api.count("SELECT count(*) FROM destinations").await, 0);

    let (status, basic) = api
        .post(&p.key, &base, json!({"url": "http://127.0.0.1:9/in", "auth": {"type": "basic", "username": "u", "password": "pw-secret"}, "rate_limit_per_second": 3}))
        .await;
    assert_eq!(status, 201, "{basic}");
    assert!(basic["id"].as_str().unwrap().starts_with("dst_"));
    assert_eq!(basic["auth"], json!({"type": "basic", "username": "u"}));
    assert!(!basic.to_string().contains("pw-secret"));
    let (status, signed) = api.post(&p.key, &base, json!({"url": "http://127.0.0.1:9/signed", "auth": {"type": "standard_webhooks"}})).await;
    assert_eq!(status, 201);
    assert!(signed["auth"]["secret"].as_str().unwrap().starts_with("whsec_"), "generated: {signed}");
    let (status, plain) = api.post(&p.key, &base, json!({"url": "http://127.0.0.1:9/plain", "enabled": false})).await;
    assert_eq!((status, &plain["auth"]), (201, &json!({"type": "none"})));
    let stored: Value = api
        .db
        .client()
        .await
        .query_one("SELECT auth FROM destinations WHERE url = 'http://127.0.0.1:9/in'", &[])
        .await
        .unwrap()
        .get::<_, tokio_postgres::types::Json<Value>>(0)
        .0;
    assert_eq!(stored, json!({"type": "basic", "username": "u", "password": "pw-secret"}), "the worker gets the credentials");

    let (_, page1) = api.get(&p.key, &format!("{base}?limit=2")).await;
    assert_eq!(page1["data"].as_array().unwrap().len(), 2);
    let (_, page2) = api.get(&p.key, &format!("{base}?limit=2&cursor={}", page1["next_cursor"].as_str().unwrap())).await;
    assert_eq!(page2["data"][0]["id"], plain["id"]);

    let one = format!("{base}/{}", basic["id"].as_str().unwrap());
    let (status, changed) = patch(&api, &p.key, &one, json!({"enabled": false, "auth": {"type": "bearer", "token": "t0k"}, "url": "http://127.0.0.1:9/moved"})).await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!((changed["enabled"].as_bool(), &changed["auth"], changed["url"].as_str()), (Some(false), &json!({"type": "bearer"}), Some("http://127.0.0.1:9/moved")));
    let (status, _) = patch(&api, &p.key, &one, json!({"url": "http://192.168.1.1/"})).await;
    assert_eq!(status, 422);
    assert_eq!(api.get(&p.key, &one).await.0, 200);
    assert_eq!(delete(&api, &p.key, &one).await, 204);
    assert_eq!(api.get(&p.key, &one).await.0, 404);

    // Deleting the Source takes its Destinations.
    assert_eq!(delete(&api, &p.key, &format!("/v1/sources/{}", src["id"].as_str().unwrap())).await, 204);
    assert_eq!(api.count("SELECT count(*) FROM destinations").await, 0);
    assert_eq!(api.get(&p.key, &base).await.0, 404);
}

#[tokio::test]
async fn another_projects_sources_destinations_and_incoming_events_are_404() {
    let api = Api::start().await;
    let a = api.project().await;
    let b = api.project().await;
    let (_, src) = api.post(&a.key, "/v1/sources", json!({"provider": "github", "secret": "s"})).await;
    let id = src["id"].as_str().unwrap();
    let (_, dst) = api.post(&a.key, &format!("/v1/sources/{id}/destinations"), json!({"url": "http://127.0.0.1:9/"})).await;
    let did = dst["id"].as_str().unwrap();

    assert_eq!(api.get(&b.key, &format!("/v1/sources/{id}")).await.0, 404);
    assert_eq!(patch(&api, &b.key, &format!("/v1/sources/{id}"), json!({"name": "x"})).await.0, 404);
    assert_eq!(api.post(&b.key, &format!("/v1/sources/{id}/disable"), Value::Null).await.0, 404);
    assert_eq!(api.post(&b.key, &format!("/v1/sources/{id}/rotate-secret"), json!({"secret": "x"})).await.0, 404);
    assert_eq!(api.get(&b.key, &format!("/v1/sources/{id}/destinations")).await.0, 404);
    assert_eq!(api.post(&b.key, &format!("/v1/sources/{id}/destinations"), json!({"url": "http://127.0.0.1:9/"})).await.0, 404);
    assert_eq!(api.get(&b.key, &format!("/v1/sources/{id}/destinations/{did}")).await.0, 404);
    assert_eq!(patch(&api, &b.key, &format!("/v1/sources/{id}/destinations/{did}"), json!({"enabled": false})).await.0, 404);
    assert_eq!(delete(&api, &b.key, &format!("/v1/sources/{id}/destinations/{did}")).await, 404);
    assert_eq!(delete(&api, &b.key, &format!("/v1/sources/{id}")).await, 404);
    let (_, list) = api.get(&b.key, "/v1/sources").await;
    assert_eq!(list["data"], json!([]));

    // B's own Source cannot reach A's Destination by id either.
    let (_, b_src) = api.post(&b.key, "/v1/sources", json!({"provider": "github", "secret": "s"})).await;
    assert_eq!(api.get(&b.key, &format!("/v1/sources/{}/destinations/{did}", b_src["id"].as_str().unwrap())).await.0, 404);

    // An Incoming Event of A.
    let token = src["ingress_path"].as_str().unwrap();
    let body = b"{}".to_vec();
    let sig = common::hmac_sha256_hex(b"s", &[&body]);
    let resp = api.http.post(api.url(token)).header("X-Hub-Signature-256", format!("sha256={sig}")).body(body).send().await.unwrap();
    assert_eq!(resp.status(), 202);
    let ine: Value = resp.json().await.unwrap();
    let ine = ine["id"].as_str().unwrap();
    assert_eq!(api.get(&a.key, &format!("/v1/incoming-events/{ine}")).await.0, 200);
    assert_eq!(api.get(&b.key, &format!("/v1/incoming-events/{ine}")).await.0, 404);
    let (_, list) = api.get(&b.key, "/v1/incoming-events").await;
    assert_eq!(list["data"], json!([]));

    // Both still intact for A.
    assert_eq!(api.get(&a.key, &format!("/v1/sources/{id}/destinations/{did}")).await.0, 200);
}
