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
        // Every body is an object; serde would otherwise read an array as the struct's
        // fields in order (and `[]` as all of them left out).
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
            return Err(ApiError::invalid("body", "the body must be a JSON object"));
        }
        parse_json(&bytes).map(ApiJson)
    }
}

/// Parses a JSON body into `T`. Every failure is a 4xx [`ApiError`] (400 `invalid_json` for
/// syntax, UTF-8, nesting deeper than serde_json's limit of 128 and numbers out of range;
/// 422 naming the field for a wrong shape), never a panic, whatever the bytes.
///
/// A string containing NUL (`\u0000`) is refused with 422 naming where it is: Postgres can
/// store it neither in `text` nor in `jsonb`, so it would otherwise fail as a 500.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        json_error(e.into_inner(), path)
    })?;
    // Trailing bytes after the JSON value.
    de.end().map_err(|e| json_error(e, String::new()))?;
    if has_nul_escape(bytes) {
        let field = serde_json::from_slice::<serde_json::Value>(bytes).ok().and_then(|v| nul_path(&v, String::new()));
        return Err(ApiError::invalid(
            field.unwrap_or_else(|| "body".to_string()),
            "strings may not contain the NUL character (\\u0000): it cannot be stored",
        ));
    }
    Ok(value)
}

/// Whether valid JSON `bytes` hold a `\u0000` escape: one preceded by an odd number of
/// backslashes (`\\u0000` is a backslash followed by the text `u0000`). A raw NUL byte is
/// not valid JSON, so this is the only way a NUL gets into a string.
fn has_nul_escape(bytes: &[u8]) -> bool {
    let needle = b"u0000";
    let mut backslashes = 0usize;
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'\\' {
            backslashes += 1;
            continue;
        }
        if backslashes % 2 == 1 && b == b'u' && bytes[i..].starts_with(needle) {
            return true;
        }
        backslashes = 0;
    }
    false
}

/// Where the first string (value or key) containing NUL is, as `a.b[2]`; `None` if nowhere.
fn nul_path(value: &serde_json::Value, path: String) -> Option<String> {
    let join = |key: &str| if path.is_empty() { key.to_string() } else { format!("{path}.{key}") };
    match value {
        serde_json::Value::String(s) if s.contains('\0') => Some(if path.is_empty() { "body".to_string() } else { path }),
        serde_json::Value::Array(items) => items.iter().enumerate().find_map(|(i, v)| nul_path(v, format!("{path}[{i}]"))),
        serde_json::Value::Object(map) => map.iter().find_map(|(k, v)| {
            let here = join(k);
            if k.contains('\0') {
                Some(here)
            } else {
                nul_path(v, here)
            }
        }),
        _ => None,
    }
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
        payload_too_large()
    } else if railhook_telemetry::is_body_read_timeout(&e) {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            "the body did not arrive in time (api.body_read_timeout_ms); the connection is closed",
        )
        .with_field("body")
    } else {
        ApiError::bad_request("invalid_body", format!("cannot read the body: {e}")).with_field("body")
    }
}

pub fn payload_too_large() -> ApiError {
    ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", "the body is larger than the limit (api.max_body_bytes)").with_field("body")
}

/// Refuses a request whose `Content-Length` already exceeds `limit` before any of its body
/// is read (a chunked body is cut by `DefaultBodyLimit` once more than `limit` arrived).
/// The server then reads the unread body away in a lingering close, so that the client,
/// still sending, gets the 413 rather than a reset (`railhook_telemetry::serve_with`).
pub async fn declared_length_limit(limit: usize, request: Request, next: axum::middleware::Next) -> axum::response::Response {
    use axum::response::IntoResponse;
    let declared = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return payload_too_large().into_response();
    }
    next.run(request).await
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
        let key = credential(&parts.headers).ok_or_else(missing_key)?;
        let client = state.pool.get().await?;
        tenancy::authenticate(&client, key).await?.map(Project).ok_or_else(invalid_key)
    }
}

/// The caller's API key as sent, not yet looked up: for `POST /v1/events`, whose statement
/// looks the key up itself (one round trip per POST). A missing key is refused here (401);
/// a handler that refuses the request for another reason calls [`ApiKey::authenticate`]
/// first, so an unknown key is a 401 before any other error, as with [`Project`].
pub struct ApiKey(pub String);

impl ApiKey {
    pub async fn authenticate(&self, state: &AppState) -> Result<Principal, ApiError> {
        let client = state.pool.get().await?;
        tenancy::authenticate(&client, &self.0).await?.ok_or_else(invalid_key)
    }
}

impl FromRequestParts<AppState> for ApiKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &AppState) -> Result<Self, ApiError> {
        credential(&parts.headers).map(|k| ApiKey(k.to_string())).ok_or_else(missing_key)
    }
}

fn missing_key() -> ApiError {
    ApiError::unauthorized("missing API key: send Authorization: Bearer <key> or X-API-Key: <key>")
}

pub fn invalid_key() -> ApiError {
    ApiError::unauthorized("the API key is not valid or has been revoked")
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

/// An integer as JSON Schema reads one: `3` and `3.0` alike (a number without a fraction),
/// so the integral float some JSON libraries print is accepted; `3.5`, `1e300` or a string are
/// refused (422 naming the field).
pub struct Int(pub i64);

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Int, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Int;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an integer")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Int, E> {
                Ok(Int(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Int, E> {
                i64::try_from(v).map(Int).map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(v), &"an integer in the 64-bit signed range"))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Int, E> {
                // 2^63 is the first float past i64::MAX; -2^63 is i64::MIN itself.
                if v.fract() == 0.0 && (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&v) {
                    Ok(Int(v as i64))
                } else {
                    Err(E::invalid_type(serde::de::Unexpected::Float(v), &"an integer"))
                }
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// `Option<i64>` through [`Int`]; use with `#[serde(default, deserialize_with = "...")]`.
pub fn int<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    Option::<Int>::deserialize(d).map(|o| o.map(|i| i.0))
}

/// `Option<Vec<i64>>` through [`Int`].
pub fn ints<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<i64>>, D::Error> {
    Option::<Vec<Int>>::deserialize(d).map(|o| o.map(|v| v.into_iter().map(|i| i.0).collect()))
}

/// [`present`] for an integer field.
pub fn present_int<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<i64>>, D::Error> {
    int(d).map(Some)
}

/// [`present`] for a list of integers.
pub fn present_ints<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<Vec<i64>>>, D::Error> {
    ints(d).map(Some)
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;
    use serde_json::Value;

    /// The shape of `POST /v1/events`, to reach the typed (422) paths as well.
    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Event {
        #[serde(rename = "type")]
        event_type: String,
        payload: Value,
        count: Option<u32>,
    }

    fn client_error<T: std::fmt::Debug>(r: Result<T, ApiError>) -> ApiError {
        let e = r.expect_err("should have been refused");
        assert!(e.status.is_client_error(), "{} {} {}", e.status, e.code, e.message);
        assert!(!e.message.is_empty());
        e
    }

    #[test]
    fn deep_nesting_is_refused_by_the_recursion_limit() {
        // 100,000 `[` (and the same closed) would overflow the stack of a naive recursive
        // parser; serde_json stops at depth 128.
        for doc in ["[".repeat(100_000), format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)), "{\"a\":".repeat(100_000)] {
            let e = client_error(parse_json::<Value>(doc.as_bytes()));
            assert_eq!((e.status.as_u16(), e.code), (400, "invalid_json"));
            assert!(e.message.contains("recursion limit exceeded"), "{}", e.message);
            let wrapped = format!(r#"{{"type":"a.b","payload":{{"x":{doc}}}}}"#);
            let e = client_error(parse_json::<Event>(wrapped.as_bytes()));
            assert_eq!(e.code, "invalid_json");
        }
        // The limit itself: 127 nested levels parse, 128 do not (the body object and the
        // payload object count as two).
        let bare = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(parse_json::<Value>(bare(127).as_bytes()).is_ok());
        assert_eq!(client_error(parse_json::<Value>(bare(128).as_bytes())).code, "invalid_json");
        let nest = |n: usize| format!(r#"{{"type":"a","payload":{{"x":{}{}}}}}"#, "[".repeat(n), "]".repeat(n));
        assert!(parse_json::<Event>(nest(125).as_bytes()).is_ok());
        assert_eq!(client_error(parse_json::<Event>(nest(126).as_bytes())).code, "invalid_json");
    }

    #[test]
    fn huge_numbers_are_refused_or_kept_finite() {
        for doc in ["1e400", "-1e400", "[1e99999999999999999999]", &format!("1{}", "0".repeat(400)), &format!("0.{}1e-99999", "0".repeat(100_000))] {
            match parse_json::<Value>(doc.as_bytes()) {
                Ok(v) => assert!(v.as_f64().is_none_or(f64::is_finite), "{doc:.40}: {v}"),
                Err(e) => assert!(e.status.is_client_error(), "{doc:.40}: {}", e.status),
            }
        }
        let e = client_error(parse_json::<Value>(b"1e400"));
        assert_eq!(e.code, "invalid_json");
        // A number too large for the field's type names the field.
        let e = client_error(parse_json::<Event>(br#"{"type":"a","payload":{},"count":99999999999999999999999}"#));
        assert_eq!((e.status.as_u16(), e.field.as_deref()), (422, Some("count")));
        let e = client_error(parse_json::<Event>(br#"{"type":"a","payload":{},"count":-1}"#));
        assert_eq!(e.field.as_deref(), Some("count"));
    }

    #[test]
    fn invalid_utf8_and_junk_are_400() {
        for doc in [&b"\xff\xfe"[..], b"{\"type\":\"\xc3\x28\"}", b"\"\xed\xa0\x80\"", b"", b" ", b"{", b"nul", b"{}}", b"\"\\ud800\"", b"[1,]"] {
            let e = client_error(parse_json::<Value>(doc));
            assert_eq!((e.status.as_u16(), e.code), (400, "invalid_json"), "{doc:?}: {}", e.message);
        }
    }

    #[test]
    fn nul_in_any_string_is_a_422_naming_where() {
        let e = client_error(parse_json::<Event>(br#"{"type":"a","payload":{"note":["ok","x\u0000y"]}}"#));
        assert_eq!((e.status.as_u16(), e.field.as_deref()), (422, Some("payload.note[1]")));
        let e = client_error(parse_json::<Event>(br#"{"type":"a\u0000","payload":{}}"#));
        assert_eq!(e.field.as_deref(), Some("type"));
        let e = client_error(parse_json::<Value>(br#"{"k\u0000":1}"#));
        assert_eq!(e.field.as_deref(), Some("k\0"));
        // An escaped backslash followed by the text u0000 is not a NUL.
        let v: Value = parse_json(br#"{"a":"\\u0000","b":"\\\\u0000"}"#).unwrap();
        assert_eq!(v["a"], "\\u0000");
        assert_eq!(client_error(parse_json::<Value>(br#"{"a":"\\\u0000"}"#)).field.as_deref(), Some("a"));
    }

    /// JSON-ish text: the structural characters, escapes and literals in any order.
    fn jsonish() -> impl Strategy<Value = Vec<u8>> {
        let piece = proptest::sample::select(vec![
            "{", "}", "[", "]", ":", ",", "\"", "\\", "\\u", "0000", "d800", "1", "-", "e", "E9999", ".", "true", "null", " ", "\"type\"",
            "\"payload\"", "\"a.b\"", "\u{e9}", "\u{0}",
        ]);
        vec(piece, 0..40).prop_map(|p| p.concat().into_bytes())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3_000))]

        /// Arbitrary bytes and JSON-ish text: `parse_json` returns a 4xx error or a value,
        /// into an untyped value and into a typed body alike; it never panics.
        #[test]
        fn arbitrary_bodies_are_values_or_4xx(bytes in prop_oneof![vec(any::<u8>(), 0..200), jsonish()]) {
            if let Err(e) = parse_json::<Value>(&bytes) {
                prop_assert!(e.status == 400 || e.status == 422, "{} {}", e.status, e.message);
            }
            if let Err(e) = parse_json::<Event>(&bytes) {
                prop_assert!(e.status == 400 || e.status == 422, "{} {}", e.status, e.message);
                prop_assert!(e.field.is_some(), "{}", e.message);
            }
        }

        /// Whatever serde_json can print parses back to the same value (no NUL in strings).
        #[test]
        fn printed_values_parse_back(v in value()) {
            let text = serde_json::to_vec(&v).unwrap();
            match parse_json::<Value>(&text) {
                Ok(back) => prop_assert_eq!(back, v),
                Err(e) => {
                    prop_assert!(text.windows(6).any(|w| w == b"\\u0000"), "{}", e.message);
                    prop_assert_eq!(e.status.as_u16(), 422);
                }
            }
        }

        /// Nesting of any depth: within the limit it parses, beyond it is a 400, never a
        /// stack overflow.
        #[test]
        fn any_nesting_depth(depth in 0usize..5_000, open in proptest::sample::select(vec!["[", "{\"k\":"])) {
            let close = if open == "[" { "]" } else { "}" };
            let doc = format!("{}0{}", open.repeat(depth), close.repeat(depth));
            match parse_json::<Value>(doc.as_bytes()) {
                Ok(_) => prop_assert!(depth < 128),
                Err(e) => {
                    prop_assert!(depth >= 128);
                    prop_assert_eq!(e.code, "invalid_json");
                }
            }
        }
    }

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            // Integers only: serde_json's default float parsing may be one ulp off
            // (20814.850494384766 reads back as 20814.85049438477); that is not a safety issue.
            any::<u64>().prop_map(Value::from),
            any::<String>().prop_map(Value::String),
        ];
        leaf.prop_recursive(6, 64, 8, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..8).prop_map(Value::Array),
                proptest::collection::btree_map(any::<String>(), inner, 0..8).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
