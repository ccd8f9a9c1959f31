//! The `replay` phase (issue 17: "a replay of 100,000 Events must not raise the live e2e p99
//! of another Endpoint by more than 20 %"), on a clean stack of its own:
//!
//! - Endpoint A (`bench.history`) gets [`HISTORY`] Events as already-delivered history,
//!   inserted in bulk with SQL (Events spread over the last hour, each with its SUCCESS
//!   Delivery to A), as a month of traffic would have left them.
//! - Endpoint B (`bench.live`) gets live Events at a fixed light rate (`--replay-live-rate`,
//!   default 150/s), latency from the 201 to the receiver's arrival.
//! - Baseline: B's live traffic for `--duration` seconds with no Replay before the Replay and
//!   as long again after it ended (pooled: a drift of the shared machine over the run then
//!   falls on both sides). Between them a Replay of A's 100,000 Events runs
//!   (`POST /v1/replays`) and B's live traffic goes on in 10 s windows until every replayed
//!   Delivery reached A (capped at [`REPLAY_CAP`]); the windows' samples together are "with
//!   replay". The ratio of the two p99s is the figure; the target is 1.2.
//! - The Replay's own pace: Deliveries made per second (creation to `finished_at`) and
//!   delivered per second (creation to A's last arrival), with the `replay.batch_size`,
//!   `replay.pause_ms` and `replay.max_deliveries_per_second` it ran under
//!   (`--replay-batch-size`, `--replay-pause-ms`, `--replay-max-per-second`; default the
//!   configuration's defaults: 100,000 Deliveries at the default cap of 100/s take about
//!   1,000 s).

use std::time::{Duration, Instant};

use anyhow::Context;
use railhook_config::Config;

use super::{accepted_deliveries, cpu_delta, cpu_snapshot, ms_between, one_type, plan, wait_arrivals};
use crate::http::{post_json, Receiver};
use crate::load;
use crate::stack::Stack;
use crate::{json, percentiles, Args};

pub const NAME: &str = "replay";
/// Events of Endpoint A's history the Replay replays.
const HISTORY: i64 = 100_000;
/// The longest the "with replay" part runs before the Replay is cancelled and reported as is.
const REPLAY_CAP: Duration = Duration::from_secs(3_000);
/// One live window of the "with replay" part.
const WINDOW: Duration = Duration::from_secs(10);
/// One live window with the Replay held, after each window with it (half as long, so a
/// whole run stays under half an hour at the default cap).
const HELD_WINDOW: Duration = Duration::from_secs(5);
const HISTORY_TYPE: &str = "bench.history";
const LIVE_TYPE: &str = "bench.live";
/// The target: p99 with the Replay at most 1.2 times the p99 without.
const P99_RATIO_TARGET: f64 = 1.2;

/// Live samples of one part (baseline or with replay).
#[derive(Default)]
struct Live {
    ms: Vec<f64>,
    accepted: usize,
    refused: usize,
    delivered: usize,
    seconds: f64,
}

impl Live {
    fn json(&self, cpu: serde_json::Value) -> serde_json::Value {
        serde_json::json!({
            "accepted": self.accepted, "refused": self.refused, "delivered": self.delivered,
            "seconds": self.seconds, "latency_201_to_arrival": json(&percentiles(self.ms.clone())), "cpu_cores": cpu,
        })
    }
}

/// One live window at `rate` to B; its samples are added to `live`.
async fn window(stack: &mut Stack, rx: &Receiver, rate: f64, duration: Duration, live: &mut Live) -> anyhow::Result<()> {
    let p = plan(stack, stack.api_addr, Some(rate), duration, one_type(LIVE_TYPE));
    let sent = load::run(&p).await?;
    let load_end = Instant::now();
    let ids = accepted_deliveries(&sent);
    wait_arrivals(stack, rx, &ids, load_end + Duration::from_secs(30)).await?;
    let arrivals = rx.arrivals_of(ids.iter().map(|(id, _)| *id));
    let ms: Vec<f64> = ids.iter().zip(arrivals).filter_map(|((_, done), at)| at.map(|at| ms_between(*done, at))).collect();
    live.accepted += ids.len();
    live.refused += sent.iter().filter(|s| s.status.as_u16() != 201).count();
    live.delivered += ms.len();
    live.seconds += duration.as_secs_f64();
    live.ms.extend(ms);
    Ok(())
}

/// Endpoint A's history: `HISTORY` Events over the last hour (ending a minute ago), each with
/// its SUCCESS Delivery to A, in batches of 20,000 rows.
async fn seed_history(stack: &Stack, endpoint_a: &str) -> anyhow::Result<f64> {
    let started = Instant::now();
    let a: railhook_core::EndpointId = endpoint_a.parse().map_err(|e| anyhow::anyhow!("endpoint id {endpoint_a}: {e}"))?;
    let client = stack.db.client().await;
    let row = client.query_one("SELECT project_id, (SELECT id FROM subscriptions WHERE endpoint_id = $1 LIMIT 1) FROM endpoints WHERE id = $1", &[&a.0]).await?;
    let (project, subscription): (uuid::Uuid, uuid::Uuid) = (row.get(0), row.get(1));
    const STEP: i64 = 20_000;
    for from in (0..HISTORY).step_by(STEP as usize) {
        let to = (from + STEP).min(HISTORY);
        client
            .execute(
                "WITH ev AS (
                    INSERT INTO events (id, project_id, event_type, payload, created_at)
                    SELECT railhook_uuid_v7(), $1, $4, jsonb_build_object('n', n, 'note', repeat('x', 960)),
                           now() - interval '61 minutes' + n * (interval '60 minutes' / $6)
                    FROM generate_series($2::bigint, $3::bigint - 1) n
                    RETURNING id, created_at
                )
                INSERT INTO deliveries (id, project_id, event_id, endpoint_id, subscription_id, status, attempt_count,
                                        max_attempts, retry_delays, timeout_seconds, created_at, updated_at, completed_at)
                SELECT railhook_uuid_v7(), $1, ev.id, $5, $7, 'SUCCESS', 1, 7, '{60,300,900,3600,21600,86400}', 30,
                       ev.created_at, ev.created_at, ev.created_at
                FROM ev",
                &[&project, &from, &to, &HISTORY_TYPE, &a.0, &(HISTORY as f64), &subscription],
            )
            .await
            .context("seeding Endpoint A's history")?;
    }
    client.batch_execute("ANALYZE events; ANALYZE deliveries").await?;
    Ok(started.elapsed().as_secs_f64())
}

/// The Replay as `GET /v1/replays/{id}` shows it.
async fn replay_state(stack: &Stack, id: &str) -> anyhow::Result<serde_json::Value> {
    let url = format!("http://{}/v1/replays/{id}", stack.api_addr);
    get_json(&url, &stack.api_key).await
}

async fn get_json(url: &str, key: &str) -> anyhow::Result<serde_json::Value> {
    // `http::get_text` carries no key; /v1 needs one.
    let uri: hyper::Uri = url.parse()?;
    let addr = format!("{}:{}", uri.host().unwrap_or("127.0.0.1"), uri.port_u16().unwrap_or(80));
    let stream = tokio::net::TcpStream::connect(&addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = hyper::Request::get(uri.path())
        .header("host", addr)
        .header("authorization", format!("Bearer {key}"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    let body = http_body_util::BodyExt::collect(resp.into_body()).await?.to_bytes();
    if !status.is_success() {
        anyhow::bail!("GET {url}: {status}: {}", String::from_utf8_lossy(&body));
    }
    Ok(serde_json::from_slice(&body)?)
}

/// The replayed Deliveries: (made, delivered, seconds from the Replay's creation to its last
/// Delivery's completion).
async fn replay_deliveries(stack: &Stack, replay: uuid::Uuid) -> anyhow::Result<(i64, i64, f64)> {
    let row = stack
        .db
        .client()
        .await
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE d.status = 'SUCCESS'),
                    COALESCE(EXTRACT(EPOCH FROM max(d.completed_at) - r.created_at), 0)::float8
             FROM replays r LEFT JOIN deliveries d ON d.replay_id = r.id WHERE r.id = $1 GROUP BY r.created_at",
            &[&replay],
        )
        .await?;
    Ok((row.get(0), row.get(1), row.get(2)))
}

/// Holds every Replay (`true`) through the shared pace row the runner obeys
/// (`replay_pace`, migration 0019), or lets them go on (`false`).
async fn hold_replays(stack: &Stack, hold: bool) -> anyhow::Result<()> {
    let sql = if hold {
        "UPDATE replay_pace SET not_before = clock_timestamp() + interval '1 hour'"
    } else {
        "UPDATE replay_pace SET not_before = clock_timestamp()"
    };
    stack.db.client().await.execute(sql, &[]).await?;
    Ok(())
}

/// Until no replayed Delivery is left unsent (at most 60 s).
async fn await_replay_drained(stack: &Stack, replay: uuid::Uuid) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let row = stack
            .db
            .client()
            .await
            .query_one("SELECT count(*) FROM deliveries WHERE replay_id = $1 AND status IN ('PENDING', 'PROCESSING')", &[&replay])
            .await?;
        if row.get::<_, i64>(0) == 0 {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "replayed Deliveries still unsent 60 s after the hold");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Until the Replay made more than `made` Deliveries again after the hold (at most 10 s; a
/// Replay that has nothing left does not move, which is fine).
async fn await_replay_moving(stack: &Stack, replay: uuid::Uuid, made: i64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if replay_deliveries(stack, replay).await?.0 > made {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

pub async fn run(args: &Args) -> anyhow::Result<serde_json::Value> {
    let (rx, rx_addr) = Receiver::start().await?;
    let (batch_size, pause_ms, max_per_second) = (args.replay_batch_size, args.replay_pause_ms, args.replay_max_per_second);
    let alternate = !args.replay_no_alternate;
    let tune = move |c: &mut Config| {
        if let Some(m) = max_per_second {
            c.replay.max_deliveries_per_second = m;
        }
        if let Some(b) = batch_size {
            c.replay.batch_size = b;
        }
        if let Some(p) = pause_ms {
            c.replay.pause_ms = p;
        }
    };
    let mut stack = Stack::start(&args.bin()?, NAME, true, tune).await?;
    let replay_config = (stack.config.replay.batch_size, stack.config.replay.pause_ms, stack.config.replay.max_deliveries_per_second);
    let a = stack.endpoint(&format!("http://{rx_addr}/replay/a"), HISTORY_TYPE).await?;
    stack.endpoint(&format!("http://{rx_addr}/replay/b"), LIVE_TYPE).await?;
    let seed_s = seed_history(&stack, &a).await?;
    println!("replay: seeded {HISTORY} Events of Endpoint A's history in {seed_s:.1} s");
    let rate = args.replay_live_rate;

    // Warm-up, then the baseline.
    window(&mut stack, &rx, rate, Duration::from_secs(3), &mut Live::default()).await?;
    let mut baseline = Live::default();
    let cpu0 = cpu_snapshot(&stack);
    let t0 = Instant::now();
    window(&mut stack, &rx, rate, args.duration, &mut baseline).await?;
    let baseline_cpu = cpu_delta(&stack, &cpu0, t0.elapsed().as_secs_f64());

    // The Replay of A's history (the last day: all of it), with B's live traffic until every
    // replayed Delivery arrived.
    let now = chrono::Utc::now();
    let range = serde_json::json!({
        "from": (now - chrono::Duration::days(1)).to_rfc3339(), "to": (now + chrono::Duration::hours(1)).to_rfc3339(),
        "endpoint_ids": [a], "event_types": [HISTORY_TYPE],
    });
    let started = Instant::now();
    let created = post_json(stack.api_addr, "/v1/replays", &stack.api_key, range).await?;
    let id = created["id"].as_str().context("replay id")?.to_string();
    let replay_uuid = id.parse::<railhook_core::ReplayId>().map_err(|e| anyhow::anyhow!("{e}"))?.0;
    println!("replay: {id} started, {} Deliveries to make", created["total"]);
    let mut with = Live::default();
    let mut paused = Live::default();
    let cpu0 = cpu_snapshot(&stack);
    let t0 = Instant::now();
    let mut last;
    let mut pairs = 0usize;
    loop {
        window(&mut stack, &rx, rate, WINDOW, &mut with).await?;
        last = replay_state(&stack, &id).await?;
        let (made, delivered, _) = replay_deliveries(&stack, replay_uuid).await?;
        println!(
            "replay: {:>5.0} s, state {}, {} made, {} delivered to A; live p99 so far {:.1} ms with, {:.1} ms paused",
            started.elapsed().as_secs_f64(), last["state"], made, delivered, percentiles(with.ms.clone()).p99, percentiles(paused.ms.clone()).p99
        );
        let ended = last["state"] != "running";
        if (ended && delivered >= made) || started.elapsed() > REPLAY_CAP {
            break;
        }
        if ended || !alternate {
            continue;
        }
        // The paired baseline: the Replay held by its own pace row, its last Deliveries
        // drained, then a live window as long as the one with it.
        hold_replays(&stack, true).await?;
        await_replay_drained(&stack, replay_uuid).await?;
        window(&mut stack, &rx, rate, HELD_WINDOW, &mut paused).await?;
        hold_replays(&stack, false).await?;
        await_replay_moving(&stack, replay_uuid, made).await?;
        pairs += 1;
    }
    let with_cpu = cpu_delta(&stack, &cpu0, t0.elapsed().as_secs_f64());
    let capped = last["state"] == "running";
    if capped {
        post_json(stack.api_addr, &format!("/v1/replays/{id}/cancel"), &stack.api_key, serde_json::json!({})).await.ok();
        last = replay_state(&stack, &id).await?;
    }
    let (made, delivered, delivered_s) = replay_deliveries(&stack, replay_uuid).await?;
    let made_s = seconds_between(&last["created_at"], &last["finished_at"]).unwrap_or(started.elapsed().as_secs_f64());

    // The baseline's second half, with the Replay over.
    let cpu0 = cpu_snapshot(&stack);
    let t0 = Instant::now();
    let before_ms = baseline.ms.len();
    window(&mut stack, &rx, rate, args.duration, &mut baseline).await?;
    let after_cpu = cpu_delta(&stack, &cpu0, t0.elapsed().as_secs_f64());
    let (before_p99, after_p99) = (percentiles(baseline.ms[..before_ms].to_vec()).p99, percentiles(baseline.ms[before_ms..].to_vec()).p99);
    stack.check_running()?;
    stack.stop().await;

    // The baseline: the windows before and after the Replay and, when alternating, the
    // paired windows with the Replay held.
    let pb = percentiles(paused.ms.clone());
    baseline.accepted += paused.accepted;
    baseline.refused += paused.refused;
    baseline.delivered += paused.delivered;
    baseline.seconds += paused.seconds;
    baseline.ms.extend(paused.ms.iter().copied());
    let (b, w) = (percentiles(baseline.ms.clone()), percentiles(with.ms.clone()));
    let paired_p99_ratio = if pairs > 0 { Some(w.p99 / pb.p99.max(0.001)) } else { None };
    let p99_ratio = w.p99 / b.p99.max(0.001);
    let p50_ratio = w.p50 / b.p50.max(0.001);
    let met = p99_ratio <= P99_RATIO_TARGET && !capped && with.delivered == with.accepted;
    println!();
    println!(
        "replay: live e2e to Endpoint B at {rate:.0} events/s while {made} replayed Deliveries went to Endpoint A (replay.batch_size {}, replay.pause_ms {}, replay.max_deliveries_per_second {})",
        replay_config.0, replay_config.1, replay_config.2
    );
    println!(
        "baseline p99 before the Replay {before_p99:.2} ms, after it {after_p99:.2} ms, in the {pairs} windows with the Replay held {:.2} ms (pooled below)",
        pb.p99
    );
    println!("{:<16} {:>8} {:>10} {:>8} {:>8} {:>8}", "", "samples", "delivered", "p50", "p99", "max");
    println!("{:<16} {:>8} {:>10} {:>8.2} {:>8.2} {:>8.1}", "without replay", b.count, baseline.delivered, b.p50, b.p99, b.max);
    println!("{:<16} {:>8} {:>10} {:>8.2} {:>8.2} {:>8.1}", "with replay", w.count, with.delivered, w.p50, w.p99, w.max);
    println!(
        "p99 with/without = {p99_ratio:.2} (target <= {P99_RATIO_TARGET}: {}), p50 {p50_ratio:.2}; the replay made {:.0} Deliveries/s ({made} in {made_s:.1} s), delivered {:.0}/s ({delivered} in {delivered_s:.1} s){}",
        if met { "met" } else { "MISSED" },
        made as f64 / made_s.max(0.001),
        delivered as f64 / delivered_s.max(0.001),
        if capped { "; CANCELLED at the cap" } else { "" }
    );
    println!();
    Ok(serde_json::json!({
        "name": "replay",
        "history_events": HISTORY,
        "live_rate_per_s": rate,
        "replay_config": {"batch_size": replay_config.0, "pause_ms": replay_config.1, "max_deliveries_per_second": replay_config.2},
        "figures": {
            "with_replay": with.json(with_cpu),
            "replay": {
                "id": id, "state": last["state"], "cancelled_at_cap": capped, "made": made, "delivered": delivered,
                "made_in_s": made_s, "made_per_s": made as f64 / made_s.max(0.001),
                "delivered_in_s": delivered_s, "delivered_per_s": delivered as f64 / delivered_s.max(0.001),
            },
            "seed_s": seed_s,
        },
        "baseline": {
            "without_replay": baseline.json(baseline_cpu),
            "p99_before_ms": before_p99, "p99_after_ms": after_p99, "cpu_cores_after": after_cpu,
        },
        "ratio": {"p99_with_over_without": p99_ratio, "p50_with_over_without": p50_ratio, "p99_with_over_held": paired_p99_ratio},
        "alternating": {"pairs": pairs, "held_p99_ms": pb.p99, "held_samples": pb.count},
        "targets": {"p99_with_over_without_at_most": P99_RATIO_TARGET, "met": met},
    }))
}

fn seconds_between(from: &serde_json::Value, to: &serde_json::Value) -> Option<f64> {
    let parse = |v: &serde_json::Value| chrono::DateTime::parse_from_rfc3339(v.as_str()?).ok();
    Some((parse(to)? - parse(from)?).num_milliseconds() as f64 / 1000.0)
}
