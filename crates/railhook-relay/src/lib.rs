//! `railhook relay`: streams committed outbox inserts from a logical replication slot
//! (pgoutput) to Kafka with an idempotent producer, and advances the slot only after Kafka
//! acknowledged (see [`progress`]).
//!
//! Modules: [`pgoutput`] decodes the protocol, [`outbox`] maps inserts to rows, [`progress`]
//! decides what may be confirmed, [`setup`] checks and creates publication and slot,
//! [`stream`] is the loop.

use std::sync::Arc;

use railhook_config::Config;
use tokio_util::sync::CancellationToken;

pub mod outbox;
pub mod pgoutput;
pub mod poll;
pub mod progress;
pub mod setup;
pub mod stream;

pub use stream::RelayStats;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("relay cannot start: {0}")]
    Misconfigured(String),
    #[error("replication slot {0} is lost (wal_status 'lost'): its WAL was removed")]
    SlotLost(String),
    #[error("Postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("store: {0}")]
    Store(#[from] railhook_store::StoreError),
    #[error("replication stream: {0}")]
    Replication(String),
    #[error("replication stream ended")]
    StreamEnded,
    #[error("decoding pgoutput: {0}")]
    Decode(#[from] pgoutput::DecodeError),
    #[error("outbox row: {0}")]
    Row(#[from] outbox::RowError),
    #[error("producing to Kafka: {0}")]
    Produce(String),
    #[error("Kafka: {0}")]
    Kafka(#[from] railhook_kafka::KafkaError),
}

impl RelayError {
    fn from_replication(e: pgwire_replication::PgWireError) -> RelayError {
        RelayError::Replication(e.to_string())
    }
}

/// Checks the server, creates what is missing, and streams until `shutdown`.
pub async fn run(config: Arc<Config>, stats: Arc<RelayStats>, shutdown: CancellationToken) -> Result<(), RelayError> {
    let (client, connection) = tokio_postgres::connect(&config.database.url, tokio_postgres::NoTls).await?;
    let conn = tokio::spawn(connection);
    let slot = setup::prepare(&client, &config.relay).await?;
    drop(client);
    conn.abort();
    railhook_kafka::ensure_topics(&config.kafka, &[config.deliveries_topic(), config.forwards_topic()]).await?;
    let mut producer_config = railhook_kafka::idempotent_producer_config(&config.kafka, stream::MAX_IN_FLIGHT);
    // Kafka being down must delay messages, never fail them: the slot holds them meanwhile.
    producer_config.set("message.timeout.ms", "0");
    let producer = producer_config.create().map_err(railhook_kafka::KafkaError::from)?;
    stream::stream(config, producer, slot.confirmed_flush, stats, shutdown).await
}
