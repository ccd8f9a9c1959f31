//! Event types and the Subscription patterns that match them.
//!
//! A type is 1-10 dot-separated segments of `[a-z0-9_-]`, at most 200 characters. A pattern
//! is an exact type (`order.paid`), a type whose last segment is `*` (exactly one more
//! segment: `order.*` matches `order.paid`, not `order` nor `order.paid.v2`), a type whose
//! last segment is `**` (one or more further segments), or `**` alone (everything).
//!
//! Contract used by ingest: `pattern.matches(t)` holds exactly when
//! `candidate_patterns(t)` contains `pattern.as_str()`, so matching is an index lookup with
//! `event_type_pattern = ANY(candidates)` instead of loading every Subscription.
//!
//! Every pattern that parses matches at least one valid event type: patterns that could never
//! match (too many segments, a prefix too long to be followed by another segment) are refused
//! when the Subscription is created instead of silently receiving nothing.

use std::fmt;
use std::str::FromStr;

/// Longest event type, in bytes (all allowed characters are ASCII).
pub const MAX_TYPE_LEN: usize = 200;
/// Most segments in an event type, and so in a pattern.
pub const MAX_SEGMENTS: usize = 10;
/// Longest pattern: `prefix.**` where `prefix.x` is a type of [`MAX_TYPE_LEN`] characters.
pub const MAX_PATTERN_LEN: usize = MAX_TYPE_LEN + 1;

/// Why an event type or a pattern was refused. The message names which of the two it was
/// and what is wrong, so it can be returned to an API client as is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("event type {0}")]
    Type(Problem),
    #[error("event type pattern {0}")]
    Pattern(Problem),
}

impl PatternError {
    pub fn problem(&self) -> &Problem {
        match self {
            PatternError::Type(p) | PatternError::Pattern(p) => p,
        }
    }
}

/// What is wrong with an event type or pattern; see [`PatternError`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("must be 1 to {max} characters long (got {len})")]
    Length { len: usize, max: usize },
    #[error("has {count} dot-separated segments; at most {MAX_SEGMENTS} are allowed")]
    TooManySegments { count: usize },
    #[error("has an empty segment (two dots in a row, or a dot at the start or end)")]
    EmptySegment,
    #[error("segment '{0}' may only contain lower-case letters a-z, digits, '_' and '-'")]
    BadSegment(String),
    #[error("may not contain '*' or '**'; wildcards belong in subscription patterns")]
    WildcardInType,
    #[error("may use '*' or '**' only as its last segment (e.g. 'order.*', 'order.**' or '**')")]
    MisplacedWildcard,
    #[error("segment '{0}' mixes a wildcard with other characters; '*' and '**' must be a whole segment")]
    PartialWildcard(String),
    #[error("'*' needs a prefix ('order.*'); use '**' to match every event type")]
    LoneStar,
}

/// A validated event type such as `order.paid`.
///
/// Invariant: 1 to [`MAX_TYPE_LEN`] characters, 1 to [`MAX_SEGMENTS`] non-empty segments of
/// `[a-z0-9_-]` separated by single dots.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventType(String);

/// Shows a segment back to the client without echoing an arbitrarily long input.
fn excerpt(seg: &str) -> String {
    let mut out: String = seg.chars().take(40).collect();
    if out.len() < seg.len() {
        out.push_str("...");
    }
    out
}

fn check_segment(seg: &str) -> Result<(), Problem> {
    if seg.is_empty() {
        return Err(Problem::EmptySegment);
    }
    if !seg.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-') {
        return Err(Problem::BadSegment(excerpt(seg)));
    }
    Ok(())
}

fn split_segments(text: &str, max_len: usize) -> Result<Vec<&str>, Problem> {
    let len = text.chars().count();
    if len == 0 || len > max_len {
        return Err(Problem::Length { len, max: max_len });
    }
    let segments: Vec<&str> = text.split('.').collect();
    if segments.len() > MAX_SEGMENTS {
        return Err(Problem::TooManySegments { count: segments.len() });
    }
    Ok(segments)
}

impl EventType {
    /// Validates `text` as an event type (see the type's invariant).
    pub fn parse(text: &str) -> Result<EventType, PatternError> {
        let segments = split_segments(text, MAX_TYPE_LEN).map_err(PatternError::Type)?;
        for seg in segments {
            if seg.contains('*') {
                return Err(PatternError::Type(Problem::WildcardInType));
            }
            check_segment(seg).map_err(PatternError::Type)?;
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

impl FromStr for EventType {
    type Err = PatternError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EventType::parse(s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Kind {
    Exact,
    /// `prefix.*`: the prefix's segments plus exactly one.
    OneMore,
    /// `prefix.**`: the prefix's segments plus one or more; `**` alone: everything.
    AnyMore,
}

/// A validated Subscription pattern: `order.paid`, `order.*`, `order.**` or `**`.
///
/// Stored and looked up by its text ([`EventTypePattern::as_str`]), which is exactly the
/// input that parsed: there is a single spelling of each pattern, so the index lookup on
/// [`candidate_patterns`] finds it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventTypePattern {
    text: String,
    kind: Kind,
    /// The segments before the wildcard (all of them for an exact pattern).
    prefix: Vec<String>,
}

impl EventTypePattern {
    /// Validates `text` as a pattern. Refuses wildcards anywhere but the last segment,
    /// partial wildcards (`pay*`), a lone `*`, and patterns no event type could match.
    pub fn parse(text: &str) -> Result<EventTypePattern, PatternError> {
        let err = PatternError::Pattern;
        let segments = split_segments(text, MAX_PATTERN_LEN).map_err(err)?;
        let (last, init) = segments.split_last().ok_or(err(Problem::Length { len: 0, max: MAX_PATTERN_LEN }))?;
        for seg in init {
            match *seg {
                "*" | "**" => return Err(err(Problem::MisplacedWildcard)),
                s if s.contains('*') => return Err(err(Problem::PartialWildcard(excerpt(s)))),
                s => check_segment(s).map_err(err)?,
            }
        }
        let kind = match *last {
            "*" if init.is_empty() => return Err(err(Problem::LoneStar)),
            "*" => Kind::OneMore,
            "**" => Kind::AnyMore,
            s if s.contains('*') => return Err(err(Problem::PartialWildcard(excerpt(s)))),
            s => {
                check_segment(s).map_err(err)?;
                Kind::Exact
            }
        };
        // `prefix.**` may be one character longer than a type (the shortest type it matches
        // is `prefix.x`); everything else is at most as long as the types it matches.
        if kind != Kind::AnyMore && text.len() > MAX_TYPE_LEN {
            return Err(err(Problem::Length { len: text.len(), max: MAX_TYPE_LEN }));
        }
        let prefix = match kind {
            Kind::Exact => segments.iter().map(|s| s.to_string()).collect(),
            _ => init.iter().map(|s| s.to_string()).collect(),
        };
        Ok(EventTypePattern { text: text.to_string(), kind, prefix })
    }

    /// The pattern as stored in `subscriptions.event_type_pattern`.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether an Event of type `t` goes to Subscriptions with this pattern.
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

impl fmt::Display for EventTypePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for EventTypePattern {
    type Err = PatternError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EventTypePattern::parse(s)
    }
}

/// Every pattern string that can match `t`: the type itself, `parent.*`, `p.**` for every
/// proper prefix `p`, and `**`. At most `MAX_SEGMENTS + 2` strings, no duplicates.
///
/// Contract: for every pattern `p` that parses, `p.matches(t)` exactly when the result
/// contains `p.as_str()`.
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
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn t(s: &str) -> EventType {
        EventType::parse(s).unwrap()
    }

    fn p(s: &str) -> EventTypePattern {
        EventTypePattern::parse(s).unwrap()
    }

    #[test]
    fn types_are_validated() {
        let ten = ["a"; 10].join(".");
        let long = format!("{}.b", "a".repeat(MAX_TYPE_LEN - 2));
        for ok in ["order", "order.paid", "a-b.c_d.9", "0", ten.as_str(), long.as_str()] {
            assert_eq!(EventType::parse(ok).map(|t| t.to_string()), Ok(ok.to_string()));
        }
        let eleven = ["a"; 11].join(".");
        let too_long = "x".repeat(MAX_TYPE_LEN + 1);
        let bad = [
            "", "Order.paid", "order..paid", ".order", "order.", "order.*", "order.**", "**", "ordér", "a b",
            "order paid", "order/paid", "order.paid\n", too_long.as_str(), eleven.as_str(),
        ];
        for bad in bad {
            assert!(matches!(EventType::parse(bad), Err(PatternError::Type(_))), "{bad:?}");
        }
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let msg = |s: &str| EventType::parse(s).unwrap_err().to_string();
        assert_eq!(msg(""), "event type must be 1 to 200 characters long (got 0)");
        assert_eq!(msg("Order.paid"), "event type segment 'Order' may only contain lower-case letters a-z, digits, '_' and '-'");
        assert_eq!(msg("a..b"), "event type has an empty segment (two dots in a row, or a dot at the start or end)");
        assert_eq!(msg(&["a"; 11].join(".")), "event type has 11 dot-separated segments; at most 10 are allowed");
        assert_eq!(msg("order.*"), "event type may not contain '*' or '**'; wildcards belong in subscription patterns");
        assert!(msg(&format!("{}X", "a".repeat(100))).ends_with("aaaa...' may only contain lower-case letters a-z, digits, '_' and '-'"));

        let pmsg = |s: &str| EventTypePattern::parse(s).unwrap_err().to_string();
        assert_eq!(pmsg("order.*.paid"), "event type pattern may use '*' or '**' only as its last segment (e.g. 'order.*', 'order.**' or '**')");
        assert_eq!(pmsg("**.paid"), "event type pattern may use '*' or '**' only as its last segment (e.g. 'order.*', 'order.**' or '**')");
        assert_eq!(pmsg("order.pa*"), "event type pattern segment 'pa*' mixes a wildcard with other characters; '*' and '**' must be a whole segment");
        assert_eq!(pmsg("*"), "event type pattern '*' needs a prefix ('order.*'); use '**' to match every event type");
        assert_eq!(pmsg("order..*"), "event type pattern has an empty segment (two dots in a row, or a dot at the start or end)");
    }

    #[test]
    fn wildcards() {
        let one = p("order.*");
        assert!(one.matches(&t("order.paid")));
        assert!(!one.matches(&t("order")));
        assert!(!one.matches(&t("order.paid.v2")));
        assert!(!one.matches(&t("orders.paid")));
        let any = p("order.**");
        assert!(any.matches(&t("order.paid")) && any.matches(&t("order.paid.v2")));
        assert!(!any.matches(&t("order")) && !any.matches(&t("orders.paid")));
        let all = p("**");
        assert!(all.matches(&t("x")) && all.matches(&t("a.b.c")));
        let exact = p("order.paid");
        assert!(exact.matches(&t("order.paid")) && !exact.matches(&t("order.paid.v2")) && !exact.matches(&t("order")));
        for bad in ["*", "order.*.paid", "*.paid", "order.p*", "order.***", "**.paid", "order..*", "", "Order.*", "order.*."] {
            assert!(matches!(EventTypePattern::parse(bad), Err(PatternError::Pattern(_))), "{bad}");
        }
    }

    #[test]
    fn patterns_that_could_never_match_are_refused() {
        // `prefix.*` with ten prefix segments would need an eleven-segment type.
        assert!(EventTypePattern::parse(&format!("{}.*", ["a"; 10].join("."))).is_err());
        assert!(EventTypePattern::parse(&format!("{}.**", ["a"; 10].join("."))).is_err());
        let nine = p(&format!("{}.**", ["a"; 9].join(".")));
        assert!(nine.matches(&t(&["a"; 10].join("."))));

        // Longest prefix that can still be followed by a segment: 198 characters.
        let prefix = "a".repeat(MAX_TYPE_LEN - 2);
        let longest_any = p(&format!("{prefix}.**"));
        assert_eq!(longest_any.as_str().len(), MAX_PATTERN_LEN);
        assert!(longest_any.matches(&t(&format!("{prefix}.b"))));
        assert!(p(&format!("{prefix}.*")).matches(&t(&format!("{prefix}.b"))));
        let prefix = "a".repeat(MAX_TYPE_LEN - 1);
        assert!(EventTypePattern::parse(&format!("{prefix}.**")).is_err());
        assert!(EventTypePattern::parse(&format!("{prefix}.*")).is_err());
        assert!(EventTypePattern::parse(&"a".repeat(MAX_TYPE_LEN + 1)).is_err());
    }

    #[test]
    fn candidates_of_a_type() {
        assert_eq!(candidate_patterns(&t("order")), vec!["order", "**"]);
        assert_eq!(candidate_patterns(&t("order.paid")), vec!["order.paid", "**", "order.*", "order.**"]);
        assert_eq!(
            candidate_patterns(&t("a.b.c")),
            vec!["a.b.c", "**", "a.**", "a.b.*", "a.b.**"]
        );
        let ten = t(&["a"; 10].join("."));
        let cands = candidate_patterns(&ten);
        assert_eq!(cands.len(), MAX_SEGMENTS + 2);
        let mut dedup = cands.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(dedup.len(), cands.len());
    }

    fn random_type(rng: &mut StdRng, words: &[&str]) -> EventType {
        let len = rng.random_range(1..=MAX_SEGMENTS);
        let segs: Vec<&str> = (0..len).map(|_| words[rng.random_range(0..words.len())]).collect();
        t(&segs.join("."))
    }

    fn random_pattern_text(rng: &mut StdRng, words: &[&str]) -> String {
        let len = rng.random_range(1..=MAX_SEGMENTS + 1);
        let mut segs: Vec<&str> = (0..len).map(|_| words[rng.random_range(0..words.len())]).collect();
        match rng.random_range(0..3) {
            0 => {}
            1 => segs[len - 1] = "*",
            _ => segs[len - 1] = "**",
        }
        segs.join(".")
    }

    /// The contract ingest relies on, for random types and patterns over a small alphabet
    /// (so that prefixes collide often).
    #[test]
    fn candidates_agree_with_matches() {
        let seed: u64 = rand::random();
        let mut rng = StdRng::seed_from_u64(seed);
        let words = ["a", "b", "order", "paid"];
        let (mut hits, mut misses) = (0, 0);
        for _ in 0..20_000 {
            let ty = random_type(&mut rng, &words);
            // Half the time take one of the type's own candidates, so matches are frequent.
            let text = if rng.random_bool(0.5) {
                let cands = candidate_patterns(&ty);
                cands[rng.random_range(0..cands.len())].clone()
            } else {
                random_pattern_text(&mut rng, &words)
            };
            let Ok(pat) = EventTypePattern::parse(&text) else { continue };
            let matched = pat.matches(&ty);
            let listed = candidate_patterns(&ty).iter().any(|c| c == pat.as_str());
            assert_eq!(matched, listed, "seed {seed}: pattern {pat} vs type {ty}");
            if matched {
                hits += 1;
            } else {
                misses += 1;
            }
        }
        assert!(hits > 5_000 && misses > 2_000, "seed {seed}: {hits} hits, {misses} misses");
    }

    /// Every candidate of a valid type is a valid pattern (so a Subscription can hold it)
    /// and matches that type, also for types near the length limit.
    #[test]
    fn candidates_parse_and_match() {
        let seed: u64 = rand::random();
        let mut rng = StdRng::seed_from_u64(seed);
        let long = "x".repeat(60);
        let words = ["a", "order", "paid-v2", "x_y", long.as_str()];
        for _ in 0..2_000 {
            let len = rng.random_range(1..=MAX_SEGMENTS);
            let segs: Vec<&str> = (0..len).map(|_| words[rng.random_range(0..words.len())]).collect();
            let Ok(ty) = EventType::parse(&segs.join(".")) else { continue };
            for c in candidate_patterns(&ty) {
                let pat = EventTypePattern::parse(&c).unwrap_or_else(|e| panic!("seed {seed}: candidate {c} of {ty}: {e}"));
                assert!(pat.matches(&ty), "seed {seed}: {c} vs {ty}");
            }
        }
    }

    /// Parsing never panics, whatever the input, and what parses round-trips.
    #[test]
    fn arbitrary_input_never_panics() {
        let seed: u64 = rand::random();
        let mut rng = StdRng::seed_from_u64(seed);
        let alphabet: Vec<char> = "ab.*-_Z9 é\u{0}".chars().collect();
        for _ in 0..20_000 {
            let len = rng.random_range(0..24);
            let s: String = (0..len).map(|_| alphabet[rng.random_range(0..alphabet.len())]).collect();
            if let Ok(ty) = EventType::parse(&s) {
                assert_eq!(ty.as_str(), s, "seed {seed}");
                assert!(!s.contains('*'), "seed {seed}: {s}");
            }
            if let Ok(pat) = EventTypePattern::parse(&s) {
                assert_eq!(pat.as_str(), s, "seed {seed}");
            }
        }
    }
}

/// Property tests (proptest): arbitrary text against both parsers, generated valid and
/// invalid types and patterns, and the contract between [`EventTypePattern::matches`] and
/// [`candidate_patterns`] that ingest's index lookup relies on.
#[cfg(test)]
mod props {
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;

    /// Segments from a small alphabet, so that prefixes of types and patterns collide often.
    fn segment() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => proptest::sample::select(vec!["a", "b", "order", "paid", "x-y", "v_2"]).prop_map(str::to_string),
            1 => "[a-z0-9_-]{1,12}",
        ]
    }

    fn valid_type() -> impl Strategy<Value = EventType> {
        vec(segment(), 1..=MAX_SEGMENTS).prop_filter_map("too long", |s| EventType::parse(&s.join(".")).ok())
    }

    /// Pattern text: segments, then maybe `*` or `**` last; not always valid (too many
    /// segments), which `parse` must say.
    fn pattern_text() -> impl Strategy<Value = String> {
        (vec(segment(), 0..=MAX_SEGMENTS), 0..3).prop_map(|(mut segs, wild)| {
            match wild {
                1 => segs.push("*".into()),
                2 => segs.push("**".into()),
                _ => {}
            }
            if segs.is_empty() {
                segs.push("**".into());
            }
            segs.join(".")
        })
    }

    /// What a pattern must match, written out independently of `EventTypePattern`.
    fn reference_match(pattern: &str, t: &str) -> bool {
        let p: Vec<&str> = pattern.split('.').collect();
        let s: Vec<&str> = t.split('.').collect();
        match p.split_last() {
            Some((&"**", init)) => s.len() > init.len() && s[..init.len()] == *init,
            Some((&"*", init)) => s.len() == init.len() + 1 && s[..init.len()] == *init,
            _ => p == s,
        }
    }

    /// A character that may not appear in a type, and the kinds of breakage.
    fn corrupt(text: &str, how: u8, at: usize, bad: char) -> String {
        let segs: Vec<&str> = text.split('.').collect();
        let i = at % segs.len();
        let mut owned: Vec<String> = segs.iter().map(|s| s.to_string()).collect();
        match how % 5 {
            0 => owned[i].push(bad),
            1 => owned.insert(i, String::new()),
            2 => owned[i] = format!("{}*", owned[i]),
            3 => owned.insert(i, "*".into()),
            _ => return format!("{text}.{}", vec!["a"; MAX_SEGMENTS].join(".")),
        }
        owned.join(".")
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3_000))]

        /// Arbitrary text never panics either parser, and whatever parses is kept verbatim and
        /// within the documented limits.
        #[test]
        fn arbitrary_text_never_panics(text in prop_oneof![any::<String>(), "[a-z.*_Z9 -]{0,30}", ".{190,260}"]) {
            if let Ok(t) = EventType::parse(&text) {
                prop_assert_eq!(t.as_str(), text.as_str());
                prop_assert!(text.len() <= MAX_TYPE_LEN && !text.contains('*'));
                prop_assert!(text.split('.').count() <= MAX_SEGMENTS);
            }
            if let Ok(p) = EventTypePattern::parse(&text) {
                prop_assert_eq!(p.as_str(), text.as_str());
                prop_assert!(text.len() <= MAX_PATTERN_LEN);
            }
        }

        /// Types and patterns with a bad character, an empty segment, a partial or misplaced
        /// wildcard, or too many segments are refused, with the error naming which it was.
        #[test]
        fn broken_inputs_are_refused(t in valid_type(), how in any::<u8>(), at in any::<usize>(), bad in prop_oneof![Just('A'), Just(' '), Just('/'), Just('é'), Just('\0'), Just('\n'), Just(':')]) {
            let broken = corrupt(t.as_str(), how, at, bad);
            prop_assert!(matches!(EventType::parse(&broken), Err(PatternError::Type(_))), "{:?}", broken);
            // As a pattern, only `prefix.*` (how 3 at the last position) is fine.
            let as_pattern = EventTypePattern::parse(&broken);
            let wildcard_last = broken.ends_with(".*") && !broken[..broken.len() - 2].contains('*') && how % 5 == 3;
            if !wildcard_last {
                prop_assert!(matches!(as_pattern, Err(PatternError::Pattern(_))), "{:?}: {:?}", broken, as_pattern);
            }
        }

        /// The contract: a pattern that parses matches a type exactly when it is among the
        /// type's candidates, and both agree with a reference written from the docs.
        #[test]
        fn candidates_agree_with_matches(t in valid_type(), text in pattern_text(), own in any::<bool>(), pick in any::<proptest::sample::Index>()) {
            let cands = candidate_patterns(&t);
            let text = if own { cands[pick.index(cands.len())].clone() } else { text };
            let Ok(p) = EventTypePattern::parse(&text) else {
                // Only a lone `*` and patterns that no type could match are refused here.
                prop_assert!(text == "*" || text.split('.').count() > MAX_SEGMENTS || text.len() > MAX_TYPE_LEN - 1, "{:?} refused", text);
                return Ok(());
            };
            let listed = cands.iter().any(|c| c == p.as_str());
            prop_assert_eq!(p.matches(&t), listed, "pattern {} type {}", p, t);
            prop_assert_eq!(p.matches(&t), reference_match(&text, t.as_str()), "pattern {} type {}", p, t);
        }

        /// Every candidate parses, matches its type, and there are no duplicates.
        #[test]
        fn candidates_are_valid_patterns(t in valid_type()) {
            let cands = candidate_patterns(&t);
            prop_assert!(cands.len() <= MAX_SEGMENTS + 2);
            let mut sorted = cands.clone();
            sorted.sort();
            sorted.dedup();
            prop_assert_eq!(sorted.len(), cands.len());
            for c in &cands {
                let p = EventTypePattern::parse(c).map_err(|e| TestCaseError::fail(format!("{c}: {e}")))?;
                prop_assert!(p.matches(&t), "{} vs {}", c, t);
            }
        }
    }
}
