//! `ApiError`: every failure a client can see, as
//! `{"error": {"code": "...", "message": "...", "field": "..."}}` with the right status.
//! Bad input is a precise 4xx; internal failures are a 500 whose body says nothing about
//! the database (the detail goes to the log).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use railhook_store::StoreError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub field: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into(), field: None }
    }

    pub fn with_field(mut self, field: impl Into<String>) -> ApiError {
        self.field = Some(field.into());
        self
    }

    /// 422 for a field whose value is wrong.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_field", message).with_field(field)
    }

    /// 400 for a malformed path or query value.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn not_found(what: &str) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("{what} not found"))
    }

    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub fn internal() -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error; it has been logged")
    }

    pub fn unavailable() -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "the database is unavailable; retry later")
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        if e.is_retryable() {
            tracing::warn!(error = %e, "store unavailable");
            ApiError::unavailable()
        } else {
            tracing::error!(error = %e, "store error");
            ApiError::internal()
        }
    }
}

impl From<tokio_postgres::Error> for ApiError {
    fn from(e: tokio_postgres::Error) -> ApiError {
        ApiError::from(StoreError::from(e))
    }
}

impl From<deadpool_pool_error::PoolError> for ApiError {
    fn from(e: deadpool_pool_error::PoolError) -> ApiError {
        ApiError::from(StoreError::from(e))
    }
}

mod deadpool_pool_error {
    pub use railhook_store::pool::PoolError;
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut error = serde_json::json!({"code": self.code, "message": self.message});
        if let Some(field) = self.field {
            error["field"] = serde_json::Value::String(field);
        }
        let mut response = (self.status, Json(serde_json::json!({ "error": error }))).into_response();
        // The rest of an unread body is still on the wire: this connection is done.
        if matches!(self.status, StatusCode::REQUEST_TIMEOUT | StatusCode::PAYLOAD_TOO_LARGE) {
            response.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
        }
        response
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// Every error body, as the OpenAPI document describes it:
/// `{"error": {"code", "message", "field"}}`, as every error response carries it.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct ErrorBody {
    error: ErrorDetail,
}

#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct ErrorDetail {
    /// Machine-readable, e.g. `invalid_field`, `not_found`, `idempotency_key_reused`.
    code: String,
    message: String,
    /// The field, header or parameter at fault, when there is one.
    field: Option<String>,
}

/// The error responses many routes share, each declared once for the OpenAPI document: a
/// route lists the ones it can answer (`responses((status = 200, body = X), BadRequest,
/// Unauthorized, Unavailable)`).
pub mod responses {
    use super::ErrorBody;

    macro_rules! error_response {
        ($(#[$doc:meta])* $name:ident, $status:literal, $description:literal) => {
            $(#[$doc])*
            #[derive(utoipa::IntoResponses)]
            #[response(status = $status, description = $description)]
            #[allow(dead_code)]
            pub struct $name(ErrorBody);
        };
    }

    error_response!(BadRequest, 400, "Malformed JSON, id or query");
    error_response!(Unauthorized, 401, "Missing or invalid credentials");
    error_response!(NotFound, 404, "Not found (or another project's)");
    error_response!(PayloadTooLarge, 413, "Body over api.max_body_bytes");
    error_response!(UnsupportedMediaType, 415, "Not application/json");
    error_response!(InvalidField, 422, "A field is invalid");
    error_response!(Unavailable, 503, "Database unavailable");
}
