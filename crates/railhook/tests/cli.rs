//! The binary as an operator runs it: real process, real Postgres.

use std::process::{Command, Output};

use railhook_testkit::TestDb;

fn railhook(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_railhook"));
    cmd.args(args).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.current_dir(std::env::temp_dir());
    cmd.output().expect("run railhook")
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

#[tokio::test]
async fn migrate_applies_once_then_does_nothing() {
    let db = TestDb::new().await;
    // An empty database, not a template clone.
    let admin = railhook_testkit::connect(&railhook_testkit::admin_url()).await.unwrap();
    let name = format!("{}_empty", db.name);
    admin.batch_execute(&format!("CREATE DATABASE {name}")).await.unwrap();
    let url = railhook_testkit::with_database(&db.url, &name);

    let first = railhook(&["migrate"], &[("RAILHOOK_DATABASE__URL", &url)]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    assert!(text(&first.stdout).contains("applied 0001_tenancy"), "{}", text(&first.stdout));

    let second = railhook(&["migrate", "--database-url", &url], &[]);
    assert!(second.status.success(), "{}", text(&second.stderr));
    assert!(text(&second.stdout).contains("database is up to date"), "{}", text(&second.stdout));

    // Tamper with a recorded checksum, as if the file had been edited after it was applied.
    let client = railhook_testkit::connect(&url).await.unwrap();
    client.batch_execute("UPDATE railhook_migrations SET checksum = 'feed' WHERE version = 2").await.unwrap();
    let third = railhook(&["migrate", "--database-url", &url], &[]);
    assert!(!third.status.success());
    assert!(text(&third.stderr).contains("was edited after it was applied"), "{}", text(&third.stderr));
}

#[test]
fn config_check_prints_effective_config_with_secrets_redacted() {
    let out = railhook(
        &["config", "check"],
        &[
            ("RAILHOOK_DATABASE__URL", "postgres://rh:s3cretpw@db:5432/railhook"),
            ("RAILHOOK_ADMIN_TOKEN", "an-admin-token-that-is-long"),
            ("RAILHOOK_KAFKA__PARTITIONS", "12"),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("partitions = 12"), "{stdout}");
    assert!(!stdout.contains("s3cretpw") && !stdout.contains("an-admin-token-that-is-long"), "{stdout}");
    assert!(stdout.contains("<redacted>"));
}

#[test]
fn invalid_config_says_how_to_fix_it() {
    let out = railhook(&["config", "check"], &[("RAILHOOK_KAFKA__PARTITIONS", "0")]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("kafka.partitions is 0"), "{}", text(&out.stderr));
    let out = railhook(&["config", "check", "--config", "/nonexistent/railhook.toml"], &[]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--config"), "{}", text(&out.stderr));
}

#[test]
fn every_subcommand_has_help() {
    for args in [
        vec!["--help"],
        vec!["api", "--help"],
        vec!["relay", "--help"],
        vec!["worker", "--help"],
        vec!["all", "--help"],
        vec!["migrate", "--help"],
        vec!["slot", "status", "--help"],
        vec!["admin", "--help"],
        vec!["config", "check", "--help"],
        vec!["doctor", "--help"],
    ] {
        let out = railhook(&args, &[]);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        assert!(text(&out.stdout).contains("Usage"), "{args:?}");
    }
}

/// Tracing (issue 33, docs/TRACING.md): `--help` says how to turn export on, and an OTLP
/// protocol this build cannot speak stops a component at start-up, naming the variable.
#[test]
fn help_names_the_otel_variables_and_a_grpc_exporter_is_refused() {
    let out = railhook(&["--help"], &[]);
    assert!(text(&out.stdout).contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{}", text(&out.stdout));
    let out = railhook(&["api"], &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("OTEL_EXPORTER_OTLP_PROTOCOL=grpc") && text(&out.stderr).contains("http/protobuf"), "{}", text(&out.stderr));
}

#[tokio::test]
async fn admin_commands_create_org_project_and_keys() {
    let db = TestDb::new().await;
    let env = [("RAILHOOK_DATABASE__URL", db.url.as_str())];
    let out = railhook(&["admin", "create-org", "--name", "acme"], &env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let org: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let org_id = org["id"].as_str().unwrap();
    assert!(org_id.starts_with("org_"));

    let out = railhook(&["admin", "create-project", "--org", org_id, "--name", "shop"], &env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let project: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let project_id = project["id"].as_str().unwrap();
    assert!(project["api_key"]["secret"].as_str().unwrap().starts_with("rhk_"));

    let out = railhook(&["admin", "create-api-key", "--project", project_id, "--name", "ci"], &env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let key: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(key["name"], "ci");
    let client = db.client().await;
    let n: i64 = client.query_one("SELECT count(*) FROM api_keys WHERE revoked_at IS NULL", &[]).await.unwrap().get(0);
    assert_eq!(n, 2);

    let out = railhook(&["admin", "create-project", "--org", "org_00000000000000000000000000", "--name", "x"], &env);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("does not exist"), "{}", text(&out.stderr));
    let out = railhook(&["admin", "create-project", "--org", "ep_nope", "--name", "x"], &env);
    assert!(!out.status.success());
}
