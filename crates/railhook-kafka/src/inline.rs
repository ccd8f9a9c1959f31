//! The inline transport (`transport = "inline"`): announcements go from the relay to the
//! workers of the same process through a bounded channel instead of Kafka.
//!
//! The contract is Kafka's, kept in memory:
//! - the relay hands an announcement over with [`crate::Announcer::send`], which waits while
//!   the channel is full (backpressure: the relay stops reading the slot, so a worker that
//!   falls behind becomes replication lag, not memory);
//! - each [`InlineHint`] carries an acknowledgement, which the worker sends when the hint's
//!   claim step is over (the moment it would store a Kafka offset): the Delivery is then
//!   claimed, or its claim found nothing to do, or it is safely a Deferral in Postgres.
//!   The relay counts these acknowledgements exactly as it counts Kafka's, so the slot moves
//!   past a commit only after every hint of it was through its claim step;
//! - a hint the worker drops (shutdown, a crash of the process) was never acknowledged: the
//!   relay does not confirm its commit, and the next start reads it again from the slot.
//!
//! One channel per direction (Deliveries, Forwards), as Kafka has one topic per direction.
//! The hint is the whole [`Announcement`], so its trace context (Kafka's `traceparent` and
//! `tracestate` headers) travels with it.

use tokio::sync::{mpsc, oneshot};

use crate::announcement::{Announcement, Stamp, Target};

/// One announcement in the channel, with its acknowledgement.
#[derive(Debug)]
pub struct InlineHint {
    pub announcement: Announcement,
    pub stamp: Stamp,
    pub ack: Ack,
}

/// The worker's side of one hint's acknowledgement: [`Ack::done`] once its claim step is
/// over. Dropping it unsent tells the relay the hint was not taken (its commit stays
/// unconfirmed).
#[derive(Debug)]
pub struct Ack(oneshot::Sender<()>);

impl Ack {
    pub fn done(self) {
        // The relay may have restarted its stream since (it reads the hint again then).
        let _ = self.0.send(());
    }
}

/// A consume loop's acknowledgements not yet sent, by the hint's sequence number in the
/// channel (its place, where a Kafka message has its offset).
#[derive(Debug, Default)]
pub struct Pending(std::collections::HashMap<i64, Ack>);

impl Pending {
    /// The hint at `seq` was taken; its acknowledgement waits for [`Pending::done`].
    pub fn taken(&mut self, seq: i64, ack: Ack) {
        self.0.insert(seq, ack);
    }

    /// The claim step of the hint at `seq` is over: acknowledged (once; again is a no-op).
    pub fn done(&mut self, seq: i64) {
        if let Some(ack) = self.0.remove(&seq) {
            ack.done();
        }
    }
}

/// The relay's side: a clone per relay stream.
#[derive(Debug, Clone)]
pub struct InlineSender {
    deliveries: mpsc::Sender<InlineHint>,
    forwards: mpsc::Sender<InlineHint>,
}

/// The workers' side: taken once by the worker of the process.
#[derive(Debug)]
pub struct InlineReceivers {
    pub deliveries: mpsc::Receiver<InlineHint>,
    pub forwards: mpsc::Receiver<InlineHint>,
}

/// Why a hint could not be handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the worker of this process has stopped taking announcements")]
pub struct Closed;

/// The channels, each holding at most `capacity` announcements that no worker took yet.
pub fn channel(capacity: usize) -> (InlineSender, InlineReceivers) {
    let (deliveries, d_rx) = mpsc::channel(capacity.max(1));
    let (forwards, f_rx) = mpsc::channel(capacity.max(1));
    (InlineSender { deliveries, forwards }, InlineReceivers { deliveries: d_rx, forwards: f_rx })
}

impl InlineSender {
    /// Hands `announcement` to the worker (waiting while its channel is full); the receiver
    /// resolves when the worker acknowledged it, or errors when the worker dropped it.
    pub async fn send(&self, announcement: &Announcement, stamp: &Stamp) -> Result<oneshot::Receiver<()>, Closed> {
        let (tx, rx) = oneshot::channel();
        let channel = match announcement.target {
            Target::Delivery { .. } => &self.deliveries,
            Target::Forward { .. } => &self.forwards,
        };
        channel.send(InlineHint { announcement: announcement.clone(), stamp: *stamp, ack: Ack(tx) }).await.map_err(|_| Closed)?;
        Ok(rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use railhook_core::{AnnouncementReason, DeliveryId, DestinationId, EndpointId, ForwardId};

    fn announcement(target: Target) -> Announcement {
        Announcement { outbox_id: 0, target, reason: AnnouncementReason::Created, claim_token: None, created_at: String::new(), trace: None }
    }

    #[tokio::test]
    async fn routes_by_target_and_acknowledges_only_when_told() {
        let (tx, mut rx) = channel(2);
        // The hint carries the trace context as Kafka's headers do (issue 33).
        let trace = railhook_core::TraceContext::from_text(Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), Some("k=v"));
        let d = Announcement { trace, ..announcement(Target::Delivery { delivery: DeliveryId::new(), endpoint: EndpointId::new() }) };
        let f = announcement(Target::Forward { forward: ForwardId::new(), destination: DestinationId::new() });
        let mut d_ack = tx.send(&d, &Stamp::default()).await.unwrap();
        let f_ack = tx.send(&f, &Stamp::default()).await.unwrap();
        let got = rx.deliveries.recv().await.unwrap();
        assert_eq!(got.announcement, d);
        assert!(d_ack.try_recv().is_err(), "not acknowledged before the worker says so");
        got.ack.done();
        assert_eq!(d_ack.await, Ok(()));
        let got = rx.forwards.recv().await.unwrap();
        assert_eq!(got.announcement, f);
        drop(got);
        assert!(f_ack.await.is_err(), "a dropped hint is not acknowledged");
    }

    #[tokio::test]
    async fn a_full_channel_holds_the_sender_back() {
        let (tx, mut rx) = channel(1);
        let d = announcement(Target::Delivery { delivery: DeliveryId::new(), endpoint: EndpointId::new() });
        tx.send(&d, &Stamp::default()).await.unwrap();
        let stamp = Stamp::default();
        let second = tx.send(&d, &stamp);
        tokio::pin!(second);
        assert!(futures::poll!(&mut second).is_pending(), "waits while the channel is full");
        rx.deliveries.recv().await.unwrap();
        assert!(second.await.is_ok());
        drop(rx);
        assert_eq!(tx.send(&d, &Stamp::default()).await.err(), Some(Closed));
    }
}
