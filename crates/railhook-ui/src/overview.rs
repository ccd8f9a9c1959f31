//! The overview (`/ui/`): the last hour of the project at a glance, read from Postgres
//! (`query::overview`).

use axum::extract::State;
use axum::response::Html;
use chrono::Utc;
use maud::{html, Markup};

use crate::error::UiResult;
use crate::page;
use crate::query::{self, Overview};
use crate::viewer::Viewer;
use crate::UiState;

/// `GET /ui/`
pub async fn page(viewer: Viewer, State(state): State<UiState>) -> UiResult<Html<String>> {
    let project = viewer.project()?;
    let mut client = state.pool.get().await?;
    let o = query::overview(&mut client, project).await?;
    let body = html! {
        h1 { "Overview" }
        p.hint { "The last hour, from the database. Rates over the newest " (query::SAMPLE) " rows at most." }
        dl.cards {
            (card("Ingest rate", per_second(o.ingest_per_second), &format!("{} Events", o.events_counted)))
            (card("Delivery success rate", percent(o.success_rate), &format!("of {} Deliveries that ended", o.ended)))
            (card("End-to-end latency p50", millis(o.e2e_p50_ms), "Event accepted to delivered"))
            (card("End-to-end latency p99", millis(o.e2e_p99_ms), "Event accepted to delivered"))
            (card("Oldest pending", age(&o), if matches!(o.oldest_pending, Some(None)) { "no Delivery is waiting" } else { "the longest-waiting Delivery" }))
            (card("Failed Messages", o.failed_last_hour.map_or("—".into(), |n| n.to_string()), "abandoned in the last hour"))
        }
        p { a href="/ui/failed-messages" { "See the Failed Messages" } " · " a href="/ui/endpoints" { "See Endpoint health" } }
    };
    Ok(page::frame(&viewer, "/ui/", "Overview", body))
}

fn card(label: &str, value: String, hint: &str) -> Markup {
    html! {
        div.card {
            dt { (label) }
            dd { (value) }
            dd.hint { (hint) }
        }
    }
}

/// Per second, or per minute while under one a second (a quiet project reads 0.08/min,
/// not 0.00/s).
fn per_second(v: Option<f64>) -> String {
    match v {
        Some(r) if r >= 1.0 => format!("{r:.1}/s"),
        Some(r) => format!("{:.2}/min", r * 60.0),
        None => "—".into(),
    }
}

fn percent(v: Option<f64>) -> String {
    v.map(|r| format!("{:.1} %", r * 100.0)).unwrap_or_else(|| "—".into())
}

fn millis(v: Option<f64>) -> String {
    match v {
        Some(ms) if ms >= 10_000.0 => format!("{:.1} s", ms / 1000.0),
        Some(ms) => format!("{ms:.0} ms"),
        None => "—".into(),
    }
}

fn age(o: &Overview) -> String {
    let t = match o.oldest_pending {
        None => return "—".into(),
        Some(None) => return "none".into(),
        Some(Some(t)) => t,
    };
    let s = (Utc::now() - t).num_seconds().max(0);
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        _ => format!("{} h", s / 3600),
    }
}
