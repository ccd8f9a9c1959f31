//! The axum extractor: a handler that takes a [`VerifiedWebhook`] runs only for an authentic,
//! fresh request; anything else is answered before the handler with a JSON error.

use axum::extract::{FromRef, FromRequest, Request};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use crate::verifier::{Verified, Verifier, VerifyError};

/// A request whose Standard Webhooks signature verified against the [`Verifier`] in the
/// router's state (`Verifier: FromRef<S>`). It consumes the body, so it must be the last
/// extractor of the handler.
///
/// ```no_run
/// use axum::{routing::post, Router};
/// use railhook_receiver::{Secret, VerifiedWebhook, Verifier};
///
/// async fn hook(webhook: VerifiedWebhook) -> &'static str {
///     println!("{} sent {} bytes", webhook.id, webhook.body.len());
///     "ok"
/// }
///
/// let secret: Secret = std::env::var("WEBHOOK_SECRET").unwrap().parse().unwrap();
/// let app: Router = Router::new().route("/webhooks", post(hook)).with_state(Verifier::new([secret]));
/// ```
#[derive(Debug, Clone)]
pub struct VerifiedWebhook {
    /// `webhook-id`: the Delivery id, the same on every Attempt; dedupe on it.
    pub id: String,
    /// `webhook-timestamp`, unix seconds.
    pub timestamp: i64,
    /// The body exactly as signed.
    pub body: Bytes,
}

impl VerifiedWebhook {
    /// The body parsed as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }
}

impl<S> FromRequest<S> for VerifiedWebhook
where
    S: Send + Sync,
    Verifier: FromRef<S>,
{
    type Rejection = WebhookRejection;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let verifier = Verifier::from_ref(state);
        let headers = req.headers().clone();
        let body = Bytes::from_request(req, state).await.map_err(|e| WebhookRejection {
            status: e.status(),
            code: "unreadable_body",
            message: e.body_text(),
            header: None,
        })?;
        let Verified { id, timestamp } = verifier.verify(&headers, &body)?;
        Ok(VerifiedWebhook { id, timestamp, body })
    }
}

/// Why the extractor refused a request: 400 for a malformed request (a header missing, a
/// timestamp that is not a number), 401 for one that is not authentic or not fresh, 500 for
/// a receiver without secrets, and the body's own status (e.g. 413) when it could not be
/// read. Answered as `{"error": {"code", "message", "header"}}`.
#[derive(Debug, Clone)]
pub struct WebhookRejection {
    pub status: StatusCode,
    /// [`VerifyError::code`], or `unreadable_body`.
    pub code: &'static str,
    pub message: String,
    /// The header at fault, if one is.
    pub header: Option<&'static str>,
}

impl From<VerifyError> for WebhookRejection {
    fn from(e: VerifyError) -> Self {
        let status = match e {
            VerifyError::NoSecrets => StatusCode::INTERNAL_SERVER_ERROR,
            ref e if e.is_unauthenticated() => StatusCode::UNAUTHORIZED,
            _ => StatusCode::BAD_REQUEST,
        };
        WebhookRejection { status, code: e.code(), message: e.to_string(), header: e.header() }
    }
}

impl IntoResponse for WebhookRejection {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": {"code": self.code, "message": self.message, "header": self.header}});
        let mut response = (self.status, body.to_string()).into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }
}
