//! Sources (`/ui/sources`): the project's Sources with their provider, state and ingress URL,
//! and one Source with its Destinations and their circuits. Reads `railhook_store::sources`
//! and the Destinations' circuits (`query::destination_circuits`).

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap};
use axum::response::Html;
use maud::{html, Markup};
use railhook_core::{DestinationId, SourceId};
use railhook_store::sources::{self, Destination, DestinationAuth, Source};
use serde::Deserialize;

use crate::deliveries::parse_opt;
use crate::error::{UiError, UiResult};
use crate::page::{self, next_page, paginate};
use crate::query::{self, Circuit};
use crate::viewer::Viewer;
use crate::UiState;

const LIMIT: i64 = 50;

#[derive(Deserialize)]
pub struct Params {
    cursor: Option<String>,
}

/// Where a provider sends: under `ingress.public_url` when set, else this request's host
/// (what the API's ingress itself assumes).
pub fn ingress_url(state: &UiState, headers: &HeaderMap, token: &str) -> String {
    let base = state.config.ingress.public_url.trim_end_matches('/');
    if !base.is_empty() {
        return format!("{base}/ingress/{token}");
    }
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("<api host>");
    format!("http://{host}/ingress/{token}")
}

fn enabled(on: bool) -> Markup {
    html! { @if on { span.badge.ok { "enabled" } } @else { span.badge.bad { "disabled" } } }
}

/// `GET /ui/sources`
pub async fn list(viewer: Viewer, State(state): State<UiState>, headers: HeaderMap, Query(p): Query<Params>) -> UiResult<Html<String>> {
    let project = viewer.project()?;
    let after = parse_opt::<SourceId>("cursor", p.cursor.as_deref().unwrap_or(""))?;
    let client = state.pool.get().await?;
    let rows = sources::list_sources(&**client, project, after, LIMIT + 1).await?;
    let (rows, next) = paginate(rows, LIMIT, |s| s.id.to_string());
    let body = html! {
        h1 { "Sources" }
        p.hint { "A provider (Stripe, GitHub, ...) sends to a Source's ingress URL; Railhook checks its signature and forwards to the Source's Destinations." }
        @if rows.is_empty() { p { "No Source yet. Create one with " code { "POST /v1/sources" } "." } }
        @else {
            table {
                caption { "Sources, oldest first" }
                thead { tr { th scope="col" { "Source" } th scope="col" { "Name" } th scope="col" { "Provider" } th scope="col" { "State" } th scope="col" { "Ingress URL" } th scope="col" { "Created" } } }
                tbody {
                    @for s in &rows {
                        tr {
                            td { a href={ "/ui/sources/" (s.id) } { code { (s.id) } } }
                            td { (s.name) }
                            td { (s.provider) }
                            td { (enabled(s.enabled)) }
                            td { code.wrap { (ingress_url(&state, &headers, &s.ingress_token)) } }
                            td { (page::time(s.created_at)) }
                        }
                    }
                }
            }
        }
        (next_page("/ui/sources", "", "cursor", next))
    };
    Ok(page::frame(&viewer, "/ui/sources", "Sources", body))
}

/// `GET /ui/sources/{id}`
pub async fn detail(viewer: Viewer, State(state): State<UiState>, headers: HeaderMap, Path(id): Path<String>, Query(p): Query<Params>) -> UiResult<Html<String>> {
    let project = viewer.project()?;
    let id: SourceId = id.parse().map_err(|e| UiError::bad_request(format!("Source id: {e}")))?;
    let after = parse_opt::<DestinationId>("cursor", p.cursor.as_deref().unwrap_or(""))?;
    let client = state.pool.get().await?;
    let source = sources::get_source(&**client, project, id).await?.ok_or_else(|| UiError::not_found("Source"))?;
    let destinations = sources::list_destinations(&**client, project, id, after, LIMIT + 1).await?.unwrap_or_default();
    let (destinations, next) = paginate(destinations, LIMIT, |d| d.id.to_string());
    let ids: Vec<DestinationId> = destinations.iter().map(|d| d.id).collect();
    let circuits = query::destination_circuits(&**client, project, &ids).await?;
    let body = html! {
        h1 { "Source " code { (source.id) } }
        (facts(&state, &headers, &source))
        p { a href={ "/ui/incoming?source_id=" (source.id) } { "Incoming Events of this Source" } " · " a href={ "/ui/failed-forwards?source_id=" (source.id) } { "its failed Forwards" } }
        h2 { "Destinations" }
        (destination_table(&destinations, &circuits))
        (next_page(&format!("/ui/sources/{}", source.id), "", "cursor", next))
    };
    Ok(page::frame(&viewer, "/ui/sources", &format!("Source {}", source.id), body))
}

fn facts(state: &UiState, headers: &HeaderMap, s: &Source) -> Markup {
    html! {
        dl.facts {
            dt { "Name" } dd { (s.name) }
            dt { "Provider" } dd { (s.provider) }
            dt { "State" } dd { (enabled(s.enabled)) }
            dt { "Ingress URL" } dd { code.wrap { (ingress_url(state, headers, &s.ingress_token)) } }
            dt { "Rate limit" } dd { @match s.rate_limit_per_second { Some(n) => { (n) " requests/s" } None => { "none" } } }
            dt { "Created" } dd { (page::time(s.created_at)) }
            dt { "Updated" } dd { (page::time(s.updated_at)) }
        }
    }
}

/// The kind of authentication only, never its secret.
fn auth_kind(a: &DestinationAuth) -> &'static str {
    match a {
        DestinationAuth::None => "none",
        DestinationAuth::Basic { .. } => "basic",
        DestinationAuth::Bearer { .. } => "bearer",
        DestinationAuth::Header { .. } => "header",
        DestinationAuth::StandardWebhooks { .. } => "standard webhooks",
    }
}

fn destination_table(rows: &[Destination], circuits: &std::collections::HashMap<DestinationId, Circuit>) -> Markup {
    html! {
        @if rows.is_empty() { p { "No Destination: what arrives is stored, and forwarded nowhere." } }
        @else {
            table {
                caption { "Destinations, oldest first" }
                thead { tr {
                    th scope="col" { "Destination" } th scope="col" { "URL" } th scope="col" { "Auth" } th scope="col" { "State" }
                    th scope="col" { "Circuit" } th scope="col" { "Rate limit" }
                } }
                tbody {
                    @for d in rows {
                        tr data-destination=(d.id) {
                            td { code { (d.id) } }
                            td { code.wrap { (d.url) } }
                            td { (auth_kind(&d.auth)) }
                            td { (enabled(d.enabled)) }
                            td { (page::circuit(circuits.get(&d.id))) }
                            td { @match d.rate_limit_per_second { Some(n) => { (n) "/s" } None => { "none" } } }
                        }
                    }
                }
            }
        }
    }
}
