//! `application/x-www-form-urlencoded` bodies, read by hand because a bulk retry repeats a
//! field (`id=...&id=...`), which serde's form decoding does not collect.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};

use crate::error::UiError;

/// A submitted form: its fields in the order they came.
pub struct Form(Vec<(String, String)>);

impl Form {
    /// The first value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// Every value of `name`.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.0.iter().filter(|(k, _)| k == name).map(|(_, v)| v.as_str()).collect()
    }

    #[cfg(test)]
    pub fn parse(bytes: &[u8]) -> Form {
        Form(url::form_urlencoded::parse(bytes).into_owned().collect())
    }
}

impl<S: Send + Sync> FromRequest<S> for Form {
    type Rejection = UiError;

    async fn from_request(req: Request, state: &S) -> Result<Form, UiError> {
        let is_form = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.split(';').next().unwrap_or("").trim().eq_ignore_ascii_case("application/x-www-form-urlencoded"));
        if !is_form {
            return Err(UiError::Client(StatusCode::UNSUPPORTED_MEDIA_TYPE, "Send the form as application/x-www-form-urlencoded.".into()));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(body_rejection)?;
        Ok(Form(url::form_urlencoded::parse(&bytes).into_owned().collect()))
    }
}

fn body_rejection(e: BytesRejection) -> UiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        UiError::Client(StatusCode::PAYLOAD_TOO_LARGE, "The form is larger than the dashboard accepts.".into())
    } else {
        UiError::bad_request("The form could not be read.")
    }
}
