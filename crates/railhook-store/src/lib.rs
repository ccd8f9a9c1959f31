//! Railhook's Postgres access. SQL lives next to the code that runs it.

pub mod attempts;
pub mod connection;
pub mod deletion;
pub mod deliveries;
pub mod endpoints;
pub mod error;
pub mod events;
pub mod incoming;
pub mod lifecycle;
pub mod locks;
pub mod migrate;
pub mod pacing;
pub mod pool;
pub mod replays;
pub mod retention;
pub mod server;
pub mod sources;
pub mod subscriptions;
pub mod tenancy;

pub use connection::{connect, connect_as, DatabaseUrl, SslMode};
pub use error::StoreError;
pub use migrate::{Migration, MigrationReport, Migrator};
pub use pool::{build_pool, build_pool_as, connect_pool, connect_pool_as, Pool};

/// The `application_name` of each component's Postgres connections (`pg_stat_activity`).
pub mod application {
    pub const API: &str = "railhook-api";
    /// The API's one `LISTEN` connection for ingest pacing ([`crate::pacing`]).
    pub const API_PACING: &str = "railhook-api-pacing";
    pub const RELAY: &str = "railhook-relay";
    pub const WORKER: &str = "railhook-worker";
    /// The Kafka source's ingest connections (`railhook-kafka-source`).
    pub const KAFKA_SOURCE: &str = "railhook-kafka-source";
    pub const CLI: &str = "railhook-cli";
}
