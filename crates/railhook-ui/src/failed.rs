//! Failed Messages (`/ui/failed-messages`): abandoned Deliveries, filtered like the API's
//! list, and putting the selected ones (or every one that matches) back on the ladder.

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use maud::{html, Markup};
use railhook_core::pattern::EventType;
use railhook_core::{DeliveryId, EndpointId};
use railhook_store::deliveries::{self, BulkSelection, FailedFilter, FailedMessage};
use serde::Deserialize;

use crate::deliveries::{parse_opt, parse_time, EXTRA_ATTEMPTS};
use crate::error::{UiError, UiResult};
use crate::form::Form;
use crate::page::{self, next_page, paginate, query_string};
use crate::viewer::Viewer;
use crate::UiState;

const LIMIT: i64 = 50;
/// The most one bulk retry takes (the API's bound: one statement holds the row locks).
const MAX_BULK: usize = 1000;

#[derive(Deserialize, Default)]
pub struct Filters {
    #[serde(default)]
    endpoint_id: String,
    #[serde(default)]
    event_type: String,
    #[serde(default)]
    failed_after: String,
    #[serde(default)]
    failed_before: String,
    cursor: Option<String>,
    retried: Option<usize>,
    skipped: Option<usize>,
}

impl Filters {
    fn encoded(&self) -> String {
        query_string(&[
            ("endpoint_id", &self.endpoint_id),
            ("event_type", &self.event_type),
            ("failed_after", &self.failed_after),
            ("failed_before", &self.failed_before),
        ])
    }
}

/// The store's filter from what the page (or the bulk form, which repeats the filters)
/// was given.
fn store_filter(endpoint_id: &str, event_type: &str, after: &str, before: &str) -> UiResult<FailedFilter> {
    let event_type = event_type.trim();
    if !event_type.is_empty() {
        EventType::parse(event_type).map_err(|e| UiError::bad_request(format!("Event type: {e}")))?;
    }
    let completed_after = parse_time("Failed from", after)?;
    let completed_before = parse_time("Failed before", before)?;
    if matches!((completed_after, completed_before), (Some(a), Some(b)) if b <= a) {
        return Err(UiError::bad_request("“Failed before” must be later than “Failed from”."));
    }
    Ok(FailedFilter {
        endpoint_id: parse_opt::<EndpointId>("Endpoint", endpoint_id)?,
        event_type: (!event_type.is_empty()).then(|| event_type.to_string()),
        completed_after,
        completed_before,
    })
}

/// `GET /ui/failed-messages`
pub async fn list(viewer: Viewer, State(state): State<UiState>, Query(f): Query<Filters>) -> UiResult<Html<String>> {
    let project = viewer.project()?;
    let filter = store_filter(&f.endpoint_id, &f.event_type, &f.failed_after, &f.failed_before)?;
    let after = parse_opt::<DeliveryId>("cursor", f.cursor.as_deref().unwrap_or(""))?;
    let client = state.pool.get().await?;
    let rows = deliveries::list_failed(&**client, project, &filter, after, LIMIT + 1).await?;
    let (rows, next) = paginate(rows, LIMIT, |m| m.delivery_id.to_string());
    let body = html! {
        h1 { "Failed Messages" }
        @if let Some(n) = f.retried {
            p.notice.ok role="status" { (n) " put back on the Retry Ladder." @if let Some(s) = f.skipped.filter(|s| *s > 0) { " " (s) " skipped (no longer FAILED, or busy)." } }
        }
        (filter_form(&f))
        (bulk_form(&viewer, &f, &rows))
        (next_page("/ui/failed-messages", &f.encoded(), "cursor", next))
    };
    Ok(page::frame(&viewer, "/ui/failed-messages", "Failed Messages", body))
}

fn filter_form(f: &Filters) -> Markup {
    html! {
        form.filters method="get" action="/ui/failed-messages" aria-label="Filter Failed Messages" {
            div { label for="endpoint_id" { "Endpoint" } input #endpoint_id name="endpoint_id" value=(f.endpoint_id) placeholder="ep_..." size="30"; }
            div { label for="event_type" { "Event type" } input #event_type name="event_type" value=(f.event_type) placeholder="order.paid"; }
            div { label for="failed_after" { "Failed from (UTC)" } input #failed_after type="datetime-local" name="failed_after" value=(f.failed_after); }
            div { label for="failed_before" { "Failed before (UTC)" } input #failed_before type="datetime-local" name="failed_before" value=(f.failed_before); }
            div { button type="submit" { "Filter" } }
        }
    }
}

fn bulk_form(viewer: &Viewer, f: &Filters, rows: &[FailedMessage]) -> Markup {
    if rows.is_empty() {
        return html! { p { "No Failed Message matches." } };
    }
    html! {
        form method="post" action="/ui/failed-messages/retry" {
            input type="hidden" name="csrf" value=(viewer.csrf);
            input type="hidden" name="endpoint_id" value=(f.endpoint_id);
            input type="hidden" name="event_type" value=(f.event_type);
            input type="hidden" name="failed_after" value=(f.failed_after);
            input type="hidden" name="failed_before" value=(f.failed_before);
            div.actions {
                button type="submit" name="scope" value="selected" { "Retry selected" }
                button.secondary type="submit" name="scope" value="matching" { "Retry every match (up to " (MAX_BULK) ")" }
            }
            table {
                caption { "Failed Messages, oldest first" }
                thead { tr {
                    th scope="col" { input type="checkbox" data-select-all="id" aria-label="Select every Failed Message on this page"; }
                    th scope="col" { "Delivery" } th scope="col" { "Event type" } th scope="col" { "Endpoint" }
                    th scope="col" { "Attempts" } th scope="col" { "Failed" } th scope="col" { "Last error" }
                } }
                tbody {
                    @for m in rows {
                        tr {
                            td { input type="checkbox" name="id" value=(m.delivery_id) aria-label={ "Select " (m.delivery_id) }; }
                            td { a href={ "/ui/deliveries/" (m.delivery_id) } { code { (m.delivery_id) } } }
                            td { (m.event_type) }
                            td { code { (m.endpoint_id) } }
                            td { (m.attempt_count) }
                            td { (page::maybe_time(m.completed_at)) }
                            td { (m.last_error.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
        }
    }
}

/// `POST /ui/failed-messages/retry`: `scope=selected` retries the checked ids,
/// `scope=matching` every Failed Message the filters match (up to [`MAX_BULK`]).
pub async fn retry(viewer: Viewer, State(state): State<UiState>, headers: HeaderMap, form: Form) -> UiResult<Response> {
    viewer.check(&headers, &form)?;
    let project = viewer.project()?;
    let field = |name: &str| form.get(name).unwrap_or("").to_string();
    let filter = store_filter(&field("endpoint_id"), &field("event_type"), &field("failed_after"), &field("failed_before"))?;
    let ids: Vec<DeliveryId> = form
        .all("id")
        .iter()
        .map(|s| s.parse().map_err(|e| UiError::bad_request(format!("Delivery id: {e}"))))
        .collect::<UiResult<_>>()?;
    let selection = match form.get("scope") {
        Some("selected") if ids.is_empty() => return Err(UiError::bad_request("Select at least one Failed Message.")),
        Some("selected") if ids.len() > MAX_BULK => return Err(UiError::bad_request(format!("Select at most {MAX_BULK}."))),
        Some("selected") => BulkSelection::Ids(&ids),
        Some("matching") => BulkSelection::Filter(&filter, MAX_BULK as i64),
        _ => return Err(UiError::bad_request("Choose “Retry selected” or “Retry every match”.")),
    };
    let client = state.pool.get().await?;
    let outcome = deliveries::retry_many(&**client, project, selection, EXTRA_ATTEMPTS).await?;
    let back = query_string(&[
        ("endpoint_id", &field("endpoint_id")),
        ("event_type", &field("event_type")),
        ("failed_after", &field("failed_after")),
        ("failed_before", &field("failed_before")),
        ("retried", &outcome.retried.len().to_string()),
        ("skipped", &outcome.skipped.len().to_string()),
    ]);
    Ok((StatusCode::SEE_OTHER, [(header::LOCATION, format!("/ui/failed-messages?{back}"))]).into_response())
}
