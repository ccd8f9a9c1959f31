//! How a Kafka record maps to an Event (docs/KAFKA_SOURCE.md): its Project, event type,
//! idempotency key and payload, or the reason it cannot be one. Pure: no I/O, and total on
//! any bytes (a record's bytes are network input; `tests::never_panics` feeds it garbage).
//!
//! The checks are those of `POST /v1/events` (the event type's syntax, a JSON object as the
//! payload, no NUL in any string, the idempotency key's alphabet and length, the request
//! hash), from the same functions, so a record and a POST with the same key are one Event.

use railhook_config::{KafkaSourceConfig, RecordFormat};
use railhook_core::pattern::{candidate_patterns, EventType};
use railhook_core::{ProjectId, TraceContext};
use railhook_store::events::{self, Caller, NewEvent};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// A record as the consumer read it, borrowed from the client's message.
#[derive(Debug, Clone)]
pub struct Record<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    /// `None` for a tombstone.
    pub value: Option<&'a [u8]>,
    pub headers: Vec<(&'a str, Option<&'a [u8]>)>,
}

impl Record<'_> {
    /// The W3C trace context in the record's `traceparent` / `tracestate` headers, if valid.
    fn trace(&self) -> Option<TraceContext> {
        let parent = self.headers.iter().find(|(k, _)| *k == "traceparent").and_then(|(_, v)| *v);
        let state = self.headers.iter().filter(|(k, _)| *k == "tracestate").filter_map(|(_, v)| *v);
        TraceContext::from_headers(parent, state)
    }

    /// The first header named `name` (case-sensitive, as Kafka headers are), as text.
    fn header(&self, name: &str) -> Result<Option<&str>, Refusal> {
        match self.headers.iter().find(|(k, _)| *k == name) {
            None | Some((_, None)) => Ok(None),
            Some((_, Some(bytes))) => std::str::from_utf8(bytes)
                .map(Some)
                .map_err(|_| Refusal::new(Reason::BadHeader, format!("header {name} is not UTF-8"))),
        }
    }

    /// The idempotency key of a record that carries none: its place in the log, which a
    /// second read of the same record (a rebalance, a crash before the offset commit) shares.
    pub fn position_key(&self) -> String {
        let key = format!("kafka:{}:{}:{}", self.topic, self.partition, self.offset);
        if key.len() <= events::IDEMPOTENCY_KEY_MAX && key.bytes().all(|b| b.is_ascii_graphic()) {
            return key;
        }
        // A topic name of up to 249 characters may not fit: its hash instead.
        let topic = hex::encode(&Sha256::digest(self.topic.as_bytes())[..16]);
        format!("kafka:{topic}:{}:{}", self.partition, self.offset)
    }
}

/// Why a record went to the dead-letter topic: the `railhook-dead-letter-reason` header and
/// the `reason` label of `railhook_kafka_source_dead_letters_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// No value (a tombstone) or a value that is not JSON, or an envelope of another shape.
    BadJson,
    /// The value is larger than `kafka_source.max_record_bytes`.
    TooLarge,
    /// No Project: none configured and none in the record.
    NoProject,
    /// The Project named is not a Project id, not one that exists, or not the configured one.
    UnknownProject,
    /// No event type, or not a valid one.
    BadType,
    /// The payload is not a JSON object, or holds a NUL character.
    BadPayload,
    /// A header Railhook reads is not UTF-8.
    BadHeader,
    /// The idempotency key is not 1-255 visible ASCII characters.
    BadIdempotencyKey,
    /// The key was used before (by REST or Kafka) with another type or payload.
    IdempotencyKeyReused,
    /// Postgres refused this record's ingest alone (a data error the checks above missed).
    Rejected,
}

impl Reason {
    pub const ALL: [Reason; 10] = [
        Reason::BadJson,
        Reason::TooLarge,
        Reason::NoProject,
        Reason::UnknownProject,
        Reason::BadType,
        Reason::BadPayload,
        Reason::BadHeader,
        Reason::BadIdempotencyKey,
        Reason::IdempotencyKeyReused,
        Reason::Rejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::BadJson => "bad_json",
            Reason::TooLarge => "too_large",
            Reason::NoProject => "no_project",
            Reason::UnknownProject => "unknown_project",
            Reason::BadType => "bad_type",
            Reason::BadPayload => "bad_payload",
            Reason::BadHeader => "bad_header",
            Reason::BadIdempotencyKey => "bad_idempotency_key",
            Reason::IdempotencyKeyReused => "idempotency_key_reused",
            Reason::Rejected => "rejected",
        }
    }
}

/// A record that cannot become an Event: the reason (a code) and what to fix (for a person).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: Reason,
    pub message: String,
}

impl Refusal {
    pub fn new(reason: Reason, message: impl Into<String>) -> Refusal {
        Refusal { reason, message: message.into() }
    }
}

/// A record mapped to an Event, ready for the ingest statement.
#[derive(Debug, Clone)]
pub struct Mapped {
    pub project: ProjectId,
    pub event_type: String,
    pub payload: serde_json::Value,
    pub idempotency_key: String,
    pub request_sha256: Vec<u8>,
    pub candidate_patterns: Vec<String>,
    /// The record's W3C `traceparent` and `tracestate` headers (the trace context's
    /// convention for Kafka records): the Event's trace continues the producer's, as
    /// `POST /v1/events` continues its caller's. A malformed one is ignored.
    pub trace: Option<TraceContext>,
}

impl Mapped {
    pub fn new_event(&self) -> NewEvent<'_> {
        NewEvent {
            caller: Caller::Project(self.project),
            event_type: &self.event_type,
            payload: &self.payload,
            idempotency_key: Some(&self.idempotency_key),
            request_sha256: self.request_sha256.clone(),
            candidate_patterns: self.candidate_patterns.clone(),
            trace: self.trace.clone(),
        }
    }
}

/// `kafka_source.format = "envelope"`: the record's value. Unknown fields are refused, as
/// `POST /v1/events` refuses them: a misspelt `idempotency_key` must not quietly lose the
/// dedupe.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    #[serde(rename = "type")]
    event_type: Option<String>,
    payload: Option<serde_json::Value>,
    project: Option<String>,
    idempotency_key: Option<String>,
}

/// The mapping settings (`kafka_source.*`), checked once at start.
#[derive(Debug, Clone)]
pub struct Mapping {
    pub format: RecordFormat,
    /// `kafka_source.project`: every record's Project.
    pub project: Option<ProjectId>,
    pub project_header: String,
    pub type_header: String,
    pub idempotency_key_header: String,
    pub max_record_bytes: usize,
}

impl Mapping {
    /// `Err` names the setting when `kafka_source.project` is not a Project id.
    pub fn from_config(c: &KafkaSourceConfig) -> Result<Mapping, String> {
        let project = match c.project.trim() {
            "" => None,
            text => Some(text.parse::<ProjectId>().map_err(|e| format!("kafka_source.project '{text}' is not a project id: {e}"))?),
        };
        Ok(Mapping {
            format: c.format,
            project,
            project_header: c.project_header.clone(),
            type_header: c.type_header.clone(),
            idempotency_key_header: c.idempotency_key_header.clone(),
            max_record_bytes: c.max_record_bytes,
        })
    }

    /// The Event `record` stands for, or why it cannot be one. Whether its Project exists is
    /// the database's to say (once per batch).
    pub fn map(&self, record: &Record<'_>) -> Result<Mapped, Refusal> {
        let value = record.value.ok_or_else(|| Refusal::new(Reason::BadJson, "the record has no value (a tombstone)"))?;
        if value.len() > self.max_record_bytes {
            return Err(Refusal::new(Reason::TooLarge, format!("the value is {} bytes, above kafka_source.max_record_bytes ({})", value.len(), self.max_record_bytes)));
        }
        let (event_type, payload, project, key) = match self.format {
            RecordFormat::Envelope => {
                let envelope: Envelope = serde_json::from_slice(value).map_err(|e| Refusal::new(Reason::BadJson, format!("the value is not a JSON envelope {{\"type\", \"payload\", \"project\"?, \"idempotency_key\"?}}: {e}")))?;
                let project = match envelope.project {
                    Some(p) => Some(p),
                    None => record.header(&self.project_header)?.map(str::to_string),
                };
                let key = match envelope.idempotency_key {
                    Some(k) => Some(k),
                    None => record.header(&self.idempotency_key_header)?.map(str::to_string),
                };
                let payload = envelope.payload.ok_or_else(|| Refusal::new(Reason::BadPayload, "the envelope has no payload"))?;
                (envelope.event_type, payload, project, key)
            }
            RecordFormat::Headers => {
                let payload: serde_json::Value = serde_json::from_slice(value).map_err(|e| Refusal::new(Reason::BadJson, format!("the value is not JSON: {e}")))?;
                let event_type = record.header(&self.type_header)?.map(str::to_string);
                let project = record.header(&self.project_header)?.map(str::to_string);
                let key = record.header(&self.idempotency_key_header)?.map(str::to_string);
                (event_type, payload, project, key)
            }
        };
        let project = self.project_of(project.as_deref())?;
        let event_type = event_type.ok_or_else(|| {
            let where_ = match self.format {
                RecordFormat::Envelope => "the envelope's \"type\"".to_string(),
                RecordFormat::Headers => format!("header {}", self.type_header),
            };
            Refusal::new(Reason::BadType, format!("no event type ({where_})"))
        })?;
        let parsed = EventType::parse(&event_type).map_err(|e| Refusal::new(Reason::BadType, format!("event type {:?}: {e}", truncate(&event_type))))?;
        if !payload.is_object() {
            return Err(Refusal::new(Reason::BadPayload, "the payload must be a JSON object"));
        }
        if let Some(path) = nul_path(&payload, String::new()) {
            return Err(Refusal::new(Reason::BadPayload, format!("a string contains the NUL character (\\u0000), which cannot be stored: at payload{path}")));
        }
        let idempotency_key = match key {
            Some(k) if events::valid_idempotency_key(&k) => k,
            Some(_) => return Err(Refusal::new(Reason::BadIdempotencyKey, format!("the idempotency key must be 1 to {} visible ASCII characters", events::IDEMPOTENCY_KEY_MAX))),
            None => record.position_key(),
        };
        Ok(Mapped {
            project,
            request_sha256: events::request_sha256(&event_type, &payload),
            candidate_patterns: candidate_patterns(&parsed),
            event_type,
            payload,
            idempotency_key,
            trace: record.trace(),
        })
    }

    fn project_of(&self, named: Option<&str>) -> Result<ProjectId, Refusal> {
        let named = match named {
            Some(text) => Some(text.parse::<ProjectId>().map_err(|_| Refusal::new(Reason::UnknownProject, format!("{:?} is not a project id (proj_...)", truncate(text))))?),
            None => None,
        };
        match (self.project, named) {
            (Some(fixed), Some(named)) if fixed != named => Err(Refusal::new(Reason::UnknownProject, format!("the record names {named}, but this source's kafka_source.project is {fixed}"))),
            (Some(fixed), _) => Ok(fixed),
            (None, Some(named)) => Ok(named),
            (None, None) => Err(Refusal::new(
                Reason::NoProject,
                format!("the record names no Project (header {} or the envelope's \"project\") and kafka_source.project is not set", self.project_header),
            )),
        }
    }
}

/// At most 80 characters of a text from the record, for a refusal's message.
fn truncate(text: &str) -> String {
    text.chars().take(80).collect()
}

/// Where the first string (value or key) holding NUL is, as `.a.b[2]`: Postgres' jsonb
/// cannot store it, and one such record must not fail a whole batch.
fn nul_path(value: &serde_json::Value, path: String) -> Option<String> {
    match value {
        serde_json::Value::String(s) if s.contains('\0') => Some(path),
        serde_json::Value::Array(items) => items.iter().enumerate().find_map(|(i, v)| nul_path(v, format!("{path}[{i}]"))),
        serde_json::Value::Object(map) => map.iter().find_map(|(k, v)| {
            if k.contains('\0') {
                Some(path.clone())
            } else {
                nul_path(v, format!("{path}.{k}"))
            }
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn mapping(format: RecordFormat) -> Mapping {
        Mapping::from_config(&KafkaSourceConfig { format, ..KafkaSourceConfig::default() }).unwrap()
    }

    fn record<'a>(value: Option<&'a [u8]>, headers: Vec<(&'a str, Option<&'a [u8]>)>) -> Record<'a> {
        Record { topic: "orders", partition: 2, offset: 41, value, headers }
    }

    #[test]
    fn an_envelope_maps_with_its_key_or_its_position() {
        let p = ProjectId::new().to_string();
        let with_key = format!(r#"{{"type":"order.paid","payload":{{"n":1}},"project":"{p}","idempotency_key":"o-1"}}"#);
        let m = mapping(RecordFormat::Envelope).map(&record(Some(with_key.as_bytes()), vec![])).unwrap();
        assert_eq!((m.project.to_string(), m.event_type.as_str(), m.idempotency_key.as_str()), (p.clone(), "order.paid", "o-1"));
        assert_eq!(m.request_sha256, events::request_sha256("order.paid", &serde_json::json!({"n": 1})));
        let without = r#"{"type":"order.paid","payload":{}}"#;
        let m = mapping(RecordFormat::Envelope).map(&record(Some(without.as_bytes()), vec![("railhook-project", Some(p.as_bytes()))])).unwrap();
        assert_eq!(m.idempotency_key, "kafka:orders:2:41");
    }

    #[test]
    fn a_records_traceparent_header_continues_its_trace_and_a_malformed_one_is_ignored() {
        let m = mapping(RecordFormat::Envelope);
        let value = format!(r#"{{"type": "order.created", "payload": {{"n": 1}}, "project": "{}"}}"#, ProjectId::new());
        let value = value.as_bytes();
        let tp = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let mapped = m.map(&record(Some(value), vec![("traceparent", Some(tp)), ("tracestate", Some(b"rh=1"))])).unwrap();
        assert_eq!(mapped.trace.expect("a trace").traceparent(), std::str::from_utf8(tp).unwrap());
        let mapped = m.map(&record(Some(value), vec![("traceparent", Some(b"00-zz-b7ad6b7169203331-01"))])).unwrap();
        assert!(mapped.trace.is_none(), "malformed: a new trace, the record still an Event");
    }

    #[test]
    fn headers_carry_type_project_and_key() {
        let p = ProjectId::new().to_string();
        let h = vec![("railhook-type", Some(&b"user.created"[..])), ("railhook-project", Some(p.as_bytes())), ("railhook-idempotency-key", Some(&b"u-9"[..]))];
        let m = mapping(RecordFormat::Headers).map(&record(Some(br#"{"id":9}"#), h)).unwrap();
        assert_eq!((m.event_type.as_str(), m.idempotency_key.as_str()), ("user.created", "u-9"));
        assert_eq!(m.payload, serde_json::json!({"id": 9}));
    }

    #[test]
    fn refusals_name_their_reason() {
        let p = ProjectId::new().to_string();
        let ph = ("railhook-project", Some(p.as_bytes()));
        let env = mapping(RecordFormat::Envelope);
        let cases: Vec<(Record<'_>, Reason)> = vec![
            (record(None, vec![ph]), Reason::BadJson),
            (record(Some(b"{not json"), vec![ph]), Reason::BadJson),
            (record(Some(br#"{"type":"a.b","payload":{},"extra":1}"#), vec![ph]), Reason::BadJson),
            (record(Some(br#"{"type":"a.b","payload":{}}"#), vec![]), Reason::NoProject),
            (record(Some(br#"{"type":"a.b","payload":{},"project":"proj_nope"}"#), vec![]), Reason::UnknownProject),
            (record(Some(br#"{"payload":{}}"#), vec![ph]), Reason::BadType),
            (record(Some(br#"{"type":"a b","payload":{}}"#), vec![ph]), Reason::BadType),
            (record(Some(br#"{"type":"a.b","payload":[1]}"#), vec![ph]), Reason::BadPayload),
            (record(Some(br#"{"type":"a.b","payload":{"x":"\u0000"}}"#), vec![ph]), Reason::BadPayload),
            (record(Some(br#"{"type":"a.b","payload":{},"idempotency_key":"has space"}"#), vec![ph]), Reason::BadIdempotencyKey),
            (record(Some(br#"{"type":"a.b","payload":{}}"#), vec![("railhook-project", Some(&b"\xff"[..]))]), Reason::BadHeader),
        ];
        for (r, want) in cases {
            assert_eq!(env.map(&r).map(|_| ()).unwrap_err().reason, want, "{:?}", r.value.map(String::from_utf8_lossy));
        }
        let small = Mapping { max_record_bytes: 10, ..env };
        assert_eq!(small.map(&record(Some(br#"{"type":"a.b","payload":{}}"#), vec![ph])).unwrap_err().reason, Reason::TooLarge);
    }

    #[test]
    fn a_fixed_project_refuses_another() {
        let fixed = ProjectId::new();
        let m = Mapping { project: Some(fixed), ..mapping(RecordFormat::Envelope) };
        assert_eq!(m.map(&record(Some(br#"{"type":"a.b","payload":{}}"#), vec![])).unwrap().project, fixed);
        let other = ProjectId::new().to_string();
        let r = record(Some(br#"{"type":"a.b","payload":{}}"#), vec![("railhook-project", Some(other.as_bytes()))]);
        assert_eq!(m.map(&r).unwrap_err().reason, Reason::UnknownProject);
    }

    #[test]
    fn a_long_topic_still_gives_a_valid_key() {
        let topic = "t".repeat(249);
        let r = Record { topic: &topic, partition: i32::MAX, offset: i64::MAX, value: None, headers: vec![] };
        let key = r.position_key();
        assert!(events::valid_idempotency_key(&key), "{key}");
        let other = "u".repeat(249);
        assert_ne!(key, Record { topic: &other, ..r.clone() }.position_key());
    }

    proptest! {
        /// A record's bytes are network input: any value and headers map or are refused.
        #[test]
        fn never_panics(value in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300)), hv in proptest::collection::vec(any::<u8>(), 0..40), json_like in "\\{\"type\":\"[a-z.\\\\ ]{0,10}\",\"payload\":\\{\"[a-z\\\\u0]{0,8}\":[0-9a-z\"\\[\\]]{0,12}\\}\\}") {
            for format in [RecordFormat::Envelope, RecordFormat::Headers] {
                let m = mapping(format);
                let headers = vec![("railhook-type", Some(hv.as_slice())), ("railhook-project", Some(hv.as_slice())), ("railhook-idempotency-key", Some(hv.as_slice()))];
                let _ = m.map(&record(value.as_deref(), headers.clone()));
                let _ = m.map(&record(Some(json_like.as_bytes()), headers));
            }
        }
    }
}
