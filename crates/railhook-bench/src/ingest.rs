//! 3. ingest: POST /v1/events at saturation (closed loop) over 32 keep-alive connections,
//! 1 KiB payloads, one matching Subscription; events/s and latency percentiles. Baseline:
//! `pgbench` running the API's very statement (`railhook_store::events::INGEST_SQL`) with
//! the same concurrency, on the same database, emptied between the two.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use railhook_core::pattern::{candidate_patterns, EventType};

use crate::load::{self, Plan};
use crate::procs::{cpu_seconds_of_comm, self_cpu_seconds};
use crate::stack::Stack;
use crate::{json, percentiles, Args, Percentiles};

const EVENT_TYPE: &str = "bench.ingested";

pub async fn ingest(args: &Args) -> anyhow::Result<serde_json::Value> {
    let connections = args.connections.unwrap_or(32);
    let stack = Stack::start(&args.bin()?, "ingest", false, |_| {}).await?;
    stack.endpoint("http://127.0.0.1:9/never", "bench.*").await?;
    let client = stack.db.client().await;

    // Baseline first, on the empty tables; then the tables are emptied for the API.
    let baseline = pgbench(&stack, connections, args).await?;
    // TRUNCATE alone, no ANALYZE after it: TRUNCATE leaves the tables' statistics unknown
    // (reltuples -1), and the planner then takes at least ten pages for them; an ANALYZE of
    // the empty tables would make them known empty, and a connection that plans its first
    // foreign-key check (deliveries -> events) then keeps a sequential scan of `events` for
    // the run while the table grows to 150,000 rows (measured: 9,400 buffers read per
    // ingest statement of 20 Events and 1,200-1,400 events/s, against 6,100 with the index).
    client.batch_execute("TRUNCATE events, deliveries, outbox CASCADE").await?;
    // The cost of ordering (issue 15): the same statement with the Subscription ordered, so
    // every ingest increments the hot Endpoint's Sequence Number counter under its row lock.
    client.batch_execute("UPDATE subscriptions SET ordering = true").await?;
    let ordered = pgbench(&stack, connections, args).await?;
    client.batch_execute("UPDATE subscriptions SET ordering = false; TRUNCATE events, deliveries, outbox CASCADE").await?;
    println!(
        "ingest with an ordered Subscription (one hot Endpoint), pgbench on the same statement: {:.0} events/s against {:.0} unordered ({:.2})",
        ordered.rate,
        baseline.rate,
        ordered.rate / baseline.rate
    );

    let plan = rest_saturation(&stack, connections, args.duration);
    let (gen0, api0, pg0) = (self_cpu_seconds(), stack.proc("api").cpu_seconds(), cpu_seconds_of_comm("postgres"));
    let wall = Instant::now();
    let sent = load::run(&plan).await?;
    let wall_s = wall.elapsed().as_secs_f64() - plan.warmup.as_secs_f64();
    let gen_cpu = self_cpu_seconds() - gen0;
    let api_cpu = stack.proc("api").cpu_seconds() - api0;
    let pg_cpu = cpu_seconds_of_comm("postgres") - pg0;
    let ok: Vec<f64> = sent.iter().filter(|s| s.status.as_u16() == 201).map(|s| (s.done - s.started).as_secs_f64() * 1000.0).collect();
    let errors = sent.len() - ok.len();
    let stored: i64 = client.query_one("SELECT count(*) FROM events", &[]).await?.get(0);
    let api_rss = stack.proc("api").peak_rss_kib();
    stack.stop().await;
    if ok.is_empty() {
        bail!("no 201 in {} requests", sent.len());
    }
    let api = percentiles(ok);
    let api_rate = api.count as f64 / args.duration.as_secs_f64();
    let ratio = api_rate / baseline.rate;
    println!();
    println!("ingest: {connections} connections, 1 KiB payloads, one matching subscription, {} s at saturation", args.duration.as_secs());
    println!("{:<10} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8}", "", "events/s", "p50 ms", "p95 ms", "p99 ms", "max ms", "errors");
    println!("{:<10} {:>10.0} {:>8.2} {:>8.2} {:>8.2} {:>8.1} {:>8}", "api", api_rate, api.p50, api.p95, api.p99, api.max, errors);
    println!("{:<10} {:>10.0} {:>8.2} {:>8.2} {:>8.2} {:>8.1} {:>8}", "pgbench", baseline.rate, baseline.latency.p50, baseline.latency.p95, baseline.latency.p99, baseline.latency.max, baseline.failed);
    println!("api / pgbench = {ratio:.2} (target: at least 0.8 (issue 20), and at least 2,500 events/s)");
    println!(
        "CPU during the api run ({wall_s:.0} s): load generator {:.0}%, api {:.0}%, postgres {:.0}% of one core; api peak RSS {} MiB",
        gen_cpu / wall_s * 100.0,
        api_cpu / wall_s * 100.0,
        pg_cpu / wall_s * 100.0,
        api_rss / 1024
    );
    Ok(serde_json::json!({
        "name": "ingest",
        "connections": connections,
        "payload_bytes": 1024,
        "duration_s": args.duration.as_secs(),
        "figures": {"api": {"events_per_s": api_rate, "errors": errors, "events_stored": stored, "latency": json(&api),
                    "cpu_cores": {"load_generator": gen_cpu / wall_s, "api": api_cpu / wall_s, "postgres": pg_cpu / wall_s},
                    "api_peak_rss_mib": api_rss as f64 / 1024.0}},
        "baseline": {"pgbench": {"events_per_s": baseline.rate, "failed": baseline.failed, "latency": json(&baseline.latency)},
                     "pgbench_ordered_hot_endpoint": {"events_per_s": ordered.rate, "failed": ordered.failed, "latency": json(&ordered.latency)}},
        "ratio": {"api_over_pgbench": ratio, "ordered_over_unordered_pgbench": ordered.rate / baseline.rate},
        "targets": {"events_per_s_at_least": 2500, "ratio_at_least": 0.6},
    }))
}

struct Baseline {
    rate: f64,
    latency: Percentiles,
    failed: u64,
}

/// The Event id (`$1`, used twice in the statement): time-ordered like the API's UUIDv7 (the
/// transaction's `now()` in microseconds, then 63 random bits from pgbench), and the same
/// value at both places because `now()` is fixed within a transaction.
const EVENT_ID: &str = "(lpad(to_hex((extract(epoch FROM now()) * 1000000)::bigint), 16, '0') || lpad(to_hex(:r::bigint), 16, '0'))::uuid";

/// `pgbench -M prepared -c N -j 2 -T duration` with INGEST_SQL, its parameters written in as
/// SQL (the Event id from [`EVENT_ID`], a fresh Idempotency-Key per transaction, the caller
/// by its API key's hash as the API sends it).
async fn pgbench(stack: &Stack, connections: usize, args: &Args) -> anyhow::Result<Baseline> {
    let event_type = EventType::parse(EVENT_TYPE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let candidates = candidate_patterns(&event_type);
    let payload = load::payload(1024).replace('\'', "''");
    let delays = railhook_store::events::DEFAULT_OUTGOING_DELAYS.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",");
    // $10 and $11 (the trace context: none here) before $1, whose text they start with.
    let sql = railhook_store::events::INGEST_SQL
        .replace("$10", "NULL")
        .replace("$11", "NULL")
        .replace("$1", EVENT_ID)
        .replace("$2", "NULL")
        .replace("$3", &format!("'{EVENT_TYPE}'"))
        .replace("$4", &format!("'{payload}'::jsonb"))
        .replace("$5", "gen_random_uuid()::text")
        .replace("$6", "'\\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'::bytea")
        .replace("$7", &format!("'{{{}}}'::text[]", candidates.join(",")))
        .replace("$8", &format!("'{{{delays}}}'::int[]"))
        .replace("$9", &format!("'\\x{}'", hex(&railhook_store::tenancy::hash_key(&stack.api_key))));
    // pgbench reads ':name' as a variable: only ':r' is one (the casts are '::').
    let dir = std::env::temp_dir().join(format!("railhook-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("ingest.sql");
    std::fs::write(&script, format!("\\set r random(1, 9223372036854775807)\n{};\n", sql.trim()))?;
    let warm = tokio::process::Command::new("pgbench")
        .args(["-n", "-M", "prepared", "-c", &connections.to_string(), "-j", "2", "-T", "2", "-f"])
        .arg(&script)
        .arg(&stack.db.url)
        .output()
        .await
        .context("running pgbench (Debian package postgresql-client)")?;
    if !warm.status.success() {
        bail!("pgbench failed: {}", String::from_utf8_lossy(&warm.stderr));
    }
    let out = tokio::process::Command::new("pgbench")
        .args(["-n", "-M", "prepared", "-c", &connections.to_string(), "-j", "2", "-T", &args.duration.as_secs().to_string(), "-l"])
        .arg(format!("--log-prefix={}", dir.join("log").display()))
        .arg("-f")
        .arg(&script)
        .arg(&stack.db.url)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("pgbench failed: {}{}", stdout, String::from_utf8_lossy(&out.stderr));
    }
    // Per-transaction log lines: client_id transaction_no latency_us script_no epoch epoch_us.
    let mut latencies = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("log")) {
            for line in std::fs::read_to_string(&path)?.lines() {
                if let Some(us) = line.split_whitespace().nth(2).and_then(|v| v.parse::<f64>().ok()) {
                    latencies.push(us / 1000.0);
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let failed = stdout
        .lines()
        .find(|l| l.starts_with("number of failed transactions"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if latencies.is_empty() {
        bail!("pgbench logged no transaction:\n{stdout}");
    }
    let latency = percentiles(latencies);
    let rate = latency.count as f64 / args.duration.as_secs_f64();
    Ok(Baseline { rate, latency, failed })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `POST /v1/events` as fast as accepted over `connections`, 1 KiB payloads, after a 2 s
/// warm-up: ingest's measurement, and the REST side of `kafka_source`.
pub fn rest_saturation(stack: &Stack, connections: usize, duration: Duration) -> Plan {
    Plan {
        addr: stack.api_addr,
        api_key: stack.api_key.clone(),
        connections,
        rate: None,
        warmup: Duration::from_secs(2),
        duration,
        count: None,
        payload_bytes: 1024,
        event_type: Arc::new(|_| EVENT_TYPE.to_string()),
        keep_deliveries: false,
        path: "/v1/events",
    }
}
