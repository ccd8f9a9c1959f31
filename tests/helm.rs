//! The Helm chart (deploy/helm/railhook) rendered by `helm template` and read back: the
//! components, their probes on the ports the binary listens on, the relay with its standby,
//! the ServiceMonitor and the alert rules. No cluster is needed.
//!
//! helm is `$RAILHOOK_HELM` (scripts/test sets it, and then a missing helm fails the test),
//! else `.local/helm/bin/helm` (scripts/lib.sh `ensure_helm`), else `helm` on the PATH; with
//! none of them the test says so and passes, so `cargo test` works on a machine without helm.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use railhook_config::{Config, ENV_ALIASES};
use serde::Deserialize;
use serde_yaml::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

fn helm() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("RAILHOOK_HELM").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "RAILHOOK_HELM={} does not exist", path.display());
        return Some(path);
    }
    let local = root().join(".local/helm/bin/helm");
    if local.is_file() {
        return Some(local);
    }
    Command::new("helm").arg("version").output().ok().filter(|o| o.status.success()).map(|_| PathBuf::from("helm"))
}

/// `helm template` with `--set` values; every document, by kind.
fn render(helm: &Path, set: &[&str]) -> Vec<Value> {
    let mut cmd = Command::new(helm);
    cmd.args(["template", "rh", "deploy/helm/railhook", "--namespace", "hooks"]).current_dir(root());
    for s in set {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("run helm template");
    assert!(out.status.success(), "helm template failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).expect("rendered YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"].as_str() == Some(kind)).collect()
}

fn component(doc: &Value) -> &str {
    doc["metadata"]["labels"]["app.kubernetes.io/component"].as_str().unwrap_or("")
}

fn env_of(container: &Value) -> BTreeMap<String, String> {
    container["env"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|e| Some((e["name"].as_str()?.to_string(), e["value"].as_str().unwrap_or("").to_string())))
        .collect()
}


/// A `RAILHOOK_*` variable names a key the binary reads (as `railhook_config::layers` maps it).
fn assert_known_setting(name: &str, keys: &[String]) {
    if ENV_ALIASES.iter().any(|(alias, _)| *alias == name) {
        return;
    }
    let key = name.strip_prefix("RAILHOOK_").unwrap_or_else(|| panic!("{name} is not a RAILHOOK_ variable")).to_ascii_lowercase().replace("__", ".");
    assert!(keys.contains(&key), "{name} names no setting ({key})");
}

#[test]
fn the_chart_renders_the_components_with_probes_on_their_ports() {
    let Some(helm) = helm() else {
        eprintln!("helm is not installed (scripts/lib.sh ensure_helm); the chart was not rendered");
        return;
    };
    let docs = render(&helm, &[]);
    let defaults = Config::default();
    let keys = railhook_config::Config::keys();
    let deployments = of_kind(&docs, "Deployment");
    let mut seen = Vec::new();
    for d in &deployments {
        let name = component(d);
        seen.push(name.to_string());
        let (listen_env, port) = match name {
            "api" => ("RAILHOOK_API__LISTEN", defaults.api.listen.port()),
            "relay" => ("RAILHOOK_RELAY__OPS_LISTEN", defaults.relay.ops_listen.port()),
            "worker" => ("RAILHOOK_WORKER__OPS_LISTEN", defaults.worker.ops_listen.port()),
            other => panic!("unexpected Deployment component {other}"),
        };
        let spec = &d["spec"]["template"]["spec"];
        let containers = spec["containers"].as_sequence().unwrap();
        assert_eq!(containers.len(), 1, "{name}");
        let c = &containers[0];
        assert_eq!(c["args"][0].as_str(), Some(name), "{name} runs `railhook {name}`");
        let ports = c["ports"].as_sequence().unwrap();
        let port_name = ports[0]["name"].as_str().unwrap();
        assert_eq!(ports[0]["containerPort"].as_u64(), Some(u64::from(port)), "{name} listens on the binary's default port");
        let env = env_of(c);
        assert_eq!(env.get(listen_env).map(String::as_str), Some(format!("0.0.0.0:{port}").as_str()), "{name}: {listen_env}");
        for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"), ("startupProbe", "/healthz")] {
            let get = &c[probe]["httpGet"];
            assert_eq!(get["path"].as_str(), Some(path), "{name} {probe}");
            assert_eq!(get["port"].as_str(), Some(port_name), "{name} {probe} on the container's port");
        }
        for var in env.keys() {
            assert_known_setting(var, &keys);
        }
        assert_eq!(c["envFrom"][0]["secretRef"]["name"].as_str(), Some("rh-railhook-secrets"), "{name}");
        // The schema before the component: `railhook migrate` as an init container.
        assert_eq!(spec["initContainers"][0]["args"][0].as_str(), Some("migrate"), "{name}");
        // Pods carry the selector's labels.
        for (k, v) in d["spec"]["selector"]["matchLabels"].as_mapping().unwrap() {
            assert_eq!(&d["spec"]["template"]["metadata"]["labels"][k.as_str().unwrap()], v, "{name}");
        }
        let replicas = d["spec"]["replicas"].as_u64().unwrap();
        if name == "relay" {
            assert_eq!(replicas, 2, "the relay runs active + hot standby");
            assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"].as_u64(), Some(0));
        } else {
            assert!(replicas >= 1, "{name}");
        }
        if name == "worker" {
            let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap();
            assert!(grace * 1000 > defaults.worker.shutdown_grace_ms, "the worker's grace period covers worker.shutdown_grace_ms");
        }
    }
    seen.sort();
    assert_eq!(seen, ["api", "relay", "worker"]);

    // A Service per component, on its container's named port.
    let services = of_kind(&docs, "Service");
    let mut port_names = Vec::new();
    for s in &services {
        let name = component(s);
        let d = deployments.iter().find(|d| component(d) == name).unwrap_or_else(|| panic!("Service {name} has no Deployment"));
        let target = s["spec"]["ports"][0]["targetPort"].as_str().unwrap();
        let container_port = d["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"].as_str().unwrap();
        assert_eq!(target, container_port, "Service {name}");
        for (k, v) in s["spec"]["selector"].as_mapping().unwrap() {
            assert_eq!(&d["spec"]["template"]["metadata"]["labels"][k.as_str().unwrap()], v, "Service {name} selects its pods");
        }
        port_names.push(s["spec"]["ports"][0]["name"].as_str().unwrap().to_string());
    }
    assert_eq!(services.len(), 3);

    // The ServiceMonitor scrapes /metrics on every Service's port.
    let monitors = of_kind(&docs, "ServiceMonitor");
    assert_eq!(monitors.len(), 1);
    assert_eq!(monitors[0]["apiVersion"].as_str(), Some("monitoring.coreos.com/v1"));
    let scraped: Vec<&str> = monitors[0]["spec"]["endpoints"].as_sequence().unwrap().iter().map(|e| e["port"].as_str().unwrap()).collect();
    for p in &port_names {
        assert!(scraped.contains(&p.as_str()), "port {p} is not scraped");
    }
    assert!(monitors[0]["spec"]["endpoints"].as_sequence().unwrap().iter().all(|e| e["path"].as_str() == Some("/metrics")));

    // The PrometheusRule holds exactly the rules of infra/prometheus/alerts.yml.
    let rules = of_kind(&docs, "PrometheusRule");
    assert_eq!(rules.len(), 1);
    let alerts: Value = serde_yaml::from_str(&read("infra/prometheus/alerts.yml")).unwrap();
    assert_eq!(rules[0]["spec"], alerts, "the PrometheusRule's spec is infra/prometheus/alerts.yml");
    assert_eq!(read("deploy/helm/railhook/files/alerts.yml"), read("infra/prometheus/alerts.yml"), "the chart's copy of the alerts is stale: cp infra/prometheus/alerts.yml deploy/helm/railhook/files/");

    // `helm test` runs the doctor with the same configuration.
    let pods = of_kind(&docs, "Pod");
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0]["metadata"]["annotations"]["helm.sh/hook"].as_str(), Some("test"));
    assert_eq!(pods[0]["spec"]["containers"][0]["args"][0].as_str(), Some("doctor"));

    // The Secret carries the two secrets the binary reads.
    let secrets = of_kind(&docs, "Secret");
    assert_eq!(secrets.len(), 1);
    for key in secrets[0]["stringData"].as_mapping().unwrap().keys() {
        assert_known_setting(key.as_str().unwrap(), &keys);
    }
}

#[test]
fn the_chart_leaves_out_what_is_turned_off() {
    let Some(helm) = helm() else {
        eprintln!("helm is not installed (scripts/lib.sh ensure_helm); the chart was not rendered");
        return;
    };
    let docs = render(&helm, &["serviceMonitor.enabled=false", "prometheusRule.enabled=false", "existingSecret=mine", "migrate.enabled=false", "relay.replicas=3"]);
    assert!(of_kind(&docs, "ServiceMonitor").is_empty());
    assert!(of_kind(&docs, "PrometheusRule").is_empty());
    assert!(of_kind(&docs, "Secret").is_empty());
    for d in of_kind(&docs, "Deployment") {
        let spec = &d["spec"]["template"]["spec"];
        assert!(spec["initContainers"].is_null(), "{}", component(d));
        assert_eq!(spec["containers"][0]["envFrom"][0]["secretRef"]["name"].as_str(), Some("mine"));
        if component(d) == "relay" {
            assert_eq!(d["spec"]["replicas"].as_u64(), Some(3));
        }
    }
}
