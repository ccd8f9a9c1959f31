//! The operator's project list (`/ui/projects`): every project, and choosing which one the
//! other pages show. A project key never sees this page.

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use maud::html;
use railhook_core::ProjectId;
use serde::Deserialize;

use crate::error::{UiError, UiResult};
use crate::form::Form;
use crate::page::{self, next_page, paginate};
use crate::session::{set_cookie, PROJECT_COOKIE};
use crate::viewer::{Role, Viewer};
use crate::{query, UiState};

const LIMIT: i64 = 50;

#[derive(Deserialize)]
pub struct Params {
    cursor: Option<String>,
}

fn operator_only(viewer: &Viewer) -> UiResult<()> {
    if viewer.role != Role::Operator {
        return Err(UiError::forbidden("Only the operator can list projects; a project key shows its own project."));
    }
    Ok(())
}

/// `GET /ui/projects`
pub async fn page(viewer: Viewer, State(state): State<UiState>, Query(p): Query<Params>) -> UiResult<Html<String>> {
    operator_only(&viewer)?;
    let after = parse_cursor(p.cursor.as_deref())?;
    let client = state.pool.get().await?;
    let (rows, next) = paginate(query::projects(&**client, after, LIMIT + 1).await?, LIMIT, |r| r.id.to_string());
    let body = html! {
        h1 { "Projects" }
        p.hint { "Signed in as the operator: choose the project the other pages show." }
        table {
            caption { "Every project, oldest first" }
            thead { tr { th scope="col" { "Project" } th scope="col" { "Organization" } th scope="col" { "Id" } th scope="col" { "Created" } th scope="col" { span.muted { "Action" } } } }
            tbody {
                @for r in &rows {
                    tr {
                        td { (r.name) }
                        td { (r.organization) }
                        td { code { (r.id) } }
                        td { (page::time(r.created_at)) }
                        td {
                            form method="post" action="/ui/projects/select" {
                                input type="hidden" name="csrf" value=(viewer.csrf);
                                input type="hidden" name="project" value=(r.id);
                                button.secondary type="submit" aria-label={ "Show project " (r.name) } {
                                    @if viewer.project == Some(r.id) { "Shown" } @else { "Show" }
                                }
                            }
                        }
                    }
                }
            }
        }
        @if rows.is_empty() { p { "No project yet: create one with the admin API or " code { "railhook admin" } "." } }
        (next_page("/ui/projects", "", "cursor", next))
    };
    Ok(page::frame(&viewer, "/ui/projects", "Projects", body))
}

fn parse_cursor(raw: Option<&str>) -> UiResult<Option<ProjectId>> {
    raw.filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| UiError::bad_request("The cursor is not one this page gave out.")))
        .transpose()
}

/// `POST /ui/projects/select`: remembers the operator's choice in a cookie.
pub async fn select(viewer: Viewer, State(state): State<UiState>, headers: HeaderMap, form: Form) -> UiResult<Response> {
    viewer.check(&headers, &form)?;
    operator_only(&viewer)?;
    let id: ProjectId = form
        .get("project")
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| UiError::bad_request("Choose a project from the list (its id did not parse)."))?;
    let client = state.pool.get().await?;
    if !query::project_exists(&**client, id).await? {
        return Err(UiError::Client(StatusCode::NOT_FOUND, "There is no such project.".into()));
    }
    let cookie = set_cookie(&headers, PROJECT_COOKIE, Some(&id.to_string()));
    Ok((StatusCode::SEE_OTHER, [(header::LOCATION, "/ui/".to_string())], [(header::SET_COOKIE, cookie)]).into_response())
}
