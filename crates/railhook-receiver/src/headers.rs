//! Where the three Standard Webhooks headers are read from: an [`http::HeaderMap`] (axum,
//! hyper, reqwest) or a plain list of name/value pairs, names compared case-insensitively.

use std::collections::HashMap;

/// The message id: Railhook's Delivery id, the same on every Attempt of a Delivery. What
/// [`crate::dedupe`] records.
pub const ID_HEADER: &str = "webhook-id";
/// Unix seconds at which this Attempt was signed; fresh on every Attempt.
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// Space-separated `v1,<base64>` signatures, one per valid secret during a rotation.
pub const SIGNATURE_HEADER: &str = "webhook-signature";

/// A request's headers, as the verifier reads them.
pub trait WebhookHeaders {
    /// The value of the header `name` (given in lower case), if present. A header present
    /// but not valid text is `Some(Err(()))`, which the verifier reports as malformed rather
    /// than missing.
    fn header(&self, name: &str) -> Option<Result<&str, ()>>;
}

impl WebhookHeaders for http::HeaderMap {
    fn header(&self, name: &str) -> Option<Result<&str, ()>> {
        self.get(name).map(|v| v.to_str().map_err(|_| ()))
    }
}

impl<K: AsRef<str>, V: AsRef<str>> WebhookHeaders for [(K, V)] {
    fn header(&self, name: &str) -> Option<Result<&str, ()>> {
        self.iter().find(|(k, _)| k.as_ref().eq_ignore_ascii_case(name)).map(|(_, v)| Ok(v.as_ref()))
    }
}

impl<K: AsRef<str>, V: AsRef<str>> WebhookHeaders for Vec<(K, V)> {
    fn header(&self, name: &str) -> Option<Result<&str, ()>> {
        self.as_slice().header(name)
    }
}

impl<V: AsRef<str>, S> WebhookHeaders for HashMap<String, V, S> {
    fn header(&self, name: &str) -> Option<Result<&str, ()>> {
        self.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| Ok(v.as_ref()))
    }
}

impl<T: WebhookHeaders + ?Sized> WebhookHeaders for &T {
    fn header(&self, name: &str) -> Option<Result<&str, ()>> {
        (**self).header(name)
    }
}
