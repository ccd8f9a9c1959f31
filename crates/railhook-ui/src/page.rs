//! The frame every page shares: skip link, header, navigation, sign-out; the error page; and
//! the small pieces pages repeat (times, status badges, circuits, the next-page link).
//!
//! The navigation is one table, [`SECTIONS`]: a later page joins it with one line and its
//! routes in `lib.rs`.

use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Utc};
use maud::{html, Markup, DOCTYPE};
use railhook_core::DeliveryStatus;

use crate::assets;
use crate::error::UiError;
use crate::query::Circuit;
use crate::viewer::{Role, Viewer};

/// A section of the dashboard, as the navigation lists it.
pub struct Section {
    pub path: &'static str,
    pub label: &'static str,
    /// Only for the operator (the project list).
    pub operator_only: bool,
}

/// The navigation, in order: the outgoing direction, the incoming one, the operator's pages.
pub const SECTIONS: &[Section] = &[
    Section { path: "/ui/", label: "Overview", operator_only: false },
    Section { path: "/ui/deliveries", label: "Deliveries", operator_only: false },
    Section { path: "/ui/failed-messages", label: "Failed Messages", operator_only: false },
    Section { path: "/ui/endpoints", label: "Endpoints", operator_only: false },
    Section { path: "/ui/replays", label: "Time Machine", operator_only: false },
    Section { path: "/ui/sources", label: "Sources", operator_only: false },
    Section { path: "/ui/incoming", label: "Incoming Events", operator_only: false },
    Section { path: "/ui/failed-forwards", label: "Failed Forwards", operator_only: false },
    Section { path: "/ui/projects", label: "Projects", operator_only: true },
    Section { path: "/ui/relay", label: "Relay", operator_only: true },
];

fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · Railhook" }
            link rel="stylesheet" href=(assets::css_href());
            script src=(assets::js_href()) defer {}
        }
    }
}

/// A page without navigation: sign-in and errors.
pub fn bare(title: &str, body: Markup) -> Html<String> {
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                (head(title))
                body { main #main .narrow { (body) } }
            }
        }
        .into_string(),
    )
}

/// A page of the dashboard: `current` is the [`Section`] path it belongs to.
pub fn frame(viewer: &Viewer, current: &str, title: &str, body: Markup) -> Html<String> {
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                (head(title))
                body {
                    a.skip href="#main" { "Skip to content" }
                    header.top {
                        span.brand { "Railhook" }
                        nav aria-label="Sections" {
                            ul {
                                @for s in SECTIONS.iter().filter(|s| !s.operator_only || viewer.role == Role::Operator) {
                                    li { a href=(s.path) aria-current=[(s.path == current).then_some("page")] { (s.label) } }
                                }
                            }
                        }
                        (who(viewer))
                    }
                    main #main { (body) }
                }
            }
        }
        .into_string(),
    )
}

fn who(viewer: &Viewer) -> Markup {
    html! {
        div.who {
            span {
                @match (viewer.role, viewer.project) {
                    (Role::Operator, Some(p)) => { "Operator · " code { (p) } }
                    (Role::Operator, None) => { "Operator · no project chosen" }
                    (Role::Project, Some(p)) => { "Project " code { (p) } }
                    (Role::Project, None) => {}
                }
            }
            form method="post" action="/ui/sign-out" {
                input type="hidden" name="csrf" value=(viewer.csrf);
                button.link type="submit" { "Sign out" }
            }
        }
    }
}

/// An error as a page: the sign-in page or the project list for a redirect, else the
/// status with its message, and the way back.
impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            UiError::Redirect(to) => return (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response(),
            UiError::Client(status, message) => (status, message),
            UiError::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "Something went wrong on our side; it has been logged. Try again.".to_string()),
        };
        let title = status.canonical_reason().unwrap_or("Error");
        let body = html! {
            h1 { (status.as_u16()) " " (title) }
            p role="alert" { (message) }
            p { a href="/ui/" { "Back to the overview" } }
        };
        (status, bare(title, body)).into_response()
    }
}

/// A time for people, with the exact value for machines.
pub fn time(t: DateTime<Utc>) -> Markup {
    html! { time datetime=(t.to_rfc3339()) { (t.format("%Y-%m-%d %H:%M:%S UTC")) } }
}

pub fn maybe_time(t: Option<DateTime<Utc>>) -> Markup {
    match t {
        Some(t) => time(t),
        None => html! { span.muted { "—" } },
    }
}

/// A status with its word spelled out (colour is never the only signal).
pub fn status(s: DeliveryStatus) -> Markup {
    let class = match s {
        DeliveryStatus::Success => "ok",
        DeliveryStatus::Failed => "bad",
        _ => "wait",
    };
    html! { span class={ "badge " (class) } { (s) } }
}

/// The circuit breaker of an Endpoint or a Destination: its state, since when it is not
/// closed, and its window's count; `None`: it never had an Attempt (closed).
pub fn circuit(c: Option<&Circuit>) -> Markup {
    html! {
        @if let Some(c) = c {
            (c.state.replace('_', "-"))
            @if let Some(t) = c.opened_at.filter(|_| c.state != "closed") { br; span.hint { "opened " (time(t)) } }
            br; span.hint { (c.window_successes) " ok, " (c.window_failures) " failed in the window" }
        } @else { "closed" }
    }
}

/// "Next page" when the list has more; `query` is the page's filters, already encoded,
/// `param` the name the cursor goes by.
pub fn next_page(path: &str, query: &str, param: &str, cursor: Option<String>) -> Markup {
    html! {
        @if let Some(cursor) = cursor {
            nav.pager aria-label="Pages" {
                a href={ (path) "?" (query) @if !query.is_empty() { "&" } (param) "=" (cursor) } rel="next" { "Next page →" }
            }
        }
    }
}

/// Builds a page from `limit + 1` fetched rows, like the API's pagination: the cursor is
/// the last id shown when more may follow.
pub fn paginate<T>(mut rows: Vec<T>, limit: i64, id: impl Fn(&T) -> String) -> (Vec<T>, Option<String>) {
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next = if more { rows.last().map(id) } else { None };
    (rows, next)
}

/// Encodes `(name, value)` pairs for a link, skipping empty values.
pub fn query_string(pairs: &[(&str, &str)]) -> String {
    let mut out = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs.iter().filter(|(_, v)| !v.is_empty()) {
        out.append_pair(k, v);
    }
    out.finish()
}
