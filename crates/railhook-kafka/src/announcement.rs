//! The announcement: the one message between the relay and the worker. The relay (stream and
//! poll modes) builds it from an outbox row and sends it with an [`Announcer`]; the worker
//! parses it. Topic names, the key and the headers are here too, so the contract is stated
//! once.
//!
//! Wire format, version 1 (messages already in Kafka must keep parsing):
//! `{["claim_token":"<uuid>",]"created_at":"<as Postgres printed it>","delivery_id"|"forward_id":
//! "<prefixed id>","outbox_id":N,"reason":"<reason>","v":1}`, keys in this (alphabetical) order,
//! byte for byte what the relay wrote before this module existed; key: the Endpoint id
//! (Deliveries) or the Destination id (Forwards), so one Endpoint's announcements keep their
//! order on one partition; headers [`header::OUTBOX_ID`] and, in CDC mode,
//! [`header::COMMIT_LSN`].
//!
//! The topic names are the configuration's (`kafka.topic_prefix` + `kafka.deliveries_topic`
//! or `kafka.forwards_topic`, validated there); [`deliveries_topic`] and [`forwards_topic`]
//! are how Railhook's Kafka code reads them.

use std::time::Duration;

use railhook_config::Config;
use railhook_core::{AnnouncementReason, ClaimToken, DeliveryId, DestinationId, EndpointId, ForwardId, Lsn, TraceContext};
use railhook_telemetry::traces;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use serde::{Deserialize, Serialize};

/// The layout version of the value.
pub const VERSION: u32 = 1;

/// The prefix of the transactional logical decoding messages that announce work in CDC mode
/// (`railhook_announce`, crates/railhook-store/src/lifecycle/announce.sql), and of every
/// version of them: a message under [`MESSAGE_PREFIX_FAMILY`] with another version is one
/// this build cannot read (an error, not a skip).
pub const MESSAGE_PREFIX: &str = "railhook.announce.v1";
pub const MESSAGE_PREFIX_FAMILY: &str = "railhook.announce.";

/// Header names.
pub mod header {
    /// The outbox row's id (decimal).
    pub const OUTBOX_ID: &str = "outbox_id";
    /// The end LSN of the commit that inserted the row (CDC mode only).
    pub const COMMIT_LSN: &str = "commit_lsn";
    /// The commit's timestamp, Unix microseconds (decimal; CDC mode only).
    pub const COMMIT_TIME_US: &str = "commit_time_us";
    /// When the relay read the announcement (decoded it, or polled it), Unix microseconds
    /// (decimal): the start of the worker's `read_to_poll` stage
    /// (`railhook_telemetry::stages`).
    pub const RELAY_READ_US: &str = "relay_read_us";
    /// The W3C trace context of the work (issue 33): the relay publish span's, or the
    /// Event's as its ingest kept it when export is off. Only when there is one.
    pub const TRACEPARENT: &str = "traceparent";
    pub const TRACESTATE: &str = "tracestate";
}

/// Where an announcement comes from, carried in its headers: the commit (CDC mode) and the
/// moment the relay read it. Informational: the worker parses them for the latency stages
/// only, and a message without them (an older relay) is handled the same.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stamp {
    pub commit_lsn: Option<Lsn>,
    pub commit_time_us: Option<i64>,
    pub relay_read_us: Option<i64>,
}

impl Stamp {
    /// The stamps of a message's headers (each one that is there and parses).
    pub fn from_headers<'a>(headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>) -> Stamp {
        let mut stamp = Stamp::default();
        for (name, value) in headers {
            let Some(text) = value.and_then(|v| std::str::from_utf8(v).ok()) else { continue };
            match name {
                header::COMMIT_LSN => stamp.commit_lsn = text.parse().ok(),
                header::COMMIT_TIME_US => stamp.commit_time_us = text.parse().ok(),
                header::RELAY_READ_US => stamp.relay_read_us = text.parse().ok(),
                _ => {}
            }
        }
        stamp
    }

    /// The relay-read stamp of a message's headers, if it has one that parses.
    pub fn relay_read_us<'a>(headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>) -> Option<i64> {
        Stamp::from_headers(headers).relay_read_us
    }
}

/// The Deliveries' topic, with the configured prefix.
pub fn deliveries_topic(config: &Config) -> String {
    config.deliveries_topic()
}

/// The Forwards' topic, with the configured prefix.
pub fn forwards_topic(config: &Config) -> String {
    config.forwards_topic()
}

/// Both topics, as [`crate::ensure_topics`] takes them.
pub fn topics(config: &Config) -> [String; 2] {
    [deliveries_topic(config), forwards_topic(config)]
}

/// What the announcement is about, and where it is routed (the message key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Delivery { delivery: DeliveryId, endpoint: EndpointId },
    Forward { forward: ForwardId, destination: DestinationId },
}

/// One announcement. `target`'s route (endpoint or destination) travels as the key, not in
/// the value: a parsed announcement knows it only from the key ([`Announcement::parse_keyed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement {
    pub outbox_id: i64,
    pub target: Target,
    pub reason: AnnouncementReason,
    /// The retry scheduler's token: only this hint may claim the row.
    pub claim_token: Option<ClaimToken>,
    /// When the outbox row was written, as Postgres printed it (informational).
    pub created_at: String,
    /// The W3C trace context the work continues (issue 33), when it has one. On the wire it
    /// is the headers [`header::TRACEPARENT`] and [`header::TRACESTATE`], not the value (whose
    /// version 1 bytes are kept); [`Announcement::parse_keyed`] leaves it `None` and
    /// [`Announcement::trace_from_headers`] reads it.
    pub trace: Option<TraceContext>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AnnouncementError {
    #[error("not a JSON announcement: {0}")]
    Malformed(String),
    #[error("announcement version {0}, this build reads {VERSION}")]
    Version(u32),
    #[error("an announcement names exactly one of delivery_id and forward_id")]
    Target,
    #[error("the message key is not the {0} id the announcement is routed by")]
    Key(&'static str),
    #[error("announcement message line {line}: {problem}")]
    MessageLine { line: usize, problem: String },
    #[error("logical decoding message prefix {0:?} is not one this build reads ({MESSAGE_PREFIX})")]
    MessagePrefix(String),
}

/// The value as it travels. The fields are in alphabetical order on purpose: serde writes
/// them in declaration order, and the relay's `json!` value before this type (a sorted map)
/// wrote them alphabetically, so the bytes are the same as version 1 always had
/// (`the_version_1_bytes_are_kept`).
#[derive(Serialize, Deserialize)]
struct Wire {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    claim_token: Option<ClaimToken>,
    #[serde(default)]
    created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delivery_id: Option<DeliveryId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    forward_id: Option<ForwardId>,
    #[serde(default)]
    outbox_id: i64,
    reason: AnnouncementReason,
    v: u32,
}

impl Announcement {
    /// The topic it goes to.
    pub fn topic(&self, config: &Config) -> String {
        match self.target {
            Target::Delivery { .. } => deliveries_topic(config),
            Target::Forward { .. } => forwards_topic(config),
        }
    }

    /// The message key: the Endpoint or Destination id.
    pub fn key(&self) -> String {
        match self.target {
            Target::Delivery { endpoint, .. } => endpoint.to_string(),
            Target::Forward { destination, .. } => destination.to_string(),
        }
    }

    /// The message value.
    pub fn to_bytes(&self) -> Vec<u8> {
        let (delivery_id, forward_id) = match self.target {
            Target::Delivery { delivery, .. } => (Some(delivery), None),
            Target::Forward { forward, .. } => (None, Some(forward)),
        };
        let wire = Wire {
            claim_token: self.claim_token,
            created_at: self.created_at.clone(),
            delivery_id,
            forward_id,
            outbox_id: self.outbox_id,
            reason: self.reason,
            v: VERSION,
        };
        serde_json::to_vec(&wire).expect("the wire struct has only strings and numbers: it always serialises")
    }

    /// Parses a message: its value and its key (the route). A Delivery's key must be an
    /// Endpoint id and a Forward's a Destination id.
    pub fn parse_keyed(key: &[u8], value: &[u8]) -> Result<Announcement, AnnouncementError> {
        let wire: Wire = serde_json::from_slice(value).map_err(|e| AnnouncementError::Malformed(e.to_string()))?;
        if wire.v != VERSION {
            return Err(AnnouncementError::Version(wire.v));
        }
        let key = std::str::from_utf8(key).ok();
        let target = match (wire.delivery_id, wire.forward_id) {
            (Some(delivery), None) => {
                let endpoint = key.and_then(|k| k.parse().ok()).ok_or(AnnouncementError::Key("endpoint"))?;
                Target::Delivery { delivery, endpoint }
            }
            (None, Some(forward)) => {
                let destination = key.and_then(|k| k.parse().ok()).ok_or(AnnouncementError::Key("destination"))?;
                Target::Forward { forward, destination }
            }
            _ => return Err(AnnouncementError::Target),
        };
        Ok(Announcement { outbox_id: wire.outbox_id, target, reason: wire.reason, claim_token: wire.claim_token, created_at: wire.created_at, trace: None })
    }

    /// The trace context of a message's headers: `None` without a valid `traceparent` (a
    /// malformed one is ignored, as the W3C specification asks).
    pub fn trace_from_headers<'a>(headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>) -> Option<TraceContext> {
        let (mut parent, mut state) = (None, None);
        for (name, value) in headers {
            match name {
                header::TRACEPARENT => parent = value,
                header::TRACESTATE => state = value,
                _ => {}
            }
        }
        TraceContext::from_headers(parent, state)
    }
}

impl Announcement {
    /// The announcements of one logical decoding message written by `railhook_announce` in
    /// CDC mode (prefix [`MESSAGE_PREFIX`]), in order: one per line,
    /// `<kind> <id> <routing> <reason>[ <token>][ tp=<traceparent>[ ts=<tracestate>]]`, kind `d` (a Delivery, routed by its
    /// Endpoint) or `f` (a Forward, routed by its Destination), the ids as hyphenated uuids.
    /// `created_at` is the commit's time (there is no outbox row); `outbox_id` is 0. Anything
    /// else (a line that does not parse, an unknown reason, no lines) is an error: the
    /// message was written by a build this one does not understand.
    pub fn parse_message(prefix: &str, content: &[u8], created_at: &str) -> Result<Vec<Announcement>, AnnouncementError> {
        if prefix != MESSAGE_PREFIX {
            return Err(AnnouncementError::MessagePrefix(prefix.to_string()));
        }
        let bad = |line: usize, problem: &str| AnnouncementError::MessageLine { line, problem: problem.to_string() };
        let text = std::str::from_utf8(content).map_err(|_| bad(1, "not UTF-8"))?;
        let mut out = Vec::new();
        for (n, line) in text.split('\n').enumerate().map(|(i, l)| (i + 1, l)) {
            let mut fields: Vec<&str> = line.split(' ').collect();
            // Issue 33: ` tp=<traceparent>` and then ` ts=<tracestate>` may end the line. A
            // traceparent that does not parse is ignored (the W3C rule), not an error: the
            // work goes on without its trace.
            let mut tracestate = None;
            if fields.len() > 4 {
                if let Some(ts) = fields.last().and_then(|f| f.strip_prefix("ts=")) {
                    tracestate = Some(ts);
                    fields.pop();
                }
            }
            let mut traceparent = None;
            if fields.len() > 4 {
                if let Some(tp) = fields.last().and_then(|f| f.strip_prefix("tp=")) {
                    traceparent = Some(tp);
                    fields.pop();
                }
            }
            if tracestate.is_some() && traceparent.is_none() {
                return Err(bad(n, "a tracestate without a traceparent"));
            }
            let trace = TraceContext::from_text(traceparent, tracestate);
            let (kind, id, routing, reason, token) = match fields.as_slice() {
                [k, i, r, why] => (*k, *i, *r, *why, None),
                [k, i, r, why, t] => (*k, *i, *r, *why, Some(*t)),
                _ => return Err(bad(n, "expected 4 or 5 fields")),
            };
            let uuid = |v: &str, what: &str| uuid::Uuid::try_parse(v).map_err(|_| bad(n, &format!("{what} is not a uuid")));
            let (id, routing) = (uuid(id, "the id")?, uuid(routing, "the routing id")?);
            let target = match kind {
                "d" => Target::Delivery { delivery: DeliveryId(id), endpoint: EndpointId(routing) },
                "f" => Target::Forward { forward: ForwardId(id), destination: DestinationId(routing) },
                _ => return Err(bad(n, "the kind is neither d nor f")),
            };
            let reason = reason.parse::<AnnouncementReason>().map_err(|_| bad(n, "unknown reason"))?;
            let claim_token = token.map(|t| uuid(t, "the token").map(ClaimToken)).transpose()?;
            out.push(Announcement { outbox_id: 0, target, reason, claim_token, created_at: created_at.to_string(), trace });
        }
        Ok(out)
    }
}

/// The relay's producer: the idempotent producer with its bounded local queue, the topics,
/// and the one place that waits while that queue is full (backpressure: the caller stops
/// reading its source instead of growing memory).
///
/// Acknowledgements are per message: [`Announcer::send`] returns once the message is in the
/// producer's queue, with a future that resolves when Kafka acknowledged (or refused) that
/// one message. The relay's progress (what the slot may be advanced past, or which polled
/// rows may be marked PUBLISHED) counts these answers one by one; nothing here acknowledges
/// on its behalf.
///
/// Cloning shares the producer (librdkafka's handle is reference-counted).
///
/// With the inline transport ([`crate::inline`]) the same type hands announcements to the
/// worker of the process instead, and the acknowledgement is the worker's.
#[derive(Clone)]
pub struct Announcer {
    via: Via,
    deliveries_topic: String,
    forwards_topic: String,
}

#[derive(Clone)]
enum Via {
    Kafka(FutureProducer),
    Inline(crate::inline::InlineSender),
}

/// One message's acknowledgement ([`Announcer::send`]): Kafka's, or with the inline transport
/// the worker's, when the hint's claim step is over. It holds the announcement's relay
/// publish span, which ends when the acknowledgement is dropped (after it was awaited).
pub struct Acknowledgement(AckInner, #[allow(dead_code)] tracing::Span);

enum AckInner {
    Kafka(DeliveryFuture),
    Inline(tokio::sync::oneshot::Receiver<()>),
}

impl std::future::Future for Acknowledgement {
    type Output = Result<(), KafkaError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        match &mut self.0 {
            AckInner::Kafka(f) => match std::pin::Pin::new(f).poll(cx) {
                Poll::Ready(Ok(Ok(_))) => Poll::Ready(Ok(())),
                Poll::Ready(Ok(Err((e, _)))) => Poll::Ready(Err(e)),
                // The producer was destroyed with the message still queued.
                Poll::Ready(Err(_)) => Poll::Ready(Err(KafkaError::Canceled)),
                Poll::Pending => Poll::Pending,
            },
            // A hint the worker dropped (it stopped) is not acknowledged.
            AckInner::Inline(rx) => std::pin::Pin::new(rx).poll(cx).map(|r| r.map_err(|_| KafkaError::Canceled)),
        }
    }
}

/// How long to wait before handing a message over again while the local queue is full.
const QUEUE_FULL_WAIT: Duration = Duration::from_millis(5);

impl Announcer {
    /// `producer` should be [`crate::idempotent_producer`]'s (the relay's guarantees assume
    /// idempotence and `acks=all`); the topics are `config`'s.
    pub fn new(producer: FutureProducer, config: &Config) -> Announcer {
        Announcer { via: Via::Kafka(producer), deliveries_topic: deliveries_topic(config), forwards_topic: forwards_topic(config) }
    }

    /// The inline transport's: announcements go to the worker of this process.
    pub fn inline(sender: crate::inline::InlineSender, config: &Config) -> Announcer {
        Announcer { via: Via::Inline(sender), deliveries_topic: deliveries_topic(config), forwards_topic: forwards_topic(config) }
    }

    /// Whether this announcer is the inline transport's.
    pub fn is_inline(&self) -> bool {
        matches!(self.via, Via::Inline(_))
    }

    /// The topic an announcement goes to.
    pub fn topic(&self, announcement: &Announcement) -> &str {
        match announcement.target {
            Target::Delivery { .. } => &self.deliveries_topic,
            Target::Forward { .. } => &self.forwards_topic,
        }
    }

    /// Hands the announcement to the producer (key [`Announcement::key`], headers
    /// [`header::OUTBOX_ID`] and, for each part of `stamp` given, [`header::COMMIT_LSN`],
    /// [`header::COMMIT_TIME_US`] and [`header::RELAY_READ_US`], and the trace context's
    /// [`header::TRACEPARENT`] and [`header::TRACESTATE`]), waiting while its queue is
    /// full. The returned future resolves when Kafka acknowledged or refused this message; an
    /// error here means it was never handed over.
    ///
    /// An announcement with a trace context gets a "relay publish" span (a child of that
    /// context, ended by the acknowledgement), and carries the span's context on, or with
    /// export off its own unchanged.
    pub async fn send(&self, announcement: &Announcement, stamp: &Stamp) -> Result<Acknowledgement, KafkaError> {
        let (span, traced);
        let announcement = match &announcement.trace {
            None => {
                span = tracing::Span::none();
                announcement
            }
            Some(remote) => {
                span = tracing::info_span!(target: traces::TARGET, parent: None, traces::span::RELAY_PUBLISH,
                    otel.kind = "producer", messaging.destination.name = self.topic(announcement), railhook.reason = announcement.reason.as_str());
                traces::continue_from(&span, Some(remote));
                traced = Announcement { trace: traces::context_of(&span, Some(remote)), ..announcement.clone() };
                &traced
            }
        };
        let producer = match &self.via {
            Via::Kafka(p) => p,
            Via::Inline(sender) => {
                let rx = sender.send(announcement, stamp).await.map_err(|_| KafkaError::Canceled)?;
                return Ok(Acknowledgement(AckInner::Inline(rx), span));
            }
        };
        let (topic, key, value) = (self.topic(announcement), announcement.key(), announcement.to_bytes());
        let outbox_id = announcement.outbox_id.to_string();
        let mut headers = OwnedHeaders::new_with_capacity(4).insert(Header { key: header::OUTBOX_ID, value: Some(outbox_id.as_bytes()) });
        for (name, value) in [
            (header::COMMIT_LSN, stamp.commit_lsn.map(|l| l.to_string())),
            (header::COMMIT_TIME_US, stamp.commit_time_us.map(|t| t.to_string())),
            (header::RELAY_READ_US, stamp.relay_read_us.map(|t| t.to_string())),
        ] {
            if let Some(value) = &value {
                headers = headers.insert(Header { key: name, value: Some(value.as_bytes()) });
            }
        }
        if let Some(trace) = &announcement.trace {
            headers = headers.insert(Header { key: header::TRACEPARENT, value: Some(trace.traceparent().as_bytes()) });
            if let Some(state) = &trace.state {
                headers = headers.insert(Header { key: header::TRACESTATE, value: Some(state.as_bytes()) });
            }
        }
        loop {
            let record = FutureRecord::to(topic).key(&key).payload(&value).headers(headers.clone());
            match producer.send_result(record) {
                Ok(delivery) => return Ok(Acknowledgement(AckInner::Kafka(delivery), span)),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => tokio::time::sleep(QUEUE_FULL_WAIT).await,
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// Waits up to `timeout` for what is queued to be delivered. librdkafka's flush blocks, so
    /// it runs off the async threads.
    pub async fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        let Via::Kafka(producer) = &self.via else { return Ok(()) };
        let producer = producer.clone();
        tokio::task::spawn_blocking(move || producer.flush(timeout)).await.map_err(|_| KafkaError::Canceled)?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(token: Option<ClaimToken>) -> Announcement {
        Announcement {
            outbox_id: 42,
            target: Target::Delivery { delivery: DeliveryId::new(), endpoint: EndpointId::new() },
            reason: AnnouncementReason::Retry,
            claim_token: token,
            created_at: "2026-12-04 03:00:00.1+00".into(),
            trace: None,
        }
    }

    #[test]
    fn round_trips_deliveries_and_forwards() {
        for a in [delivery(Some(ClaimToken::new())), delivery(None)] {
            assert_eq!(Announcement::parse_keyed(a.key().as_bytes(), &a.to_bytes()), Ok(a.clone()));
        }
        let f = Announcement { target: Target::Forward { forward: ForwardId::new(), destination: DestinationId::new() }, reason: AnnouncementReason::Created, ..delivery(None) };
        assert_eq!(Announcement::parse_keyed(f.key().as_bytes(), &f.to_bytes()), Ok(f.clone()));
    }

    #[test]
    fn the_version_1_layout_is_kept() {
        let a = delivery(None);
        let Target::Delivery { delivery, .. } = a.target else { unreachable!() };
        let v: serde_json::Value = serde_json::from_slice(&a.to_bytes()).unwrap();
        assert_eq!(v, serde_json::json!({"v": 1, "outbox_id": 42, "delivery_id": delivery.to_string(), "reason": "retry", "created_at": "2026-12-04 03:00:00.1+00"}));
        // What the relay sent before this type existed parses, with or without the optional fields.
        let key = EndpointId::new().to_string();
        let old = serde_json::json!({"v": 1, "delivery_id": delivery.to_string(), "reason": "created"}).to_string();
        assert_eq!(Announcement::parse_keyed(key.as_bytes(), old.as_bytes()).unwrap().claim_token, None);
    }

    /// Byte for byte what the relay wrote before this type existed: a `json!` map (sorted
    /// keys), the ids prefixed, the token a hyphenated UUID.
    #[test]
    fn the_version_1_bytes_are_kept() {
        for a in [delivery(Some(ClaimToken::new())), delivery(None)] {
            let Target::Delivery { delivery, .. } = a.target else { unreachable!() };
            let mut old = serde_json::json!({"v": 1, "outbox_id": a.outbox_id, "reason": a.reason.as_str(), "created_at": a.created_at});
            old["delivery_id"] = serde_json::Value::String(delivery.to_string());
            if let Some(token) = a.claim_token {
                old["claim_token"] = serde_json::Value::String(token.0.to_string());
            }
            assert_eq!(String::from_utf8(a.to_bytes()).unwrap(), serde_json::to_string(&old).unwrap());
        }
        let forward = ForwardId::new();
        let f = Announcement { target: Target::Forward { forward, destination: DestinationId::new() }, ..delivery(None) };
        let old = serde_json::json!({"v": 1, "outbox_id": 42, "reason": "retry", "created_at": f.created_at, "forward_id": forward.to_string()});
        assert_eq!(String::from_utf8(f.to_bytes()).unwrap(), serde_json::to_string(&old).unwrap());
        assert!(String::from_utf8(f.to_bytes()).unwrap().starts_with(r#"{"created_at":"#));
    }

    #[test]
    fn refuses_anything_else() {
        let d = DeliveryId::new().to_string();
        let ep = EndpointId::new().to_string();
        for bad in [
            "not json".to_string(),
            format!(r#"{{"v":2,"delivery_id":"{d}","reason":"created"}}"#),
            r#"{"v":1,"delivery_id":"ep_0000","reason":"created"}"#.to_string(),
            r#"{"v":1,"reason":"created"}"#.to_string(),
            format!(r#"{{"v":1,"delivery_id":"{d}","reason":"whatever"}}"#),
            format!(r#"{{"v":1,"delivery_id":"{d}","forward_id":"fwd_x","reason":"created"}}"#),
            format!(r#"{{"v":1,"delivery_id":"{d}","reason":"retry","claim_token":"nope"}}"#),
            format!(r#"{{"v":"1","delivery_id":"{d}","reason":"created"}}"#),
            format!(r#"[1,"{d}","created"]"#),
            String::new(),
            // The worker's own list before this type existed (its `parse_hint` test).
            r#"{"v":2,"delivery_id":"x"}"#.to_string(),
            r#"{"v":1,"forward_id":"fwd_x"}"#.to_string(),
            r#"{"v":1,"delivery_id":"ep_0000"}"#.to_string(),
            r#"{"v":1}"#.to_string(),
        ] {
            assert!(Announcement::parse_keyed(ep.as_bytes(), bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(Announcement::parse_keyed(ep.as_bytes(), b"\xff\xfe").is_err());
        assert_eq!(Announcement::parse_keyed(ep.as_bytes(), format!(r#"{{"v":2,"delivery_id":"{d}","reason":"created"}}"#).as_bytes()), Err(AnnouncementError::Version(2)));
        assert_eq!(Announcement::parse_keyed(ep.as_bytes(), br#"{"v":1,"reason":"created"}"#), Err(AnnouncementError::Target));
        // A null token is no token, as the worker read it before.
        let null_token = format!(r#"{{"v":1,"delivery_id":"{d}","reason":"created","claim_token":null}}"#);
        assert_eq!(Announcement::parse_keyed(ep.as_bytes(), null_token.as_bytes()).map(|a| a.claim_token), Ok(None));
        let fine = format!(r#"{{"v":1,"delivery_id":"{d}","reason":"created"}}"#);
        assert_eq!(Announcement::parse_keyed(b"dst_000", fine.as_bytes()), Err(AnnouncementError::Key("endpoint")), "a Delivery keyed by something else");
    }

    #[test]
    fn messages_parse_line_by_line_and_refuse_anything_else() {
        let (d, e, f, x, t) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7(), uuid::Uuid::now_v7(), uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
        let text = format!("d {d} {e} created\nf {f} {x} retry {t}");
        let got = Announcement::parse_message(MESSAGE_PREFIX, text.as_bytes(), "2026-12-05 18:00:00+00").unwrap();
        assert_eq!(
            got,
            vec![
                Announcement { outbox_id: 0, target: Target::Delivery { delivery: DeliveryId(d), endpoint: EndpointId(e) }, reason: AnnouncementReason::Created, claim_token: None, created_at: "2026-12-05 18:00:00+00".into(), trace: None },
                Announcement { outbox_id: 0, target: Target::Forward { forward: ForwardId(f), destination: DestinationId(x) }, reason: AnnouncementReason::Retry, claim_token: Some(ClaimToken(t)), created_at: "2026-12-05 18:00:00+00".into(), trace: None },
            ]
        );
        for bad in [
            String::new(),
            format!("d {d} {e}"),
            format!("d {d} {e} created {t} extra"),
            format!("x {d} {e} created"),
            format!("d {d} ep_{e} created"),
            format!("d {d} {e} Created"),
            format!("d {d} {e} created nope"),
            format!("d {d} {e} created\n"),
            format!("d  {d} {e} created"),
        ] {
            assert!(Announcement::parse_message(MESSAGE_PREFIX, bad.as_bytes(), "").is_err(), "{bad:?}");
        }
        assert!(Announcement::parse_message(MESSAGE_PREFIX, b"\xff", "").is_err());
        assert_eq!(
            Announcement::parse_message("railhook.announce.v2", format!("d {d} {e} created").as_bytes(), ""),
            Err(AnnouncementError::MessagePrefix("railhook.announce.v2".into()))
        );
    }

    #[test]
    fn message_lines_carry_the_trace_context() {
        let (d, e, t) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let text = format!("d {d} {e} created tp={tp} ts=a=1,b=2\nd {d} {e} retry {t} tp={tp}\nd {d} {e} created tp=garbage");
        let got = Announcement::parse_message(MESSAGE_PREFIX, text.as_bytes(), "").unwrap();
        assert_eq!(got[0].trace, TraceContext::from_text(Some(tp), Some("a=1,b=2")));
        assert_eq!(got[0].claim_token, None);
        assert_eq!((got[1].claim_token, got[1].trace.as_ref().map(|c| c.traceparent())), (Some(ClaimToken(t)), Some(tp.to_string())));
        assert_eq!(got[2].trace, None, "a malformed traceparent is ignored, not an error");
        for bad in [format!("d {d} {e} created ts=a=1"), format!("d {d} {e} created ts=a=1 tp={tp}"), format!("d {d} tp={tp}")] {
            assert!(Announcement::parse_message(MESSAGE_PREFIX, bad.as_bytes(), "").is_err(), "{bad:?}");
        }
        // Kafka headers.
        let headers = [(header::OUTBOX_ID, Some(b"1".as_slice())), (header::TRACEPARENT, Some(tp.as_bytes())), (header::TRACESTATE, Some(b"k=v".as_slice()))];
        assert_eq!(Announcement::trace_from_headers(headers), TraceContext::from_text(Some(tp), Some("k=v")));
        assert_eq!(Announcement::trace_from_headers([(header::TRACEPARENT, Some(b"00-zz".as_slice()))]), None);
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_message_bytes_never_panic(content in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let _ = Announcement::parse_message(MESSAGE_PREFIX, &content, "");
        }

        #[test]
        fn arbitrary_bytes_never_panic(key in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40), value in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let _ = Announcement::parse_keyed(&key, &value);
        }

        #[test]
        fn any_announcement_round_trips(outbox_id in proptest::prelude::any::<i64>(), created_at in ".{0,40}", token in proptest::prelude::any::<Option<u128>>(), forward in proptest::prelude::any::<bool>()) {
            let target = if forward {
                Target::Forward { forward: ForwardId::new(), destination: DestinationId::new() }
            } else {
                Target::Delivery { delivery: DeliveryId::new(), endpoint: EndpointId::new() }
            };
            let a = Announcement { outbox_id, target, reason: AnnouncementReason::Reannounce, claim_token: token.map(|t| ClaimToken(uuid::Uuid::from_u128(t))), created_at, trace: None };
            proptest::prop_assert_eq!(Announcement::parse_keyed(a.key().as_bytes(), &a.to_bytes()), Ok(a));
        }
    }
}
