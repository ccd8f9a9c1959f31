//! Standard Webhooks signing (<https://www.standardwebhooks.com>): Endpoint secrets, the
//! `webhook-signature` header we send, and verification of one we receive.
//!
//! The signed content is `"{webhook-id}.{webhook-timestamp}.{body}"`, the signature
//! `v1,<base64 HMAC-SHA256(key, content)>` where the key is the base64-decoded part of the
//! `whsec_` secret. Any Standard Webhooks library must verify what [`signature_header`]
//! produces, unchanged.

use std::fmt;

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use hmac::digest::{Key, KeyInit};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Prefix of every Endpoint secret.
pub const SECRET_PREFIX: &str = "whsec_";
/// Key bytes in a secret from [`EndpointSecret::generate`].
pub const GENERATED_KEY_LEN: usize = 32;
/// Shortest key accepted by [`EndpointSecret::parse`].
pub const MIN_KEY_LEN: usize = 24;
/// Longest key accepted by [`EndpointSecret::parse`]; also SHA-256's block size, see
/// [`EndpointSecret::from_key`].
pub const MAX_KEY_LEN: usize = 64;
/// Tolerance between `webhook-timestamp` and now that Standard Webhooks libraries use.
pub const DEFAULT_TOLERANCE_SECS: i64 = 300;

/// Decodes base64 with or without padding: secrets and signatures made by other tools are
/// not always padded. Encoding always uses [`STANDARD`] (padded).
const LENIENT: GeneralPurpose =
    GeneralPurpose::new(&alphabet::STANDARD, GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent));

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("secret must start with '{SECRET_PREFIX}'")]
    MissingPrefix,
    #[error("secret must be '{SECRET_PREFIX}' followed by standard base64")]
    NotBase64,
    #[error("secret must encode {MIN_KEY_LEN} to {MAX_KEY_LEN} bytes (got {0})")]
    KeyLength(usize),
}

/// An Endpoint's signing secret: `whsec_` + base64 of 24 to 64 key bytes.
///
/// `Debug` shows only the prefix; there is deliberately no `Display`, so the secret reaches
/// a log or a response only through an explicit [`EndpointSecret::as_str`].
#[derive(Clone)]
pub struct EndpointSecret {
    /// The secret as given (or generated): what is stored and shown to the customer once.
    text: String,
    /// HMAC-SHA256 already keyed, cloned for every signature.
    mac: HmacSha256,
}

impl EndpointSecret {
    /// A new secret of [`GENERATED_KEY_LEN`] bytes from the thread-local CSPRNG.
    pub fn generate() -> EndpointSecret {
        let mut key = [0u8; GENERATED_KEY_LEN];
        rand::rng().fill_bytes(&mut key);
        let text = format!("{SECRET_PREFIX}{}", STANDARD.encode(key));
        EndpointSecret { text, mac: Self::from_key(&key) }
    }

    /// Accepts `whsec_` + base64 (padded or not) decoding to 24..=64 bytes.
    pub fn parse(text: &str) -> Result<EndpointSecret, SecretError> {
        let encoded = text.strip_prefix(SECRET_PREFIX).ok_or(SecretError::MissingPrefix)?;
        let key = LENIENT.decode(encoded).map_err(|_| SecretError::NotBase64)?;
        if !(MIN_KEY_LEN..=MAX_KEY_LEN).contains(&key.len()) {
            return Err(SecretError::KeyLength(key.len()));
        }
        Ok(EndpointSecret { text: text.to_string(), mac: Self::from_key(&key) })
    }

    /// The secret as stored; handle with care.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// HMAC pads a key shorter than the hash's block size with zeros (RFC 2104), so a key of
    /// at most [`MAX_KEY_LEN`] = 64 bytes zero-padded to the block is the same key; this
    /// uses the infallible constructor instead of `new_from_slice`. Callers keep the length
    /// within bounds; a longer key would be truncated, so `parse` refuses it first.
    fn from_key(key: &[u8]) -> HmacSha256 {
        let mut block = Key::<HmacSha256>::default();
        for (slot, byte) in block.iter_mut().zip(key) {
            *slot = *byte;
        }
        <HmacSha256 as KeyInit>::new(&block)
    }

    fn keyed(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> HmacSha256 {
        let mut mac = self.mac.clone();
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

impl fmt::Debug for EndpointSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EndpointSecret({SECRET_PREFIX}<redacted>)")
    }
}

impl std::str::FromStr for EndpointSecret {
    type Err = SecretError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EndpointSecret::parse(s)
    }
}

/// One signature, `v1,<base64 HMAC-SHA256(key, "{msg_id}.{timestamp}.{body}")>`.
///
/// `msg_id` is the `webhook-id` header (the Delivery id) and `timestamp` the
/// `webhook-timestamp` header (unix seconds) of the same request; `body` the exact bytes sent.
pub fn sign(secret: &EndpointSecret, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    let tag = secret.keyed(msg_id, timestamp, body).finalize().into_bytes();
    format!("v1,{}", STANDARD.encode(tag))
}

/// The `webhook-signature` header: one [`sign`] entry per secret, in the order given,
/// separated by single spaces. During a rotation's overlap pass every unexpired secret, so
/// receivers holding either the old or the new one verify. An empty slice gives an empty
/// string; an Endpoint always has a current secret.
pub fn signature_header(secrets: &[EndpointSecret], msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets.iter().map(|s| sign(s, msg_id, timestamp, body)).collect::<Vec<_>>().join(" ")
}

/// Why a signed request was not accepted by [`verify`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("webhook-timestamp {timestamp} is {age} s in the past, more than the {tolerance} s tolerance")]
    TooOld { timestamp: i64, age: u64, tolerance: i64 },
    #[error("webhook-timestamp {timestamp} is {ahead} s in the future, more than the {tolerance} s tolerance")]
    InFuture { timestamp: i64, ahead: u64, tolerance: i64 },
    #[error("webhook-signature header has no signatures")]
    NoSignatures,
    #[error("webhook-signature header is malformed: entries must be 'v1,<base64>' separated by spaces")]
    Malformed,
    #[error("webhook-signature header has no v1 signature")]
    NoSupportedVersion,
    #[error("no webhook-signature entry matches the request")]
    Mismatch,
}

/// Verifies a Standard Webhooks request signed with `secret`.
///
/// - The timestamp must be within `tolerance_secs` of `now` (both unix seconds, inclusive,
///   either direction; a negative tolerance counts as zero). Checked first and overflow-free.
/// - `header` holds space-separated `version,signature` entries. Entries of versions other
///   than `v1` are ignored (e.g. `v1a` asymmetric signatures). The request is accepted as
///   soon as one `v1` entry matches; each comparison is constant-time (`verify_slice`).
/// - If none matches: [`VerifyError::NoSignatures`] for an empty header, else
///   [`VerifyError::Malformed`] if some entry lacked a `,` or a `v1` entry was not base64,
///   else [`VerifyError::Mismatch`] if there was a `v1` entry, else
///   [`VerifyError::NoSupportedVersion`].
///
/// Never panics, whatever `header` holds. The HMAC over the body is computed once, however
/// many entries the header has.
pub fn verify(
    secret: &EndpointSecret,
    msg_id: &str,
    timestamp: i64,
    body: &[u8],
    header: &str,
    now: i64,
    tolerance_secs: i64,
) -> Result<(), VerifyError> {
    use railhook_receiver::VerifyError as R;
    let tolerance = tolerance_secs.max(0);
    // The check itself is the receiver kit's (one implementation for Railhook's ingress and
    // for customers' receivers); only the error's shape is this crate's.
    let key = railhook_receiver::Secret::parse(secret.as_str()).map_err(|_| VerifyError::Mismatch)?;
    railhook_receiver::check_signatures(std::slice::from_ref(&key), msg_id, timestamp, header, body, now, tolerance.unsigned_abs()).map_err(|e| match e {
        R::TooOld { timestamp, age, .. } => VerifyError::TooOld { timestamp, age, tolerance },
        R::TooNew { timestamp, ahead, .. } => VerifyError::InFuture { timestamp, ahead, tolerance },
        R::NoSignatures => VerifyError::NoSignatures,
        R::MalformedSignature => VerifyError::Malformed,
        R::NoSupportedVersion => VerifyError::NoSupportedVersion,
        // NoMatchingSignature, and what only a header reader can return.
        _ => VerifyError::Mismatch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    // The official Standard Webhooks test vector.
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const MSG_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TS: i64 = 1614265330;
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const EXPECTED: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn secret() -> EndpointSecret {
        EndpointSecret::parse(SECRET).unwrap()
    }

    #[test]
    fn known_answer() {
        assert_eq!(sign(&secret(), MSG_ID, TS, BODY), EXPECTED);
        assert_eq!(verify(&secret(), MSG_ID, TS, BODY, EXPECTED, TS, DEFAULT_TOLERANCE_SECS), Ok(()));
    }

    /// The zero-padded block key must equal HMAC's own key handling for every length we
    /// accept, or signatures would differ from other libraries'.
    #[test]
    fn padded_key_is_the_same_hmac_key() {
        let mut rng = StdRng::seed_from_u64(7);
        for len in MIN_KEY_LEN..=MAX_KEY_LEN {
            let mut key = vec![0u8; len];
            rng.fill_bytes(&mut key);
            let text = format!("whsec_{}", STANDARD.encode(&key));
            let ours = sign(&EndpointSecret::parse(&text).unwrap(), "msg_1", 5, b"body");
            let mut reference = <HmacSha256 as Mac>::new_from_slice(&key).unwrap();
            reference.update(b"msg_1.5.body");
            assert_eq!(ours, format!("v1,{}", STANDARD.encode(reference.finalize().into_bytes())), "len {len}");
        }
    }

    #[test]
    fn generated_secrets() {
        let a = EndpointSecret::generate();
        let b = EndpointSecret::generate();
        assert_ne!(a.as_str(), b.as_str());
        let encoded = a.as_str().strip_prefix("whsec_").unwrap();
        assert_eq!(STANDARD.decode(encoded).unwrap().len(), GENERATED_KEY_LEN);
        assert!(encoded.ends_with('='), "standard base64 with padding: {encoded}");
        let reparsed = EndpointSecret::parse(a.as_str()).unwrap();
        assert_eq!(sign(&a, "m", 1, b"x"), sign(&reparsed, "m", 1, b"x"));
        assert_ne!(sign(&a, "m", 1, b"x"), sign(&b, "m", 1, b"x"));
    }

    #[test]
    fn secrets_are_validated() {
        let key = |n: usize| format!("whsec_{}", STANDARD.encode(vec![7u8; n]));
        for n in [24, 32, 64] {
            assert!(EndpointSecret::parse(&key(n)).is_ok(), "{n}");
        }
        assert_eq!(EndpointSecret::parse(&key(23)).unwrap_err(), SecretError::KeyLength(23));
        assert_eq!(EndpointSecret::parse(&key(65)).unwrap_err(), SecretError::KeyLength(65));
        assert_eq!(EndpointSecret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap_err(), SecretError::MissingPrefix);
        assert_eq!(EndpointSecret::parse("whsec_not base64!").unwrap_err(), SecretError::NotBase64);
        assert_eq!(EndpointSecret::parse("whsec_").unwrap_err(), SecretError::KeyLength(0));
        // Unpadded base64 of 32 bytes is accepted and is the same key as the padded form.
        let padded = key(32);
        let unpadded = padded.trim_end_matches('=');
        assert_ne!(padded, unpadded);
        assert_eq!(
            sign(&EndpointSecret::parse(&padded).unwrap(), "m", 1, b""),
            sign(&EndpointSecret::parse(unpadded).unwrap(), "m", 1, b"")
        );
    }

    #[test]
    fn debug_does_not_print_the_secret() {
        let s = secret();
        let shown = format!("{s:?} {:?}", vec![s.clone()]);
        assert!(!shown.contains("MfKQ9r8"), "{shown}");
        assert!(shown.contains("redacted"));
    }

    #[test]
    fn header_has_one_entry_per_secret() {
        let other = EndpointSecret::generate();
        let header = signature_header(&[secret(), other.clone()], MSG_ID, TS, BODY);
        assert_eq!(header, format!("{EXPECTED} {}", sign(&other, MSG_ID, TS, BODY)));
        // A receiver holding either secret accepts the rotation header.
        assert_eq!(verify(&secret(), MSG_ID, TS, BODY, &header, TS, 300), Ok(()));
        assert_eq!(verify(&other, MSG_ID, TS, BODY, &header, TS, 300), Ok(()));
        let third = EndpointSecret::generate();
        assert_eq!(verify(&third, MSG_ID, TS, BODY, &header, TS, 300), Err(VerifyError::Mismatch));
        assert_eq!(signature_header(&[], MSG_ID, TS, BODY), "");
    }

    #[test]
    fn any_change_breaks_the_signature() {
        let s = secret();
        let v = |id: &str, ts: i64, body: &[u8]| verify(&s, id, ts, body, EXPECTED, TS, 300);
        assert_eq!(v("msg_p5jXN8AQM9LWM0D4loKWxJeK", TS, BODY), Err(VerifyError::Mismatch));
        assert_eq!(v(MSG_ID, TS + 1, BODY), Err(VerifyError::Mismatch));
        assert_eq!(v(MSG_ID, TS, br#"{"test": 2432232315}"#), Err(VerifyError::Mismatch));
        assert_eq!(v(MSG_ID, TS, b""), Err(VerifyError::Mismatch));
        // A truncated or extended tag is not accepted.
        let tag = STANDARD.decode(&EXPECTED[3..]).unwrap();
        for bad in [&tag[..31], &[&tag[..], &[0u8]].concat()[..]] {
            let header = format!("v1,{}", STANDARD.encode(bad));
            assert_eq!(verify(&s, MSG_ID, TS, BODY, &header, TS, 300), Err(VerifyError::Mismatch));
        }
    }

    #[test]
    fn timestamp_tolerance() {
        let s = secret();
        let at = |now: i64, tol: i64| verify(&s, MSG_ID, TS, BODY, EXPECTED, now, tol);
        assert_eq!(at(TS + 300, 300), Ok(()));
        assert_eq!(at(TS - 300, 300), Ok(()));
        assert_eq!(at(TS + 301, 300), Err(VerifyError::TooOld { timestamp: TS, age: 301, tolerance: 300 }));
        assert_eq!(at(TS - 301, 300), Err(VerifyError::InFuture { timestamp: TS, ahead: 301, tolerance: 300 }));
        assert_eq!(at(TS, 0), Ok(()));
        assert_eq!(at(TS, -5), Ok(()));
        assert!(at(TS + 1, -5).is_err());
        // Extreme values neither overflow nor panic.
        assert!(verify(&s, MSG_ID, i64::MIN, BODY, EXPECTED, i64::MAX, i64::MAX).is_err());
        assert!(verify(&s, MSG_ID, i64::MAX, BODY, EXPECTED, i64::MIN, 300).is_err());
        assert_eq!(
            at(TS + 1000, 300).unwrap_err().to_string(),
            "webhook-timestamp 1614265330 is 1000 s in the past, more than the 300 s tolerance"
        );
    }

    #[test]
    fn header_parsing() {
        let s = secret();
        let v = |h: &str| verify(&s, MSG_ID, TS, BODY, h, TS, 300);
        assert_eq!(v(""), Err(VerifyError::NoSignatures));
        assert_eq!(v("   "), Err(VerifyError::NoSignatures));
        assert_eq!(v("v2,abc v1a,xyz"), Err(VerifyError::NoSupportedVersion));
        assert_eq!(v("v1,AAAA"), Err(VerifyError::Mismatch));
        assert_eq!(v("v1,not*base64"), Err(VerifyError::Malformed));
        assert_eq!(v("garbage"), Err(VerifyError::Malformed));
        assert_eq!(v("v1"), Err(VerifyError::Malformed));
        // Unknown versions and extra spaces around a valid entry are fine.
        assert_eq!(v(&format!("v2,abc  {EXPECTED} v1a,zzz")), Ok(()));
        assert_eq!(v(&format!(" {EXPECTED} ")), Ok(()));
        // Unpadded is accepted too.
        assert_eq!(v(EXPECTED.trim_end_matches('=')), Ok(()));
        // A valid v1 entry wins over junk next to it: the sender proved it holds the key.
        assert_eq!(v(&format!("junk v1,%%% {EXPECTED}")), Ok(()));
        // A different version label with the right signature is not a v1 signature.
        assert_eq!(v(&EXPECTED.replacen("v1", "v2", 1)), Err(VerifyError::NoSupportedVersion));
        assert_eq!(v(&EXPECTED.replacen("v1", "V1", 1)), Err(VerifyError::NoSupportedVersion));
    }

    /// Random headers built from the characters that matter (and arbitrary bytes made into
    /// text) never panic and never verify.
    #[test]
    fn random_headers_never_panic_or_verify() {
        let seed: u64 = rand::random();
        let mut rng = StdRng::seed_from_u64(seed);
        let s = secret();
        let pieces = ["v1", ",", " ", "=", "g0hM9SsE", "+/", "v2", "\u{0}", "é", "AAAA", "v1,", ",,"];
        for _ in 0..5_000 {
            let header: String = if rng.random_bool(0.5) {
                (0..rng.random_range(0..12)).map(|_| pieces[rng.random_range(0..pieces.len())]).collect()
            } else {
                let bytes: Vec<u8> = (0..rng.random_range(0..80)).map(|_| rng.random()).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            };
            assert!(verify(&s, MSG_ID, TS, BODY, &header, TS, 300).is_err(), "seed {seed}: {header:?}");
        }
    }

    /// Signing and verifying agree for random ids, timestamps, bodies and secrets.
    #[test]
    fn random_round_trips() {
        let seed: u64 = rand::random();
        let mut rng = StdRng::seed_from_u64(seed);
        for _ in 0..500 {
            let secrets: Vec<EndpointSecret> = (0..rng.random_range(1..4)).map(|_| EndpointSecret::generate()).collect();
            let id = format!("msg_{}", rng.random::<u64>());
            let ts: i64 = rng.random_range(0..4_000_000_000);
            let body: Vec<u8> = (0..rng.random_range(0..300)).map(|_| rng.random()).collect();
            let header = signature_header(&secrets, &id, ts, &body);
            assert_eq!(header.split(' ').count(), secrets.len());
            for s in &secrets {
                assert_eq!(verify(s, &id, ts, &body, &header, ts + 10, 300), Ok(()), "seed {seed}");
            }
            let mut tampered = body.clone();
            tampered.push(b'x');
            assert_eq!(verify(&secrets[0], &id, ts, &tampered, &header, ts, 300), Err(VerifyError::Mismatch), "seed {seed}");
        }
    }
}

/// Header names a custom Endpoint header may not set: hop-by-hop ones (they describe one
/// connection, not the request) and those Railhook sets itself on every Attempt (DESIGN.md
/// 7), compared case-insensitively; `proxy-*` is refused as well. The API refuses them when an
/// Endpoint is created or updated; the worker drops them from rows written some other way.
pub const RESERVED_HEADERS: [&str; 16] = [
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "content-type",
    "user-agent",
    "x-event-id",
    "x-sequence-number",
];

/// Whether a custom header may not use `name` (see [`RESERVED_HEADERS`]).
pub fn is_reserved_header(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    RESERVED_HEADERS.contains(&lower.as_str()) || lower.starts_with("proxy-")
}

/// Property tests (proptest) of the verifier against hostile `webhook-signature` headers, and
/// of sign/verify against each other.
#[cfg(test)]
mod props {
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;

    fn secret() -> impl Strategy<Value = EndpointSecret> {
        vec(any::<u8>(), MIN_KEY_LEN..=MAX_KEY_LEN).prop_map(|key| EndpointSecret::parse(&format!("whsec_{}", STANDARD.encode(key))).unwrap())
    }

    /// Header pieces that make the parser's branches meet: versions, separators, base64 and
    /// not-quite-base64, and whole signatures of other content.
    fn piece() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("v1,".to_string()),
            Just("v1".to_string()),
            Just(",".to_string()),
            Just(" ".to_string()),
            Just("  ".to_string()),
            Just("=".to_string()),
            Just("v2,".to_string()),
            Just("v1a,".to_string()),
            Just("\t".to_string()),
            vec(any::<u8>(), 0..40).prop_map(|b| STANDARD.encode(b)),
            vec(any::<u8>(), 32..=32).prop_map(|b| format!("v1,{}", STANDARD.encode(b))),
            any::<String>(),
        ]
    }

    fn header() -> impl Strategy<Value = String> {
        prop_oneof![any::<String>(), vec(piece(), 0..16).prop_map(|p| p.concat())]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// No header, however built, panics or verifies without the key's signature in it.
        #[test]
        fn arbitrary_headers_never_panic_or_verify(s in secret(), id in ".{0,40}", ts in any::<i64>(), body in vec(any::<u8>(), 0..200), header in header()) {
            prop_assert!(verify(&s, &id, ts, &body, &header, ts, DEFAULT_TOLERANCE_SECS).is_err());
            // Any timestamp and now, however far apart: no overflow.
            let _ = verify(&s, &id, ts, &body, &header, ts.wrapping_mul(3), DEFAULT_TOLERANCE_SECS);
        }

        /// The signature verifies next to any amount of junk, before or after it.
        #[test]
        fn the_valid_entry_is_found_among_many(s in secret(), id in "[a-z0-9_]{1,30}", ts in 0i64..5_000_000_000, body in vec(any::<u8>(), 0..200), junk in vec(piece(), 0..200), at in any::<proptest::sample::Index>()) {
            let good = sign(&s, &id, ts, &body);
            let mut entries: Vec<String> = junk.into_iter().map(|j| j.replace(' ', "")).filter(|j| !j.is_empty()).collect();
            let i = at.index(entries.len() + 1);
            entries.insert(i, good);
            prop_assert_eq!(verify(&s, &id, ts, &body, &entries.join(" "), ts, 0), Ok(()));
        }

        /// Sign then verify always succeeds, for every secret of a rotation header.
        #[test]
        fn sign_then_verify(secrets in vec(secret(), 1..4), id in any::<String>(), ts in any::<i64>(), body in vec(any::<u8>(), 0..500), skew in -300i64..=300) {
            let header = signature_header(&secrets, &id, ts, &body);
            for s in &secrets {
                prop_assert_eq!(verify(s, &id, ts, &body, &header, ts.saturating_add(skew), 300), Ok(()));
            }
        }

        /// Changing any single byte of the body, of the id, or the timestamp breaks it.
        #[test]
        fn any_single_byte_change_fails(s in secret(), id in "[ -~]{1,40}", ts in 0i64..5_000_000_000, body in vec(any::<u8>(), 1..300), at in any::<proptest::sample::Index>(), flip in 1u8..=255, printable in 0x20u8..0x7f, delta in 1i64..1_000_000) {
            let header = sign(&s, &id, ts, &body);
            let mut changed = body.clone();
            let i = at.index(changed.len());
            changed[i] ^= flip;
            prop_assert_eq!(verify(&s, &id, ts, &changed, &header, ts, 300), Err(VerifyError::Mismatch));

            let mut id_bytes = id.clone().into_bytes();
            let j = at.index(id_bytes.len());
            prop_assume!(id_bytes[j] != printable);
            id_bytes[j] = printable;
            let other_id = String::from_utf8(id_bytes).unwrap();
            prop_assert_eq!(verify(&s, &other_id, ts, &body, &header, ts, 300), Err(VerifyError::Mismatch));

            // A different timestamp, with `now` next to it so the tolerance is not what refuses.
            let other_ts = ts + delta;
            prop_assert_eq!(verify(&s, &id, other_ts, &body, &header, other_ts, 300), Err(VerifyError::Mismatch));
        }

        /// Secrets: arbitrary text never panics; what parses re-parses to the same key.
        #[test]
        fn arbitrary_secrets_never_panic(text in prop_oneof![any::<String>(), ".{0,100}".prop_map(|s| format!("whsec_{s}")), vec(any::<u8>(), 0..80).prop_map(|k| format!("whsec_{}", STANDARD.encode(k)))]) {
            if let Ok(s) = EndpointSecret::parse(&text) {
                prop_assert_eq!(sign(&s, "m", 1, b"x"), sign(&EndpointSecret::parse(s.as_str()).unwrap(), "m", 1, b"x"));
            }
        }
    }

    /// Huge inputs: a 4 MiB header of entries, a 4 MiB header without a space, and a
    /// 16 MiB body. All return, and in time linear in the input (one HMAC, one pass).
    #[test]
    fn huge_inputs_do_not_panic() {
        let s = EndpointSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = vec![b'x'; 16 << 20];
        let good = sign(&s, "msg", 5, &body);
        let many = vec!["v1,AAAA"; 500_000].join(" ");
        assert_eq!(verify(&s, "msg", 5, &body, &many, 5, 300), Err(VerifyError::Mismatch));
        let with_good = format!("{many} {good}");
        assert_eq!(verify(&s, "msg", 5, &body, &with_good, 5, 300), Ok(()));
        let one_long = format!("v1,{}", "A".repeat(4 << 20));
        assert_eq!(verify(&s, "msg", 5, &body, &one_long, 5, 300), Err(VerifyError::Mismatch));
        let no_comma = "x".repeat(4 << 20);
        assert_eq!(verify(&s, "msg", 5, &body, &no_comma, 5, 300), Err(VerifyError::Malformed));
        let long_id = "i".repeat(1 << 20);
        assert!(verify(&s, &long_id, 5, &body, &good, 5, 300).is_err());
    }
}
