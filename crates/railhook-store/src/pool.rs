//! The connection pool every component uses.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, RecyclingMethod, Runtime};
use railhook_config::DatabaseConfig;
use crate::{DatabaseUrl, StoreError};

pub type Pool = deadpool_postgres::Pool;
pub use deadpool_postgres::PoolError;

/// Builds a pool for `config.url` and checks that one connection can be made. Its
/// connections show as `application_name` (unless the URL names one) in
/// `pg_stat_activity`, so an operator can tell the components' load apart.
pub async fn connect_pool_as(config: &DatabaseConfig, application_name: &str) -> Result<Pool, StoreError> {
    let pool = build_pool_as(config, application_name)?;
    let client = pool.get().await.map_err(|e| StoreError::Connect(crate::error::error_chain(&e)))?;
    client.simple_query("SELECT 1").await?;
    Ok(pool)
}

/// Builds a pool without connecting: connections are made on first use, with TLS as the
/// URL's `sslmode` asks (see [`crate::connection`]).
pub fn build_pool_as(config: &DatabaseConfig, application_name: &str) -> Result<Pool, StoreError> {
    let mut url = DatabaseUrl::parse(&config.url)?;
    if url.pg.get_application_name().is_none() {
        url.pg.application_name(application_name);
    }
    let tls = url.tls_connector()?;
    let manager = Manager::from_config(url.pg, tls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    let timeout = Some(Duration::from_millis(config.acquire_timeout_ms));
    Pool::builder(manager)
        .max_size(config.max_connections)
        .runtime(Runtime::Tokio1)
        .wait_timeout(timeout)
        .create_timeout(timeout)
        .recycle_timeout(timeout)
        .build()
        .map_err(|e| StoreError::Pool(e.to_string()))
}

/// [`connect_pool_as`] named `railhook` (tools and tests).
pub async fn connect_pool(config: &DatabaseConfig) -> Result<Pool, StoreError> {
    connect_pool_as(config, "railhook").await
}

/// [`build_pool_as`] named `railhook` (tools and tests).
pub fn build_pool(config: &DatabaseConfig) -> Result<Pool, StoreError> {
    build_pool_as(config, "railhook")
}
