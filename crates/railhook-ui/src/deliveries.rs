//! Deliveries (`/ui/deliveries`): the list, filtered by status, Endpoint, event type and
//! creation time; one Delivery with its Event and every Attempt; and a retry of a FAILED one.

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, NaiveDateTime, Utc};
use maud::{html, Markup};
use railhook_core::pattern::EventType;
use railhook_core::{AttemptId, DeliveryId, DeliveryStatus, EndpointId};
use railhook_store::deliveries::{self, Attempt, Delivery, DeliveryFilter, RetryOutcome};
use railhook_store::{endpoints, events};
use serde::Deserialize;

use crate::error::{UiError, UiResult};
use crate::form::Form;
use crate::page::{self, next_page, paginate, query_string};
use crate::query::{self, ByType, DeliveryRow};
use crate::viewer::Viewer;
use crate::UiState;

const LIMIT: i64 = 50;
/// Attempts per page of a Delivery (the API's largest page).
const ATTEMPTS_LIMIT: i64 = 200;
/// Attempts a retry from the dashboard adds (the API's default).
pub const EXTRA_ATTEMPTS: i32 = 1;

/// The list's query string; every field optional, empty means "any".
#[derive(Deserialize, Default)]
pub struct Filters {
    #[serde(default)]
    status: String,
    #[serde(default)]
    endpoint_id: String,
    #[serde(default)]
    event_type: String,
    #[serde(default)]
    created_after: String,
    #[serde(default)]
    created_before: String,
    cursor: Option<String>,
}

impl Filters {
    fn encoded(&self) -> String {
        query_string(&[
            ("status", &self.status),
            ("endpoint_id", &self.endpoint_id),
            ("event_type", &self.event_type),
            ("created_after", &self.created_after),
            ("created_before", &self.created_before),
        ])
    }

    fn to_store(&self) -> UiResult<DeliveryFilter> {
        let status = match self.status.as_str() {
            "" => None,
            s => Some(s.parse::<DeliveryStatus>().map_err(|_| UiError::bad_request("Status must be PENDING, PROCESSING, SUCCESS or FAILED."))?),
        };
        let created_after = parse_time("Created from", &self.created_after)?;
        let created_before = parse_time("Created before", &self.created_before)?;
        if matches!((created_after, created_before), (Some(a), Some(b)) if b <= a) {
            return Err(UiError::bad_request("“Created before” must be later than “Created from”."));
        }
        let cursor = parse_opt::<DeliveryId>("cursor", self.cursor.as_deref().unwrap_or(""))?;
        Ok(DeliveryFilter {
            status,
            endpoint_id: parse_opt::<EndpointId>("Endpoint", &self.endpoint_id)?,
            event_id: None,
            created_after,
            created_before,
            after: cursor.max(created_after.map(ids_from)),
            limit: LIMIT + 1,
        })
    }
}

/// The greatest id below every Delivery created at `t` or later, to start the list's id-order
/// scan there instead of at the project's first Delivery (1,000,000 rows read for "the last
/// hour" otherwise: docs/UI.md, tests/ui/bigdb). Exact: a Delivery's id is
/// `railhook_uuid_v7()` of the inserting statement, whose time (`clock_timestamp()`, in ms,
/// in its first 48 bits) is never before its `created_at` (`now()`, the transaction's start).
/// One millisecond is kept in hand for the rounding of both.
pub fn ids_from(t: DateTime<Utc>) -> DeliveryId {
    let ms = (t.timestamp_millis() - 1).max(0) as u128;
    DeliveryId(uuid::Uuid::from_u128(ms << 80))
}

/// An id typed into a filter; empty is "any".
pub fn parse_opt<T: std::str::FromStr>(label: &str, raw: &str) -> UiResult<Option<T>>
where
    T::Err: std::fmt::Display,
{
    match raw.trim() {
        "" => Ok(None),
        s => s.parse().map(Some).map_err(|e| UiError::bad_request(format!("{label}: {e}"))),
    }
}

/// A time from a `datetime-local` field (taken as UTC) or RFC 3339.
pub fn parse_time(label: &str, raw: &str) -> UiResult<Option<DateTime<Utc>>> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(None);
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(raw) {
        return Ok(Some(t.with_timezone(&Utc)));
    }
    ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(raw, f).ok())
        .map(|t| Some(t.and_utc()))
        .ok_or_else(|| UiError::bad_request(format!("{label} must be a time such as 2026-01-31T12:00 (UTC).")))
}

/// `GET /ui/deliveries`
pub async fn list(viewer: Viewer, State(state): State<UiState>, Query(f): Query<Filters>) -> UiResult<Html<String>> {
    let project = viewer.project()?;
    let filter = f.to_store()?;
    let event_type = f.event_type.trim();
    if !event_type.is_empty() {
        EventType::parse(event_type).map_err(|e| UiError::bad_request(format!("Event type: {e}")))?;
    }
    let mut client = state.pool.get().await?;
    let mut filter = filter;
    let rows: Vec<DeliveryRow> = match start_of_status(&mut client, project, &filter).await? {
        Some(None) => Vec::new(),
        bound => {
            filter.after = filter.after.max(bound.flatten().map(ids_from));
            fetch(&client, project, event_type, &filter).await?
        }
    };
    let (rows, next) = paginate(rows, LIMIT, |d| d.id.to_string());
    let body = html! {
        h1 { "Deliveries" }
        (filter_form(&f))
        (table(&rows))
        (next_page("/ui/deliveries", &f.encoded(), "cursor", next))
    };
    Ok(page::frame(&viewer, "/ui/deliveries", "Deliveries", body))
}

/// For a PENDING or PROCESSING filter, the oldest such Delivery's creation (see
/// [`query::oldest_of`]).
async fn start_of_status(client: &mut deadpool_postgres::Client, project: railhook_core::ProjectId, filter: &DeliveryFilter) -> UiResult<Option<Option<DateTime<Utc>>>> {
    match filter.status {
        Some(status) => query::oldest_of(client, project, status).await,
        None => Ok(None),
    }
}

/// One page of the list: the store's list, or by event type the dashboard's own query.
async fn fetch(client: &deadpool_postgres::Client, project: railhook_core::ProjectId, event_type: &str, filter: &DeliveryFilter) -> UiResult<Vec<DeliveryRow>> {
    Ok(if event_type.is_empty() {
        deliveries::list_deliveries(&***client, project, filter).await?.into_iter().map(DeliveryRow::from).collect()
    } else {
        query::deliveries_by_type(&***client, project, ByType { event_type, filter }).await?
    })
}

fn filter_form(f: &Filters) -> Markup {
    html! {
        form.filters method="get" action="/ui/deliveries" aria-label="Filter Deliveries" {
            div {
                label for="status" { "Status" }
                select #status name="status" {
                    option value="" selected[f.status.is_empty()] { "Any" }
                    @for s in DeliveryStatus::ALL {
                        option value=(s.as_sql()) selected[f.status == s.as_sql()] { (s) }
                    }
                }
            }
            div { label for="endpoint_id" { "Endpoint" } input #endpoint_id name="endpoint_id" value=(f.endpoint_id) placeholder="ep_..." size="30"; }
            div { label for="event_type" { "Event type" } input #event_type name="event_type" value=(f.event_type) placeholder="order.paid"; }
            div { label for="created_after" { "Created from (UTC)" } input #created_after type="datetime-local" name="created_after" value=(f.created_after); }
            div { label for="created_before" { "Created before (UTC)" } input #created_before type="datetime-local" name="created_before" value=(f.created_before); }
            div { button type="submit" { "Filter" } }
        }
        p.hint {
            "Oldest first, like every list. Recent ones: "
            a href=(since(chrono::Duration::hours(1))) { "the last hour" } ", "
            a href=(since(chrono::Duration::hours(24))) { "the last 24 hours" } "."
        }
    }
}

/// The list of what was created since `ago`.
fn since(ago: chrono::Duration) -> String {
    let from = (Utc::now() - ago).format("%Y-%m-%dT%H:%M").to_string();
    format!("/ui/deliveries?{}", query_string(&[("created_after", &from)]))
}

fn table(rows: &[DeliveryRow]) -> Markup {
    html! {
        @if rows.is_empty() {
            p { "No Delivery matches." }
        } @else {
            table {
                caption { "Deliveries, oldest first" }
                thead { tr {
                    th scope="col" { "Delivery" } th scope="col" { "Event type" } th scope="col" { "Endpoint" }
                    th scope="col" { "Status" } th scope="col" { "Attempts" } th scope="col" { "Created" } th scope="col" { "Last error" }
                } }
                tbody {
                    @for d in rows {
                        tr {
                            td { a href={ "/ui/deliveries/" (d.id) } { code { (d.id) } } }
                            td { (d.event_type) }
                            td { a href={ "/ui/deliveries?endpoint_id=" (d.endpoint_id) } { code { (d.endpoint_id) } } }
                            td { (page::status(d.status)) @if let Some(t) = d.next_retry_at.filter(|_| d.status == DeliveryStatus::Pending) { br; span.hint { "next " (page::time(t)) } } }
                            td { (d.attempt_count) " / " (d.max_attempts) }
                            td { (page::time(d.created_at)) }
                            td { (d.last_error.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_bound_is_below_every_v7_id_of_that_millisecond_and_later() {
        let t = DateTime::parse_from_rfc3339("2026-12-04T07:00:00.123Z").unwrap().with_timezone(&Utc);
        let ms = t.timestamp_millis() as u128;
        let first_possible = uuid::Uuid::from_u128((ms << 80) | (0x7 << 76));
        let before = uuid::Uuid::from_u128(((ms - 2) << 80) | (0x7 << 76) | 0xffff);
        assert!(ids_from(t).0 < first_possible);
        assert!(ids_from(t).0 > before);
    }
}

#[derive(Deserialize)]
pub struct DetailParams {
    attempts_cursor: Option<String>,
    retried: Option<String>,
}

/// `GET /ui/deliveries/{id}`
pub async fn detail(viewer: Viewer, State(state): State<UiState>, Path(id): Path<String>, Query(p): Query<DetailParams>) -> UiResult<Html<String>> {
    let project = viewer.project()?;
    let id: DeliveryId = id.parse().map_err(|e| UiError::bad_request(format!("Delivery id: {e}")))?;
    let after = parse_opt::<AttemptId>("cursor", p.attempts_cursor.as_deref().unwrap_or(""))?;
    let client = state.pool.get().await?;
    let delivery = deliveries::get_delivery(&**client, project, id).await?.ok_or_else(|| UiError::not_found("Delivery"))?;
    let attempts = deliveries::list_attempts(&**client, project, id, after, ATTEMPTS_LIMIT + 1).await?.unwrap_or_default();
    let (attempts, next) = paginate(attempts, ATTEMPTS_LIMIT, |a| a.id.to_string());
    let event = events::get_event(&client, project, delivery.event_id).await?;
    let endpoint = endpoints::get_endpoint(&**client, project, delivery.endpoint_id).await?;
    let body = html! {
        div data-refresh-seconds=[(!delivery.status.is_terminal()).then_some("3")] {
            h1 { "Delivery " code { (delivery.id) } }
            @if p.retried.is_some() { p.notice.ok role="status" { "Back on the Retry Ladder: the next Attempt is due now." } }
            (facts(&delivery, event.as_ref().and_then(|e| e.trace_id.as_deref()), &state.config.ui))
            @if delivery.status == DeliveryStatus::Failed { (retry_form(&viewer, delivery.id)) }
            h2 { "Request" }
            (request(&delivery, endpoint.as_ref().map(|e| e.url.as_str()), event.as_ref().and_then(|e| e.payload.as_ref())))
            h2 { "Attempts" }
            @if attempts.is_empty() { p { "No Attempt yet." } }
            @for a in &attempts { (attempt(a)) }
            (next_page(&format!("/ui/deliveries/{}", delivery.id), "", "attempts_cursor", next))
        }
    };
    Ok(page::frame(&viewer, "/ui/deliveries", &format!("Delivery {}", delivery.id), body))
}

/// `trace_id`: the Event's OpenTelemetry trace (issue 33), linked to the trace viewer when
/// `ui.trace_url_template` is set.
fn facts(d: &Delivery, trace_id: Option<&str>, ui: &railhook_config::UiConfig) -> Markup {
    html! {
        dl.facts {
            dt { "Status" } dd { (page::status(d.status)) @if d.parked { " (parked: waits for the previous Sequence Number)" } }
            dt { "Event" } dd { code { (d.event_id) } " · " (d.event_type) }
            @if let Some(trace_id) = trace_id {
                dt { "Trace" } dd {
                    @match ui.trace_url(trace_id) {
                        Some(url) => a.trace href=(url) target="_blank" rel="noopener noreferrer" { code { (trace_id) } },
                        None => code { (trace_id) },
                    }
                }
            }
            dt { "Endpoint" } dd { a href={ "/ui/deliveries?endpoint_id=" (d.endpoint_id) } { code { (d.endpoint_id) } } }
            dt { "Attempts" } dd { (d.attempt_count) " of at most " (d.max_attempts) }
            dt { "Next Attempt" } dd { (page::maybe_time(d.next_retry_at)) }
            dt { "Created" } dd { (page::time(d.created_at)) }
            dt { "Ended" } dd { (page::maybe_time(d.completed_at)) }
            @if let Some(e) = &d.last_error { dt { "Last error" } dd { (e) } }
            @if let Some(n) = d.sequence_number { dt { "Sequence Number" } dd { (n) } }
        }
    }
}

fn retry_form(viewer: &Viewer, id: DeliveryId) -> Markup {
    html! {
        form.actions method="post" action={ "/ui/deliveries/" (id) "/retry" } {
            input type="hidden" name="csrf" value=(viewer.csrf);
            button type="submit" { "Retry this Delivery" }
            span.hint { "Adds " (EXTRA_ATTEMPTS) " Attempt and sends it now." }
        }
    }
}

/// What every Attempt sends: the Event's payload with the Standard Webhooks headers (the
/// timestamp and signature are fresh per Attempt).
fn request(d: &Delivery, url: Option<&str>, payload: Option<&serde_json::Value>) -> Markup {
    let body = payload.map(|p| serde_json::to_string_pretty(p).unwrap_or_else(|_| p.to_string()));
    html! {
        pre aria-label="Request headers" {
            "POST " (url.unwrap_or("<Endpoint URL>")) "\ncontent-type: application/json\nwebhook-id: " (d.id)
            "\nwebhook-timestamp: <per Attempt>\nwebhook-signature: v1,<per Attempt>\nx-event-id: " (d.event_id)
            @if let Some(n) = d.sequence_number { "\nx-sequence-number: " (n) }
        }
        @match body {
            Some(b) => { pre aria-label="Request body" { (b) } }
            None => { p.muted { "The Event's payload is not available." } }
        }
    }
}

fn attempt(a: &Attempt) -> Markup {
    let ok = a.result == "success";
    let headers = a.response_headers.as_ref().map(|h| serde_json::to_string_pretty(h).unwrap_or_default());
    // Credentials are redacted by the worker before they are stored.
    let sent = a.request_headers.as_ref().filter(|h| !h.is_null()).map(|h| serde_json::to_string_pretty(h).unwrap_or_default());
    html! {
        section.attempt aria-label={ "Attempt " (a.attempt_number) } {
            h3 {
                "Attempt " (a.attempt_number) " · "
                span class={ "badge " (if ok { "ok" } else { "bad" }) } { (a.result) }
                @if let Some(code) = a.status_code { " · HTTP " (code) }
            }
            p.hint { (page::time(a.started_at)) " · " (a.duration_ms) " ms" @if let Some(e) = &a.error_message { " · " (e) } }
            @if let Some(sent) = sent {
                details {
                    summary { "Request headers" }
                    pre aria-label="Request headers" { (sent) }
                }
            }
            details {
                summary { "Response" }
                @if let Some(h) = headers { pre aria-label="Response headers" { (h) } }
                pre aria-label="Response body" { (a.response_body.as_deref().unwrap_or("(no body)")) }
                @if a.response_truncated { p.hint { "The body was longer; only its start is stored." } }
            }
        }
    }
}

/// `POST /ui/deliveries/{id}/retry`
pub async fn retry(viewer: Viewer, State(state): State<UiState>, Path(id): Path<String>, headers: HeaderMap, form: Form) -> UiResult<Response> {
    viewer.check(&headers, &form)?;
    let project = viewer.project()?;
    let id: DeliveryId = id.parse().map_err(|e| UiError::bad_request(format!("Delivery id: {e}")))?;
    let client = state.pool.get().await?;
    match deliveries::retry(&**client, project, id, EXTRA_ATTEMPTS).await? {
        RetryOutcome::Retried(_) => Ok((StatusCode::SEE_OTHER, [(header::LOCATION, format!("/ui/deliveries/{id}?retried=1"))]).into_response()),
        RetryOutcome::NotFailed(s) => Err(UiError::Client(StatusCode::CONFLICT, format!("Only a FAILED Delivery can be retried; this one is {s}."))),
        RetryOutcome::NotFound => Err(UiError::not_found("Delivery")),
    }
}
