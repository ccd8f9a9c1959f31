//! The request as it reached the ingress, borrowed: what every verifier reads.

use crate::Refusal;

/// Request headers in arrival order; names compare ASCII case-insensitively and a name may
/// appear several times. Values are bytes, as HTTP allows; verifiers that need text refuse
/// non-UTF-8 as `malformed_header`.
///
/// Built from an `http::HeaderMap` with
/// `map.iter().map(|(n, v)| (n.as_str(), v.as_bytes())).collect()`.
#[derive(Debug, Clone, Default)]
pub struct Headers<'a> {
    entries: Vec<(&'a str, &'a [u8])>,
}

impl<'a> Headers<'a> {
    pub fn new() -> Headers<'a> {
        Headers {
            entries: Vec::new(),
        }
    }

    pub fn push(&mut self, name: &'a str, value: &'a [u8]) {
        self.entries.push((name, value));
    }

    /// Every value of `name`, in arrival order.
    pub fn get_all<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'a [u8]> + 's {
        self.entries
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }

    /// The first value of `name`.
    pub fn get(&self, name: &str) -> Option<&'a [u8]> {
        self.get_all(name).next()
    }

    /// The one value of `name` as trimmed text: `Ok(None)` if absent or blank; refused as
    /// `malformed_header` if it is repeated (a provider sends each of its headers once, and a
    /// second copy is ambiguous) or not UTF-8.
    pub(crate) fn single(&self, name: &str) -> Result<Option<&'a str>, Refusal> {
        let mut values = self.get_all(name);
        let Some(first) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(Refusal::MalformedHeader);
        }
        let text = std::str::from_utf8(first)
            .map_err(|_| Refusal::MalformedHeader)?
            .trim();
        Ok(if text.is_empty() { None } else { Some(text) })
    }

    /// Like [`Headers::single`], absent or blank being `missing_header`.
    pub(crate) fn required(&self, name: &str) -> Result<&'a str, Refusal> {
        self.single(name)?.ok_or(Refusal::MissingHeader)
    }
}

impl<'a> FromIterator<(&'a str, &'a [u8])> for Headers<'a> {
    fn from_iter<I: IntoIterator<Item = (&'a str, &'a [u8])>>(iter: I) -> Headers<'a> {
        Headers {
            entries: iter.into_iter().collect(),
        }
    }
}

/// One request to an ingress URL, as it arrived.
#[derive(Debug, Clone)]
pub struct IncomingRequest<'a> {
    /// The HTTP method, e.g. `POST` (HubSpot signs it; Twilio may call with `GET`).
    pub method: &'a str,
    /// The absolute URL the provider called, scheme, host, path and query exactly as the
    /// provider has it configured (Twilio, Square and HubSpot sign it). Behind a proxy this is
    /// the public URL, not the one the listener saw.
    pub url: &'a str,
    pub headers: Headers<'a>,
    /// The raw body bytes, never re-serialised.
    pub body: &'a [u8],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_is_case_insensitive_and_keeps_repeats() {
        let h: Headers = [
            ("X-A", &b"1"[..]),
            ("x-a", b"2"),
            ("X-B", b" v "),
            ("X-C", b"  "),
            ("X-D", b"\xff"),
        ]
        .into_iter()
        .collect();
        assert_eq!(h.get_all("x-A").collect::<Vec<_>>(), vec![&b"1"[..], b"2"]);
        assert_eq!(h.get("X-B"), Some(&b" v "[..]));
        assert_eq!(h.single("x-a"), Err(Refusal::MalformedHeader));
        assert_eq!(h.single("x-b"), Ok(Some("v")));
        assert_eq!(h.single("x-c"), Ok(None));
        assert_eq!(h.required("x-c"), Err(Refusal::MissingHeader));
        assert_eq!(h.required("x-z"), Err(Refusal::MissingHeader));
        assert_eq!(h.single("x-d"), Err(Refusal::MalformedHeader));
    }
}
