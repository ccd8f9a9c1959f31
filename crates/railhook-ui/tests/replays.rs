//! The Time Machine page (`/ui/replays`) against a real Postgres, request by request: the
//! estimate (dry run) before the confirmation, starting a Replay (CSRF, one running per
//! project), its progress as the runner's batches advance it (`run_batch`, as the worker
//! calls it), cancelling, tenancy, pagination and bad input as a precise 4xx. The browser
//! flow is tests/ui/specs/replays.spec.mjs.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use chrono::{Duration, Utc};
use railhook_core::{EndpointId, ProjectId, ReplayId};
use railhook_store::endpoints::{self, NewEndpoint};
use railhook_store::replays::{self, ReplayFilter};
use railhook_store::subscriptions::{self, NewSubscription};
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
        let config = test_config(&db);
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

    async fn project(&self, name: &str) -> (ProjectId, String) {
        let client = self.pool.get().await.unwrap();
        let org = tenancy::create_organization(&**client, "Acme").await.unwrap();
        let project = tenancy::create_project(&**client, org.id, name).await.unwrap().unwrap();
        let key = tenancy::create_api_key(&**client, project.id, "ui").await.unwrap().unwrap();
        (project.id, key.secret)
    }

    async fn sign_in(&self, credential: &str) -> String {
        let form = self.get("/ui/sign-in", "").await;
        let token = set_cookie(&form, "rh_signin");
        let body = format!("csrf={token}&credential={}", enc(credential));
        let signed = self.post("/ui/sign-in", &format!("rh_signin={token}"), &body).await;
        assert_eq!(signed.status, StatusCode::SEE_OTHER, "{}", signed.body);
        format!("rh_session={}", set_cookie(&signed, "rh_session"))
    }

    /// An Endpoint subscribed to `pattern`.
    async fn endpoint(&self, project: ProjectId, pattern: &str) -> EndpointId {
        let client = self.pool.get().await.unwrap();
        let headers = Default::default();
        let secret = railhook_core::EndpointSecret::generate();
        let new = NewEndpoint { url: "http://127.0.0.1:9/hook", description: pattern, enabled: true, rate_limit_per_second: None, headers: &headers, secret: secret.as_str() };
        let id = endpoints::create_endpoint(&**client, project, new).await.unwrap().id;
        let sub = NewSubscription { endpoint_id: id, event_type_pattern: pattern, ordering: false, max_attempts: 5, timeout_seconds: 30, retry_delays: None, enabled: true };
        subscriptions::create_subscription(&**client, project, sub).await.unwrap().unwrap();
        id
    }

    /// `n` stored Events of `event_type` (no Delivery: a Replay makes them).
    async fn events(&self, project: ProjectId, event_type: &str, n: i32) {
        let client = self.pool.get().await.unwrap();
        client
            .execute(
                "INSERT INTO events (id, project_id, event_type, payload) SELECT railhook_uuid_v7(), $1, $2, '{}' FROM generate_series(1, $3)",
                &[&project.0, &event_type, &n],
            )
            .await
            .unwrap();
    }

    /// One batch of the runner, as the worker runs it.
    async fn run_batch(&self) -> Option<replays::Batch> {
        let mut client = self.pool.get().await.unwrap();
        replays::run_batch(&mut client, 100).await.unwrap()
    }
}

fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

fn csrf_of(page: &Page) -> String {
    let at = page.body.find("name=\"csrf\" value=\"").expect("a form with a token") + 19;
    page.body[at..].split('"').next().unwrap().to_string()
}

fn set_cookie(page: &Page, name: &str) -> String {
    page.headers
        .get_all(header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| v.strip_prefix(&format!("{name}=")).map(|rest| rest.split(';').next().unwrap_or("").to_string()))
        .unwrap_or_else(|| panic!("no Set-Cookie for {name}"))
}

/// The estimate's figure of Deliveries.
fn estimated(page: &Page) -> String {
    let at = page.body.find("id=\"estimate-deliveries\">").unwrap_or_else(|| panic!("no estimate: {}", page.body)) + 25;
    page.body[at..].split('<').next().unwrap().to_string()
}

/// "made / total" as the progress shows it.
fn progress(page: &Page) -> (String, String) {
    let field = |class: &str| {
        let marker = format!("class=\"{class}\">");
        let at = page.body.find(&marker).unwrap_or_else(|| panic!("no {class}: {}", page.body)) + marker.len();
        page.body[at..].split('<').next().unwrap().to_string()
    };
    (field("made"), field("total"))
}

fn hour_ago() -> String {
    enc(&(Utc::now() - Duration::hours(1)).format("%Y-%m-%dT%H:%M").to_string())
}

#[tokio::test]
async fn estimate_then_start_watch_it_complete_and_cancel_another() {
    let ui = Ui::new().await;
    let (project, key) = ui.project("Shop").await;
    let orders = ui.endpoint(project, "order.*").await;
    let billing = ui.endpoint(project, "invoice.*").await;
    ui.events(project, "order.paid", 3).await;
    ui.events(project, "invoice.created", 2).await;
    let session = ui.sign_in(&key).await;

    let page = ui.get("/ui/replays", &session).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("Time Machine") && page.body.contains("No Replay yet"), "{}", page.body);
    assert!(page.body.contains(&format!("value=\"{orders}\"")) && page.body.contains(&format!("value=\"{billing}\"")), "the Endpoints are offered");
    assert!(page.body.contains("href=\"/ui/replays\" aria-current=\"page\""), "the navigation marks the page");

    // The dry run: by type, by Endpoint, both, nothing.
    let from = hour_ago();
    let est = ui.get(&format!("/ui/replays/estimate?from={from}&to=&event_types=order.*"), &session).await;
    assert_eq!((est.status, estimated(&est).as_str()), (StatusCode::OK, "3"), "{}", est.body);
    assert!(est.body.contains("Start the Replay"));
    let all = ui.get(&format!("/ui/replays/estimate?from={from}"), &session).await;
    assert_eq!(estimated(&all), "5");
    let one = ui.get(&format!("/ui/replays/estimate?from={from}&event_types=**&endpoint_id={billing}"), &session).await;
    assert_eq!(estimated(&one), "2");
    assert!(one.body.contains(&format!("name=\"endpoint_id\" value=\"{billing}\"")), "the confirmation carries the choice");
    // A count past its cap is a lower bound, and says so.
    let client = ui.pool.get().await.unwrap();
    let every = ReplayFilter { from: Utc::now() - Duration::hours(1), to: Utc::now(), event_types: None, endpoint_ids: None };
    let capped = replays::count_upto(&client, project, &every, 4).await.unwrap();
    assert_eq!((capped.events, capped.capped), (4, true));
    assert_eq!(replays::count(&client, project, &every).await.unwrap(), replays::ReplayCount { deliveries: 5, events: 5, capped: false });
    let none = ui.get(&format!("/ui/replays/estimate?from={from}&event_types=order.*&endpoint_id={billing}"), &session).await;
    assert_eq!(estimated(&none), "0");
    assert!(none.body.contains("Nothing to replay") && !none.body.contains("Start the Replay"));

    // Start it: only with the session's token.
    let form = format!("from={from}&to=&event_types=order.*");
    assert_eq!(ui.post("/ui/replays", &session, &form).await.status, StatusCode::FORBIDDEN);
    let csrf = csrf_of(&est);
    let started = ui.post("/ui/replays", &session, &format!("csrf={csrf}&{form}")).await;
    assert_eq!(started.status, StatusCode::SEE_OTHER, "{}", started.body);
    let location = started.headers[header::LOCATION].to_str().unwrap().to_string();
    let id: ReplayId = location.trim_start_matches("/ui/replays/").trim_end_matches("?started=1").parse().expect("a replay id");
    let again = ui.post("/ui/replays", &session, &format!("csrf={csrf}&{form}")).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "one running Replay per project");
    assert!(again.body.contains(&id.to_string()));
    let blocked = ui.get(&format!("/ui/replays/estimate?from={from}"), &session).await;
    assert!(blocked.body.contains("Running now") && !blocked.body.contains("Start the Replay"), "{}", blocked.body);

    let running = ui.get(&location, &session).await;
    assert_eq!(running.status, StatusCode::OK, "{}", running.body);
    assert!(running.body.contains("Started.") && running.body.contains("running") && running.body.contains("data-refresh-seconds=\"3\""));
    assert_eq!(progress(&running), ("0".into(), "3".into()));
    assert!(running.body.contains("Cancel the Replay"));

    // The runner's batch completes it: made == total, no more reloads, nothing to cancel.
    let batch = ui.run_batch().await.expect("a batch");
    assert!(batch.finished && batch.made == 3, "{batch:?}");
    let done = ui.get(&format!("/ui/replays/{id}"), &session).await;
    assert!(done.body.contains("completed") && !done.body.contains("data-refresh-seconds"), "{}", done.body);
    assert_eq!(progress(&done), ("3".into(), "3".into()));
    assert!(!done.body.contains("Cancel the Replay"));
    let late = ui.post(&format!("/ui/replays/{id}/cancel"), &session, &format!("csrf={csrf}")).await;
    assert_eq!(late.status, StatusCode::CONFLICT);
    assert!(late.body.contains("completed"), "{}", late.body);
    let made: i64 = ui.pool.get().await.unwrap().query_one("SELECT count(*) FROM deliveries WHERE replay_id = $1", &[&id.0]).await.unwrap().get(0);
    assert_eq!(made, 3);

    // Another one, cancelled before the runner gets to it: nothing is made.
    let second = ui.post("/ui/replays", &session, &format!("csrf={csrf}&from={from}&to=")).await;
    assert_eq!(second.status, StatusCode::SEE_OTHER, "{}", second.body);
    let second: ReplayId = second.headers[header::LOCATION].to_str().unwrap().trim_start_matches("/ui/replays/").trim_end_matches("?started=1").parse().unwrap();
    assert_eq!(progress(&ui.get(&format!("/ui/replays/{second}"), &session).await).1, "5");
    let cancelled = ui.post(&format!("/ui/replays/{second}/cancel"), &session, &format!("csrf={csrf}")).await;
    assert_eq!(cancelled.status, StatusCode::SEE_OTHER, "{}", cancelled.body);
    assert_eq!(cancelled.headers[header::LOCATION], format!("/ui/replays/{second}?cancelled=1"));
    assert!(ui.run_batch().await.is_none(), "nothing runs");
    let after = ui.get(&format!("/ui/replays/{second}?cancelled=1"), &session).await;
    assert!(after.body.contains("cancelled") && after.body.contains("Cancelled:"), "{}", after.body);
    assert_eq!(progress(&after), ("0".into(), "5".into()));

    let list = ui.get("/ui/replays", &session).await;
    let (a, b) = (list.body.find(&format!("data-replay=\"{id}\"")).expect("first"), list.body.find(&format!("data-replay=\"{second}\"")).expect("second"));
    assert!(a < b, "oldest first");

    // Another project sees none of it.
    let (_, other) = ui.project("Other").await;
    let theirs = ui.sign_in(&other).await;
    assert_eq!(ui.get(&format!("/ui/replays/{id}"), &theirs).await.status, StatusCode::NOT_FOUND);
    let their_csrf = csrf_of(&ui.get("/ui/replays", &theirs).await);
    assert_eq!(ui.post(&format!("/ui/replays/{second}/cancel"), &theirs, &format!("csrf={their_csrf}")).await.status, StatusCode::NOT_FOUND);
    assert!(!ui.get("/ui/replays", &theirs).await.body.contains(&id.to_string()));
    let foreign = ui.get(&format!("/ui/replays/estimate?from={from}&endpoint_id={orders}"), &theirs).await;
    assert_eq!(foreign.status, StatusCode::BAD_REQUEST, "another project's Endpoint is unknown");
}

#[tokio::test]
async fn bad_input_is_a_precise_4xx_never_a_500() {
    let ui = Ui::new().await;
    let (_, key) = ui.project("Shop").await;
    let session = ui.sign_in(&key).await;
    let csrf = csrf_of(&ui.get("/ui/replays", &session).await);
    let from = hour_ago();
    let soon = enc(&(Utc::now() + Duration::hours(1)).format("%Y-%m-%dT%H:%M").to_string());
    let long_ago = enc(&(Utc::now() - Duration::days(40)).format("%Y-%m-%dT%H:%M").to_string());
    let gets = [
        "/ui/replays/estimate".to_string(),
        "/ui/replays/estimate?from=yesterday".to_string(),
        format!("/ui/replays/estimate?from={soon}"),
        format!("/ui/replays/estimate?from={from}&to={from}"),
        format!("/ui/replays/estimate?from={long_ago}"),
        format!("/ui/replays/estimate?from={from}&event_types=a..b"),
        format!("/ui/replays/estimate?from={from}&endpoint_id=evt_x"),
        format!("/ui/replays/estimate?from={from}&endpoint_id={}", EndpointId::new()),
        format!("/ui/replays/estimate?from={from}&event_types={}", enc(&vec!["a"; 51].join(" "))),
        "/ui/replays/not-an-id".to_string(),
        "/ui/replays?cursor=zzz".to_string(),
    ];
    for path in gets {
        let page = ui.get(&path, &session).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{path}: {}", page.body);
    }
    assert_eq!(ui.get(&format!("/ui/replays/{}", ReplayId::new()), &session).await.status, StatusCode::NOT_FOUND);
    let posts = [
        ("/ui/replays".to_string(), format!("from={from}"), StatusCode::FORBIDDEN),
        ("/ui/replays".to_string(), format!("csrf={csrf}"), StatusCode::BAD_REQUEST),
        ("/ui/replays".to_string(), format!("csrf={csrf}&from={from}&event_types=a..b"), StatusCode::BAD_REQUEST),
        ("/ui/replays/nope/cancel".to_string(), format!("csrf={csrf}"), StatusCode::BAD_REQUEST),
        (format!("/ui/replays/{}/cancel", ReplayId::new()), format!("csrf={csrf}"), StatusCode::NOT_FOUND),
        (format!("/ui/replays/{}/cancel", ReplayId::new()), String::new(), StatusCode::FORBIDDEN),
    ];
    for (path, form, expected) in posts {
        let page = ui.post(&path, &session, &form).await;
        assert_eq!(page.status, expected, "{path} {form}: {}", page.body);
    }
    // An operator who has not chosen a project is sent to choose one.
    let operator = ui.sign_in(&ui.operator).await;
    let page = ui.get("/ui/replays", &operator).await;
    assert_eq!((page.status, page.headers[header::LOCATION].to_str().unwrap()), (StatusCode::SEE_OTHER, "/ui/projects"));
}

#[tokio::test]
async fn the_list_is_cursor_paginated() {
    let ui = Ui::new().await;
    let (project, key) = ui.project("Shop").await;
    let client = ui.pool.get().await.unwrap();
    let filter = ReplayFilter { from: Utc::now() - Duration::hours(1), to: Utc::now(), event_types: None, endpoint_ids: None };
    let count = replays::count(&client, project, &filter).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..51 {
        let replays::CreateOutcome::Created(r) = replays::create(&client, project, &filter, count).await.unwrap() else { panic!("created") };
        assert!(matches!(replays::cancel(&client, project, r.id).await.unwrap(), replays::CancelOutcome::Cancelled(_)));
        ids.push(r.id);
    }
    let session = ui.sign_in(&key).await;
    let first = ui.get("/ui/replays", &session).await;
    assert_eq!(first.body.matches("data-replay=").count(), 50);
    let next = format!("/ui/replays?cursor={}", ids[49]);
    assert!(first.body.contains(&format!("href=\"{next}\"")), "a next link after the 50th");
    let second = ui.get(&next, &session).await;
    assert_eq!(second.body.matches("data-replay=").count(), 1);
    assert!(second.body.contains(&ids[50].to_string()) && !second.body.contains("rel=\"next\""));
}
