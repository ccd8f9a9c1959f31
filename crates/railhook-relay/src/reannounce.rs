//! Re-announcement after a slot was created: the Deliveries and Forwards that are still
//! PENDING, unclaimed and not scheduled for a retry get a fresh outbox row (reason
//! `reannounce`). The statements are the Delivery lifecycle's
//! (`railhook_store::lifecycle::schedule`); this module is the relay's name for them.

pub use railhook_store::lifecycle::{reannounce_pending, Reannounced};
