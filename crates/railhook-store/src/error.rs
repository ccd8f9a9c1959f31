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

    /// Whether the same operation may succeed when tried again later.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Connect(_) | StoreError::Pool(_) => true,
            StoreError::Db(e) => e.is_closed() || e.code().is_some_and(|c| {
                let c = c.code();
                c.starts_with("08") || c == "40001" || c == "40P01" || c == "57P01"
            }),
            _ => false,
        }
    }
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        StoreError::Pool(error_chain(&e))
    }
}
