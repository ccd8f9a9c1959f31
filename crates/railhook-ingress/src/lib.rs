//! Railhook's incoming direction, the part that needs no I/O: deciding whether a request that
//! reached an ingress URL really comes from the provider its Source names, and which provider
//! event id dedupes it (DESIGN.md 4, window 2).
//!
//! The ingress route builds an [`IncomingRequest`] from what arrived (the URL as the provider
//! called it, the method, the headers, the raw body bytes), asks the Source's [`Verifier`] with
//! the Source's unexpired secrets, and gets either [`Verified`] (store it, dedupe on
//! [`Verified::event_id`], answer a Slack [`Verified::challenge`]) or a [`Refusal`] whose
//! [`Refusal::as_str`] is the reason code for the 401 and the metrics label.
//!
//! The Sources API validates what a customer submits with [`ProviderConfig::from_parts`],
//! [`ProviderConfig::validate`] and [`ProviderConfig::validate_secret`]; each error names the
//! field for a 422.
//!
//! Contract shared by every verifier (each provider's module states its specifics):
//! - signatures are compared in constant time (`subtle`); a secret is never part of a
//!   [`Refusal`] or of anything this crate formats;
//! - where the provider signs a time, it must lie within [`TOLERANCE_SECS`] of `now`, in either
//!   direction; the signature is checked first, so `timestamp_out_of_tolerance` means "genuine
//!   but stale (or replayed)", which is what an operator chasing clock skew needs to know;
//! - any one of the given secrets may match (rotation overlap); [`Verified::secret_index`] says
//!   which, so the API can tell when the old secret stops being used;
//! - nothing panics, whatever the headers, URL or body hold (property-tested).

mod clock;
mod event_id;
mod mac;
mod provider;
pub mod providers;
mod refusal;
mod request;
mod secret;

use std::time::SystemTime;

pub use clock::TOLERANCE_SECS;
pub use event_id::MAX_EVENT_ID_LEN;
pub use provider::{
    ConfigError, GenericHmacConfig, HmacAlgorithm, Provider, ProviderConfig, SignatureEncoding,
};
pub use refusal::Refusal;
pub use request::{Headers, IncomingRequest};
pub use secret::Secret;

/// What a verifier established about a genuine request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The provider's id for this event (or delivery), stable across the provider's resends:
    /// the ingress stores it unique per Source, so a resend is answered 200 and forwarded to
    /// nobody again. `None` when the provider gives none (or the request lacks it); such a
    /// request is stored without dedupe. At most [`MAX_EVENT_ID_LEN`] bytes, never empty.
    pub event_id: Option<String>,
    /// Slack's `url_verification` handshake: the ingress answers 200 with this value as the
    /// body (and need not store or forward the request). Only ever set by the Slack verifier.
    pub challenge: Option<String>,
    /// Index in the `secrets` slice of the secret that matched.
    pub secret_index: usize,
}

/// Verifies one provider's signature scheme.
///
/// Implementations are pure (no I/O, no clock reads: `now` is passed in) and may be called
/// concurrently from many requests.
pub trait Verifier {
    /// The provider this verifier speaks for (the metrics label next to the reason code).
    fn provider(&self) -> Provider;

    /// Accepts the request if any one of `secrets` produced its signature.
    ///
    /// `secrets` holds every currently valid secret of the Source (the current one and, during
    /// a rotation's overlap, the previous one); an empty slice is [`Refusal::NoSecret`].
    fn verify(
        &self,
        req: &IncomingRequest<'_>,
        secrets: &[Secret],
        now: SystemTime,
    ) -> Result<Verified, Refusal>;
}

/// The verifier for a Source's provider configuration.
///
/// Infallible: a configuration that [`ProviderConfig::validate`] would refuse still yields a
/// verifier, one that refuses every request (e.g. a generic header name that never matches is
/// `missing_header`). Validate at creation time to tell the customer instead.
pub fn verifier(config: &ProviderConfig) -> Box<dyn Verifier + Send + Sync> {
    use providers::*;
    match config {
        ProviderConfig::Stripe => Box::new(stripe::Stripe),
        ProviderConfig::Github => Box::new(github::Github),
        ProviderConfig::Gitlab => Box::new(gitlab::Gitlab),
        ProviderConfig::Shopify => Box::new(shopify::Shopify),
        ProviderConfig::Slack => Box::new(slack::Slack),
        ProviderConfig::Twilio => Box::new(twilio::Twilio),
        ProviderConfig::Square => Box::new(square::Square),
        ProviderConfig::Hubspot => Box::new(hubspot::Hubspot),
        ProviderConfig::Sendgrid => Box::new(sendgrid::Sendgrid),
        ProviderConfig::StandardWebhooks => Box::new(standard_webhooks::StandardWebhooks),
        ProviderConfig::GenericHmac(config) => {
            Box::new(generic_hmac::GenericHmac::new(config.clone()))
        }
    }
}
