//! Incoming Events (`/ui/incoming`): what providers sent to the project's Sources, filtered by
//! Source, provider event id and arrival time; one with its headers and body as they arrived,
//! its Forwards and their Attempts; and a retry of a FAILED Forward. Reads
//! `railhook_store::incoming` and `railhook_store::lifecycle::forward` only.

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use maud::{html, Markup};
use railhook_core::{DeliveryStatus, ForwardId, IncomingEventId, SourceId};
use railhook_store::incoming::{self, Forward, ForwardAttempt, IncomingEvent, IncomingEventFilter, IncomingEventSummary};
use railhook_store::lifecycle::forward::{self, ForwardRetryOutcome};
use serde::Deserialize;

use crate::deliveries::{parse_opt, parse_time, EXTRA_ATTEMPTS};
use crate::error::{UiError, UiResult};
use crate::form::Form;
use crate::page::{self, next_page, paginate, query_string};
use crate::viewer::Viewer;
use crate::UiState;

const LIMIT: i64 = 50;
/// The most of a body the page shows (the ingress keeps up to `ingress.max_body_bytes`).
const BODY_SHOWN: usize = 64 * 1024;

#[derive(Deserialize, Default)]
pub struct Filters {
    #[serde(default)]
    source_id: String,
    #[serde(default)]
    provider_event_id: String,
    #[serde(default)]
    received_after: String,
    #[serde(default)]
    received_before: String,
    cursor: Option<String>,
}

impl Filters {
    fn encoded(&self) -> String {
        query_string(&[
            ("source_id", &self.source_id),
            ("provider_event_id", &self.provider_event_id),
            ("received_after", &self.received_after),
            ("received_before", &self.received_before),
        ])
    }

    fn to_store(&self) -> UiResult<IncomingEventFilter> {
        let received_after = parse_time("Received from", &self.received_after)?;
        let received_before = parse_time("Received before", &self.received_before)?;
        if matches!((received_after, received_before), (Some(a), Some(b)) if b <= a) {
            return Err(UiError::bad_request("“Received before” must be later than “Received from”."));
        }
        let provider_event_id = self.provider_event_id.trim();
        Ok(IncomingEventFilter {
            source_id: parse_opt::<SourceId>("Source", &self.source_id)?,
            provider_event_id: (!provider_event_id.is_empty()).then(|| provider_event_id.to_string()),
            received_after,
            received_before,
            after: parse_opt::<IncomingEventId>("cursor", self.cursor.as_deref().unwrap_or(""))?,
            limit: LIMIT + 1,
        })
    }
}

/// `GET /ui/incoming`
pub async fn list(viewer: Viewer, State(state): State<UiState>, Query(f): Query<Filters>) -> UiResult<Html<String>> {
    let project = viewer.project()?;
    let filter = f.to_store()?;
    let client = state.pool.get().await?;
    let rows = incoming::list_incoming_events(&**client, project, &filter).await?;
    let (rows, next) = paginate(rows, LIMIT, |e| e.id.to_string());
    let body = html! {
        h1 { "Incoming Events" }
        (filter_form(&f))
        (table(&rows))
        (next_page("/ui/incoming", &f.encoded(), "cursor", next))
    };
    Ok(page::frame(&viewer, "/ui/incoming", "Incoming Events", body))
}

fn filter_form(f: &Filters) -> Markup {
    html! {
        form.filters method="get" action="/ui/incoming" aria-label="Filter Incoming Events" {
            div { label for="source_id" { "Source" } input #source_id name="source_id" value=(f.source_id) placeholder="src_..." size="30"; }
            div { label for="provider_event_id" { "Provider event id" } input #provider_event_id name="provider_event_id" value=(f.provider_event_id) placeholder="evt_..."; }
            div { label for="received_after" { "Received from (UTC)" } input #received_after type="datetime-local" name="received_after" value=(f.received_after); }
            div { label for="received_before" { "Received before (UTC)" } input #received_before type="datetime-local" name="received_before" value=(f.received_before); }
            div { button type="submit" { "Filter" } }
        }
    }
}

fn table(rows: &[IncomingEventSummary]) -> Markup {
    html! {
        @if rows.is_empty() { p { "No Incoming Event matches." } }
        @else {
            table {
                caption { "Incoming Events, oldest first" }
                thead { tr {
                    th scope="col" { "Incoming Event" } th scope="col" { "Source" } th scope="col" { "Provider event id" }
                    th scope="col" { "Request" } th scope="col" { "Received" }
                } }
                tbody {
                    @for e in rows {
                        tr {
                            td { a href={ "/ui/incoming/" (e.id) } { code { (e.id) } } }
                            td { a href={ "/ui/sources/" (e.source_id) } { code { (e.source_id) } } }
                            td { (e.provider_event_id.as_deref().unwrap_or("—")) }
                            td { (e.method) " · " (e.content_type.as_deref().unwrap_or("no content type")) " · " (e.body_size) " bytes" }
                            td { (page::time(e.received_at)) }
                        }
                    }
                }
            }
        }
    }
}

#[derive(Deserialize)]
pub struct DetailParams {
    retried: Option<String>,
}

/// `GET /ui/incoming/{id}`
pub async fn detail(viewer: Viewer, State(state): State<UiState>, Path(id): Path<String>, Query(p): Query<DetailParams>) -> UiResult<Html<String>> {
    let project = viewer.project()?;
    let id: IncomingEventId = id.parse().map_err(|e| UiError::bad_request(format!("Incoming Event id: {e}")))?;
    let client = state.pool.get().await?;
    let event = incoming::get_incoming_event(&**client, project, id).await?.ok_or_else(|| UiError::not_found("Incoming Event"))?;
    let in_flight = event.forwards.iter().any(|f| !f.status.is_terminal());
    let body = html! {
        div data-refresh-seconds=[in_flight.then_some("3")] {
            h1 { "Incoming Event " code { (event.summary.id) } }
            @if p.retried.is_some() { p.notice.ok role="status" { "The Forward is back on its Retry Ladder: the next Attempt is due now." } }
            (facts(&event.summary))
            h2 { "Request as it arrived" }
            (request(&event))
            h2 { "Forwards" }
            @if event.forwards.is_empty() { p { "No Forward: the Source had no enabled Destination when this arrived." } }
            @for f in &event.forwards { (forward_section(&viewer, f)) }
        }
    };
    Ok(page::frame(&viewer, "/ui/incoming", &format!("Incoming Event {}", event.summary.id), body))
}

fn facts(e: &IncomingEventSummary) -> Markup {
    html! {
        dl.facts {
            dt { "Source" } dd { a href={ "/ui/sources/" (e.source_id) } { code { (e.source_id) } } }
            dt { "Provider event id" } dd { (e.provider_event_id.as_deref().unwrap_or("—")) }
            dt { "Received" } dd { (page::time(e.received_at)) }
            dt { "Body" } dd { (e.body_size) " bytes · SHA-256 " code { (hex(&e.body_sha256)) } }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn request(e: &IncomingEvent) -> Markup {
    let shown = &e.body[..e.body.len().min(BODY_SHOWN)];
    let text = String::from_utf8_lossy(shown);
    html! {
        pre aria-label="Request headers" {
            (e.summary.method) " /ingress/…\n"
            @for h in &e.headers {
                (h.name) ": "
                @match (&h.value, &h.value_base64) { (Some(v), _) => { (v) } (None, Some(b)) => { "(base64) " (b) } (None, None) => {} }
                "\n"
            }
        }
        pre aria-label="Request body" { (text) }
        @if e.body.len() > BODY_SHOWN { p.hint { "Only the first " (BODY_SHOWN / 1024) " KiB are shown; the whole body is stored." } }
    }
}

fn forward_section(viewer: &Viewer, f: &Forward) -> Markup {
    html! {
        section.attempt aria-label={ "Forward " (f.id) } {
            h3 { "Forward " code { (f.id) } " · " (page::status(f.status)) }
            p.hint {
                "to Destination " code { (f.destination_id) } " · " (f.attempt_count) " of at most " (f.max_attempts) " Attempts"
                @if let Some(t) = f.next_retry_at.filter(|_| f.status == DeliveryStatus::Pending) { " · next " (page::time(t)) }
                @if let Some(e) = &f.last_error { " · " (e) }
            }
            @if f.status == DeliveryStatus::Failed {
                form.actions method="post" action={ "/ui/forwards/" (f.id) "/retry" } {
                    input type="hidden" name="csrf" value=(viewer.csrf);
                    button type="submit" aria-label={ "Retry Forward " (f.id) } { "Retry this Forward" }
                }
            }
            @if f.attempts.is_empty() { p.muted { "No Attempt yet." } }
            @else { (attempts(&f.attempts)) }
        }
    }
}

fn attempts(rows: &[ForwardAttempt]) -> Markup {
    html! {
        table {
            caption { "Attempts" }
            thead { tr { th scope="col" { "#" } th scope="col" { "Result" } th scope="col" { "HTTP" } th scope="col" { "Started" } th scope="col" { "Duration" } th scope="col" { "Error or response" } } }
            tbody {
                @for a in rows {
                    tr {
                        td { (a.attempt_number) }
                        td { span class={ "badge " (if a.result == "success" { "ok" } else { "bad" }) } { (a.result) } }
                        td { @if let Some(c) = a.status_code { (c) } @else { "—" } }
                        td { (page::time(a.started_at)) }
                        td { (a.duration_ms) " ms" }
                        td { (a.error_message.as_deref().or(a.response_body.as_deref()).unwrap_or("")) @if a.response_truncated { " …" } }
                    }
                }
            }
        }
    }
}

/// `POST /ui/forwards/{id}/retry`: one more Attempt of a FAILED Forward, due now.
pub async fn retry(viewer: Viewer, State(state): State<UiState>, Path(id): Path<String>, headers: HeaderMap, form: Form) -> UiResult<Response> {
    viewer.check(&headers, &form)?;
    let project = viewer.project()?;
    let id: ForwardId = id.parse().map_err(|e| UiError::bad_request(format!("Forward id: {e}")))?;
    let client = state.pool.get().await?;
    match forward::retry(&**client, project, id, EXTRA_ATTEMPTS).await? {
        ForwardRetryOutcome::Retried(f) => Ok((StatusCode::SEE_OTHER, [(header::LOCATION, format!("/ui/incoming/{}?retried=1", f.incoming_event_id))]).into_response()),
        ForwardRetryOutcome::NotFailed(s) => Err(UiError::Client(StatusCode::CONFLICT, format!("Only a FAILED Forward can be retried; this one is {s}."))),
        ForwardRetryOutcome::NotFound => Err(UiError::not_found("Forward")),
    }
}
