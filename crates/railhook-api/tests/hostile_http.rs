//! The API against hostile HTTP clients, over real sockets: slowloris headers, trickled
//! bodies, oversized chunked bodies and more connections than `api.max_connections`. Each
//! attack runs while a normal client keeps being served.
//!
//! The attackers are raw TCP clients; their pauses between bytes are the attack itself, not
//! synchronisation. What the tests wait for is always a condition (a response, the server
//! closing the connection), bounded by [`GUARD`].

mod common;

use std::time::{Duration, Instant};

use common::Api;
use railhook_testkit::{test_config, TestDb};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Upper bound on any wait; only guards against a hung test.
const GUARD: Duration = Duration::from_secs(20);
/// Scheduling slack allowed on top of a timeout (two cores shared with other builds).
const SLACK: Duration = Duration::from_millis(1500);

async fn api_with(edit: impl FnOnce(&mut railhook_config::Config)) -> Api {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    edit(&mut config);
    Api::start_with(db, config).await
}

/// Reads until the server closes the connection (EOF or reset); returns what arrived.
async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Status code and body of a raw HTTP/1.1 response.
fn parse_response(raw: &[u8]) -> (u16, serde_json::Value) {
    let text = String::from_utf8_lossy(raw);
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status line in {text:?}"));
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(serde_json::Value::Null))
}

/// A normal client's request, with its own fresh connection each time.
async fn healthy(api: &Api) -> Duration {
    let started = Instant::now();
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let resp = tokio::time::timeout(GUARD, client.get(api.url("/healthz")).send()).await.expect("normal client hung").unwrap();
    assert_eq!(resp.status(), 200);
    started.elapsed()
}

/// Sends a request line and headers one byte every `pause`, forever (as far as the client
/// is concerned); returns how long after connecting the server closed the connection.
async fn slowloris(addr: std::net::SocketAddr, pause: Duration) -> Duration {
    let started = Instant::now();
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let trickle = async move {
        let head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n";
        for &b in head {
            if write.write_all(&[b]).await.is_err() {
                return;
            }
            tokio::time::sleep(pause).await;
        }
        // Then header after header, never the blank line that ends them.
        loop {
            for &b in b"X-Slow: 1\r\n" {
                if write.write_all(&[b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(pause).await;
            }
        }
    };
    let closed = async move {
        let mut buf = [0u8; 1024];
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::select! {
        _ = closed => {}
        _ = trickle => panic!("the server kept reading headers"),
    }
    started.elapsed()
}

#[tokio::test]
async fn slowloris_clients_are_cut_off_while_others_are_served() {
    let timeout = Duration::from_millis(1000);
    let api = api_with(|c| c.api.header_read_timeout_ms = 1000).await;
    let attackers: Vec<_> = (0..20).map(|_| tokio::spawn(slowloris(api.addr, Duration::from_millis(50)))).collect();

    // While the attack runs, a normal client is served as usual.
    let mut served = 0;
    let mut slowest = Duration::ZERO;
    while attackers.iter().any(|a| !a.is_finished()) {
        slowest = slowest.max(healthy(&api).await);
        served += 1;
    }
    let mut cut = Vec::new();
    for a in attackers {
        cut.push(a.await.unwrap());
    }
    let (first, last) = (*cut.iter().min().unwrap(), *cut.iter().max().unwrap());
    println!("20 slowloris connections cut after {first:?} to {last:?}; {served} normal requests served meanwhile, slowest {slowest:?}");
    assert!(first >= timeout - Duration::from_millis(100), "cut before the timeout: {first:?}");
    assert!(last <= timeout + SLACK, "a slowloris connection lasted {last:?}");
    assert!(served >= 5, "only {served} normal requests during the attack");
    assert!(slowest < Duration::from_millis(500), "a normal request took {slowest:?}");
}

#[tokio::test]
async fn an_idle_connection_is_closed_after_the_header_timeout() {
    let api = api_with(|c| c.api.header_read_timeout_ms = 500).await;
    // One request on a kept-alive connection, then silence.
    let started = Instant::now();
    let mut stream = TcpStream::connect(api.addr).await.unwrap();
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let got = tokio::time::timeout(GUARD, read_until_closed(&mut stream)).await.expect("never closed");
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"), "{got:?}");
    let lasted = started.elapsed();
    assert!(lasted >= Duration::from_millis(450) && lasted <= Duration::from_millis(500) + SLACK, "{lasted:?}");
    // A connection that never sends a byte is closed too.
    let started = Instant::now();
    let mut silent = TcpStream::connect(api.addr).await.unwrap();
    let got = tokio::time::timeout(GUARD, read_until_closed(&mut silent)).await.expect("never closed");
    assert!(got.is_empty() || String::from_utf8_lossy(&got).starts_with("HTTP/1.1 408"), "{got:?}");
    assert!(started.elapsed() <= Duration::from_millis(500) + SLACK, "{:?}", started.elapsed());
}

/// A POST that announces 1000 bytes and sends 10, then one more every 100 ms.
#[tokio::test]
async fn a_trickled_body_gets_408_and_the_connection_is_closed() {
    let api = api_with(|c| c.api.body_read_timeout_ms = 1000).await;
    let p = api.project().await;
    let started = Instant::now();
    let mut stream = TcpStream::connect(api.addr).await.unwrap();
    let head = format!(
        "POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"type\":\"a",
        p.key
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let trickle = tokio::spawn(async move {
        let mut sent = 10;
        while sent < 1000 && write.write_all(b"a").await.is_ok() {
            sent += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        sent
    });
    let mut got = Vec::new();
    let closed = tokio::time::timeout(GUARD, async {
        let mut buf = [0u8; 4096];
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let lasted = started.elapsed();
    closed.expect("the server never closed the connection");
    trickle.abort();
    let (status, body) = parse_response(&got);
    assert_eq!(status, 408, "{}", String::from_utf8_lossy(&got));
    assert_eq!(body["error"]["code"], "request_timeout");
    assert_eq!(body["error"]["field"], "body");
    assert!(String::from_utf8_lossy(&got).to_ascii_lowercase().contains("connection: close"));
    assert!(lasted >= Duration::from_millis(950) && lasted <= Duration::from_millis(1000) + SLACK, "{lasted:?}");
    assert_eq!(api.count("SELECT count(*) FROM events").await, 0);

    // A body that simply stops after 10 bytes is cut the same way.
    let started = Instant::now();
    let mut stalled = TcpStream::connect(api.addr).await.unwrap();
    stalled.write_all(head.as_bytes()).await.unwrap();
    let got = tokio::time::timeout(GUARD, read_until_closed(&mut stalled)).await.expect("never closed");
    assert_eq!(parse_response(&got).0, 408);
    assert!(started.elapsed() <= Duration::from_millis(1000) + SLACK);
}

/// 10 MiB, chunked, sent 64 KiB at a time: the 413 comes once the limit (1 MiB) is passed,
/// long before the rest is sent, and the connection is closed rather than drained.
#[tokio::test]
async fn a_10_mib_chunked_body_gets_413_after_about_the_limit() {
    let api = Api::start().await;
    assert_eq!(api.config.api.max_body_bytes, 1 << 20);
    let p = api.project().await;
    let mut stream = TcpStream::connect(api.addr).await.unwrap();
    let head = format!(
        "POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
        p.key
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sender = tokio::spawn({
        let sent = sent.clone();
        async move {
            let chunk = vec![b' '; 64 * 1024];
            let framed = [format!("{:x}\r\n", chunk.len()).into_bytes(), chunk, b"\r\n".to_vec()].concat();
            while sent.load(std::sync::atomic::Ordering::SeqCst) < 10 << 20 {
                if write.write_all(&framed).await.is_err() {
                    return;
                }
                sent.fetch_add(64 * 1024, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let _ = write.write_all(b"0\r\n\r\n").await;
        }
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let mut sent_at_response = None;
    tokio::time::timeout(GUARD, async {
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    sent_at_response.get_or_insert(sent.load(std::sync::atomic::Ordering::SeqCst));
                    got.extend_from_slice(&buf[..n]);
                }
            }
        }
    })
    .await
    .expect("the server never closed the connection");
    let at_response = sent_at_response.expect("no response");
    let at_close = sent.load(std::sync::atomic::Ordering::SeqCst);
    sender.abort();
    println!("413 after {} KiB sent; connection closed after {} KiB of 10240", at_response >> 10, at_close >> 10);
    let (status, body) = parse_response(&got);
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&got));
    assert_eq!(body["error"]["code"], "payload_too_large");
    assert!(at_response < 4 << 20, "413 only after {at_response} bytes");
    assert!(at_close < 10 << 20, "the server read all 10 MiB before closing");
    assert_eq!(api.count("SELECT count(*) FROM events").await, 0);
}

/// A declared `Content-Length` over the limit is answered before any body byte is sent.
#[tokio::test]
async fn a_declared_oversized_body_gets_413_at_once() {
    let api = Api::start().await;
    let p = api.project().await;
    let mut stream = TcpStream::connect(api.addr).await.unwrap();
    let head = format!(
        "POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        p.key,
        10 << 20
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let got = tokio::time::timeout(GUARD, read_until_closed(&mut stream)).await.expect("never answered");
    let (status, body) = parse_response(&got);
    assert_eq!(status, 413);
    assert_eq!(body["error"]["code"], "payload_too_large");
    // Exactly at the limit is fine as far as size goes (then it is not JSON: 400).
    let (status, _) = {
        let resp = api
            .http
            .post(api.url("/v1/events"))
            .bearer_auth(&p.key)
            .header("content-type", "application/json")
            .body(vec![b'x'; 1 << 20])
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), ())
    };
    assert_eq!(status, 400);
}

/// With `api.max_connections = 2`, two open connections hold the server; a third is
/// accepted by the kernel but not served until one of the two closes.
#[tokio::test]
async fn connections_beyond_the_cap_wait_until_one_closes() {
    let api = api_with(|c| {
        c.api.max_connections = 2;
        c.api.header_read_timeout_ms = 60_000;
    })
    .await;
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(api.addr).await.unwrap();
        s.write_all(request).await.unwrap();
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout(GUARD, s.read(&mut buf)).await.expect("held connection not served").unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        held.push(s); // kept alive, idle
    }
    let mut third = TcpStream::connect(api.addr).await.unwrap();
    third.write_all(request).await.unwrap();
    let mut buf = [0u8; 1024];
    // Asserting that something does not happen needs a wait; 500 ms is far more than a
    // request to /healthz takes.
    let early = tokio::time::timeout(Duration::from_millis(500), third.read(&mut buf)).await;
    assert!(early.is_err(), "the third connection was served while two were held: {early:?}");

    drop(held.pop());
    let started = Instant::now();
    let n = tokio::time::timeout(GUARD, third.read(&mut buf)).await.expect("third connection never served").unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&buf[..n]));
    println!("third connection served {:?} after one of the two closed", started.elapsed());
}

/// Shutdown waits for a request in flight (here: a body not sent yet), and refuses new
/// connections meanwhile.
#[tokio::test]
async fn shutdown_waits_for_requests_in_flight() {
    let api = Api::start().await;
    let p = api.project().await;
    let body = br#"{"type":"order.paid","payload":{"n":1}}"#;
    let mut stream = TcpStream::connect(api.addr).await.unwrap();
    let head = format!(
        "POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        p.key,
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    // `Expect: 100-continue`: hyper answers 100 when the handler starts reading the body,
    // which says the request is in flight.
    let mut buf = [0u8; 256];
    let n = tokio::time::timeout(GUARD, stream.read(&mut buf)).await.expect("no 100 Continue").unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 100"), "{:?}", String::from_utf8_lossy(&buf[..n]));
    api.shutdown.cancel();
    // New connections are refused once the listener is closed.
    railhook_testkit::eventually(GUARD, "the listener to close", || async { TcpStream::connect(api.addr).await.is_err().then_some(()) }).await;
    stream.write_all(body).await.unwrap();
    let got = tokio::time::timeout(GUARD, read_until_closed(&mut stream)).await.expect("never answered");
    assert_eq!(parse_response(&got).0, 201, "{}", String::from_utf8_lossy(&got));
    assert_eq!(api.count("SELECT count(*) FROM events").await, 1);
}

/// Bodies Postgres could not store or serde_json must refuse: precise 4xx, nothing written.
/// (NUL in a string used to reach Postgres and come back as a 500.)
#[tokio::test]
async fn hostile_json_bodies_get_4xx_and_write_nothing() {
    let api = Api::start().await;
    let p = api.project().await;
    let deep = format!(r#"{{"type":"a.b","payload":{{"x":{}}}}}"#, "[".repeat(100_000));
    let cases: Vec<(&str, String, u16, &str, &str)> = vec![
        ("/v1/events", r#"{"type":"a.b","payload":{"note":"x\u0000y"}}"#.into(), 422, "invalid_field", "payload.note"),
        ("/v1/events", r#"{"type":"a.b","payload":{"k\u0000":1}}"#.into(), 422, "invalid_field", "payload.k\u{0}"),
        ("/v1/endpoints", r#"{"url":"http://127.0.0.1:9/","description":"a\u0000"}"#.into(), 422, "invalid_field", "description"),
        ("/v1/events", deep, 400, "invalid_json", "body"),
        ("/v1/events", r#"{"type":"a.b","payload":{"n":1e400}}"#.into(), 400, "invalid_json", "body"),
    ];
    for (path, body, status, code, field) in cases {
        let resp = api.http.post(api.url(path)).bearer_auth(&p.key).header("content-type", "application/json").body(body.clone()).send().await.unwrap();
        let got = resp.status().as_u16();
        let json: serde_json::Value = resp.json().await.unwrap();
        assert_eq!((got, json["error"]["code"].as_str(), json["error"]["field"].as_str()), (status, Some(code), Some(field)), "{:.80}: {json}", body);
    }
    assert_eq!(api.count("SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM endpoints)").await, 0);
}
