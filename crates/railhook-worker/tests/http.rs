//! The outgoing side of an Attempt against real HTTP(S) servers on 127.0.0.1, built from raw
//! sockets so that they can misbehave: stall, flood, redirect, never answer, or present a
//! certificate nobody trusts.
//!
//! "The server saw nothing" is shown without sleeping: after the send returns, the test
//! connects a probe and checks that the probe is the first connection the server ever
//! accepted (a listener accepts in arrival order).

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use railhook_core::address::{fixed_resolver, AllowList};
use railhook_core::signing::EndpointSecret;
use railhook_worker::http::{
    classify, webhook_headers, AttemptOutcome, AttemptResult, OutgoingRequest, Sender, Verdict, BODY_CAP,
    BODY_READ_TIMEOUT, USER_AGENT,
};
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// Upper bound on waiting for a server event; only guards against a hung test.
const GUARD: Duration = Duration::from_secs(20);
/// Scheduling slack allowed on top of a deadline.
const SLACK: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------------
// A raw HTTP/1.1 test server

#[derive(Debug, Clone)]
struct Captured {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Captured {
    fn all(&self, name: &str) -> Vec<&str> {
        self.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str()).collect()
    }

    /// The one value of `name`; fails if it is missing or repeated.
    fn one(&self, name: &str) -> &str {
        let all = self.all(name);
        assert_eq!(all.len(), 1, "header {name} must appear exactly once: {:?}", self.headers);
        all[0]
    }
}

#[derive(Debug)]
enum Event {
    Accepted(SocketAddr),
    Request(Captured),
}

struct Server {
    addr: SocketAddr,
    events: mpsc::UnboundedReceiver<Event>,
}

/// Starts a server on 127.0.0.1: each connection's request is read and reported, then
/// `handler` gets the stream to answer (or not) as it likes.
async fn server<F, Fut>(handler: F) -> Server
where
    F: Fn(Captured, TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, events) = mpsc::unbounded_channel();
    let handler = Arc::new(handler);
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, peer)) = listener.accept().await else { return };
            let _ = tx.send(Event::Accepted(peer));
            let (tx, handler) = (tx.clone(), handler.clone());
            tokio::spawn(async move {
                if let Some(request) = read_request(&mut stream).await {
                    let _ = tx.send(Event::Request(request.clone()));
                    handler(request, stream).await;
                }
            });
        }
    });
    Server { addr, events }
}

/// A server that answers every request with `raw` and closes.
async fn answering(raw: impl Into<String>) -> Server {
    let raw: Arc<str> = raw.into().into();
    server(move |_, mut stream| {
        let raw = raw.clone();
        async move {
            let _ = stream.write_all(raw.as_bytes()).await;
        }
    })
    .await
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.addr.port())
    }

    async fn next_request(&mut self) -> Captured {
        loop {
            match tokio::time::timeout(GUARD, self.events.recv()).await {
                Ok(Some(Event::Request(r))) => return r,
                Ok(Some(Event::Accepted(_))) => continue,
                other => panic!("no request reached the server: {other:?}"),
            }
        }
    }

    /// Asserts that nothing connected to the server before now.
    async fn assert_untouched(&mut self) {
        let probe = TcpStream::connect(self.addr).await.unwrap();
        let me = probe.local_addr().unwrap();
        match tokio::time::timeout(GUARD, self.events.recv()).await {
            Ok(Some(Event::Accepted(peer))) if peer == me => {}
            other => panic!("something reached the server before the probe: {other:?}"),
        }
    }

    /// Asserts that exactly `n` requests arrived before now, and returns them.
    async fn requests_so_far(&mut self, n: usize) -> Vec<Captured> {
        let mut requests = Vec::new();
        for _ in 0..n {
            requests.push(self.next_request().await);
        }
        let probe = TcpStream::connect(self.addr).await.unwrap();
        let me = probe.local_addr().unwrap();
        loop {
            match tokio::time::timeout(GUARD, self.events.recv()).await {
                Ok(Some(Event::Accepted(peer))) if peer == me => return requests,
                Ok(Some(Event::Accepted(_))) => continue,
                other => panic!("more than {n} requests reached the server: {other:?}"),
            }
        }
    }
}

async fn read_request(stream: &mut TcpStream) -> Option<Captured> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 || buf.len() > 1 << 20 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).ok()?;
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let (method, path) = (request_line.next()?.to_owned(), request_line.next()?.to_owned());
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.parse().unwrap())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Captured { method, path, headers, body })
}

fn response(status: &str, headers: &[(&str, &str)], body: &str) -> String {
    let mut raw = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
    for (n, v) in headers {
        raw.push_str(&format!("{n}: {v}\r\n"));
    }
    raw.push_str("\r\n");
    raw.push_str(body);
    raw
}

// ---------------------------------------------------------------------------------------------
// Helpers on the sending side

fn sender(allow: &[&str]) -> Sender {
    let allow = AllowList::parse(&allow.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    Sender::new(allow).unwrap()
}

/// A Sender that may reach loopback, as in local development.
fn local() -> Sender {
    sender(&["127.0.0.0/8"])
}

fn request(url: &str, timeout: Duration) -> OutgoingRequest {
    OutgoingRequest {
        url: url.to_owned(),
        headers: vec![("Content-Type".into(), "application/json".into())],
        body: bytes::Bytes::from_static(br#"{"hello":"world"}"#),
        timeout,
    }
}

async fn send(sender: &Sender, url: &str, timeout: Duration) -> (AttemptOutcome, Duration) {
    let start = Instant::now();
    let outcome = tokio::time::timeout(timeout + GUARD, sender.send(request(url, timeout)))
        .await
        .expect("send must return within its timeout");
    (outcome, start.elapsed())
}

fn retry(secs: Option<u64>) -> Verdict {
    Verdict::Retry { retry_after: secs.map(Duration::from_secs) }
}

// ---------------------------------------------------------------------------------------------
// Bodies: a 2xx status line is a delivery, whatever the body does

#[tokio::test]
async fn a_200_whose_body_stalls_is_delivered_within_the_deadline() {
    let srv = server(|_, mut stream| async move {
        let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nX-Why: stall\r\n\r\nhello").await;
        let _ = stream.flush().await;
        let _keep_open = stream;
        std::future::pending::<()>().await
    })
    .await;
    let timeout = Duration::from_secs(2);
    let (outcome, took) = send(&local(), &srv.url("/"), timeout).await;
    assert_eq!(outcome.result, AttemptResult::Success, "{outcome:?}");
    assert_eq!(outcome.status_code, Some(200));
    assert_eq!(classify(&outcome), Verdict::Delivered);
    assert_eq!(outcome.response_body, "hello");
    assert!(outcome.response_truncated);
    assert!(outcome.error_message.as_deref().unwrap().contains("incomplete"), "{outcome:?}");
    assert_eq!(outcome.response_headers["x-why"], "stall");
    assert!(took < timeout + SLACK, "took {took:?}");
    assert!(outcome.duration <= took);
}

/// With the default 30 s timeout, the body still gets only BODY_READ_TIMEOUT.
#[tokio::test]
async fn a_stalled_body_gets_only_the_body_read_timeout() {
    let srv = server(|_, mut stream| async move {
        let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").await;
        let _keep_open = stream;
        std::future::pending::<()>().await
    })
    .await;
    let (outcome, took) = send(&local(), &srv.url("/"), Duration::from_secs(30)).await;
    assert_eq!(outcome.result, AttemptResult::Success, "{outcome:?}");
    assert_eq!(classify(&outcome), Verdict::Delivered);
    assert!(took >= BODY_READ_TIMEOUT && took < BODY_READ_TIMEOUT + SLACK, "took {took:?}");
}

#[tokio::test]
async fn a_200_whose_connection_breaks_mid_body_is_delivered() {
    let srv = answering("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\npartial").await;
    let (outcome, _) = send(&local(), &srv.url("/"), Duration::from_secs(5)).await;
    assert_eq!(outcome.result, AttemptResult::Success, "{outcome:?}");
    assert_eq!(classify(&outcome), Verdict::Delivered);
    assert_eq!(outcome.response_body, "partial");
    assert!(outcome.response_truncated);
    assert!(outcome.error_message.as_deref().unwrap().contains("reading failed"), "{outcome:?}");
}

#[tokio::test]
async fn a_1_mib_body_is_stored_as_64_kib() {
    let body = "x".repeat(1 << 20);
    let srv = answering(response("200 OK", &[], &body)).await;
    let (outcome, _) = send(&local(), &srv.url("/"), Duration::from_secs(5)).await;
    assert_eq!(outcome.result, AttemptResult::Success, "{outcome:?}");
    assert_eq!(outcome.response_body.len(), BODY_CAP);
    assert_eq!(BODY_CAP, 64 * 1024);
    assert!(outcome.response_body.bytes().all(|b| b == b'x'));
    assert!(outcome.response_truncated);
    assert_eq!(outcome.error_message, None);
}

#[tokio::test]
async fn a_body_of_exactly_the_cap_is_not_truncated() {
    let body = "y".repeat(BODY_CAP);
    let srv = answering(response("500 Internal Server Error", &[], &body)).await;
    let (outcome, _) = send(&local(), &srv.url("/"), Duration::from_secs(5)).await;
    assert_eq!(outcome.result, AttemptResult::HttpStatus);
    assert_eq!(outcome.response_body, body);
    assert!(!outcome.response_truncated);
}

#[tokio::test]
async fn response_headers_are_bounded() {
    let long = "v".repeat(5000);
    let mut headers: Vec<(String, String)> = (0..80).map(|i| (format!("X-H{i:02}"), "1".to_owned())).collect();
    headers.insert(0, ("X-Long".into(), long));
    headers.insert(0, ("Set-Cookie".into(), "a=1".into()));
    headers.insert(1, ("Set-Cookie".into(), "b=2".into()));
    let refs: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let srv = answering(response("200 OK", &refs, "ok")).await;
    let (outcome, _) = send(&local(), &srv.url("/"), Duration::from_secs(5)).await;
    assert_eq!(outcome.result, AttemptResult::Success, "{outcome:?}");
    let captured = outcome.response_headers.as_object().unwrap();
    assert!(captured.len() <= 50, "{}", captured.len());
    assert_eq!(captured["set-cookie"], "a=1, b=2");
    assert_eq!(captured["x-long"].as_str().unwrap().len(), 1024);
    assert!(captured.contains_key("x-h00") && !captured.contains_key("x-h79"));
}

// ---------------------------------------------------------------------------------------------
// Statuses and classification (DESIGN.md 6.3)

#[tokio::test]
async fn redirects_are_not_followed_and_fail() {
    let mut target = answering(response("200 OK", &[], "you should not be here")).await;
    let location = target.url("/target");
    let mut origin = answering(response("302 Found", &[("Location", &location)], "")).await;
    let (outcome, _) = send(&local(), &origin.url("/"), Duration::from_secs(5)).await;
    assert_eq!(outcome.result, AttemptResult::HttpStatus, "{outcome:?}");
    assert_eq!(outcome.status_code, Some(302));
    assert_eq!(classify(&outcome), Verdict::Fail);
    let message = outcome.error_message.as_deref().unwrap();
    assert!(message.contains("not followed") && message.contains(&location), "{message}");
    assert_eq!(outcome.response_headers["location"], location.as_str());
    origin.requests_so_far(1).await;
    target.assert_untouched().await;
}

#[tokio::test]
async fn statuses_are_classified() {
    let in_two_minutes = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
    let cases: Vec<(&str, String, Verdict)> = vec![
        ("/200", response("200 OK", &[], "ok"), Verdict::Delivered),
        ("/204", response("204 No Content", &[], ""), Verdict::Delivered),
        ("/500", response("500 Internal Server Error", &[], "boom"), retry(None)),
        ("/502", response("502 Bad Gateway", &[], ""), retry(None)),
        ("/503", response("503 Service Unavailable", &[("Retry-After", "120")], ""), retry(Some(120))),
        ("/503-none", response("503 Service Unavailable", &[], ""), retry(None)),
        ("/429", response("429 Too Many Requests", &[("Retry-After", &in_two_minutes)], ""), retry(Some(120))),
        // Retry-After is honoured only for 429 and 503.
        ("/500-ra", response("500 Internal Server Error", &[("Retry-After", "60")], ""), retry(None)),
        ("/408", response("408 Request Timeout", &[], ""), retry(None)),
        ("/400", response("400 Bad Request", &[], "bad"), Verdict::Fail),
        ("/404", response("404 Not Found", &[], ""), Verdict::Fail),
        ("/410", response("410 Gone", &[], ""), Verdict::Fail),
        ("/301", response("301 Moved Permanently", &[("Location", "http://127.0.0.1:1/")], ""), Verdict::Fail),
        ("/304", response("304 Not Modified", &[], ""), Verdict::Fail),
    ];
    let table: Arc<BTreeMap<String, String>> =
        Arc::new(cases.iter().map(|(p, raw, _)| (p.to_string(), raw.clone())).collect());
    let srv = server(move |req, mut stream| {
        let table = table.clone();
        async move {
            let _ = stream.write_all(table[&req.path].as_bytes()).await;
        }
    })
    .await;
    let sender = local();
    for (path, _, expected) in cases {
        let (outcome, _) = send(&sender, &srv.url(path), Duration::from_secs(5)).await;
        let code: u16 = path[1..4].parse().unwrap();
        assert_eq!(outcome.status_code, Some(code), "{path}: {outcome:?}");
        let result = if (200..300).contains(&code) { AttemptResult::Success } else { AttemptResult::HttpStatus };
        assert_eq!(outcome.result, result, "{path}");
        match (classify(&outcome), expected) {
            // An HTTP-date is a wait from now, at one-second resolution.
            (Verdict::Retry { retry_after: Some(got) }, Verdict::Retry { retry_after: Some(want) }) if path == "/429" => {
                assert!(got <= want && got >= want - Duration::from_secs(10), "{path}: {got:?}");
            }
            (got, want) => assert_eq!(got, want, "{path}: {outcome:?}"),
        }
        if code >= 300 {
            assert!(outcome.error_message.as_deref().unwrap().starts_with(&format!("HTTP {code}")), "{outcome:?}");
        }
    }
    assert_eq!(send(&sender, &srv.url("/500"), Duration::from_secs(5)).await.0.response_body, "boom");
}

// ---------------------------------------------------------------------------------------------
// Failures before a response

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    let mut srv = server(|_, stream| async move {
        let _keep_open = stream;
        std::future::pending::<()>().await
    })
    .await;
    let timeout = Duration::from_millis(300);
    let (outcome, took) = send(&local(), &srv.url("/"), timeout).await;
    assert_eq!(outcome.result, AttemptResult::Timeout, "{outcome:?}");
    assert_eq!(outcome.status_code, None);
    assert_eq!(classify(&outcome), retry(None));
    assert!(took >= timeout && took < timeout + SLACK, "took {took:?}");
    assert!(outcome.error_message.as_deref().unwrap().contains("300 ms"));
    // It was the answer that never came: the request itself got there.
    assert_eq!(srv.next_request().await.method, "POST");
}

#[tokio::test]
async fn a_refused_connection_is_a_connect_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let (outcome, _) = send(&local(), &format!("http://127.0.0.1:{port}/"), Duration::from_secs(5)).await;
    assert_eq!(outcome.result, AttemptResult::Connect, "{outcome:?}");
    assert_eq!(classify(&outcome), retry(None));
    assert!(outcome.error_message.is_some());
}

#[tokio::test]
async fn an_unknown_name_is_a_dns_error() {
    let (outcome, _) = send(&local(), "http://nonexistent.invalid/hook", Duration::from_secs(10)).await;
    assert_eq!(outcome.result, AttemptResult::Dns, "{outcome:?}");
    assert_eq!(classify(&outcome), retry(None));
    assert!(outcome.error_message.as_deref().unwrap().contains("nonexistent.invalid"), "{outcome:?}");
}

#[tokio::test]
async fn a_connection_closed_before_the_status_line_is_a_protocol_error() {
    let srv = server(|_, stream| async move { drop(stream) }).await;
    let (outcome, _) = send(&local(), &srv.url("/"), Duration::from_secs(5)).await;
    assert_eq!(outcome.result, AttemptResult::Protocol, "{outcome:?}");
    assert_eq!(classify(&outcome), retry(None));
    let garbage = answering("this is not http\r\n\r\n").await;
    let (outcome, _) = send(&local(), &garbage.url("/"), Duration::from_secs(5)).await;
    assert_eq!(outcome.result, AttemptResult::Protocol, "{outcome:?}");
}

#[tokio::test]
async fn bad_requests_fail_without_sending() {
    let mut srv = answering(response("200 OK", &[], "")).await;
    let sender = local();
    for url in ["ftp://127.0.0.1/", "not a url", "http://user:pw@127.0.0.1/"] {
        let outcome = sender.send(request(url, Duration::from_secs(5))).await;
        assert_eq!(outcome.result, AttemptResult::Request, "{url}: {outcome:?}");
        assert_eq!(classify(&outcome), Verdict::Fail);
    }
    let mut bad = request(&srv.url("/"), Duration::from_secs(5));
    bad.headers.push(("X-Bad".into(), "line\r\nbreak".into()));
    let outcome = sender.send(bad).await;
    assert_eq!(outcome.result, AttemptResult::Request, "{outcome:?}");
    assert!(outcome.error_message.as_deref().unwrap().contains("x-bad"), "{outcome:?}");
    srv.assert_untouched().await;
}

// ---------------------------------------------------------------------------------------------
// SSRF guard

#[tokio::test]
async fn loopback_is_refused_unless_allowed() {
    let mut srv = answering(response("200 OK", &[], "ok")).await;
    let port = srv.addr.port();
    let guarded = sender(&["10.0.0.0/8"]);
    let urls = [
        format!("http://localhost:{port}/"),
        format!("http://127.0.0.1:{port}/"),
        format!("http://2130706433:{port}/"),
        format!("http://[::ffff:127.0.0.1]:{port}/"),
    ];
    for url in &urls {
        let (outcome, _) = send(&guarded, url, Duration::from_secs(5)).await;
        assert_eq!(outcome.result, AttemptResult::RefusedAddress, "{url}: {outcome:?}");
        assert_eq!(classify(&outcome), Verdict::Fail);
        let message = outcome.error_message.as_deref().unwrap();
        assert!(message.contains("loopback") && message.contains("network.allow_cidrs"), "{url}: {message}");
    }
    srv.assert_untouched().await;

    let allowed = local();
    for url in &urls[..2] {
        let (outcome, _) = send(&allowed, url, Duration::from_secs(5)).await;
        assert_eq!(outcome.result, AttemptResult::Success, "{url}: {outcome:?}");
        assert_eq!(outcome.response_body, "ok");
    }
    srv.requests_so_far(2).await;
}

/// Only loopback addresses are used, so that even a broken guard sends nothing elsewhere.
#[tokio::test]
async fn an_allow_entry_permits_only_its_range() {
    let mut srv = answering(response("200 OK", &[], "ok")).await;
    let port = srv.addr.port();
    let narrow = sender(&["127.0.0.2/32"]);
    for url in [format!("http://127.0.0.1:{port}/"), format!("http://localhost:{port}/")] {
        let (outcome, _) = send(&narrow, &url, Duration::from_secs(5)).await;
        assert_eq!(outcome.result, AttemptResult::RefusedAddress, "{url}: {outcome:?}");
    }
    srv.assert_untouched().await;
}

/// Every spelling of a refused address, and every name whose DNS answers are refused, fails at
/// delivery time as `RefusedAddress` without a connection, whatever the API let through (a
/// row written before a rule changed, or a name that now answers differently: DNS
/// rebinding). Names get fixed answers through the Sender's resolver seam; the loopback
/// cases point at a live server, which must see nothing.
#[tokio::test]
async fn refused_addresses_and_dns_answers_fail_at_delivery() {
    let mut srv = answering(response("200 OK", &[], "ok")).await;
    let port = srv.addr.port();
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    let answers: Vec<(String, Vec<std::net::IpAddr>)> = [
        ("private.test", vec!["10.1.2.3"]),
        ("private6.test", vec!["fd12:3456::1"]),
        ("loopback.test", vec!["127.0.0.1"]),
        ("linklocal.test", vec!["169.254.7.7"]),
        ("metadata.test", vec!["169.254.169.254"]),
        ("metadata6.test", vec!["fd00:ec2::254"]),
        ("mapped.test", vec!["::ffff:127.0.0.1"]),
        ("mapped-metadata.test", vec!["::ffff:169.254.169.254"]),
        ("rebound.test", vec!["::ffff:0:10.0.0.1", "fe80::1"]),
    ]
    .into_iter()
    .map(|(name, ips)| (name.to_string(), ips.into_iter().map(ip).collect()))
    .collect();
    let names: Vec<String> = answers.iter().map(|(name, _)| format!("http://{name}:{port}/")).collect();
    let guarded = Sender::with_resolver(AllowList::parse(&[]).unwrap(), fixed_resolver(answers)).unwrap();
    let literals = [
        "http://10.0.0.1/",
        "http://172.16.5.4/",
        "http://192.168.1.10/",
        "http://[fd12::1]/",
        "http://169.254.1.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/",
        "http://[fe80::1]/",
        "http://[::ffff:169.254.169.254]/",
        "http://[::ffff:a9fe:a9fe]/",
        "http://[64:ff9b::a9fe:a9fe]/",
        "http://0.0.0.0/",
        "http://[::]/",
    ]
    .map(|u| u.to_string());
    let loopback_spellings = [
        format!("http://127.0.0.1:{port}/"),
        format!("http://127.1:{port}/"),
        format!("http://2130706433:{port}/"),
        format!("http://0x7f000001:{port}/"),
        format!("http://0177.0.0.1:{port}/"),
        format!("http://0x7f.0.0.1:{port}/"),
        format!("http://[::1]:{port}/"),
        format!("http://[::ffff:127.0.0.1]:{port}/"),
        format!("http://[::ffff:7f00:1]:{port}/"),
    ];
    let mut wrong = Vec::new();
    let all: Vec<&String> = literals.iter().chain(&loopback_spellings).chain(&names).collect();
    for url in &all {
        let (outcome, _) = send(&guarded, url, Duration::from_secs(2)).await;
        if outcome.result != AttemptResult::RefusedAddress || classify(&outcome) != Verdict::Fail {
            wrong.push(format!("{url}: {outcome:?}"));
        } else if !outcome.error_message.as_deref().unwrap_or("").contains("network.allow_cidrs") {
            wrong.push(format!("{url}: the message does not say how to permit it: {:?}", outcome.error_message));
        }
    }
    assert!(wrong.is_empty(), "{} of {} not refused:\n{}", wrong.len(), all.len(), wrong.join("\n"));
    srv.assert_untouched().await;
}

/// A name with a permitted and a refused answer connects only to the permitted one, and a
/// loopback allow-list entry does not admit the metadata address behind a name.
#[tokio::test]
async fn a_name_connects_only_to_its_permitted_answers() {
    let mut srv = answering(response("200 OK", &[], "ok")).await;
    let port = srv.addr.port();
    let answers = vec![
        ("mixed.test".to_string(), vec!["169.254.169.254".parse().unwrap(), "127.0.0.1".parse().unwrap()]),
        ("metadata.test".to_string(), vec!["169.254.169.254".parse().unwrap()]),
    ];
    let allow = AllowList::parse(&["127.0.0.0/8".to_string(), "169.254.0.0/16".to_string()]).unwrap();
    let sender = Sender::with_resolver(allow, fixed_resolver(answers)).unwrap();
    let (outcome, _) = send(&sender, &format!("http://metadata.test:{port}/"), Duration::from_secs(2)).await;
    assert_eq!(outcome.result, AttemptResult::RefusedAddress, "{outcome:?}");
    let (outcome, _) = send(&sender, &format!("http://mixed.test:{port}/"), Duration::from_secs(5)).await;
    assert_eq!(outcome.result, AttemptResult::Success, "{outcome:?}");
    assert_eq!(srv.next_request().await.one("host"), format!("mixed.test:{port}"));
}

// ---------------------------------------------------------------------------------------------
// TLS verification

/// A self-signed end-entity certificate for `localhost` and `127.0.0.1` (P-256, valid
/// 2026-12-02 to 2126-11-08), DER as base64; a test-only key, trusted by nothing. Made with:
///
/// ```text
/// openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 36500 \
///   -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
///   -addext basicConstraints=critical,CA:FALSE -addext keyUsage=digitalSignature \
///   -addext extendedKeyUsage=serverAuth -keyout key.pem -outform DER -out cert.der
/// openssl pkcs8 -topk8 -nocrypt -in key.pem -outform DER -out key.der
/// ```
///
/// (An end-entity certificate: openssl's default is a CA, which webpki refuses as a server
/// certificate even when trusted.) Embedded rather than made at test time, so the test needs
/// no openssl CLI.
const TEST_CERT_DER_B64: &str = "\
    MIIBvDCCAWKgAwIBAgIUKQHgK/6tQVM3RrcRGwy77XDqAGwwCgYIKoZIzj0EAwIwFDESMBAGA1UEAwwJbG9jYWxob3\
    N0MCAXDTI2MTIwMjE1MTM0NloYDzIxMjYxMTA4MTUxMzQ2WjAUMRIwEAYDVQQDDAlsb2NhbGhvc3QwWTATBgcqhkjO\
    PQIBBggqhkjOPQMBBwNCAAQB9SmRzLsQD+I8ewyTcPMfOC3wVig43mA2BXQft+AfshrOWTXTjCF19xj2dxlDNRjQ70\
    iDkZplehKTMpth4Xruo4GPMIGMMB0GA1UdDgQWBBRAfZrBHks1Wg86STTCJ4SS+yTZwTAfBgNVHSMEGDAWgBRAfZrB\
    Hks1Wg86STTCJ4SS+yTZwTAaBgNVHREEEzARgglsb2NhbGhvc3SHBH8AAAEwDAYDVR0TAQH/BAIwADALBgNVHQ8EBA\
    MCB4AwEwYDVR0lBAwwCgYIKwYBBQUHAwEwCgYIKoZIzj0EAwIDSAAwRQIhAMRpWaoJCCJrZWqT32fH5fiWnNBngMrm\
    CPOicwrDtbVfAiBn/es14LKhQEmKTJ19oxzALRrv9pGiX0A4ER76RP/q8w==";
const TEST_KEY_PKCS8_DER_B64: &str = "\
    MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgqi9olfXtD5+p13orM2AEQ2H9IE5c4scmvCPeruGEYe\
    ahRANCAAQB9SmRzLsQD+I8ewyTcPMfOC3wVig43mA2BXQft+AfshrOWTXTjCF19xj2dxlDNRjQ70iDkZplehKTMpth\
    4Xru";

#[tokio::test]
async fn an_untrusted_certificate_is_a_tls_error() {
    use tokio_rustls::rustls::{self, pki_types};

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cert = pki_types::CertificateDer::from(STANDARD.decode(TEST_CERT_DER_B64).unwrap());
    let key = STANDARD.decode(TEST_KEY_PKCS8_DER_B64).unwrap();
    let key = pki_types::PrivateKeyDer::Pkcs8(pki_types::PrivatePkcs8KeyDer::from(key));
    let config = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, mut handshakes) = mpsc::unbounded_channel::<Result<Option<Captured>, String>>();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match acceptor.accept(stream).await {
                    Ok(mut stream) => {
                        let mut buf = vec![0u8; 4096];
                        let n = stream.read(&mut buf).await.unwrap_or(0);
                        let _ = stream.write_all(response("200 OK", &[], "tls ok").as_bytes()).await;
                        let _ = stream.shutdown().await;
                        let line = String::from_utf8_lossy(&buf[..n]).lines().next().unwrap_or("").to_owned();
                        let _ = tx.send(Ok(Some(Captured { method: line, path: String::new(), headers: vec![], body: vec![] })));
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                    }
                }
            });
        }
    });

    // Control: a client that trusts this certificate completes the handshake and gets an
    // answer, so the server works and only trust is missing below.
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let name = pki_types::ServerName::try_from("localhost").unwrap();
    let mut stream = connector.connect(name, tcp).await.expect("a client trusting the cert connects");
    stream.write_all(b"GET /control HTTP/1.1\r\nHost: localhost\r\n\r\n").await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("tls ok"), "{answer}");
    let control = tokio::time::timeout(GUARD, handshakes.recv()).await.unwrap().unwrap();
    assert_eq!(control.unwrap().unwrap().method, "GET /control HTTP/1.1");

    for url in [format!("https://localhost:{port}/"), format!("https://127.0.0.1:{port}/")] {
        let (outcome, _) = send(&local(), &url, Duration::from_secs(5)).await;
        assert_eq!(outcome.result, AttemptResult::Tls, "{url}: {outcome:?}");
        assert_eq!(classify(&outcome), retry(None));
        let message = outcome.error_message.as_deref().unwrap();
        assert!(message.contains("certificate") || message.contains("UnknownIssuer"), "{message}");
        // The server saw the handshake fail; no request was ever sent over it.
        let seen = tokio::time::timeout(GUARD, handshakes.recv()).await.unwrap().unwrap();
        assert!(seen.is_err(), "{url}: the handshake must fail: {seen:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Signing (DESIGN.md 7), checked with an independent Standard Webhooks verifier

/// Standard Webhooks verification written from the spec: the key is the base64 after
/// `whsec_`; the signed content is "{id}.{timestamp}.{body}"; the header holds
/// space-separated "v1,<base64 HMAC-SHA256>" entries, any of which may match.
fn standard_webhooks_verify(secret: &str, id: &str, timestamp: &str, body: &[u8], header: &str) -> bool {
    let key = STANDARD.decode(secret.strip_prefix("whsec_").unwrap()).unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let expected = STANDARD.encode(mac.finalize().into_bytes());
    header.split(' ').filter_map(|entry| entry.strip_prefix("v1,")).any(|sig| sig == expected)
}

fn secret_text(fill: u8) -> String {
    format!("whsec_{}", STANDARD.encode([fill; 32]))
}

#[test]
fn the_test_verifier_passes_the_official_vector() {
    let (secret, id, ts) = ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330");
    let body = br#"{"test": 2432232314}"#;
    let header = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
    assert!(standard_webhooks_verify(secret, id, ts, body, header));
    assert!(!standard_webhooks_verify(secret, id, "1614265331", body, header));
    assert!(!standard_webhooks_verify(&secret_text(1), id, ts, body, header));
}

#[tokio::test]
async fn outgoing_requests_are_signed_for_every_secret_in_a_rotation() {
    let mut srv = answering(response("200 OK", &[], "")).await;
    let (current, previous) = (secret_text(7), secret_text(9));
    let secrets = [EndpointSecret::parse(&current).unwrap(), EndpointSecret::parse(&previous).unwrap()];
    let body = br#"{"type":"invoice.paid","data":{"id":"in_1","amount":1200}}"#;
    let timestamp = 1_760_000_000;
    let extra: BTreeMap<String, String> = [
        ("X-Tenant", "acme"),
        // Reserved names: never sent from an Endpoint's custom headers.
        ("user-agent", "evil/1.0"),
        ("Webhook-Id", "spoofed"),
        ("Content-Type", "text/plain"),
        ("Proxy-Authorization", "Basic Zm9vOmJhcg=="),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_owned(), v.to_owned()))
    .collect();
    let headers = webhook_headers("dlv_01ABC", "evt_01XYZ", timestamp, body, &secrets, Some(42), &extra);
    let outgoing = OutgoingRequest { url: srv.url("/hooks"), headers, body: bytes::Bytes::from_static(body), timeout: Duration::from_secs(5) };
    let outcome = local().send(outgoing).await;
    assert_eq!(outcome.result, AttemptResult::Success, "{outcome:?}");

    let got = srv.next_request().await;
    assert_eq!((got.method.as_str(), got.path.as_str()), ("POST", "/hooks"));
    assert_eq!(got.body, body);
    assert_eq!(got.one("webhook-id"), "dlv_01ABC");
    assert_eq!(got.one("webhook-timestamp"), "1760000000");
    assert_eq!(got.one("x-event-id"), "evt_01XYZ");
    assert_eq!(got.one("x-sequence-number"), "42");
    assert_eq!(got.one("content-type"), "application/json");
    assert_eq!(got.one("user-agent"), format!("Railhook/{}", env!("CARGO_PKG_VERSION")));
    assert_eq!(got.one("user-agent"), USER_AGENT);
    assert_eq!(got.one("x-tenant"), "acme");
    assert!(got.all("proxy-authorization").is_empty());

    let signature = got.one("webhook-signature");
    assert_eq!(signature.split(' ').count(), 2, "{signature}");
    let verify = |secret: &str, body: &[u8]| standard_webhooks_verify(secret, got.one("webhook-id"), got.one("webhook-timestamp"), body, signature);
    assert!(verify(&current, &got.body), "current secret");
    assert!(verify(&previous, &got.body), "previous secret, during the overlap");
    assert!(!verify(&secret_text(3), &got.body), "an unrelated secret");
    assert!(!verify(&current, b"{}"), "another body");
}

#[tokio::test]
async fn unordered_deliveries_have_no_sequence_number() {
    let mut srv = answering(response("200 OK", &[], "")).await;
    let secrets = [EndpointSecret::parse(&secret_text(5)).unwrap()];
    let headers = webhook_headers("dlv_2", "evt_2", 1, b"{}", &secrets, None, &BTreeMap::new());
    let outgoing = OutgoingRequest { url: srv.url("/"), headers, body: bytes::Bytes::from_static(b"{}"), timeout: Duration::from_secs(5) };
    assert_eq!(local().send(outgoing).await.result, AttemptResult::Success);
    let got = srv.next_request().await;
    assert!(got.all("x-sequence-number").is_empty());
    assert_eq!(got.one("webhook-signature").split(' ').count(), 1);
    assert!(standard_webhooks_verify(&secret_text(5), "dlv_2", "1", b"{}", got.one("webhook-signature")));
}
