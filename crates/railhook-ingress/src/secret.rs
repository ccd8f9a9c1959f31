//! A Source's secret as the verifiers receive it.

use std::fmt;

/// One secret of a Source: the shared signing secret (Stripe `whsec_...`, GitHub/Shopify/Slack
/// secrets, Twilio auth token, Square signature key, HubSpot client secret, GitLab token,
/// Standard Webhooks `whsec_...`, the generic HMAC key) or, for SendGrid, the verification
/// public key (base64 DER or PEM).
///
/// HMAC providers use the text's UTF-8 bytes as the key, as the providers' own libraries do;
/// Standard Webhooks decodes the base64 after `whsec_`.
///
/// `Debug` is redacted and there is no `Display`: a secret reaches nothing this crate prints.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: impl Into<String>) -> Secret {
        Secret(text.into())
    }

    /// The secret's text, for the verifiers only.
    pub(crate) fn text(&self) -> &str {
        &self.0
    }

    /// The HMAC key of the providers that use the secret as given.
    pub(crate) fn key(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl From<String> for Secret {
    fn from(text: String) -> Secret {
        Secret(text)
    }
}

impl From<&str> for Secret {
    fn from(text: &str) -> Secret {
        Secret(text.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_is_redacted() {
        let shown = format!("{:?}", vec![Secret::new("whsec_topsecret")]);
        assert!(!shown.contains("topsecret"), "{shown}");
    }
}
