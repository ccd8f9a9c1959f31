//! Slot health: what the relay exports as gauges and `railhook slot status` prints.
//!
//! Sampled from `pg_replication_slots` joined with `pg_stat_replication` (for the time of the
//! last Standby Status Update the server received), in one query, every few seconds by
//! whichever relay process is running (active or standby), so an operator sees the slot even
//! when no relay streams from it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{GaugeVec, Histogram, HistogramOpts, IntCounter, IntGauge, IntGaugeVec, Opts, Registry};
use serde::Serialize;
use tokio_postgres::Client;

use crate::RelayStats;

/// Values of `pg_replication_slots.wal_status`, plus `missing` when the slot does not exist.
pub const WAL_STATUSES: [&str; 5] = ["reserved", "extended", "unreserved", "lost", "missing"];

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlotHealth {
    pub slot: String,
    pub exists: bool,
    pub plugin: Option<String>,
    pub active: bool,
    pub active_pid: Option<i32>,
    /// `reserved`, `extended`, `unreserved`, `lost`, or `missing`.
    pub wal_status: String,
    /// `pg_current_wal_lsn() - confirmed_flush_lsn`.
    pub lag_bytes: Option<i64>,
    /// `pg_current_wal_lsn() - restart_lsn`: the WAL this slot keeps on disk.
    pub retained_bytes: Option<i64>,
    /// WAL that can still be written before the slot is in danger of losing its WAL; `None`
    /// when `max_slot_wal_keep_size = -1` (unlimited).
    pub safe_wal_size_bytes: Option<i64>,
    /// `max_slot_wal_keep_size` in bytes; -1 when unlimited.
    pub max_slot_wal_keep_size_bytes: i64,
    /// Seconds since the server last received a status update from the slot's walsender
    /// client (`pg_stat_replication.reply_time`); `None` when no walsender is attached.
    pub last_feedback_age_seconds: Option<f64>,
    pub confirmed_flush_lsn: Option<String>,
    pub restart_lsn: Option<String>,
    pub current_wal_lsn: String,
    /// The database the slot belongs to.
    pub database: Option<String>,
}

impl SlotHealth {
    pub fn is_lost(&self) -> bool {
        self.wal_status == "lost"
    }
}

const HEALTH_SQL: &str = "
WITH cur AS (SELECT pg_current_wal_lsn() AS lsn),
     keep AS (SELECT CASE WHEN setting::bigint < 0 THEN -1 ELSE setting::bigint * 1024 * 1024 END AS bytes
              FROM pg_settings WHERE name = 'max_slot_wal_keep_size')
SELECT s.slot_name IS NOT NULL, s.plugin::text, coalesce(s.active, false), s.active_pid,
       coalesce(s.wal_status, 'missing'),
       pg_wal_lsn_diff(cur.lsn, s.confirmed_flush_lsn)::bigint,
       pg_wal_lsn_diff(cur.lsn, s.restart_lsn)::bigint,
       s.safe_wal_size::bigint,
       keep.bytes,
       EXTRACT(EPOCH FROM clock_timestamp() - r.reply_time)::float8,
       s.confirmed_flush_lsn::text, s.restart_lsn::text, cur.lsn::text, s.database::text
FROM cur CROSS JOIN keep
LEFT JOIN pg_replication_slots s ON s.slot_name = $1
LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid";

/// One snapshot of the slot, in one round trip.
pub async fn slot_health(client: &Client, slot: &str) -> Result<SlotHealth, tokio_postgres::Error> {
    let row = client.query_one(HEALTH_SQL, &[&slot]).await?;
    Ok(SlotHealth {
        slot: slot.to_string(),
        exists: row.try_get(0)?,
        plugin: row.try_get(1)?,
        active: row.try_get(2)?,
        active_pid: row.try_get(3)?,
        wal_status: row.try_get(4)?,
        lag_bytes: row.try_get(5)?,
        retained_bytes: row.try_get(6)?,
        safe_wal_size_bytes: row.try_get(7)?,
        max_slot_wal_keep_size_bytes: row.try_get(8)?,
        last_feedback_age_seconds: row.try_get(9)?,
        confirmed_flush_lsn: row.try_get(10)?,
        restart_lsn: row.try_get(11)?,
        current_wal_lsn: row.try_get(12)?,
        database: row.try_get(13)?,
    })
}

/// The relay's Prometheus metrics. Counters are read from [`RelayStats`] at scrape time, the
/// gauges are set by [`RelayMetrics::observe`] from each health sample.
#[derive(Clone)]
pub struct RelayMetrics {
    pub stats: Arc<RelayStats>,
    lag: IntGaugeVec,
    retained: IntGaugeVec,
    active: IntGaugeVec,
    wal_status: IntGaugeVec,
    safe_wal_size: GaugeVec,
    max_keep: IntGauge,
    feedback_age: GaugeVec,
    pub standby: IntGauge,
    pub slot_lost: IntCounter,
    /// When the slot was last seen with a walsender, to keep the feedback age growing while
    /// no relay is attached.
    last_feedback: Arc<Mutex<Option<std::time::Instant>>>,
}

fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric")
}

impl RelayMetrics {
    pub fn new(stats: Arc<RelayStats>) -> RelayMetrics {
        RelayMetrics {
            stats,
            lag: gauge_vec("railhook_relay_slot_lag_bytes", "WAL bytes between the server's position and the slot's confirmed flush LSN.", &["slot"]),
            retained: gauge_vec("railhook_relay_slot_retained_bytes", "WAL bytes the slot keeps on disk (current LSN - restart_lsn).", &["slot"]),
            active: gauge_vec("railhook_relay_slot_active", "1 when a walsender streams from the slot.", &["slot"]),
            wal_status: gauge_vec("railhook_relay_slot_wal_status", "One-hot wal_status of the slot (missing: the slot does not exist).", &["slot", "status"]),
            safe_wal_size: GaugeVec::new(
                Opts::new("railhook_relay_slot_safe_wal_size_bytes", "WAL that can be written before the slot risks losing WAL (NaN when unlimited)."),
                &["slot"],
            )
            .expect("valid metric"),
            max_keep: IntGauge::new("railhook_relay_max_slot_wal_keep_size_bytes", "The server's max_slot_wal_keep_size in bytes; -1 when unlimited.").expect("valid metric"),
            feedback_age: GaugeVec::new(
                Opts::new("railhook_relay_last_feedback_age_seconds", "Seconds since Postgres last received a status update for the slot."),
                &["slot"],
            )
            .expect("valid metric"),
            standby: IntGauge::new("railhook_relay_standby", "1 while this relay waits as a standby because another relay holds the slot.").expect("valid metric"),
            slot_lost: IntCounter::new("railhook_relay_slot_lost_total", "Times the relay found its slot lost (wal_status 'lost') or dropped.").expect("valid metric"),
            last_feedback: Arc::new(Mutex::new(None)),
        }
    }

    /// Registers every collector; call once per registry.
    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.lag.clone()))?;
        registry.register(Box::new(self.retained.clone()))?;
        registry.register(Box::new(self.active.clone()))?;
        registry.register(Box::new(self.wal_status.clone()))?;
        registry.register(Box::new(self.safe_wal_size.clone()))?;
        registry.register(Box::new(self.max_keep.clone()))?;
        registry.register(Box::new(self.feedback_age.clone()))?;
        registry.register(Box::new(self.standby.clone()))?;
        registry.register(Box::new(self.slot_lost.clone()))?;
        registry.register(Box::new(self.stats.commit_to_ack.clone()))?;
        registry.register(Box::new(StatsCollector::new(self.stats.clone())))?;
        Ok(())
    }

    /// Sets the gauges from one sample.
    pub fn observe(&self, h: &SlotHealth) {
        let slot = h.slot.as_str();
        let or_zero = |v: Option<i64>| v.unwrap_or(0);
        self.lag.with_label_values(&[slot]).set(or_zero(h.lag_bytes));
        self.retained.with_label_values(&[slot]).set(or_zero(h.retained_bytes));
        self.active.with_label_values(&[slot]).set(h.active as i64);
        for status in WAL_STATUSES {
            self.wal_status.with_label_values(&[slot, status]).set((h.wal_status == status) as i64);
        }
        self.safe_wal_size.with_label_values(&[slot]).set(h.safe_wal_size_bytes.map(|v| v as f64).unwrap_or(f64::NAN));
        self.max_keep.set(h.max_slot_wal_keep_size_bytes);
        let mut last = self.last_feedback.lock().unwrap_or_else(|e| e.into_inner());
        let age = match h.last_feedback_age_seconds {
            Some(age) => {
                *last = Some(std::time::Instant::now() - Duration::from_secs_f64(age.max(0.0)));
                age.max(0.0)
            }
            // No walsender: the age keeps growing from the last reply this process saw.
            None => last.map(|t| t.elapsed().as_secs_f64()).unwrap_or(f64::NAN),
        };
        self.feedback_age.with_label_values(&[slot]).set(age);
    }
}

/// Exposes the [`RelayStats`] counters.
struct StatsCollector {
    stats: Arc<RelayStats>,
    produced: IntCounter,
    errors: IntCounter,
    read: IntCounter,
    live: IntGauge,
    in_flight: IntGauge,
    descs: Vec<Desc>,
}

impl StatsCollector {
    fn new(stats: Arc<RelayStats>) -> StatsCollector {
        let produced = IntCounter::new("railhook_relay_messages_produced_total", "Outbox announcements Kafka acknowledged.").expect("valid metric");
        let errors = IntCounter::new("railhook_relay_produce_errors_total", "Announcements Kafka refused (the relay restarts from the slot).").expect("valid metric");
        let read = IntCounter::new("railhook_relay_outbox_rows_read_total", "Outbox inserts read from the stream (or claimed by the poller).").expect("valid metric");
        let live = IntGauge::new("railhook_relay_stream_live", "1 while this relay streams from the slot and its liveness marker came back.").expect("valid metric");
        let in_flight = IntGauge::new("railhook_relay_messages_in_flight", "Announcements handed to the producer that Kafka has not acknowledged yet.").expect("valid metric");
        let mut descs: Vec<Desc> = [&produced, &errors, &read].iter().flat_map(|c| c.desc().into_iter().cloned()).collect();
        descs.extend(live.desc().into_iter().cloned());
        descs.extend(in_flight.desc().into_iter().cloned());
        StatsCollector { stats, produced, errors, read, live, in_flight, descs }
    }
}

impl Collector for StatsCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let sync = |c: &IntCounter, v: u64| {
            let cur = c.get();
            if v > cur {
                c.inc_by(v - cur);
            }
        };
        sync(&self.produced, self.stats.produced.load(Ordering::Relaxed));
        sync(&self.errors, self.stats.produce_errors.load(Ordering::Relaxed));
        sync(&self.read, self.stats.read.load(Ordering::Relaxed));
        self.live.set(self.stats.live.load(Ordering::Relaxed) as i64);
        let mut families: Vec<MetricFamily> = [&self.produced, &self.errors, &self.read].iter().flat_map(|c| c.collect()).collect();
        families.extend(self.live.collect());
        self.in_flight.set(self.stats.in_flight.load(Ordering::Relaxed) as i64);
        families.extend(self.in_flight.collect());
        families
    }
}

/// The commit-to-ack histogram's buckets, seconds.
pub fn commit_to_ack_histogram() -> Histogram {
    Histogram::with_opts(
        HistogramOpts::new("railhook_relay_commit_to_ack_seconds", "From an outbox insert's commit to Kafka's acknowledgement of its announcement.")
            .buckets(vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]),
    )
    .expect("valid metric")
}

/// Lag above which the sampler writes a heartbeat into the WAL.
pub const HEARTBEAT_LAG_BYTES: i64 = 64 * 1024;

/// Samples the slot every `every` until `shutdown`, on its own connection.
///
/// Heartbeat: when a relay streams from the slot and its lag exceeds [`HEARTBEAT_LAG_BYTES`],
/// the sampler writes a non-transactional logical message (`pg_logical_emit_message`,
/// prefix `railhook.heartbeat`). WAL of other tables produces nothing on the stream and the
/// server sends keepalives rarely while the relay keeps answering, so without it an idle
/// outbox in a busy database would pin WAL. The relay confirms the message's position when
/// nothing is in flight.
pub async fn sample_loop(url: String, metrics: RelayMetrics, slot: String, every: Duration, shutdown: tokio_util::sync::CancellationToken) {
    let mut client: Option<Client> = None;
    loop {
        if let Some(c) = crate::reconnect(&url, &mut client, "slot health").await {
            match slot_health(c, &slot).await {
                Ok(h) => {
                    metrics.observe(&h);
                    if h.active && h.lag_bytes.unwrap_or(0) > HEARTBEAT_LAG_BYTES {
                        if let Err(e) = c.execute("SELECT pg_logical_emit_message(false, 'railhook.heartbeat', '')", &[]).await {
                            tracing::warn!(error = %e, "slot health: heartbeat failed");
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "slot health: sampling failed"),
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(status: &str) -> SlotHealth {
        SlotHealth {
            slot: "s".into(),
            exists: status != "missing",
            plugin: Some("pgoutput".into()),
            active: true,
            active_pid: Some(1),
            wal_status: status.into(),
            lag_bytes: Some(42),
            retained_bytes: Some(4242),
            safe_wal_size_bytes: None,
            max_slot_wal_keep_size_bytes: -1,
            last_feedback_age_seconds: Some(1.5),
            confirmed_flush_lsn: None,
            restart_lsn: None,
            current_wal_lsn: "0/0".into(),
            database: None,
        }
    }

    #[test]
    fn gauges_follow_the_sample_and_wal_status_is_one_hot() {
        let stats = Arc::new(RelayStats::default());
        let metrics = RelayMetrics::new(stats.clone());
        let registry = Registry::new();
        metrics.register(&registry).unwrap();
        metrics.observe(&sample("extended"));
        stats.produced.store(7, Ordering::Relaxed);
        let text = {
            let mut buf = Vec::new();
            prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &registry.gather(), &mut buf).unwrap();
            String::from_utf8(buf).unwrap()
        };
        assert!(text.contains("railhook_relay_slot_lag_bytes{slot=\"s\"} 42"), "{text}");
        assert!(text.contains("railhook_relay_slot_retained_bytes{slot=\"s\"} 4242"));
        assert!(text.contains("railhook_relay_slot_wal_status{slot=\"s\",status=\"extended\"} 1"));
        assert!(text.contains("railhook_relay_slot_wal_status{slot=\"s\",status=\"reserved\"} 0"));
        assert!(text.contains("railhook_relay_slot_safe_wal_size_bytes{slot=\"s\"} NaN"));
        assert!(text.contains("railhook_relay_messages_produced_total 7"));
        assert!(text.contains("railhook_relay_last_feedback_age_seconds{slot=\"s\"} 1.5"));
        metrics.observe(&sample("lost"));
        let families = registry.gather();
        let wal = families.iter().find(|f| f.name() == "railhook_relay_slot_wal_status").unwrap();
        let ones: Vec<_> = wal.get_metric().iter().filter(|m| m.get_gauge().get_value() == 1.0).collect();
        assert_eq!(ones.len(), 1);
        assert!(ones[0].get_label().iter().any(|l| l.value() == "lost"));
    }
}
