//! The Kafka source's one error type. Its [`ErrorKind`] is decided where the error is born:
//! `Unavailable` (Postgres or Kafka cannot be reached now) makes the batch again later;
//! `Misconfigured` stops the source, and with it its process, with a message naming the
//! setting.

use std::borrow::Cow;
use std::sync::Arc;

type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Unavailable,
    Misconfigured,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{context}")]
pub struct SourceError {
    kind: ErrorKind,
    context: Cow<'static, str>,
    #[source]
    source: Option<Source>,
}

impl SourceError {
    pub fn unavailable<E: std::error::Error + Send + Sync + 'static>(context: impl Into<Cow<'static, str>>, source: E) -> SourceError {
        SourceError { kind: ErrorKind::Unavailable, context: context.into(), source: Some(Arc::new(source)) }
    }

    pub fn misconfigured(context: impl Into<Cow<'static, str>>) -> SourceError {
        SourceError { kind: ErrorKind::Misconfigured, context: context.into(), source: None }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

/// An error with its chain of sources, for logs (one function for every crate).
pub use railhook_core::error_chain as chain;
