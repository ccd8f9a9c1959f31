//! Event types and the Subscription patterns that match them.
//!
//! A type is 1-10 dot-separated segments of `[a-z0-9_-]`, at most 200 characters. A pattern
//! is an exact type (`order.paid`), a type whose last segment is `*` (exactly one more
//! segment: `order.*` matches `order.paid`, not `order.paid.v2`), a type whose last segment is
//! `**` (one or more further segments), or `**` alone (everything).
//!
//! Contract used by ingest: `pattern.matches(t)` holds exactly when
//! `candidate_patterns(t)` contains `pattern.as_str()`, so matching is an index lookup with
//! `event_type_pattern = ANY(candidates)` instead of loading every Subscription.

use std::fmt;

pub const MAX_TYPE_LEN: usize = 200;
pub const MAX_SEGMENTS: usize = 10;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("must be 1 to {MAX_TYPE_LEN} characters")]
    Length,
    #[error("has more than {MAX_SEGMENTS} segments")]
    TooManySegments,
    #[error("has an empty segment (two dots, or a dot at either end)")]
    EmptySegment,
    #[error("segment '{0}' may only contain lower-case letters, digits, '_' and '-'")]
    BadSegment(String),
    #[error("'*' and '**' may only be the last segment (e.g. 'order.*', 'order.**' or '**')")]
    MisplacedWildcard,
}

/// A validated event type such as `order.paid`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventType(String);

fn check_segment(seg: &str) -> Result<(), PatternError> {
    if seg.is_empty() {
        return Err(PatternError::EmptySegment);
    }
    if !seg.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-') {
        return Err(PatternError::BadSegment(seg.chars().take(40).collect()));
    }
    Ok(())
}

fn check_shape(text: &str) -> Result<Vec<&str>, PatternError> {
    if text.is_empty() || text.len() > MAX_TYPE_LEN {
        return Err(PatternError::Length);
    }
    let segments: Vec<&str> = text.split('.').collect();
    if segments.len() > MAX_SEGMENTS {
        return Err(PatternError::TooManySegments);
    }
    Ok(segments)
}

impl EventType {
    pub fn parse(text: &str) -> Result<EventType, PatternError> {
        for seg in check_shape(text)? {
            if seg == "*" || seg == "**" {
                return Err(PatternError::BadSegment(seg.into()));
            }
            check_segment(seg)?;
        }
        Ok(EventType(text.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('.')
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Exact,
    /// `prefix.*`: the prefix's segments plus exactly one.
    OneMore,
    /// `prefix.**`: the prefix's segments plus one or more; `**` alone: everything.
    AnyMore,
}

/// A validated Subscription pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventTypePattern {
    text: String,
    kind: Kind,
    /// The segments before the wildcard (all of them for an exact pattern).
    prefix: Vec<String>,
}

impl EventTypePattern {
    pub fn parse(text: &str) -> Result<EventTypePattern, PatternError> {
        let segments = check_shape(text)?;
        let (last, init) = segments.split_last().ok_or(PatternError::Length)?;
        for seg in init {
            if seg.contains('*') {
                return Err(PatternError::MisplacedWildcard);
            }
            check_segment(seg)?;
        }
        let kind = match *last {
            "*" if !init.is_empty() => Kind::OneMore,
            "*" => return Err(PatternError::MisplacedWildcard),
            "**" => Kind::AnyMore,
            seg if seg.contains('*') => return Err(PatternError::MisplacedWildcard),
            seg => {
                check_segment(seg)?;
                Kind::Exact
            }
        };
        let prefix = match kind {
            Kind::Exact => segments.iter().map(|s| s.to_string()).collect(),
            _ => init.iter().map(|s| s.to_string()).collect(),
        };
        Ok(EventTypePattern { text: text.to_string(), kind, prefix })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn matches(&self, t: &EventType) -> bool {
        let segs: Vec<&str> = t.segments().collect();
        let starts = segs.len() >= self.prefix.len() && self.prefix.iter().zip(&segs).all(|(p, s)| p == s);
        match self.kind {
            Kind::Exact => segs.len() == self.prefix.len() && starts,
            Kind::OneMore => segs.len() == self.prefix.len() + 1 && starts,
            Kind::AnyMore => segs.len() > self.prefix.len() && starts,
        }
    }
}

/// Every pattern string that can match `t`: the type itself, `parent.*`, `p.**` for every
/// proper prefix `p`, and `**`. At most `MAX_SEGMENTS + 2` strings.
pub fn candidate_patterns(t: &EventType) -> Vec<String> {
    let segs: Vec<&str> = t.segments().collect();
    let mut out = Vec::with_capacity(segs.len() + 2);
    out.push(t.as_str().to_string());
    out.push("**".to_string());
    for i in 1..segs.len() {
        let prefix = segs[..i].join(".");
        if i == segs.len() - 1 {
            out.push(format!("{prefix}.*"));
        }
        out.push(format!("{prefix}.**"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> EventType {
        EventType::parse(s).unwrap()
    }

    #[test]
    fn types_are_validated() {
        for ok in ["order", "order.paid", "a-b.c_d.9", &"a.".repeat(9).to_string().add_last("z")] {
            assert!(EventType::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Order.paid", "order..paid", ".order", "order.", "order.*", "ordér", "a b", &"x".repeat(201), &"a.".repeat(10).add_last("z")] {
            assert!(EventType::parse(bad).is_err(), "{bad}");
        }
    }

    trait AddLast {
        fn add_last(self, s: &str) -> String;
    }
    impl AddLast for String {
        fn add_last(mut self, s: &str) -> String {
            self.push_str(s);
            self
        }
    }

    #[test]
    fn wildcards() {
        let one = EventTypePattern::parse("order.*").unwrap();
        assert!(one.matches(&t("order.paid")));
        assert!(!one.matches(&t("order")));
        assert!(!one.matches(&t("order.paid.v2")));
        assert!(!one.matches(&t("orders.paid")));
        let any = EventTypePattern::parse("order.**").unwrap();
        assert!(any.matches(&t("order.paid")) && any.matches(&t("order.paid.v2")));
        assert!(!any.matches(&t("order")));
        let all = EventTypePattern::parse("**").unwrap();
        assert!(all.matches(&t("x")) && all.matches(&t("a.b.c")));
        let exact = EventTypePattern::parse("order.paid").unwrap();
        assert!(exact.matches(&t("order.paid")) && !exact.matches(&t("order.paid.v2")));
        for bad in ["*", "order.*.paid", "*.paid", "order.p*", "**.paid", "order..*", ""] {
            assert!(EventTypePattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn candidates_agree_with_matches() {
        let words = ["a", "b", "order", "paid"];
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let mut checked = 0;
        for _ in 0..3000 {
            let len = 1 + next(4);
            let ty: Vec<&str> = (0..len).map(|_| words[next(words.len())]).collect();
            let ty = t(&ty.join("."));
            let plen = 1 + next(4);
            let mut pat: Vec<String> = (0..plen).map(|_| words[next(words.len())].to_string()).collect();
            match next(3) {
                0 => {}
                1 => *pat.last_mut().unwrap() = "*".into(),
                _ => *pat.last_mut().unwrap() = "**".into(),
            }
            let Ok(p) = EventTypePattern::parse(&pat.join(".")) else { continue };
            let cands = candidate_patterns(&ty);
            assert_eq!(p.matches(&ty), cands.iter().any(|c| c == p.as_str()), "{} vs {}", p.as_str(), ty);
            checked += 1;
        }
        assert!(checked > 2000);
        assert_eq!(candidate_patterns(&t("order.paid")), vec!["order.paid", "**", "order.*", "order.**"]);
    }
}
