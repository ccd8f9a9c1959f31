//! The API's operational routes against the real Postgres, over real HTTP.

use std::sync::Arc;

use railhook_api::AppState;
use railhook_telemetry::Metrics;
use railhook_testkit::{test_config, TestDb};
use tokio_util::sync::CancellationToken;

async fn serve(state: AppState, shutdown: &CancellationToken) -> (std::net::SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (addr, tokio::spawn(railhook_api::run(state, listener, shutdown.clone())))
}

#[tokio::test]
async fn healthz_readyz_and_metrics_over_http() {
    let db = TestDb::new().await;
    let config = test_config(&db);
    let pool = railhook_store::connect_pool(&config.database).await.unwrap();
    let shutdown = CancellationToken::new();
    let (addr, server) = serve(AppState::new(Arc::new(config), pool, Metrics::new()), &shutdown).await;

    let http = reqwest::Client::new();
    let health = http.get(format!("http://{addr}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let ready = http.get(format!("http://{addr}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let body: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(body["checks"]["postgres"]["ok"], true);
    let metrics = http.get(format!("http://{addr}/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 200);

    shutdown.cancel();
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn readyz_is_503_while_postgres_is_unreachable() {
    let db = TestDb::new().await;
    let mut config = test_config(&db);
    config.database.url = "postgres://railhook@127.0.0.1:1/none".into();
    config.database.acquire_timeout_ms = 200;
    let pool = railhook_store::build_pool(&config.database).unwrap();
    let shutdown = CancellationToken::new();
    let (addr, _server) = serve(AppState::new(Arc::new(config), pool, Metrics::new()), &shutdown).await;
    let http = reqwest::Client::new();
    assert_eq!(http.get(format!("http://{addr}/healthz")).send().await.unwrap().status(), 200);
    let not_ready = http.get(format!("http://{addr}/readyz")).send().await.unwrap();
    assert_eq!(not_ready.status(), 503);
    let body: serde_json::Value = not_ready.json().await.unwrap();
    assert_eq!(body["checks"]["postgres"]["ok"], false);
    shutdown.cancel();
}
