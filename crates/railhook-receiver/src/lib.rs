//! The receiver kit: what a service that receives Railhook's webhooks needs to close the last
//! duplicate window (DESIGN.md 4, window 8) and to trust what it receives.
//!
//! - [`verify`] / [`Verifier`]: Standard Webhooks (<https://www.standardwebhooks.com>)
//!   verification of `webhook-id`, `webhook-timestamp` and `webhook-signature` against one or
//!   several `whsec_` secrets (several during a secret rotation), with a timestamp tolerance
//!   (5 minutes by default) and constant-time comparison.
//! - [`VerifiedWebhook`] (feature `axum`): an axum extractor that verifies the request and
//!   rejects it with 400 or 401 and a JSON body naming what is wrong.
//! - [`dedupe`] (feature `postgres`): records a `webhook-id` in the `processed_webhooks` table
//!   inside the caller's tokio-postgres transaction and says whether it is the first time.
//!
//! Railhook sends a Delivery at least once: when the receiver acted but its answer never
//! reached Railhook (a lost response, a worker that died), the same Delivery comes again with
//! the same `webhook-id`. Recording the id in the same transaction as the effect makes the
//! effect happen once: both commit or neither does.
//!
//! ```
//! use railhook_receiver::{Secret, Verifier};
//!
//! let secret: Secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse().unwrap();
//! let body = br#"{"test": 2432232314}"#;
//! let headers = [
//!     ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
//!     ("webhook-timestamp", "1614265330"),
//!     ("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="),
//! ];
//! let webhook = Verifier::new([secret]).verify_at(&headers[..], body, 1614265330).unwrap();
//! assert_eq!(webhook.id, "msg_p5jXN8AQM9LWM0D4loKWxJek");
//! ```

mod headers;
mod secret;
mod verifier;

#[cfg(feature = "axum")]
mod extract;
#[cfg(feature = "postgres")]
mod dedupe;

pub use headers::{WebhookHeaders, SIGNATURE_HEADER, ID_HEADER, TIMESTAMP_HEADER};
pub use secret::{Secret, SecretError, SECRET_PREFIX};
pub use verifier::{check_signatures, verify, Verified, Verifier, VerifyError, DEFAULT_TOLERANCE};

#[cfg(feature = "axum")]
pub use extract::{VerifiedWebhook, WebhookRejection};
#[cfg(feature = "postgres")]
pub use dedupe::{dedupe, migrate, prune, PROCESSED_WEBHOOKS_DDL};
