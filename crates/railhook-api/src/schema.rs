//! The OpenAPI schemas of what the server enforces, each built from the constant its check
//! uses, so the document and the checks cannot drift apart: id patterns, integer ranges,
//! string lengths and patterns, enums, array bounds and formats (docs/API.md, "Schema and
//! fuzzing"). The handlers' structs refer to these with `#[schema(schema_with = ...)]` or
//! `#[schema(value_type = ...)]`, their parameters by type (`("id" = schema::EndpointId,
//! Path)`).
//!
//! What no schema can say (a rule between two fields, a URL's DNS answers) has its own error
//! code, listed in docs/API.md and allowed by the fuzz run (tests/fuzz/hooks.py).

use std::borrow::Cow;

use serde_json::json;
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::schema::{
    AdditionalProperties, AllOfBuilder, AnyOfBuilder, ArrayBuilder, KnownFormat, Object, ObjectBuilder, OneOfBuilder, Ref, Schema, SchemaFormat,
    SchemaType, Type,
};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};

/// The 26 characters after an id's `<prefix>_`: Crockford base32 as `railhook_core::id`
/// decodes it (either case), the first carrying the top 3 bits of the 128.
pub const ID_BODY_PATTERN: &str = "[0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{25}";

/// The pattern of an id of the kind with `prefix`.
pub fn id_pattern(prefix: &str) -> String {
    format!("^{prefix}_{ID_BODY_PATTERN}$")
}

/// Rust's `char::is_whitespace` (Unicode White_Space), as a regex character class body: what
/// `str::trim` removes.
pub const WHITESPACE_CLASS: &str = "\\t-\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";

/// No NUL (`\u0000`): Postgres stores it in neither `text` nor `jsonb`, so every string in a
/// body is refused with it (`crate::extract::parse_json`).
pub const NO_NUL_PATTERN: &str = "^[^\\u0000]*$";

fn string() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String)
}

fn nullable(ty: Type) -> SchemaType {
    SchemaType::from_iter([ty, Type::Null])
}

fn id_schema(prefix: &str, what: &str) -> Schema {
    let len = prefix.len() + 1 + 26;
    string()
        .pattern(Some(id_pattern(prefix)))
        .min_length(Some(len))
        .max_length(Some(len))
        .description(Some(format!("{what} id: `{prefix}_` and 26 base32 characters")))
        .examples([json!(format!("{prefix}_0123456789abcdefghjkmnpqrs"))])
        .into()
}

macro_rules! id_schemas {
    ($($name:ident => $core:ty, $what:literal;)*) => {$(
        #[doc = concat!("The schema of ", $what, " id (`", stringify!($core), "`).")]
        pub struct $name;

        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                id_schema(<$core>::PREFIX, $what).into()
            }
        }

        impl ToSchema for $name {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed(stringify!($name))
            }
        }
    )*};
}

id_schemas! {
    OrganizationId => railhook_core::OrganizationId, "an Organization";
    ApiKeyId => railhook_core::ApiKeyId, "an API key";
    EventId => railhook_core::EventId, "an Event";
    EndpointId => railhook_core::EndpointId, "an Endpoint";
    SubscriptionId => railhook_core::SubscriptionId, "a Subscription";
    DeliveryId => railhook_core::DeliveryId, "a Delivery";
    AttemptId => railhook_core::AttemptId, "an Attempt";
    SourceId => railhook_core::SourceId, "a Source";
    IncomingEventId => railhook_core::IncomingEventId, "an Incoming Event";
    DestinationId => railhook_core::DestinationId, "a Destination";
    ForwardId => railhook_core::ForwardId, "a Forward";
    ReplayId => railhook_core::ReplayId, "a Replay";
}

/// `?limit=`: 1 to [`crate::pagination::MAX_LIMIT`].
pub struct Limit;

impl PartialSchema for Limit {
    fn schema() -> RefOr<Schema> {
        integer(1..=crate::pagination::MAX_LIMIT).default(Some(json!(crate::pagination::DEFAULT_LIMIT))).into()
    }
}

impl ToSchema for Limit {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Limit")
    }
}

/// An RFC 3339 time (`date-time`), as `chrono::DateTime::parse_from_rfc3339` reads it.
pub struct Time;

impl PartialSchema for Time {
    fn schema() -> RefOr<Schema> {
        time_schema().into()
    }
}

impl ToSchema for Time {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Time")
    }
}

fn time_schema() -> ObjectBuilder {
    string().format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime))).examples([json!("2026-01-31T12:00:00Z")])
}

/// An event type: 1 to [`railhook_core::pattern::MAX_SEGMENTS`] dot-separated segments of
/// `[a-z0-9_-]`, at most [`railhook_core::pattern::MAX_TYPE_LEN`] characters.
pub struct EventType;

fn segment_pattern() -> &'static str {
    "[a-z0-9_-]+"
}

fn event_type_schema() -> ObjectBuilder {
    use railhook_core::pattern::{MAX_SEGMENTS, MAX_TYPE_LEN};
    let seg = segment_pattern();
    string()
        .pattern(Some(format!("^{seg}(\\.{seg}){{0,{}}}$", MAX_SEGMENTS - 1)))
        .min_length(Some(1))
        .max_length(Some(MAX_TYPE_LEN))
        .examples([json!("order.paid")])
}

impl PartialSchema for EventType {
    fn schema() -> RefOr<Schema> {
        event_type_schema().into()
    }
}

impl ToSchema for EventType {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("EventType")
    }
}

/// A Subscription-style event type pattern: an exact type, `prefix.*` (one more segment),
/// `prefix.**` (one or more) or `**` alone; what `EventTypePattern::parse` accepts.
pub struct EventTypePattern;

impl PartialSchema for EventTypePattern {
    fn schema() -> RefOr<Schema> {
        use railhook_core::pattern::{MAX_PATTERN_LEN, MAX_SEGMENTS, MAX_TYPE_LEN};
        let seg = segment_pattern();
        let before_wildcard = MAX_SEGMENTS - 2;
        // An exact type or `prefix.*`: at most as long as a type.
        let exact_or_one = string()
            .pattern(Some(format!("^(?:{seg}(?:\\.{seg}){{0,{}}}|{seg}(?:\\.{seg}){{0,{before_wildcard}}}\\.\\*)$", MAX_SEGMENTS - 1)))
            .max_length(Some(MAX_TYPE_LEN));
        // `**` or `prefix.**`: one character longer (the shortest type it matches is `prefix.x`).
        let any_more = string().pattern(Some(format!("^(?:\\*\\*|{seg}(?:\\.{seg}){{0,{before_wildcard}}}\\.\\*\\*)$"))).max_length(Some(MAX_PATTERN_LEN));
        AnyOfBuilder::new()
            .item(exact_or_one)
            .item(any_more)
            .description(Some("`order.paid`, `order.*` (one more segment), `order.**` (one or more) or `**` (every type)"))
            .examples([json!("order.*")])
            .into()
    }
}

impl ToSchema for EventTypePattern {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("EventTypePattern")
    }
}

/// A Delivery's or Forward's status.
pub struct DeliveryStatus;

impl PartialSchema for DeliveryStatus {
    fn schema() -> RefOr<Schema> {
        string().enum_values(Some(railhook_core::DeliveryStatus::ALL.iter().map(|s| s.as_sql()))).into()
    }
}

impl ToSchema for DeliveryStatus {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("DeliveryStatus")
    }
}

/// A JSON value whose strings (and object keys) hold no NUL: what Postgres `jsonb` stores.
pub struct JsonValue;

impl PartialSchema for JsonValue {
    fn schema() -> RefOr<Schema> {
        let no_nul = || string().pattern(Some(NO_NUL_PATTERN));
        AnyOfBuilder::new()
            .item(ObjectBuilder::new().schema_type(SchemaType::from_iter([Type::Null, Type::Boolean, Type::Number])))
            .item(no_nul())
            .item(ArrayBuilder::new().items(Ref::from_schema_name("JsonValue")))
            .item(
                ObjectBuilder::new()
                    .property_names(Some(no_nul()))
                    .additional_properties(Some(Ref::from_schema_name("JsonValue"))),
            )
            .description(Some("Any JSON value; strings and keys may not contain NUL (\\u0000)"))
            .into()
    }
}

impl ToSchema for JsonValue {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("JsonValue")
    }
}

/// A JSON object of [`JsonValue`]s: an Event's payload.
pub fn payload() -> Object {
    json_object().examples([json!({"order_id": 42})]).build()
}

/// A JSON object of [`JsonValue`]s, or null.
pub fn json_object_or_null() -> Schema {
    or_null(json_object().build())
}

/// A JSON object of [`JsonValue`]s.
pub fn json_object() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property_names(Some(string().pattern(Some(NO_NUL_PATTERN))))
        .additional_properties(Some(Ref::from_schema_name("JsonValue")))
        .description(Some("A JSON object; strings and keys may not contain NUL (\\u0000)"))
}

// ---- Fields ------------------------------------------------------------------------------

/// An integer in `range`.
pub fn integer(range: std::ops::RangeInclusive<i64>) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
        .minimum(Some(*range.start() as f64))
        .maximum(Some(*range.end() as f64))
}

/// An integer in `range`, or null.
pub fn nullable_integer(range: std::ops::RangeInclusive<i64>) -> ObjectBuilder {
    integer(range).schema_type(nullable(Type::Integer))
}

/// A string of text: 1 to `max` characters once trimmed (it holds a character that is not
/// whitespace), no NUL.
pub fn trimmed_name(max: usize) -> ObjectBuilder {
    string().pattern(Some(format!("^[^\\u0000]*[^{WHITESPACE_CLASS}\\u0000][^\\u0000]*$"))).min_length(Some(1)).max_length(Some(max))
}

/// Free text of at most `max` characters, no NUL.
pub fn text(max: usize) -> ObjectBuilder {
    string().pattern(Some(NO_NUL_PATTERN)).max_length(Some(max))
}

/// `whsec_` and the base64 (padded or not) of a key of `MIN_KEY_LEN` to `MAX_KEY_LEN` bytes,
/// as `EndpointSecret::parse` accepts it. Whole 3-byte groups and, at the end, one or two
/// more bytes whose unused bits are zero.
pub fn endpoint_secret() -> ObjectBuilder {
    use railhook_core::signing::{MAX_KEY_LEN, MIN_KEY_LEN, SECRET_PREFIX};
    let c = "[A-Za-z0-9+/]";
    // Keys of 3n, 3n+1 and 3n+2 bytes, each within the bounds.
    let groups = |bytes_min: usize, bytes_max: usize, extra: usize| {
        let lo = bytes_min.saturating_sub(extra).div_ceil(3);
        let hi = (bytes_max - extra) / 3;
        format!("(?:{c}{{4}}){{{lo},{hi}}}")
    };
    let whole = groups(MIN_KEY_LEN, MAX_KEY_LEN, 0);
    let one = format!("{}{c}[AQgw](?:==)?", groups(MIN_KEY_LEN, MAX_KEY_LEN, 1));
    let two = format!("{}{c}{c}[AEIMQUYcgkosw048]=?", groups(MIN_KEY_LEN, MAX_KEY_LEN, 2));
    string()
        .pattern(Some(format!("^{SECRET_PREFIX}(?:{whole}|{one}|{two})$")))
        .description(Some(format!("`{SECRET_PREFIX}` and the base64 of a key of {MIN_KEY_LEN} to {MAX_KEY_LEN} bytes")))
        .examples([json!(format!("{SECRET_PREFIX}MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"))])
}

/// Visible ASCII with inner spaces, at most `max` bytes; `min_one`: at least one character.
pub fn visible_ascii(max: usize, min_one: bool) -> ObjectBuilder {
    let body = "[!-~](?:[ -~]*[!-~])?";
    let pattern = if min_one { format!("^{body}$") } else { format!("^(?:{body})?$") };
    string().pattern(Some(pattern)).min_length(Some(usize::from(min_one))).max_length(Some(max))
}

/// An HTTP header name (RFC 9110 token) of 1 to `max` characters.
pub fn header_name(max: usize) -> ObjectBuilder {
    string().pattern(Some("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")).min_length(Some(1)).max_length(Some(max))
}

/// A header name a customer may set: a token, and none of
/// `railhook_core::signing::RESERVED_HEADERS` nor `proxy-*`, in any case.
pub fn custom_header_name(max: usize) -> Object {
    let any_case = |name: &str| -> String {
        name.chars()
            .map(|c| if c.is_ascii_alphabetic() { format!("[{}{}]", c.to_ascii_lowercase(), c.to_ascii_uppercase()) } else { regex_escape(c) })
            .collect()
    };
    let reserved: Vec<String> = railhook_core::signing::RESERVED_HEADERS.iter().map(|h| any_case(h)).collect();
    let reserved = format!("^(?:(?:{})$|{})", reserved.join("|"), any_case("proxy-"));
    // utoipa has no `not`; it is written as the keyword it is.
    header_name(max).extensions(Some(Extensions::from_iter([("not", json!({"pattern": reserved}))]))).build()
}

fn regex_escape(c: char) -> String {
    if "\\^$.|?*+()[]{}-".contains(c) {
        format!("\\{c}")
    } else {
        c.to_string()
    }
}

/// An http(s) URL as `parse_endpoint_url` accepts it, written so that every string it allows
/// parses: a host name whose last label starts with a letter (so it is never read as an IPv4
/// address), or an IPv4 address; a port from 1 to 65535; a path and query of URL characters.
/// The server also takes what this leaves out (IPv6 literals, other characters it
/// percent-encodes); the pattern is the part every client can rely on.
/// Whether the host resolves to an address `network.allow_cidrs` allows is not the string's
/// to say: that refusal is 422 `url_unresolvable` or `url_not_allowed`.
pub fn url() -> ObjectBuilder {
    let octet = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
    let label = "[A-Za-z0-9][A-Za-z0-9-]{0,62}";
    let last_label = "[A-Za-z][A-Za-z0-9-]{0,62}";
    let port = "(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})";
    let path = "[A-Za-z0-9._~!$&'()*+,;=:@%/-]";
    // `'` is percent-encoded in the query of an http(s) URL, which would lengthen it.
    let query = "[A-Za-z0-9._~!$&()*+,;=:@%/?-]";
    string()
        .pattern(Some(format!("^[hH][tT][tT][pP][sS]?://(?:(?:{label}\\.)*{last_label}|{octet}(?:\\.{octet}){{3}})(?::{port})?(?:/{path}*)?(?:\\?{query}*)?$")))
        // Normalising adds the `/` of an empty path; the normalised URL must fit MAX_URL_LEN.
        .max_length(Some(railhook_core::address::MAX_URL_LEN - 1))
        .format(Some(SchemaFormat::Custom("uri".to_string())))
        .examples([json!("https://example.com/webhooks")])
}

/// [`url`], built.
pub fn url_object() -> Object {
    url().build()
}

/// `Option<T>` as `null` or `schema`.
pub fn or_null(schema: impl Into<RefOr<Schema>>) -> Schema {
    OneOfBuilder::new().item(ObjectBuilder::new().schema_type(Type::Null)).item(schema).into()
}

/// An array of `items`, `min` to `max` of them.
pub fn array(items: impl Into<RefOr<Schema>>, min: usize, max: usize) -> ArrayBuilder {
    let items: RefOr<Schema> = items.into();
    ArrayBuilder::new().items(items).min_items(Some(min)).max_items(Some(max))
}

/// A JSON object with exactly the properties given (`deny_unknown_fields`).
pub fn closed_object() -> ObjectBuilder {
    ObjectBuilder::new().additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false)))
}

/// `allOf` of the schemas, for a value that must satisfy each.
pub fn all_of(items: impl IntoIterator<Item = Schema>) -> Schema {
    items.into_iter().fold(AllOfBuilder::new(), |b, s| b.item(s)).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_displayed_id_has_the_pattern_shape() {
        fn check<T: std::fmt::Display + std::str::FromStr>(id: T, prefix: &str) {
            let text = id.to_string();
            let rest = text.strip_prefix(prefix).and_then(|r| r.strip_prefix('_')).expect("prefix");
            assert_eq!(rest.len(), 26);
            assert!(('0'..='7').contains(&rest.chars().next().unwrap()), "{text}");
            assert!(rest.chars().all(|c| c.is_ascii_digit() || (c.is_ascii_lowercase() && !"ilou".contains(c))), "{text}");
            // Upper case parses too, as the pattern allows.
            assert!(rest.to_ascii_uppercase().chars().all(|c| !"ILOU".contains(c)));
            assert!(format!("{prefix}_{}", rest.to_ascii_uppercase()).parse::<T>().is_ok());
        }
        for _ in 0..1000 {
            check(railhook_core::EndpointId::new(), "ep");
            check(railhook_core::DeliveryId::new(), "dlv");
        }
        // The largest value: the first character carries 3 bits.
        assert!("ep_7zzzzzzzzzzzzzzzzzzzzzzzzz".parse::<railhook_core::EndpointId>().is_ok());
        assert!("ep_8zzzzzzzzzzzzzzzzzzzzzzzzz".parse::<railhook_core::EndpointId>().is_err());
        assert_eq!(id_pattern("ep"), "^ep_[0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{25}$");
    }

    #[test]
    fn endpoint_secret_bounds_follow_the_key_lengths() {
        let pattern = endpoint_secret().build().pattern.unwrap();
        // 24 bytes = 8 groups; 64 bytes = 21 groups and one byte.
        assert!(pattern.contains("(?:[A-Za-z0-9+/]{4}){8,21}|"), "{pattern}");
        assert!(pattern.contains("(?:[A-Za-z0-9+/]{4}){8,21}[A-Za-z0-9+/][AQgw]"), "{pattern}");
        assert!(pattern.contains("(?:[A-Za-z0-9+/]{4}){8,20}[A-Za-z0-9+/][A-Za-z0-9+/][AEIMQUYcgkosw048]"), "{pattern}");
        let example = endpoint_secret().build().examples[0].as_str().unwrap().to_string();
        assert!(railhook_core::signing::EndpointSecret::parse(&example).is_ok());
    }
}
