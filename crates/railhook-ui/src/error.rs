//! One error type for the dashboard: bad input becomes a precise 4xx page, a failure of
//! ours a 500 page that says nothing about the internals (those go to the log). The pages
//! themselves are drawn by `crate::page` (its `IntoResponse for UiError`), so that this
//! module, which every other one uses, uses none of them.

use axum::http::StatusCode;
use railhook_store::pool::PoolError;
use railhook_store::StoreError;

#[derive(Debug)]
pub enum UiError {
    /// Go elsewhere first (303): the sign-in page for a signed-out visitor, the project
    /// list for an operator who has not chosen a project.
    Redirect(&'static str),
    /// A 4xx with a message meant for the person who sent the request.
    Client(StatusCode, String),
    /// Postgres unavailable or a bug; logged where it is turned into this.
    Internal,
}

pub type UiResult<T> = Result<T, UiError>;

impl UiError {
    pub fn bad_request(message: impl Into<String>) -> UiError {
        UiError::Client(StatusCode::BAD_REQUEST, message.into())
    }

    pub fn not_found(what: &str) -> UiError {
        UiError::Client(StatusCode::NOT_FOUND, format!("No such {what} in this project."))
    }

    pub fn forbidden(message: impl Into<String>) -> UiError {
        UiError::Client(StatusCode::FORBIDDEN, message.into())
    }
}

impl From<StoreError> for UiError {
    fn from(e: StoreError) -> UiError {
        tracing::error!(error = %e, "ui: store call failed");
        UiError::Internal
    }
}

impl From<tokio_postgres::Error> for UiError {
    fn from(e: tokio_postgres::Error) -> UiError {
        tracing::error!(error = %e, "ui: query failed");
        UiError::Internal
    }
}

impl From<PoolError> for UiError {
    fn from(e: PoolError) -> UiError {
        tracing::warn!(error = %e, "ui: no database connection");
        UiError::Internal
    }
}

pub async fn not_found() -> UiError {
    UiError::Client(StatusCode::NOT_FOUND, "There is no such page.".into())
}
