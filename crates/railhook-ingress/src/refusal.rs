//! Why a request was not accepted: the reason codes of the ingress's 401 and of its
//! `provider, reason` metrics labels.

/// Why a verifier refused a request.
///
/// Carries no data on purpose: nothing about a secret, an expected signature or the request
/// can leak through a refusal's text, a log line or a response. A wrong secret and a tampered
/// request are both [`Refusal::BadSignature`]; a verifier cannot tell them apart, and should
/// not try.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Refusal {
    /// A header the scheme needs (signature, timestamp, signed id) is absent or empty.
    #[error("a required header is missing")]
    MissingHeader,
    /// A header is present but not in the provider's format (not UTF-8, not hex/base64, no
    /// timestamp, repeated, an event id longer than the limit, ...).
    #[error("a header is not in the provider's format")]
    MalformedHeader,
    /// No secret produced the signature: a wrong or rotated-out secret, or a tampered body,
    /// URL or signed header.
    #[error("the signature does not match")]
    BadSignature,
    /// The signature is genuine but the signed time is more than the tolerance away from now.
    #[error("the signed timestamp is outside the tolerance")]
    TimestampOutOfTolerance,
    /// The signature is genuine but the body, which should carry the event id, is not what the
    /// provider sends (e.g. not JSON for Stripe or Square).
    #[error("the body is not in the provider's format")]
    BodyNotParsable,
    /// The request URL, part of the signed content (Twilio, Square, HubSpot), is not an
    /// absolute http(s) URL. A fault of the ingress route, not of the caller.
    #[error("the request URL is not an absolute http(s) URL")]
    MalformedUrl,
    /// The Source has no secret to verify with.
    #[error("no secret to verify with")]
    NoSecret,
    /// None of the Source's secrets can be used by this provider (e.g. a SendGrid public key
    /// that does not parse). A stored-configuration fault: [`crate::ProviderConfig::validate_secret`]
    /// refuses such secrets at creation.
    #[error("no usable secret for this provider")]
    InvalidSecret,
}

impl Refusal {
    /// Every reason, for metrics initialisation and tests.
    pub const ALL: [Refusal; 8] = [
        Refusal::MissingHeader,
        Refusal::MalformedHeader,
        Refusal::BadSignature,
        Refusal::TimestampOutOfTolerance,
        Refusal::BodyNotParsable,
        Refusal::MalformedUrl,
        Refusal::NoSecret,
        Refusal::InvalidSecret,
    ];

    /// The snake_case reason code: the 401's `error.code` detail and the metrics label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Refusal::MissingHeader => "missing_header",
            Refusal::MalformedHeader => "malformed_header",
            Refusal::BadSignature => "bad_signature",
            Refusal::TimestampOutOfTolerance => "timestamp_out_of_tolerance",
            Refusal::BodyNotParsable => "body_not_parsable",
            Refusal::MalformedUrl => "malformed_url",
            Refusal::NoSecret => "no_secret",
            Refusal::InvalidSecret => "invalid_secret",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_snake_case() {
        let codes: std::collections::HashSet<&str> =
            Refusal::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(codes.len(), Refusal::ALL.len());
        for code in codes {
            assert!(
                code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{code}"
            );
        }
    }
}
