//! Ingest pacing's signal (issue 20): the workers tell the API processes, through Postgres
//! `NOTIFY`, how long a new Delivery would wait for work that is the workers' own to do.
//!
//! Each worker process reports `"<instance> <milliseconds> <per second>"` on [`CHANNEL`] every
//! 50 ms while its predicted wait is above zero (and once more when it falls back to zero):
//! the wait, and the rate at which the worker's requests end (Deliveries per second; 0 when not
//! yet known). A report without the rate (a worker of an earlier build) is read as rate 0. Every API
//! process `LISTEN`s on one connection of its own and keeps the largest fresh report (see
//! `railhook_api::pacing`). No table, no WAL: a notification lives only until the listeners
//! read it, so a worker that dies simply stops reporting and its last report ages out.

use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;

use crate::{DatabaseUrl, StoreError};

/// The notification channel.
pub const CHANNEL: &str = "railhook_delivery_wait";

/// One worker process's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The reporting worker process (random per process start).
    pub instance: String,
    /// How long a new Delivery would wait for its claim, predicted from the worker's queues.
    pub wait: Duration,
    /// How fast the worker's requests end, Deliveries per second (0: not known). The API adds
    /// what it accepted since the report at this rate (`railhook_api::pacing`).
    pub per_s: u32,
}

impl Report {
    /// The notification's payload; `None` for anything that is not a report (the channel is
    /// not ours alone: anyone with `NOTIFY` rights can write on it).
    pub fn parse(payload: &str) -> Option<Report> {
        let (instance, rest) = payload.split_once(' ')?;
        let (ms, per_s) = match rest.split_once(' ') {
            Some((ms, per_s)) => (ms, per_s.parse().ok()?),
            None => (rest, 0),
        };
        let ms: u64 = ms.parse().ok()?;
        if instance.is_empty() || instance.len() > 64 {
            return None;
        }
        Some(Report { instance: instance.to_string(), wait: Duration::from_millis(ms), per_s })
    }
}

/// Sends a worker's report (one round trip; delivered to the listeners at once, outside any
/// transaction).
pub async fn publish<C: GenericClient + Sync>(db: &C, instance: &str, wait: Duration, per_s: u32) -> Result<(), StoreError> {
    let payload = format!("{instance} {} {per_s}", wait.as_millis());
    let statement = db.prepare_cached("SELECT pg_notify($1, $2)").await?;
    db.execute(&statement, &[&CHANNEL, &payload]).await?;
    Ok(())
}

/// Connects to `url`, `LISTEN`s on [`CHANNEL`] and sends every report into `reports` until
/// the connection fails or `reports` is closed. A report that does not fit in the channel is
/// dropped: the next one follows within 50 ms.
pub async fn listen(url: &str, application_name: &str, reports: mpsc::Sender<Report>) -> Result<(), StoreError> {
    let mut url = DatabaseUrl::parse(url)?;
    if url.pg.get_application_name().is_none() {
        url.pg.application_name(application_name);
    }
    let tls = url.tls_connector()?;
    let (client, mut connection) = url.pg.connect(tls).await.map_err(StoreError::from_connect)?;
    let forward = reports.clone();
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if let Some(report) = Report::parse(n.payload()) {
                        if let Err(mpsc::error::TrySendError::Closed(_)) = forward.try_send(report) {
                            return Ok(());
                        }
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => return Ok(()),
            }
        }
    });
    let listened = client.batch_execute(&format!("LISTEN {CHANNEL}")).await;
    if let Err(e) = listened {
        driver.abort();
        return Err(e.into());
    }
    tokio::select! {
        ended = driver => match ended {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.into()),
            Err(e) => Err(StoreError::Misconfigured(format!("the LISTEN connection's task failed: {e}"))),
        },
        _ = reports.closed() => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_parse_and_anything_else_is_ignored() {
        assert_eq!(Report::parse("w1 250 1800"), Some(Report { instance: "w1".into(), wait: Duration::from_millis(250), per_s: 1_800 }));
        // An earlier build's report, without the rate.
        assert_eq!(Report::parse("w1 250"), Some(Report { instance: "w1".into(), wait: Duration::from_millis(250), per_s: 0 }));
        for bad in ["", "w1", "w1 ", " 250", "w1 -5", "w1 2.5", "w1 250 x", "w1 250 -1", "w1 250 1 2", &format!("{} 1", "x".repeat(65))] {
            assert_eq!(Report::parse(bad), None, "{bad:?}");
        }
    }
}
