//! The Time Machine (`/ui/replays`): create a Replay (a time range, event type patterns,
//! optional Endpoints), see its estimate (the dry run) before confirming it, follow its
//! progress (made of total, state) and cancel it while it runs.
//!
//! Everything goes through `railhook_store::replays`, the functions the API's `/v1/replays`
//! uses: `count` (the dry run), `running`, `create` (one running Replay per project, decided
//! by `replays_one_running_idx`), `get`, `list` (`replays_project_idx`, id order) and
//! `cancel`. The checks of the request are the API's (`railhook-api/src/replays.rs`),
//! phrased for a form: a range of at most `replay.max_range_days`, `from` in the past, `to`
//! later than now taken as now, 1 to [`MAX_EVENT_TYPES`] patterns, Endpoints of this project.
//!
//! The flow is two steps: the form is a `GET` of the estimate page (a dry run changes
//! nothing), which shows the count and a `POST` form (CSRF) that starts the Replay with the
//! same fields. The worker runs it in the background; its page reloads itself every 3 s while
//! it runs.

use axum::extract::{Path, Query, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Duration, DurationRound, Utc};
use maud::{html, Markup};
use railhook_core::{EndpointId, EventTypePattern, ProjectId, ReplayId};
use railhook_store::endpoints::{self, Endpoint};
use railhook_store::replays::{self, CancelOutcome, CreateOutcome, Replay, ReplayCount, ReplayFilter, ReplayState};
use serde::Deserialize;

use crate::deliveries::{parse_opt, parse_time};
use crate::error::{UiError, UiResult};
use crate::form::Form;
use crate::page::{self, next_page, paginate, query_string};
use crate::viewer::Viewer;
use crate::UiState;

const LIMIT: i64 = 50;
/// Event type patterns and Endpoints one Replay may name (the API's bounds).
pub const MAX_EVENT_TYPES: usize = 50;
pub const MAX_ENDPOINTS: usize = 100;
/// Events the estimate page counts at most (`replays::count_upto`): about 100 ms here, so the
/// page stays under 200 ms with a million Events in the range (tests/ui/bigdb). Starting the
/// Replay counts up to the API's cap (`replays::COUNT_CAP`) for its total, as the API does.
pub const ESTIMATE_CAP: i64 = 100_000;
/// The form's default range: the last day.
const DEFAULT_RANGE_HOURS: i64 = 24;

/// What the form sent, as typed: the estimate page shows it again and carries it to the
/// confirmation.
#[derive(Debug, Default, Clone)]
struct Draft {
    from: String,
    /// Empty: now.
    to: String,
    /// Patterns separated by spaces or commas; empty: every type.
    event_types: String,
    /// None checked: every Endpoint.
    endpoint_ids: Vec<String>,
}

impl Draft {
    fn read<'a>(get: impl Fn(&str) -> Option<&'a str>, all: impl Fn(&str) -> Vec<&'a str>) -> Draft {
        let text = |name: &str| get(name).unwrap_or("").trim().to_string();
        Draft {
            from: text("from"),
            to: text("to"),
            event_types: text("event_types"),
            endpoint_ids: all("endpoint_id").into_iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
        }
    }

    fn from_query(raw: Option<&str>) -> Draft {
        let pairs: Vec<(String, String)> = url::form_urlencoded::parse(raw.unwrap_or("").as_bytes()).into_owned().collect();
        let get = |name: &str| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        let all = |name: &str| pairs.iter().filter(|(k, _)| k == name).map(|(_, v)| v.as_str()).collect();
        Draft::read(get, all)
    }

    fn from_form(form: &Form) -> Draft {
        Draft::read(|name| form.get(name), |name| form.all(name))
    }

    /// The form's starting point: the last day, every type, every Endpoint.
    fn default_now(now: DateTime<Utc>) -> Draft {
        let from = (now - Duration::hours(DEFAULT_RANGE_HOURS)).duration_trunc(Duration::minutes(1)).unwrap_or(now);
        Draft { from: from.format("%Y-%m-%dT%H:%M").to_string(), ..Draft::default() }
    }

    fn patterns(&self) -> impl Iterator<Item = &str> {
        self.event_types.split([',', ' ', '\n', '\r', '\t']).filter(|s| !s.is_empty())
    }

    /// The checked filter, as `POST /v1/replays` checks it; `now` clamps `to`.
    fn filter(&self, max_days: i64, now: DateTime<Utc>) -> UiResult<ReplayFilter> {
        let from = parse_time("From", &self.from)?.ok_or_else(|| UiError::bad_request("From is required: the first moment to replay (UTC)."))?;
        let to = parse_time("To", &self.to)?.unwrap_or(now);
        if to <= from {
            return Err(UiError::bad_request("“To” must be later than “From”: the range is empty."));
        }
        if from >= now {
            return Err(UiError::bad_request("“From” must be in the past: nothing is stored after now."));
        }
        let to = to.min(now);
        if to - from > Duration::days(max_days) {
            return Err(UiError::bad_request(format!("A Replay may span at most {max_days} days (replay.max_range_days).")));
        }
        let patterns: Vec<&str> = self.patterns().collect();
        let event_types = match patterns.len() {
            0 => None,
            n if n > MAX_EVENT_TYPES => return Err(UiError::bad_request(format!("Name at most {MAX_EVENT_TYPES} event type patterns."))),
            _ => Some(
                patterns
                    .iter()
                    .map(|p| EventTypePattern::parse(p).map_err(|e| UiError::bad_request(format!("Event type pattern “{p}”: {e}"))))
                    .collect::<UiResult<Vec<_>>>()?,
            ),
        };
        let endpoint_ids = match self.endpoint_ids.len() {
            0 => None,
            n if n > MAX_ENDPOINTS => return Err(UiError::bad_request(format!("Choose at most {MAX_ENDPOINTS} Endpoints."))),
            _ => Some(
                self.endpoint_ids
                    .iter()
                    .map(|id| id.parse::<EndpointId>().map_err(|e| UiError::bad_request(format!("Endpoint: {e}"))))
                    .collect::<UiResult<Vec<_>>>()?,
            ),
        };
        Ok(ReplayFilter { from, to, event_types, endpoint_ids })
    }

    /// The fields again, for a hidden form or a link.
    fn pairs(&self) -> Vec<(&'static str, &str)> {
        let mut pairs = vec![("from", self.from.as_str()), ("to", self.to.as_str()), ("event_types", self.event_types.as_str())];
        pairs.extend(self.endpoint_ids.iter().map(|id| ("endpoint_id", id.as_str())));
        pairs
    }
}

/// The checked filter, with Endpoints of another project as unknown as missing ones.
async fn checked(state: &UiState, client: &deadpool_postgres::Client, project: ProjectId, draft: &Draft) -> UiResult<ReplayFilter> {
    let filter = draft.filter(state.config.replay.max_range_days, Utc::now())?;
    if let Some(ids) = &filter.endpoint_ids {
        if let Some(unknown) = replays::unknown_endpoints(client, project, ids).await?.first() {
            return Err(UiError::bad_request(format!("{unknown} is not an Endpoint of this project.")));
        }
    }
    Ok(filter)
}

#[derive(Deserialize)]
pub struct ListParams {
    cursor: Option<String>,
}

/// `GET /ui/replays`: the form, the running Replay, and every Replay of the project.
pub async fn list(viewer: Viewer, State(state): State<UiState>, Query(p): Query<ListParams>) -> UiResult<Html<String>> {
    let project = viewer.project()?;
    let after = parse_opt::<ReplayId>("cursor", p.cursor.as_deref().unwrap_or(""))?;
    let client = state.pool.get().await?;
    let rows = replays::list(&client, project, after, LIMIT + 1).await?;
    let (rows, next) = paginate(rows, LIMIT, |r| r.id.to_string());
    let running = running(&client, project).await?;
    let endpoints = endpoint_choices(&client, project).await?;
    let body = html! {
        h1 { "Time Machine" }
        (intro())
        @if let Some(r) = &running { (running_notice(r)) }
        h2 { "New Replay" }
        (draft_form(&Draft::default_now(Utc::now()), &endpoints))
        h2 { "Replays" }
        (table(&rows))
        (next_page("/ui/replays", "", "cursor", next))
    };
    Ok(page::frame(&viewer, "/ui/replays", "Time Machine", body))
}

fn intro() -> Markup {
    html! {
        p.hint {
            "A Replay makes a new Delivery of each Event stored in a time range to each chosen Endpoint whose "
            "Subscription matches now: a new " code { "webhook-id" } " (so receivers take it again), the same "
            code { "X-Event-Id" } ". It runs in the background in small batches below live traffic; one runs per project at a time."
        }
    }
}

async fn running(client: &deadpool_postgres::Client, project: ProjectId) -> UiResult<Option<Replay>> {
    match replays::running(client, project).await? {
        Some(id) => Ok(replays::get(client, project, id).await?),
        None => Ok(None),
    }
}

/// The Endpoints the form offers, at most [`MAX_ENDPOINTS`]; `true` when the project has more.
async fn endpoint_choices(client: &deadpool_postgres::Client, project: ProjectId) -> UiResult<(Vec<Endpoint>, bool)> {
    let mut rows = endpoints::list_endpoints(&***client, project, None, MAX_ENDPOINTS as i64 + 1).await?;
    let more = rows.len() > MAX_ENDPOINTS;
    rows.truncate(MAX_ENDPOINTS);
    Ok((rows, more))
}

fn running_notice(r: &Replay) -> Markup {
    html! {
        p.notice role="status" {
            "Running now: " a href={ "/ui/replays/" (r.id) } { code { (r.id) } } ", " (r.made) " of " (r.total) " Deliveries made."
        }
    }
}

fn draft_form(d: &Draft, (endpoints, more): &(Vec<Endpoint>, bool)) -> Markup {
    html! {
        form.stack method="get" action="/ui/replays/estimate" aria-label="New Replay" {
            div.filters {
                div { label for="from" { "From (UTC)" } input #from type="datetime-local" name="from" value=(d.from) required; }
                div { label for="to" { "To (UTC)" } input #to type="datetime-local" name="to" value=(d.to) aria-describedby="to-help"; }
                div {
                    label for="event_types" { "Event types" }
                    input #event_types name="event_types" value=(d.event_types) placeholder="order.paid invoice.*" size="36" aria-describedby="event-types-help";
                }
            }
            p #to-help .hint { "Events stored from “From” up to, not including, “To”; an empty “To” is now. At most the configured number of days." }
            p #event-types-help .hint { "Patterns as in Subscriptions (" code { "order.paid" } ", " code { "order.*" } ", " code { "**" } "), separated by spaces; empty: every type." }
            @if endpoints.is_empty() {
                p { "This project has no Endpoint yet: a Replay would make no Delivery." }
            } @else {
                fieldset {
                    legend { "Endpoints (none checked: every Endpoint)" }
                    @for e in endpoints {
                        div {
                            input type="checkbox" name="endpoint_id" id={ "ep-" (e.id) } value=(e.id) checked[d.endpoint_ids.iter().any(|c| *c == e.id.to_string())];
                            " "
                            label for={ "ep-" (e.id) } { (endpoint_label(e)) }
                        }
                    }
                    @if *more { p.hint { "Only the first " (MAX_ENDPOINTS) " Endpoints are listed; " code { "POST /v1/replays" } " takes any of them." } }
                }
            }
            div { button type="submit" { "Estimate" } }
        }
    }
}

fn endpoint_label(e: &Endpoint) -> Markup {
    html! {
        @if !e.description.is_empty() { (e.description) " · " }
        code { (e.id) } " · " (e.url)
        @if !e.enabled { " (disabled: gets nothing)" }
    }
}

fn table(rows: &[Replay]) -> Markup {
    html! {
        @if rows.is_empty() { p { "No Replay yet." } }
        @else {
            table {
                caption { "Replays, oldest first" }
                thead { tr {
                    th scope="col" { "Replay" } th scope="col" { "State" } th scope="col" { "Range (UTC)" }
                    th scope="col" { "Event types" } th scope="col" { "Endpoints" } th scope="col" { "Progress" } th scope="col" { "Created" }
                } }
                tbody {
                    @for r in rows {
                        tr data-replay=(r.id) {
                            td { a href={ "/ui/replays/" (r.id) } { code { (r.id) } } }
                            td { (state_badge(r.state)) }
                            td { (page::time(r.from)) br; "to " (page::time(r.to)) }
                            td { (types_of(r)) }
                            td { (endpoints_of(r)) }
                            td { (progress(r)) }
                            td { (page::time(r.created_at)) }
                        }
                    }
                }
            }
        }
    }
}

/// The state spelled out; a completed Replay is the one good ending.
fn state_badge(s: ReplayState) -> Markup {
    let (word, class) = match s {
        ReplayState::Running => ("running", "wait"),
        ReplayState::Completed => ("completed", "ok"),
        ReplayState::Cancelled => ("cancelled", "wait"),
    };
    html! { span class={ "badge " (class) } { (word) } }
}

fn types_of(r: &Replay) -> Markup {
    html! {
        @match &r.event_types {
            Some(ts) => { @for (i, t) in ts.iter().enumerate() { @if i > 0 { ", " } code { (t) } } }
            None => { "every type" }
        }
    }
}

fn endpoints_of(r: &Replay) -> Markup {
    html! {
        @match &r.endpoint_ids {
            Some(ids) => { @for (i, id) in ids.iter().enumerate() { @if i > 0 { br; } code { (id) } } }
            None => { "every Endpoint" }
        }
    }
}

/// `made / total`, with a bar (`made` may pass `total` when Subscriptions changed meanwhile).
fn progress(r: &Replay) -> Markup {
    html! {
        span.progress {
            span.made { (r.made) } " / " span.total { (r.total) @if r.total_capped { "+" } }
            @if r.total > 0 {
                " " progress max=(r.total) value=(r.made.min(r.total)) aria-label={ "Progress of " (r.id) } { (r.made) " of " (r.total) }
            }
        }
    }
}

/// `GET /ui/replays/estimate?from=..&to=..&event_types=..&endpoint_id=..`: the dry run, and
/// the confirmation that starts the Replay.
pub async fn estimate(viewer: Viewer, State(state): State<UiState>, RawQuery(raw): RawQuery) -> UiResult<Html<String>> {
    let project = viewer.project()?;
    let draft = Draft::from_query(raw.as_deref());
    let client = state.pool.get().await?;
    let filter = checked(&state, &client, project, &draft).await?;
    let count = replays::count_upto(&client, project, &filter, ESTIMATE_CAP).await?;
    let running = running(&client, project).await?;
    let endpoints = endpoint_choices(&client, project).await?;
    let body = html! {
        h1 { "Time Machine" }
        h2 #estimate-heading { "Estimate" }
        (estimate_facts(&filter, &count))
        @if let Some(r) = &running {
            (running_notice(r))
            p { "Cancel it or wait for it to complete before starting another." }
        } @else if count.deliveries == 0 {
            p.notice role="status" { "Nothing to replay: no Event in this range has an Endpoint whose Subscription matches now." }
        } @else {
            form.actions method="post" action="/ui/replays" aria-label="Start the Replay" {
                input type="hidden" name="csrf" value=(viewer.csrf);
                @for (name, value) in draft.pairs() { input type="hidden" name=(name) value=(value); }
                button type="submit" { "Start the Replay" }
                span.hint { "The count is taken again when it starts." }
            }
        }
        h2 { "Change it" }
        (draft_form(&draft, &endpoints))
    };
    Ok(page::frame(&viewer, "/ui/replays", "Time Machine: estimate", body))
}

fn estimate_facts(f: &ReplayFilter, c: &ReplayCount) -> Markup {
    html! {
        dl.facts aria-labelledby="estimate-heading" {
            dt { "Deliveries it would make" } dd #estimate-deliveries { (c.deliveries) @if c.capped { " or more" } }
            dt { "Events it would replay" } dd #estimate-events { (c.events) @if c.capped { " or more (the estimate stops counting there; the Replay counts up to " (replays::COUNT_CAP) " when it starts)" } }
            dt { "Range" } dd { (page::time(f.from)) " up to " (page::time(f.to)) }
            dt { "Event types" } dd {
                @match &f.event_types {
                    Some(ps) => { @for (i, p) in ps.iter().enumerate() { @if i > 0 { ", " } code { (p.as_str()) } } }
                    None => { "every type" }
                }
            }
            dt { "Endpoints" } dd {
                @match &f.endpoint_ids {
                    Some(ids) => { @for (i, id) in ids.iter().enumerate() { @if i > 0 { ", " } code { (id) } } }
                    None => { "every Endpoint" }
                }
            }
        }
    }
}

/// `POST /ui/replays`: starts the Replay the estimate page showed.
pub async fn create(viewer: Viewer, State(state): State<UiState>, headers: HeaderMap, form: Form) -> UiResult<Response> {
    viewer.check(&headers, &form)?;
    let project = viewer.project()?;
    let draft = Draft::from_form(&form);
    let client = state.pool.get().await?;
    let filter = checked(&state, &client, project, &draft).await?;
    if let Some(id) = replays::running(&client, project).await? {
        return Err(already_running(id));
    }
    let count = replays::count(&client, project, &filter).await?;
    match replays::create(&client, project, &filter, count).await? {
        CreateOutcome::Created(r) => Ok((StatusCode::SEE_OTHER, [(header::LOCATION, format!("/ui/replays/{}?started=1", r.id))]).into_response()),
        CreateOutcome::AlreadyRunning(id) => Err(already_running(id)),
    }
}

fn already_running(id: ReplayId) -> UiError {
    UiError::Client(StatusCode::CONFLICT, format!("Replay {id} is running in this project; cancel it or wait for it to complete."))
}

#[derive(Deserialize)]
pub struct DetailParams {
    started: Option<String>,
    cancelled: Option<String>,
}

/// `GET /ui/replays/{id}`: one Replay and its progress; reloads itself while it runs.
pub async fn detail(viewer: Viewer, State(state): State<UiState>, Path(id): Path<String>, Query(p): Query<DetailParams>) -> UiResult<Html<String>> {
    let project = viewer.project()?;
    let id = parse_id(&id)?;
    let client = state.pool.get().await?;
    let r = replays::get(&client, project, id).await?.ok_or_else(|| UiError::not_found("Replay"))?;
    let running = r.state == ReplayState::Running;
    let body = html! {
        div data-refresh-seconds=[running.then_some("3")] {
            h1 { "Replay " code { (r.id) } }
            @if p.started.is_some() { p.notice.ok role="status" { "Started." @if running { " The worker makes its Deliveries in the background, a batch at a time." } } }
            @if p.cancelled.is_some() { p.notice.ok role="status" { "Cancelled: no further Delivery is made; those made stay." } }
            dl.facts {
                dt { "State" } dd #replay-state { (state_badge(r.state)) }
                dt { "Deliveries made" } dd #replay-progress { (progress(&r)) }
                dt { "Events of the range read" } dd { (r.events_done) " " span.hint { "(of every type; those that match make Deliveries)" } }
                dt { "Range" } dd { (page::time(r.from)) " up to " (page::time(r.to)) }
                dt { "Event types" } dd { (types_of(&r)) }
                dt { "Endpoints" } dd { (endpoints_of(&r)) }
                dt { "Created" } dd { (page::time(r.created_at)) }
                dt { "Finished" } dd { (page::maybe_time(r.finished_at)) }
            }
            @if running {
                form.actions method="post" action={ "/ui/replays/" (r.id) "/cancel" }
                    data-confirm="Cancel this Replay? The Deliveries made so far stay." {
                    input type="hidden" name="csrf" value=(viewer.csrf);
                    button.secondary type="submit" { "Cancel the Replay" }
                    span.hint { "This page reloads itself every 3 s while the Replay runs." }
                }
            }
            @if let Some(ids) = r.endpoint_ids.as_ref().filter(|ids| ids.len() == 1) {
                p { a href={ "/ui/deliveries?" (query_string(&[("endpoint_id", &ids[0].to_string())])) } { "The Endpoint's Deliveries" } }
            }
            p { a href="/ui/replays" { "Back to the Time Machine" } }
        }
    };
    Ok(page::frame(&viewer, "/ui/replays", &format!("Replay {}", r.id), body))
}

fn parse_id(raw: &str) -> UiResult<ReplayId> {
    raw.parse().map_err(|e| UiError::bad_request(format!("Replay id: {e}")))
}

/// `POST /ui/replays/{id}/cancel`
pub async fn cancel(viewer: Viewer, State(state): State<UiState>, Path(id): Path<String>, headers: HeaderMap, form: Form) -> UiResult<Response> {
    viewer.check(&headers, &form)?;
    let project = viewer.project()?;
    let id = parse_id(&id)?;
    let client = state.pool.get().await?;
    match replays::cancel(&client, project, id).await? {
        CancelOutcome::Cancelled(_) => Ok((StatusCode::SEE_OTHER, [(header::LOCATION, format!("/ui/replays/{id}?cancelled=1"))]).into_response()),
        CancelOutcome::NotRunning(s) => Err(UiError::Client(StatusCode::CONFLICT, format!("Only a running Replay can be cancelled; this one is {}.", state_word(s)))),
        CancelOutcome::NotFound => Err(UiError::not_found("Replay")),
    }
}

fn state_word(s: ReplayState) -> &'static str {
    match s {
        ReplayState::Running => "running",
        ReplayState::Completed => "completed",
        ReplayState::Cancelled => "cancelled",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn draft(from: &str, to: &str, types: &str) -> Draft {
        Draft { from: from.into(), to: to.into(), event_types: types.into(), endpoint_ids: vec![] }
    }

    #[test]
    fn the_range_is_checked_as_the_api_checks_it() {
        let now = at("2026-12-04T08:00:00Z");
        let f = draft("2026-12-03T08:00", "", "").filter(30, now).unwrap();
        assert_eq!((f.from, f.to), (at("2026-12-03T08:00:00Z"), now), "an empty To is now");
        let f = draft("2026-12-03T08:00", "2027-01-01T00:00", "").filter(30, now).unwrap();
        assert_eq!(f.to, now, "a To after now is now");
        for (from, to) in [("", ""), ("2026-12-04T09:00", ""), ("2026-12-03T08:00", "2026-12-03T07:00"), ("2026-10-01T00:00", ""), ("yesterday", "")] {
            assert!(matches!(draft(from, to, "").filter(30, now), Err(UiError::Client(StatusCode::BAD_REQUEST, _))), "{from} {to}");
        }
    }

    #[test]
    fn patterns_and_endpoints_are_parsed_or_refused() {
        let now = at("2026-12-04T08:00:00Z");
        let f = draft("2026-12-04T07:00", "", " order.paid, invoice.*\n**").filter(30, now).unwrap();
        let types: Vec<&str> = f.event_types.as_ref().unwrap().iter().map(|p| p.as_str()).collect();
        assert_eq!(types, ["order.paid", "invoice.*", "**"]);
        assert!(draft("2026-12-04T07:00", "", "a..b").filter(30, now).is_err());
        let many = vec!["a"; MAX_EVENT_TYPES + 1].join(" ");
        assert!(draft("2026-12-04T07:00", "", &many).filter(30, now).is_err());
        let mut d = draft("2026-12-04T07:00", "", "");
        d.endpoint_ids = vec!["evt_x".into()];
        assert!(d.filter(30, now).is_err(), "an id of another kind");
        let id = EndpointId::new();
        d.endpoint_ids = vec![id.to_string()];
        assert_eq!(d.filter(30, now).unwrap().endpoint_ids, Some(vec![id]));
    }

    #[test]
    fn a_query_with_repeated_endpoints_is_read_whole() {
        let d = Draft::from_query(Some("from=2026-12-04T07%3A00&to=&event_types=order.*&endpoint_id=ep_a&endpoint_id=ep_b"));
        assert_eq!((d.from.as_str(), d.to.as_str(), d.event_types.as_str()), ("2026-12-04T07:00", "", "order.*"));
        assert_eq!(d.endpoint_ids, ["ep_a", "ep_b"]);
        assert_eq!(d.pairs().len(), 5);
    }
}
