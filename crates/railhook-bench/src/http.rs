//! The load generator's HTTP: one keep-alive HTTP/1.1 connection per task (hyper, no pool),
//! so "32 connections" means 32 TCP connections; and the fast local receiver.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

pub struct Conn {
    addr: SocketAddr,
    sender: SendRequest<Full<Bytes>>,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> anyhow::Result<Conn> {
        let stream = tokio::net::TcpStream::connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        Ok(Conn { addr, sender })
    }

    /// POST `body`; reconnects once when the connection was closed.
    pub async fn post(&mut self, path: &str, headers: &[(&str, &str)], body: Bytes) -> anyhow::Result<(StatusCode, Bytes)> {
        if self.sender.ready().await.is_err() {
            *self = Conn::open(self.addr).await?;
        }
        let mut req = Request::post(path).header("host", self.addr.to_string()).header("content-type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = self.sender.send_request(req.body(Full::new(body))?).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }
}

/// GET a URL on 127.0.0.1 (readiness probes, /metrics).
pub async fn get_text(url: &str) -> anyhow::Result<String> {
    let uri: hyper::Uri = url.parse()?;
    let addr: SocketAddr = format!("{}:{}", uri.host().unwrap_or("127.0.0.1"), uri.port_u16().unwrap_or(80)).parse()?;
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = Request::get(uri.path()).header("host", addr.to_string()).body(Full::new(Bytes::new()))?;
    let resp = sender.send_request(req).await?;
    if resp.status() != StatusCode::OK {
        anyhow::bail!("{url}: {}", resp.status());
    }
    Ok(String::from_utf8_lossy(&resp.into_body().collect().await?.to_bytes()).into_owned())
}

/// JSON POST with a bearer token, for setting up fixtures through the API.
pub async fn post_json(addr: SocketAddr, path: &str, token: &str, body: serde_json::Value) -> anyhow::Result<serde_json::Value> {
    let mut conn = Conn::open(addr).await?;
    let auth = format!("Bearer {token}");
    let (status, bytes) = conn.post(path, &[("authorization", &auth)], Bytes::from(body.to_string())).await?;
    if !status.is_success() {
        anyhow::bail!("POST {path}: {status}: {}", String::from_utf8_lossy(&bytes));
    }
    Ok(serde_json::from_slice(&bytes)?)
}

/// A fast local receiver: answers every POST with 204 at once and records, per
/// `webhook-id` (or per `Idempotency-Key` when the load generator drives it directly), the instant it first arrived.
#[derive(Default)]
pub struct Receiver {
    pub arrivals: Mutex<HashMap<String, Instant>>,
    pub count: AtomicU64,
    pub duplicates: AtomicU64,
    /// Per path, the `X-Sequence-Number` of the last first arrival (ordered Endpoints).
    pub sequences: Mutex<HashMap<String, u64>>,
    /// First arrivals whose `X-Sequence-Number` was not the path's previous one plus one
    /// (out of order, or a gap).
    pub order_violations: AtomicU64,
}

impl Receiver {
    pub async fn start() -> anyhow::Result<(Arc<Receiver>, SocketAddr)> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let rx = Arc::new(Receiver::default());
        let state = rx.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let _ = stream.set_nodelay(true);
                let state = state.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let state = state.clone();
                        async move {
                            let at = Instant::now();
                            let path = req.uri().path().to_string();
                            let sequence: Option<u64> = req.headers().get("x-sequence-number").and_then(|v| v.to_str().ok()?.parse().ok());
                            let id = req
                                .headers()
                                .get("webhook-id")
                                .or_else(|| req.headers().get("idempotency-key"))
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_owned);
                            // Read the whole body, as a real receiver would.
                            let _ = req.into_body().collect().await;
                            if let Some(id) = id {
                                state.count.fetch_add(1, Ordering::Relaxed);
                                match state.arrivals.lock().unwrap().entry(id) {
                                    std::collections::hash_map::Entry::Occupied(_) => {
                                        state.duplicates.fetch_add(1, Ordering::Relaxed);
                                    }
                                    std::collections::hash_map::Entry::Vacant(v) => {
                                        v.insert(at);
                                        if let Some(n) = sequence {
                                            let mut last = state.sequences.lock().unwrap();
                                            let previous = last.insert(path, n).unwrap_or(0);
                                            if n != previous + 1 {
                                                state.order_violations.fetch_add(1, Ordering::Relaxed);
                                            }
                                        }
                                    }
                                }
                            }
                            Ok::<_, Infallible>(Response::builder().status(StatusCode::NO_CONTENT).body(Full::new(Bytes::new())).unwrap())
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        Ok((rx, addr))
    }

    pub fn arrived(&self, id: &str) -> Option<Instant> {
        self.arrivals.lock().unwrap().get(id).copied()
    }

    /// The arrival of each id (None: not yet), under one lock.
    pub fn arrivals_of<'a>(&self, ids: impl IntoIterator<Item = &'a str>) -> Vec<Option<Instant>> {
        let arrivals = self.arrivals.lock().unwrap();
        ids.into_iter().map(|id| arrivals.get(id).copied()).collect()
    }
}
