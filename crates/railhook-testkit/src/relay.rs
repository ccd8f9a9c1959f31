//! Helpers for relay tests: outbox rows in, announcements out of Kafka, slot positions.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use railhook_config::Config;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Headers;
use rdkafka::Message;
use tokio_postgres::Client;
use uuid::Uuid;

/// Inserts one outbox row per route in one statement (one transaction); returns the
/// delivery ids in insert order. No Delivery rows are written: the relay reads the outbox only.
pub async fn insert_outbox(client: &Client, project: Uuid, routes: &[Uuid]) -> Vec<Uuid> {
    let deliveries: Vec<Uuid> = routes.iter().map(|_| Uuid::now_v7()).collect();
    client
        .execute(
            "INSERT INTO outbox (project_id, delivery_id, routing_id, reason)
             SELECT $1, d, r, 'created' FROM unnest($2::uuid[], $3::uuid[]) WITH ORDINALITY AS t(d, r, n) ORDER BY n",
            &[&project, &deliveries, &routes],
        )
        .await
        .expect("insert outbox rows");
    deliveries
}

/// `pg_current_wal_lsn()` as a number.
pub async fn current_lsn(client: &Client) -> u64 {
    let lsn: String = client.query_one("SELECT pg_current_wal_lsn()::text", &[]).await.expect("current lsn").get(0);
    parse_lsn(&lsn)
}

pub fn parse_lsn(text: &str) -> u64 {
    let (hi, lo) = text.split_once('/').expect("LSN is hi/lo");
    (u64::from_str_radix(hi, 16).expect("hex") << 32) | u64::from_str_radix(lo, 16).expect("hex")
}

/// The slot's `confirmed_flush_lsn` and active pid, `None` when the slot does not exist.
pub async fn slot(client: &Client, slot: &str) -> Option<(u64, Option<i32>)> {
    client
        .query_opt("SELECT confirmed_flush_lsn::text, active_pid FROM pg_replication_slots WHERE slot_name = $1", &[&slot])
        .await
        .expect("query slot")
        .map(|r| (r.get::<_, Option<String>>(0).map(|l| parse_lsn(&l)).unwrap_or(0), r.get(1)))
}

/// One announcement as read back from Kafka.
#[derive(Debug, Clone)]
pub struct Announcement {
    pub key: String,
    pub delivery_id: Option<String>,
    pub forward_id: Option<String>,
    pub reason: String,
    pub outbox_id: i64,
    pub commit_lsn: Option<String>,
}

/// Reads a topic from the beginning and keeps everything it saw.
pub struct Announcements {
    consumer: StreamConsumer,
    pub seen: Vec<Announcement>,
}

impl Announcements {
    /// Subscribes to `topic` with a group of its own, from the earliest offset.
    pub fn subscribe(config: &Config, topic: &str) -> Announcements {
        Self::subscribe_at(config, &config.kafka.brokers, topic)
    }

    pub fn subscribe_at(config: &Config, brokers: &str, topic: &str) -> Announcements {
        let mut kafka = config.kafka.clone();
        kafka.brokers = brokers.to_string();
        let consumer: StreamConsumer = railhook_kafka::client_config(&kafka)
            .set("group.id", format!("{}check-{}", config.kafka.topic_prefix, Uuid::new_v4().simple()))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            // The topic may be seconds old: look for it again soon rather than after 5 minutes.
            .set("topic.metadata.refresh.interval.ms", "500")
            .create()
            .expect("create consumer");
        consumer.subscribe(&[topic]).expect("subscribe");
        Announcements { consumer, seen: Vec::new() }
    }

    /// Consumes until `done(&seen)` holds; panics after `timeout` with `what` and a summary.
    pub async fn until(&mut self, timeout: Duration, what: &str, done: impl Fn(&[Announcement]) -> bool) {
        if let Err(e) = self.try_until(timeout, what, done).await {
            panic!("{e}");
        }
    }

    /// [`Announcements::until`] that returns the failure instead of panicking.
    pub async fn try_until(&mut self, timeout: Duration, what: &str, done: impl Fn(&[Announcement]) -> bool) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last_error: Option<String> = None;
        let mut stream = self.consumer.stream();
        while !done(&self.seen) {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let msg = match tokio::time::timeout(left, stream.next()).await {
                Ok(Some(Ok(m))) => m,
                // Transient on a topic seconds old or a broker just restarted (e.g. unknown
                // topic or partition): keep reading until the deadline.
                Ok(Some(Err(e))) => {
                    last_error = Some(e.to_string());
                    continue;
                }
                Ok(None) => return Err(format!("consumer stream ended while waiting for {what}")),
                Err(_) => return Err(format!("timed out after {timeout:?} waiting for {what}; {} announcements seen; last consumer error: {last_error:?}", self.seen.len())),
            };
            let value: serde_json::Value = serde_json::from_slice(msg.payload().unwrap_or_default()).expect("JSON value");
            let header = |name: &str| {
                msg.headers().and_then(|h| h.iter().find(|x| x.key == name).and_then(|x| x.value).map(|v| String::from_utf8_lossy(v).into_owned()))
            };
            self.seen.push(Announcement {
                key: String::from_utf8_lossy(msg.key().unwrap_or_default()).into_owned(),
                delivery_id: value["delivery_id"].as_str().map(str::to_string),
                forward_id: value["forward_id"].as_str().map(str::to_string),
                reason: value["reason"].as_str().unwrap_or_default().to_string(),
                outbox_id: value["outbox_id"].as_i64().expect("outbox_id"),
                commit_lsn: header("commit_lsn"),
            });
        }
        Ok(())
    }

    /// How often each delivery id was announced.
    pub fn delivery_counts(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for a in &self.seen {
            if let Some(d) = &a.delivery_id {
                *counts.entry(d.clone()).or_insert(0) += 1;
            }
        }
        counts
    }
}

/// Whether every id in `want` was seen at least once.
pub fn all_announced(seen: &[Announcement], want: &[String]) -> bool {
    let got: std::collections::HashSet<&str> = seen.iter().filter_map(|a| a.delivery_id.as_deref()).collect();
    want.iter().all(|w| got.contains(w.as_str()))
}

/// A project with `endpoints` Endpoints, each subscribed to `**`, made through the store
/// functions the API uses.
pub struct Fixture {
    pub project: railhook_core::ProjectId,
    pub endpoints: Vec<railhook_core::EndpointId>,
}

/// How [`Fixture::create_with`] subscribes each Endpoint.
#[derive(Debug, Clone)]
pub struct SubscriptionSpec {
    pub max_attempts: i16,
    pub timeout_seconds: i16,
    pub retry_delays: Option<Vec<i32>>,
    /// Ordered delivery (DESIGN.md 6.5).
    pub ordering: bool,
}

impl Default for SubscriptionSpec {
    fn default() -> Self {
        SubscriptionSpec { max_attempts: 5, timeout_seconds: 30, retry_delays: None, ordering: false }
    }
}

impl Fixture {
    pub async fn create(client: &Client, endpoints: usize) -> Fixture {
        let urls: Vec<String> = (0..endpoints).map(|i| format!("http://127.0.0.1:9/{i}")).collect();
        Self::create_with(client, &urls, &SubscriptionSpec::default()).await.0
    }

    /// One Endpoint per URL, each subscribed to `**` per `spec`; returns the fixture and
    /// each Endpoint's signing secret.
    /// A fresh database with `endpoints` Endpoints (at unreachable URLs) subscribed with the
    /// default spec, and a pool on it: for tests of the worker's SQL that send nothing.
    pub async fn in_fresh_db(endpoints: usize) -> (crate::TestDb, railhook_store::Pool, Fixture) {
        let db = crate::TestDb::new().await;
        let config = crate::test_config(&db);
        let urls: Vec<String> = (0..endpoints).map(|i| format!("http://127.0.0.1:9/{i}")).collect();
        let (fixture, _) = Fixture::create_with(&db.client().await, &urls, &SubscriptionSpec::default()).await;
        let pool = railhook_store::build_pool(&config.database).expect("pool");
        (db, pool, fixture)
    }

    pub async fn create_with(client: &Client, urls: &[String], spec: &SubscriptionSpec) -> (Fixture, Vec<String>) {
        use railhook_store::{endpoints as ep, subscriptions as subs, tenancy};
        let org = tenancy::create_organization(client, "relay-test").await.expect("org");
        let project = tenancy::create_project(client, org.id, "relay-test").await.expect("project").expect("org exists");
        let headers = ep::EndpointHeaders::new();
        let mut ids = Vec::new();
        let mut secrets = Vec::new();
        for url in urls {
            let secret = railhook_core::signing::EndpointSecret::generate();
            let new = ep::NewEndpoint { url, description: "", enabled: true, rate_limit_per_second: None, headers: &headers, secret: secret.as_str() };
            let endpoint = ep::create_endpoint(client, project.id, new).await.expect("endpoint");
            let sub = subs::NewSubscription {
                endpoint_id: endpoint.id,
                event_type_pattern: "**",
                ordering: spec.ordering,
                max_attempts: spec.max_attempts,
                timeout_seconds: spec.timeout_seconds,
                retry_delays: spec.retry_delays.as_deref(),
                enabled: true,
            };
            subs::create_subscription(client, project.id, sub).await.expect("subscription").expect("endpoint exists");
            ids.push(endpoint.id);
            secrets.push(secret.as_str().to_string());
        }
        (Fixture { project: project.id, endpoints: ids }, secrets)
    }

    /// Ingests one event the way `POST /v1/events` does; returns its delivery ids.
    pub async fn ingest(&self, pool: &railhook_store::Pool, event_type: &str) -> Vec<String> {
        use railhook_store::events;
        let client = pool.get().await.expect("pooled connection");
        let ty = railhook_core::pattern::EventType::parse(event_type).expect("event type");
        let payload = serde_json::json!({"n": Uuid::now_v7().to_string()});
        let new = events::NewEvent {
            caller: events::Caller::Project(self.project),
            event_type,
            payload: &payload,
            idempotency_key: None,
            request_sha256: vec![0; 32],
            candidate_patterns: railhook_core::pattern::candidate_patterns(&ty),
            trace: None,
        };
        let event = match events::ingest(&client, new).await.expect("ingest") {
            events::IngestOutcome::Created(e) => e,
            _ => panic!("no idempotency key, so always created"),
        };
        client
            .query("SELECT id FROM deliveries WHERE event_id = $1", &[&event.id.0])
            .await
            .expect("deliveries")
            .iter()
            .map(|r| railhook_core::DeliveryId(r.get(0)).to_string())
            .collect()
    }
}

/// Inserts, on `client` (inside whatever transaction it has open), a new PENDING Delivery
/// `id` copied from Delivery `of` (same event, endpoint and Subscription; `replay_of = of`,
/// so the once-per-Subscription index allows it). Tests use it for a Delivery whose commit
/// they control.
pub async fn insert_delivery_copy(client: &Client, id: Uuid, of: Uuid) {
    client
        .execute(
            "INSERT INTO deliveries (id, project_id, event_id, endpoint_id, subscription_id, max_attempts, retry_delays, timeout_seconds, ordered, replay_of)
             SELECT $1, project_id, event_id, endpoint_id, subscription_id, max_attempts, retry_delays, timeout_seconds, ordered, id FROM deliveries WHERE id = $2",
            &[&id, &of],
        )
        .await
        .expect("insert a copy of a Delivery");
}

/// Claims every Delivery announced through the outbox table (the Outbox mode), in the
/// announcements' order and in one batch, as a worker's claim would with no limits: an
/// ordered Delivery gets its Sequence Number there (migration 0035). For tests of what the
/// API or a Replay writes, without a worker. Answers per announcement, in order.
pub async fn claim_announced(pool: &railhook_store::Pool) -> Vec<railhook_store::lifecycle::ClaimResult> {
    use railhook_store::lifecycle::{claim_batch, ClaimRequest, Limits};
    let client = pool.get().await.expect("pooled connection");
    let requests: Vec<ClaimRequest> = client
        .query("SELECT delivery_id FROM outbox WHERE delivery_id IS NOT NULL ORDER BY id", &[])
        .await
        .expect("outbox")
        .iter()
        .enumerate()
        .map(|(i, r)| ClaimRequest {
            delivery: railhook_core::DeliveryId(r.get(0)),
            token: railhook_core::ClaimToken::new(),
            hint: None,
            wait: false,
            announced_at: None,
            position: Some((0, i as i64)),
        })
        .collect();
    let limits = Limits { endpoint_concurrency: 0, project_concurrency: 0, project_rate: 0, circuit_cooldown_s: 30.0, probe_timeout_s: 300.0, ordering_gap_s: 60.0, synchronous_commit: false };
    claim_batch(&client, &requests, &limits).await.expect("claim")
}
