//! `railhook api`: the HTTP API. Started as `run(state, listener, shutdown)` so the binary,
//! `railhook all` and the tests start it the same way.

use std::sync::Arc;

use axum::Router;
use railhook_config::Config;
use railhook_store::Pool;
use railhook_telemetry::{Metrics, Ops, ReadyCheck};
use tokio_util::sync::CancellationToken;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub pool: Pool,
    pub metrics: Metrics,
}

/// `/readyz` of the API: Postgres must answer.
fn postgres_check(pool: Pool) -> ReadyCheck {
    Arc::new(move || {
        let pool = pool.clone();
        Box::pin(async move {
            let client = pool.get().await.map_err(|e| e.to_string())?;
            client.simple_query("SELECT 1").await.map_err(|e| e.to_string())?;
            Ok(())
        })
    })
}

/// The whole router. Tests call it directly.
pub fn app(state: AppState) -> Router {
    let ops = Ops::new(state.metrics.clone(), vec![("postgres", postgres_check(state.pool.clone()))]);
    railhook_telemetry::ops_router(ops)
}

/// Serves the API on `listener` until `shutdown` is cancelled.
pub async fn run(state: AppState, listener: tokio::net::TcpListener, shutdown: CancellationToken) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "api listening");
    railhook_telemetry::serve(listener, app(state), shutdown).await
}
