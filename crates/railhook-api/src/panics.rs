//! A handler that panics: the request gets the same JSON 500 as any internal failure
//! (`{"error": {"code": "internal", ...}}`, nothing of the panic in it), the panic goes to
//! the log and to `railhook_api_panics_total`, and the connection stays open for the
//! client's next request. Without this layer hyper drops the connection mid-request and the
//! client sees a reset, which it may take for a network fault and retry blindly.
//!
//! The test hook: with `RAILHOOK_FAILPOINT_API_PANIC=1` in the environment when the
//! [`AppState`](crate::AppState) is made, `GET /failpoints/panic` exists and panics. Off
//! by default; nothing in the configuration reaches it.

use std::any::Any;

use axum::body::Body;
use axum::http::Response;
use axum::response::IntoResponse;
use prometheus::IntCounter;
use railhook_telemetry::Metrics;
use tower_http::catch_panic::{CatchPanicLayer, ResponseForPanic};

use crate::error::ApiError;

/// The variable that adds the panicking route.
pub const FAILPOINT_ENV: &str = "RAILHOOK_FAILPOINT_API_PANIC";
/// The panicking route's path, outside `/v1`.
pub const FAILPOINT_PATH: &str = "/failpoints/panic";

/// Counts panics and answers them.
#[derive(Clone)]
pub struct PanicResponse {
    panics: IntCounter,
}

impl PanicResponse {
    /// Registers `railhook_api_panics_total` with `metrics` (once per registry; a second
    /// state on the same registry counts in a counter of its own, unexported).
    pub fn new(metrics: &Metrics) -> PanicResponse {
        let panics = IntCounter::new("railhook_api_panics_total", "Requests whose handler panicked (answered 500, connection kept).").expect("valid metric");
        if let Err(e) = metrics.registry().register(Box::new(panics.clone())) {
            tracing::debug!(error = %e, "panic counter not registered");
        }
        PanicResponse { panics }
    }

    pub fn layer(&self) -> CatchPanicLayer<PanicResponse> {
        CatchPanicLayer::custom(self.clone())
    }
}

impl ResponseForPanic for PanicResponse {
    type ResponseBody = Body;

    fn response_for_panic(&mut self, panic: Box<dyn Any + Send + 'static>) -> Response<Body> {
        self.panics.inc();
        let message = panic.downcast_ref::<&str>().copied().or_else(|| panic.downcast_ref::<String>().map(String::as_str)).unwrap_or("(not a string)");
        tracing::error!(panic = message, "a request handler panicked; answered 500");
        ApiError::internal().into_response()
    }
}

/// Whether the environment asks for the panicking route.
pub fn failpoint_from_env() -> bool {
    std::env::var(FAILPOINT_ENV).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// `GET /failpoints/panic`: panics, with text that must not reach the client.
pub async fn panic_now() -> ApiError {
    panic!("failpoint {FAILPOINT_ENV}: internals that must not leak (password=hunter2)")
}
