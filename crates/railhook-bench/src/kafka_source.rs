//! kafka_source (issue 33): Events ingested from a Kafka topic by the Kafka source
//! (`railhook worker` with `kafka_source.topics`), against `POST /v1/events` at saturation,
//! on the same database in the same run, with the same 1 KiB payload and one matching
//! Subscription.
//!
//! 1. REST: the `ingest` benchmark's closed loop (32 keep-alive connections) for
//!    `--duration`, against `railhook api`; events/s = 201s / duration.
//! 2. The tables are emptied. As many records as the REST phase stored (at least 10,000, at
//!    most 200,000) are produced to a topic of 6 partitions (JSON envelopes, no idempotency
//!    key: the record's position is its key), then a `railhook worker` with the source starts
//!    and catches up that backlog. Records/s = the Events committed after the first batch's
//!    transaction started and before the last one's, over that span (`events.created_at`,
//!    the transactions' start time on the database's clock): the consumer's group join and
//!    start-up are outside it.
//!
//! Ratio: `kafka_source_over_rest` (target at least 1.5: the source batches records into one
//! transaction where the API commits each Event on its own).

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rdkafka::producer::FutureRecord;

use crate::load;
use crate::procs::{cpu_seconds_of_comm, Proc};
use crate::stack::{log_dir, Stack};
use crate::{json, percentiles, Args};

const EVENT_TYPE: &str = "bench.ingested";
const TOPIC: &str = "bench.events";

pub async fn run(args: &Args) -> anyhow::Result<serde_json::Value> {
    let connections = args.connections.unwrap_or(32);
    let bin = args.bin()?;
    let mut stack = Stack::start(&bin, "kafka_source", false, |_| {}).await?;
    stack.endpoint("http://127.0.0.1:9/never", "bench.*").await?;
    let client = stack.db.client().await;

    // 1. REST.
    let plan = crate::ingest::rest_saturation(&stack, connections, args.duration);
    let pg0 = cpu_seconds_of_comm("postgres");
    let sent = load::run(&plan).await?;
    let rest_pg_cpu = cpu_seconds_of_comm("postgres") - pg0;
    let ok: Vec<f64> = sent.iter().filter(|s| s.status.as_u16() == 201).map(|s| (s.done - s.started).as_secs_f64() * 1000.0).collect();
    if ok.is_empty() {
        bail!("no 201 in {} requests", sent.len());
    }
    let rest = percentiles(ok);
    let rest_rate = rest.count as f64 / args.duration.as_secs_f64();
    client.batch_execute("TRUNCATE events, deliveries, outbox CASCADE").await?;
    client.batch_execute("VACUUM ANALYZE events, deliveries, outbox").await?;

    // 2. The backlog, then the source.
    let project: uuid::Uuid = client.query_one("SELECT id FROM projects LIMIT 1", &[]).await?.get(0);
    let project = railhook_core::ProjectId(project).to_string();
    let records = ((rest_rate * args.duration.as_secs_f64()) as usize).clamp(10_000, 200_000);
    let mut config = stack.config.clone();
    let topic = format!("{}{TOPIC}", config.kafka.topic_prefix);
    railhook_kafka::ensure_topics(&config.kafka, std::slice::from_ref(&topic)).await?;
    let producer = railhook_kafka::idempotent_producer(&config.kafka, 100_000)?;
    let payload = load::payload(1024);
    let produced = Instant::now();
    for chunk in (0..records).collect::<Vec<_>>().chunks(5_000) {
        let sends = chunk.iter().map(|i| {
            let value = format!(r#"{{"type":"{EVENT_TYPE}","payload":{payload}}}"#);
            let key = i.to_string();
            let producer = &producer;
            let topic = &topic;
            async move { producer.send(FutureRecord::to(topic).key(&key).payload(&value), Duration::from_secs(30)).await.map_err(|(e, _)| e) }
        });
        for r in futures::future::join_all(sends).await {
            r.context("producing the backlog")?;
        }
    }
    println!("kafka_source: {records} records produced to {topic} in {:.1?}", produced.elapsed());
    config.kafka_source.topics = vec![TOPIC.to_string()];
    config.kafka_source.project = project;
    config.kafka_source.group_id = format!("{}kafka-source", config.kafka.topic_prefix);
    let (pg0, started) = (cpu_seconds_of_comm("postgres"), Instant::now());
    let worker = Proc::spawn(&bin, &config, "worker", &["worker"], &log_dir("kafka_source"))?;
    stack.procs.push(worker);
    let deadline = Instant::now() + Duration::from_secs(120 + records as u64 / 200);
    loop {
        stack.check_running()?;
        let n: i64 = client.query_one("SELECT count(*) FROM events", &[]).await?.get(0);
        if n as usize >= records {
            break;
        }
        if Instant::now() > deadline {
            bail!("the Kafka source ingested {n} of {records} records before the deadline");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let wall = started.elapsed().as_secs_f64();
    let worker_cpu = stack.proc("worker").cpu_seconds();
    let source_pg_cpu = cpu_seconds_of_comm("postgres") - pg0;
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE created_at < (SELECT max(created_at) FROM events)),
                    extract(epoch FROM max(created_at) - min(created_at))::float8,
                    count(DISTINCT created_at),
                    (SELECT count(*) FROM deliveries)
             FROM events",
            &[],
        )
        .await?;
    let (before_last, span_s, batches, deliveries): (i64, f64, i64, i64) = (row.get(0), row.get(1), row.get(2), row.get(3));
    stack.stop().await;
    if span_s <= 0.0 {
        bail!("the Kafka source ingested {records} records in one transaction: no span to measure (use a longer --duration)");
    }
    let source_rate = before_last as f64 / span_s;
    let ratio = source_rate / rest_rate;
    println!();
    println!("kafka_source: 1 KiB payloads, one matching Subscription; REST {connections} connections for {} s; Kafka source catching up {records} records (6 partitions)", args.duration.as_secs());
    println!("{:<14} {:>12} {:>10}", "", "events/s", "pg CPU");
    println!("{:<14} {:>12.0} {:>9.2}c", "POST /v1/events", rest_rate, rest_pg_cpu / args.duration.as_secs_f64());
    println!("{:<14} {:>12.0} {:>9.2}c", "kafka source", source_rate, source_pg_cpu / wall);
    println!("kafka_source / rest = {ratio:.2} (target: at least 1.5); {batches} transactions, {:.0} records each on average; {deliveries} Deliveries; worker CPU {worker_cpu:.1} s over {wall:.1} s", records as f64 / batches.max(1) as f64);
    Ok(serde_json::json!({
        "name": "kafka_source",
        "connections": connections,
        "payload_bytes": 1024,
        "duration_s": args.duration.as_secs(),
        "records": records,
        "figures": {
            "kafka_source": {"events_per_s": source_rate, "span_s": span_s, "transactions": batches, "records_per_transaction": records as f64 / batches.max(1) as f64,
                             "deliveries": deliveries, "wall_s_from_start": wall, "worker_cpu_s": worker_cpu, "postgres_cpu_cores": source_pg_cpu / wall},
            "rest": {"events_per_s": rest_rate, "latency": json(&rest), "postgres_cpu_cores": rest_pg_cpu / args.duration.as_secs_f64()},
        },
        "ratio": {"kafka_source_over_rest": ratio},
        "targets": {"ratio_at_least": 1.5},
    }))
}
