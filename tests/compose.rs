//! docker-compose.yml cannot run here (no Docker engine), so its YAML and its agreement with
//! the native infrastructure (scripts/infra, infra/) are checked instead.

use serde_yaml::Value;

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

fn compose() -> Value {
    serde_yaml::from_str(&read("docker-compose.yml")).expect("docker-compose.yml is valid YAML")
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence().map(|s| s.iter().filter_map(|x| x.as_str().map(String::from)).collect()).unwrap_or_default()
}

#[test]
fn compose_has_the_whole_topology() {
    let c = compose();
    let services = c["services"].as_mapping().expect("services");
    for name in ["postgres", "kafka", "migrate", "api", "relay", "worker", "doctor"] {
        assert!(services.contains_key(name), "service {name} missing");
    }
    // Nothing beyond them, so a new component is added here on purpose.
    assert_eq!(services.len(), 7, "{:?}", services.keys().collect::<Vec<_>>());
    // Active relay + hot standby.
    assert_eq!(c["services"]["relay"]["deploy"]["replicas"].as_u64(), Some(2), "two relays: active and standby");
    for (name, sub) in [("migrate", "migrate"), ("api", "api"), ("relay", "relay"), ("worker", "worker"), ("doctor", "doctor")] {
        let cmd = strings(&c["services"][name]["command"]);
        assert_eq!(cmd.first().map(String::as_str), Some(sub), "{name} runs `railhook {sub}`");
        assert_eq!(c["services"][name]["build"]["dockerfile"].as_str(), Some("infra/docker/Dockerfile"));
    }
    assert!(root().join("infra/docker/Dockerfile").exists());
}

#[test]
fn compose_postgres_matches_the_native_settings() {
    let c = compose();
    let cmd = strings(&c["services"]["postgres"]["command"]).join(" ");
    let native = read("infra/postgres/postgresql.conf");
    for key in ["wal_level", "max_replication_slots", "max_wal_senders", "max_slot_wal_keep_size"] {
        let line = native.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("{key} not in postgresql.conf"));
        let value = line.split('=').nth(1).unwrap().trim().trim_matches('\'');
        assert!(cmd.contains(&format!("{key}={value}")), "compose postgres lacks {key}={value}: {cmd}");
    }
}

#[test]
fn compose_kafka_is_kraft_like_the_native_broker() {
    let c = compose();
    let env = &c["services"]["kafka"]["environment"];
    assert_eq!(env["KAFKA_PROCESS_ROLES"].as_str(), Some("broker,controller"));
    assert!(env["KAFKA_CONTROLLER_QUORUM_VOTERS"].as_str().is_some());
    let native = read("infra/kafka/server.properties");
    assert!(native.contains("process.roles=broker,controller"));
    assert!(native.contains("auto.create.topics.enable=false"));
    assert_eq!(env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"].as_str(), Some("false"));
    let image = c["services"]["kafka"]["image"].as_str().unwrap();
    let pom = read("infra/kafka/pom.xml");
    let version = image.rsplit(':').next().unwrap();
    assert!(pom.contains(&format!("<kafka.version>{version}</kafka.version>")), "compose Kafka {version} differs from infra/kafka/pom.xml");
}

#[test]
fn compose_ports_match_scripts() {
    let c = compose();
    let lib = read("scripts/lib.sh");
    let pg = strings(&c["services"]["postgres"]["ports"]).join(",");
    let kafka = strings(&c["services"]["kafka"]["ports"]).join(",");
    assert!(pg.starts_with("127.0.0.1:54329:") && lib.contains("RAILHOOK_PG_PORT:-54329"), "{pg}");
    assert!(kafka.starts_with("127.0.0.1:19092:") && lib.contains("RAILHOOK_KAFKA_PORT:-19092"), "{kafka}");
}

#[test]
fn ci_runs_the_readme_test_command() {
    let ci = read(".ci/run");
    assert!(ci.lines().any(|l| l.trim() == "exec scripts/test"), ".ci/run must call scripts/test");
    let readme = read("README.md");
    assert!(readme.contains("scripts/test") && readme.contains("scripts/demo"));
}

/// Every `RAILHOOK_*` variable a Railhook service gets names a setting the binary reads (and
/// every `OTEL_*` one is documented in docs/TRACING.md), and
/// its health check asks `/readyz` on the port the component listens on.
#[test]
fn compose_railhook_services_use_real_settings_and_ports() {
    let c = compose();
    let defaults = railhook_config::Config::default();
    let keys = railhook_config::Config::keys();
    for name in ["migrate", "api", "relay", "worker", "doctor"] {
        let env = c["services"][name]["environment"].as_mapping().unwrap_or_else(|| panic!("{name} has no environment"));
        for var in env.keys().filter_map(|k| k.as_str()) {
            if railhook_config::ENV_ALIASES.iter().any(|(alias, _)| *alias == var) {
                continue;
            }
            // OpenTelemetry's standard variables, which the binary reads as they are.
            if var.starts_with("OTEL_") {
                assert!(read("docs/TRACING.md").contains(var), "{name}: {var} is not one docs/TRACING.md names");
                continue;
            }
            let key = var.strip_prefix("RAILHOOK_").unwrap_or_else(|| panic!("{name}: {var}")).to_ascii_lowercase().replace("__", ".");
            assert!(keys.contains(&key), "{name}: {var} names no setting ({key})");
        }
        let url = &env[&Value::from("RAILHOOK_DATABASE__URL")];
        assert!(url.as_str().is_some_and(|u| u.contains("@postgres:5432/")), "{name} reaches the postgres service");
        assert_eq!(env[&Value::from("RAILHOOK_KAFKA__BROKERS")].as_str(), Some("kafka:9092"), "{name} reaches the kafka service");
    }
    for (name, port) in [("api", 8080), ("relay", defaults.relay.ops_listen.port()), ("worker", defaults.worker.ops_listen.port())] {
        let test = strings(&c["services"][name]["healthcheck"]["test"]).join(" ");
        assert!(test.contains(&format!("http://127.0.0.1:{port}/readyz")), "{name} health check: {test}");
    }
    let api = strings(&c["services"]["api"]["command"]).join(" ");
    assert!(api.contains("--listen 0.0.0.0:8080"), "{api}");
    // The API's image has curl for the health checks.
    assert!(read("infra/docker/Dockerfile").contains("curl"));
}
