//! `ApiError`: every failure a client can see, as
//! `{"error": {"code": "...", "message": "...", "field": "..."}}` with the right status.
//! Bad input is a precise 4xx; internal failures are a 500 whose body says nothing about
//! the database (the detail goes to the log).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use railhook_store::StoreError;

#[derive(Debug, Clone)]
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

/// The error responses routes share, each status and description declared once for the
/// OpenAPI document, grouped by the kind of route: a route names its group once
/// (`responses((status = 201, body = Endpoint), BodyErrors)`), and adding a status every
/// body-taking route can answer is one edit here.
pub mod responses {
    use std::collections::BTreeMap;

    use utoipa::openapi::{ContentBuilder, Ref, RefOr, Response, ResponseBuilder};

    /// One error response: its status and what it means; the body is always [`super::ErrorBody`].
    struct Shared {
        status: u16,
        description: &'static str,
    }

    const BAD_REQUEST: Shared = Shared { status: 400, description: "Malformed JSON, id or query" };
    const UNAUTHORIZED: Shared = Shared { status: 401, description: "Missing or invalid credentials" };
    const NOT_FOUND: Shared = Shared { status: 404, description: "Not found (or another project's)" };
    const PAYLOAD_TOO_LARGE: Shared = Shared { status: 413, description: "Body over api.max_body_bytes" };
    const UNSUPPORTED_MEDIA_TYPE: Shared = Shared { status: 415, description: "Not application/json" };
    const INVALID_FIELD: Shared = Shared { status: 422, description: "A field is invalid" };
    const UNAVAILABLE: Shared = Shared { status: 503, description: "Database unavailable" };

    /// The responses of `shared`, each with the `ErrorBody` schema.
    fn error_responses(shared: &[Shared]) -> BTreeMap<String, RefOr<Response>> {
        shared
            .iter()
            .map(|s| {
                let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build();
                let response = ResponseBuilder::new().description(s.description).content("application/json", content).build();
                (s.status.to_string(), RefOr::T(response))
            })
            .collect()
    }

    macro_rules! group {
        ($(#[$doc:meta])* $name:ident = [$($shared:ident),+]) => {
            $(#[$doc])*
            pub struct $name;

            impl utoipa::IntoResponses for $name {
                fn responses() -> BTreeMap<String, RefOr<Response>> {
                    error_responses(&[$($shared),+])
                }
            }
        };
    }

    group!(
        /// A route that takes a JSON body: 400, 401, 413, 415, 422, 503.
        BodyErrors = [BAD_REQUEST, UNAUTHORIZED, PAYLOAD_TOO_LARGE, UNSUPPORTED_MEDIA_TYPE, INVALID_FIELD, UNAVAILABLE]
    );
    group!(
        /// A route that takes a JSON body and names a resource by id: [`BodyErrors`] and 404.
        BodyByIdErrors = [BAD_REQUEST, UNAUTHORIZED, NOT_FOUND, PAYLOAD_TOO_LARGE, UNSUPPORTED_MEDIA_TYPE, INVALID_FIELD, UNAVAILABLE]
    );
    group!(
        /// A list with query parameters: 400, 401, 503.
        ListErrors = [BAD_REQUEST, UNAUTHORIZED, UNAVAILABLE]
    );
    group!(
        /// A route without a body that names a resource by id (get, delete): 400, 401, 404, 503.
        ByIdErrors = [BAD_REQUEST, UNAUTHORIZED, NOT_FOUND, UNAVAILABLE]
    );
    group!(
        /// What any authenticated route can answer: 401, 503.
        AuthErrors = [UNAUTHORIZED, UNAVAILABLE]
    );
    group!(
        /// The body checks alone, for a route that describes its own 400: 413, 415, 422.
        BodyChecks = [PAYLOAD_TOO_LARGE, UNSUPPORTED_MEDIA_TYPE, INVALID_FIELD]
    );
}
