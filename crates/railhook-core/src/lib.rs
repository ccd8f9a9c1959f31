//! Railhook's vocabulary, shared by every crate: typed ids, WAL positions and statuses.
//! Nothing here does I/O.

pub mod id;
pub mod lsn;
pub mod pattern;
pub mod status;

pub use id::{
    ApiKeyId, AttemptId, DeliveryId, DestinationId, EndpointId, EventId, ForwardId, IdError,
    IncomingEventId, OrganizationId, ProjectId, SourceId, SubscriptionId,
};
pub use lsn::Lsn;
pub use status::DeliveryStatus;
