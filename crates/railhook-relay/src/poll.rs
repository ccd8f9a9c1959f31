//! `railhook relay --mode poll`: the polling relay the CDC design replaces, kept as the
//! benchmark baseline. (Being written.)

use std::sync::Arc;

use railhook_config::Config;
use rdkafka::producer::FutureProducer;
use tokio_util::sync::CancellationToken;

use crate::{RelayError, RelayStats};

/// Polls the outbox until `shutdown`.
pub async fn run(config: Arc<Config>, producer: FutureProducer, stats: Arc<RelayStats>, shutdown: CancellationToken) -> Result<(), RelayError> {
    let _ = (config, producer, stats, shutdown);
    Err(RelayError::Misconfigured("relay.mode = poll is not built yet".into()))
}
