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
    ] {
        let out = railhook(&args, &[]);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        assert!(text(&out.stdout).contains("Usage"), "{args:?}");
    }
}
