//! Failed Forwards (`/ui/failed-forwards`): Forwards that ran out of Attempts, filtered by
//! Source, Destination and when they failed, and putting the selected ones (or every match)
//! back on their ladder. `railhook_store::lifecycle::forward::{list_failed, retry_many}`.

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use maud::{html, Markup};
use railhook_core::{DestinationId, ForwardId, SourceId};
use railhook_store::lifecycle::forward::{self, FailedForwardFilter, ForwardSelection, ForwardSummary};
use serde::Deserialize;

use crate::deliveries::{parse_opt, parse_time, EXTRA_ATTEMPTS};
use crate::error::{UiError, UiResult};
use crate::form::Form;
use crate::page::{self, next_page, paginate, query_string};
use crate::viewer::Viewer;
use crate::UiState;

const LIMIT: i64 = 50;
/// The most one bulk retry takes (the API's bound).
const MAX_BULK: usize = 1000;
const FIELDS: [&str; 4] = ["source_id", "destination_id", "failed_after", "failed_before"];

#[derive(Deserialize, Default)]
pub struct Filters {
    #[serde(default)]
    source_id: String,
    #[serde(default)]
    destination_id: String,
    #[serde(default)]
    failed_after: String,
    #[serde(default)]
    failed_before: String,
    cursor: Option<String>,
    retried: Option<usize>,
    skipped: Option<usize>,
}

impl Filters {
    fn values(&self) -> [&str; 4] {
        [&self.source_id, &self.destination_id, &self.failed_after, &self.failed_before]
    }

    fn encoded(&self) -> String {
        let v = self.values();
        query_string(&FIELDS.iter().copied().zip(v).collect::<Vec<_>>())
    }
}

fn store_filter([source, destination, after, before]: [&str; 4]) -> UiResult<FailedForwardFilter> {
    let completed_after = parse_time("Failed from", after)?;
    let completed_before = parse_time("Failed before", before)?;
    if matches!((completed_after, completed_before), (Some(a), Some(b)) if b <= a) {
        return Err(UiError::bad_request("“Failed before” must be later than “Failed from”."));
    }
    Ok(FailedForwardFilter {
        source_id: parse_opt::<SourceId>("Source", source)?,
        destination_id: parse_opt::<DestinationId>("Destination", destination)?,
        completed_after,
        completed_before,
    })
}

/// `GET /ui/failed-forwards`
pub async fn list(viewer: Viewer, State(state): State<UiState>, Query(f): Query<Filters>) -> UiResult<Html<String>> {
    let project = viewer.project()?;
    let filter = store_filter(f.values())?;
    let after = parse_opt::<ForwardId>("cursor", f.cursor.as_deref().unwrap_or(""))?;
    let client = state.pool.get().await?;
    let rows = forward::list_failed(&**client, project, &filter, after, LIMIT + 1).await?;
    let (rows, next) = paginate(rows, LIMIT, |m| m.id.to_string());
    let body = html! {
        h1 { "Failed Forwards" }
        @if let Some(n) = f.retried {
            p.notice.ok role="status" { (n) " put back on the Retry Ladder." @if let Some(s) = f.skipped.filter(|s| *s > 0) { " " (s) " skipped (no longer FAILED, or busy)." } }
        }
        (filter_form(&f))
        (bulk_form(&viewer, &f, &rows))
        (next_page("/ui/failed-forwards", &f.encoded(), "cursor", next))
    };
    Ok(page::frame(&viewer, "/ui/failed-forwards", "Failed Forwards", body))
}

fn filter_form(f: &Filters) -> Markup {
    html! {
        form.filters method="get" action="/ui/failed-forwards" aria-label="Filter failed Forwards" {
            div { label for="source_id" { "Source" } input #source_id name="source_id" value=(f.source_id) placeholder="src_..." size="30"; }
            div { label for="destination_id" { "Destination" } input #destination_id name="destination_id" value=(f.destination_id) placeholder="dst_..." size="30"; }
            div { label for="failed_after" { "Failed from (UTC)" } input #failed_after type="datetime-local" name="failed_after" value=(f.failed_after); }
            div { label for="failed_before" { "Failed before (UTC)" } input #failed_before type="datetime-local" name="failed_before" value=(f.failed_before); }
            div { button type="submit" { "Filter" } }
        }
    }
}

fn bulk_form(viewer: &Viewer, f: &Filters, rows: &[ForwardSummary]) -> Markup {
    if rows.is_empty() {
        return html! { p { "No failed Forward matches." } };
    }
    html! {
        form method="post" action="/ui/failed-forwards/retry" {
            input type="hidden" name="csrf" value=(viewer.csrf);
            @for (name, value) in FIELDS.iter().zip(f.values()) { input type="hidden" name=(name) value=(value); }
            div.actions {
                button type="submit" name="scope" value="selected" { "Retry selected" }
                button.secondary type="submit" name="scope" value="matching" { "Retry every match (up to " (MAX_BULK) ")" }
            }
            table {
                caption { "Failed Forwards, oldest first" }
                thead { tr {
                    th scope="col" { input type="checkbox" data-select-all="id" aria-label="Select every failed Forward on this page"; }
                    th scope="col" { "Forward" } th scope="col" { "Incoming Event" } th scope="col" { "Destination" }
                    th scope="col" { "Attempts" } th scope="col" { "Failed" } th scope="col" { "Last error" }
                } }
                tbody {
                    @for m in rows {
                        tr {
                            td { input type="checkbox" name="id" value=(m.id) aria-label={ "Select " (m.id) }; }
                            td { code { (m.id) } }
                            td { a href={ "/ui/incoming/" (m.incoming_event_id) } { code { (m.incoming_event_id) } } }
                            td { code { (m.destination_id) } }
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

/// `POST /ui/failed-forwards/retry`: `scope=selected` or `scope=matching`.
pub async fn retry(viewer: Viewer, State(state): State<UiState>, headers: HeaderMap, form: Form) -> UiResult<Response> {
    viewer.check(&headers, &form)?;
    let project = viewer.project()?;
    let values = FIELDS.map(|name| form.get(name).unwrap_or(""));
    let filter = store_filter(values)?;
    let ids: Vec<ForwardId> = form
        .all("id")
        .iter()
        .map(|s| s.parse().map_err(|e| UiError::bad_request(format!("Forward id: {e}"))))
        .collect::<UiResult<_>>()?;
    let selection = match form.get("scope") {
        Some("selected") if ids.is_empty() => return Err(UiError::bad_request("Select at least one failed Forward.")),
        Some("selected") if ids.len() > MAX_BULK => return Err(UiError::bad_request(format!("Select at most {MAX_BULK}."))),
        Some("selected") => ForwardSelection::Ids(&ids),
        Some("matching") => ForwardSelection::Filter(&filter, MAX_BULK as i64),
        _ => return Err(UiError::bad_request("Choose “Retry selected” or “Retry every match”.")),
    };
    let client = state.pool.get().await?;
    let outcome = forward::retry_many(&**client, project, selection, EXTRA_ATTEMPTS).await?;
    let (retried, skipped) = (outcome.retried.len().to_string(), outcome.skipped.len().to_string());
    let mut pairs: Vec<(&str, &str)> = FIELDS.iter().copied().zip(values).collect();
    pairs.extend([("retried", retried.as_str()), ("skipped", skipped.as_str())]);
    Ok((StatusCode::SEE_OTHER, [(header::LOCATION, format!("/ui/failed-forwards?{}", query_string(&pairs)))]).into_response())
}
