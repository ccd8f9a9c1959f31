//! `railhook_store::connect` and the pool against the scripts' Postgres, which has TLS with a
//! self-signed certificate for localhost/127.0.0.1 and a SCRAM-only role (see
//! `railhook_testkit::tls`).

use railhook_store::{build_pool, connect, StoreError};
use railhook_testkit::tls::{scram_role, scram_url, server_cert, superuser_url};
use railhook_testkit::{with_database, TestDb};

/// Whether the session of `client` is encrypted, as the server sees it.
async fn uses_tls(client: &tokio_postgres::Client) -> bool {
    client.query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[]).await.expect("pg_stat_ssl").get(0)
}

fn url(params: &str) -> String {
    let base = superuser_url();
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}{params}")
}

async fn tls_of(params: &str) -> Result<bool, StoreError> {
    let (client, _conn) = connect(&url(params)).await?;
    Ok(uses_tls(&client).await)
}

#[tokio::test]
async fn sslmode_decides_whether_the_session_is_encrypted() {
    let cert = server_cert();
    let cert = cert.display();
    assert!(!tls_of("sslmode=disable").await.unwrap(), "disable");
    assert!(tls_of("sslmode=prefer").await.unwrap(), "prefer: the server offers TLS");
    assert!(tls_of("sslmode=allow").await.unwrap(), "allow is read as prefer");
    assert!(tls_of("sslmode=require").await.unwrap(), "require");
    assert!(tls_of(&format!("sslmode=require&sslrootcert={cert}")).await.unwrap(), "require with a root certificate");
    assert!(tls_of(&format!("sslmode=verify-ca&sslrootcert={cert}")).await.unwrap(), "verify-ca");
    assert!(tls_of(&format!("sslmode=verify-full&sslrootcert={cert}")).await.unwrap(), "verify-full, IP address in the certificate");
    let localhost = url(&format!("sslmode=verify-full&sslrootcert={cert}")).replace("127.0.0.1", "localhost");
    let (client, _conn) = connect(&localhost).await.expect("verify-full by the name localhost");
    assert!(uses_tls(&client).await);
}

#[tokio::test]
async fn verification_refuses_an_untrusted_certificate_or_the_wrong_host() {
    let cert = server_cert();
    let cert = cert.display();
    // The Mozilla roots do not include a self-signed certificate.
    for mode in ["verify-ca", "verify-full", "verify-full&sslrootcert=system"] {
        let e = tls_of(&format!("sslmode={mode}")).await.expect_err(mode).to_string();
        assert!(e.contains("certificate") && e.contains("UnknownIssuer"), "{mode}: {e}");
    }
    // Connect to 127.0.0.1, but expect the certificate to name another host (libpq's hostaddr).
    let port = superuser_url().split_once("127.0.0.1:").and_then(|(_, r)| r.split('/').next().map(str::to_string)).expect("port");
    let elsewhere =
        |mode: &str| format!("postgres://postgres@/postgres?host=db.example.invalid&hostaddr=127.0.0.1&port={port}&sslmode={mode}&sslrootcert={cert}");
    let tls = |url: String| async move {
        let (client, _conn) = connect(&url).await?;
        Ok::<bool, StoreError>(uses_tls(&client).await)
    };
    assert!(tls(elsewhere("verify-ca")).await.unwrap(), "verify-ca ignores the host name");
    assert!(tls(elsewhere("require")).await.unwrap(), "require with a root certificate is verify-ca");
    let e = tls(elsewhere("verify-full")).await.expect_err("name mismatch").to_string();
    assert!(e.contains("certificate not valid for name"), "{e}");
    // Unreadable root certificates are a configuration error, reported before connecting.
    let e = tls_of("sslmode=verify-full&sslrootcert=/nonexistent/root.crt").await.expect_err("missing file");
    assert!(matches!(e, StoreError::Url(_)) && e.to_string().contains("/nonexistent/root.crt"), "{e}");
    assert!(!e.is_retryable());
}

#[tokio::test]
async fn scram_with_and_without_tls_and_a_percent_encoded_password() {
    let db = TestDb::new().await;
    let password = scram_role().await;
    assert!(password.contains('@') && password.contains('%'), "the password exercises percent-decoding");
    let cert = server_cert();
    for (params, tls) in [
        ("sslmode=disable".to_string(), false),
        ("sslmode=require".to_string(), true),
        (format!("sslmode=verify-full&sslrootcert={}", cert.display()), true),
    ] {
        let (client, _conn) = connect(&scram_url(&db, password, &params)).await.unwrap_or_else(|e| panic!("{params}: {e}"));
        assert_eq!(uses_tls(&client).await, tls, "{params}");
        let who: String = client.query_one("SELECT current_user::text", &[]).await.unwrap().get(0);
        assert_eq!(who, "rh_scram");
    }
    for params in ["sslmode=disable", "sslmode=require"] {
        let e = connect(&scram_url(&db, "not-the-password", params)).await.expect_err("wrong password");
        assert!(e.is_auth_failure(), "{params}: {e}");
        assert!(!e.is_retryable());
        assert!(e.to_string().contains("password authentication failed"), "{e}");
    }
}

#[tokio::test]
async fn the_pool_connects_with_verify_full() {
    let db = TestDb::new().await;
    let mut config = railhook_testkit::test_config(&db).database;
    let base = with_database(&superuser_url(), &db.name);
    config.url = format!("{base}?sslmode=verify-full&sslrootcert={}", server_cert().display());
    let pool = railhook_store::connect_pool(&config).await.expect("pool with verify-full");
    let client = pool.get().await.expect("pooled connection");
    let ssl: bool = client.query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[]).await.unwrap().get(0);
    assert!(ssl);

    config.url = format!("{base}?sslmode=verify-full");
    let pool = build_pool(&config).expect("built without connecting");
    let e = StoreError::from(pool.get().await.expect_err("self-signed certificate, Mozilla roots"));
    assert!(e.to_string().contains("certificate"), "{e}");
}
