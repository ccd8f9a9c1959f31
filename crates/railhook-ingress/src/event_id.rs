//! Provider event ids: where they are read from and the limits every id keeps.

use crate::{Headers, Refusal};

/// The longest event id kept. Providers' ids are UUIDs or short prefixed ids; anything longer
/// is not one of theirs.
pub const MAX_EVENT_ID_LEN: usize = 255;

/// An id fit for the unique (source, provider event id) key: non-empty, at most
/// [`MAX_EVENT_ID_LEN`] bytes, no control characters.
fn acceptable(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_EVENT_ID_LEN && !id.chars().any(char::is_control)
}

/// The event id in header `name`: absent is `None` (the request is kept without dedupe),
/// present but unfit (repeated, not UTF-8, too long) is `malformed_header`.
pub(crate) fn from_header(headers: &Headers<'_>, name: &str) -> Result<Option<String>, Refusal> {
    match headers.single(name)? {
        None => Ok(None),
        Some(id) if acceptable(id) => Ok(Some(id.to_string())),
        Some(_) => Err(Refusal::MalformedHeader),
    }
}

/// The body as JSON, for providers that always send JSON (`body_not_parsable` otherwise).
pub(crate) fn json(body: &[u8]) -> Result<serde_json::Value, Refusal> {
    serde_json::from_slice(body).map_err(|_| Refusal::BodyNotParsable)
}

/// The string field `field` of a JSON object: absent (or not an object) is `None`; present
/// but not a fit string is `body_not_parsable`.
pub(crate) fn from_json_field(
    value: &serde_json::Value,
    field: &str,
) -> Result<Option<String>, Refusal> {
    match value.get(field) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(id)) if acceptable(id) => Ok(Some(id.clone())),
        Some(_) => Err(Refusal::BodyNotParsable),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn limits() {
        let long = "x".repeat(MAX_EVENT_ID_LEN + 1);
        let h: Headers = [
            ("Id", &b"abc"[..]),
            ("Long", long.as_bytes()),
            ("Ctl", b"a\x01b"),
        ]
        .into_iter()
        .collect();
        assert_eq!(from_header(&h, "id"), Ok(Some("abc".into())));
        assert_eq!(from_header(&h, "absent"), Ok(None));
        assert_eq!(from_header(&h, "long"), Err(Refusal::MalformedHeader));
        assert_eq!(from_header(&h, "ctl"), Err(Refusal::MalformedHeader));
        let v = json!({"id": "evt_1", "n": 5, "e": "", "z": null});
        assert_eq!(from_json_field(&v, "id"), Ok(Some("evt_1".into())));
        assert_eq!(from_json_field(&v, "missing"), Ok(None));
        assert_eq!(from_json_field(&v, "z"), Ok(None));
        assert_eq!(from_json_field(&v, "n"), Err(Refusal::BodyNotParsable));
        assert_eq!(from_json_field(&v, "e"), Err(Refusal::BodyNotParsable));
        assert_eq!(from_json_field(&json!([1]), "id"), Ok(None));
        assert_eq!(json(b"{"), Err(Refusal::BodyNotParsable));
    }
}
