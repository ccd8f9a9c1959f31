//! The worker's Ordering Buffer (DESIGN.md 6.5, issue 30): an ordered Endpoint's Deliveries
//! are claimed ahead, several per claim round trip, and sent one after another, each the
//! moment its predecessor's Attempt ended in a final verdict, without a round trip through
//! Postgres in between.
//!
//! How: this worker's Claims of ordered Deliveries are [`OrderingBuffer::held`] from the
//! moment the claim answered until their task ends, and every claim batch names them
//! (`railhook_claim_batch`'s `p_mine`). A Delivery whose predecessor is one of them is claimed
//! "behind" it (`Claimed::behind`) instead of parked in Postgres. Its task then waits
//! ([`OrderingBuffer::wait`]) for the predecessor's [`Resolution`], which the predecessor's
//! task publishes as soon as it classified its response ([`OrderingBuffer::resolve`]),
//! before its finalise:
//! - [`Resolution::Go`]: delivered, or ended in Failed Messages; the successor is sent.
//! - [`Resolution::Stop`]: anything else (back on its Retry Ladder, cut short at shutdown, its
//!   claim failed, the task ended without a verdict); the successor is parked in Postgres
//!   (`railhook_park_held`), no Attempt spent, and the Postgres path takes over: the
//!   predecessor's finalise releases it when it ends, or its gap timeout does.
//!
//! Postgres stays the truth across workers and after a crash: a worker that dies holding
//! claims leaves them PROCESSING, the stuck sweep announces them again, and their claims
//! check each predecessor in Postgres. A successor may be sent before its predecessor's
//! finalise committed; a crash in between sends the predecessor again after the sweep (a
//! duplicate, window 8), never a successor before its predecessor's first arrival.
//!
//! Bounded: at most `worker.max_in_flight` Claims are held; resolutions are kept until their
//! successor read them or for [`KEEP`], whichever comes first.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use railhook_core::{ClaimToken, EndpointId};
use tokio::sync::Notify;
use tokio::time::Instant;

/// How an ordered Delivery's Attempt ended, as its successor needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Delivered, or in Failed Messages: the successor may go.
    Go,
    /// Not resolved (back on its ladder, cut short, no verdict): the successor is parked.
    Stop,
}

/// How long a resolution waits for its successor to read it.
pub const KEEP: Duration = Duration::from_secs(60);

/// How long a Claim stays held without its task letting it go: a Claim whose answer never
/// reached a task (the task was aborted while the claim batch ran) is forgotten after this,
/// well past the stuck sweep's `worker.processing_timeout_seconds` (5 min by default), which
/// has taken the Delivery back by then.
pub const HELD_MAX: Duration = Duration::from_secs(15 * 60);

#[derive(Default)]
struct State {
    held: HashMap<ClaimToken, Instant>,
    /// Per Endpoint: Sequence Number -> resolution and when it was published.
    resolutions: HashMap<EndpointId, BTreeMap<i64, (Resolution, Instant)>>,
    /// Per Endpoint, what a waiting successor is woken by.
    wakers: HashMap<EndpointId, Arc<Notify>>,
}

/// Shared by the claimer (which holds new Claims), the Attempt tasks (which resolve and
/// wait) and every claim batch (which names the held Claims). Cloning shares it.
#[derive(Clone, Default)]
pub struct OrderingBuffer(Arc<Mutex<State>>);

impl OrderingBuffer {
    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; a poisoned state is still the right state.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A Claim of an ordered Delivery this worker now holds (until [`Held`] is dropped).
    pub fn hold(&self, token: ClaimToken) {
        self.state().held.insert(token, Instant::now());
    }

    /// The held Claims, for a claim batch (`p_mine`); forgets those held longer than
    /// [`HELD_MAX`].
    pub fn held(&self) -> Vec<ClaimToken> {
        let mut state = self.state();
        let now = Instant::now();
        state.held.retain(|_, since| now.duration_since(*since) <= HELD_MAX);
        state.held.keys().copied().collect()
    }

    /// Guards a held Claim: publishes `Stop` for its Sequence Number if nothing was published
    /// (a task that ended or panicked without a verdict) and lets the Claim go when dropped.
    pub fn guard(&self, endpoint: EndpointId, sequence: i64, token: ClaimToken) -> Held {
        Held { buffer: self.clone(), endpoint, sequence, token, resolved: false }
    }

    /// Publishes how `sequence` of `endpoint` ended; wakes its successor.
    fn resolve(&self, endpoint: EndpointId, sequence: i64, resolution: Resolution) {
        let waker = {
            let mut state = self.state();
            let now = Instant::now();
            let per = state.resolutions.entry(endpoint).or_default();
            per.insert(sequence, (resolution, now));
            // Forget what no successor read in time (its successor went elsewhere).
            while per.first_key_value().is_some_and(|(_, (_, at))| now.duration_since(*at) > KEEP) {
                per.pop_first();
            }
            state.wakers.get(&endpoint).cloned()
        };
        if let Some(waker) = waker {
            waker.notify_waiters();
        }
    }

    /// Waits until `sequence` of `endpoint` (the predecessor of a Delivery claimed behind it)
    /// is resolved, at most `timeout` (then `Stop`); takes the resolution.
    pub async fn wait(&self, endpoint: EndpointId, sequence: i64, timeout: Duration) -> Resolution {
        let deadline = Instant::now() + timeout;
        loop {
            let waker = {
                let mut state = self.state();
                if let Some(per) = state.resolutions.get_mut(&endpoint) {
                    if let Some((resolution, _)) = per.remove(&sequence) {
                        if per.is_empty() {
                            state.resolutions.remove(&endpoint);
                        }
                        return resolution;
                    }
                }
                state.wakers.entry(endpoint).or_default().clone()
            };
            let timed_out = {
                let notified = waker.notified();
                tokio::pin!(notified);
                // Registered before the check below: a resolution published in between wakes it.
                notified.as_mut().enable();
                let published = self.state().resolutions.get(&endpoint).is_some_and(|per| per.contains_key(&sequence));
                !published && tokio::time::timeout_at(deadline, notified).await.is_err()
            };
            if timed_out {
                drop(waker);
                self.forget_waker(endpoint);
                return Resolution::Stop;
            }
        }
    }

    /// Drops an Endpoint's waker once nothing of it is kept (bounded by the Endpoints in use).
    fn forget_waker(&self, endpoint: EndpointId) {
        let mut state = self.state();
        if !state.resolutions.contains_key(&endpoint) {
            if let Some(w) = state.wakers.get(&endpoint) {
                if Arc::strong_count(w) == 1 {
                    state.wakers.remove(&endpoint);
                }
            }
        }
    }

    /// Held Claims and kept resolutions (tests, metrics).
    pub fn sizes(&self) -> (usize, usize) {
        let state = self.state();
        (state.held.len(), state.resolutions.values().map(BTreeMap::len).sum())
    }
}

/// A held Claim of an ordered Delivery; see [`OrderingBuffer::guard`].
pub struct Held {
    buffer: OrderingBuffer,
    endpoint: EndpointId,
    sequence: i64,
    token: ClaimToken,
    resolved: bool,
}

impl Held {
    /// Publishes the Attempt's resolution for the successor (once).
    pub fn resolve(&mut self, resolution: Resolution) {
        if !self.resolved {
            self.resolved = true;
            self.buffer.resolve(self.endpoint, self.sequence, resolution);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.resolve(Resolution::Stop);
        self.buffer.state().held.remove(&self.token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_successor_goes_when_its_predecessor_resolves_and_not_before() {
        let buffer = OrderingBuffer::default();
        let ep = EndpointId::new();
        let token = ClaimToken::new();
        buffer.hold(token);
        let mut held = buffer.guard(ep, 7, token);
        assert_eq!(buffer.held(), vec![token]);
        let waiting = tokio::spawn({
            let buffer = buffer.clone();
            async move { buffer.wait(ep, 7, Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "no resolution yet");
        held.resolve(Resolution::Go);
        assert_eq!(waiting.await.unwrap(), Resolution::Go);
        drop(held);
        assert_eq!(buffer.sizes(), (0, 0), "the Claim let go, the resolution read");
    }

    #[tokio::test]
    async fn a_task_that_ends_without_a_verdict_stops_its_successor() {
        let buffer = OrderingBuffer::default();
        let ep = EndpointId::new();
        let token = ClaimToken::new();
        buffer.hold(token);
        drop(buffer.guard(ep, 3, token));
        assert_eq!(buffer.wait(ep, 3, Duration::from_secs(1)).await, Resolution::Stop);
        // Published before anyone waited, and read once.
        let mut held = buffer.guard(ep, 4, token);
        held.resolve(Resolution::Go);
        held.resolve(Resolution::Stop);
        assert_eq!(buffer.wait(ep, 4, Duration::from_secs(1)).await, Resolution::Go, "the first resolution counts");
    }

    #[tokio::test]
    async fn nothing_published_stops_after_the_timeout() {
        let buffer = OrderingBuffer::default();
        let ep = EndpointId::new();
        assert_eq!(buffer.wait(ep, 1, Duration::from_millis(50)).await, Resolution::Stop);
        assert_eq!(buffer.sizes(), (0, 0));
        assert!(buffer.state().wakers.is_empty(), "no waker left behind");
    }
}
