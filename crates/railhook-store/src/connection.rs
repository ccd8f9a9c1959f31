//! The one way Railhook opens a Postgres connection: `database.url` with libpq's TLS settings.
//!
//! tokio-postgres knows `sslmode=disable|prefer|require` only and refuses `sslrootcert`, so
//! [`DatabaseUrl::parse`] takes both out of the URL first and hands the rest to
//! tokio-postgres; the TLS connector (rustls, ring provider) then verifies what the mode asks:
//!
//! | `sslmode` | TLS | server certificate |
//! | --- | --- | --- |
//! | `disable` | never | - |
//! | `allow`, `prefer` (the default) | when the server offers it | not verified |
//! | `require` | always | not verified; verified like `verify-ca` when `sslrootcert` is given (as libpq does) |
//! | `verify-ca` | always | chain to `sslrootcert` (or the webpki roots); any host name |
//! | `verify-full` | always | chain, and the host (name or IP address) must be in the certificate |
//!
//! `sslrootcert` is a PEM file of trusted certificates; `sslrootcert=system` means the
//! Mozilla roots (webpki-roots), makes `verify-full` the default and refuses weaker modes,
//! as libpq does with the system store. Without `sslrootcert`, the verify modes use the
//! Mozilla roots as well.
//!
//! Passwords: percent-encoded in the URL, decoded by tokio-postgres; SCRAM-SHA-256 (with
//! channel binding over TLS when the server offers it), MD5 and cleartext are negotiated by
//! the server's `pg_hba.conf`.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::task::JoinHandle;
use tokio_postgres::Client;
pub use tokio_postgres_rustls::MakeRustlsConnect;

use crate::StoreError;

/// libpq's `sslmode` (`allow` is read as `prefer`: TLS when the server offers it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Option<SslMode> {
        Some(match value {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Whether the connection fails rather than going without TLS.
    pub fn requires_tls(self) -> bool {
        !matches!(self, SslMode::Disable | SslMode::Prefer)
    }

    /// Whether the server's certificate chain is verified.
    pub fn verifies(self) -> bool {
        matches!(self, SslMode::VerifyCa | SslMode::VerifyFull)
    }
}

/// What a verifying mode trusts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCerts {
    /// The Mozilla roots of webpki-roots (`sslrootcert=system`, or no `sslrootcert`).
    WebPki,
    /// A PEM file (`sslrootcert=<path>`).
    File(PathBuf),
}

/// A parsed `database.url`: what tokio-postgres takes, plus the TLS settings it cannot express.
#[derive(Clone)]
pub struct DatabaseUrl {
    /// Host, port, user, password (percent-decoded), database and the other libpq keys
    /// tokio-postgres supports; its `ssl_mode` is `disable`, `prefer` or `require` (the verify
    /// modes are `require` here, the verification is the connector's).
    pub pg: tokio_postgres::Config,
    pub ssl_mode: SslMode,
    pub root_certs: RootCerts,
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // tokio_postgres::Config's Debug redacts the password.
        f.debug_struct("DatabaseUrl").field("pg", &self.pg).field("ssl_mode", &self.ssl_mode).field("root_certs", &self.root_certs).finish()
    }
}

fn url_error(message: impl Into<String>) -> StoreError {
    StoreError::Url(message.into())
}

/// Percent-decoding of a URL query key or value (`+` stays `+`, as in tokio-postgres).
fn percent_decode(s: &str) -> Result<String, StoreError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
            match hex {
                Some(b) => {
                    out.push(b);
                    i += 3;
                    continue;
                }
                None => return Err(url_error("a parameter has an invalid percent-encoding")),
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).map_err(|_| url_error("a parameter is not UTF-8 once percent-decoded"))
}

impl DatabaseUrl {
    /// Parses a `postgres://` URL (or a libpq `key=value` string, whose TLS settings are
    /// tokio-postgres' own: no verify modes there).
    pub fn parse(url: &str) -> Result<DatabaseUrl, StoreError> {
        let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
        let mut ssl_mode: Option<SslMode> = None;
        let mut root_cert: Option<String> = None;
        let rest = if is_url {
            match url.split_once('?') {
                None => url.to_string(),
                Some((base, query)) => {
                    let mut kept = Vec::new();
                    for pair in query.split('&').filter(|p| !p.is_empty()) {
                        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                        match percent_decode(key)?.as_str() {
                            "sslmode" => {
                                let value = percent_decode(value)?;
                                ssl_mode = Some(SslMode::parse(&value).ok_or_else(|| {
                                    url_error(format!("sslmode={value} is not one of disable, allow, prefer, require, verify-ca, verify-full"))
                                })?);
                            }
                            "sslrootcert" => root_cert = Some(percent_decode(value)?),
                            _ => kept.push(pair),
                        }
                    }
                    if kept.is_empty() {
                        base.to_string()
                    } else {
                        format!("{base}?{}", kept.join("&"))
                    }
                }
            }
        } else {
            url.to_string()
        };
        let mut pg: tokio_postgres::Config = rest.parse().map_err(|e| url_error(format!("does not parse: {}", crate::error::error_chain(&e))))?;
        let root_certs = match root_cert.as_deref() {
            None | Some("") => None,
            Some("system") => Some(RootCerts::WebPki),
            Some(path) => Some(RootCerts::File(PathBuf::from(path))),
        };
        let ssl_mode = match (ssl_mode, &root_certs) {
            (None, Some(RootCerts::WebPki)) => SslMode::VerifyFull,
            (Some(mode), Some(RootCerts::WebPki)) if mode != SslMode::VerifyFull => {
                return Err(url_error(format!("sslrootcert=system needs sslmode=verify-full, not {}", mode.as_str())));
            }
            // libpq: with a root certificate, `require` verifies the chain like `verify-ca`.
            (Some(SslMode::Require), Some(RootCerts::File(_))) => SslMode::VerifyCa,
            (Some(mode), _) => mode,
            (None, _) if is_url => SslMode::Prefer,
            (None, _) => match pg.get_ssl_mode() {
                tokio_postgres::config::SslMode::Disable => SslMode::Disable,
                tokio_postgres::config::SslMode::Require => SslMode::Require,
                _ => SslMode::Prefer,
            },
        };
        pg.ssl_mode(match ssl_mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => tokio_postgres::config::SslMode::Require,
        });
        Ok(DatabaseUrl { pg, ssl_mode, root_certs: root_certs.unwrap_or(RootCerts::WebPki) })
    }

    /// The trusted roots of a verifying mode; reads `sslrootcert`.
    pub fn root_store(&self) -> Result<RootCertStore, StoreError> {
        let mut roots = RootCertStore::empty();
        match &self.root_certs {
            RootCerts::WebPki => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
            RootCerts::File(path) => {
                let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                    .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| url_error(format!("sslrootcert {}: {e}", path.display())))?;
                let (added, _) = roots.add_parsable_certificates(certs);
                if added == 0 {
                    return Err(url_error(format!("sslrootcert {}: no usable certificate in the file", path.display())));
                }
            }
        }
        Ok(roots)
    }

    /// The TLS connector for this URL's `sslmode` (used only when TLS is negotiated).
    pub fn tls_connector(&self) -> Result<MakeRustlsConnect, StoreError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| url_error(format!("TLS: {e}")))?;
        let config = match self.ssl_mode {
            SslMode::Disable | SslMode::Prefer | SslMode::Require => {
                builder.dangerous().with_custom_certificate_verifier(Arc::new(Unverified(provider))).with_no_client_auth()
            }
            SslMode::VerifyCa => {
                let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(self.root_store()?), provider)
                    .build()
                    .map_err(|e| url_error(format!("TLS: {e}")))?;
                builder.dangerous().with_custom_certificate_verifier(Arc::new(ChainOnly(inner))).with_no_client_auth()
            }
            SslMode::VerifyFull => builder.with_root_certificates(self.root_store()?).with_no_client_auth(),
        };
        Ok(MakeRustlsConnect::new(config))
    }

    /// Connects, and runs the connection on a task of its own (it ends when the [`Client`] is
    /// dropped; aborting the handle closes the connection at once).
    pub async fn connect(&self) -> Result<(Client, JoinHandle<()>), StoreError> {
        let tls = self.tls_connector()?;
        let (client, connection) = self.pg.connect(tls).await.map_err(StoreError::from_connect)?;
        let handle = tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "Postgres connection ended");
            }
        });
        Ok((client, handle))
    }
}

impl DatabaseUrl {
    /// The replication connection's settings for pgwire-replication (the relay's stream), from
    /// this same reading of the URL: the `sslmode` (`prefer` tries TLS, `require` encrypts
    /// without verifying, `verify-ca`/`verify-full` check the server against `sslrootcert` or
    /// the Mozilla roots), `hostaddr` (connect there, check the certificate against `host`)
    /// and the percent-decoded password, with which pgwire-replication answers SCRAM-SHA-256
    /// (or MD5/cleartext) when the server asks. What is not the connection's (the start
    /// position, intervals, buffer) is left at pgwire-replication's defaults for the caller.
    pub fn replication_config(&self, slot: &str, publication: &str, application_name: &str) -> Result<pgwire_replication::ReplicationConfig, StoreError> {
        use pgwire_replication::{ReplicationConfig, TlsConfig};
        use tokio_postgres::config::Host;
        let pg = &self.pg;
        let host = match pg.get_hosts().first() {
            Some(Host::Tcp(h)) => h.clone(),
            Some(Host::Unix(p)) => p.display().to_string(),
            None => "localhost".into(),
        };
        // libpq's hostaddr: connect there, and check the certificate against `host`.
        let (addr, tls_name) = match pg.get_hostaddrs().first() {
            Some(ip) => (ip.to_string(), Some(host)),
            None => (host, None),
        };
        let port = pg.get_ports().first().copied().unwrap_or(5432);
        let password = match pg.get_password() {
            None => String::new(),
            Some(p) => String::from_utf8(p.to_vec()).map_err(|_| url_error("the password is not UTF-8"))?,
        };
        let ca = match &self.root_certs {
            RootCerts::WebPki => None,
            RootCerts::File(path) => Some(path.clone()),
        };
        let mut tls = match self.ssl_mode {
            SslMode::Disable => TlsConfig::disabled(),
            SslMode::Prefer => TlsConfig { mode: pgwire_replication::SslMode::Prefer, ..TlsConfig::disabled() },
            SslMode::Require => TlsConfig::require(),
            SslMode::VerifyCa => TlsConfig::verify_ca(ca),
            SslMode::VerifyFull => TlsConfig::verify_full(ca),
        };
        match tls_name {
            Some(name) => tls = tls.with_sni_hostname(name),
            // pgwire-replication refuses verify-full for an IP address unless the name to check
            // is given explicitly; rustls checks an IP address against the certificate's IP SANs.
            None if self.ssl_mode == SslMode::VerifyFull && addr.parse::<std::net::IpAddr>().is_ok() => tls = tls.with_sni_hostname(addr.clone()),
            None => {}
        }
        let user = pg.get_user().unwrap_or("postgres");
        let database = pg.get_dbname().unwrap_or("postgres");
        Ok(ReplicationConfig::new(addr, user, password, database, slot, publication).with_port(port).with_tls(tls).with_application_name(application_name))
    }
}

/// Connects to `url` honouring its `sslmode` and `sslrootcert` (see the module docs).
pub async fn connect(url: &str) -> Result<(Client, JoinHandle<()>), StoreError> {
    DatabaseUrl::parse(url)?.connect().await
}

/// As [`connect`], shown as `application_name` in `pg_stat_activity` unless the URL names one.
pub async fn connect_as(url: &str, application_name: &str) -> Result<(Client, JoinHandle<()>), StoreError> {
    let mut url = DatabaseUrl::parse(url)?;
    if url.pg.get_application_name().is_none() {
        url.pg.application_name(application_name);
    }
    url.connect().await
}

/// `prefer` and `require`: encryption without authentication of the server, like libpq. The
/// handshake signatures are still checked (against the certificate the server sent).
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the host name is not checked (webpki
/// checks the chain first, so a name mismatch is the only error left to forgive).
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. })) => {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> DatabaseUrl {
        DatabaseUrl::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    #[test]
    fn sslmode_and_sslrootcert_are_taken_out_of_the_url() {
        let u = parse("postgres://u:p%40ss@db:5433/app?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=x");
        assert_eq!(u.ssl_mode, SslMode::VerifyFull);
        assert_eq!(u.root_certs, RootCerts::File("/etc/ca.pem".into()));
        assert_eq!(u.pg.get_ssl_mode(), tokio_postgres::config::SslMode::Require);
        assert_eq!(u.pg.get_password(), Some(&b"p@ss"[..]));
        assert_eq!(u.pg.get_application_name(), Some("x"));
        assert_eq!(u.pg.get_dbname(), Some("app"));
        assert_eq!(u.pg.get_ports(), &[5433]);
    }

    #[test]
    fn modes_map_like_libpq() {
        let mode = |q: &str| parse(&format!("postgres://u@h/d{q}")).ssl_mode;
        assert_eq!(mode(""), SslMode::Prefer);
        assert_eq!(mode("?sslmode=disable"), SslMode::Disable);
        assert_eq!(mode("?sslmode=allow"), SslMode::Prefer);
        assert_eq!(mode("?sslmode=prefer"), SslMode::Prefer);
        assert_eq!(mode("?sslmode=require"), SslMode::Require);
        assert_eq!(mode("?sslmode=require&sslrootcert=/ca.pem"), SslMode::VerifyCa);
        assert_eq!(mode("?sslmode=verify-ca"), SslMode::VerifyCa);
        assert_eq!(mode("?sslrootcert=system"), SslMode::VerifyFull);
        assert_eq!(parse("postgres://u@h/d?sslmode=disable").pg.get_ssl_mode(), tokio_postgres::config::SslMode::Disable);
        assert_eq!(parse("postgres://u@h/d").pg.get_ssl_mode(), tokio_postgres::config::SslMode::Prefer);
    }

    #[test]
    fn bad_settings_are_refused_without_echoing_the_password() {
        for url in ["postgres://u:secret@h/d?sslmode=verify", "postgres://u:secret@h/d?sslmode=require&sslrootcert=system", "postgres://u:secret@h/d?nonsense=1"] {
            let e = DatabaseUrl::parse(url).expect_err(url).to_string();
            assert!(e.starts_with("database.url: "), "{e}");
            assert!(!e.contains("secret"), "{e}");
        }
        let u = parse("postgres://u@h/d?sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem");
        let e = u.tls_connector().err().expect("missing file").to_string();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
    }

    #[test]
    fn key_value_strings_keep_tokio_postgres_modes() {
        assert_eq!(parse("host=h user=u sslmode=require").ssl_mode, SslMode::Require);
        assert_eq!(parse("host=h user=u").ssl_mode, SslMode::Prefer);
    }

    #[test]
    fn every_mode_builds_a_connector() {
        for q in ["sslmode=disable", "sslmode=prefer", "sslmode=require", "sslmode=verify-ca", "sslmode=verify-full"] {
            parse(&format!("postgres://u@h/d?{q}")).tls_connector().unwrap_or_else(|e| panic!("{q}: {e}"));
        }
    }
}
