//! An Endpoint's signing secret as the receiver holds it: `whsec_` + base64 of the key.

use std::fmt;

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// Prefix of a Standard Webhooks secret.
pub const SECRET_PREFIX: &str = "whsec_";

/// Decodes base64 with or without padding: secrets and signatures copied by hand are not
/// always padded. Encoding is always padded ([`STANDARD`]), as every Standard Webhooks
/// library expects.
pub(crate) const LENIENT: GeneralPurpose =
    GeneralPurpose::new(&alphabet::STANDARD, GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent));

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("secret must start with '{SECRET_PREFIX}' (copy it whole from Railhook's Endpoint)")]
    MissingPrefix,
    #[error("secret must be '{SECRET_PREFIX}' followed by standard base64")]
    NotBase64,
    #[error("secret has an empty key")]
    Empty,
}

/// A signing secret, keyed once. `Debug` shows only the prefix, and there is no `Display`:
/// a secret should not end up in a log by accident.
#[derive(Clone)]
pub struct Secret {
    /// HMAC-SHA256 already keyed with the decoded key, cloned for every message.
    mac: HmacSha256,
}

impl Secret {
    /// Parses `whsec_` + base64 (padded or not). Any non-empty key is accepted, as the
    /// Standard Webhooks libraries do; Railhook's own secrets have 24 to 64 key bytes.
    pub fn parse(text: &str) -> Result<Secret, SecretError> {
        let encoded = text.trim().strip_prefix(SECRET_PREFIX).ok_or(SecretError::MissingPrefix)?;
        let key = LENIENT.decode(encoded).map_err(|_| SecretError::NotBase64)?;
        Secret::from_key(&key)
    }

    /// A secret from its raw key bytes (the part after `whsec_`, decoded).
    pub fn from_key(key: &[u8]) -> Result<Secret, SecretError> {
        if key.is_empty() {
            return Err(SecretError::Empty);
        }
        // HMAC takes keys of any length (longer than the block are hashed first).
        let mac = <HmacSha256 as Mac>::new_from_slice(key).map_err(|_| SecretError::Empty)?;
        Ok(Secret { mac })
    }

    /// The HMAC of `"{webhook_id}.{timestamp}.{body}"`, the signed content.
    pub(crate) fn keyed(&self, webhook_id: &str, timestamp: i64, body: &[u8]) -> HmacSha256 {
        let mut mac = self.mac.clone();
        mac.update(webhook_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }

    /// One `webhook-signature` entry, `v1,<base64>`, as Railhook would send it: for tests of
    /// a receiver, and for tools that re-sign.
    pub fn sign(&self, webhook_id: &str, timestamp: i64, body: &[u8]) -> String {
        format!("v1,{}", STANDARD.encode(self.keyed(webhook_id, timestamp, body).finalize().into_bytes()))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({SECRET_PREFIX}<redacted>)")
    }
}

impl std::str::FromStr for Secret {
    type Err = SecretError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Secret::parse(s)
    }
}
