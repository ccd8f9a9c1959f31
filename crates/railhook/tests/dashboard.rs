//! The Grafana dashboard (deploy/grafana/railhook.json) against the binary: every metric a
//! panel's query names is one `railhook all` exports on /metrics once an Event went through
//! it (a histogram's `_bucket`, `_sum` and `_count` series count as the histogram).
//!
//! Every query is also parsed by `promtool check rules` (as a recording rule, with Grafana's
//! `$__rate_interval` as 5m) where promtool is installed (`scripts/test` installs it).
//!
//! A few labelled counters have no series until what they count happens (a Deferral, a
//! sweep, a circuit change, an incoming webhook, a Forward, a retention delete); a Prometheus
//! client exports nothing for them before that. For those the test checks that the binary's
//! source registers that name, and that they are few.

mod common;

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use railhook_testkit::{eventually, test_config, TestDb};
use serde_json::{json, Value};

/// Metrics that exist only once what they count has happened (see the module docs).
const ON_OCCURRENCE: [&str; 9] = [
    "railhook_worker_deferrals_total",
    "railhook_worker_claims_busy_total",
    "railhook_worker_swept_total",
    "railhook_worker_circuit_changes_total",
    "railhook_ingress_received_total",
    "railhook_ingress_refused_total",
    "railhook_worker_forward_attempts_total",
    "railhook_retention_deleted_rows_total",
    "railhook_retention_runs_total",
];

fn repo(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

/// Every `expr` of every panel (rows' nested panels too), with its panel's title.
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    fn walk(panels: &Value, out: &mut Vec<(String, String)>) {
        for panel in panels.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push((panel["title"].as_str().unwrap_or("").to_string(), expr.to_string()));
                }
            }
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// The `railhook_*` identifiers in a PromQL expression.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("railhook_") {
        let start = i + at;
        let preceded = start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let end = expr[start..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(expr.len(), |e| start + e);
        if !preceded {
            names.insert(expr[start..end].to_string());
        }
        i = end;
    }
    names
}

/// `# TYPE name kind` of a Prometheus text exposition.
fn exported(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' ').map(|(n, k)| (n.to_string(), k.trim().to_string())))
        .collect()
}

/// Whether `name` (as a query names it) is among the exported families.
fn is_exported(name: &str, families: &[(String, String)]) -> bool {
    families.iter().any(|(n, kind)| {
        n == name || (kind == "histogram" && ["_bucket", "_sum", "_count"].iter().any(|s| name.strip_suffix(s) == Some(n.as_str())))
    })
}

#[test]
fn the_dashboard_is_well_formed() {
    let text = std::fs::read_to_string(repo("deploy/grafana/railhook.json")).expect("deploy/grafana/railhook.json");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert_eq!(dashboard["uid"], "railhook");
    let mut ids = HashSet::new();
    let mut panels = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        assert!(ids.insert(panel["id"].as_i64().unwrap()), "panel id {} twice", panel["id"]);
        if panel["type"] == "row" {
            continue;
        }
        panels += 1;
        let title = panel["title"].as_str().unwrap();
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title} uses the dashboard's Prometheus variable");
        let targets = panel["targets"].as_array().unwrap_or_else(|| panic!("{title} has no targets"));
        assert!(!targets.is_empty(), "{title} has no query");
        for t in targets {
            assert!(!metric_names(t["expr"].as_str().unwrap()).is_empty(), "{title}: a query without a railhook_ metric");
        }
    }
    assert!(panels >= 15, "{panels} panels");
    assert_eq!(
        metric_names("histogram_quantile(0.99, sum by (le) (rate(railhook_a_bucket[5m]))) / railhook_b{x=\"railhook_c\"}"),
        ["railhook_a_bucket", "railhook_b", "railhook_c"].iter().map(|s| s.to_string()).collect()
    );
}

#[test]
fn every_query_is_promql() {
    let Ok(out) = std::process::Command::new("promtool").arg("--version").output() else {
        eprintln!("promtool is not installed (scripts/test installs it); the queries were not parsed");
        return;
    };
    assert!(out.status.success());
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(repo("deploy/grafana/railhook.json")).unwrap()).unwrap();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, (_, expr)) in queries(&dashboard).iter().enumerate() {
        let expr = expr.replace("$__rate_interval", "5m");
        rules.push_str(&format!("      - record: railhook_dashboard:query{i}\n        expr: {}\n", serde_json::to_string(&expr).unwrap()));
    }
    let path = std::env::temp_dir().join(format!("railhook-dashboard-{}.yml", std::process::id()));
    std::fs::write(&path, rules).unwrap();
    let out = std::process::Command::new("promtool").arg("check").arg("rules").arg(&path).output().unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(out.status.success(), "promtool: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

#[tokio::test]
async fn every_query_names_a_metric_the_binary_exports() {
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(repo("deploy/grafana/railhook.json")).unwrap()).unwrap();
    let queries = queries(&dashboard);

    // `railhook all`, one Event through it to a receiver here.
    let hits = Arc::new(AtomicUsize::new(0));
    let receiver = {
        let hits = hits.clone();
        axum::Router::new().route(
            "/hook",
            axum::routing::post(move || {
                let hits = hits.clone();
                async move {
                    hits.fetch_add(1, Ordering::SeqCst);
                    "ok"
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let rx_port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, receiver).await });

    let db = TestDb::new().await;
    let config = test_config(&db);
    let port = railhook_testkit::free_port();
    let api = format!("http://127.0.0.1:{port}");
    let _all = common::spawn_railhook(
        &config,
        "all",
        None,
        &[
            ("RAILHOOK_API__LISTEN", format!("127.0.0.1:{port}")),
            ("RAILHOOK_KAFKA__PARTITIONS", config.kafka.partitions.to_string()),
            ("RAILHOOK_RETENTION__INTERVAL_SECONDS", "1".into()),
        ],
    );
    let http = reqwest::Client::new();
    eventually(Duration::from_secs(60), "the API to answer", || async {
        http.get(format!("{api}/healthz")).send().await.ok().filter(|r| r.status().is_success()).map(|_| ())
    })
    .await;
    let call = |path: &str, key: &str, body: Value| {
        let req = http.post(format!("{api}{path}")).bearer_auth(key).json(&body);
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status();
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            assert!(status.is_success(), "{status} {body}");
            body
        }
    };
    let admin = config.api.admin_token.clone();
    let org = call("/v1/admin/organizations", &admin, json!({"name": "acme"})).await;
    let project = call(&format!("/v1/admin/organizations/{}/projects", org["id"].as_str().unwrap()), &admin, json!({"name": "shop"})).await;
    let key = project["api_key"]["secret"].as_str().unwrap().to_string();
    let endpoint = call("/v1/endpoints", &key, json!({"url": format!("http://127.0.0.1:{rx_port}/hook")})).await;
    call("/v1/subscriptions", &key, json!({"endpoint_id": endpoint["id"], "event_type": "order.*"})).await;
    call("/v1/events", &key, json!({"type": "order.paid", "payload": {"n": 1}})).await;
    eventually(Duration::from_secs(90), "the Event at the receiver", || async { (hits.load(Ordering::SeqCst) > 0).then_some(()) }).await;

    // Gauges sampled on an interval (the slot's, the sweeper's) come within seconds.
    let wanted: BTreeSet<String> = queries.iter().flat_map(|(_, e)| metric_names(e)).filter(|n| !ON_OCCURRENCE.contains(&n.as_str())).collect();
    let missing = |families: &[(String, String)]| -> Vec<String> { wanted.iter().filter(|n| !is_exported(n, families)).cloned().collect() };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut last_missing;
    loop {
        let text = http.get(format!("{api}/metrics")).send().await.unwrap().text().await.unwrap();
        last_missing = missing(&exported(&text));
        if last_missing.is_empty() || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let offenders: Vec<String> =
        last_missing.iter().map(|m| format!("{m} (in {:?})", queries.iter().filter(|(_, e)| metric_names(e).contains(m)).map(|(t, _)| t).collect::<Vec<_>>())).collect();
    assert!(offenders.is_empty(), "the dashboard queries metrics `railhook all` does not export: {offenders:?}");

    // The metrics that need an occurrence: registered by name in the binary's crates.
    let mut sources = String::new();
    for entry in std::fs::read_dir(repo("crates")).unwrap().flatten() {
        let src = entry.path().join("src");
        let mut stack = vec![src];
        while let Some(dir) = stack.pop() {
            for f in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let p = f.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|e| e == "rs") {
                    sources.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
                }
            }
        }
    }
    for name in ON_OCCURRENCE {
        assert!(sources.contains(&format!("\"{name}\"")), "{name} is not a metric name in crates/*/src");
    }
}
