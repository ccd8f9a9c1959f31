//! The worker's one error type. Its [`ErrorKind`] is decided where the error is born and
//! drives what the caller does: an `Unavailable` claim or finalise is made again; a
//! `Refused` batch is made again request by request; `Misconfigured` stops the worker. The
//! source is kept (shared, so that one batch failure can answer every request in it).

use std::borrow::Cow;
use std::sync::Arc;

type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Postgres, its pool or Kafka cannot be reached now; the same call may succeed later.
    Unavailable,
    /// Postgres answered the statement with an error (a constraint, a deadlock): the
    /// statement, not the connection, is at fault.
    Refused,
    /// The worker cannot run as configured.
    Misconfigured,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{context}")]
pub struct WorkerError {
    kind: ErrorKind,
    context: Cow<'static, str>,
    #[source]
    source: Option<Source>,
}

impl WorkerError {
    pub fn new(kind: ErrorKind, context: impl Into<Cow<'static, str>>, source: Option<Source>) -> WorkerError {
        WorkerError { kind, context: context.into(), source }
    }

    pub fn unavailable<E: std::error::Error + Send + Sync + 'static>(context: impl Into<Cow<'static, str>>, source: E) -> WorkerError {
        WorkerError::new(ErrorKind::Unavailable, context, Some(Arc::new(source)))
    }

    pub fn misconfigured<E: std::error::Error + Send + Sync + 'static>(context: impl Into<Cow<'static, str>>, source: E) -> WorkerError {
        WorkerError::new(ErrorKind::Misconfigured, context, Some(Arc::new(source)))
    }

    /// A Postgres error: `Refused` when the server answered the statement with an error,
    /// `Unavailable` when the connection failed.
    pub fn postgres(context: impl Into<Cow<'static, str>>, e: tokio_postgres::Error) -> WorkerError {
        let kind = if e.as_db_error().is_some() { ErrorKind::Refused } else { ErrorKind::Unavailable };
        WorkerError::new(kind, context, Some(Arc::new(e)))
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

/// An error with its chain of sources, for logs (one function for every crate).
pub use railhook_core::error_chain as chain;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_its_source_and_kind() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused by 127.0.0.1:1");
        let e = WorkerError::unavailable("claim batch", io);
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert_eq!(chain(&e), "claim batch: refused by 127.0.0.1:1");
        let shared = e.clone();
        assert!(std::error::Error::source(&shared).is_some());
    }
}
