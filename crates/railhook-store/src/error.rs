//! The store's one error type. It says whether a retry could help, decided where the error
//! is born.

/// An error with its sources, `: `-separated. tokio-postgres' own Display is the kind only
/// ("db error", "error performing TLS handshake"); what happened is in the sources.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot reach Postgres: {0}")]
    Connect(String),
    #[error("Postgres error: {}", error_chain(.0))]
    Db(#[from] tokio_postgres::Error),
    #[error("no pooled Postgres connection: {0}")]
    Pool(String),
    #[error("migration {name} was edited after it was applied (checksum {applied} in the database, {found} in this build); restore the original file and add a new migration instead")]
    MigrationTampered { name: String, applied: String, found: String },
    #[error("the database has migration {0}, which this build does not know: run a newer railhook")]
    MigrationUnknown(String),
    #[error("Postgres server is misconfigured: {0}")]
    Misconfigured(String),
    /// `database.url` cannot be used as given (syntax, `sslmode`, `sslrootcert`).
    #[error("database.url: {0}")]
    Url(String),
}

impl StoreError {
    /// A failed connection attempt: errors the server sent keep their SQLSTATE ([`StoreError::Db`]),
    /// the rest (unreachable, TLS handshake, connection closed) are [`StoreError::Connect`].
    pub fn from_connect(e: tokio_postgres::Error) -> StoreError {
        if e.as_db_error().is_some() {
            StoreError::Db(e)
        } else {
            StoreError::Connect(error_chain(&e))
        }
    }

    /// The server refused the credentials or has no `pg_hba.conf` entry for them (SQLSTATE
    /// class 28): retrying with the same settings cannot help.
    pub fn is_auth_failure(&self) -> bool {
        matches!(self, StoreError::Db(e) if e.code().is_some_and(|c| c.code().starts_with("28")))
    }

    /// Whether the same operation may succeed when tried again later: the connection went
    /// away (class 08), a serialization failure or deadlock, the server shutting down,
    /// crashed or still starting (57P01-57P03), or out of a resource such as disk space or
    /// connections (class 53: `disk_full` is 53100). The API answers these 503.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Connect(_) | StoreError::Pool(_) => true,
            StoreError::Db(e) => e.is_closed() || e.code().is_some_and(|c| retryable_sqlstate(c.code())),
            _ => false,
        }
    }
}

/// See [`StoreError::is_retryable`].
fn retryable_sqlstate(code: &str) -> bool {
    code.starts_with("08") || code.starts_with("53") || matches!(code, "40001" | "40P01" | "57P01" | "57P02" | "57P03")
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        StoreError::Pool(error_chain(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::retryable_sqlstate;

    #[test]
    fn a_full_disk_and_a_restarting_server_are_retryable_bad_sql_is_not() {
        for code in ["08006", "53100", "53300", "57P01", "57P02", "57P03", "40001", "40P01"] {
            assert!(retryable_sqlstate(code), "{code}");
        }
        for code in ["42601", "23505", "22P02", "XX000", "28P01"] {
            assert!(!retryable_sqlstate(code), "{code}");
        }
    }
}
