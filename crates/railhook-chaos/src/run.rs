//! One run, start to end: private servers (and the proxy), the processes, the tenancy, the
//! send phase with the faults, the drain, the checks, the report.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chrono::Utc;
use railhook_core::signing::EndpointSecret;
use railhook_testkit::kafka::KafkaBroker;
use railhook_testkit::pg::PgCluster;
use tokio::time::Instant;

use crate::by_kind::{self, KindInputs};
use crate::checker::{self, Inputs};
use crate::forwards;
use crate::inject::{self, Bursts, IncomingBursts, Targets};
use crate::network::Toxiproxy;
use crate::options::*;
use crate::plan::{plan_faults, skipped_faults, Component, FaultKind, Link, Service};
use crate::receiver::{Profile, Receiver, ReceiverEndpoint};
use crate::record::AttemptRow;
use crate::report::{GapTimeoutCount, Report, Timings, Topology};
use crate::stack::{self, Ports, Routes, Stack};
use crate::{client, incoming, wait_for};

/// The size of the tmpfs holding Postgres' data for `disk_full`: memory is taken only as
/// the data grows (a full run's database is a few hundred MB).
const PG_TMPFS_BYTES: u64 = 4 << 30;
/// The Kafka listeners the proxied components come in on.
const KAFKA_LISTENERS: [(Component, &str); 2] = [(Component::Relay, "RELAY"), (Component::Worker, "WORKER")];

fn run_dir() -> PathBuf {
    std::env::temp_dir().join(format!("railhook-chaos-{}-{}", std::process::id(), &uuid::Uuid::new_v4().simple().to_string()[..8]))
}

async fn http_ok(http: &reqwest::Client, url: &str) -> bool {
    matches!(http.get(url).send().await, Ok(r) if r.status().is_success())
}

/// Runs the whole suite once. An `Err` means the run could not be carried out (a server
/// did not start, a tool is missing); a run that found a problem returns a [`Report`] whose
/// verdict failed.
pub async fn run(opts: &Options) -> anyhow::Result<Report> {
    let t0 = Instant::now();
    let started_at = Utc::now();
    let dir = run_dir();
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("create {}", logs.display()))?;
    anyhow::ensure!(opts.railhook_bin.is_file(), "no railhook binary at {}", opts.railhook_bin.display());
    // The components run in the run's folder: the binary's path must not be relative.
    let bin = opts.railhook_bin.canonicalize().with_context(|| format!("resolve {}", opts.railhook_bin.display()))?;
    let mut plan = plan_faults(opts);
    let planned = |k: FaultKind| plan.iter().any(|f| f.kind == k);
    let proxied = plan.iter().any(|f| f.link.is_some());
    let processes = if opts.inline() { format!("{} all (inline, no Kafka)", opts.alls) } else { format!("{} api / {} relay / {} worker (kafka)", opts.apis, opts.relays, opts.workers) };
    eprintln!(
        "railhook-chaos: {} run, {} events over {} endpoints, {processes}, {} faults, seed {}, folder {}",
        if opts.quick { "quick" } else { "full" },
        opts.events,
        opts.endpoints,
        plan.len(),
        opts.seed,
        dir.display()
    );

    // Private servers (no broker on inline), and the proxy between them and the processes.
    let mut skipped = skipped_faults(opts);
    let links = Link::of(opts.transport);
    let pg_start = async {
        if planned(FaultKind::DiskFull) {
            if let Some(pg) = PgCluster::start_on_tmpfs(PG_TMPFS_BYTES).await {
                return pg;
            }
        }
        PgCluster::start().await
    };
    let proxy_ports: HashMap<Link, u16> = if proxied { links.iter().map(|l| (*l, railhook_testkit::free_port())).collect() } else { HashMap::new() };
    let listeners: Vec<(&str, u16)> = if proxied {
        KAFKA_LISTENERS.iter().filter_map(|(c, name)| proxy_ports.get(&Link { component: *c, service: Service::Kafka }).map(|port| (*name, *port))).collect()
    } else {
        Vec::new()
    };
    let kafka_start = async {
        match opts.transport {
            TransportKind::Kafka => Some(KafkaBroker::start_with_listeners(&listeners).await),
            TransportKind::Inline => None,
        }
    };
    let (mut pg, mut kafka) = tokio::join!(pg_start, kafka_start);
    if planned(FaultKind::DiskFull) && !pg.is_on_tmpfs() {
        skipped.push("disk_full: mounting a tmpfs for Postgres' data needs root".to_string());
        plan.retain(|f| f.kind != FaultKind::DiskFull);
    }
    {
        let admin = railhook_testkit::connect(&pg.url("postgres")).await.context("connect to the private Postgres")?;
        admin.batch_execute("CREATE DATABASE railhook").await.context("create database railhook")?;
    }
    let direct_pg = pg.url("railhook");
    let proxy = if proxied {
        let mut p = Toxiproxy::start(&logs).await?;
        for link in links.iter().copied() {
            let upstream = match link.service {
                Service::Postgres => pg.port(),
                Service::Kafka => {
                    let name = KAFKA_LISTENERS.iter().find(|(c, _)| *c == link.component).map(|(_, n)| *n).context("a Kafka link of a component without a listener")?;
                    kafka.as_ref().and_then(|k| k.listener_port(name)).context("the broker's proxied listener")?
                }
            };
            p.add_proxy(link, proxy_ports[&link], upstream).await?;
        }
        Some(p)
    } else {
        None
    };
    let mut routes = Routes { postgres: HashMap::new(), kafka: HashMap::new() };
    let brokers = kafka.as_ref().map(|k| k.brokers()).unwrap_or_default();
    for component in [Component::Api, Component::Relay, Component::Worker, Component::All] {
        let via = |service| proxy.as_ref().and_then(|p| p.port(Link { component, service }));
        let pg_url = match via(Service::Postgres) {
            Some(port) => direct_pg.replace(&format!(":{}/", pg.port()), &format!(":{port}/")),
            None => direct_pg.clone(),
        };
        routes.postgres.insert(component, pg_url);
        let kafka_route = match &kafka {
            Some(_) => via(Service::Kafka).map_or(brokers.clone(), |port| format!("127.0.0.1:{port}")),
            None => String::new(),
        };
        routes.kafka.insert(component, kafka_route);
    }

    let mut base = stack::base_config();
    base.database.url = direct_pg.clone();
    base.kafka.brokers = brokers.clone();
    base.transport = match opts.transport {
        TransportKind::Kafka => railhook_config::Transport::Kafka,
        TransportKind::Inline => railhook_config::Transport::Inline,
    };
    let migrate_config = dir.join("migrate.toml");
    std::fs::write(&migrate_config, toml::to_string(&base).context("render the configuration")?)?;
    let migrate = tokio::process::Command::new(&bin)
        .args(["migrate", "--config"])
        .arg(&migrate_config)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .await
        .context("run railhook migrate")?;
    anyhow::ensure!(migrate.status.success(), "railhook migrate failed: {}", String::from_utf8_lossy(&migrate.stderr));

    // The receiver.
    let ports = Ports::pick(opts);
    let mut secrets = Vec::new();
    let mut endpoints = Vec::new();
    for j in 0..opts.endpoints {
        let profile = profile_for(j, opts.quick);
        let timeout = if profile == Profile::Healthy { HEALTHY_TIMEOUT_S } else { FLAKY_TIMEOUT_S };
        let secret = EndpointSecret::generate();
        secrets.push(secret.as_str().to_string());
        endpoints.push(ReceiverEndpoint { secret, profile, timeout: Duration::from_secs(timeout as u64) });
    }
    let flaky_endpoints = endpoints.iter().filter(|e| e.profile != Profile::Healthy).count();
    // The Destinations' receiver endpoints follow the Endpoints': `opts.endpoints + d`.
    let destination_count: usize = destinations_per_source(opts).iter().sum();
    for d in 0..destination_count {
        let profile = destination_profile(d);
        let timeout = if profile == Profile::Healthy { HEALTHY_TIMEOUT_S } else { FLAKY_TIMEOUT_S };
        endpoints.push(ReceiverEndpoint { secret: EndpointSecret::generate(), profile, timeout: Duration::from_secs(timeout as u64) });
    }
    let receiver_port = ports.receiver;
    let receiver = Receiver::start(receiver_port, endpoints.clone(), opts.seed ^ 0x5eed).await?;
    let receiver = Arc::new(tokio::sync::Mutex::new(receiver));

    // The processes.
    let mut stack = Stack::start(opts, &bin, &dir, &logs, &base, &routes, ports)?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let bases: Vec<String> = stack.ports.api.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let ready = async {
        for base in &bases {
            let health = format!("{base}/healthz");
            wait_for(Duration::from_secs(60), "the API's /healthz", || http_ok(&http, &health)).await?;
        }
        for port in &stack.ports.worker_ops {
            let ready = format!("http://127.0.0.1:{port}/readyz");
            wait_for(Duration::from_secs(60), "the workers' /readyz", || http_ok(&http, &ready)).await?;
        }
        wait_for(Duration::from_secs(90), "a relay's stream to be live", || async { stack.active_relay(&http).await.is_some() }).await
    };
    if let Err(e) = ready.await {
        let tails = stack.tails();
        stack.stop().await;
        return Err(e.context(tails));
    }

    let api = client::Api::new(bases.clone());
    let plans: Vec<client::EndpointPlan> = (0..opts.endpoints)
        .map(|j| client::EndpointPlan {
            url: format!("http://127.0.0.1:{receiver_port}/ep/{j}"),
            secret: secrets[j].clone(),
            timeout_seconds: endpoints[j].timeout.as_secs() as i64,
            ordered: is_ordered(j),
        })
        .collect();
    let tenancy = client::set_up(&api, ADMIN_TOKEN, &plans, &RETRY_DELAYS, MAX_ATTEMPTS).await?;
    let incoming_tenancy = Arc::new(incoming::set_up(&api, &tenancy.api_key, &destination_plans(opts, &endpoints, receiver_port)).await?);
    let setup_s = t0.elapsed().as_secs_f64();
    eprintln!("railhook-chaos: set up in {setup_s:.1} s; sending");

    // Send, and inject the faults meanwhile.
    let t_send = Instant::now();
    let sending = Arc::new(client::Sending::default());
    let run_tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let ordered_endpoints: Vec<usize> = (0..opts.endpoints).filter(|j| is_ordered(*j)).collect();
    let incoming_sending = Arc::new(incoming::IncomingSending::default());
    let mut burst_types: Vec<Vec<String>> = ordered_endpoints
        .iter()
        .map(|&j| {
            let n = if endpoints[j].profile == Profile::Healthy { opts.ordered_burst } else { opts.ordered_burst_flaky };
            vec![client::ordered_event_type(j); n]
        })
        .collect();
    // Unordered events to the first healthy Endpoint, as fast as the API takes them: its
    // requests in flight reach the concurrency limit, which the receiver checks.
    if let Some(j) = (0..opts.endpoints).find(|j| endpoints[*j].profile == Profile::Healthy) {
        burst_types.push(vec![format!("chaos.e{j}.x"); opts.ordered_burst]);
    }
    let bursts = Bursts {
        api: api.clone(),
        key: tenancy.api_key.clone(),
        run: run_tag.clone(),
        types: burst_types,
        first_index: opts.events,
        incoming: IncomingBursts { tenancy: incoming_tenancy.clone(), sending: incoming_sending.clone(), size: opts.incoming_burst, first_index: opts.incoming },
    };
    let client_done = tokio_util::sync::CancellationToken::new();
    let send_incoming = async {
        // Over the paced stream's time (slightly less, so it ends with it).
        let (send_time, slots) = (opts.events as f64 / opts.rate, opts.incoming + opts.incoming / incoming::RESEND_EVERY);
        let rate = slots as f64 / (send_time * 0.95);
        let give_up = Duration::from_secs_f64(send_time) + Duration::from_secs(900);
        incoming::send_all(&api, &incoming_tenancy, &run_tag, opts.incoming, rate, opts.concurrency, give_up, incoming_sending.clone()).await;
    };
    let send = async {
        let give_up = Duration::from_secs_f64(opts.events as f64 / opts.rate) + Duration::from_secs(900);
        client::send_all(&api, &tenancy.api_key, &run_tag, opts.events, opts.endpoints, opts.rate, opts.concurrency, give_up, sending.clone()).await;
        client_done.cancel();
    };
    let mut targets = Targets {
        stack: &mut stack,
        pg: &mut pg,
        kafka: kafka.as_mut(),
        proxy: proxy.as_ref(),
        receiver: receiver.clone(),
        admin_url: String::new(),
        slot_name: base.relay.slot_name.clone(),
        http: http.clone(),
    };
    targets.admin_url = targets.pg.url("postgres");
    let faults = inject::inject(&plan, opts, &mut targets, &sending, &client_done, &bursts);
    let ((), (), (mut records, burst_events)) = tokio::join!(send, send_incoming, faults);
    let send_s = t_send.elapsed().as_secs_f64();
    eprintln!(
        "railhook-chaos: sent in {send_s:.1} s, {} accepted ({} of {burst_events} in bursts); draining",
        sending.accepted_count.load(Ordering::SeqCst) + sending.burst_accepted.load(Ordering::SeqCst),
        sending.burst_accepted.load(Ordering::SeqCst)
    );

    // Drain: until every expected Delivery exists and none is PENDING or PROCESSING.
    let t_drain = Instant::now();
    let accepted: Vec<checker::AcceptedEvent> = sending.accepted.lock().unwrap().clone();
    let expected = expected_count(&accepted, &tenancy.subscriptions);
    let expected_forwards = incoming_sending.expected_forwards(&incoming_tenancy);
    let drained = wait_for(opts.drain_timeout, "every Delivery and Forward to be terminal", || async {
        let Ok(db) = railhook_testkit::connect(&direct_pg).await else { return false };
        terminal(&db, "deliveries", expected).await && terminal(&db, "forwards", expected_forwards).await
    })
    .await
    .is_ok();
    let drain_s = t_drain.elapsed().as_secs_f64();
    eprintln!("railhook-chaos: {} in {drain_s:.1} s; checking", if drained { "drained" } else { "NOT drained" });

    // Check.
    let t_check = Instant::now();
    let db = railhook_testkit::connect(&direct_pg).await.context("connect for the check")?;
    let mut inputs = read_postgres(&db).await?;
    let in_postgres = read_forwards(&db).await?;
    drop(db);
    let mut worker_metric = None;
    for port in &stack.ports.worker_ops {
        if let Some(n) = stack::metric(&http, *port, "railhook_ordering_gap_timeout_total").await {
            worker_metric = Some(worker_metric.unwrap_or(0) + n as u64);
        }
    }
    let mut gap_timeouts = GapTimeoutCount { worker_metric, worker_log: 0 };
    // `task_panic` lasts to the end: its window and its panics, counted in its workers' logs
    // (`workers`: [name, log offset] each).
    let run_end = Utc::now();
    for r in records.iter_mut().filter(|r| r.kind == FaultKind::TaskPanic) {
        r.ended_at = run_end;
        let mut panics = 0;
        for entry in r.detail.get("workers").and_then(|w| w.as_array()).cloned().unwrap_or_default() {
            let (Some(name), Some(from)) = (entry.get(0).and_then(|n| n.as_str()), entry.get(1).and_then(|f| f.as_u64())) else { continue };
            if let Some(worker) = stack.workers.iter().find(|w| w.name == name) {
                panics += worker.log_since(from).lines().filter(|l| l.contains("panicked at")).count();
            }
        }
        r.detail["panics"] = panics.into();
    }
    stack.stop().await;
    gap_timeouts.worker_log = stack
        .workers
        .iter()
        .chain(stack.skewed.iter())
        .map(|w| std::fs::read_to_string(&w.log).unwrap_or_default().lines().filter(|l| l.contains("ordering gap timeout")).count() as u64)
        .sum();
    let (arrivals, forward_arrivals): (Vec<_>, Vec<_>) = receiver.lock().await.arrivals().into_iter().partition(|a| a.endpoint < opts.endpoints);
    receiver.lock().await.go_away().await;
    records.sort_by_key(|r| r.started_at);
    inputs.planned_events = opts.events + burst_events;
    inputs.gap_timeouts = gap_timeouts.worker_log.max(gap_timeouts.worker_metric.unwrap_or(0));
    inputs.gap_timeouts_allowed = false;
    inputs.accepted = accepted;
    inputs.rejected = sending.stats.lock().unwrap().rejected.clone();
    inputs.subscriptions = tenancy.subscriptions.clone();
    inputs.arrivals = arrivals;
    inputs.faults = records.clone();
    let verdict = checker::check(&inputs);
    let forward_inputs = forwards::ForwardInputs {
        planned: opts.incoming + incoming_sending.burst_events.load(Ordering::SeqCst),
        requests: incoming_sending.answered.lock().unwrap().clone(),
        refused: incoming_sending.refused.lock().unwrap().clone(),
        destinations: incoming_tenancy.destinations.clone(),
        arrivals: forward_arrivals,
        faults: records.clone(),
        ..in_postgres
    };
    let forwards_verdict = forwards::check(&forward_inputs);
    let healthy: HashSet<uuid::Uuid> = (0..opts.endpoints).filter(|j| endpoints[*j].profile == Profile::Healthy).map(|j| tenancy.endpoint_ids[j]).collect();
    let mut troubles = sending.troubles.lock().unwrap().clone();
    troubles.extend(incoming_sending.troubles.lock().unwrap().iter().cloned());
    let by_kind = by_kind::by_kind(&KindInputs {
        faults: &records,
        accepted: &inputs.accepted,
        incoming: &forward_inputs.requests,
        subscriptions: &inputs.subscriptions,
        healthy_endpoints: &healthy,
        deliveries: &inputs.deliveries,
        attempts: &inputs.attempts,
        arrivals: &inputs.arrivals,
        troubles: &troubles,
        verdict: &verdict,
        forwards: &forwards_verdict,
        endpoint_concurrency: ENDPOINT_CONCURRENCY as usize,
    });
    let mut failures = verdict.failures.clone();
    failures.extend(forwards_verdict.failures.iter().cloned());
    failures.extend(by_kind.failures.iter().cloned());
    for (name, k) in by_kind.kinds.iter().map(|(n, k)| (n.as_str(), k)).chain([("baseline", &by_kind.baseline)]) {
        failures.extend(k.failures.iter().map(|f| format!("{name}: {f}")));
    }
    failures.dedup();
    let check_s = t_check.elapsed().as_secs_f64();
    std::fs::write(dir.join("arrivals.json"), serde_json::to_vec(&inputs.arrivals)?)?;
    std::fs::write(dir.join("forward_arrivals.json"), serde_json::to_vec(&forward_inputs.arrivals)?)?;
    let passed = failures.is_empty();
    let keep = opts.keep || !passed;
    let report = Report {
        mode: if opts.quick { "quick" } else { "full" },
        transport: opts.transport.as_str(),
        seed: opts.seed,
        events: opts.events,
        lost: verdict.lost + forwards_verdict.lost,
        passed,
        failures,
        endpoints: opts.endpoints,
        flaky_endpoints,
        topology: Topology {
            all: if opts.inline() { opts.alls } else { 0 },
            apis: if opts.inline() { 0 } else { opts.apis },
            relays: if opts.inline() { 0 } else { opts.relays },
            workers: if opts.inline() { 0 } else { opts.workers },
            kafka: kafka.is_some(),
            network: if proxy.is_some() { "toxiproxy" } else { "direct" },
            postgres_data_on_tmpfs: pg.is_on_tmpfs(),
        },
        ordered_endpoints,
        burst_events,
        ordering_gap_timeout_seconds: ORDERING_GAP_TIMEOUT_S,
        gap_timeouts,
        started_at,
        verdict,
        forwards: forwards_verdict,
        kinds: by_kind.kinds,
        baseline: by_kind.baseline,
        max_endpoint_concurrency: by_kind.max_endpoint_concurrency,
        endpoint_concurrency_limit: ENDPOINT_CONCURRENCY as usize,
        faults_planned: plan,
        faults: records,
        faults_skipped: skipped,
        processes: stack.stats(),
        client: sending.stats.lock().unwrap().clone(),
        sources: opts.sources,
        destinations: incoming_tenancy.destinations.len(),
        flaky_destinations: (0..incoming_tenancy.destinations.len()).filter(|d| destination_profile(*d) != Profile::Healthy).count(),
        incoming_client: incoming_sending.stats.lock().unwrap().clone(),
        incoming_burst_events: incoming_sending.burst_events.load(Ordering::SeqCst),
        drained,
        timings: Timings { setup_s, send_s, drain_s, check_s, total_s: t0.elapsed().as_secs_f64() },
        run_dir: keep.then(|| dir.clone()),
    };
    drop(proxy);
    drop(kafka);
    drop(pg);
    if !keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(report)
}

fn destination_plans(opts: &Options, endpoints: &[ReceiverEndpoint], port: u16) -> Vec<Vec<incoming::DestinationPlan>> {
    let mut d = 0;
    let mut plans = Vec::new();
    for count in destinations_per_source(opts) {
        let plan = (d..d + count)
            .map(|d| {
                let endpoint = opts.endpoints + d;
                incoming::DestinationPlan { endpoint, url: format!("http://127.0.0.1:{port}/ep/{endpoint}"), secret: endpoints[endpoint].secret.as_str().to_string() }
            })
            .collect();
        plans.push(plan);
        d += count;
    }
    plans
}

/// At least `expected` rows in `table` and none PENDING or PROCESSING.
async fn terminal(db: &tokio_postgres::Client, table: &str, expected: usize) -> bool {
    let sql = format!("SELECT count(*), count(*) FILTER (WHERE status IN ('PENDING', 'PROCESSING')) FROM {table}");
    match db.query_one(&sql, &[]).await {
        Ok(row) => row.get::<_, i64>(0) as usize >= expected && row.get::<_, i64>(1) == 0,
        Err(_) => false,
    }
}

fn attempt_rows(rows: &[tokio_postgres::Row]) -> Vec<AttemptRow> {
    rows.iter()
        .map(|r| AttemptRow { delivery_id: r.get(0), attempt_number: r.get(1), started_at: r.get(2), duration_ms: r.get(3), result: r.get(4), status_code: r.get(5) })
        .collect()
}

/// Incoming Events, Forwards and the Forwards' Attempts (`delivery_id` holds the Forward id).
async fn read_forwards(db: &tokio_postgres::Client) -> anyhow::Result<forwards::ForwardInputs> {
    let incoming_in_postgres = db.query("SELECT id FROM incoming_events", &[]).await?.iter().map(|r| r.get(0)).collect();
    let forwards = db
        .query("SELECT id, incoming_event_id, destination_id, status::text, attempt_count, timeout_seconds, created_at FROM forwards", &[])
        .await?
        .iter()
        .map(|r| forwards::ForwardRow {
            id: r.get(0),
            incoming_event_id: r.get(1),
            destination_id: r.get(2),
            status: r.get(3),
            attempt_count: r.get(4),
            timeout_seconds: r.get(5),
            created_at: r.get(6),
        })
        .collect();
    let attempts = attempt_rows(&db.query("SELECT forward_id, attempt_number, started_at, duration_ms, result, status_code FROM attempts WHERE forward_id IS NOT NULL", &[]).await?);
    Ok(forwards::ForwardInputs { incoming_in_postgres, forwards, attempts, ..Default::default() })
}

fn expected_count(accepted: &[checker::AcceptedEvent], subs: &[checker::SubscriptionSpec]) -> usize {
    let patterns: Vec<_> = subs.iter().filter_map(|s| railhook_core::pattern::EventTypePattern::parse(&s.pattern).ok()).collect();
    accepted
        .iter()
        .filter_map(|e| railhook_core::pattern::EventType::parse(&e.event_type).ok())
        .map(|t| patterns.iter().filter(|p| p.matches(&t)).count())
        .sum()
}

async fn read_postgres(db: &tokio_postgres::Client) -> anyhow::Result<Inputs> {
    let mut inputs = Inputs::default();
    inputs.events_in_postgres = db.query("SELECT id FROM events", &[]).await?.iter().map(|r| r.get(0)).collect();
    inputs.deliveries = db
        .query("SELECT id, event_id, endpoint_id, subscription_id, status::text, attempt_count, sequence_number, created_at FROM deliveries", &[])
        .await?
        .iter()
        .map(|r| checker::DeliveryRow {
            id: r.get(0),
            event_id: r.get(1),
            endpoint_id: r.get(2),
            subscription_id: r.get(3),
            status: r.get(4),
            attempt_count: r.get(5),
            sequence_number: r.get(6),
            created_at: r.get(7),
        })
        .collect();
    inputs.attempts = attempt_rows(&db.query("SELECT delivery_id, attempt_number, started_at, duration_ms, result, status_code FROM attempts WHERE delivery_id IS NOT NULL", &[]).await?);
    Ok(inputs)
}
