//! Forwards end to end, against the real Postgres, Kafka and HTTP: the ingress's statement
//! (`railhook_store::incoming::receive`, what `POST /ingress/{token}` runs once the provider's
//! signature verified), the CDC relay, the worker's Forwards loop, and receivers on 127.0.0.1
//! that record what they were sent. Each auth kind is checked at the receiver (the Standard
//! Webhooks re-signing with this file's own verifier); an outage of 2 minutes; kill -9 of a
//! worker process; retry and replay.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use railhook_core::{DestinationId, ForwardId, IncomingEventId, ProjectId, SourceId};
use railhook_store::incoming::{self, NewIncomingEvent, Received, StoredHeader};
use railhook_store::lifecycle::forward::{self, ForwardRetryOutcome, ForwardSelection, ReplayOutcome};
use railhook_store::sources::{self, DestinationAuth, NewDestination, NewSource};
use railhook_testkit::eventually;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A project and a Source (GitHub) in the System's database.
async fn source(sys_pool: &railhook_store::Pool) -> (ProjectId, SourceId) {
    let client = sys_pool.get().await.unwrap();
    let org = railhook_store::tenancy::create_organization(&**client, "acme").await.unwrap();
    let project = railhook_store::tenancy::create_project(&**client, org.id, "shop").await.unwrap().unwrap();
    let new = NewSource { name: "gh", provider: "github", config: None, secret: "s3cret", enabled: true, rate_limit_per_second: None };
    let src = sources::create_source(&**client, project.id, new).await.unwrap();
    (project.id, src.id)
}

async fn destination(pool: &railhook_store::Pool, project: ProjectId, source: SourceId, url: &str, auth: DestinationAuth) -> DestinationId {
    let client = pool.get().await.unwrap();
    let new = NewDestination { url, auth: &auth, enabled: true, rate_limit_per_second: None };
    sources::create_destination(&**client, project, source, new).await.unwrap().unwrap().id
}

/// Stores a request as the ingress does; its Incoming Event and Forwards.
async fn ingress(pool: &railhook_store::Pool, project: ProjectId, source: SourceId, headers: &[(&str, &[u8])], body: &[u8], content_type: Option<&str>) -> (IncomingEventId, Vec<(ForwardId, DestinationId)>) {
    let client = pool.get().await.unwrap();
    let stored: Vec<StoredHeader> = headers.iter().map(|(n, v)| StoredHeader::new(n, v)).collect();
    let event_id = uuid::Uuid::new_v4().to_string();
    let new = NewIncomingEvent { project, source, provider_event_id: Some(&event_id), method: "POST", headers: &stored, body, content_type };
    match incoming::receive(&client, new).await.unwrap() {
        Received::Stored { id, forwards, .. } => (id, forwards),
        other => panic!("{other:?}"),
    }
}

async fn forward_status(client: &tokio_postgres::Client, id: ForwardId) -> (String, i32) {
    let row = client.query_one("SELECT status::text, attempt_count FROM forwards WHERE id = $1", &[&id.0]).await.unwrap();
    (row.get(0), row.get(1))
}

async fn wait_forward(client: &tokio_postgres::Client, id: ForwardId, want: &str, within: Duration) -> i32 {
    eventually(within, &format!("forward {id} to be {want}"), || async {
        let (status, attempts) = forward_status(client, id).await;
        (status == want).then_some(attempts)
    })
    .await
}

fn header<'a>(hit: &'a Hit, name: &str) -> Option<&'a str> {
    hit.headers.get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn forwards_carry_the_exact_request_the_allow_listed_headers_and_each_auth() {
    let (receiver, base) = Receiver::start(|_, _| Act::Status(200)).await;
    let sys = System::start(|_| {}).await;
    let (project, src) = source(&sys.pool).await;
    let auths = [
        ("none", DestinationAuth::None),
        ("basic", DestinationAuth::Basic { username: "ali".into(), password: "open: sesame".into() }),
        ("bearer", DestinationAuth::Bearer { token: "tok-123".into() }),
        ("header", DestinationAuth::Header { name: "X-Api-Key".into(), value: "k-456".into() }),
        ("sw", DestinationAuth::StandardWebhooks { secret: SECRET.into() }),
    ];
    for (path, auth) in &auths {
        destination(&sys.pool, project, src, &format!("{base}/{path}"), auth.clone()).await;
    }
    // Not UTF-8, with a NUL and a CRLF: must arrive byte for byte.
    let body: &[u8] = b"payload=\xff\x00\r\n{\"a\": 1}";
    let headers: &[(&str, &[u8])] = &[
        ("X-GitHub-Event", b"push"),
        ("X-GitHub-Delivery", b"72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        ("X-Hub-Signature-256", b"sha256=abc"),
        ("webhook-id", b"msg_original"),
        ("User-Agent", b"GitHub-Hookshot/044aadd"),
        ("Cookie", b"session=secret"),
        ("X-Forwarded-For", b"203.0.113.9"),
        ("Authorization", b"Bearer provider-token"),
    ];
    let ct = "application/x-www-form-urlencoded; charset=utf-8";
    let (ine, forwards) = ingress(&sys.pool, project, src, headers, body, Some(ct)).await;
    assert_eq!(forwards.len(), 5);
    for (id, _) in &forwards {
        assert_eq!(wait_forward(&sys.client, *id, "SUCCESS", Duration::from_secs(60)).await, 1);
    }
    for (path, auth) in &auths {
        let hits = receiver.hits(&format!("/{path}"));
        assert_eq!(hits.len(), 1, "{path}: one arrival");
        let hit = &hits[0];
        assert_eq!(hit.body, body, "{path}: the exact body bytes");
        assert_eq!(header(hit, "content-type"), Some(ct), "{path}");
        assert_eq!(header(hit, "x-github-event"), Some("push"));
        assert_eq!(header(hit, "x-github-delivery"), Some("72d3162e-cc78-11e3-81ab-4c9367dc0958"));
        assert_eq!(header(hit, "x-hub-signature-256"), Some("sha256=abc"));
        assert_eq!(header(hit, "x-incoming-event-id"), Some(ine.to_string().as_str()));
        assert_eq!(header(hit, "x-forward-attempt"), Some("1"));
        let key = header(hit, "idempotency-key").unwrap();
        assert!(forwards.iter().any(|(f, _)| f.to_string() == key), "{path}: Idempotency-Key is a Forward id: {key}");
        assert!(header(hit, "user-agent").unwrap().starts_with("Railhook/"), "{path}: the provider's User-Agent is not forwarded");
        assert_eq!(header(hit, "cookie"), None);
        assert_eq!(header(hit, "x-forwarded-for"), None);
        match auth {
            DestinationAuth::None => assert_eq!(header(hit, "authorization"), None),
            DestinationAuth::Basic { .. } => assert_eq!(header(hit, "authorization"), Some("Basic YWxpOm9wZW46IHNlc2FtZQ==")),
            DestinationAuth::Bearer { .. } => assert_eq!(header(hit, "authorization"), Some("Bearer tok-123")),
            DestinationAuth::Header { .. } => {
                assert_eq!(header(hit, "x-api-key"), Some("k-456"));
                assert_eq!(header(hit, "authorization"), None);
            }
            DestinationAuth::StandardWebhooks { secret } => {
                assert_eq!(header(hit, "webhook-id"), Some(key), "webhook-id is the Forward id");
                assert!(verifies(secret, &hit.headers, &hit.body), "the re-signed request verifies: {:?}", hit.headers);
                assert_eq!(hit.headers.get_all("webhook-id").iter().count(), 1, "the provider's webhook-id is replaced");
            }
        }
        if !matches!(auth, DestinationAuth::StandardWebhooks { .. }) {
            assert_eq!(header(hit, "webhook-id"), Some("msg_original"), "{path}: not re-signed: the provider's webhook-id goes through");
        }
    }
    let attempts = sys.worker.metrics.forwards.attempts.with_label_values(&["success", "2xx"]).get();
    assert_eq!(attempts, 5);
    sys.stop().await;
}
