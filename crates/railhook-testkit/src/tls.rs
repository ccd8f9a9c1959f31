//! TLS and SCRAM against the scripts' Postgres.
//!
//! `scripts/infra up` gives the cluster a self-signed certificate for `localhost` and
//! `127.0.0.1` (its public half in `.local/pg/server.crt`, or the file named by
//! `RAILHOOK_TEST_PG_SSLROOTCERT`), and its `pg_hba.conf` makes the role [`SCRAM_ROLE`]
//! authenticate with SCRAM-SHA-256 over TLS and without (everyone else is trusted).
//! [`scram_role`] creates that role and gives it a password; [`grant_relay`] lets it run
//! the relay on a test database.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::{admin_url, connect, with_database, TestDb};

/// The role `infra/postgres/pg_hba.conf` makes use SCRAM-SHA-256.
pub const SCRAM_ROLE: &str = "rh_scram";

/// The cluster's certificate, to pass as `sslrootcert`. Panics with the fix when missing.
pub fn server_cert() -> PathBuf {
    let path = match std::env::var("RAILHOOK_TEST_PG_SSLROOTCERT") {
        Ok(p) if !p.is_empty() => PathBuf::from(p),
        _ => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.local/pg/server.crt"),
    };
    assert!(path.is_file(), "{} is missing: run scripts/infra up (it makes the Postgres certificate)", path.display());
    path.canonicalize().unwrap_or(path)
}

/// The superuser `postgres` (trusted on loopback) at the test cluster.
pub fn superuser_url() -> String {
    let url = admin_url();
    match url.split_once("://").and_then(|(scheme, rest)| rest.split_once('@').map(|(_, host)| (scheme, host))) {
        Some((scheme, host)) => format!("{scheme}://postgres@{host}"),
        None => url,
    }
}

/// The password of [`SCRAM_ROLE`] for this test process: random, with characters that must
/// be percent-encoded in a URL (`@`, `:`, `/`, `%`, space).
pub fn scram_password() -> &'static str {
    static PASSWORD: OnceLock<String> = OnceLock::new();
    PASSWORD.get_or_init(|| format!("p@ss:w/rd% {}", uuid::Uuid::new_v4().simple()))
}

/// Percent-encodes everything but unreserved characters, for the userinfo of a URL.
pub fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Creates [`SCRAM_ROLE`] (LOGIN REPLICATION) when missing and sets its password to
/// [`scram_password`], stored as a SCRAM verifier. Safe to call from parallel tests.
pub async fn scram_role() -> &'static str {
    let mut su = connect(&superuser_url()).await.expect("connect as the postgres superuser");
    let tx = su.transaction().await.expect("begin");
    // Role creation is cluster-wide: one test at a time.
    tx.execute("SELECT pg_advisory_xact_lock(7271735)", &[]).await.expect("role lock");
    tx.batch_execute("SET LOCAL password_encryption = 'scram-sha-256'").await.expect("password_encryption");
    let exists = tx.query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&SCRAM_ROLE]).await.expect("look up role").is_some();
    if !exists {
        tx.batch_execute(&format!("CREATE ROLE {SCRAM_ROLE} LOGIN REPLICATION")).await.expect("create role");
    }
    let password = scram_password().replace('\'', "''");
    tx.batch_execute(&format!("ALTER ROLE {SCRAM_ROLE} LOGIN REPLICATION PASSWORD '{password}'")).await.expect("set password");
    tx.commit().await.expect("commit role");
    scram_password()
}

/// Lets [`SCRAM_ROLE`] run the relay on `db`: it owns the outbox (a publication needs the
/// table's owner), may create publications, and may use every table (re-announcement,
/// retention). The test's own role keeps its rights on the outbox.
pub async fn grant_relay(db: &TestDb) {
    let su = connect(&with_database(&superuser_url(), &db.name)).await.expect("connect to the test database as postgres");
    let own = admin_url();
    let own_role = own.split_once("://").and_then(|(_, rest)| rest.split_once('@')).map(|(user, _)| user.split(':').next().unwrap_or(user).to_string());
    let mut sql = format!(
        "GRANT CONNECT, CREATE ON DATABASE {db} TO {r};
         GRANT USAGE, CREATE ON SCHEMA public TO {r};
         GRANT ALL ON ALL TABLES IN SCHEMA public TO {r};
         GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {r};
         ALTER TABLE outbox OWNER TO {r};",
        db = db.name,
        r = SCRAM_ROLE
    );
    if let Some(role) = own_role.filter(|r| r != SCRAM_ROLE) {
        sql.push_str(&format!("GRANT ALL ON outbox TO {role};"));
    }
    su.batch_execute(&sql).await.expect("grant the relay's rights");
}

/// `db` as [`SCRAM_ROLE`] with its password, and `params` (e.g. `sslmode=require`).
pub fn scram_url(db: &TestDb, password: &str, params: &str) -> String {
    let base = with_database(&admin_url(), &db.name);
    let (scheme, rest) = base.split_once("://").expect("a postgres:// URL");
    let host = rest.split_once('@').map(|(_, h)| h).unwrap_or(rest);
    let host = host.split_once('?').map(|(h, _)| h).unwrap_or(host);
    let sep = if params.is_empty() { "" } else { "?" };
    format!("{scheme}://{SCRAM_ROLE}:{}@{host}{sep}{params}", percent_encode(password))
}
