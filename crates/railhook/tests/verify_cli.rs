//! `railhook verify` as an operator runs it: the real binary on files, exit status and
//! messages. (A request captured from a real Delivery is checked in receivers_process.rs.)

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{SystemTime, UNIX_EPOCH};

use railhook_receiver::Secret;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const NEW_SECRET: &str = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYX";
const BODY: &str = r#"{"id":"evt_1","type":"order.paid","timestamp":"2026-01-01T00:00:00.000Z","data":{"n":1}}"#;

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// A scratch directory of this test's files, removed on drop.
struct Files(PathBuf);

impl Files {
    fn new() -> Files {
        let dir = std::env::temp_dir().join(format!("railhook-verify-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        Files(dir)
    }
    fn write(&self, name: &str, content: impl AsRef<[u8]>) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, content).unwrap();
        path.to_string_lossy().into_owned()
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

fn railhook(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_railhook"));
    cmd.arg("verify").args(args).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.current_dir(std::env::temp_dir()).output().expect("run railhook verify")
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

fn signature(secrets: &[&str], id: &str, ts: i64, body: &str) -> String {
    secrets.iter().map(|s| s.parse::<Secret>().unwrap().sign(id, ts, body.as_bytes())).collect::<Vec<_>>().join(" ")
}

fn raw_request(id: &str, ts: i64, signature: &str, body: &str) -> String {
    format!(
        "POST /webhooks HTTP/1.1\r\nhost: 127.0.0.1:9\r\ncontent-type: application/json\r\nwebhook-id: {id}\r\nwebhook-timestamp: {ts}\r\nwebhook-signature: {signature}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[test]
fn a_valid_raw_request_exits_0_and_names_the_matching_secret() {
    let files = Files::new();
    let ts = now();
    let request = files.write("req.http", raw_request("dlv_1", ts, &signature(&[NEW_SECRET, SECRET], "dlv_1", ts, BODY), BODY));
    let out = railhook(&["--secret", SECRET, "--request", &request], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with(&format!("valid: webhook-id dlv_1 signed at {ts}")), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("matches --secret #1"), "{}", text(&out.stdout));
    // Several secrets: the second one matches; and from the environment instead of flags.
    let stranger = "whsec_//79/Pv6+fj39vX08/Lx8O/u7ezr6uno5+bl5OPi4eA=";
    let out = railhook(&["--secret", stranger, "--secret", NEW_SECRET, "--request", &request], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("matches --secret #2"), "{}", text(&out.stdout));
    let out = railhook(&["--request", &request], &[("RAILHOOK_VERIFY_SECRET", &format!("{stranger} {SECRET}"))]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // From standard input, with LF line endings (a capture pasted into an editor).
    let lf = raw_request("dlv_1", ts, &signature(&[SECRET], "dlv_1", ts, BODY), BODY).replace("\r\n", "\n");
    let mut child = Command::new(env!("CARGO_BIN_EXE_railhook"))
        .args(["verify", "--secret", SECRET, "--request", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), lf.as_bytes()).unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn headers_and_body_files_as_lines_or_json() {
    let files = Files::new();
    let ts = now();
    let sig = signature(&[SECRET], "dlv_2", ts, BODY);
    let body = files.write("body.json", BODY);
    let lines = files.write("headers.txt", format!("webhook-id: dlv_2\nwebhook-timestamp: {ts}\nwebhook-signature: {sig}\n"));
    let json = files.write("headers.json", serde_json::json!({"webhook-id": "dlv_2", "webhook-timestamp": ts.to_string(), "webhook-signature": sig}).to_string());
    for headers in [&lines, &json] {
        let out = railhook(&["--secret", SECRET, "--headers", headers, "--body", &body], &[]);
        assert!(out.status.success(), "{headers}: {}", text(&out.stderr));
    }
    // A body file saved with a final newline the request did not have: refused, with a hint.
    let with_newline = files.write("body-nl.json", format!("{BODY}\n"));
    let out = railhook(&["--secret", SECRET, "--headers", &lines, "--body", &with_newline], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("matches the body without its final newline"), "{}", text(&out.stderr));
}

#[test]
fn invalid_requests_exit_1_with_the_reason() {
    let files = Files::new();
    let ts = now();
    let good = signature(&[SECRET], "dlv_3", ts, BODY);
    let cases = [
        ("tampered body", raw_request("dlv_3", ts, &good, &BODY.replace("\"n\":1", "\"n\":2")), "no webhook-signature entry matches", "no_matching_signature"),
        ("another secret", raw_request("dlv_3", ts, &signature(&[NEW_SECRET], "dlv_3", ts, BODY), BODY), "no webhook-signature entry matches", "no_matching_signature"),
        ("missing id", raw_request("dlv_3", ts, &good, BODY).replace("webhook-id: dlv_3\r\n", ""), "the webhook-id header is missing", "missing_header"),
        ("bad timestamp", raw_request("dlv_3", ts, &good, BODY).replace(&format!("webhook-timestamp: {ts}"), "webhook-timestamp: soon"), "unix seconds", "invalid_timestamp"),
    ];
    for (what, request, message, code) in cases {
        let file = files.write("req.http", request);
        let out = railhook(&["--secret", SECRET, "--request", &file], &[]);
        assert_eq!(out.status.code(), Some(1), "{what}: {}", text(&out.stderr));
        let stderr = text(&out.stderr);
        assert!(stderr.contains(message) && stderr.contains(code), "{what}: {stderr}");
        assert!(text(&out.stdout).is_empty(), "{what}");
    }
}

#[test]
fn an_old_capture_fails_on_its_age_unless_told_to_ignore_it() {
    let files = Files::new();
    let ts = now() - 7200;
    let file = files.write("old.http", raw_request("dlv_4", ts, &signature(&[SECRET], "dlv_4", ts, BODY), BODY));
    let out = railhook(&["--secret", SECRET, "--request", &file], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("timestamp_too_old") && text(&out.stderr).contains("--ignore-age"), "{}", text(&out.stderr));
    let out = railhook(&["--secret", SECRET, "--request", &file, "--ignore-age"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("age not checked"), "{}", text(&out.stdout));
    let out = railhook(&["--secret", SECRET, "--request", &file, "--tolerance", "10000"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // --ignore-age does not excuse a wrong signature.
    let out = railhook(&["--secret", NEW_SECRET, "--request", &file, "--ignore-age"], &[]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn bad_input_exits_2() {
    let files = Files::new();
    let request = files.write("req.http", raw_request("dlv_5", now(), "v1,AAAA", BODY));
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--secret".into(), "not-a-secret".into(), "--request".into(), request.clone()], "--secret #1: secret must start with 'whsec_'"),
        (vec!["--secret".into(), SECRET.into(), "--request".into(), "/nonexistent/req.http".into()], "reading /nonexistent/req.http"),
        (vec!["--secret".into(), SECRET.into(), "--request".into(), files.write("cut.http", "POST / HTTP/1.1\r\ncontent-length: 50\r\n\r\n{}")], "the capture is cut short"),
    ];
    for (args, message) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = railhook(&args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains(message), "{args:?}: {}", text(&out.stderr));
    }
    // Usage errors are clap's (exit 2 too): no secret, no input, both inputs.
    for args in [vec!["--request", request.as_str()], vec!["--secret", SECRET], vec!["--secret", SECRET, "--request", request.as_str(), "--headers", request.as_str(), "--body", request.as_str()]] {
        let out = railhook(&args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
    }
}
