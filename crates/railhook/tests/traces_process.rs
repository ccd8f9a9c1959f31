//! OpenTelemetry traces as an operator meets them (issue 33, docs/TRACING.md): `railhook all`
//! exporting over OTLP/HTTP to a real collector, Jaeger (built by `scripts/lib.sh
//! ensure_jaeger`, found through `RAILHOOK_JAEGER` or `.local/jaeger/bin/jaeger`; without it
//! the collector tests say so and pass, as the Helm tests do without helm). One Event to one
//! Endpoint with a caller's `traceparent` is one trace whose spans are ingest, relay publish,
//! claim, Attempt and finalise, in this order, and the receiver's `traceparent` names the
//! Attempt span in that trace; on both transports (Kafka headers, the inline hint). A retry
//! is in the same trace. A Kafka source record with a `traceparent` header is one trace the
//! same way, its `ingest` span the source's. A malformed `traceparent` is ignored (201, a new trace). With export off, the caller's
//! context reaches the receiver unchanged (the W3C pass-through).

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use railhook_testkit::{eventually, test_config, TestDb};
use serde_json::{json, Value};

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// Per `X-Event-Id`: the `traceparent` and `tracestate` of each request the receiver got.
#[derive(Default)]
struct Rx {
    port: u16,
    seen: Mutex<HashMap<String, Vec<(Option<String>, Option<String>)>>>,
}

/// An Event whose payload has `fail_first` gets a 500 at its first Attempt (a retry follows).
async fn receive(State(rx): State<Arc<Rx>>, headers: HeaderMap, body: axum::body::Bytes) -> StatusCode {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let Some(id) = text("x-event-id") else { return StatusCode::BAD_REQUEST };
    let mut seen = rx.seen.lock().unwrap();
    let requests = seen.entry(id).or_default();
    requests.push((text("traceparent"), text("tracestate")));
    if requests.len() == 1 && String::from_utf8_lossy(&body).contains("fail_first") {
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    StatusCode::NO_CONTENT
}

async fn start_receiver() -> Arc<Rx> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let rx = Arc::new(Rx { port: listener.local_addr().unwrap().port(), ..Default::default() });
    let app = axum::Router::new().route("/hook", axum::routing::post(receive)).with_state(rx.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    rx
}

async fn call(http: &reqwest::Client, url: String, key: &str, body: Value, headers: &[(&str, &str)]) -> Value {
    let mut request = http.post(&url).bearer_auth(key).json(&body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let resp = request.send().await.unwrap();
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    assert!((200..300).contains(&status), "{url}: {status} {body}");
    body
}

/// A running `railhook all` with a project, an Endpoint at the receiver and a Subscription.
struct Stack {
    _process: tokio::process::Child,
    api: String,
    key: String,
    project: String,
    http: reqwest::Client,
    rx: Arc<Rx>,
}

async fn start_stack(config: &railhook_config::Config, env: Vec<(&'static str, String)>) -> Stack {
    let rx = start_receiver().await;
    let port = railhook_testkit::free_port();
    let api = format!("http://127.0.0.1:{port}");
    let mut env = env;
    env.push(("RAILHOOK_API__LISTEN", format!("127.0.0.1:{port}")));
    let process = common::spawn_railhook(config, "all", None, &env);
    let http = reqwest::Client::new();
    // The relay's stream live: an Event before it may be announced twice (its own
    // announcement and the re-announcement of what is PENDING when the slot was made), which
    // would make two relay publish spans.
    eventually(Duration::from_secs(90), "the relay streaming", || async {
        let metrics = http.get(format!("{api}/metrics")).send().await.ok()?.text().await.ok()?;
        metrics.lines().any(|l| l == "railhook_relay_stream_live 1").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let admin = config.api.admin_token.clone();
    let org = call(&http, format!("{api}/v1/admin/organizations"), &admin, json!({"name": "acme"}), &[]).await;
    let project = call(&http, format!("{api}/v1/admin/organizations/{}/projects", org["id"].as_str().unwrap()), &admin, json!({"name": "shop"}), &[]).await;
    let key = project["api_key"]["secret"].as_str().unwrap().to_string();
    let endpoint = call(&http, format!("{api}/v1/endpoints"), &key, json!({"url": format!("http://127.0.0.1:{}/hook", rx.port)}), &[]).await;
    // One second between Attempts: the retry test below.
    call(&http, format!("{api}/v1/subscriptions"), &key, json!({"endpoint_id": endpoint["id"], "event_type": "order.*", "retry_delays": [1]}), &[]).await;
    let project = project["id"].as_str().unwrap().to_string();
    Stack { _process: process, api, key, project, http, rx }
}

impl Stack {
    /// Posts one Event with `headers`; waits for the receiver; what it saw.
    async fn deliver(&self, headers: &[(&str, &str)]) -> (String, Option<String>, Option<String>) {
        let (id, mut requests) = self.deliver_payload(headers, json!({"n": 1}), 1).await;
        let (tp, ts) = requests.remove(0);
        (id, tp, ts)
    }

    /// Posts one Event with `headers` and `payload`; waits for `requests` at the receiver.
    async fn deliver_payload(&self, headers: &[(&str, &str)], payload: Value, requests: usize) -> (String, Vec<(Option<String>, Option<String>)>) {
        let event = call(&self.http, format!("{}/v1/events", self.api), &self.key, json!({"type": "order.paid", "payload": payload}), headers).await;
        let id = event["id"].as_str().unwrap().to_string();
        let seen = eventually(Duration::from_secs(60), "the Event's requests at the receiver", || async {
            self.rx.seen.lock().unwrap().get(&id).filter(|r| r.len() >= requests).cloned()
        })
        .await;
        (id, seen)
    }
}

/// The Jaeger binary, if it was built here.
fn jaeger_binary() -> Option<PathBuf> {
    if let Ok(path) = std::env::var("RAILHOOK_JAEGER") {
        return Some(PathBuf::from(path));
    }
    let local = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.local/jaeger/bin/jaeger");
    local.exists().then_some(local)
}

/// Jaeger with in-memory storage, OTLP/HTTP and its query API on free ports.
struct Jaeger {
    _process: tokio::process::Child,
    _dir: PathBuf,
    otlp: String,
    query: String,
}

async fn start_jaeger(binary: &PathBuf) -> Jaeger {
    let (otlp, query, query_grpc) = (railhook_testkit::free_port(), railhook_testkit::free_port(), railhook_testkit::free_port());
    let dir = std::env::temp_dir().join(format!("railhook-jaeger-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = format!(
        r#"service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: 127.0.0.1:{query}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp}
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
"#
    );
    let file = dir.join("jaeger.yaml");
    std::fs::write(&file, config).unwrap();
    let process = tokio::process::Command::new(binary)
        .arg("--config")
        .arg(&file)
        .current_dir(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn jaeger");
    let jaeger = Jaeger { _process: process, _dir: dir, otlp: format!("http://127.0.0.1:{otlp}"), query: format!("http://127.0.0.1:{query}") };
    let http = reqwest::Client::new();
    eventually(Duration::from_secs(60), "Jaeger's query API", || async {
        http.get(format!("{}/api/services", jaeger.query)).send().await.ok().filter(|r| r.status().is_success()).map(|_| ())
    })
    .await;
    jaeger
}

/// One span of a Jaeger trace: its name, ids, parent and start (µs).
#[derive(Debug, Clone)]
struct Span {
    name: String,
    id: String,
    parent: Option<String>,
    start: i64,
    service: String,
}

async fn trace_spans(jaeger: &Jaeger, trace_id: &str) -> Vec<Span> {
    let http = reqwest::Client::new();
    let Ok(resp) = http.get(format!("{}/api/traces/{trace_id}", jaeger.query)).send().await else { return Vec::new() };
    let Ok(body) = resp.json::<Value>().await else { return Vec::new() };
    let Some(trace) = body["data"].get(0) else { return Vec::new() };
    let processes = &trace["processes"];
    trace["spans"]
        .as_array()
        .map(|spans| {
            spans
                .iter()
                .map(|s| Span {
                    name: s["operationName"].as_str().unwrap_or_default().to_string(),
                    id: s["spanID"].as_str().unwrap_or_default().to_string(),
                    parent: s["references"].as_array().and_then(|r| r.iter().find(|r| r["refType"] == "CHILD_OF")).and_then(|r| r["spanID"].as_str()).map(str::to_string),
                    start: s["startTime"].as_i64().unwrap_or_default(),
                    service: processes[s["processID"].as_str().unwrap_or_default()]["serviceName"].as_str().unwrap_or_default().to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

const SPANS: [&str; 5] = ["ingest", "relay publish", "claim", "Attempt", "finalise"];

/// Waits until the trace `trace_id` has the five spans in Jaeger; the trace's spans, and the
/// one span of each name in [`SPANS`]'s order (exactly one of each, or the test fails).
async fn five_spans(jaeger: &Jaeger, trace_id: &str) -> (Vec<Span>, [Span; 5]) {
    let spans = eventually(Duration::from_secs(30), "the five spans in Jaeger", || async {
        let spans = trace_spans(jaeger, trace_id).await;
        SPANS.iter().all(|name| spans.iter().any(|s| s.name == *name)).then_some(spans)
    })
    .await;
    let one = |name: &str| -> Span {
        let found: Vec<&Span> = spans.iter().filter(|s| s.name == name).collect();
        assert_eq!(found.len(), 1, "exactly one {name} span: {spans:#?}");
        found[0].clone()
    };
    let five = SPANS.map(one);
    (spans, five)
}

/// The whole check, on one transport (`env` picks it).
async fn one_event_is_one_trace(transport_env: Vec<(&'static str, String)>) {
    let Some(binary) = jaeger_binary() else {
        eprintln!("Jaeger is not built (scripts/lib.sh ensure_jaeger); the trace was not checked against a collector");
        return;
    };
    let jaeger = start_jaeger(&binary).await;
    let db = TestDb::new().await;
    let config = test_config(&db);
    let mut env = transport_env;
    env.extend([
        ("OTEL_EXPORTER_OTLP_ENDPOINT", jaeger.otlp.clone()),
        ("OTEL_SERVICE_NAME", "railhook-test".to_string()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_string()),
    ]);
    let stack = start_stack(&config, env).await;

    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let (event_id, tp, ts) = stack.deliver(&[("traceparent", caller.as_str()), ("tracestate", "rojo=00f067aa0ba902b7")]).await;
    let tp = tp.expect("the receiver got a traceparent");
    let parts: Vec<&str> = tp.split('-').collect();
    assert_eq!((parts.len(), parts[0], parts[1], parts[3]), (4, "00", CALLER_TRACE, "01"), "the caller's trace, sampled: {tp}");
    assert_ne!(parts[2], CALLER_SPAN, "the parent is Railhook's Attempt span, not the caller's");
    assert_eq!(ts.as_deref(), Some("rojo=00f067aa0ba902b7"), "tracestate carried");
    let event = stack.http.get(format!("{}/v1/events/{event_id}", stack.api)).bearer_auth(&stack.key).send().await.unwrap().json::<Value>().await.unwrap();
    assert_eq!(event["trace_id"], CALLER_TRACE, "the Event keeps its trace id");

    let (spans, [ingest, publish, claim, attempt, finalise]) = five_spans(&jaeger, CALLER_TRACE).await;
    assert!(spans.iter().all(|s| s.service == "railhook-test"), "OTEL_SERVICE_NAME: {spans:#?}");
    assert_eq!(ingest.parent.as_deref(), Some(CALLER_SPAN), "ingest continues the caller's span");
    assert_eq!(publish.parent.as_ref(), Some(&ingest.id), "relay publish is the ingest's child");
    for s in [&claim, &attempt, &finalise] {
        assert_eq!(s.parent.as_ref(), Some(&publish.id), "{} is the relay publish's child", s.name);
    }
    assert_eq!(parts[2], attempt.id, "the receiver's parent is the Attempt span");
    for s in [&ingest, &publish, &claim, &attempt, &finalise] {
        eprintln!("trace {CALLER_TRACE}: {:<14} span {} parent {:?} start {}", s.name, s.id, s.parent, s.start);
    }
    let starts = [ingest.start, publish.start, claim.start, attempt.start, finalise.start];
    assert!(starts.windows(2).all(|w| w[0] <= w[1]), "in order: {spans:#?}");

    // A retry is in the Event's trace: its own relay publish under the same ingest, with
    // its claim, Attempt and finalise.
    let retried = "4bf92f3577b34da6a3ce929d0e0e4737";
    let caller = format!("00-{retried}-{CALLER_SPAN}-01");
    stack.deliver_payload(&[("traceparent", caller.as_str())], json!({"fail_first": true}), 2).await;
    let spans = eventually(Duration::from_secs(30), "two Attempts in one trace", || async {
        let spans = trace_spans(&jaeger, retried).await;
        (spans.iter().filter(|s| s.name == "Attempt").count() == 2 && spans.iter().filter(|s| s.name == "finalise").count() == 2).then_some(spans)
    })
    .await;
    let ingests: Vec<&Span> = spans.iter().filter(|s| s.name == "ingest").collect();
    let publishes: Vec<&Span> = spans.iter().filter(|s| s.name == "relay publish").collect();
    assert_eq!((ingests.len(), publishes.len()), (1, 2), "{spans:#?}");
    assert!(publishes.iter().all(|p| p.parent.as_ref() == Some(&ingests[0].id)), "{spans:#?}");
    for attempt in spans.iter().filter(|s| s.name == "Attempt") {
        assert!(publishes.iter().any(|p| attempt.parent.as_ref() == Some(&p.id)), "{spans:#?}");
    }

    // A malformed traceparent is ignored: accepted, delivered, in a new trace of its own.
    let (_, tp, _) = stack.deliver(&[("traceparent", "00-not-a-trace-context-01")]).await;
    let tp = tp.expect("a new trace was started and sent on");
    assert!(railhook_core::TraceParent::parse(tp.as_bytes()).is_some_and(|p| p.trace_id_hex() != CALLER_TRACE), "{tp}");
}

#[tokio::test]
async fn one_event_is_one_trace_in_jaeger_over_kafka() {
    one_event_is_one_trace(Vec::new()).await;
}

#[tokio::test]
async fn one_event_is_one_trace_in_jaeger_inline() {
    one_event_is_one_trace(vec![("RAILHOOK_KAFKA_BROKERS", String::new())]).await;
}

/// Export off (no `OTEL_EXPORTER_OTLP_*`): no span is made, and the caller's context goes
/// through unchanged, as the W3C specification asks of a component that does not trace; no
/// context in, none out.
#[tokio::test]
async fn with_export_off_the_callers_context_passes_through_unchanged() {
    let db = TestDb::new().await;
    let config = test_config(&db);
    let stack = start_stack(&config, vec![("RAILHOOK_KAFKA_BROKERS", String::new())]).await;
    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let (id, tp, ts) = stack.deliver(&[("traceparent", caller.as_str()), ("tracestate", "a=1 , b=2")]).await;
    assert_eq!(tp.as_deref(), Some(caller.as_str()));
    assert_eq!(ts.as_deref(), Some("a=1,b=2"), "tracestate normalised, carried");
    let event = stack.http.get(format!("{}/v1/events/{id}", stack.api)).bearer_auth(&stack.key).send().await.unwrap().json::<Value>().await.unwrap();
    assert_eq!(event["trace_id"], CALLER_TRACE);
    let (_, tp, ts) = stack.deliver(&[]).await;
    assert_eq!((tp, ts), (None, None), "no context in, none out");
    let (_, tp, _) = stack.deliver(&[("traceparent", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")]).await;
    assert_eq!(tp, None, "a traceparent that does not parse is ignored");
    // A retry (the scheduler's announcement) carries the Event's context too.
    let (_, requests) = stack.deliver_payload(&[("traceparent", caller.as_str())], json!({"fail_first": true}), 2).await;
    assert_eq!(requests.len(), 2, "one failed Attempt, one retry");
    for (tp, _) in &requests {
        assert_eq!(tp.as_deref(), Some(caller.as_str()), "{requests:?}");
    }
}

/// The Kafka source (issue 33): a record whose headers carry a `traceparent` is one trace
/// like a POST's, the source's own `ingest` span (a consumer span) the child of the
/// producer's, and the rest under it.
#[tokio::test]
async fn a_kafka_source_record_is_one_trace_in_jaeger() {
    let Some(binary) = jaeger_binary() else {
        eprintln!("Jaeger is not built (scripts/lib.sh ensure_jaeger); the trace was not checked against a collector");
        return;
    };
    let jaeger = start_jaeger(&binary).await;
    let db = TestDb::new().await;
    let config = test_config(&db);
    let topic = format!("{}orders", config.kafka.topic_prefix);
    railhook_kafka::ensure_topics(&config.kafka, std::slice::from_ref(&topic)).await.unwrap();
    let env = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", jaeger.otlp.clone()),
        ("OTEL_SERVICE_NAME", "railhook-test".to_string()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_string()),
        ("RAILHOOK_KAFKA_SOURCE__TOPICS", r#"["orders"]"#.to_string()),
        ("RAILHOOK_KAFKA_SOURCE__GROUP_ID", format!("{}source", config.kafka.topic_prefix)),
    ];
    let stack = start_stack(&config, env).await;

    let producer_trace = "5bf92f3577b34da6a3ce929d0e0e4736";
    let caller = format!("00-{producer_trace}-{CALLER_SPAN}-01");
    let value = json!({"type": "order.paid", "payload": {"n": 1}, "project": stack.project}).to_string();
    let headers = rdkafka::message::OwnedHeaders::new()
        .insert(rdkafka::message::Header { key: "traceparent", value: Some(caller.as_bytes()) })
        .insert(rdkafka::message::Header { key: "tracestate", value: Some("rojo=1".as_bytes()) });
    let producer = railhook_kafka::idempotent_producer(&config.kafka, 100).unwrap();
    producer
        .send(rdkafka::producer::FutureRecord::<(), _>::to(&topic).payload(&value).headers(headers), Duration::from_secs(30))
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    let (tp, ts) = eventually(Duration::from_secs(90), "the record's Event at the receiver", || async {
        stack.rx.seen.lock().unwrap().values().next().map(|r| r[0].clone())
    })
    .await;
    let tp = tp.expect("the receiver got a traceparent");
    assert!(tp.starts_with(&format!("00-{producer_trace}-")), "the producer's trace: {tp}");
    assert_eq!(ts.as_deref(), Some("rojo=1"));

    let (_, [ingest, publish, claim, attempt, finalise]) = five_spans(&jaeger, producer_trace).await;
    assert_eq!(ingest.parent.as_deref(), Some(CALLER_SPAN), "the source's ingest continues the producer's span");
    assert_eq!(publish.parent.as_ref(), Some(&ingest.id));
    for s in [&claim, &attempt, &finalise] {
        assert_eq!(s.parent.as_ref(), Some(&publish.id), "{} is the relay publish's child", s.name);
    }
    assert_eq!(tp.split('-').nth(2), Some(attempt.id.as_str()), "the receiver's parent is the Attempt span");
    for s in [&ingest, &publish, &claim, &attempt, &finalise] {
        eprintln!("trace {producer_trace}: {:<14} span {} parent {:?} start {}", s.name, s.id, s.parent, s.start);
    }
}
