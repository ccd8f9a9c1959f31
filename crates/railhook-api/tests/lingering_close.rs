//! The lingering close, with the clients people use: a body the API refuses without reading
//! it (413 by its declared length, 401 before the body, 415) must reach the client as that
//! 4xx with its JSON error, not as a broken connection, however the client sends and reads.
//! Before the lingering close, Python's urllib got `BrokenPipeError` on every 2 MiB
//! `POST /v1/events` and Node's `fetch` got `EPIPE` on some.
//!
//! Each client sends its body [`ATTEMPTS`] times and every answer must be the 4xx with
//! `{"error":{"code":...,"message":...}}`. Python, Node and curl run as child processes
//! (`scripts/test` installs Python's `requests`); reqwest runs in-process.
//!
//! Then the bounds: an endless body is cut off after `api.linger_timeout_ms` when it trickles
//! and after `api.linger_max_bytes` when it streams. The raw TCP clients' pauses between
//! writes are the attack itself, not synchronisation.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Api;
use railhook_testkit::{test_config, TestDb};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Command;

const ATTEMPTS: usize = 20;
/// Twice the default `api.max_body_bytes`.
const OVERSIZED: usize = 2 << 20;
/// Under `api.max_body_bytes`, so that the refusal is not a 413.
const UNDER_LIMIT: usize = 1_000_000;
/// Upper bound on one client's whole run; only guards against a hung test.
const GUARD: Duration = Duration::from_secs(120);
/// Scheduling slack allowed on top of a bound (two cores shared with other builds).
const SLACK: Duration = Duration::from_millis(1500);

/// One answer as a client saw it: a status and a body, or the client's error.
#[derive(Debug)]
enum Outcome {
    Answered { status: u16, body: String },
    Failed(String),
}

impl Outcome {
    fn parse_line(line: &str) -> Outcome {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("client printed {line:?}: {e}"));
        match (v["status"].as_u64(), v["body"].as_str(), v["error"].as_str()) {
            (Some(status), Some(body), _) => Outcome::Answered { status: status as u16, body: body.to_string() },
            (_, _, Some(error)) => Outcome::Failed(error.to_string()),
            _ => panic!("client printed {line:?}"),
        }
    }

    /// The status with `{"error":{"code":code,"message":"..."}}`.
    fn is(&self, want_status: u16, want_code: &str) -> bool {
        let Outcome::Answered { status, body } = self else { return false };
        let Ok(json) = serde_json::from_str::<Value>(body) else { return false };
        *status == want_status
            && json["error"]["code"] == want_code
            && json["error"]["message"].as_str().is_some_and(|m| !m.is_empty())
    }
}

/// Every one of the [`ATTEMPTS`] answers must be `status` with the JSON error `code`.
fn assert_all(client: &str, outcomes: &[Outcome], status: u16, code: &str) {
    let good = outcomes.iter().filter(|o| o.is(status, code)).count();
    println!("{client}: {good}/{} answered {status} {code}", outcomes.len());
    let others: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.is(status, code))
        .map(|o| match o {
            Outcome::Answered { status, body } => format!("{status} {body:.200}"),
            Outcome::Failed(error) => error.clone(),
        })
        .collect();
    assert!(outcomes.len() == ATTEMPTS && others.is_empty(), "{client}: {good}/{ATTEMPTS} answered {status} {code}; the others: {others:?}");
}

/// A JSON event of exactly `len` bytes, in a file the child processes read; removed on drop.
struct BodyFile(PathBuf);

impl Drop for BodyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn body_file(name: &str, len: usize) -> BodyFile {
    let head = br#"{"type":"big.event","payload":{"pad":""#;
    let tail = br#""}}"#;
    let mut body = head.to_vec();
    body.resize(len - tail.len(), b'x');
    body.extend_from_slice(tail);
    let path = std::env::temp_dir().join(format!("railhook-lingering-{}-{name}.json", std::process::id()));
    std::fs::write(&path, body).unwrap();
    BodyFile(path)
}

/// Runs a client program to its end; each line it prints is one [`Outcome`].
async fn run_client(what: &str, command: &mut Command) -> Vec<Outcome> {
    command.kill_on_drop(true);
    let output = tokio::time::timeout(GUARD, command.output())
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {GUARD:?}"))
        .unwrap_or_else(|e| panic!("cannot run {what} ({e}): scripts/test installs it"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{what} exited with {}: {stderr}", output.status);
    String::from_utf8_lossy(&output.stdout).lines().filter(|l| !l.trim().is_empty()).map(Outcome::parse_line).collect()
}

/// Python: `urllib.request` by default, `requests` with `requests` as the first argument
/// (and a chunked body, sent from a generator, with `requests-chunked`).
const PYTHON_CLIENT: &str = r#"
import json, sys
lib, url, key, path, content_type, attempts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
body = open(path, "rb").read()
headers = {"Authorization": "Bearer " + key, "Content-Type": content_type}

def report(**kv):
    print(json.dumps(kv), flush=True)

if lib == "urllib":
    import urllib.request, urllib.error
    for _ in range(attempts):
        request = urllib.request.Request(url, data=body, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                report(status=response.status, body=response.read().decode("utf-8", "replace"))
        except urllib.error.HTTPError as e:
            report(status=e.code, body=e.read().decode("utf-8", "replace"))
        except Exception as e:
            report(error=repr(e))
else:
    import requests
    def chunks():
        for i in range(0, len(body), 64 * 1024):
            yield body[i:i + 64 * 1024]
    for _ in range(attempts):
        try:
            data = chunks() if lib == "requests-chunked" else body
            response = requests.post(url, data=data, headers=headers, timeout=30)
            report(status=response.status_code, body=response.text)
        except Exception as e:
            report(error=repr(e))
"#;

/// Node's built-in `fetch` (undici).
const NODE_CLIENT: &str = r#"
const fs = require("fs");
const [url, key, path, contentType, attempts] = process.argv.slice(1);
const body = fs.readFileSync(path);
(async () => {
  for (let i = 0; i < Number(attempts); i++) {
    try {
      const response = await fetch(url, { method: "POST", body, headers: { authorization: `Bearer ${key}`, "content-type": contentType } });
      console.log(JSON.stringify({ status: response.status, body: await response.text() }));
    } catch (e) {
      console.log(JSON.stringify({ error: `${e.name}: ${e.message} ${e.cause ? (e.cause.code || e.cause.message) : ""}` }));
    }
  }
})();
"#;

async fn python(lib: &str, api: &Api, key: &str, body: &Path, content_type: &str) -> Vec<Outcome> {
    let mut command = Command::new("python3");
    command.arg("-c").arg(PYTHON_CLIENT).arg(lib).arg(api.url("/v1/events")).arg(key).arg(body).arg(content_type).arg(ATTEMPTS.to_string());
    run_client(&format!("python3 ({lib})"), &mut command).await
}

/// curl, one process per attempt. With `expect_100 = false` curl sends the body straight
/// away; by default it asks `Expect: 100-continue` first for a body this large, and the
/// early 413 spares it sending the body at all.
async fn curl(api: &Api, key: &str, body: &Path, expect_100: bool) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    for _ in 0..ATTEMPTS {
        let mut command = Command::new("curl");
        command
            .args(["-sS", "-X", "POST", "--max-time", "30", "-w", "\n%{http_code}"])
            .arg("--data-binary")
            .arg(format!("@{}", body.display()))
            .args(["-H", "Content-Type: application/json", "-H"])
            .arg(format!("Authorization: Bearer {key}"));
        if !expect_100 {
            command.args(["-H", "Expect:"]);
        }
        command.arg(api.url("/v1/events")).kill_on_drop(true);
        let output = tokio::time::timeout(GUARD, command.output())
            .await
            .expect("curl did not finish")
            .unwrap_or_else(|e| panic!("cannot run curl ({e}): scripts/test installs it"));
        let stdout = String::from_utf8_lossy(&output.stdout);
        outcomes.push(match (output.status.success(), stdout.rsplit_once('\n')) {
            (true, Some((body, status))) => Outcome::Answered { status: status.trim().parse().unwrap_or(0), body: body.to_string() },
            _ => Outcome::Failed(format!("{}: {}", output.status, String::from_utf8_lossy(&output.stderr).trim())),
        });
    }
    outcomes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_urllib_reads_every_413() {
    let api = Api::start().await;
    let p = api.project().await;
    let body = body_file("urllib", OVERSIZED);
    assert_all("python urllib", &python("urllib", &api, &p.key, &body.0, "application/json").await, 413, "payload_too_large");
    assert_eq!(api.count("SELECT count(*) FROM events").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_requests_reads_every_413() {
    let api = Api::start().await;
    let p = api.project().await;
    let body = body_file("requests", OVERSIZED);
    assert_all("python requests", &python("requests", &api, &p.key, &body.0, "application/json").await, 413, "payload_too_large");
    // Chunked, the 413 comes once more than the limit has arrived, the rest unread.
    assert_all("python requests, chunked", &python("requests-chunked", &api, &p.key, &body.0, "application/json").await, 413, "payload_too_large");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_fetch_reads_every_413() {
    let api = Api::start().await;
    let p = api.project().await;
    let body = body_file("node", OVERSIZED);
    let mut command = Command::new("node");
    command.arg("-e").arg(NODE_CLIENT).arg(api.url("/v1/events")).arg(&p.key).arg(&body.0).arg("application/json").arg(ATTEMPTS.to_string());
    assert_all("node fetch", &run_client("node", &mut command).await, 413, "payload_too_large");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_reads_every_413() {
    let api = Api::start().await;
    let p = api.project().await;
    let body = body_file("curl", OVERSIZED);
    assert_all("curl, body sent at once", &curl(&api, &p.key, &body.0, false).await, 413, "payload_too_large");
    assert_all("curl, Expect: 100-continue", &curl(&api, &p.key, &body.0, true).await, 413, "payload_too_large");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reqwest_reads_every_413() {
    let api = Api::start().await;
    let p = api.project().await;
    let body = std::fs::read(&body_file("reqwest", OVERSIZED).0).unwrap();
    let client = reqwest::Client::new();
    let mut outcomes = Vec::new();
    for _ in 0..ATTEMPTS {
        let sent = client
            .post(api.url("/v1/events"))
            .bearer_auth(&p.key)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await;
        outcomes.push(match sent {
            Ok(response) => {
                let status = response.status().as_u16();
                match response.text().await {
                    Ok(body) => Outcome::Answered { status, body },
                    Err(e) => Outcome::Failed(format!("{e:?}")),
                }
            }
            Err(e) => Outcome::Failed(format!("{e:?}")),
        });
    }
    assert_all("reqwest", &outcomes, 413, "payload_too_large");
}

/// The refusals before the body that are not about its size: a bad key (401) and a body
/// that is not JSON (415), each with a body under the limit that nothing reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_urllib_reads_every_401_and_415() {
    let api = Api::start().await;
    let p = api.project().await;
    let body = body_file("urllib-401-415", UNDER_LIMIT);
    assert_all("python urllib, bad key", &python("urllib", &api, "rh_not_a_key", &body.0, "application/json").await, 401, "unauthorized");
    assert_all("python urllib, text/plain", &python("urllib", &api, &p.key, &body.0, "text/plain").await, 415, "unsupported_media_type");
    assert_eq!(api.count("SELECT count(*) FROM events").await, 0);
}

async fn api_with(edit: impl FnOnce(&mut railhook_config::Config)) -> Api {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    edit(&mut config);
    Api::start_with(db, config).await
}

/// How an endless body ended: when the 413 arrived, when the server cut the connection off
/// (the client's write failed), and how many body bytes the client wrote in all.
struct CutOff {
    answered_after: Duration,
    cut_after_answer: Duration,
    written: u64,
    response: String,
}

/// Declares a 1 TiB body and sends it in `chunk`-byte writes with `pause` between them,
/// while reading the response; returns once a write fails.
async fn endless_body(api: &Api, key: &str, chunk: usize, pause: Duration) -> CutOff {
    let started = Instant::now();
    let stream = TcpStream::connect(api.addr).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let head = format!(
        "POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        1u64 << 40
    );
    write.write_all(head.as_bytes()).await.unwrap();
    let written = Arc::new(AtomicU64::new(0));
    let writer = tokio::spawn({
        let written = written.clone();
        async move {
            let bytes = vec![b'x'; chunk];
            while write.write_all(&bytes).await.is_ok() {
                written.fetch_add(chunk as u64, Ordering::SeqCst);
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
            Instant::now()
        }
    });
    // The response, then the server's FIN: it has answered and lingers.
    let mut response = Vec::new();
    tokio::time::timeout(GUARD, read.read_to_end(&mut response)).await.expect("no response").ok();
    let answered = Instant::now();
    let cut = tokio::time::timeout(GUARD, writer).await.expect("the server never cut the endless body off").unwrap();
    CutOff {
        answered_after: answered - started,
        cut_after_answer: cut.saturating_duration_since(answered),
        written: written.load(Ordering::SeqCst),
        response: String::from_utf8_lossy(&response).into_owned(),
    }
}

/// A body trickling 1 KiB every 10 ms forever is cut off `api.linger_timeout_ms` after the
/// 413; the byte bound is out of reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickling_endless_body_is_cut_off_after_the_linger_timeout() {
    let bound = Duration::from_millis(1000);
    let api = api_with(|c| {
        c.api.linger_timeout_ms = 1000;
        c.api.linger_max_bytes = 1 << 40;
    })
    .await;
    let p = api.project().await;
    let cut = endless_body(&api, &p.key, 1024, Duration::from_millis(10)).await;
    println!(
        "trickled endless body: 413 after {:?}, cut off {:?} later, {} KiB written in all",
        cut.answered_after,
        cut.cut_after_answer,
        cut.written >> 10
    );
    assert!(cut.response.starts_with("HTTP/1.1 413"), "{}", cut.response);
    assert!(cut.response.to_ascii_lowercase().contains("connection: close"), "{}", cut.response);
    assert!(cut.cut_after_answer >= bound - Duration::from_millis(50), "cut before the bound: {:?}", cut.cut_after_answer);
    assert!(cut.cut_after_answer <= bound + SLACK, "lingered {:?}", cut.cut_after_answer);
}

/// A body streamed as fast as the client can is cut off once `api.linger_max_bytes` have
/// been thrown away, long before the 60 s time bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_endless_body_is_cut_off_after_the_linger_bytes() {
    let max_bytes: u64 = 4 << 20;
    let api = api_with(|c| {
        c.api.linger_timeout_ms = 60_000;
        c.api.linger_max_bytes = max_bytes;
    })
    .await;
    let p = api.project().await;
    let cut = endless_body(&api, &p.key, 64 * 1024, Duration::ZERO).await;
    println!(
        "streamed endless body: 413 after {:?}, cut off {:?} later, {} KiB written in all (bound {} KiB)",
        cut.answered_after,
        cut.cut_after_answer,
        cut.written >> 10,
        max_bytes >> 10
    );
    assert!(cut.response.starts_with("HTTP/1.1 413"), "{}", cut.response);
    assert!(cut.cut_after_answer < Duration::from_secs(10), "lingered {:?}: the byte bound did not hold", cut.cut_after_answer);
    // The client wrote at least what the server threw away, and at most that plus what
    // hyper had read before the answer and what the two sockets' buffers hold.
    assert!(cut.written >= max_bytes, "cut before the bound: {} bytes written", cut.written);
    assert!(cut.written <= max_bytes + (32 << 20), "{} bytes written", cut.written);
}

/// With the default bounds (5 s, 4 MiB), a client that goes on trickling after the 413 is
/// let go 5 s after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_timeout_cuts_a_trickle_after_5_s() {
    let api = Api::start().await;
    assert_eq!((api.config.api.linger_timeout_ms, api.config.api.linger_max_bytes), (5_000, 4 << 20));
    let p = api.project().await;
    let cut = endless_body(&api, &p.key, 1, Duration::from_millis(20)).await;
    println!("default bounds: trickle cut off {:?} after the 413", cut.cut_after_answer);
    assert!(cut.response.starts_with("HTTP/1.1 413"), "{}", cut.response);
    let lingered = cut.cut_after_answer;
    assert!(lingered >= Duration::from_millis(4950) && lingered <= Duration::from_secs(5) + SLACK, "{lingered:?}");
}
