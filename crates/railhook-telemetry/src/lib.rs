//! Telemetry: `tracing` logs (human or JSON), one Prometheus registry per process, and the
//! operational routes every component serves: `/metrics`, `/healthz` (the process is up) and
//! `/readyz` (its dependencies are reachable).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures::future::BoxFuture;
use prometheus::{Encoder, Registry, TextEncoder};
use railhook_config::{LogFormat, TelemetryConfig};
use tracing_subscriber::EnvFilter;

/// Installs the global `tracing` subscriber. Call once, before the runtime starts work.
pub fn init_tracing(config: &TelemetryConfig) {
    let filter = EnvFilter::try_new(&config.log_filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let result = match config.log_format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
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

/// Serves `router` on `listener` until `shutdown` is cancelled.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router).with_graceful_shutdown(async move { shutdown.cancelled().await }).await
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
