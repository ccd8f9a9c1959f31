//! Validation at start: every problem at once, each saying how to fix it.

use crate::{Config, ConfigError, IngressConfig};

impl Config {
    /// Every problem at once, each with its fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        if !(self.database.url.starts_with("postgres://") || self.database.url.starts_with("postgresql://")) {
            problems.push("database.url must be a postgres:// URL, e.g. postgres://railhook@127.0.0.1:54329/railhook (set RAILHOOK_DATABASE__URL)".to_string());
        }
        if self.database.max_connections == 0 {
            problems.push("database.max_connections must be at least 1".into());
        }
        if self.transport == crate::Transport::Kafka && self.kafka.brokers.trim().is_empty() {
            problems.push("transport is kafka but kafka.brokers is empty: set kafka.brokers to host:port[,host:port] (e.g. RAILHOOK_KAFKA_BROKERS=127.0.0.1:19092), or set transport = \"inline\" to run without Kafka under `railhook all`".into());
        }
        if self.kafka.partitions < 1 {
            problems.push(format!("kafka.partitions is {}: it must be at least 1", self.kafka.partitions));
        }
        if self.kafka.replication_factor < 1 {
            problems.push("kafka.replication_factor must be at least 1".into());
        }
        for topic in [&self.kafka.deliveries_topic, &self.kafka.forwards_topic] {
            if !valid_topic(&format!("{}{}", self.kafka.topic_prefix, topic)) {
                problems.push(format!("kafka topic '{}{}' is not a valid Kafka topic name (letters, digits, '.', '_', '-', at most 249 characters)", self.kafka.topic_prefix, topic));
            }
        }
        for key in self.kafka.properties.keys() {
            if ["enable.idempotence", "acks", "bootstrap.servers"].contains(&key.as_str()) {
                problems.push(format!("kafka.properties.{key} is set by Railhook itself and may not be overridden (remove it)"));
            }
        }
        if self.api.max_body_bytes < 1024 {
            problems.push("api.max_body_bytes must be at least 1024".into());
        }
        if !(100..=600_000).contains(&self.api.header_read_timeout_ms) {
            problems.push(format!("api.header_read_timeout_ms is {}: it must be between 100 and 600000 (10000 is the default)", self.api.header_read_timeout_ms));
        }
        if !(100..=3_600_000).contains(&self.api.body_read_timeout_ms) {
            problems.push(format!("api.body_read_timeout_ms is {}: it must be between 100 and 3600000 (30000 is the default)", self.api.body_read_timeout_ms));
        }
        if self.api.ingest_lanes == 0 {
            problems.push("api.ingest_lanes must be at least 1 (1 is the default)".into());
        }
        if self.api.ingest_batch_max == 0 {
            problems.push("api.ingest_batch_max must be at least 1 (64 is the default; 1 runs one statement per POST)".into());
        }
        if self.api.max_connections == 0 {
            problems.push("api.max_connections must be at least 1 (1024 is the default)".into());
        }
        if self.api.linger_timeout_ms > 600_000 {
            problems.push(format!("api.linger_timeout_ms is {}: it must be between 0 (no lingering) and 600000 (5000 is the default)", self.api.linger_timeout_ms));
        }
        if self.api.ingest_pacing && self.api.ingest_hold_above_ms >= self.api.ingest_hold_ignore_above_ms {
            problems.push(format!(
                "api.ingest_hold_above_ms ({}) must be below api.ingest_hold_ignore_above_ms ({}), or set api.ingest_pacing = false",
                self.api.ingest_hold_above_ms, self.api.ingest_hold_ignore_above_ms
            ));
        }
        if self.api.ingest_max_hold_ms > 60_000 {
            problems.push(format!("api.ingest_max_hold_ms is {}: it must be at most 60000 (1000 is the default)", self.api.ingest_max_hold_ms));
        }
        if self.api.linger_max_bytes > 1 << 40 {
            problems.push(format!("api.linger_max_bytes is {}: it must be between 0 (no lingering) and 1099511627776 (4194304 is the default)", self.api.linger_max_bytes));
        }
        if !self.api.admin_token.is_empty() && self.api.admin_token.len() < 16 {
            problems.push("api.admin_token is shorter than 16 characters: use a long random value (e.g. `openssl rand -hex 24`)".into());
        }
        problems.extend(self.ingress.problems());
        for name in [&self.relay.slot_name, &self.relay.publication_name] {
            if !valid_identifier(name) {
                problems.push(format!("relay slot/publication name '{name}' must be lower-case letters, digits and '_' (at most 63), starting with a letter"));
            }
        }
        if self.relay.status_interval_ms == 0 || self.relay.status_interval_ms > 30_000 {
            problems.push("relay.status_interval_ms must be between 1 and 30000 (well inside wal_sender_timeout, 60 s by default)".into());
        }
        if self.relay.outbox_cleanup_interval_ms == 0 {
            problems.push("relay.outbox_cleanup_interval_ms must be at least 1".into());
        }
        if self.worker.max_in_flight == 0 {
            problems.push("worker.max_in_flight must be at least 1".into());
        }
        if self.worker.scheduler_interval_ms == 0 || self.worker.scheduler_interval_ms > 1_000 {
            problems.push("worker.scheduler_interval_ms must be between 1 and 1000 (retries fire within about a second of their due time)".into());
        }
        if !(self.worker.circuit_failure_ratio > 0.0 && self.worker.circuit_failure_ratio <= 1.0) {
            problems.push("worker.circuit_failure_ratio must be above 0 and at most 1".into());
        }
        let delays = &self.worker.incoming_retry_delays_seconds;
        if delays.len() > 50 || delays.iter().any(|d| !(1..=86_400).contains(d)) {
            problems.push("worker.incoming_retry_delays_seconds must list at most 50 waits, each from 1 to 86400 seconds (or be empty: the default ladder)".into());
        }
        if self.worker.processing_timeout_seconds == 0 {
            problems.push("worker.processing_timeout_seconds must be at least 1".into());
        }
        if !(1..=10_000).contains(&self.replay.batch_size) {
            problems.push("replay.batch_size must be from 1 to 10000 (Events per batch, one transaction each)".into());
        }
        if !(self.replay.max_deliveries_per_second.is_finite() && (1.0..=100_000.0).contains(&self.replay.max_deliveries_per_second)) {
            problems.push("replay.max_deliveries_per_second must be from 1 to 100000 (100 is the default)".into());
        }
        if !(1..=3_650).contains(&self.replay.max_range_days) {
            problems.push("replay.max_range_days must be from 1 to 3650".into());
        }
        let r = &self.retention;
        for (key, days) in [("events_days", r.events_days), ("failed_days", r.failed_days), ("attempts_days", r.attempts_days)] {
            if !(days.is_finite() && days > 0.0 && days <= 36_500.0) {
                problems.push(format!("retention.{key} is {days}: it must be above 0 and at most 36500 (days; fractions allowed, 0.0035 is about 5 minutes)"));
            }
        }
        if !(r.interval_seconds.is_finite() && (0.1..=86_400.0).contains(&r.interval_seconds)) {
            problems.push("retention.interval_seconds must be from 0.1 to 86400 (60 is the default)".into());
        }
        if !(10..=100_000).contains(&r.batch_rows) {
            problems.push("retention.batch_rows must be from 10 to 100000 (1000 is the default)".into());
        }
        if !(1..=100).contains(&r.max_busy_percent) {
            problems.push("retention.max_busy_percent must be from 1 to 100 (10 is the default)".into());
        }
        if r.max_rows_per_second > 10_000_000 {
            problems.push("retention.max_rows_per_second must be at most 10000000 (3000 is the default; 0: no cap)".into());
        }
        if !(1..=1_000).contains(&r.batch_target_ms) {
            problems.push("retention.batch_target_ms must be from 1 to 1000 (10 is the default; batches are meant to stay under 100 ms)".into());
        }
        let t = &self.ui.trace_url_template;
        if !t.is_empty() && (!(t.starts_with("http://") || t.starts_with("https://")) || !t.contains("{trace_id}") || t.contains([' ', '"', '<', '>'])) {
            problems.push(format!("ui.trace_url_template '{t}' must be an http(s) URL with {{trace_id}} in it, e.g. http://jaeger:16686/trace/{{trace_id}} (or empty)"));
        }
        problems.extend(self.kafka_source_problems());
        for cidr in &self.network.allow_cidrs {
            if !valid_cidr(cidr) {
                problems.push(format!("network.allow_cidrs entry '{cidr}' is not a CIDR such as 127.0.0.0/8 or ::1/128"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }
}

impl Config {
    /// What [`Config::validate`] reports about the `kafka_source.*` keys (only when the
    /// source is on: its defaults must not trouble a process without it).
    fn kafka_source_problems(&self) -> Vec<String> {
        let s = &self.kafka_source;
        let mut problems = Vec::new();
        if s.topics.is_empty() {
            return problems;
        }
        if s.brokers.trim().is_empty() && self.kafka.brokers.trim().is_empty() {
            problems.push("kafka_source.topics is set but neither kafka_source.brokers nor kafka.brokers names a broker: set kafka_source.brokers to host:port[,host:port] (RAILHOOK_KAFKA_SOURCE__BROKERS)".into());
        }
        for topic in self.kafka_source_topics().iter().chain(std::iter::once(&self.kafka_source_dead_letter_topic())) {
            if !valid_topic(topic) {
                problems.push(format!("kafka_source topic '{topic}' is not a valid Kafka topic name (letters, digits, '.', '_', '-', at most 249 characters)"));
            }
        }
        if self.kafka_source_topics().contains(&self.kafka_source_dead_letter_topic()) {
            problems.push("kafka_source.dead_letter_topic is one of kafka_source.topics: a refused record would come back for ever; name another topic".into());
        }
        if s.group_id.trim().is_empty() {
            problems.push("kafka_source.group_id must not be empty (the consumer group that holds the source's offsets)".into());
        }
        if s.group_id == self.worker.group_id {
            problems.push(format!("kafka_source.group_id is '{}', the same as worker.group_id: the two consumers need their own groups", s.group_id));
        }
        if !s.project.is_empty() && !looks_like_project_id(&s.project) {
            problems.push(format!("kafka_source.project '{}' is not a project id (proj_ followed by 26 characters), or leave it empty so each record names its Project", s.project));
        }
        for (key, name) in [("project_header", &s.project_header), ("type_header", &s.type_header), ("idempotency_key_header", &s.idempotency_key_header)] {
            if name.trim().is_empty() {
                problems.push(format!("kafka_source.{key} must not be empty"));
            }
        }
        if !(1024..=64 * 1024 * 1024).contains(&s.max_record_bytes) {
            problems.push(format!("kafka_source.max_record_bytes is {}: it must be between 1024 and 67108864 (1048576 is the default)", s.max_record_bytes));
        }
        if !(1..=10_000).contains(&s.batch_max_records) {
            problems.push(format!("kafka_source.batch_max_records is {}: it must be from 1 to 10000 (500 is the default)", s.batch_max_records));
        }
        if s.batch_max_wait_ms > 10_000 {
            problems.push(format!("kafka_source.batch_max_wait_ms is {}: it must be at most 10000 (5 is the default)", s.batch_max_wait_ms));
        }
        if !(1..=64).contains(&s.connections) || s.connections > self.database.max_connections {
            problems.push(format!(
                "kafka_source.connections is {}: it must be from 1 to 64 and at most database.max_connections ({}); 8 is the default",
                s.connections, self.database.max_connections
            ));
        }
        for key in s.properties.keys() {
            if ["enable.idempotence", "acks", "bootstrap.servers", "group.id", "enable.auto.commit", "enable.auto.offset.store"].contains(&key.as_str()) {
                problems.push(format!("kafka_source.properties.{key} is set by Railhook itself and may not be overridden (remove it)"));
            }
        }
        problems
    }
}

impl IngressConfig {
    /// What [`Config::validate`] reports about the `ingress.*` keys.
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !(1024..=64 * 1024 * 1024).contains(&self.max_body_bytes) {
            problems.push(format!("ingress.max_body_bytes is {}: it must be between 1024 and 67108864 (524288 is the default)", self.max_body_bytes));
        }
        if self.secret_overlap_seconds > 30 * 24 * 3600 {
            problems.push(format!("ingress.secret_overlap_seconds is {}: it must be at most 2592000 (30 days; 86400 is the default)", self.secret_overlap_seconds));
        }
        let url = self.public_url.trim_end_matches('/');
        let valid_url = url.is_empty()
            || ((url.starts_with("http://") || url.starts_with("https://")) && !url.contains(['?', '#', ' ']) && url.split("://").nth(1).is_some_and(|rest| !rest.is_empty()));
        if !valid_url {
            problems.push(format!("ingress.public_url '{}' must be an http(s) URL without query, e.g. https://hooks.example.com (or empty)", self.public_url));
        }
        problems
    }
}

fn valid_topic(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 249
        && name != "."
        && name != ".."
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// `proj_` and 26 base32 characters (the text form of a `railhook_core::ProjectId`; this crate
/// does not depend on the core, the worker parses it again).
fn looks_like_project_id(text: &str) -> bool {
    text.strip_prefix("proj_").is_some_and(|rest| rest.len() == 26 && rest.bytes().all(|b| b.is_ascii_alphanumeric()))
}

fn valid_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && name.len() <= 63
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn valid_cidr(cidr: &str) -> bool {
    let Some((addr, len)) = cidr.split_once('/') else { return false };
    let Ok(len) = len.parse::<u8>() else { return false };
    match addr.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => len <= 32,
        Ok(std::net::IpAddr::V6(_)) => len <= 128,
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use crate::{Config, FileSource, Overrides};

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn invalid_values_say_how_to_fix() {
        let err = Config::load_from(
            FileSource::Default,
            &env(&[("RAILHOOK_KAFKA__PARTITIONS", "0"), ("RAILHOOK_DATABASE__URL", "mysql://x")]),
            &Overrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("kafka.partitions is 0"), "{err}");
        assert!(err.contains("RAILHOOK_DATABASE__URL"), "{err}");
    }

    #[test]
    fn server_limits_are_validated() {
        let err = Config::load_from(
            FileSource::Default,
            &env(&[("RAILHOOK_API__HEADER_READ_TIMEOUT_MS", "0"), ("RAILHOOK_API__BODY_READ_TIMEOUT_MS", "99"), ("RAILHOOK_API__MAX_CONNECTIONS", "0")]),
            &Overrides::default(),
        )
        .unwrap_err()
        .to_string();
        for key in ["api.header_read_timeout_ms is 0", "api.body_read_timeout_ms is 99", "api.max_connections must be at least 1"] {
            assert!(err.contains(key), "{key}: {err}");
        }
        let ok = Config::load_from(FileSource::Default, &env(&[("RAILHOOK_API__MAX_CONNECTIONS", "8")]), &Overrides::default()).unwrap();
        assert_eq!((ok.api.max_connections, ok.api.header_read_timeout_ms, ok.api.body_read_timeout_ms), (8, 10_000, 30_000));
        assert_eq!((ok.api.linger_timeout_ms, ok.api.linger_max_bytes), (5_000, 4 << 20));
    }

    #[test]
    fn lingering_bounds_are_validated() {
        let err = Config::load_from(
            FileSource::Default,
            &env(&[("RAILHOOK_API__LINGER_TIMEOUT_MS", "600001"), ("RAILHOOK_API__LINGER_MAX_BYTES", "1099511627777")]),
            &Overrides::default(),
        )
        .unwrap_err()
        .to_string();
        for key in ["api.linger_timeout_ms is 600001", "api.linger_max_bytes is 1099511627777"] {
            assert!(err.contains(key), "{key}: {err}");
        }
        let off = Config::load_from(
            FileSource::Default,
            &env(&[("RAILHOOK_API__LINGER_TIMEOUT_MS", "0"), ("RAILHOOK_API__LINGER_MAX_BYTES", "0")]),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!((off.api.linger_timeout_ms, off.api.linger_max_bytes), (0, 0));
    }

    #[test]
    fn ingress_keys_are_validated() {
        let err = Config::load_from(
            FileSource::Default,
            &env(&[("RAILHOOK_INGRESS__MAX_BODY_BYTES", "10"), ("RAILHOOK_INGRESS__PUBLIC_URL", "ftp://x")]),
            &Overrides::default(),
        )
        .unwrap_err()
        .to_string();
        for key in ["ingress.max_body_bytes is 10", "ingress.public_url 'ftp://x'"] {
            assert!(err.contains(key), "{key}: {err}");
        }
        let ok = Config::load_from(FileSource::Default, &env(&[("RAILHOOK_INGRESS__PUBLIC_URL", "https://hooks.example.com/in/")]), &Overrides::default()).unwrap();
        assert_eq!((ok.ingress.max_body_bytes, ok.ingress.secret_overlap_seconds), (512 * 1024, 86_400));
    }

    #[test]
    fn the_trace_url_template_is_validated() {
        for bad in ["jaeger:16686/trace/{trace_id}", "http://jaeger:16686/trace/", "http://x/{trace_id} y"] {
            let err = Config::load_from(FileSource::Default, &env(&[("RAILHOOK_UI__TRACE_URL_TEMPLATE", bad)]), &Overrides::default()).unwrap_err().to_string();
            assert!(err.contains("ui.trace_url_template"), "{bad}: {err}");
        }
        let ok = Config::load_from(FileSource::Default, &env(&[("RAILHOOK_UI__TRACE_URL_TEMPLATE", "http://jaeger:16686/trace/{trace_id}")]), &Overrides::default()).unwrap();
        assert_eq!(ok.ui.trace_url("abc").as_deref(), Some("http://jaeger:16686/trace/abc"));
        assert_eq!(Config::default().ui.trace_url("abc"), None, "off by default");
    }

    #[test]
    fn kafka_source_keys_are_validated_only_when_it_is_on() {
        let off = Config::load_from(FileSource::Default, &env(&[("RAILHOOK_KAFKA_SOURCE__PROJECT", "nope")]), &Overrides::default());
        assert!(off.is_ok(), "the source is off: its keys are not checked");
        let err = Config::load_from(
            FileSource::Default,
            &env(&[
                ("RAILHOOK_KAFKA_SOURCE__TOPICS", r#"["orders", "bad topic"]"#),
                ("RAILHOOK_KAFKA_SOURCE__PROJECT", "prj_1"),
                ("RAILHOOK_KAFKA_SOURCE__GROUP_ID", "railhook-worker"),
                ("RAILHOOK_KAFKA_SOURCE__BATCH_MAX_RECORDS", "0"),
                ("RAILHOOK_KAFKA_SOURCE__DEAD_LETTER_TOPIC", "orders"),
            ]),
            &Overrides::default(),
        )
        .unwrap_err()
        .to_string();
        for key in [
            "neither kafka_source.brokers nor kafka.brokers",
            "kafka_source topic 'bad topic'",
            "kafka_source.project 'prj_1'",
            "the same as worker.group_id",
            "kafka_source.batch_max_records is 0",
            "kafka_source.dead_letter_topic is one of kafka_source.topics",
        ] {
            assert!(err.contains(key), "{key}: {err}");
        }
        let ok = Config::load_from(
            FileSource::Default,
            &env(&[("RAILHOOK_KAFKA_SOURCE__TOPICS", r#"["orders"]"#), ("RAILHOOK_KAFKA_SOURCE__BROKERS", "127.0.0.1:19092"), ("RAILHOOK_KAFKA_SOURCE__FORMAT", "headers")]),
            &Overrides::default(),
        )
        .unwrap();
        assert!(ok.kafka_source_enabled());
        assert_eq!(ok.kafka_source_kafka().brokers, "127.0.0.1:19092");
        assert_eq!(ok.kafka_source.format, crate::RecordFormat::Headers);
    }
}
