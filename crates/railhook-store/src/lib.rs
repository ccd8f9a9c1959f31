//! Railhook's Postgres access. SQL lives next to the code that runs it.

pub mod connection;
pub mod deliveries;
pub mod endpoints;
pub mod error;
pub mod events;
pub mod lifecycle;
pub mod locks;
pub mod migrate;
pub mod pool;
pub mod server;
pub mod subscriptions;
pub mod tenancy;

pub use connection::{connect, DatabaseUrl, SslMode};
pub use error::StoreError;
pub use migrate::{Migration, MigrationReport, Migrator};
pub use pool::{build_pool, connect_pool, Pool};
