//! 1. relay_latency and 2. relay_throughput: the relay alone, in process.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures::StreamExt;
use railhook_config::{Config, RelayMode};
use railhook_relay::{RelayMetrics, RelayStats};
use railhook_testkit::{test_config, TestDb};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::Message;
use tokio_util::sync::CancellationToken;

use crate::{json, percentiles, Args, Percentiles};

/// 1. relay_latency: outbox rows committed at a fixed rate (one row per transaction, as one
/// ingest with one subscription writes), a consumer recording when each becomes visible in
/// Kafka; latency = visible minus the moment the client's commit returned. CDC first, then
/// the polling relay (the baseline) on a fresh database, in the same invocation.
pub async fn relay_latency(args: &Args) -> anyhow::Result<serde_json::Value> {
    let cdc = latency_run(RelayMode::Cdc, args).await?;
    let poll = latency_run(RelayMode::Poll, args).await?;
    let ratio = poll.p50 / cdc.p50.max(0.001);
    println!();
    println!("relay_latency: {} rows/s for {:?}, commit returned -> visible in Kafka (ms)", args.rate, args.duration);
    println!("{:<6} {:>8} {:>9} {:>9} {:>9} {:>9}", "mode", "rows", "p50", "p95", "p99", "max");
    for (mode, p) in [("cdc", &cdc), ("poll", &poll)] {
        println!("{:<6} {:>8} {:>9.1} {:>9.1} {:>9.1} {:>9.1}", mode, p.count, p.p50, p.p95, p.p99, p.max);
    }
    println!("poll p50 / cdc p50 = {ratio:.1}x (target: at least 20x; cdc p50 < 20 ms, p99 < 100 ms)");
    Ok(serde_json::json!({
        "name": "relay_latency",
        "rate_per_s": args.rate,
        "duration_s": args.duration.as_secs(),
        "figures": {"cdc": json(&cdc)},
        "baseline": {"poll": json(&poll)},
        "ratio": {"poll_p50_over_cdc_p50": ratio, "poll_p99_over_cdc_p99": poll.p99 / cdc.p99.max(0.001)},
        "targets": {"cdc_p50_ms_under": 20, "cdc_p99_ms_under": 100, "ratio_at_least": 20},
    }))
}

async fn latency_run(mode: RelayMode, args: &Args) -> anyhow::Result<Percentiles> {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.relay.mode = mode;
    config.kafka.partitions = 6;
    let config = Arc::new(config);
    let metrics = RelayMetrics::new(Arc::new(RelayStats::default()));
    let stop = CancellationToken::new();
    let relay = tokio::spawn(railhook_relay::run(config.clone(), metrics.clone(), stop.clone()));
    railhook_kafka::ensure_topics(&config.kafka, &[config.deliveries_topic(), config.forwards_topic()]).await?;
    if mode == RelayMode::Cdc {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !metrics.stats.live.load(Ordering::Relaxed) {
            if Instant::now() > deadline || relay.is_finished() {
                bail!("the CDC relay did not go live");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // The consumer, subscribed and assigned before the load starts.
    let consumer: StreamConsumer = railhook_kafka::client_config(&config.kafka)
        .set("group.id", format!("{}bench", config.kafka.topic_prefix))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "5")
        .set("topic.metadata.refresh.interval.ms", "500")
        .create()?;
    consumer.subscribe(&[&config.deliveries_topic()])?;
    let seen: Arc<Mutex<HashMap<i64, Instant>>> = Arc::default();
    let reader = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut stream = consumer.stream();
            while let Some(Ok(m)) = stream.next().await {
                let at = Instant::now();
                if let Ok(v) = serde_json::from_slice::<serde_json::Value>(m.payload().unwrap_or_default()) {
                    if let Some(id) = v["outbox_id"].as_i64() {
                        seen.lock().unwrap().entry(id).or_insert(at);
                    }
                }
            }
        })
    };
    let committed = load(&config, args.rate, args.duration).await?;
    let want = committed.len();
    let deadline = Instant::now() + Duration::from_secs(60);
    while committed.keys().filter(|id| seen.lock().unwrap().contains_key(id)).count() < want {
        if Instant::now() > deadline {
            bail!("{mode:?}: not every row became visible within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    reader.abort();
    stop.cancel();
    relay.await??;
    let seen = seen.lock().unwrap();
    let ms: Vec<f64> = committed.iter().map(|(id, at)| seen[id].saturating_duration_since(*at).as_secs_f64() * 1000.0).collect();
    if mode == RelayMode::Cdc {
        let client = db.client().await;
        client.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", &[&config.relay.slot_name]).await.ok();
    }
    Ok(percentiles(ms))
}

/// Commits `rate` single-row transactions per second for `duration` over 4 connections;
/// returns each outbox id with the instant its commit returned. The first second is a warm-up
/// and not returned.
async fn load(config: &Config, rate: u64, duration: Duration) -> anyhow::Result<HashMap<i64, Instant>> {
    const CONNECTIONS: u64 = 4;
    let per = (rate / CONNECTIONS).max(1);
    let started = Instant::now();
    let warmup = Duration::from_secs(1);
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        let url = config.database.url.clone();
        tasks.push(tokio::spawn(async move {
            let (client, conn) = railhook_store::connect(&url).await?;
            let statement = client
                .prepare("INSERT INTO outbox (project_id, delivery_id, routing_id, reason) VALUES ($1, $2, $3, 'created') RETURNING id")
                .await?;
            let project = uuid::Uuid::now_v7();
            let routes: Vec<uuid::Uuid> = (0..50).map(|_| uuid::Uuid::now_v7()).collect();
            let mut tick = tokio::time::interval(Duration::from_nanos(1_000_000_000 / per));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut out = Vec::new();
            let mut n = 0usize;
            while started.elapsed() < duration + warmup {
                tick.tick().await;
                let row = client.query_one(&statement, &[&project, &uuid::Uuid::now_v7(), &routes[n % routes.len()]]).await?;
                let at = Instant::now();
                if started.elapsed() > warmup {
                    out.push((row.get::<_, i64>(0), at));
                }
                n += 1;
            }
            conn.abort();
            Ok::<_, anyhow::Error>(out)
        }));
    }
    let mut all = HashMap::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(all)
}

/// 2. relay_throughput: with no relay running, commit a backlog of `--rows` outbox rows in
/// transactions of 5 (one event for five endpoints), then start the CDC relay and measure
/// rows/s until Kafka acknowledged them all. Baseline: `pg_recvlogical` decoding the same WAL
/// range with pgoutput (same publication) to /dev/null, from a second slot created at the
/// same point.
pub async fn relay_throughput(args: &Args) -> anyhow::Result<serde_json::Value> {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.kafka.partitions = 6;
    let config = Arc::new(config);
    let client = db.client().await;
    let baseline_slot = format!("{}_base", config.relay.slot_name);
    client.batch_execute(&format!("CREATE PUBLICATION {} FOR TABLE outbox WITH (publish = 'insert')", config.relay.publication_name)).await?;
    client.execute("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", &[&config.relay.slot_name]).await?;
    client.execute("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", &[&baseline_slot]).await?;
    railhook_kafka::ensure_topics(&config.kafka, &[config.deliveries_topic(), config.forwards_topic()]).await?;

    let txns = args.rows.div_ceil(5);
    let started = Instant::now();
    client
        .batch_execute(&format!(
            "DO $$
             DECLARE p uuid := gen_random_uuid();
             BEGIN
               FOR i IN 1..{txns} LOOP
                 INSERT INTO outbox (project_id, delivery_id, routing_id, reason)
                 SELECT p, gen_random_uuid(), ('00000000-0000-7000-8000-' || lpad((i % 50 + n)::text, 12, '0'))::uuid, 'created'
                 FROM generate_series(1, 5) n;
                 COMMIT;
               END LOOP;
             END $$"
        ))
        .await?;
    let backlog_s = started.elapsed().as_secs_f64();
    let rows = txns * 5;
    let end_lsn: String = client.query_one("SELECT pg_current_wal_lsn()::text", &[]).await?.get(0);
    println!("relay_throughput: backlog of {rows} rows in {txns} transactions committed in {backlog_s:.1} s");

    // Railhook: the CDC relay from the slot to Kafka acknowledgements.
    let metrics = RelayMetrics::new(Arc::new(RelayStats::default()));
    let stop = CancellationToken::new();
    let started = Instant::now();
    let relay = tokio::spawn(railhook_relay::run(config.clone(), metrics.clone(), stop.clone()));
    while metrics.stats.produced.load(Ordering::Relaxed) < rows {
        if relay.is_finished() {
            bail!("the relay stopped: {:?}", relay.await);
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("the relay did not catch up within 600 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let relay_s = started.elapsed().as_secs_f64();
    stop.cancel();
    relay.await??;

    // Baseline: pg_recvlogical over the same range.
    let started = Instant::now();
    let status = tokio::process::Command::new("pg_recvlogical")
        .args(["-d", &config.database.url, "--slot", &baseline_slot, "--start", "-E", &end_lsn, "-f", "/dev/null", "--no-loop"])
        .args(["-o", "proto_version=1", "-o", &format!("publication_names={}", config.relay.publication_name)])
        .status()
        .await
        .context("running pg_recvlogical (Debian package postgresql-client)")?;
    if !status.success() {
        bail!("pg_recvlogical failed: {status}");
    }
    let baseline_s = started.elapsed().as_secs_f64();
    for slot in [&config.relay.slot_name, &baseline_slot] {
        client.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", &[slot]).await.ok();
    }
    let relay_rate = rows as f64 / relay_s;
    let baseline_rate = rows as f64 / baseline_s;
    println!();
    println!("relay_throughput: {rows} backlog rows, slot -> acknowledged by Kafka");
    println!("{:<16} {:>10} {:>12}", "", "seconds", "rows/s");
    println!("{:<16} {:>10.2} {:>12.0}", "railhook relay", relay_s, relay_rate);
    println!("{:<16} {:>10.2} {:>12.0}", "pg_recvlogical", baseline_s, baseline_rate);
    println!("relay / pg_recvlogical = {:.2} (target: at least 0.5, and at least 30,000 rows/s)", relay_rate / baseline_rate);
    Ok(serde_json::json!({
        "name": "relay_throughput",
        "rows": rows,
        "transactions": txns,
        "figures": {"relay": {"seconds": relay_s, "rows_per_s": relay_rate}},
        "baseline": {"pg_recvlogical": {"seconds": baseline_s, "rows_per_s": baseline_rate}},
        "ratio": {"relay_over_pg_recvlogical": relay_rate / baseline_rate},
        "targets": {"rows_per_s_at_least": 30000, "ratio_at_least": 0.5},
    }))
}
