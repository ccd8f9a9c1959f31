//! `railhook admin project export|erase` as an operator runs them: the binary against a real
//! Postgres holding two seeded projects.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Output, Stdio};

use railhook_testkit::TestDb;
use serde_json::Value;
use tokio::io::AsyncBufReadExt;
use uuid::Uuid;

const ENDPOINT_SECRET: &str = "whsec_c2VjcmV0LWVuZHBvaW50LXNpZ25pbmcta2V5";
const SOURCE_SECRET: &str = "whsec_c291cmNlLXNpZ25pbmctc2VjcmV0LXZhbHVl";
const RETIRED_SECRET: &str = "whsec_cmV0aXJlZC1zb3VyY2Utc2VjcmV0LXZhbHVl";
const INGRESS_TOKEN: &str = "ingress-token-that-is-a-credential";
const DESTINATION_PASSWORD: &str = "destination-basic-password";
const HEADER_VALUE: &str = "Bearer endpoint-custom-header-value";

fn railhook(args: &[&str], url: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_railhook"));
    cmd.args(args).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default()).env("RAILHOOK_DATABASE_URL", url).current_dir(std::env::temp_dir());
    cmd
}

fn run(args: &[&str], url: &str) -> Output {
    railhook(args, url).output().expect("run railhook")
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

/// A project with a row of every kind (secrets included) and `deliveries` Deliveries with an
/// Attempt each; its id.
async fn seed(client: &tokio_postgres::Client, name: &str, deliveries: i64) -> Uuid {
    let org = Uuid::now_v7();
    let project = Uuid::now_v7();
    client.execute("INSERT INTO organizations (id, name) VALUES ($1, $2)", &[&org, &name]).await.unwrap();
    client.execute("INSERT INTO projects (id, organization_id, name) VALUES ($1, $2, $3)", &[&project, &org, &name]).await.unwrap();
    let key_hash = format!("hash-{project}").into_bytes();
    client
        .execute("INSERT INTO api_keys (id, project_id, name, display_prefix, secret_sha256) VALUES ($1, $2, 'default', 'rhk_abcd', $3)", &[&Uuid::now_v7(), &project, &key_hash])
        .await
        .unwrap();
    let endpoint = Uuid::now_v7();
    let headers = serde_json::json!({"Authorization": HEADER_VALUE});
    client.execute("INSERT INTO endpoints (id, project_id, url, headers) VALUES ($1, $2, 'https://example.com/hook', $3)", &[&endpoint, &project, &headers]).await.unwrap();
    client.execute("INSERT INTO endpoint_secrets (id, endpoint_id, secret) VALUES ($1, $2, $3)", &[&Uuid::now_v7(), &endpoint, &ENDPOINT_SECRET]).await.unwrap();
    client.execute("INSERT INTO circuits (endpoint_id) VALUES ($1)", &[&endpoint]).await.unwrap();
    client.execute("INSERT INTO endpoint_ordering (endpoint_id) VALUES ($1)", &[&endpoint]).await.unwrap();
    client.execute("INSERT INTO claim_rates (kind, id, window_start, used) VALUES ('endpoint', $1, now(), 1), ('project', $2, now(), 1)", &[&endpoint, &project]).await.unwrap();
    let subscription = Uuid::now_v7();
    client.execute("INSERT INTO subscriptions (id, project_id, endpoint_id, event_type_pattern) VALUES ($1, $2, $3, 'order.*')", &[&subscription, &project, &endpoint]).await.unwrap();
    client
        .execute(
            "WITH ev AS (
                INSERT INTO events (id, project_id, event_type, payload)
                SELECT railhook_uuid_v7(), $1, 'order.paid', jsonb_build_object('n', n) FROM generate_series(1, $4::bigint) n RETURNING id
             ), dl AS (
                INSERT INTO deliveries (id, project_id, event_id, endpoint_id, subscription_id, status, max_attempts, retry_delays, timeout_seconds)
                SELECT railhook_uuid_v7(), $1, ev.id, $2, $3, 'SUCCESS', 7, '{60}', 30 FROM ev RETURNING id
             )
             INSERT INTO attempts (id, project_id, delivery_id, attempt_number, started_at, duration_ms, status_code, result)
             SELECT railhook_uuid_v7(), $1, dl.id, 1, now(), 12, 204, 'success' FROM dl",
            &[&project, &endpoint, &subscription, &deliveries],
        )
        .await
        .unwrap();
    let delivery: Uuid = client.query_one("SELECT id FROM deliveries WHERE project_id = $1 LIMIT 1", &[&project]).await.unwrap().get(0);
    client.execute("INSERT INTO outbox (project_id, delivery_id, routing_id, reason) VALUES ($1, $2, $3, 'created')", &[&project, &delivery, &endpoint]).await.unwrap();
    client
        .execute(
            "INSERT INTO replays (id, project_id, state, range_from, range_to, total, cursor_created_at, finished_at)
             VALUES ($1, $2, 'completed', now() - interval '1 hour', now(), 0, now(), now())",
            &[&Uuid::now_v7(), &project],
        )
        .await
        .unwrap();
    let source = Uuid::now_v7();
    let token = format!("{INGRESS_TOKEN}-{project}");
    client
        .execute("INSERT INTO sources (id, project_id, name, provider, secret, ingress_token) VALUES ($1, $2, 'gh', 'github', $3, $4)", &[&source, &project, &SOURCE_SECRET, &token])
        .await
        .unwrap();
    client
        .execute("INSERT INTO source_retired_secrets (id, source_id, secret, expires_at) VALUES ($1, $2, $3, now() + interval '1 hour')", &[&Uuid::now_v7(), &source, &RETIRED_SECRET])
        .await
        .unwrap();
    let destination = Uuid::now_v7();
    let auth = serde_json::json!({"type": "basic", "username": "u", "password": DESTINATION_PASSWORD});
    client
        .execute(
            "INSERT INTO destinations (id, project_id, source_id, url, auth, headers) VALUES ($1, $2, $3, 'https://example.com/in', $4, $5)",
            &[&destination, &project, &source, &auth, &headers],
        )
        .await
        .unwrap();
    client.execute("INSERT INTO circuits (destination_id) VALUES ($1)", &[&destination]).await.unwrap();
    let incoming = Uuid::now_v7();
    client
        .execute(
            "INSERT INTO incoming_events (id, project_id, source_id, provider_event_id, method, headers, body) VALUES ($1, $2, $3, 'gh-1', 'POST', '{}', 'hello')",
            &[&incoming, &project, &source],
        )
        .await
        .unwrap();
    let forward = Uuid::now_v7();
    client
        .execute(
            "INSERT INTO forwards (id, project_id, incoming_event_id, destination_id, status, max_attempts, retry_delays, timeout_seconds)
             VALUES ($1, $2, $3, $4, 'SUCCESS', 5, '{60}', 30)",
            &[&forward, &project, &incoming, &destination],
        )
        .await
        .unwrap();
    client
        .execute(
            "INSERT INTO attempts (id, project_id, forward_id, attempt_number, started_at, duration_ms, status_code, result) VALUES ($1, $2, $3, 1, now(), 9, 200, 'success')",
            &[&Uuid::now_v7(), &project, &forward],
        )
        .await
        .unwrap();
    project
}

/// The tables [`seed`] fills (with or without a `project_id` column).
const SEEDED: &[&str] = &[
    "api_keys", "endpoints", "endpoint_secrets", "circuits", "claim_rates", "subscriptions", "events", "deliveries", "attempts", "outbox",
    "replays", "sources", "source_retired_secrets", "destinations", "incoming_events", "forwards", "projects",
];

fn project_text(project: Uuid) -> String {
    railhook_core::ProjectId(project).to_string()
}

#[tokio::test]
async fn export_has_every_kind_and_no_secret_unless_asked() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let project = seed(&client, "export-me", 25).await;
    let other = seed(&client, "someone-else", 3).await;
    let dir = std::env::temp_dir().join(format!("rh-export-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("export.jsonl");

    let out = run(&["admin", "project", "export", &project_text(project), "--out", file.to_str().unwrap()], &db.url);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!dir.join("export.jsonl.partial").exists());
    let body = std::fs::read_to_string(&file).unwrap();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for line in body.lines() {
        let row: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        *kinds.entry(row["type"].as_str().unwrap().to_string()).or_default() += 1;
        if let Some(p) = row.get("project_id") {
            assert_eq!(p.as_str().unwrap(), project_text(project), "only this project's rows: {line}");
        }
    }
    let want: BTreeSet<&str> = [
        "organization", "project", "api_key", "endpoint", "subscription", "event", "delivery", "attempt", "source", "destination",
        "incoming_event", "forward", "replay",
    ]
    .into();
    assert_eq!(kinds.keys().map(String::as_str).collect::<BTreeSet<_>>(), want, "{kinds:?}");
    assert_eq!(kinds["event"], 25);
    assert_eq!(kinds["delivery"], 25);
    assert_eq!(kinds["attempt"], 26, "25 Delivery Attempts and one Forward Attempt");
    for secret in [ENDPOINT_SECRET, SOURCE_SECRET, RETIRED_SECRET, INGRESS_TOKEN, DESTINATION_PASSWORD, HEADER_VALUE, "hash-"] {
        assert!(!body.contains(secret), "the export holds {secret}");
    }
    assert!(!body.contains(&project_text(other)), "another project's rows");
    // Ids as the API shows them; header names kept, their values redacted; auth type kept.
    assert!(body.contains("\"id\":\"evt_") && body.contains("\"endpoint_id\":\"ep_"), "{body}");
    let endpoint: Value = body.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).find(|r| r["type"] == "endpoint").unwrap();
    assert_eq!(endpoint["headers"]["Authorization"], "<redacted>");
    let destination: Value = body.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).find(|r| r["type"] == "destination").unwrap();
    assert_eq!(destination["auth"], serde_json::json!({"type": "basic"}));

    // With --include-secrets, to stdout: the secrets are there, as their own kinds too.
    let out = run(&["admin", "project", "export", &project_text(project), "--include-secrets"], &db.url);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let body = text(&out.stdout);
    for secret in [ENDPOINT_SECRET, SOURCE_SECRET, RETIRED_SECRET, INGRESS_TOKEN, DESTINATION_PASSWORD, HEADER_VALUE] {
        assert!(body.contains(secret), "--include-secrets leaves out {secret}");
    }
    assert!(body.contains("\"type\":\"endpoint_secret\"") && body.contains("\"type\":\"source_secret\""));
    assert!(!body.contains("hash-"), "an API key's hash is never exported");

    let out = run(&["admin", "project", "export", &project_text(Uuid::now_v7())], &db.url);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("does not exist"));
    let out = run(&["admin", "project", "export", "ep_nope"], &db.url);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("is not a project id"), "{}", text(&out.stderr));
    std::fs::remove_dir_all(&dir).ok();
}

/// Rows per table with a `project_id` column (base tables and partitioned parents, from
/// information_schema), for one project; plus the rows tied to its Endpoints and Sources.
async fn rows_of(client: &tokio_postgres::Client, project: Uuid) -> BTreeMap<String, i64> {
    let tables: Vec<String> = client
        .query(
            "SELECT c.table_name::text FROM information_schema.columns c JOIN pg_class k ON k.relname = c.table_name AND k.relnamespace = to_regnamespace(c.table_schema)
             WHERE c.table_schema = current_schema() AND c.column_name = 'project_id' AND NOT k.relispartition ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(tables.len() >= 12, "{tables:?}");
    let mut out = BTreeMap::new();
    for t in tables {
        let n: i64 = client.query_one(&format!("SELECT count(*) FROM {t} WHERE project_id = $1"), &[&project]).await.unwrap().get(0);
        out.insert(t, n);
    }
    for (name, sql) in [
        ("projects", "SELECT count(*) FROM projects WHERE id = $1"),
        ("endpoint_secrets", "SELECT count(*) FROM endpoint_secrets WHERE endpoint_id IN (SELECT id FROM endpoints WHERE project_id = $1)"),
        (
            "circuits",
            "SELECT count(*) FROM circuits WHERE endpoint_id IN (SELECT id FROM endpoints WHERE project_id = $1)
                OR destination_id IN (SELECT id FROM destinations WHERE project_id = $1)",
        ),
        ("source_retired_secrets", "SELECT count(*) FROM source_retired_secrets WHERE source_id IN (SELECT id FROM sources WHERE project_id = $1)"),
        ("claim_rates", "SELECT count(*) FROM claim_rates WHERE id = $1 OR (kind = 'endpoint' AND id NOT IN (SELECT id FROM endpoints))"),
    ] {
        let n: i64 = client.query_one(sql, &[&project]).await.unwrap().get(0);
        out.insert(name.to_string(), n);
    }
    out
}

#[tokio::test]
async fn erase_leaves_nothing_of_the_project_survives_a_kill_and_spares_the_others() {
    let db = TestDb::new().await;
    let client = db.client().await;
    // Enough Deliveries for many batches, so the kill lands in the middle.
    let project = seed(&client, "erase-me", 30_000).await;
    let other = seed(&client, "keep-me", 10).await;
    let other_before = rows_of(&client, other).await;
    let seeded = rows_of(&client, project).await;
    for t in SEEDED {
        assert!(seeded[*t] > 0, "{t} holds a row of the seeded project: {seeded:?}");
    }

    // Refused without --confirm; nothing deleted.
    let out = run(&["admin", "project", "erase", &project_text(project)], &db.url);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--confirm"), "{}", text(&out.stderr));
    let n: i64 = client.query_one("SELECT count(*) FROM deliveries WHERE project_id = $1", &[&project]).await.unwrap().get(0);
    assert_eq!(n, 30_000);

    // kill -9 once the Deliveries' batches are under way.
    let mut child = tokio::process::Command::from(railhook(&["admin", "project", "erase", &project_text(project), "--confirm"], &db.url))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    while let Some(line) = lines.next_line().await.unwrap() {
        if line.contains("rows of deliveries") {
            break;
        }
    }
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let left: i64 = client.query_one("SELECT count(*) FROM deliveries WHERE project_id = $1", &[&project]).await.unwrap().get(0);
    assert!(left > 0 && left < 30_000, "killed half-way: {left} Deliveries left");
    assert_eq!(rows_of(&client, project).await["projects"], 1, "the project row goes last");

    // Run again: it finishes.
    let out = run(&["admin", "project", "erase", &project_text(project), "--confirm"], &db.url);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&format!("erased project {}", project_text(project))), "{}", text(&out.stdout));
    let after = rows_of(&client, project).await;
    assert!(after.values().all(|n| *n == 0), "rows of the erased project left: {after:?}");
    assert_eq!(rows_of(&client, other).await, other_before, "another project untouched");
    let orgs: i64 = client.query_one("SELECT count(*) FROM organizations WHERE name = 'erase-me'", &[]).await.unwrap().get(0);
    assert_eq!(orgs, 1, "the organization stays");

    // Once more: there is nothing left to erase.
    let out = run(&["admin", "project", "erase", &project_text(project), "--confirm"], &db.url);
    assert_eq!(out.status.code(), Some(3));
    assert!(text(&out.stderr).contains("does not exist"), "{}", text(&out.stderr));
}
