//! The test harness. Every integration test gets:
//! - its own database, cloned from a migrated template (`CREATE DATABASE ... TEMPLATE`), so
//!   a test starts in milliseconds with the full schema and shares nothing with its peers;
//! - its own Kafka topic prefix, so tests can run in parallel against one broker.
//!
//! Where the servers are comes from `RAILHOOK_TEST_PG_URL` (a superuser-free role with
//! CREATEDB on the `postgres` database) and `RAILHOOK_TEST_KAFKA_BROKERS`; `scripts/test`
//! sets both, and the defaults match `scripts/infra`.

use std::time::Duration;

pub mod bigdb;
pub mod kafka;
pub mod pg;
pub mod relay;
pub mod tls;

use railhook_config::Config;
use railhook_store::Migrator;
use tokio_postgres::Client;

/// Prefix of every database the harness creates; `scripts/test` drops leftovers.
pub const TEST_DB_PREFIX: &str = "rh_test_";
const TEMPLATE_LOCK: i64 = 0x7274_6573_7474_706c;

/// A free loopback port for a server a test starts, chosen below the ephemeral range: a port
/// from `bind(127.0.0.1:0)` is released before the child binds it, and any outgoing connection
/// on the machine may take it meanwhile (CI lost a run to that: `relay.ops_listen` "Address
/// already in use"). Below the range only another listener can, and the pick is random.
pub fn free_port() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse::<u16>().ok()))
        .unwrap_or(32_768);
    for _ in 0..500 {
        if low <= 21_000 {
            break;
        }
        let port = 20_000 + (uuid::Uuid::new_v4().as_u128() % u128::from(low - 20_000)) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

pub fn admin_url() -> String {
    std::env::var("RAILHOOK_TEST_PG_URL").unwrap_or_else(|_| "postgres://railhook@127.0.0.1:54329/postgres".into())
}

pub fn kafka_brokers() -> String {
    std::env::var("RAILHOOK_TEST_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:19092".into())
}

/// Replaces the database name of a postgres URL.
pub fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let base = match base.rfind('/') {
        Some(i) if base[..i].contains("://") && i > base.find("://").unwrap_or(0) + 2 => &base[..i],
        _ => base,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

/// A connection for `url`, through `railhook_store::connect` like every component's (TLS per
/// the URL's `sslmode`).
pub async fn connect(url: &str) -> Result<Client, railhook_store::StoreError> {
    let (client, _connection) = railhook_store::connect(url).await?;
    Ok(client)
}

/// A fresh, migrated database that belongs to one test.
pub struct TestDb {
    pub name: String,
    pub url: String,
}

impl TestDb {
    /// Clones the migrated template into a new database. The template is rebuilt when the
    /// migrations change (its name carries their fingerprint).
    pub async fn new() -> TestDb {
        let admin = connect(&admin_url()).await.unwrap_or_else(|e| {
            panic!("cannot reach test Postgres at {}: {e}. Run scripts/infra up (or scripts/test).", admin_url())
        });
        let migrator = Migrator::embedded();
        let template = format!("rh_template_{}", &migrator.fingerprint()[..16]);

        // One creator at a time, across all test binaries; cloning takes the same lock because
        // Postgres refuses to clone a template while another session is connected to it.
        admin.execute("SELECT pg_advisory_lock($1)", &[&TEMPLATE_LOCK]).await.expect("template lock");
        let exists = admin
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&template])
            .await
            .expect("look up template")
            .is_some();
        if !exists {
            let building = format!("{template}_building");
            admin.batch_execute(&format!("DROP DATABASE IF EXISTS {building}")).await.expect("drop stale template");
            admin.batch_execute(&format!("CREATE DATABASE {building}")).await.expect("create template");
            {
                let mut client = connect(&with_database(&admin_url(), &building)).await.expect("connect template");
                migrator.run(&mut client).await.expect("migrate template");
            }
            // The migrate connection must be gone before the rename.
            for _ in 0..100 {
                let n: i64 = admin
                    .query_one("SELECT count(*) FROM pg_stat_activity WHERE datname = $1", &[&building])
                    .await
                    .expect("count sessions")
                    .get(0);
                if n == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            admin.batch_execute(&format!("ALTER DATABASE {building} RENAME TO {template}")).await.expect("publish template");
        }
        let name = format!("{TEST_DB_PREFIX}{}", uuid::Uuid::new_v4().simple());
        admin
            .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {template}"))
            .await
            .unwrap_or_else(|e| panic!("clone template {template}: {e}"));
        admin.execute("SELECT pg_advisory_unlock($1)", &[&TEMPLATE_LOCK]).await.expect("template unlock");
        let url = with_database(&admin_url(), &name);
        TestDb { name, url }
    }

    pub async fn client(&self) -> Client {
        connect(&self.url).await.expect("connect test database")
    }
}

/// A unique topic prefix (`t<hex>.`), so each test's topics are its own.
pub fn topic_prefix() -> String {
    format!("t{}.", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// A configuration for one test: its database, its topic prefix, loopback allowed.
pub fn test_config(db: &TestDb) -> Config {
    let mut config = Config::default();
    config.database.url = db.url.clone();
    config.database.max_connections = 8;
    config.kafka.brokers = kafka_brokers();
    config.kafka.topic_prefix = topic_prefix();
    config.kafka.partitions = 3;
    config.network.allow_cidrs = vec!["127.0.0.0/8".into()];
    config.api.admin_token = "test-admin-token-0123456789".into();
    config.relay.slot_name = format!("rh_slot_{}", &db.name[TEST_DB_PREFIX.len()..][..16]);
    config.relay.publication_name = "railhook_outbox".into();
    config.worker.group_id = format!("{}worker", config.kafka.topic_prefix);
    config
}

/// Polls `condition` until it returns `Some`, or panics after `timeout` with `what`.
/// For waiting on an effect another process produces; never a fixed sleep.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut condition: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = condition().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_database_name() {
        assert_eq!(with_database("postgres://u@h:1/postgres", "x"), "postgres://u@h:1/x");
        assert_eq!(with_database("postgres://u@h:1/postgres?sslmode=disable", "x"), "postgres://u@h:1/x?sslmode=disable");
        assert_eq!(with_database("postgres://u@h:1", "x"), "postgres://u@h:1/x");
    }
}
