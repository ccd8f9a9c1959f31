//! A handler that panics answers a JSON 500 that leaks nothing, is counted in
//! `railhook_api_panics_total`, and leaves the connection open. Its own test binary: the
//! panicking route (`RAILHOOK_FAILPOINT_API_PANIC`) is read from the process environment.

mod common;

use std::time::Duration;

use common::Api;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const GUARD: Duration = Duration::from_secs(20);

/// Reads one HTTP/1.1 response with a Content-Length body: (status, headers, body).
async fn read_response(stream: &mut TcpStream) -> (u16, String, String) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = stream.read(&mut buf).await.expect("read");
        assert!(n > 0, "the server closed the connection: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_string();
    let status: u16 = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status line");
    let length: usize = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
        .expect("a Content-Length");
    while got.len() < head_end + length {
        let n = stream.read(&mut buf).await.expect("read");
        assert!(n > 0, "the server closed the connection mid-body");
        got.extend_from_slice(&buf[..n]);
    }
    (status, head, String::from_utf8_lossy(&got[head_end..head_end + length]).to_string())
}

#[tokio::test]
async fn a_handler_panic_is_a_json_500_counted_and_the_connection_stays() {
    // Read by AppState::new; the only test here.
    std::env::set_var(railhook_api::panics::FAILPOINT_ENV, "1");
    let api = Api::start().await;
    let mut stream = TcpStream::connect(api.addr).await.unwrap();
    let request = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: railhook\r\n\r\n");

    stream.write_all(request(railhook_api::panics::FAILPOINT_PATH).as_bytes()).await.unwrap();
    let (status, head, body) = tokio::time::timeout(GUARD, read_response(&mut stream)).await.expect("an answer to the panicking request");
    assert_eq!(status, 500, "{head}{body}");
    assert!(head.to_ascii_lowercase().contains("content-type: application/json"), "{head}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["error"]["code"], "internal", "{body}");
    assert!(json["error"]["message"].is_string(), "{body}");
    for secret in ["hunter2", "password", "failpoint", "panic", "RAILHOOK_"] {
        assert!(!body.to_ascii_lowercase().contains(&secret.to_ascii_lowercase()), "the panic leaked into the answer: {body}");
    }

    // The same connection serves the next request, and a second panic.
    stream.write_all(request("/healthz").as_bytes()).await.unwrap();
    let (status, _, _) = tokio::time::timeout(GUARD, read_response(&mut stream)).await.expect("an answer on the same connection");
    assert_eq!(status, 200);
    stream.write_all(request(railhook_api::panics::FAILPOINT_PATH).as_bytes()).await.unwrap();
    let (status, _, _) = tokio::time::timeout(GUARD, read_response(&mut stream)).await.expect("a second answer");
    assert_eq!(status, 500);

    let metrics = api.http.get(api.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.lines().any(|l| l == "railhook_api_panics_total 2"), "two panics counted:\n{}", metrics.lines().filter(|l| l.contains("panic")).collect::<Vec<_>>().join("\n"));
}
