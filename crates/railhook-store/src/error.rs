//! The store's one error type. It says whether a retry could help, decided where the error
//! is born.

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot reach Postgres: {0}")]
    Connect(String),
    #[error("Postgres error: {0}")]
    Db(#[from] tokio_postgres::Error),
    #[error("no pooled Postgres connection: {0}")]
    Pool(String),
    #[error("migration {name} was edited after it was applied (checksum {applied} in the database, {found} in this build); restore the original file and add a new migration instead")]
    MigrationTampered { name: String, applied: String, found: String },
    #[error("the database has migration {0}, which this build does not know: run a newer railhook")]
    MigrationUnknown(String),
    #[error("Postgres server is misconfigured: {0}")]
    Misconfigured(String),
}

impl StoreError {
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
        StoreError::Pool(e.to_string())
    }
}
