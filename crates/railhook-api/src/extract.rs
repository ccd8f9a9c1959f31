//! Extractors that turn bad input into precise errors: JSON bodies, ids in paths, and the
//! two kinds of credentials (project API key, operator token).

use std::str::FromStr;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use hmac::Mac;
use railhook_store::tenancy::{self, Principal};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

use crate::error::ApiError;
use crate::AppState;

/// A JSON body: `Content-Type: application/json` (415 otherwise), at most
/// `api.max_body_bytes` (413), syntactically valid UTF-8 JSON (400 `invalid_json`), of the
/// right shape (422 `invalid_field`, naming the field).
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        if !is_json(req.headers()) {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send the body as JSON with Content-Type: application/json",
            )
            .with_field("content-type"));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(body_rejection)?;
        parse_json(&bytes).map(ApiJson)
    }
}

pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        json_error(e.into_inner(), path)
    })?;
    // Trailing bytes after the JSON value.
    de.end().map_err(|e| json_error(e, String::new()))?;
    Ok(value)
}

fn json_error(inner: serde_json::Error, path: String) -> ApiError {
    match inner.classify() {
        serde_json::error::Category::Data => {
            let at_top = path.is_empty() || path == ".";
            let message = inner.to_string();
            // serde reports a missing or unknown field at its parent: name the field itself.
            let named = ["missing field `", "unknown field `"]
                .iter()
                .find_map(|p| message.strip_prefix(p))
                .and_then(|rest| rest.split('`').next())
                .map(|name| {
                    if at_top || path == name {
                        name.to_string()
                    } else if path.ends_with(&format!(".{name}")) {
                        path.clone()
                    } else {
                        format!("{path}.{name}")
                    }
                });
            let field = named.unwrap_or_else(|| if at_top { "body".to_string() } else { path });
            ApiError::invalid(field, message)
        }
        _ => ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", format!("the body is not valid JSON: {inner}"))
            .with_field("body"),
    }
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            let mime = v.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
            mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
        })
        .unwrap_or(false)
}

pub fn body_rejection(e: BytesRejection) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", "the body is larger than the limit (api.max_body_bytes)")
            .with_field("body")
    } else {
        ApiError::bad_request("invalid_body", format!("cannot read the body: {e}")).with_field("body")
    }
}

/// Parses a typed id from a path segment; a malformed id is a 400 naming the parameter.
pub fn parse_id<T: FromStr>(param: &'static str, raw: &str) -> Result<T, ApiError>
where
    T::Err: std::fmt::Display,
{
    raw.parse::<T>()
        .map_err(|e| ApiError::bad_request("invalid_id", format!("{param}: {e}")).with_field(param))
}

/// The caller's project, from `Authorization: Bearer <key>` or `X-API-Key: <key>`.
pub struct Project(pub Principal);

impl FromRequestParts<AppState> for Project {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let key = credential(&parts.headers).ok_or_else(|| {
            ApiError::unauthorized("missing API key: send Authorization: Bearer <key> or X-API-Key: <key>")
        })?;
        let client = state.pool.get().await?;
        match tenancy::authenticate(&**client, key).await? {
            Some(principal) => Ok(Project(principal)),
            None => Err(ApiError::unauthorized("the API key is not valid or has been revoked")),
        }
    }
}

/// The operator, from `Authorization: Bearer $RAILHOOK_ADMIN_TOKEN`.
pub struct Operator;

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let expected = state.config.api.admin_token.as_bytes();
        if expected.is_empty() {
            return Err(ApiError::new(StatusCode::FORBIDDEN, "admin_disabled", "admin routes are disabled: set RAILHOOK_ADMIN_TOKEN"));
        }
        let given = credential(&parts.headers).ok_or_else(|| ApiError::unauthorized("missing operator token: send Authorization: Bearer <token>"))?;
        // Compare MACs of both values so the comparison takes the same time whatever matches.
        let mac = |v: &[u8]| {
            let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(b"railhook-admin").expect("HMAC takes any key length");
            m.update(v);
            m.finalize().into_bytes()
        };
        if mac(given.as_bytes()) == mac(expected) {
            Ok(Operator)
        } else {
            Err(ApiError::unauthorized("the operator token is not valid"))
        }
    }
}

fn credential(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        let (scheme, rest) = v.split_once(' ')?;
        return scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim()).filter(|s| !s.is_empty());
    }
    headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim).filter(|s| !s.is_empty())
}

/// For PATCH bodies: tells an absent field (`None`) from an explicit `null` (`Some(None)`).
/// Use with `#[serde(default, deserialize_with = "present")]`.
pub fn present<'de, T: Deserialize<'de>, D: Deserializer<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// A PATCH field that may be absent but not `null`.
pub fn not_null<T>(field: &'static str, value: Option<Option<T>>) -> Result<Option<T>, ApiError> {
    match value {
        Some(None) => Err(ApiError::invalid(field, format!("{field} cannot be null; leave it out to keep its value"))),
        Some(Some(v)) => Ok(Some(v)),
        None => Ok(None),
    }
}

/// A JSON body that may also be left out entirely (no body, no `Content-Type`): then
/// `T::default()`. A body that is there goes through [`ApiJson`], with its errors.
pub async fn optional_json<T: DeserializeOwned + Default>(headers: &HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let bytes = body.map_err(body_rejection)?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    let mut request = Request::new(axum::body::Body::from(bytes));
    if let Some(content_type) = headers.get(header::CONTENT_TYPE) {
        request.headers_mut().insert(header::CONTENT_TYPE, content_type.clone());
    }
    let ApiJson(value) = ApiJson::<T>::from_request(request, &()).await?;
    Ok(value)
}
