//! `GET/PATCH /v1/admin/projects/{project_id}`: a Project's retention overrides (issue 17)
//! through the admin API, against the real Postgres, and what the worker's retention job
//! (`railhook_store::retention`) then reads.

mod common;

use common::{uuid_of, Api, TestProject};
use railhook_store::retention;
use serde_json::{json, Value};

fn path(project: &str) -> String {
    format!("/v1/admin/projects/{project}")
}

async fn admin_get(api: &Api, project: &str) -> (u16, Value) {
    api.get(&api.config.api.admin_token, &path(project)).await
}

async fn admin_patch(api: &Api, project: &str, body: Value) -> (u16, Value) {
    let resp = api.http.patch(api.url(&path(project))).bearer_auth(&api.config.api.admin_token).json(&body).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// The `retention` of a Project as the API answers it.
fn retention_of(body: &Value) -> (Value, Value, Value, Value) {
    let r = &body["retention"];
    (r["events_days"].clone(), r["failed_days"].clone(), r["effective_events_days"].clone(), r["effective_failed_days"].clone())
}

/// The configured defaults of the test configuration, as JSON numbers.
fn defaults(api: &Api) -> (Value, Value) {
    (json!(api.config.retention.events_days), json!(api.config.retention.failed_days))
}

/// The columns the worker reads, straight from the table.
async fn columns(api: &Api, p: &TestProject) -> (Option<f64>, Option<f64>) {
    let row = api
        .db
        .client()
        .await
        .query_one("SELECT retention_events_days, retention_failed_days FROM projects WHERE id = $1", &[&uuid_of(&p.id)])
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn a_new_project_has_no_overrides_and_the_configured_periods() {
    let api = Api::start().await;
    let p = api.project().await;
    let (status, body) = admin_get(&api, &p.id).await;
    assert_eq!(status, 200, "{body}");
    // The Project as the create answers it.
    assert_eq!(body["id"], p.id.as_str());
    assert_eq!(body["name"], "shop");
    assert!(body["organization_id"].as_str().unwrap().starts_with("org_"), "{body}");
    assert!(body["created_at"].is_string(), "{body}");
    assert!(body.get("api_key").is_none(), "no key, and never a secret: {body}");
    let (events_default, failed_default) = defaults(&api);
    assert_eq!(retention_of(&body), (Value::Null, Value::Null, events_default, failed_default), "{body}");
}

#[tokio::test]
async fn setting_both_periods_reads_back_and_reaches_the_table() {
    let api = Api::start().await;
    let p = api.project().await;
    let (status, body) = admin_patch(&api, &p.id, json!({"retention": {"events_days": 7, "failed_days": 0.25}})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["id"], p.id.as_str());
    assert_eq!(body["name"], "shop");
    assert_eq!(retention_of(&body), (json!(7.0), json!(0.25), json!(7.0), json!(0.25)), "{body}");

    let (status, got) = admin_get(&api, &p.id).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(retention_of(&got), (json!(7.0), json!(0.25), json!(7.0), json!(0.25)), "{got}");
    assert_eq!(columns(&api, &p).await, (Some(7.0), Some(0.25)));

    // The bounds themselves are accepted: at most 36500, anything above 0.
    let (status, body) = admin_patch(&api, &p.id, json!({"retention": {"events_days": 36500, "failed_days": 0.0001}})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(columns(&api, &p).await, (Some(36_500.0), Some(0.0001)));
}

#[tokio::test]
async fn null_clears_one_override_back_to_the_default() {
    let api = Api::start().await;
    let p = api.project().await;
    let (events_default, _) = defaults(&api);
    let (status, _) = admin_patch(&api, &p.id, json!({"retention": {"events_days": 7, "failed_days": 45}})).await;
    assert_eq!(status, 200);

    let (status, body) = admin_patch(&api, &p.id, json!({"retention": {"events_days": null}})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(retention_of(&body), (Value::Null, json!(45.0), events_default.clone(), json!(45.0)), "{body}");
    let (_, got) = admin_get(&api, &p.id).await;
    assert_eq!(retention_of(&got), (Value::Null, json!(45.0), events_default, json!(45.0)), "{got}");
    assert_eq!(columns(&api, &p).await, (None, Some(45.0)));

    // Both back to the defaults.
    let (status, body) = admin_patch(&api, &p.id, json!({"retention": {"events_days": null, "failed_days": null}})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(columns(&api, &p).await, (None, None));
}

#[tokio::test]
async fn a_partial_update_keeps_what_it_leaves_out() {
    let api = Api::start().await;
    let p = api.project().await;
    let other = api.project().await;
    let (status, _) = admin_patch(&api, &p.id, json!({"retention": {"events_days": 7}})).await;
    assert_eq!(status, 200);
    assert_eq!(columns(&api, &p).await, (Some(7.0), None));

    let (status, body) = admin_patch(&api, &p.id, json!({"retention": {"failed_days": 45}})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(retention_of(&body).0, json!(7.0), "events_days kept: {body}");
    assert_eq!(columns(&api, &p).await, (Some(7.0), Some(45.0)));

    // An empty retention object and an empty body change nothing.
    for empty in [json!({"retention": {}}), json!({})] {
        let (status, body) = admin_patch(&api, &p.id, empty.clone()).await;
        assert_eq!(status, 200, "{empty}: {body}");
        assert_eq!(retention_of(&body).0, json!(7.0), "{empty}: {body}");
        assert_eq!(columns(&api, &p).await, (Some(7.0), Some(45.0)), "{empty}");
    }
    // Another Project is untouched.
    assert_eq!(columns(&api, &other).await, (None, None));
}

#[tokio::test]
async fn bad_periods_are_422_naming_the_field_and_change_nothing() {
    let api = Api::start().await;
    let p = api.project().await;
    let (status, _) = admin_patch(&api, &p.id, json!({"retention": {"events_days": 7, "failed_days": 45}})).await;
    assert_eq!(status, 200);

    let cases = [
        (json!({"retention": {"events_days": 0}}), "retention.events_days"),
        (json!({"retention": {"events_days": -1}}), "retention.events_days"),
        (json!({"retention": {"events_days": 40000}}), "retention.events_days"),
        (json!({"retention": {"events_days": 36500.5}}), "retention.events_days"),
        (json!({"retention": {"events_days": -0.0}}), "retention.events_days"),
        (json!({"retention": {"events_days": "7"}}), "retention.events_days"),
        (json!({"retention": {"events_days": true}}), "retention.events_days"),
        (json!({"retention": {"failed_days": 0}}), "retention.failed_days"),
        (json!({"retention": {"failed_days": 40000}}), "retention.failed_days"),
        // A valid period with a bad one: nothing is written.
        (json!({"retention": {"events_days": 1, "failed_days": -1}}), "retention.failed_days"),
        // Unknown fields are refused, as on every body.
        (json!({"retention": {"event_days": 7}}), "retention.event_days"),
        (json!({"name": "renamed"}), "name"),
        // `retention` itself is an object, not null.
        (json!({"retention": null}), "retention"),
        (json!({"retention": 7}), "retention"),
    ];
    for (body, field) in cases {
        let (status, answer) = admin_patch(&api, &p.id, body.clone()).await;
        assert_eq!(status, 422, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_field", "{body}: {answer}");
        assert_eq!(answer["error"]["field"], field, "{body}: {answer}");
        assert_eq!(columns(&api, &p).await, (Some(7.0), Some(45.0)), "{body} changed the Project");
    }

    // Not a number JSON can carry: a 400, never a 500.
    let resp = api
        .http
        .patch(api.url(&path(&p.id)))
        .bearer_auth(&api.config.api.admin_token)
        .header("content-type", "application/json")
        .body(r#"{"retention": {"events_days": 1e400}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert_eq!(columns(&api, &p).await, (Some(7.0), Some(45.0)));
}

#[tokio::test]
async fn unknown_and_malformed_project_ids() {
    let api = Api::start().await;
    let p = api.project().await;
    let missing = railhook_core::ProjectId::new().to_string();
    let (status, body) = admin_get(&api, &missing).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("not_found")), "{body}");
    let (status, body) = admin_patch(&api, &missing, json!({"retention": {"events_days": 7}})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("not_found")), "{body}");

    // Malformed, or another kind of id: 400 naming the parameter, as `org_id` of the create.
    let org = railhook_core::OrganizationId::new().to_string();
    for bad in ["proj_x", "x", org.as_str()] {
        let (status, body) = admin_get(&api, bad).await;
        assert_eq!((status, body["error"]["code"].as_str(), body["error"]["field"].as_str()), (400, Some("invalid_id"), Some("project_id")), "{bad}: {body}");
        let (status, body) = admin_patch(&api, bad, json!({"retention": {"events_days": 7}})).await;
        assert_eq!((status, body["error"]["field"].as_str()), (400, Some("project_id")), "{bad}: {body}");
    }
    assert_eq!(columns(&api, &p).await, (None, None));
}

#[tokio::test]
async fn the_admin_token_is_required() {
    let api = Api::start().await;
    let p = api.project().await;
    let url = api.url(&path(&p.id));
    let body = json!({"retention": {"events_days": 7}});
    let cases: [(&str, Option<&str>); 3] = [("no token", None), ("wrong token", Some("wrong-token-wrong-token")), ("a project API key", Some(p.key.as_str()))];
    for (what, token) in cases {
        let mut get = api.http.get(&url);
        let mut patch = api.http.patch(&url).json(&body);
        if let Some(token) = token {
            get = get.bearer_auth(token);
            patch = patch.bearer_auth(token);
        }
        for request in [get, patch] {
            let resp = request.send().await.unwrap();
            assert_eq!(resp.status(), 401, "{what}");
            let answer: Value = resp.json().await.unwrap();
            assert_eq!(answer["error"]["code"], "unauthorized", "{what}: {answer}");
        }
    }
    assert_eq!(columns(&api, &p).await, (None, None), "nothing was written");

    // Without a configured token the admin routes are off: 403, whatever is sent.
    let db = railhook_testkit::TestDb::new().await;
    let mut config = railhook_testkit::test_config(&db);
    config.api.admin_token = String::new();
    let off = Api::start_with(db, config).await;
    let url = off.url(&path(&p.id));
    for request in [off.http.get(&url).bearer_auth("anything"), off.http.patch(&url).bearer_auth("anything").json(&body)] {
        let resp = request.send().await.unwrap();
        assert_eq!(resp.status(), 403);
        let answer: Value = resp.json().await.unwrap();
        assert_eq!(answer["error"]["code"], "admin_disabled", "{answer}");
    }
}

/// What the API sets is what the worker's retention job reads (`retention::projects`) and
/// deletes by (`retention::delete_events_batch` with the Project's cutoffs).
#[tokio::test]
async fn the_retention_job_sees_the_override() {
    let api = Api::start().await;
    let p = api.project().await;
    let other = api.project().await;
    let pool = railhook_store::connect_pool(&api.config.database).await.unwrap();
    let client = pool.get().await.unwrap();
    let defaults = retention::Periods { events_days: api.config.retention.events_days, failed_days: api.config.retention.failed_days };
    let periods_of = |all: &[(railhook_core::ProjectId, retention::Periods)], id: &str| {
        let id: railhook_core::ProjectId = id.parse().unwrap();
        all.iter().find(|(p, _)| *p == id).map(|(_, periods)| *periods).unwrap()
    };

    let all = retention::projects(&client, defaults).await.unwrap();
    assert_eq!(periods_of(&all, &p.id), defaults);
    assert_eq!(retention::overrides(&client, p.id.parse().unwrap(), false).await.unwrap(), Some(retention::Overrides::default()));

    let (status, body) = admin_patch(&api, &p.id, json!({"retention": {"events_days": 7, "failed_days": 14.5}})).await;
    assert_eq!(status, 200, "{body}");
    let all = retention::projects(&client, defaults).await.unwrap();
    assert_eq!(periods_of(&all, &p.id), retention::Periods { events_days: 7.0, failed_days: 14.5 });
    assert_eq!(periods_of(&all, &other.id), defaults, "another Project keeps the defaults");
    assert_eq!(
        retention::overrides(&client, p.id.parse().unwrap(), false).await.unwrap(),
        Some(retention::Overrides { events_days: Some(7.0), failed_days: Some(14.5) })
    );

    // An Event of 10 days (no Delivery: it goes by age alone) stays under the default of 30
    // days and goes under the override of 7.
    let (status, event) = api.post(&p.key, "/v1/events", json!({"type": "order.paid", "payload": {}})).await;
    assert_eq!(status, 201, "{event}");
    let event_id = uuid_of(event["id"].as_str().unwrap());
    api.db.client().await.execute("UPDATE events SET created_at = now() - interval '10 days' WHERE id = $1", &[&event_id]).await.unwrap();
    let now = retention::now(&client).await.unwrap();
    let project: railhook_core::ProjectId = p.id.parse().unwrap();
    let (deleted, _) = retention::delete_events_batch(&client, project, retention::Cutoffs::at(now, defaults), retention::EVENTS_START, 100, true).await.unwrap();
    assert_eq!(deleted.parents, 0, "the default of 30 days keeps it");
    let periods = periods_of(&retention::projects(&client, defaults).await.unwrap(), &p.id);
    let (deleted, _) = retention::delete_events_batch(&client, project, retention::Cutoffs::at(now, periods), retention::EVENTS_START, 100, true).await.unwrap();
    assert_eq!(deleted.parents, 1, "the override of 7 days deletes it");
    assert_eq!(api.count("SELECT count(*) FROM events").await, 0);

    // Cleared: the defaults again.
    let (status, _) = admin_patch(&api, &p.id, json!({"retention": {"events_days": null, "failed_days": null}})).await;
    assert_eq!(status, 200);
    assert_eq!(periods_of(&retention::projects(&client, defaults).await.unwrap(), &p.id), defaults);
}

/// The document states the bounds the server checks, so the fuzz run (tests/fuzz/run) only
/// generates periods the server accepts.
#[tokio::test]
async fn openapi_states_the_project_routes_and_period_bounds() {
    let api = Api::start().await;
    let doc: Value = api.http.get(api.url("/openapi.json")).send().await.unwrap().json().await.unwrap();
    let schemas = &doc["components"]["schemas"];
    let route = &doc["paths"]["/v1/admin/projects/{project_id}"];
    for method in ["get", "patch"] {
        let param = &route[method]["parameters"][0];
        assert_eq!(param["name"], "project_id", "{method}");
        assert_eq!(param["schema"]["$ref"], "#/components/schemas/ProjectId", "{method}");
        assert_eq!(route[method]["security"], json!([{"admin_token": []}]), "{method}");
        assert!(route[method]["responses"]["403"].is_object(), "{method}");
    }
    assert_eq!(schemas["ProjectId"]["pattern"], railhook_api::schema::id_pattern("proj"));
    assert_eq!(route["patch"]["requestBody"]["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/UpdateProject");
    assert_eq!(schemas["UpdateProject"]["additionalProperties"], false);
    assert_eq!(schemas["RetentionChanges"]["additionalProperties"], false);
    for field in ["events_days", "failed_days"] {
        let days = &schemas["RetentionChanges"]["properties"][field];
        assert_eq!(days["oneOf"][0]["type"], "null", "{field}: {days}");
        let number = &days["oneOf"][1];
        assert_eq!(number["type"], "number", "{field}: {number}");
        assert_eq!(number["exclusiveMinimum"].as_f64(), Some(0.0), "{field}: {number}");
        assert_eq!(number["maximum"].as_f64(), Some(railhook_api::admin::MAX_RETENTION_DAYS), "{field}: {number}");
        assert!(number.get("minimum").is_none(), "{field}: {number}");
    }
    assert!(schemas["RetentionChanges"].get("required").is_none(), "every period may be left out");
    assert!(schemas["UpdateProject"].get("required").is_none(), "retention may be left out");
    assert_eq!(schemas["ProjectDetails"]["allOf"][0]["$ref"], "#/components/schemas/Project");
    let answer = &schemas["ProjectRetention"];
    assert_eq!(answer["required"], json!(["effective_events_days", "effective_failed_days"]), "{answer}");
    assert_eq!(answer["properties"]["events_days"]["type"], json!(["number", "null"]), "{answer}");
}
