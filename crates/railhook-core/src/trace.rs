//! W3C Trace Context (https://www.w3.org/TR/trace-context/): the `traceparent` and
//! `tracestate` headers a caller sends with an Event, that travel with its announcements and
//! that the worker sends to the receiver. Parsing only; the spans are `railhook-telemetry`'s.
//!
//! The rules kept here are the specification's for a receiver of the headers:
//! - a `traceparent` that does not parse is ignored (the request goes on, a new trace starts):
//!   never an error for the caller;
//! - `tracestate` is kept only with a valid `traceparent`, and dropped whole when it is not a
//!   list Railhook can carry (over 512 bytes, more than 32 members, a member that is not
//!   `key=value`, or a byte outside printable ASCII). Optional whitespace around its commas is
//!   removed, so the carried form has no space (the announcement line is space separated).

use std::fmt;

/// The specification's size a vendor must be able to propagate; longer lists may be dropped.
pub const TRACESTATE_MAX_BYTES: usize = 512;
/// The specification's limit on list members.
pub const TRACESTATE_MAX_MEMBERS: usize = 32;

/// A parsed `traceparent`: which trace, which span is the parent, and the sampled flag.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub parent_id: [u8; 8],
    pub flags: u8,
}

/// A `traceparent` with its (normalised) `tracestate`, as Railhook carries them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TraceContext {
    pub parent: TraceParent,
    pub state: Option<String>,
}

impl TraceParent {
    /// Parses a `traceparent` header value. `None` for anything the specification says to
    /// ignore: the wrong length or case, version `ff`, an all-zero trace or parent id, a
    /// version 00 value with anything after the flags.
    pub fn parse(value: &[u8]) -> Option<TraceParent> {
        // version "-" trace-id "-" parent-id "-" flags: 2 + 1 + 32 + 1 + 16 + 1 + 2 = 55.
        if value.len() < 55 || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let version = hex_byte(&value[0..2])?;
        if version == 0xff {
            return None;
        }
        // Version 00 is exactly 55 bytes; a later version may append fields after a '-'.
        if (version == 0 && value.len() != 55) || (value.len() > 55 && value[55] != b'-') {
            return None;
        }
        let mut trace_id = [0u8; 16];
        for (i, b) in trace_id.iter_mut().enumerate() {
            *b = hex_byte(&value[3 + 2 * i..5 + 2 * i])?;
        }
        let mut parent_id = [0u8; 8];
        for (i, b) in parent_id.iter_mut().enumerate() {
            *b = hex_byte(&value[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&value[53..55])?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(TraceParent { trace_id, parent_id, flags })
    }

    /// The trace id as 32 lowercase hex digits (what trace viewers search by).
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

/// `traceparent`'s form: always version 00 (what this build writes, whatever it read).
impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "00-{}-{}-{:02x}", hex(&self.trace_id), hex(&self.parent_id), self.flags)
    }
}

impl fmt::Debug for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceParent({self})")
    }
}

impl TraceContext {
    /// From the two headers' values (`tracestate` possibly repeated: the specification
    /// joins repeated headers with commas). `None` without a valid `traceparent`.
    pub fn from_headers<'a>(traceparent: Option<&[u8]>, tracestate: impl IntoIterator<Item = &'a [u8]>) -> Option<TraceContext> {
        let parent = TraceParent::parse(traceparent?)?;
        Some(TraceContext { parent, state: normalise_tracestate(tracestate) })
    }

    /// From the stored or announced text forms (each as [`TraceContext::from_headers`]).
    pub fn from_text(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<TraceContext> {
        TraceContext::from_headers(traceparent.map(str::as_bytes), tracestate.map(str::as_bytes))
    }

    pub fn traceparent(&self) -> String {
        self.parent.to_string()
    }
}

/// The carried form of `tracestate` values, or `None` to drop it (see the module doc).
pub fn normalise_tracestate<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Option<String> {
    let mut out = String::new();
    let mut members = 0;
    for value in values {
        let text = std::str::from_utf8(value).ok()?;
        for member in text.split(',') {
            let member = member.trim_matches(|c| c == ' ' || c == '\t');
            if member.is_empty() {
                continue; // empty list members are allowed and skipped
            }
            let (key, val) = member.split_once('=')?;
            let printable = |s: &str| !s.is_empty() && s.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',' && b != b'=');
            if !printable(key) || !printable(val) {
                return None;
            }
            members += 1;
            if members > TRACESTATE_MAX_MEMBERS {
                return None;
            }
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(member);
            if out.len() > TRACESTATE_MAX_BYTES {
                return None;
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    // Lowercase only: the specification makes uppercase hex invalid.
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(digit(two[0])? << 4 | digit(two[1])?)
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_and_prints_the_specification_example() {
        let p = TraceParent::parse(GOOD.as_bytes()).unwrap();
        assert_eq!(p.to_string(), GOOD);
        assert_eq!(p.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(p.sampled());
        // A later version with more fields is read as version 00 (the specification's rule).
        let future = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-whatever";
        assert_eq!(TraceParent::parse(future.as_bytes()).unwrap().to_string(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
    }

    #[test]
    fn ignores_what_the_specification_says_to_ignore() {
        for bad in [
            "",
            "00",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn tracestate_is_normalised_or_dropped() {
        let one = |s: &str| normalise_tracestate([s.as_bytes()]);
        assert_eq!(one("rojo=00f067aa0ba902b7 , congo=t61rcWkgMzE"), Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE".into()));
        assert_eq!(normalise_tracestate([b"a=1".as_slice(), b"b=2".as_slice()]), Some("a=1,b=2".into()));
        assert_eq!(one(",,"), None);
        assert_eq!(one("novalue"), None);
        assert_eq!(one("a=has space"), None);
        assert_eq!(one(&"k=v,".repeat(33)), None);
        assert_eq!(one(&format!("k={}", "v".repeat(600))), None);
        assert_eq!(normalise_tracestate([b"\xff=1".as_slice()]), None);
        // Without a valid traceparent there is no context at all.
        assert_eq!(TraceContext::from_headers(Some(b"garbage"), [b"a=1".as_slice()]), None);
        assert_eq!(TraceContext::from_text(Some(GOOD), Some("a=1")).unwrap().state.as_deref(), Some("a=1"));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(value in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80), state in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80)) {
            let _ = TraceContext::from_headers(Some(&value), [state.as_slice()]);
        }

        #[test]
        fn what_parses_prints_back(trace in proptest::prelude::any::<u128>(), parent in 1u64.., flags in proptest::prelude::any::<u8>()) {
            let trace = trace.max(1);
            let text = format!("00-{trace:032x}-{parent:016x}-{flags:02x}");
            proptest::prop_assert_eq!(TraceParent::parse(text.as_bytes()).map(|p| p.to_string()), Some(text));
        }
    }
}
