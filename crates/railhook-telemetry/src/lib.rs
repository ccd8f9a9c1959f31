//! Telemetry: `tracing` logs (human or JSON), one Prometheus registry per process, and the
//! operational routes every component serves: `/metrics`, `/healthz` (the process is up) and
//! `/readyz` (its dependencies are reachable). And the HTTP/1 server they and the API run on
//! ([`serve_with`]), whose connections end in a lingering close (module `lingering`). And the
//! latency stages of a Delivery's path ([`stages`]), which the relay and the worker observe.
//! And OpenTelemetry traces ([`traces`]): the spans' target and names, their export.

mod lingering;
pub mod stages;
pub mod traces;

pub use traces::Export;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures::future::BoxFuture;
use prometheus::{Encoder, Registry, TextEncoder};
use railhook_config::{ApiConfig, LogFormat, TelemetryConfig};
use tracing_subscriber::EnvFilter;

/// Installs the global `tracing` subscriber, logs only. Call once, before the runtime
/// starts work.
pub fn init_tracing(config: &TelemetryConfig) {
    install(config, None);
}

/// Installs the global `tracing` subscriber with the OpenTelemetry export the environment
/// asks for (`OTEL_EXPORTER_OTLP_ENDPOINT`, [`traces`]), if any. The returned [`Export`]
/// must be shut down before the process exits; an `OTEL_*` setting it cannot honour is an
/// error (start-up refuses, naming the variable).
pub fn init_tracing_with_export(config: &TelemetryConfig) -> Result<Option<Export>, traces::ExportError> {
    let export = Export::from_env()?;
    install(config, export.as_ref());
    Ok(export)
}

fn install(config: &TelemetryConfig, export: Option<&Export>) {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    let filter = EnvFilter::try_new(&config.log_filter).unwrap_or_else(|_| EnvFilter::new("info"));
    // The trace spans are the exporter's, never the log's (whatever log_filter says).
    let filter = match format!("{}=off", traces::TARGET).parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    };
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match config.log_format {
        LogFormat::Human => fmt.boxed(),
        LogFormat::Json => fmt.json().flatten_event(true).boxed(),
    };
    let otel = export.map(|e| e.layer().with_filter(tracing_subscriber::filter::Targets::new().with_target(traces::TARGET, tracing::Level::TRACE)));
    let result = tracing_subscriber::registry().with(fmt.with_filter(filter)).with(otel).try_init();
    // A second init (tests) keeps the first subscriber.
    let _ = result;
}

/// The process's metrics. Components register their collectors here at start.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics { registry: Registry::new() }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Prometheus text exposition of everything registered.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let encoder = TextEncoder::new();
        if let Err(e) = encoder.encode(&self.registry.gather(), &mut buf) {
            tracing::warn!(error = %e, "cannot encode metrics");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// A named dependency check for `/readyz`: `Ok` when reachable.
pub type ReadyCheck = Arc<dyn Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// The state of the operational routes.
#[derive(Clone)]
pub struct Ops {
    pub metrics: Metrics,
    checks: Arc<Vec<(&'static str, ReadyCheck)>>,
}

impl Ops {
    pub fn new(metrics: Metrics, checks: Vec<(&'static str, ReadyCheck)>) -> Ops {
        Ops { metrics, checks: Arc::new(checks) }
    }

    /// Runs every check concurrently, each bounded by a timeout.
    pub async fn readiness(&self) -> (bool, serde_json::Value) {
        let results = futures::future::join_all(self.checks.iter().map(|(name, check)| {
            let check = check.clone();
            async move {
                let outcome = match tokio::time::timeout(Duration::from_secs(3), check()).await {
                    Ok(r) => r,
                    Err(_) => Err("timed out after 3 s".to_string()),
                };
                (*name, outcome)
            }
        }))
        .await;
        let ready = results.iter().all(|(_, r)| r.is_ok());
        let mut body = serde_json::Map::new();
        for (name, r) in results {
            body.insert(
                name.to_string(),
                match r {
                    Ok(()) => serde_json::json!({"ok": true}),
                    Err(e) => serde_json::json!({"ok": false, "error": e}),
                },
            );
        }
        (ready, serde_json::json!({"ready": ready, "checks": body}))
    }
}

/// `/metrics`, `/healthz` and `/readyz`, to be merged into a component's router.
pub fn ops_router(ops: Ops) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { Json(serde_json::json!({"status": "ok"})) }))
        .route("/readyz", get(readyz_handler))
        .with_state(ops)
}

async fn metrics_handler(State(ops): State<Ops>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], ops.metrics.render()).into_response()
}

async fn readyz_handler(State(ops): State<Ops>) -> Response {
    let (ready, body) = ops.readiness().await;
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(body)).into_response()
}

/// What a listener grants each client (see [`serve_with`]): defaults equal those of
/// `api.header_read_timeout_ms`, `api.body_read_timeout_ms`, `api.max_connections`,
/// `api.linger_timeout_ms` and `api.linger_max_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Time to send a request line and headers, from when the server starts reading them
    /// (a new connection, or the end of the previous response on a kept-alive one).
    pub header_read_timeout: Duration,
    /// Time to send a request body, from the end of its headers.
    pub body_read_timeout: Duration,
    /// Connections served at once; further ones are not accepted until one closes.
    pub max_connections: usize,
    /// After a response that left its request's body unread, how long the server keeps
    /// reading and throwing away what the client still sends before it closes (the
    /// lingering close; zero: none).
    pub linger_timeout: Duration,
    /// ... and how many bytes it throws away at most (zero: no lingering).
    pub linger_max_bytes: u64,
}

impl ServerLimits {
    pub fn from_api(api: &ApiConfig) -> ServerLimits {
        ServerLimits {
            header_read_timeout: Duration::from_millis(api.header_read_timeout_ms),
            body_read_timeout: Duration::from_millis(api.body_read_timeout_ms),
            max_connections: api.max_connections.max(1),
            linger_timeout: Duration::from_millis(api.linger_timeout_ms),
            linger_max_bytes: api.linger_max_bytes,
        }
    }
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits::from_api(&ApiConfig::default())
    }
}

/// The error a request body yields when it has not fully arrived within
/// [`ServerLimits::body_read_timeout`]; the API answers it with 408.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyReadTimeout(pub Duration);

impl std::fmt::Display for BodyReadTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the request body did not arrive within {} ms (api.body_read_timeout_ms)", self.0.as_millis())
    }
}

impl std::error::Error for BodyReadTimeout {}

/// Whether `error`, or anything in its chain of sources, is a [`BodyReadTimeout`].
pub fn is_body_read_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    for _ in 0..16 {
        let Some(e) = next else { return false };
        if e.is::<BodyReadTimeout>() {
            return true;
        }
        next = e.source();
    }
    false
}

/// A request body that fails with [`BodyReadTimeout`] once its deadline has passed, however
/// the bytes trickle in: the deadline is for the whole body, not per chunk. It records in
/// `read` whether it was read to its end, for the lingering close.
struct DeadlineBody {
    inner: hyper::body::Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
    read: Arc<lingering::BodyRead>,
}

impl http_body::Body for DeadlineBody {
    type Data = bytes::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.read.failed();
            return Poll::Ready(Some(Err(Box::new(BodyReadTimeout(this.timeout)))));
        }
        let frame = std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            None => this.read.ended(),
            Some(Err(_)) => this.read.failed(),
            Some(Ok(_)) if this.inner.is_end_stream() => this.read.ended(),
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame.map(|r| r.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `router` on `listener` with the default [`ServerLimits`] until `shutdown` is
/// cancelled (the ops listeners of the relay and the worker).
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    serve_with(listener, router, ServerLimits::default(), shutdown).await
}

/// Serves `router` over HTTP/1.1 on `listener` until `shutdown` is cancelled, then stops
/// accepting and waits for the requests in flight to finish (idle connections close at once).
///
/// Unlike `axum::serve`, every client is bounded ([`ServerLimits`]):
/// - request line and headers must arrive within `header_read_timeout` (hyper's
///   `header_read_timeout`, with a Tokio timer), else the connection is closed: this cuts off
///   slowloris clients and connections left idle between requests;
/// - the body must arrive within `body_read_timeout` of the headers, else reading it fails
///   with [`BodyReadTimeout`] (408 from the API) and the connection is closed;
/// - at most `max_connections` are served at once: the accept loop takes a permit before it
///   accepts, so further clients wait in the kernel's listen backlog, costing nothing here;
/// - a response that leaves its request's body unread (an early 4xx) says
///   `Connection: close`, and the connection ends in a lingering close (module `lingering`): FIN,
///   then the rest of the body is read and thrown away for at most `linger_timeout` and
///   `linger_max_bytes`, so that the client, still sending, is not reset before it has read
///   the response. A lingering connection keeps its permit.
///
/// Body size limits stay with the router (`DefaultBodyLimit`), which reads at most the limit.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: ServerLimits,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};

    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let lingering = lingering::Lingering { timeout: limits.linger_timeout, max_bytes: limits.linger_max_bytes };
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout).keep_alive(true);
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
        };
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Per-connection errors (reset before accept) and descriptor exhaustion:
                    // log, pause briefly on the latter, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    if !matches!(e.kind(), std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset) {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let stream = lingering::LingeringStream::new(stream, lingering);
        let unread_body = stream.unread_body();
        let router = router.clone();
        let body_timeout = limits.body_read_timeout;
        let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let router = router.clone();
            let unread_body = unread_body.clone();
            let read = Arc::new(lingering::BodyRead::default());
            let request = request.map(|inner| {
                if http_body::Body::is_end_stream(&inner) {
                    read.ended();
                    axum::body::Body::new(inner)
                } else {
                    let deadline = Box::pin(tokio::time::sleep(body_timeout));
                    axum::body::Body::new(DeadlineBody { inner, deadline, timeout: body_timeout, read: read.clone() })
                }
            });
            async move {
                let mut response = tower::ServiceExt::oneshot(router, request).await?;
                if read.left_unread() {
                    // The rest of the body is still on its way: this is the connection's last
                    // response, and the connection lingers when hyper shuts it down.
                    response.headers_mut().insert(header::CONNECTION, axum::http::HeaderValue::from_static("close"));
                    unread_body.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    fn check(ok: bool) -> ReadyCheck {
        Arc::new(move || Box::pin(async move { if ok { Ok(()) } else { Err("down".to_string()) } }))
    }

    #[tokio::test]
    async fn readyz_reflects_checks() {
        let ops = Ops::new(Metrics::new(), vec![("postgres", check(true)), ("kafka", check(false))]);
        let resp = ops_router(ops).oneshot(Request::get("/readyz").body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);

        let ops = Ops::new(Metrics::new(), vec![("postgres", check(true))]);
        let resp = ops_router(ops).oneshot(Request::get("/readyz").body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn metrics_are_rendered() {
        let metrics = Metrics::new();
        let c = prometheus::IntCounter::new("railhook_test_total", "test").unwrap();
        metrics.registry().register(Box::new(c.clone())).unwrap();
        c.inc();
        let resp = ops_router(Ops::new(metrics, vec![]))
            .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
        assert!(String::from_utf8_lossy(&body).contains("railhook_test_total 1"));
    }
}
