//! Endpoints (`/ui/endpoints`): each with its health, circuit state and concurrency in use,
//! and the rotation of its signing secret.

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Html;
use maud::{html, Markup};
use railhook_core::signing::EndpointSecret;
use railhook_core::EndpointId;
use railhook_store::endpoints::{self, Endpoint};
use serde::Deserialize;

use crate::deliveries::parse_opt;
use crate::error::{UiError, UiResult};
use crate::form::Form;
use crate::page::{self, next_page, paginate};
use crate::query::{self, EndpointHealth};
use crate::viewer::Viewer;
use crate::UiState;

const LIMIT: i64 = 50;

#[derive(Deserialize)]
pub struct Params {
    cursor: Option<String>,
}

/// `GET /ui/endpoints`
pub async fn list(viewer: Viewer, State(state): State<UiState>, Query(p): Query<Params>) -> UiResult<Html<String>> {
    let project = viewer.project()?;
    let after = parse_opt::<EndpointId>("cursor", p.cursor.as_deref().unwrap_or(""))?;
    let client = state.pool.get().await?;
    let rows = endpoints::list_endpoints(&**client, project, after, LIMIT + 1).await?;
    let (rows, next) = paginate(rows, LIMIT, |e| e.id.to_string());
    let ids: Vec<EndpointId> = rows.iter().map(|e| e.id).collect();
    let health = query::endpoint_health(&**client, project, &ids).await?;
    let limit = state.config.worker.endpoint_concurrency;
    let body = html! {
        h1 { "Endpoints" }
        @if rows.is_empty() { p { "No Endpoint yet: create one with " code { "POST /v1/endpoints" } "." } }
        @else {
            table {
                caption { "Endpoints, oldest first; health over the circuit's window and the last hour" }
                thead { tr {
                    th scope="col" { "Endpoint" } th scope="col" { "Health" } th scope="col" { "Circuit" }
                    th scope="col" { "Concurrency in use" } th scope="col" { "Failed (1 h)" } th scope="col" { "Secret" }
                } }
                tbody {
                    @for e in &rows { (row(&viewer, e, health.get(&e.id), limit)) }
                }
            }
        }
        (next_page("/ui/endpoints", "", "cursor", next))
    };
    Ok(page::frame(&viewer, "/ui/endpoints", "Endpoints", body))
}

/// `healthy`, `failing` (circuit not closed, or failures in the window or the last hour),
/// `idle` (nothing recorded) or `disabled`, with the badge class.
fn verdict(e: &Endpoint, h: Option<&EndpointHealth>) -> (&'static str, &'static str) {
    let Some(h) = h else { return ("idle", "wait") };
    if !e.enabled {
        return ("disabled", "wait");
    }
    let c = &h.circuit;
    let failing = c.state != "closed" || h.failed_last_hour > 0 || (c.window_failures > 0 && c.window_failures >= c.window_successes);
    match (failing, c.window_successes + c.window_failures) {
        (true, _) => ("failing", "bad"),
        (false, 0) => ("idle", "wait"),
        (false, _) => ("healthy", "ok"),
    }
}

fn row(viewer: &Viewer, e: &Endpoint, h: Option<&EndpointHealth>, limit: i32) -> Markup {
    let (word, class) = verdict(e, h);
    html! {
        tr data-endpoint=(e.id) {
            td {
                a href={ "/ui/deliveries?endpoint_id=" (e.id) } { code { (e.id) } }
                br; span { (e.url) }
                @if !e.description.is_empty() { br; span.muted { (e.description) } }
            }
            td { span class={ "badge " (class) } { (word) } }
            td { (page::circuit(h.map(|h| &h.circuit))) }
            td { (h.map_or(0, |h| h.in_flight)) @if limit > 0 { " / " (limit) } }
            td { (h.map_or(0, |h| h.failed_last_hour)) }
            td {
                form method="post" action={ "/ui/endpoints/" (e.id) "/rotate-secret" }
                    data-confirm="Rotate this Endpoint's signing secret? The old one keeps signing during the grace period." {
                    input type="hidden" name="csrf" value=(viewer.csrf);
                    button.secondary type="submit" aria-label={ "Rotate the secret of " (e.id) } { "Rotate secret" }
                }
            }
        }
    }
}

/// `POST /ui/endpoints/{id}/rotate-secret`: a new generated secret; the old one signs on
/// for `api.secret_rotation_grace_seconds`. The new secret is shown once, on this response.
pub async fn rotate_secret(
    viewer: Viewer,
    State(state): State<UiState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    form: Form,
) -> UiResult<Html<String>> {
    viewer.check(&headers, &form)?;
    let project = viewer.project()?;
    let id: EndpointId = id.parse().map_err(|e| UiError::bad_request(format!("Endpoint id: {e}")))?;
    let secret = EndpointSecret::generate();
    let mut client = state.pool.get().await?;
    let tx = client.transaction().await?;
    let grace = state.config.api.secret_rotation_grace_seconds;
    let rotation = endpoints::rotate_secret(&*tx, project, id, secret.as_str(), grace).await?.ok_or_else(|| UiError::not_found("Endpoint"))?;
    tx.commit().await?;
    let body = html! {
        h1 { "Secret rotated" }
        p.notice.ok role="status" { "Endpoint " code { (id) } " signs with a new secret from now on." }
        p { "Copy it now; this page is the only time the dashboard shows it:" }
        pre aria-label="New signing secret" { (secret.as_str()) }
        @if let Some(t) = rotation.previous_expires_at { p { "The previous secret signs too until " (page::time(t)) "." } }
        p { a href="/ui/endpoints" { "Back to the Endpoints" } }
    };
    Ok(page::frame(&viewer, "/ui/endpoints", "Secret rotated", body))
}
