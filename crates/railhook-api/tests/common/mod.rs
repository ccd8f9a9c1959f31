//! Shared setup of the API tests: a real server on 127.0.0.1:0 against a fresh database.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use railhook_api::AppState;
use railhook_config::Config;
use railhook_telemetry::Metrics;
use railhook_testkit::{test_config, TestDb};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

pub struct Api {
    pub db: TestDb,
    pub config: Config,
    pub addr: SocketAddr,
    pub http: reqwest::Client,
    pub shutdown: CancellationToken,
}

impl Drop for Api {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub struct TestProject {
    pub id: String,
    pub key: String,
}

impl Api {
    pub async fn start() -> Api {
        let db = TestDb::new().await;
        let config = test_config(&db);
        Self::start_with(db, config).await
    }

    pub async fn start_with(db: TestDb, config: Config) -> Api {
        Self::start_resolving(db, config, None).await
    }

    /// As [`Api::start_with`]; with `resolver`, Endpoint host names get its fixed answers
    /// instead of the system resolver's.
    pub async fn start_resolving(db: TestDb, config: Config, resolver: Option<railhook_core::address::Resolver>) -> Api {
        let pool = railhook_store::connect_pool(&config.database).await.unwrap();
        let mut state = AppState::new(Arc::new(config.clone()), pool, Metrics::new());
        if let Some(resolver) = resolver {
            state.resolver = resolver;
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        tokio::spawn(railhook_api::run(state, listener, shutdown.clone()));
        Api { db, config, addr, http: reqwest::Client::new(), shutdown }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// An organization and a project, through the admin routes.
    pub async fn project(&self) -> TestProject {
        let token = &self.config.api.admin_token;
        let org: Value = self
            .http
            .post(self.url("/v1/admin/organizations"))
            .bearer_auth(token)
            .json(&json!({"name": "acme"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let org_id = org["id"].as_str().unwrap();
        let resp = self
            .http
            .post(self.url(&format!("/v1/admin/organizations/{org_id}/projects")))
            .bearer_auth(token)
            .json(&json!({"name": "shop"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        let project: Value = resp.json().await.unwrap();
        TestProject {
            id: project["id"].as_str().unwrap().to_string(),
            key: project["api_key"]["secret"].as_str().unwrap().to_string(),
        }
    }

    pub async fn post(&self, key: &str, path: &str, body: Value) -> (u16, Value) {
        let resp = self.http.post(self.url(path)).bearer_auth(key).json(&body).send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, key: &str, path: &str) -> (u16, Value) {
        let resp = self.http.get(self.url(path)).bearer_auth(key).send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn count(&self, sql: &str) -> i64 {
        self.db.client().await.query_one(sql, &[]).await.unwrap().get(0)
    }
}

/// The uuid behind a prefixed id, for SQL in tests.
pub fn uuid_of(id: &str) -> uuid::Uuid {
    let (prefix, _) = id.split_once('_').unwrap();
    match prefix {
        "proj" => id.parse::<railhook_core::ProjectId>().unwrap().0,
        "ep" => id.parse::<railhook_core::EndpointId>().unwrap().0,
        "evt" => id.parse::<railhook_core::EventId>().unwrap().0,
        "sub" => id.parse::<railhook_core::SubscriptionId>().unwrap().0,
        "dlv" => id.parse::<railhook_core::DeliveryId>().unwrap().0,
        "src" => id.parse::<railhook_core::SourceId>().unwrap().0,
        "dst" => id.parse::<railhook_core::DestinationId>().unwrap().0,
        "ine" => id.parse::<railhook_core::IncomingEventId>().unwrap().0,
        other => panic!("unknown prefix {other}"),
    }
}

/// Hex HMAC-SHA256 of the concatenated `parts`, as providers sign.
pub fn hmac_sha256_hex(key: &[u8], parts: &[&[u8]]) -> String {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
    for part in parts {
        mac.update(part);
    }
    hex::encode(mac.finalize().into_bytes())
}

/// An endpoint and subscriptions, written directly (the endpoint routes have their own tests).
pub async fn endpoint_with(api: &Api, project: &str, patterns: &[(&str, bool)]) -> uuid::Uuid {
    let client = api.db.client().await;
    let ep = uuid::Uuid::now_v7();
    client
        .execute("INSERT INTO endpoints (id, project_id, url) VALUES ($1, $2, 'http://127.0.0.1:9/hook')", &[&ep, &uuid_of(project)])
        .await
        .unwrap();
    for (pattern, ordering) in patterns {
        client
            .execute(
                "INSERT INTO subscriptions (id, project_id, endpoint_id, event_type_pattern, ordering) VALUES ($1, $2, $3, $4, $5)",
                &[&uuid::Uuid::now_v7(), &uuid_of(project), &ep, pattern, ordering],
            )
            .await
            .unwrap();
    }
    ep
}

/// A sample of the API's `/metrics` by its name (with labels, if any), 0 when absent.
pub async fn metric(api: &Api, name: &str) -> f64 {
    let text = api.http.get(api.url("/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0.0)
}
