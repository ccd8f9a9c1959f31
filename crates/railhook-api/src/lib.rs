//! `railhook api`: the HTTP API. Started as `run(state, listener, shutdown)` so the binary,
//! `railhook all` and the tests start it the same way.

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use axum::Router;
use railhook_config::Config;
use railhook_core::address::Resolver;
use railhook_store::Pool;
use railhook_telemetry::{Metrics, Ops, ReadyCheck, ServerLimits};
use tokio_util::sync::CancellationToken;

pub mod admin;
pub mod api_keys;
pub mod deliveries;
pub mod endpoints;
pub mod error;
pub mod events;
pub mod extract;
pub mod forwards;
pub mod incoming;
pub mod ingest;
pub mod ingress;
pub mod openapi;
pub mod pacing;
pub mod pagination;
pub mod panics;
pub mod replays;
pub mod schema;
pub mod sources;
pub mod subscriptions;

use error::ApiError;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub pool: Pool,
    pub metrics: Metrics,
    /// Resolves Endpoint host names when their URL is checked: the system resolver
    /// ([`AppState::new`]); tests give fixed answers.
    pub resolver: Resolver,
    /// Ingest pacing ([`pacing`]): off until [`run`] starts it.
    pub pacer: pacing::Pacer,
    /// `POST /v1/events` in batches ([`ingest`]).
    pub ingest: ingest::Ingest,
    /// Answers (and counts) a handler's panic ([`panics`]).
    pub panics: panics::PanicResponse,
    /// The test hook `GET /failpoints/panic` ([`panics::FAILPOINT_ENV`]); off by default.
    pub panic_route: bool,
    /// `/readyz` checks beside Postgres' (`railhook all` on Kafka: its worker's consumer
    /// has joined its group); none by default.
    pub ready_checks: Vec<(&'static str, ReadyCheck)>,
}

impl AppState {
    pub fn new(config: Arc<Config>, pool: Pool, metrics: Metrics) -> AppState {
        let panics = panics::PanicResponse::new(&metrics);
        let ingest = ingest::Ingest::new(pool.clone(), config.api.ingest_lanes, config.api.ingest_batch_max, &metrics);
        AppState {
            config,
            pool,
            metrics,
            resolver: railhook_core::address::system_resolver(),
            pacer: pacing::Pacer::off(),
            ingest,
            panics,
            panic_route: panics::failpoint_from_env(),
            ready_checks: Vec::new(),
        }
    }
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

/// The `/v1` routes.
fn v1(state: AppState) -> Router {
    Router::new()
        .route("/v1/admin/organizations", post(admin::create_organization))
        .route("/v1/admin/organizations/{org_id}/projects", post(admin::create_project))
        .route("/v1/admin/projects/{project_id}", get(admin::get_project).patch(admin::update_project))
        .route("/v1/api-keys", post(api_keys::create).get(api_keys::list))
        .route("/v1/api-keys/{id}", delete(api_keys::revoke))
        .route("/v1/events", post(events::create).get(events::list))
        .route("/v1/events/{id}", get(events::get))
        .route("/v1/deliveries", get(deliveries::list))
        .route("/v1/deliveries/{id}", get(deliveries::get))
        .route("/v1/deliveries/{id}/attempts", get(deliveries::attempts))
        .route("/v1/deliveries/{id}/retry", post(deliveries::retry))
        .route("/v1/failed-messages", get(deliveries::failed))
        .route("/v1/failed-messages/retry", post(deliveries::retry_failed))
        .route("/v1/endpoints", post(endpoints::create).get(endpoints::list))
        .route("/v1/endpoints/{id}", get(endpoints::get).patch(endpoints::update).delete(endpoints::delete))
        .route("/v1/endpoints/{id}/rotate-secret", post(endpoints::rotate_secret))
        .route("/v1/endpoints/{id}/secret", get(endpoints::secret))
        .route("/v1/subscriptions", post(subscriptions::create).get(subscriptions::list))
        .route("/v1/subscriptions/{id}", get(subscriptions::get).patch(subscriptions::update).delete(subscriptions::delete))
        .route("/v1/sources", post(sources::create).get(sources::list))
        .route("/v1/sources/{id}", get(sources::get).patch(sources::update).delete(sources::delete))
        .route("/v1/sources/{id}/disable", post(sources::disable))
        .route("/v1/sources/{id}/rotate-secret", post(sources::rotate_secret))
        .route("/v1/sources/{id}/destinations", post(sources::create_destination).get(sources::list_destinations))
        .route(
            "/v1/sources/{id}/destinations/{destination_id}",
            get(sources::get_destination).patch(sources::update_destination).delete(sources::delete_destination),
        )
        .route("/v1/incoming-events", get(incoming::list))
        .route("/v1/incoming-events/{id}", get(incoming::get))
        .route("/v1/incoming-events/{id}/replay", post(forwards::replay))
        .route("/v1/forwards/{id}/retry", post(forwards::retry))
        .route("/v1/failed-forwards", get(forwards::failed))
        .route("/v1/failed-forwards/retry", post(forwards::retry_failed))
        .route("/v1/replays", post(replays::create).get(replays::list))
        .route("/v1/replays/{id}", get(replays::get))
        .route("/v1/replays/{id}/cancel", post(replays::cancel))
        .route("/openapi.json", get(openapi::serve))
        .layer(DefaultBodyLimit::max(state.config.api.max_body_bytes))
        .layer(axum::middleware::from_fn({
            let limit = state.config.api.max_body_bytes;
            move |request, next| extract::declared_length_limit(limit, request, next)
        }))
        .with_state(state)
}

/// The whole router. Tests call it directly. A handler's panic anywhere in it is a JSON 500
/// ([`panics`]).
pub fn app(state: AppState) -> Router {
    let mut checks = vec![("postgres", postgres_check(state.pool.clone()))];
    checks.extend(state.ready_checks.iter().cloned());
    let ops = Ops::new(state.metrics.clone(), checks);
    let ingress = ingress::router(&state);
    let ui = railhook_ui::router(railhook_ui::UiState::new(state.config.clone(), state.pool.clone()));
    let (panics, panic_route) = (state.panics.clone(), state.panic_route);
    let mut router = v1(state).merge(ingress).merge(ui).merge(railhook_telemetry::ops_router(ops));
    if panic_route {
        router = router.route(panics::FAILPOINT_PATH, get(panics::panic_now));
    }
    router
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "route_not_found", "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "this route does not accept that method")
        })
        .layer(panics.layer())
}

/// Serves the API on `listener` until `shutdown` is cancelled, with the header and body read
/// timeouts, the connection cap and the lingering close of `api.*` (see
/// [`railhook_telemetry::serve_with`]); on shutdown the requests in flight finish first.
pub async fn run(mut state: AppState, listener: tokio::net::TcpListener, shutdown: CancellationToken) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    state.pacer = pacing::Pacer::start(&state.config.api, &state.config.database.url, &state.metrics, &shutdown);
    let limits = ServerLimits::from_api(&state.config.api);
    tracing::info!(%addr, max_connections = limits.max_connections, "api listening");
    railhook_telemetry::serve_with(listener, app(state), limits, shutdown).await
}
