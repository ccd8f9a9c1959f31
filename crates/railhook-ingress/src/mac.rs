//! HMAC tags and their constant-time comparison, shared by every HMAC provider.

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use subtle::ConstantTimeEq;

use crate::{HmacAlgorithm, Refusal, Secret};

/// Standard base64 decoded with or without padding; providers' signatures are padded, but
/// proxies and hand-written senders are not always.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// HMAC of the concatenation of `parts` (no copy of the body is made).
pub(crate) fn hmac(algorithm: HmacAlgorithm, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    fn run<M: Mac + KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        // HMAC takes keys of any length; an error here is impossible, and an empty tag never
        // matches (see `tags_equal`).
        let Ok(mut mac) = <M as KeyInit>::new_from_slice(key) else {
            return Vec::new();
        };
        for part in parts {
            mac.update(part);
        }
        mac.finalize().into_bytes().to_vec()
    }
    match algorithm {
        HmacAlgorithm::Sha1 => run::<Hmac<sha1::Sha1>>(key, parts),
        HmacAlgorithm::Sha256 => run::<Hmac<sha2::Sha256>>(key, parts),
        HmacAlgorithm::Sha512 => run::<Hmac<sha2::Sha512>>(key, parts),
    }
}

/// Constant-time equality of an expected tag and a candidate. Lengths are public (the
/// algorithm fixes them); an empty expected tag never matches.
pub(crate) fn tags_equal(expected: &[u8], candidate: &[u8]) -> bool {
    !expected.is_empty()
        && expected.len() == candidate.len()
        && bool::from(expected.ct_eq(candidate))
}

/// The index of the first secret whose tag (computed by `tag`) equals one of `candidates`.
///
/// Every candidate is compared with every secret's tag in constant time; which secret
/// matched is not secret (it is reported in `Verified::secret_index`).
pub(crate) fn matching_secret(
    secrets: &[Secret],
    candidates: &[Vec<u8>],
    tag: impl Fn(&Secret) -> Vec<u8>,
) -> Result<usize, Refusal> {
    if secrets.is_empty() {
        return Err(Refusal::NoSecret);
    }
    for (index, secret) in secrets.iter().enumerate() {
        let expected = tag(secret);
        if candidates.iter().any(|c| tags_equal(&expected, c)) {
            return Ok(index);
        }
    }
    Err(Refusal::BadSignature)
}

pub(crate) fn decode_base64(text: &str) -> Option<Vec<u8>> {
    BASE64.decode(text).ok()
}

pub(crate) fn decode_hex(text: &str) -> Option<Vec<u8>> {
    hex::decode(text).ok()
}

/// Decodes a signature header value, refusing what is not in the encoding (or is empty) as
/// `malformed_header`.
pub(crate) fn decode(text: &str, decoder: fn(&str) -> Option<Vec<u8>>) -> Result<Vec<u8>, Refusal> {
    match decoder(text) {
        Some(bytes) if !bytes.is_empty() => Ok(bytes),
        _ => Err(Refusal::MalformedHeader),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4231 test case 2 (and its SHA-1 counterpart from RFC 2202).
    #[test]
    fn known_answers() {
        let parts: [&[u8]; 2] = [b"what do ya want ", b"for nothing?"];
        assert_eq!(
            hex::encode(hmac(HmacAlgorithm::Sha256, b"Jefe", &parts)),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hex::encode(hmac(HmacAlgorithm::Sha1, b"Jefe", &parts)),
            "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
        );
        assert_eq!(
            hex::encode(hmac(HmacAlgorithm::Sha512, b"Jefe", &parts)),
            "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737"
        );
    }

    #[test]
    fn comparison() {
        assert!(tags_equal(b"abc", b"abc"));
        assert!(!tags_equal(b"abc", b"abd"));
        assert!(!tags_equal(b"abc", b"ab"));
        assert!(!tags_equal(b"", b""));
        let secrets = [Secret::new("a"), Secret::new("b")];
        let tag = |s: &Secret| hmac(HmacAlgorithm::Sha256, s.key(), &[b"x"]);
        assert_eq!(matching_secret(&secrets, &[tag(&secrets[1])], tag), Ok(1));
        assert_eq!(
            matching_secret(&secrets, &[vec![1; 32]], tag),
            Err(Refusal::BadSignature)
        );
        assert_eq!(
            matching_secret(&[], &[tag(&secrets[1])], tag),
            Err(Refusal::NoSecret)
        );
    }
}
