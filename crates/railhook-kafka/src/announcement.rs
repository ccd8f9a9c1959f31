//! The announcement: the one message between the relay and the worker. The relay (stream and
//! poll modes) builds it from an outbox row and sends it with an [`Announcer`]; the worker
//! parses it. Topic names, the key and the headers are here too, so the contract is stated
//! once.
//!
//! Wire format, version 1 (messages already in Kafka must keep parsing):
//! `{"v":1,"outbox_id":N,"delivery_id"|"forward_id":"<prefixed id>","reason":"<reason>",
//! "created_at":"<as Postgres printed it>"[,"claim_token":"<uuid>"]}`; key: the Endpoint id
//! (Deliveries) or the Destination id (Forwards), so one Endpoint's announcements keep their
//! order on one partition; headers `outbox_id` and, in CDC mode, `commit_lsn`.

use std::time::Duration;

use railhook_config::Config;
use railhook_core::{AnnouncementReason, ClaimToken, DeliveryId, DestinationId, EndpointId, ForwardId, Lsn};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use serde::{Deserialize, Serialize};

/// The layout version of the value.
pub const VERSION: u32 = 1;

/// Header names.
pub mod header {
    /// The outbox row's id (decimal).
    pub const OUTBOX_ID: &str = "outbox_id";
    /// The end LSN of the commit that inserted the row (CDC mode only).
    pub const COMMIT_LSN: &str = "commit_lsn";
}

/// The topics, with the configured prefix (`kafka.topic_prefix` + `kafka.deliveries_topic`
/// or `kafka.forwards_topic`; the configuration spells the names, once).
pub fn deliveries_topic(config: &Config) -> String {
    config.deliveries_topic()
}

pub fn forwards_topic(config: &Config) -> String {
    config.forwards_topic()
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
}

#[derive(Serialize, Deserialize)]
struct Wire {
    v: u32,
    #[serde(default)]
    outbox_id: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delivery_id: Option<DeliveryId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    forward_id: Option<ForwardId>,
    reason: AnnouncementReason,
    #[serde(default)]
    created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    claim_token: Option<ClaimToken>,
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
            v: VERSION,
            outbox_id: self.outbox_id,
            delivery_id,
            forward_id,
            reason: self.reason,
            created_at: self.created_at.clone(),
            claim_token: self.claim_token,
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
        Ok(Announcement { outbox_id: wire.outbox_id, target, reason: wire.reason, claim_token: wire.claim_token, created_at: wire.created_at })
    }
}

/// The relay's producer: the idempotent producer with its bounded local queue, and the one
/// place that waits while that queue is full (backpressure: the caller stops reading its
/// source instead of growing memory).
#[derive(Clone)]
pub struct Announcer {
    producer: FutureProducer,
}

/// How long to wait before handing a message over again while the local queue is full.
const QUEUE_FULL_WAIT: Duration = Duration::from_millis(5);

impl Announcer {
    pub fn new(producer: FutureProducer) -> Announcer {
        Announcer { producer }
    }

    pub fn producer(&self) -> &FutureProducer {
        &self.producer
    }

    /// Hands the announcement to the producer, waiting while its queue is full; the future it
    /// returns resolves when Kafka acknowledged (or refused) the message.
    pub async fn send(&self, config: &Config, announcement: &Announcement, commit_lsn: Option<Lsn>) -> Result<DeliveryFuture, KafkaError> {
        let (topic, key, value) = (announcement.topic(config), announcement.key(), announcement.to_bytes());
        let outbox_id = announcement.outbox_id.to_string();
        let lsn = commit_lsn.map(|l| l.to_string());
        let mut headers = OwnedHeaders::new().insert(Header { key: header::OUTBOX_ID, value: Some(outbox_id.as_bytes()) });
        if let Some(lsn) = &lsn {
            headers = headers.insert(Header { key: header::COMMIT_LSN, value: Some(lsn.as_bytes()) });
        }
        loop {
            let record = FutureRecord::to(&topic).key(&key).payload(&value).headers(headers.clone());
            match self.producer.send_result(record) {
                Ok(delivery) => return Ok(delivery),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => tokio::time::sleep(QUEUE_FULL_WAIT).await,
                Err((e, _)) => return Err(e),
            }
        }
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
        ] {
            assert!(Announcement::parse_keyed(ep.as_bytes(), bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(Announcement::parse_keyed(ep.as_bytes(), b"\xff\xfe").is_err());
        let fine = format!(r#"{{"v":1,"delivery_id":"{d}","reason":"created"}}"#);
        assert_eq!(Announcement::parse_keyed(b"dst_000", fine.as_bytes()), Err(AnnouncementError::Key("endpoint")), "a Delivery keyed by something else");
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(key in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40), value in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let _ = Announcement::parse_keyed(&key, &value);
        }
    }
}
