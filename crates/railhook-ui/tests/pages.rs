//! The dashboard's router against a real Postgres (a database per test), request by
//! request: sign-in and its cookies, CSRF, precise 4xx for bad input (never a 500),
//! escaping, tenancy and the operator's project list. The browser flows are in tests/ui/.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use railhook_core::{DeliveryId, ProjectId};
use railhook_store::endpoints::{self, NewEndpoint};
use railhook_store::tenancy;
use railhook_testkit::{test_config, TestDb};
use railhook_ui::{router, UiState};
use tower::ServiceExt;

struct Page {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

struct Ui {
    app: Router,
    operator: String,
    _db: TestDb,
    pool: railhook_store::Pool,
}

impl Ui {
    async fn new() -> Ui {
        let db = TestDb::new().await;
        let mut config = test_config(&db);
        // An Event's trace links here (issue 33); untraced Events show no trace.
        config.ui.trace_url_template = "http://jaeger.test:16686/trace/{trace_id}".into();
        let operator = config.api.admin_token.clone();
        let pool = railhook_store::build_pool(&config.database).expect("pool");
        let app = router(UiState::new(Arc::new(config), pool.clone()));
        Ui { app, operator, _db: db, pool }
    }

    async fn send(&self, request: Request<Body>) -> Page {
        let response = self.app.clone().oneshot(request).await.expect("infallible");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.expect("body");
        Page { status, headers, body: String::from_utf8_lossy(&bytes).into_owned() }
    }

    async fn get(&self, path: &str, cookie: &str) -> Page {
        self.send(Request::get(path).header(header::COOKIE, cookie).body(Body::empty()).unwrap()).await
    }

    async fn post(&self, path: &str, cookie: &str, form: &str) -> Page {
        let request = Request::post(path)
            .header(header::COOKIE, cookie)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(form.to_string()))
            .unwrap();
        self.send(request).await
    }

    /// A project with an API key; the key.
    async fn project(&self, name: &str) -> (ProjectId, String) {
        let client = self.pool.get().await.unwrap();
        let org = tenancy::create_organization(&**client, "Acme").await.unwrap();
        let project = tenancy::create_project(&**client, org.id, name).await.unwrap().unwrap();
        let key = tenancy::create_api_key(&**client, project.id, "ui").await.unwrap().unwrap();
        (project.id, key.secret)
    }

    /// Signs in through the form; the session cookie pair ("rh_session=...").
    async fn sign_in(&self, credential: &str) -> String {
        let form = self.get("/ui/sign-in", "").await;
        let token = set_cookie(&form, "rh_signin");
        let body = format!("csrf={token}&credential={}", urlencode(credential));
        let signed = self.post("/ui/sign-in", &format!("rh_signin={token}"), &body).await;
        assert_eq!(signed.status, StatusCode::SEE_OTHER, "{}", signed.body);
        format!("rh_session={}", set_cookie(&signed, "rh_session"))
    }

    /// The CSRF token of the session's forms.
    async fn csrf(&self, cookie: &str) -> String {
        csrf_of(&self.get("/ui/endpoints", cookie).await)
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The CSRF token in the page's first form.
fn csrf_of(page: &Page) -> String {
    let at = page.body.find("name=\"csrf\" value=\"").expect("a form with a token") + 19;
    page.body[at..].split('"').next().unwrap().to_string()
}

/// The value a response sets for cookie `name`.
fn set_cookie(page: &Page, name: &str) -> String {
    page.headers
        .get_all(header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| v.strip_prefix(&format!("{name}=")).map(|rest| rest.split(';').next().unwrap_or("").to_string()))
        .unwrap_or_else(|| panic!("no Set-Cookie for {name}"))
}

#[tokio::test]
async fn signed_out_pages_send_to_sign_in_and_every_response_carries_the_policy() {
    let ui = Ui::new().await;
    for path in ["/ui", "/ui/", "/ui/deliveries", "/ui/failed-messages", "/ui/endpoints", "/ui/projects"] {
        let page = ui.get(path, "").await;
        assert_eq!(page.status, StatusCode::SEE_OTHER, "{path}");
        assert_eq!(page.headers[header::LOCATION], "/ui/sign-in", "{path}");
    }
    let page = ui.get("/ui/sign-in", "").await;
    assert_eq!(page.status, StatusCode::OK);
    let csp = page.headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
    assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"), "{csp}");
    assert!(!page.body.contains("<script>"), "no inline script");
    let cookie = page.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    let css = ui.get("/ui/assets/ui.css", "").await;
    assert_eq!((css.status, css.headers[header::CONTENT_TYPE].to_str().unwrap()), (StatusCode::OK, "text/css; charset=utf-8"));
    assert_eq!(ui.get("/ui/assets/nope.js", "").await.status, StatusCode::NOT_FOUND);
    assert_eq!(ui.get("/ui/no-such-page", "").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn sign_in_checks_its_token_and_the_credential() {
    let ui = Ui::new().await;
    let (_, key) = ui.project("Shop").await;
    let form = ui.get("/ui/sign-in", "").await;
    let token = set_cookie(&form, "rh_signin");
    let cookie = format!("rh_signin={token}");
    let forged = ui.post("/ui/sign-in", &cookie, &format!("csrf=other&credential={key}")).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let wrong = ui.post("/ui/sign-in", &cookie, &format!("csrf={token}&credential=rhk_nope")).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.body.contains("not valid"));
    let empty = ui.post("/ui/sign-in", &cookie, &format!("csrf={token}&credential=")).await;
    assert_eq!(empty.status, StatusCode::BAD_REQUEST);
    let session = ui.sign_in(&key).await;
    let overview = ui.get("/ui/", &session).await;
    assert_eq!(overview.status, StatusCode::OK, "{}", overview.body);
    assert!(overview.body.contains("Failed Messages"));
    // Behind a proxy that ended TLS the cookies are Secure.
    let tls = Request::get("/ui/sign-in").header("x-forwarded-proto", "https").body(Body::empty()).unwrap();
    let tls = ui.send(tls).await;
    assert!(tls.headers[header::SET_COOKIE].to_str().unwrap().ends_with("; Secure"));
    // A cookie that is not a session is no session.
    assert_eq!(ui.get("/ui/", "rh_session=%%%").await.status, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn bad_input_is_a_precise_4xx_never_a_500() {
    let ui = Ui::new().await;
    let (_, key) = ui.project("Shop").await;
    let session = ui.sign_in(&key).await;
    let csrf = ui.csrf(&session).await;
    let gets = [
        ("/ui/deliveries/not-an-id", StatusCode::BAD_REQUEST),
        (&format!("/ui/deliveries/{}", DeliveryId::new()) as &str, StatusCode::NOT_FOUND),
        ("/ui/deliveries?status=BOGUS", StatusCode::BAD_REQUEST),
        ("/ui/deliveries?endpoint_id=evt_x", StatusCode::BAD_REQUEST),
        ("/ui/deliveries?event_type=a..b", StatusCode::BAD_REQUEST),
        ("/ui/deliveries?created_after=2026-01-02T00:00&created_before=2026-01-01T00:00", StatusCode::BAD_REQUEST),
        ("/ui/deliveries?created_after=yesterday", StatusCode::BAD_REQUEST),
        ("/ui/deliveries?cursor=zzz", StatusCode::BAD_REQUEST),
        ("/ui/failed-messages?cursor=dlv_zzz", StatusCode::BAD_REQUEST),
        ("/ui/endpoints?cursor=%FF", StatusCode::BAD_REQUEST),
        ("/ui/projects", StatusCode::FORBIDDEN),
    ];
    for (path, expected) in gets {
        let page = ui.get(path, &session).await;
        assert_eq!(page.status, expected, "{path}: {}", page.body);
    }
    let posts = [
        ("/ui/failed-messages/retry", "scope=matching".to_string(), StatusCode::FORBIDDEN),
        ("/ui/failed-messages/retry", format!("csrf={csrf}&scope=selected"), StatusCode::BAD_REQUEST),
        ("/ui/failed-messages/retry", format!("csrf={csrf}&scope=selected&id=nope"), StatusCode::BAD_REQUEST),
        ("/ui/failed-messages/retry", format!("csrf={csrf}&scope=whatever"), StatusCode::BAD_REQUEST),
        (&format!("/ui/deliveries/{}/retry", DeliveryId::new()) as &str, format!("csrf={csrf}"), StatusCode::NOT_FOUND),
        ("/ui/endpoints/ep_x/rotate-secret", format!("csrf={csrf}"), StatusCode::BAD_REQUEST),
    ];
    for (path, form, expected) in posts {
        let page = ui.post(path, &session, &form).await;
        assert_eq!(page.status, expected, "{path} {form}: {}", page.body);
    }
    let json = Request::post("/ui/sign-out").header(header::COOKIE, &session).header(header::CONTENT_TYPE, "application/json").body(Body::from("{}")).unwrap();
    assert_eq!(ui.send(json).await.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let retried = ui.post("/ui/failed-messages/retry", &session, &format!("csrf={csrf}&scope=matching")).await;
    assert_eq!(retried.status, StatusCode::SEE_OTHER, "an empty bulk retry is fine: {}", retried.body);
}

#[tokio::test]
async fn what_customers_wrote_is_escaped_and_other_projects_stay_hidden() {
    let ui = Ui::new().await;
    let (project, key) = ui.project("Shop").await;
    let (_, other_key) = ui.project("Other").await;
    let client = ui.pool.get().await.unwrap();
    let headers = Default::default();
    let endpoint = endpoints::create_endpoint(
        &**client,
        project,
        NewEndpoint {
            url: "http://127.0.0.1:9/hook",
            description: "<script>alert(1)</script>",
            enabled: true,
            rate_limit_per_second: None,
            headers: &headers,
            secret: railhook_core::EndpointSecret::generate().as_str(),
        },
    )
    .await
    .unwrap();
    let mine = ui.sign_in(&key).await;
    let page = ui.get("/ui/endpoints", &mine).await;
    assert!(page.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{}", page.body);
    assert!(!page.body.contains("<script>alert"));
    let theirs = ui.sign_in(&other_key).await;
    let page = ui.get("/ui/endpoints", &theirs).await;
    assert!(!page.body.contains(&endpoint.id.to_string()), "another project's Endpoint is not listed");
    let csrf = ui.csrf(&theirs).await;
    let rotate = ui.post(&format!("/ui/endpoints/{}/rotate-secret", endpoint.id), &theirs, &format!("csrf={csrf}")).await;
    assert_eq!(rotate.status, StatusCode::NOT_FOUND);
    // The owner's token does not work in the other session.
    let mine_csrf = ui.csrf(&mine).await;
    let forged = ui.post(&format!("/ui/endpoints/{}/rotate-secret", endpoint.id), &theirs, &format!("csrf={mine_csrf}")).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn the_operator_lists_every_project_and_chooses_one() {
    let ui = Ui::new().await;
    let (project, _) = ui.project("Shop").await;
    let session = ui.sign_in(&ui.operator).await;
    let overview = ui.get("/ui/", &session).await;
    assert_eq!(overview.status, StatusCode::SEE_OTHER);
    assert_eq!(overview.headers[header::LOCATION], "/ui/projects");
    let list = ui.get("/ui/projects", &session).await;
    assert!(list.body.contains(&project.to_string()) && list.body.contains("Shop"));
    let csrf = csrf_of(&list);
    let missing = ui.post("/ui/projects/select", &session, &format!("csrf={csrf}&project={}", ProjectId::new())).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let chosen = ui.post("/ui/projects/select", &session, &format!("csrf={csrf}&project={project}")).await;
    assert_eq!(chosen.status, StatusCode::SEE_OTHER);
    let choice = format!("{session}; rh_project={}", set_cookie(&chosen, "rh_project"));
    let overview = ui.get("/ui/", &choice).await;
    assert_eq!(overview.status, StatusCode::OK, "{}", overview.body);
    assert!(overview.body.contains(&project.to_string()));
}

#[tokio::test]
async fn lists_are_cursor_paginated() {
    let ui = Ui::new().await;
    let (project, key) = ui.project("Shop").await;
    let client = ui.pool.get().await.unwrap();
    let headers = Default::default();
    let secret = railhook_core::EndpointSecret::generate();
    let mut ids = Vec::new();
    for i in 0..51 {
        let new = NewEndpoint {
            url: "http://127.0.0.1:9/hook",
            description: &format!("endpoint {i}"),
            enabled: true,
            rate_limit_per_second: None,
            headers: &headers,
            secret: secret.as_str(),
        };
        ids.push(endpoints::create_endpoint(&**client, project, new).await.unwrap().id);
    }
    let session = ui.sign_in(&key).await;
    let first = ui.get("/ui/endpoints", &session).await;
    assert_eq!(first.body.matches("data-endpoint=").count(), 50);
    let next = format!("/ui/endpoints?cursor={}", ids[49]);
    assert!(first.body.contains(&format!("href=\"{next}\"")), "a next link after the 50th");
    let second = ui.get(&next, &session).await;
    assert_eq!(second.body.matches("data-endpoint=").count(), 1);
    assert!(second.body.contains(&ids[50].to_string()) && !second.body.contains("rel=\"next\""));
}

/// A Source named with markup, a Destination, and one Incoming Event whose header and body
/// carry markup too; its Forward set to FAILED as the worker would leave it.
async fn incoming_fixture(ui: &Ui, project: ProjectId) -> (railhook_core::SourceId, railhook_core::IncomingEventId, railhook_core::ForwardId) {
    use railhook_store::incoming::{self, NewIncomingEvent, Received, StoredHeader};
    use railhook_store::sources::{self, DestinationAuth, NewDestination, NewSource};
    let client = ui.pool.get().await.unwrap();
    let new = NewSource { name: "<b>Stripe</b>", provider: "stripe", config: None, secret: "whsec_test", enabled: true, rate_limit_per_second: None };
    let source = sources::create_source(&**client, project, new).await.unwrap();
    let dest = NewDestination { url: "http://127.0.0.1:9/in", auth: &DestinationAuth::None, enabled: true, rate_limit_per_second: None };
    sources::create_destination(&**client, project, source.id, dest).await.unwrap().unwrap();
    let headers = [StoredHeader::new("x-note", b"<i>hi</i>")];
    let new = NewIncomingEvent {
        project,
        source: source.id,
        provider_event_id: Some("evt_1"),
        method: "POST",
        headers: &headers,
        body: b"{\"a\":\"<script>x</script>\"}",
        content_type: Some("application/json"),
        trace: None,
    };
    let Received::Stored { id, forwards, .. } = incoming::receive(&client, new).await.unwrap() else { panic!("stored") };
    let forward = forwards[0].0;
    client
        .execute("UPDATE forwards SET status = 'FAILED', completed_at = now(), last_error = 'HTTP 500' WHERE id = $1", &[&forward.0])
        .await
        .unwrap();
    (source.id, id, forward)
}

#[tokio::test]
async fn incoming_pages_show_sources_events_and_forwards_escaped_and_retry_a_failed_forward() {
    let ui = Ui::new().await;
    let (project, key) = ui.project("Shop").await;
    let (source, event, forward) = incoming_fixture(&ui, project).await;
    let session = ui.sign_in(&key).await;
    let sources = ui.get("/ui/sources", &session).await;
    assert_eq!(sources.status, StatusCode::OK, "{}", sources.body);
    assert!(sources.body.contains("&lt;b&gt;Stripe&lt;/b&gt;") && sources.body.contains("/ingress/") && sources.body.contains("stripe"));
    let one = ui.get(&format!("/ui/sources/{source}"), &session).await;
    assert!(one.body.contains("http://127.0.0.1:9/in"), "{}", one.body);
    assert!(!one.body.contains("opened "), "no Attempt yet: the circuit is closed");
    // Three failed Attempts recorded by the breaker's own rules open the Destination's circuit.
    let client = ui.pool.get().await.unwrap();
    let destination: uuid::Uuid = client.query_one("SELECT id FROM destinations WHERE source_id = $1", &[&source.0]).await.unwrap().get(0);
    let change: String = client
        .query_one(
            "SELECT railhook_circuit_record_many($1, 'destination', ARRAY[gen_random_uuid(), gen_random_uuid(), gen_random_uuid()], ARRAY[false, false, false], 60, 3, 0.5)",
            &[&destination],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(change, "opened");
    let one = ui.get(&format!("/ui/sources/{source}"), &session).await;
    let row = one.body.split(&format!("data-destination=\"{}\"", railhook_core::DestinationId(destination))).nth(1).expect("the Destination's row");
    let row = row.split("</tr>").next().unwrap();
    assert!(row.contains("<td>open<br>") && row.contains("opened "), "{row}");
    let list = ui.get(&format!("/ui/incoming?source_id={source}&provider_event_id=evt_1"), &session).await;
    assert!(list.body.contains(&event.to_string()), "{}", list.body);
    let none = ui.get("/ui/incoming?provider_event_id=evt_2", &session).await;
    assert!(!none.body.contains(&event.to_string()));
    let detail = ui.get(&format!("/ui/incoming/{event}"), &session).await;
    assert!(detail.body.contains("&lt;i&gt;hi&lt;/i&gt;") && detail.body.contains("&lt;script&gt;x&lt;/script&gt;"), "{}", detail.body);
    assert!(!detail.body.contains("<script>x"));
    assert!(detail.body.contains(&forward.to_string()) && detail.body.contains("FAILED"));
    let failed = ui.get("/ui/failed-forwards", &session).await;
    assert!(failed.body.contains(&forward.to_string()), "{}", failed.body);
    let csrf = csrf_of(&detail);
    let retried = ui.post(&format!("/ui/forwards/{forward}/retry"), &session, &format!("csrf={csrf}")).await;
    assert_eq!(retried.status, StatusCode::SEE_OTHER, "{}", retried.body);
    assert_eq!(retried.headers[header::LOCATION], format!("/ui/incoming/{event}?retried=1"));
    let again = ui.post(&format!("/ui/forwards/{forward}/retry"), &session, &format!("csrf={csrf}")).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    // Another project sees none of it.
    let (_, other) = ui.project("Other").await;
    let theirs = ui.sign_in(&other).await;
    assert_eq!(ui.get(&format!("/ui/incoming/{event}"), &theirs).await.status, StatusCode::NOT_FOUND);
    assert_eq!(ui.get(&format!("/ui/sources/{source}"), &theirs).await.status, StatusCode::NOT_FOUND);
    assert!(!ui.get("/ui/failed-forwards", &theirs).await.body.contains(&forward.to_string()));
}

#[tokio::test]
async fn incoming_and_relay_pages_refuse_bad_input_with_a_4xx() {
    let ui = Ui::new().await;
    let (_, key) = ui.project("Shop").await;
    let session = ui.sign_in(&key).await;
    let csrf = ui.csrf(&session).await;
    let gets = [
        ("/ui/sources/nope", StatusCode::BAD_REQUEST),
        (&format!("/ui/sources/{}", railhook_core::SourceId::new()) as &str, StatusCode::NOT_FOUND),
        ("/ui/sources?cursor=zzz", StatusCode::BAD_REQUEST),
        ("/ui/incoming/nope", StatusCode::BAD_REQUEST),
        (&format!("/ui/incoming/{}", railhook_core::IncomingEventId::new()) as &str, StatusCode::NOT_FOUND),
        ("/ui/incoming?source_id=ep_x", StatusCode::BAD_REQUEST),
        ("/ui/incoming?received_after=2026-01-02T00:00&received_before=2026-01-01T00:00", StatusCode::BAD_REQUEST),
        ("/ui/failed-forwards?destination_id=zzz", StatusCode::BAD_REQUEST),
        ("/ui/failed-forwards?cursor=zzz", StatusCode::BAD_REQUEST),
        ("/ui/relay", StatusCode::FORBIDDEN),
    ];
    for (path, expected) in gets {
        let page = ui.get(path, &session).await;
        assert_eq!(page.status, expected, "{path}: {}", page.body);
    }
    let posts = [
        ("/ui/forwards/nope/retry", format!("csrf={csrf}"), StatusCode::BAD_REQUEST),
        (&format!("/ui/forwards/{}/retry", railhook_core::ForwardId::new()) as &str, format!("csrf={csrf}"), StatusCode::NOT_FOUND),
        (&format!("/ui/forwards/{}/retry", railhook_core::ForwardId::new()) as &str, String::new(), StatusCode::FORBIDDEN),
        ("/ui/failed-forwards/retry", format!("csrf={csrf}&scope=selected"), StatusCode::BAD_REQUEST),
        ("/ui/failed-forwards/retry", format!("csrf={csrf}&scope=selected&id=zzz"), StatusCode::BAD_REQUEST),
        ("/ui/failed-forwards/retry", format!("csrf={csrf}&scope=other"), StatusCode::BAD_REQUEST),
    ];
    for (path, form, expected) in posts {
        let page = ui.post(path, &session, &form).await;
        assert_eq!(page.status, expected, "{path} {form}: {}", page.body);
    }
    let all = ui.post("/ui/failed-forwards/retry", &session, &format!("csrf={csrf}&scope=matching")).await;
    assert_eq!(all.status, StatusCode::SEE_OTHER, "{}", all.body);
}

#[tokio::test]
async fn the_operator_sees_the_slot_on_the_relay_page() {
    let ui = Ui::new().await;
    let session = ui.sign_in(&ui.operator).await;
    let page = ui.get("/ui/relay", &session).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    // No relay runs in this test: the slot does not exist, and the page says so.
    assert!(page.body.contains("wal_status") && page.body.contains("missing") && page.body.contains("id=\"current-lsn\""), "{}", page.body);
    assert!(!page.body.contains(" style="), "no inline style");
}

/// The lists that start their id-order scan at a bound (creation time, the oldest PENDING or
/// PROCESSING) still show every match, the oldest included.
#[tokio::test]
async fn status_and_time_filtered_lists_miss_nothing() {
    let ui = Ui::new().await;
    let (project, key) = ui.project("Shop").await;
    let client = ui.pool.get().await.unwrap();
    let headers = Default::default();
    let secret = railhook_core::EndpointSecret::generate();
    let new = NewEndpoint { url: "http://127.0.0.1:9/hook", description: "e", enabled: true, rate_limit_per_second: None, headers: &headers, secret: secret.as_str() };
    let endpoint = endpoints::create_endpoint(&**client, project, new).await.unwrap().id;
    let mut ids = std::collections::HashMap::new();
    for status in ["PENDING", "SUCCESS", "PROCESSING", "PENDING2"] {
        let row = client
            .query_one(
                "WITH ev AS (INSERT INTO events (id, project_id, event_type, payload) VALUES (railhook_uuid_v7(), $1, 'order.paid', '{}') RETURNING id)
                 INSERT INTO deliveries (id, project_id, event_id, endpoint_id, status, max_attempts, retry_delays, timeout_seconds, next_retry_at)
                 SELECT railhook_uuid_v7(), $1, ev.id, $2, $3::text::delivery_status, 5, '{1}', 30, now() FROM ev RETURNING id",
                &[&project.0, &endpoint.0, &status.trim_end_matches('2')],
            )
            .await
            .unwrap();
        ids.insert(status, DeliveryId(row.get(0)).to_string());
    }
    // A PROCESSING Delivery holds a Claim, whose row the claim writes with it (migration 0032).
    client
        .batch_execute(
            "UPDATE deliveries SET claim_token = gen_random_uuid(), claimed_at = now() WHERE status = 'PROCESSING';
             INSERT INTO delivery_claims (project_id, endpoint_id, delivery_id, claim_token)
             SELECT project_id, endpoint_id, id, claim_token FROM deliveries WHERE status = 'PROCESSING'",
        )
        .await
        .unwrap();
    let session = ui.sign_in(&key).await;
    let pending = ui.get("/ui/deliveries?status=PENDING", &session).await;
    assert!(pending.body.contains(&ids["PENDING"]) && pending.body.contains(&ids["PENDING2"]), "{}", pending.body);
    assert!(!pending.body.contains(&ids["SUCCESS"]));
    let processing = ui.get("/ui/deliveries?status=PROCESSING", &session).await;
    assert!(processing.body.contains(&ids["PROCESSING"]) && !processing.body.contains(&ids["PENDING"]));
    let hour_ago = (chrono::Utc::now() - chrono::Duration::hours(1)).format("%Y-%m-%dT%H:%M").to_string();
    let recent = ui.get(&format!("/ui/deliveries?created_after={hour_ago}"), &session).await;
    assert_eq!(ids.values().filter(|id| recent.body.contains(id.as_str())).count(), 4, "{}", recent.body);
    let later = (chrono::Utc::now() + chrono::Duration::minutes(2)).format("%Y-%m-%dT%H:%M").to_string();
    assert!(ui.get(&format!("/ui/deliveries?created_after={later}"), &session).await.body.contains("No Delivery matches"));
    client.execute("UPDATE deliveries SET status = 'SUCCESS' WHERE status = 'PROCESSING'", &[]).await.unwrap();
    assert!(ui.get("/ui/deliveries?status=PROCESSING", &session).await.body.contains("No Delivery matches"));
}

#[tokio::test]
async fn a_deliverys_page_shows_each_attempts_request_headers_escaped() {
    let ui = Ui::new().await;
    let (project, key) = ui.project("Shop").await;
    let client = ui.pool.get().await.unwrap();
    let headers = Default::default();
    let endpoint = endpoints::create_endpoint(
        &**client,
        project,
        NewEndpoint { url: "http://127.0.0.1:9/hook", description: "", enabled: true, rate_limit_per_second: None, headers: &headers, secret: railhook_core::EndpointSecret::generate().as_str() },
    )
    .await
    .unwrap();
    let sub = railhook_store::subscriptions::NewSubscription {
        endpoint_id: endpoint.id,
        event_type_pattern: "**",
        ordering: false,
        max_attempts: 3,
        timeout_seconds: 5,
        retry_delays: None,
        enabled: true,
    };
    railhook_store::subscriptions::create_subscription(&**client, project, sub).await.unwrap().unwrap();
    let ty = railhook_core::pattern::EventType::parse("order.paid").unwrap();
    let payload = serde_json::json!({});
    let new = railhook_store::events::NewEvent {
        caller: railhook_store::events::Caller::Project(project),
        event_type: "order.paid",
        payload: &payload,
        idempotency_key: None,
        request_sha256: vec![0; 32],
        candidate_patterns: railhook_core::pattern::candidate_patterns(&ty),
        trace: railhook_core::TraceContext::from_text(Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), None),
    };
    let railhook_store::events::IngestOutcome::Created(event) = railhook_store::events::ingest(&client, new).await.unwrap() else { panic!("created") };
    let delivery: uuid::Uuid = client.query_one("SELECT id FROM deliveries WHERE event_id = $1", &[&event.id.0]).await.unwrap().get(0);
    client
        .execute(
            "INSERT INTO attempts (id, project_id, delivery_id, attempt_number, started_at, duration_ms, status_code, result, request_headers, response_body)
             VALUES ($1, $2, $3, 1, now(), 12, 500, 'http_status',
                     '{\"webhook-signature\": \"v1,c2ln\", \"authorization\": \"<redacted>\", \"x-note\": \"<b>hi</b>\"}', 'down')",
            &[&uuid::Uuid::now_v7(), &project.0, &delivery],
        )
        .await
        .unwrap();
    let session = ui.sign_in(&key).await;
    let page = ui.get(&format!("/ui/deliveries/{}", DeliveryId(delivery)), &session).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("Request headers"), "{}", page.body);
    assert!(page.body.contains("v1,c2ln"));
    assert!(page.body.contains("&lt;redacted&gt;"));
    assert!(page.body.contains("&lt;b&gt;hi&lt;/b&gt;") && !page.body.contains("<b>hi</b>"), "escaped");
    // The Event's trace id, linked to the configured trace viewer (ui.trace_url_template).
    assert!(page.body.contains(r#"href="http://jaeger.test:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736""#), "{}", page.body);
}
