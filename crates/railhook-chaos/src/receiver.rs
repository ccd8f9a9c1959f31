//! The test receiver: one HTTP/1 server on 127.0.0.1, a path per Endpoint (`/ep/<n>`). It
//! verifies every request's Standard Webhooks signature, records every arrival by
//! `webhook-id` (when it came, what it answered; a Forward's `Idempotency-Key`,
//! `X-Incoming-Event-Id` and `X-Forward-Attempt` too), and behaves per Endpoint: healthy, or
//! flaky (500s, hangs past the Subscription's timeout, answers close to the timeout, slow
//! bodies after a 200 status line).
//!
//! [`Receiver::go_away`] drops the listener and every open connection (connections are then
//! refused), and [`Receiver::come_back`] binds the same port again.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use railhook_core::signing::{self, EndpointSecret};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How an Endpoint's receiver behaves.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Profile {
    /// Answers 200 at once.
    Healthy,
    /// Per request: 500 with `p500`, hangs past the timeout with `p_hang`, answers 200 close
    /// to the timeout (sometimes just past it: a lost response) with `p_slow_answer`, sends a
    /// 200 status line and then a body slower than the timeout with `p_slow_body`; else 200.
    Flaky { p500: f64, p_hang: f64, p_slow_answer: f64, p_slow_body: f64 },
}

impl Profile {
    pub fn flaky() -> Profile {
        Profile::Flaky { p500: 0.2, p_hang: 0.05, p_slow_answer: 0.05, p_slow_body: 0.05 }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Profile::Healthy => "healthy",
            Profile::Flaky { .. } => "flaky",
        }
    }
}

/// One Endpoint as the receiver sees it.
#[derive(Debug, Clone)]
pub struct ReceiverEndpoint {
    pub secret: EndpointSecret,
    pub profile: Profile,
    /// The Subscription's timeout (what "close to" and "past" the timeout refer to).
    pub timeout: Duration,
}

/// One request that reached the receiver.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Arrival {
    pub webhook_id: String,
    pub endpoint: usize,
    pub received_at: DateTime<Utc>,
    /// When the answer's status line was handed to the connection; `None` when the request
    /// was cut off (the client went away, or the receiver did) before an answer.
    pub answered_at: Option<DateTime<Utc>>,
    pub status: Option<u16>,
    /// ok, error_500, hang, slow_answer, slow_body, bad_signature
    pub behaviour: String,
    pub verified: bool,
    /// The request's `X-Sequence-Number` (ordered Subscriptions' Deliveries only).
    #[serde(default)]
    pub sequence: Option<i64>,
    /// A Forward's `Idempotency-Key` (the Forward id, as its `webhook-id` when re-signed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// A Forward's `X-Incoming-Event-Id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incoming_event_id: Option<String>,
    /// A Forward's `X-Forward-Attempt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_attempt: Option<i32>,
    /// The request's `webhook-timestamp` (unix seconds, the sending worker's clock): a
    /// worker whose clock is off shows here.
    #[serde(default)]
    pub sent_timestamp: i64,
}

impl Arrival {
    /// The checkers' tests' arrival: a verified Delivery request to Endpoint 0, received at
    /// `at_ms` past a fixed instant, answered `answered_ms` later with `status`, sent by a
    /// worker whose clock was `skew_s` ahead.
    #[cfg(test)]
    pub(crate) fn for_test(delivery: uuid::Uuid, at_ms: i64, answered_ms: i64, status: u16, skew_s: i64) -> Arrival {
        let t = |ms: i64| DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap_or_default();
        Arrival {
            webhook_id: railhook_core::DeliveryId(delivery).to_string(),
            endpoint: 0,
            received_at: t(at_ms),
            answered_at: Some(t(at_ms + answered_ms)),
            status: Some(status),
            behaviour: "ok".into(),
            verified: true,
            sequence: None,
            idempotency_key: None,
            incoming_event_id: None,
            forward_attempt: None,
            sent_timestamp: t(at_ms).timestamp() + skew_s,
        }
    }

    /// The sending worker's clock minus the receiver's, in whole seconds (about 0, or about
    /// 30 for the worker of `clock_skew`).
    pub fn sender_skew_s(&self) -> i64 {
        self.sent_timestamp - self.received_at.timestamp()
    }
}

impl Arrival {
    pub fn answered_2xx(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

struct Inner {
    endpoints: Vec<ReceiverEndpoint>,
    arrivals: Mutex<Vec<Arrival>>,
    rng: Mutex<StdRng>,
}

pub struct Receiver {
    inner: Arc<Inner>,
    port: u16,
    serving: Option<(tokio::task::JoinHandle<()>, CancellationToken)>,
}

impl Receiver {
    /// Binds 127.0.0.1:`port` and starts serving.
    pub async fn start(port: u16, endpoints: Vec<ReceiverEndpoint>, seed: u64) -> anyhow::Result<Receiver> {
        let inner = Arc::new(Inner { endpoints, arrivals: Mutex::new(Vec::new()), rng: Mutex::new(StdRng::seed_from_u64(seed)) });
        let mut receiver = Receiver { inner, port, serving: None };
        receiver.come_back().await?;
        Ok(receiver)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self, endpoint: usize) -> String {
        format!("http://127.0.0.1:{}/ep/{endpoint}", self.port)
    }

    /// Stops listening and drops every open connection: from now on connections are refused.
    pub async fn go_away(&mut self) {
        if let Some((handle, cancel)) = self.serving.take() {
            cancel.cancel();
            let _ = handle.await;
        }
    }

    /// Binds the same port again (retrying for a while if it is still held) and serves.
    pub async fn come_back(&mut self) -> anyhow::Result<()> {
        if self.serving.is_some() {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", self.port)).await {
                Ok(l) => break l,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::warn!(port = self.port, error = %e, "receiver cannot bind yet; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => anyhow::bail!("receiver cannot bind 127.0.0.1:{}: {e}", self.port),
            }
        };
        let cancel = CancellationToken::new();
        let handle = tokio::spawn(serve(listener, self.inner.clone(), cancel.clone()));
        self.serving = Some((handle, cancel));
        Ok(())
    }

    /// Everything recorded so far.
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.inner.arrivals.lock().unwrap().clone()
    }

    pub fn arrival_count(&self) -> usize {
        self.inner.arrivals.lock().unwrap().len()
    }
}

async fn serve(listener: TcpListener, inner: Arc<Inner>, cancel: CancellationToken) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let inner = inner.clone();
                    connections.spawn(async move {
                        let service = hyper::service::service_fn(move |req| {
                            let inner = inner.clone();
                            async move { Ok::<_, Infallible>(handle(inner, req).await) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new().keep_alive(true).serve_connection(TokioIo::new(stream), service).await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "receiver accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    // Going away: every connection (and every request in it) is cut off.
    connections.abort_all();
    while connections.join_next().await.is_some() {}
    drop(listener);
}

type Body = BoxBody<Bytes, Infallible>;

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())).boxed());
    *r.status_mut() = status;
    r
}

fn header<'a>(req: &'a Request<Incoming>, name: &str) -> &'a str {
    req.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

#[derive(Clone, Copy)]
enum Behaviour {
    Ok,
    Error500,
    Hang,
    SlowAnswer,
    SlowBody,
}

impl Behaviour {
    fn name(self) -> &'static str {
        match self {
            Behaviour::Ok => "ok",
            Behaviour::Error500 => "error_500",
            Behaviour::Hang => "hang",
            Behaviour::SlowAnswer => "slow_answer",
            Behaviour::SlowBody => "slow_body",
        }
    }
}

async fn handle(inner: Arc<Inner>, req: Request<Incoming>) -> Response<Body> {
    let received_at = Utc::now();
    let Some(index) = req.uri().path().strip_prefix("/ep/").and_then(|n| n.parse::<usize>().ok()).filter(|n| *n < inner.endpoints.len()) else {
        return text(StatusCode::NOT_FOUND, "no such endpoint");
    };
    let endpoint = inner.endpoints[index].clone();
    let webhook_id = header(&req, "webhook-id").to_string();
    let timestamp: i64 = header(&req, "webhook-timestamp").parse().unwrap_or(0);
    let signature = header(&req, "webhook-signature").to_string();
    let sequence = req.headers().get("x-sequence-number").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<i64>().ok());
    let optional = |name: &str| Some(header(&req, name).to_string()).filter(|v| !v.is_empty());
    let (idempotency_key, incoming_event_id) = (optional("idempotency-key"), optional("x-incoming-event-id"));
    let forward_attempt = optional("x-forward-attempt").and_then(|v| v.parse::<i32>().ok());
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return text(StatusCode::BAD_REQUEST, "body"),
    };
    let verified = signing::verify(&endpoint.secret, &webhook_id, timestamp, &body, &signature, Utc::now().timestamp(), 300).is_ok();
    let (behaviour, slow) = {
        let mut rng = inner.rng.lock().unwrap();
        let roll: f64 = rng.random();
        let behaviour = match endpoint.profile {
            Profile::Healthy => Behaviour::Ok,
            Profile::Flaky { p500, p_hang, p_slow_answer, p_slow_body } => {
                if roll < p500 {
                    Behaviour::Error500
                } else if roll < p500 + p_hang {
                    Behaviour::Hang
                } else if roll < p500 + p_hang + p_slow_answer {
                    Behaviour::SlowAnswer
                } else if roll < p500 + p_hang + p_slow_answer + p_slow_body {
                    Behaviour::SlowBody
                } else {
                    Behaviour::Ok
                }
            }
        };
        // Slow answers land between 75 % and 105 % of the timeout: most arrive in time, some
        // just after the worker gave up (a lost response, duplicate window 8).
        (behaviour, endpoint.timeout.mul_f64(rng.random_range(0.75..1.05)))
    };
    let slot = {
        let mut arrivals = inner.arrivals.lock().unwrap();
        arrivals.push(Arrival {
            webhook_id,
            endpoint: index,
            received_at,
            answered_at: None,
            status: None,
            behaviour: if verified { behaviour.name().into() } else { "bad_signature".into() },
            verified,
            sequence,
            idempotency_key,
            incoming_event_id,
            forward_attempt,
            sent_timestamp: timestamp,
        });
        arrivals.len() - 1
    };
    let answer = |status: StatusCode| {
        let mut arrivals = inner.arrivals.lock().unwrap();
        arrivals[slot].status = Some(status.as_u16());
        arrivals[slot].answered_at = Some(Utc::now());
    };
    if !verified {
        answer(StatusCode::UNAUTHORIZED);
        return text(StatusCode::UNAUTHORIZED, "bad signature");
    }
    match behaviour {
        Behaviour::Ok => {
            answer(StatusCode::OK);
            text(StatusCode::OK, "ok")
        }
        Behaviour::Error500 => {
            answer(StatusCode::INTERNAL_SERVER_ERROR);
            text(StatusCode::INTERNAL_SERVER_ERROR, "flaky")
        }
        Behaviour::Hang => {
            // Past the timeout: the worker gives up first (if this future is not dropped
            // with its connection, the late answer is a 503, never a 2xx).
            tokio::time::sleep(endpoint.timeout + Duration::from_millis(1500)).await;
            answer(StatusCode::SERVICE_UNAVAILABLE);
            text(StatusCode::SERVICE_UNAVAILABLE, "late")
        }
        Behaviour::SlowAnswer => {
            tokio::time::sleep(slow).await;
            answer(StatusCode::OK);
            text(StatusCode::OK, "slow ok")
        }
        Behaviour::SlowBody => {
            // A 200 status line at once, then a body that takes longer than the timeout:
            // "failing to read a response is never failing to deliver".
            answer(StatusCode::OK);
            let chunk_wait = endpoint.timeout / 4;
            let chunks = futures::stream::unfold(0u32, move |n| async move {
                if n >= 8 {
                    return None;
                }
                tokio::time::sleep(chunk_wait).await;
                Some((Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"slow body chunk\n"))), n + 1))
            });
            let mut r = Response::new(StreamBody::new(chunks).boxed());
            *r.status_mut() = StatusCode::OK;
            r
        }
    }
}
