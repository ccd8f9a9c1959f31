//! The Kafka side: a consumer group on the deliveries topic. Each message is a hint; it is
//! handed to the Attempt Runner concurrently (at most `worker.max_in_flight` at once; at the
//! bound the consumer stops reading, so memory stays bounded), so a slow endpoint never
//! delays another endpoint that shares its partition (6.6).
//!
//! Offsets: a message's offset is stored (and auto-committed) once its claim step finished,
//! not once its HTTP request did, and only over a contiguous prefix per partition. A crash
//! therefore loses no hint whose Delivery is still unclaimed (the stranded sweep would need
//! an hour to find it); a hint whose claim happened is covered by the Claim and the
//! PROCESSING sweep.

use std::collections::{BTreeSet, HashMap};

/// Per partition: offsets handed out and not yet through their claim step.
#[derive(Debug, Default)]
pub struct OffsetTracker {
    partitions: HashMap<i32, Partition>,
}

#[derive(Debug, Default)]
struct Partition {
    pending: BTreeSet<i64>,
    highest: i64,
}

impl OffsetTracker {
    pub fn started(&mut self, partition: i32, offset: i64) {
        let p = self.partitions.entry(partition).or_default();
        p.pending.insert(offset);
        p.highest = p.highest.max(offset);
    }

    /// The claim step of `offset` finished; returns the offset to store for the partition
    /// (the next one to read after a restart), if it moved.
    pub fn done(&mut self, partition: i32, offset: i64) -> Option<i64> {
        let p = self.partitions.get_mut(&partition)?;
        let before = p.pending.first().copied();
        p.pending.remove(&offset);
        match (before, p.pending.first()) {
            (Some(b), Some(&now)) if now > b => Some(now),
            (Some(_), Some(_)) => None,
            (_, None) => Some(p.highest + 1),
            (None, Some(_)) => None,
        }
    }

    /// Forgets partitions this consumer no longer owns.
    pub fn revoke(&mut self, partition: i32) {
        self.partitions.remove(&partition);
    }

    pub fn pending(&self) -> usize {
        self.partitions.values().map(|p| p.pending.len()).sum()
    }
}

/// What the worker takes from an announcement: the Delivery and the scheduler's token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hint {
    pub delivery: railhook_core::DeliveryId,
    pub claim_token: Option<railhook_core::ClaimToken>,
    /// When its announcement was committed (the relay's `commit_time_us` header), if known:
    /// the claim tells a retry's hint that overtook that commit from a stale one.
    pub announced_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Its Kafka partition and offset: one Endpoint's hints are claimed in this order within
    /// a claim batch (its ordered Deliveries' commit order). `None` without a message.
    pub position: Option<(i32, i64)>,
    /// The W3C trace context the announcement carried (issue 33: the `traceparent` and
    /// `tracestate` headers, or the inline hint's): the parent of this Delivery's claim,
    /// Attempt and finalise spans, and what the receiver is sent.
    pub trace: Option<railhook_core::TraceContext>,
}

/// Parses a message (`railhook_kafka::Announcement`, the relay's contract): the hint and its
/// Endpoint (the key); `None` for anything that is not a Delivery announcement.
pub fn parse_hint(key: &[u8], payload: &[u8]) -> Option<(railhook_core::EndpointId, Hint)> {
    match railhook_kafka::Announcement::parse_keyed(key, payload) {
        Ok(railhook_kafka::Announcement { target: railhook_kafka::Target::Delivery { delivery, endpoint }, claim_token, .. }) => {
            Some((endpoint, Hint { delivery, claim_token, announced_at: None, position: None, trace: None }))
        }
        Ok(_) => None,
        Err(e) => {
            tracing::debug!(error = %e, "not an announcement");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_only_a_contiguous_prefix() {
        let mut t = OffsetTracker::default();
        for o in 10..15 {
            t.started(0, o);
        }
        assert_eq!(t.done(0, 12), None, "10 and 11 still running");
        assert_eq!(t.done(0, 10), Some(11));
        assert_eq!(t.done(0, 11), Some(13));
        assert_eq!(t.done(0, 14), None);
        assert_eq!(t.done(0, 13), Some(15), "all done: resume after the highest");
        assert_eq!(t.pending(), 0);
        t.started(1, 3);
        t.revoke(1);
        assert_eq!(t.done(1, 3), None);
    }

    #[test]
    fn parses_delivery_announcements_and_refuses_anything_else() {
        let d = railhook_core::DeliveryId::new();
        let ep = railhook_core::EndpointId::new();
        let key = ep.to_string();
        let token = railhook_core::ClaimToken::new();
        let v = serde_json::json!({"v": 1, "delivery_id": d.to_string(), "reason": "retry", "claim_token": token.to_string()});
        assert_eq!(parse_hint(key.as_bytes(), v.to_string().as_bytes()), Some((ep, Hint { delivery: d, claim_token: Some(token), announced_at: None, position: None, trace: None })));
        let v = serde_json::json!({"v": 1, "delivery_id": d.to_string(), "reason": "created"});
        assert_eq!(parse_hint(key.as_bytes(), v.to_string().as_bytes()).unwrap().1.claim_token, None);
        let forward = serde_json::json!({"v": 1, "forward_id": railhook_core::ForwardId::new().to_string(), "reason": "created"}).to_string();
        let dst = railhook_core::DestinationId::new().to_string();
        assert_eq!(parse_hint(dst.as_bytes(), forward.as_bytes()), None, "a Forward is not a Delivery hint");
        for bad in [&b"not json"[..], br#"{"v":2,"delivery_id":"x"}"#, br#"{"v":1,"delivery_id":"ep_0000"}"#, br#"{"v":1}"#, b"\xff\xfe"] {
            assert_eq!(parse_hint(key.as_bytes(), bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
