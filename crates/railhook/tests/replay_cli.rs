//! `railhook replay` as an operator runs it: the CLI process against a running `railhook all`
//! process over HTTP, with a project API key in RAILHOOK_API_KEY; real Postgres and Kafka.

use std::process::{Output, Stdio};
use std::time::Duration;

use railhook_testkit::{eventually, test_config, TestDb};
use serde_json::{json, Value};

const EVENTS: i64 = 300;

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

/// `railhook replay ...` with only the given environment (stdout and stderr are pipes, not a
/// terminal: the plain-line progress).
async fn cli(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_railhook"));
    cmd.args(args).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default()).current_dir(std::env::temp_dir());
    for (k, v) in env {
        cmd.env(k, v);
    }
    tokio::time::timeout(Duration::from_secs(60), cmd.output()).await.expect("the CLI returned within 60 s").expect("run railhook")
}

struct Server {
    api: String,
    key: String,
    endpoint: String,
    db: TestDb,
    _child: tokio::process::Child,
}

/// `railhook all` with small, slow Replay batches (20 Events every 300 ms, so following has
/// something to show), a project, an Endpoint subscribed to `order.*`, and `EVENTS` stored
/// `order.paid` Events from ten minutes ago.
async fn server() -> Server {
    let db = TestDb::new().await;
    let config = test_config(&db);
    let api = format!("127.0.0.1:{}", railhook_testkit::free_port());
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_railhook"))
        .arg("all")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RAILHOOK_DATABASE_URL", &config.database.url)
        .env("RAILHOOK_KAFKA_BROKERS", &config.kafka.brokers)
        .env("RAILHOOK_KAFKA__TOPIC_PREFIX", &config.kafka.topic_prefix)
        .env("RAILHOOK_KAFKA__PARTITIONS", "2")
        .env("RAILHOOK_RELAY__SLOT_NAME", &config.relay.slot_name)
        .env("RAILHOOK_API__LISTEN", &api)
        .env("RAILHOOK_ADMIN_TOKEN", &config.api.admin_token)
        .env("RAILHOOK_WORKER__GROUP_ID", &config.worker.group_id)
        .env("RAILHOOK_NETWORK__ALLOW_CIDRS", r#"["127.0.0.0/8"]"#)
        .env("RAILHOOK_REPLAY__BATCH_SIZE", "20")
        .env("RAILHOOK_REPLAY__PAUSE_MS", "300")
        .env("RAILHOOK_TELEMETRY__LOG_FILTER", "error")
        .current_dir(std::env::temp_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn railhook all");
    let api = format!("http://{api}");
    let http = reqwest::Client::new();
    eventually(Duration::from_secs(60), "the API's /readyz", || {
        let http = http.clone();
        let url = format!("{api}/readyz");
        async move { http.get(url).send().await.ok().filter(|r| r.status().is_success()) }
    })
    .await;
    let token = &config.api.admin_token;
    let org: Value = http.post(format!("{api}/v1/admin/organizations")).bearer_auth(token).json(&json!({"name": "acme"})).send().await.unwrap().json().await.unwrap();
    let project: Value = http
        .post(format!("{api}/v1/admin/organizations/{}/projects", org["id"].as_str().unwrap()))
        .bearer_auth(token)
        .json(&json!({"name": "shop"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let key = project["api_key"]["secret"].as_str().unwrap().to_string();
    // Nothing listens there: the replayed Deliveries are made, their sending is not the point.
    let ep: Value = http.post(format!("{api}/v1/endpoints")).bearer_auth(&key).json(&json!({"url": format!("http://127.0.0.1:{}/hook", railhook_testkit::free_port())})).send().await.unwrap().json().await.unwrap();
    let endpoint = ep["id"].as_str().unwrap().to_string();
    let sub = http.post(format!("{api}/v1/subscriptions")).bearer_auth(&key).json(&json!({"endpoint_id": endpoint, "event_type": "order.*"})).send().await.unwrap();
    assert_eq!(sub.status().as_u16(), 201);
    let project_id: railhook_core::ProjectId = project["id"].as_str().unwrap().parse().unwrap();
    db.client()
        .await
        .execute(
            "INSERT INTO events (id, project_id, event_type, payload, created_at)
             SELECT railhook_uuid_v7(), $1, 'order.paid', jsonb_build_object('n', n), now() - interval '10 minutes' + n * interval '1 ms'
             FROM generate_series(1, $2::bigint) n",
            &[&project_id.0, &EVENTS],
        )
        .await
        .unwrap();
    Server { api, key, endpoint, db, _child: child }
}

fn range() -> (String, String) {
    let now = chrono::Utc::now();
    ((now - chrono::Duration::hours(1)).to_rfc3339(), (now + chrono::Duration::minutes(1)).to_rfc3339())
}

#[tokio::test]
async fn create_follows_to_completion_and_status_cancel_answer() {
    let s = server().await;
    let env = [("RAILHOOK_API_KEY", s.key.as_str())];
    let (from, to) = range();
    let base = ["replay", "--api-url", s.api.as_str()];

    // The dry run counts and starts nothing.
    let out = cli(&[&base[..], &["create", "--from", &from, "--to", &to, "--event-type", "order.*", "--dry-run"]].concat(), &env).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&format!("would make {EVENTS} Deliveries from {EVENTS} Events")), "{}", text(&out.stdout));
    let client = s.db.client().await;
    let replays: i64 = client.query_one("SELECT count(*) FROM replays", &[]).await.unwrap().get(0);
    assert_eq!(replays, 0);

    // Create and follow: one plain line a second while running, then the end; exit 0.
    let out = cli(&[&base[..], &["create", "--from", &from, "--to", &to, "--event-type", "order.paid", "--endpoint", &s.endpoint]].concat(), &env).await;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", text(&out.stderr));
    assert!(text(&out.stderr).contains(&format!("{EVENTS} Deliveries to make")), "{}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.len() >= 2, "progress lines while running, then the end:\n{stdout}");
    assert!(lines.iter().any(|l| l.contains(" running: ")), "{stdout}");
    let last = lines.last().unwrap();
    assert!(last.contains(" completed: ") && last.contains(&format!("{EVENTS} of {EVENTS} Deliveries made (100.0 %)")), "{stdout}");
    let id = last.split_whitespace().nth(1).unwrap().to_string();
    assert!(id.starts_with("rpl_"), "{last}");
    let made: i64 = client.query_one("SELECT count(*) FROM deliveries WHERE replay_id IS NOT NULL", &[]).await.unwrap().get(0);
    assert_eq!(made, EVENTS, "each Event replayed once");

    // status --json: the API's Replay.
    let out = cli(&[&base[..], &["status", &id, "--json"]].concat(), &env).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let replay: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(replay["state"], "completed");
    assert_eq!(replay["made"], EVENTS);

    // Cancelling a completed Replay: the API's 409, shown as it wrote it.
    let out = cli(&[&base[..], &["cancel", &id]].concat(), &env).await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("409") && text(&out.stderr).contains("not_running"), "{}", text(&out.stderr));

    // A second one, not followed, cancelled at once; following it then exits 4 (cancelled).
    let out = cli(&[&base[..], &["create", "--from", &from, "--to", &to, "--no-follow", "--json"]].concat(), &env).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let second: Value = serde_json::from_slice(&out.stdout).unwrap();
    let second = second["id"].as_str().unwrap().to_string();
    let out = cli(&[&base[..], &["cancel", &second]].concat(), &env).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(" cancelled: "), "{}", text(&out.stdout));
    let out = cli(&[&base[..], &["status", &second, "--follow"]].concat(), &env).await;
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stdout));
    let made_after: i64 = client.query_one("SELECT count(*) FROM deliveries WHERE replay_id = $1", &[&second.parse::<railhook_core::ReplayId>().unwrap()]).await.unwrap().get(0);
    assert!(made_after < EVENTS, "cancelled before the end: {made_after}");

    // list shows both.
    let out = cli(&[&base[..], &["list"]].concat(), &env).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    assert!(listed.contains(&id) && listed.contains(&second), "{listed}");
}

#[tokio::test]
async fn bad_input_gets_a_precise_error() {
    let s = server().await;
    let (from, to) = range();
    let base = ["replay", "--api-url", s.api.as_str()];
    let env = [("RAILHOOK_API_KEY", s.key.as_str())];

    let out = cli(&[&base[..], &["create", "--from", &from, "--to", &to]].concat(), &[]).await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("RAILHOOK_API_KEY is not set"), "{}", text(&out.stderr));

    let out = cli(&[&base[..], &["create", "--from", "yesterday", "--to", &to]].concat(), &env).await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--from 'yesterday': not an RFC 3339 time"), "{}", text(&out.stderr));

    let out = cli(&[&base[..], &["status", "ep_nope"]].concat(), &env).await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("is not a Replay id"), "{}", text(&out.stderr));

    // The API's own checks come back with their code and field.
    let other = railhook_core::EndpointId::new().to_string();
    let out = cli(&[&base[..], &["create", "--from", &from, "--to", &to, "--endpoint", &other]].concat(), &env).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("is not an Endpoint of this project") && err.contains("field endpoint_ids"), "{err}");

    let out = cli(&[&base[..], &["create", "--from", &from, "--to", &to, "--event-type", "*.paid"]].concat(), &env).await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("field event_types"), "{}", text(&out.stderr));

    let out = cli(&[&base[..], &["list"]].concat(), &[("RAILHOOK_API_KEY", "rhk_not_a_key")]).await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("401"), "{}", text(&out.stderr));

    // Nothing listening there.
    let nowhere = format!("http://127.0.0.1:{}", railhook_testkit::free_port());
    let out = cli(&["replay", "--api-url", &nowhere, "list"], &env).await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("no answer from"), "{}", text(&out.stderr));

    let out = cli(&["replay", "--help"], &[]).await;
    assert!(out.status.success());
    let help = text(&out.stdout);
    assert!(help.contains("RAILHOOK_API_KEY") && help.contains("--api-url"), "{help}");
}
