//! Railhook's vocabulary, shared by every crate: typed ids, WAL positions, statuses, event
//! type patterns, Standard Webhooks signing and the SSRF guard for Endpoint URLs.
//! Nothing here does I/O.

pub mod address;
pub mod id;
pub mod lsn;
pub mod pattern;
pub mod signing;
pub mod status;
pub mod trace;

pub use address::{classify, parse_endpoint_url, AllowList, AllowListError, DeniedReason, EndpointUrl, UrlError};
pub use id::{
    ClaimToken,
    ApiKeyId, AttemptId, DeliveryId, DestinationId, EndpointId, EventId, ForwardId, IdError,
    IncomingEventId, OrganizationId, ProjectId, ReplayId, SourceId, SubscriptionId,
};
pub use lsn::Lsn;
pub use pattern::{candidate_patterns, EventType, EventTypePattern, PatternError};
pub use signing::{sign, signature_header, verify, EndpointSecret, SecretError, VerifyError};
pub use trace::{TraceContext, TraceParent};
pub use status::{AnnouncementReason, CircuitChange, DeferralReason, DeliveryStatus, UnknownWord};

/// An error with its chain of sources, for logs: `context: source: source's source`.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}
