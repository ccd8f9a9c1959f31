//! The stylesheet and the one script, embedded in the binary (no CDN: the dashboard works
//! offline). Their URLs carry a hash of their content, so they can be cached for good.

use std::sync::OnceLock;

use axum::extract::{Path, Query};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use crate::error::UiError;

const CSS: &str = include_str!("../assets/ui.css");
const JS: &str = include_str!("../assets/ui.js");

fn version(content: &str) -> String {
    hex_prefix(&Sha256::digest(content.as_bytes()))
}

fn hex_prefix(bytes: &[u8]) -> String {
    bytes.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

fn versions() -> &'static (String, String) {
    static VERSIONS: OnceLock<(String, String)> = OnceLock::new();
    VERSIONS.get_or_init(|| (version(CSS), version(JS)))
}

pub fn css_href() -> String {
    format!("/ui/assets/ui.css?v={}", versions().0)
}

pub fn js_href() -> String {
    format!("/ui/assets/ui.js?v={}", versions().1)
}

#[derive(serde::Deserialize)]
pub struct Version {
    v: Option<String>,
}

/// `GET /ui/assets/{name}`: cached for a year when the URL names the current version.
pub async fn serve(Path(name): Path<String>, Query(q): Query<Version>) -> Result<Response, UiError> {
    let (body, content_type, current) = match name.as_str() {
        "ui.css" => (CSS, "text/css; charset=utf-8", &versions().0),
        "ui.js" => (JS, "text/javascript; charset=utf-8", &versions().1),
        _ => return Err(UiError::Client(StatusCode::NOT_FOUND, "There is no such asset.".into())),
    };
    let cache = if q.v.as_deref() == Some(current.as_str()) { "public, max-age=31536000, immutable" } else { "no-cache" };
    Ok(([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, cache)], body).into_response())
}
