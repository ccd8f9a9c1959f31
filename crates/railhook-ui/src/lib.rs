//! The web dashboard at `/ui` on the API's port: server-rendered HTML (maud), one CSS and
//! one small script embedded in the binary, no CDN. `railhook-api` merges [`router`].
//!
//! Security contract, kept by [`security_headers`] and [`session`]:
//! - the credential (a project API key or the operator token) lives only in an HttpOnly,
//!   SameSite=Strict cookie scoped to `/ui`, `Secure` behind TLS;
//! - every form carries a CSRF token derived from that credential, checked on every POST;
//! - `Content-Security-Policy` allows scripts and styles from `/ui/assets` only, no inline
//!   script or style, no framing;
//! - every value that reaches HTML is escaped by maud; nothing is rendered with
//!   `PreEscaped` except the output of maud itself.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::{any, get, post};
use axum::Router;
use railhook_config::Config;
use railhook_store::Pool;

mod assets;
mod deliveries;
mod endpoints;
mod error;
mod failed;
mod failed_forwards;
mod form;
mod incoming;
mod overview;
mod page;
mod projects;
mod query;
pub mod relay;
mod replays;
mod sources;
pub mod session;
mod viewer;

/// What every page can reach: the API's configuration and pool, and the slot's recent
/// history for the relay page.
#[derive(Clone)]
pub struct UiState {
    pub config: Arc<Config>,
    pub pool: Pool,
    pub relay: Arc<relay::History>,
}

impl UiState {
    /// Starts the slot sampler when called inside a Tokio runtime (it ends with the state).
    pub fn new(config: Arc<Config>, pool: Pool) -> UiState {
        let relay = Arc::new(relay::History::default());
        relay::spawn_sampler(pool.clone(), config.relay.slot_name.clone(), &relay);
        UiState { config, pool, relay }
    }
}

/// Forms are small: a few ids and a token.
const MAX_FORM_BYTES: usize = 64 * 1024;

/// The dashboard's routes, at `/ui` (merged into the API's router, so `/ui` and `/ui/` both
/// reach the overview and an unknown `/ui/...` gets an HTML 404, not the API's JSON one).
pub fn router(state: UiState) -> Router {
    Router::new()
        .route("/ui", get(overview::page))
        .route("/ui/", get(overview::page))
        .route("/ui/sign-in", get(session::sign_in_page).post(session::sign_in))
        .route("/ui/sign-out", post(session::sign_out))
        .route("/ui/projects", get(projects::page))
        .route("/ui/projects/select", post(projects::select))
        .route("/ui/deliveries", get(deliveries::list))
        .route("/ui/deliveries/{id}", get(deliveries::detail))
        .route("/ui/deliveries/{id}/retry", post(deliveries::retry))
        .route("/ui/failed-messages", get(failed::list))
        .route("/ui/failed-messages/retry", post(failed::retry))
        .route("/ui/endpoints", get(endpoints::list))
        .route("/ui/endpoints/{id}/rotate-secret", post(endpoints::rotate_secret))
        .route("/ui/replays", get(replays::list).post(replays::create))
        .route("/ui/replays/estimate", get(replays::estimate))
        .route("/ui/replays/{id}", get(replays::detail))
        .route("/ui/replays/{id}/cancel", post(replays::cancel))
        .route("/ui/sources", get(sources::list))
        .route("/ui/sources/{id}", get(sources::detail))
        .route("/ui/incoming", get(incoming::list))
        .route("/ui/incoming/{id}", get(incoming::detail))
        .route("/ui/forwards/{id}/retry", post(incoming::retry))
        .route("/ui/failed-forwards", get(failed_forwards::list))
        .route("/ui/failed-forwards/retry", post(failed_forwards::retry))
        .route("/ui/relay", get(relay::page))
        .route("/ui/assets/{name}", get(assets::serve))
        .route("/ui/{*rest}", any(error::not_found))
        .layer(DefaultBodyLimit::max(MAX_FORM_BYTES))
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(state)
}

/// The policy: scripts and styles from our own origin only (the embedded assets), nothing
/// inline, no framing, forms post only to us.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Adds the security headers to every response of the dashboard, and `no-store` to every
/// page (they show a project's data; the embedded assets set their own caching).
async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
    response
}
