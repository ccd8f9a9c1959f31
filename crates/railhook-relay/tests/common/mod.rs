//! The in-process relay the integration tests of this crate start and stop.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use railhook_config::Config;
use railhook_relay::{RelayError, RelayMetrics, RelayStats};
use railhook_testkit::eventually;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub struct Relay {
    pub metrics: RelayMetrics,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<Result<(), RelayError>>,
}

impl Relay {
    /// Starts `railhook_relay::run`; logs go to stderr at `RAILHOOK_TEST_LOG` (default warn).
    pub fn start(config: &Arc<Config>) -> Relay {
        let mut telemetry = config.telemetry.clone();
        telemetry.log_filter = std::env::var("RAILHOOK_TEST_LOG").unwrap_or_else(|_| "warn".into());
        railhook_telemetry::init_tracing(&telemetry);
        let metrics = RelayMetrics::new(Arc::new(RelayStats::default()));
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(railhook_relay::run(config.clone(), metrics.clone(), shutdown.clone()));
        Relay { metrics, shutdown, task }
    }

    pub fn stats(&self) -> &RelayStats {
        &self.metrics.stats
    }

    /// Waits until the relay's stream returned its liveness marker: from then on every
    /// transaction that starts is in the stream. Panics if the relay ended first.
    pub async fn live(&self) {
        eventually(Duration::from_secs(60), "the relay stream to be live", || async {
            if self.task.is_finished() {
                panic!("the relay ended before its stream was live");
            }
            self.stats().live.load(Ordering::Relaxed).then_some(())
        })
        .await
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.expect("relay task").expect("relay ends cleanly");
    }
}
