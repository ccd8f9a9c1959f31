//! Standard Webhooks verification: the three headers, the timestamp tolerance, and the
//! signatures of a rotation.
//!
//! The signed content is `"{webhook-id}.{webhook-timestamp}.{body}"`; each signature is
//! `v1,<base64 HMAC-SHA256(key, content)>`. During a secret rotation Railhook sends one entry
//! per valid secret, space separated, and a receiver may hold several secrets too (the old
//! one until the rotation is over): the request is authentic when any entry matches any
//! secret.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::headers::{WebhookHeaders, ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER};
use crate::secret::{Secret, LENIENT};

use base64::Engine;
use hmac::Mac;

/// How far `webhook-timestamp` may be from now, either way: 5 minutes, as in every Standard
/// Webhooks library. Railhook signs each Attempt afresh, so a retry is never stale; a request
/// replayed by someone who captured it is.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// What a verified request says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// `webhook-id`: the Delivery id, the same on every Attempt of a Delivery. The key to
    /// [`crate::dedupe`] on.
    pub id: String,
    /// `webhook-timestamp`, unix seconds: when this Attempt was signed.
    pub timestamp: i64,
}

/// Why a request was refused. [`VerifyError::code`] and [`VerifyError::header`] name it for a
/// machine, `Display` for a person; [`VerifyError::is_unauthenticated`] tells a malformed
/// request (400) from one that failed authentication (401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the receiver has no secret to verify with")]
    NoSecrets,
    #[error("the {0} header is missing")]
    MissingHeader(&'static str),
    #[error("the {0} header is not valid text")]
    InvalidHeader(&'static str),
    #[error("webhook-timestamp must be unix seconds, got {0:?}")]
    InvalidTimestamp(String),
    #[error("webhook-timestamp {timestamp} is {age} s old, more than the {tolerance} s tolerance")]
    TooOld { timestamp: i64, age: u64, tolerance: u64 },
    #[error("webhook-timestamp {timestamp} is {ahead} s in the future, more than the {tolerance} s tolerance")]
    TooNew { timestamp: i64, ahead: u64, tolerance: u64 },
    #[error("the webhook-signature header has no signatures")]
    NoSignatures,
    #[error("the webhook-signature header is malformed: entries must be 'v1,<base64>' separated by spaces")]
    MalformedSignature,
    #[error("the webhook-signature header has no v1 signature")]
    NoSupportedVersion,
    #[error("no webhook-signature entry matches the request with any of the receiver's secrets")]
    NoMatchingSignature,
}

impl VerifyError {
    /// A stable snake_case code for JSON error bodies and logs.
    pub fn code(&self) -> &'static str {
        match self {
            VerifyError::NoSecrets => "no_secrets",
            VerifyError::MissingHeader(_) => "missing_header",
            VerifyError::InvalidHeader(_) => "invalid_header",
            VerifyError::InvalidTimestamp(_) => "invalid_timestamp",
            VerifyError::TooOld { .. } => "timestamp_too_old",
            VerifyError::TooNew { .. } => "timestamp_too_new",
            VerifyError::NoSignatures => "no_signatures",
            VerifyError::MalformedSignature => "malformed_signature",
            VerifyError::NoSupportedVersion => "no_supported_signature_version",
            VerifyError::NoMatchingSignature => "no_matching_signature",
        }
    }

    /// The header at fault, if one is.
    pub fn header(&self) -> Option<&'static str> {
        match self {
            VerifyError::NoSecrets => None,
            VerifyError::MissingHeader(h) | VerifyError::InvalidHeader(h) => Some(h),
            VerifyError::InvalidTimestamp(_) | VerifyError::TooOld { .. } | VerifyError::TooNew { .. } => Some(TIMESTAMP_HEADER),
            VerifyError::NoSignatures | VerifyError::MalformedSignature | VerifyError::NoSupportedVersion | VerifyError::NoMatchingSignature => {
                Some(SIGNATURE_HEADER)
            }
        }
    }

    /// Whether the request was well formed but not authentic or not fresh (answer 401),
    /// rather than malformed (400). [`VerifyError::NoSecrets`] is neither: the receiver is
    /// misconfigured.
    pub fn is_unauthenticated(&self) -> bool {
        matches!(self, VerifyError::TooOld { .. } | VerifyError::TooNew { .. } | VerifyError::NoSupportedVersion | VerifyError::NoMatchingSignature)
    }
}

/// One or several secrets and a tolerance. Cheap to clone; build it once at start-up.
#[derive(Debug, Clone)]
pub struct Verifier {
    /// Every secret currently valid for the Endpoint: one normally, two during a rotation.
    secrets: Vec<Secret>,
    /// Allowed distance between `webhook-timestamp` and the receiver's clock.
    tolerance: Duration,
}

impl Verifier {
    /// A verifier of `secrets` with the [`DEFAULT_TOLERANCE`].
    pub fn new(secrets: impl IntoIterator<Item = Secret>) -> Verifier {
        Verifier { secrets: secrets.into_iter().collect(), tolerance: DEFAULT_TOLERANCE }
    }

    /// Another tolerance (e.g. for a receiver whose clock is known to drift).
    pub fn with_tolerance(mut self, tolerance: Duration) -> Verifier {
        self.tolerance = tolerance;
        self
    }

    pub fn tolerance(&self) -> Duration {
        self.tolerance
    }

    /// Verifies a request against the system clock.
    pub fn verify(&self, headers: &(impl WebhookHeaders + ?Sized), body: &[u8]) -> Result<Verified, VerifyError> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        self.verify_at(headers, body, now)
    }

    /// Verifies a request as if the time were `now` (unix seconds).
    ///
    /// Order of the checks, so the error names the first thing wrong: secrets configured,
    /// the three headers present and text, the timestamp an integer within the tolerance,
    /// then the signatures. Entries of versions other than `v1` (e.g. `v1a`) are skipped. Each
    /// comparison is constant-time (`Mac::verify_slice`), and the HMAC of the body is
    /// computed once per secret, however many entries the header has. Never panics.
    pub fn verify_at(&self, headers: &(impl WebhookHeaders + ?Sized), body: &[u8], now: i64) -> Result<Verified, VerifyError> {
        if self.secrets.is_empty() {
            return Err(VerifyError::NoSecrets);
        }
        let id = required(headers, ID_HEADER)?;
        let timestamp_text = required(headers, TIMESTAMP_HEADER)?;
        let signatures = required(headers, SIGNATURE_HEADER)?;

        let timestamp: i64 = timestamp_text
            .trim()
            .parse()
            .ok()
            .filter(|_| timestamp_text.trim().bytes().all(|b| b.is_ascii_digit() || b == b'-'))
            .ok_or_else(|| VerifyError::InvalidTimestamp(timestamp_text.chars().take(40).collect()))?;
        check_signatures(&self.secrets, id, timestamp, signatures, body, now, self.tolerance.as_secs())?;
        Ok(Verified { id: id.to_string(), timestamp })
    }
}

/// The checks after the headers were read: `timestamp` within `tolerance_secs` of `now` (unix
/// seconds, inclusive, either direction, overflow-free), then the space-separated `v1,<base64>`
/// entries of `signatures` against each secret's HMAC of `{id}.{timestamp}.{body}` (other
/// versions skipped, constant-time comparisons, the HMAC of the body computed once per
/// secret). The error says the first thing wrong: [`VerifyError::TooOld`] or
/// [`VerifyError::TooNew`]; then, when nothing matched, [`VerifyError::NoSignatures`] for an
/// empty header, [`VerifyError::MalformedSignature`] if an entry lacked its `,` or a `v1`
/// entry was not base64, [`VerifyError::NoMatchingSignature`] if there was a `v1` entry,
/// else [`VerifyError::NoSupportedVersion`]. Never panics.
///
/// [`Verifier`] calls it after reading the three headers; Railhook's own ingress (Standard
/// Webhooks Sources, `railhook_core::signing::verify`) calls it with the parts it read.
pub fn check_signatures(secrets: &[Secret], id: &str, timestamp: i64, signatures: &str, body: &[u8], now: i64, tolerance_secs: u64) -> Result<(), VerifyError> {
    let tolerance = tolerance_secs;
    let distance = now.abs_diff(timestamp);
    if distance > tolerance {
        return Err(if timestamp < now {
            VerifyError::TooOld { timestamp, age: distance, tolerance }
        } else {
            VerifyError::TooNew { timestamp, ahead: distance, tolerance }
        });
    }

    let expected: Vec<_> = secrets.iter().map(|s| s.keyed(id, timestamp, body)).collect();
    let (mut entries, mut malformed, mut saw_v1) = (0usize, false, false);
    for entry in signatures.split(' ').filter(|e| !e.is_empty()) {
        entries += 1;
        let Some((version, signature)) = entry.split_once(',') else {
            malformed = true;
            continue;
        };
        if version != "v1" {
            continue;
        }
        saw_v1 = true;
        let Ok(tag) = LENIENT.decode(signature) else {
            malformed = true;
            continue;
        };
        if expected.iter().any(|mac| mac.clone().verify_slice(&tag).is_ok()) {
            return Ok(());
        }
    }
    Err(if entries == 0 {
        VerifyError::NoSignatures
    } else if malformed {
        VerifyError::MalformedSignature
    } else if saw_v1 {
        VerifyError::NoMatchingSignature
    } else {
        VerifyError::NoSupportedVersion
    })
}

/// Verifies a request against `secrets` with the [`DEFAULT_TOLERANCE`] and the system clock.
/// For another tolerance, or to verify many requests, build a [`Verifier`] once.
pub fn verify(secrets: &[Secret], headers: &(impl WebhookHeaders + ?Sized), body: &[u8]) -> Result<Verified, VerifyError> {
    Verifier::new(secrets.iter().cloned()).verify(headers, body)
}

fn required<'h>(headers: &'h (impl WebhookHeaders + ?Sized), name: &'static str) -> Result<&'h str, VerifyError> {
    match headers.header(name) {
        None => Err(VerifyError::MissingHeader(name)),
        Some(Err(())) => Err(VerifyError::InvalidHeader(name)),
        Some(Ok(v)) if v.trim().is_empty() => Err(VerifyError::MissingHeader(name)),
        Some(Ok(v)) => Ok(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SecretError;

    /// The official Standard Webhooks test vector (the one every Standard Webhooks library
    /// tests against), then vectors made with the Python `standardwebhooks` package 1.1.0's
    /// `Webhook.sign`: a 24-byte key, a 64-byte key with an empty body, a 32-byte key with
    /// non-ASCII UTF-8 in the body.
    const VECTORS: [(&str, &str, i64, &str, &str); 4] = [
        ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, r#"{"test": 2432232314}"#, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="),
        (
            "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYX",
            "dlv_01h2xcejqtf2nbrexx3vqjhp41",
            1700000000,
            r#"{"type":"order.paid","payload":{"amount":100}}"#,
            "v1,w6+ih8XbKFVXh8+Q/wv6u9zUsO6L6FOa40VzMuJYU9o=",
        ),
        (
            "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+Pw==",
            "dlv_x",
            0,
            "",
            "v1,MM+02Q+zxSiN9Xkdfk1BG494r6NFv9EmKNW26VzCo3k=",
        ),
        ("whsec_//79/Pv6+fj39vX08/Lx8O/u7ezr6uno5+bl5OPi4eA=", "msg_2", 4102444800, "{\"emoji\":\"\u{e9}\u{2603}\"}", "v1,uvIMkpBV59qgjnhkN3HNRorm66Ex2VpBuvPvXDtVMdQ="),
    ];

    const OFFICIAL: (&str, &str, i64, &str, &str) = VECTORS[0];

    fn secret(text: &str) -> Secret {
        text.parse().unwrap()
    }

    fn headers(id: &str, ts: &str, sig: &str) -> Vec<(String, String)> {
        vec![("webhook-id".into(), id.into()), ("webhook-timestamp".into(), ts.into()), ("webhook-signature".into(), sig.into())]
    }

    fn official(sig: &str, now: i64) -> Result<Verified, VerifyError> {
        let (s, id, ts, body, _) = OFFICIAL;
        Verifier::new([secret(s)]).verify_at(&headers(id, &ts.to_string(), sig), body.as_bytes(), now)
    }

    #[test]
    fn published_and_cross_checked_vectors() {
        for (s, id, ts, body, expected) in VECTORS {
            assert_eq!(secret(s).sign(id, ts, body.as_bytes()), expected, "{id}");
            let got = Verifier::new([secret(s)]).verify_at(&headers(id, &ts.to_string(), expected), body.as_bytes(), ts);
            assert_eq!(got, Ok(Verified { id: id.to_string(), timestamp: ts }));
        }
    }

    #[test]
    fn rotation_several_signatures_and_several_secrets() {
        let (s, id, ts, body, good) = OFFICIAL;
        let other = secret(VECTORS[1].0);
        let third = secret(VECTORS[3].0);
        let both = format!("{} {good}", other.sign(id, ts, body.as_bytes()));
        let h = headers(id, &ts.to_string(), &both);
        // A receiver holding only the old secret, only the new one, or both, accepts.
        for v in [Verifier::new([secret(s)]), Verifier::new([other.clone()]), Verifier::new([third.clone(), secret(s)])] {
            assert!(v.verify_at(&h, body.as_bytes(), ts).is_ok());
        }
        // A receiver holding neither does not.
        assert_eq!(Verifier::new([third]).verify_at(&h, body.as_bytes(), ts), Err(VerifyError::NoMatchingSignature));
        assert_eq!(Verifier::new([]).verify_at(&h, body.as_bytes(), ts), Err(VerifyError::NoSecrets));
    }

    #[test]
    fn any_change_breaks_it() {
        let (s, id, ts, body, good) = OFFICIAL;
        let v = Verifier::new([secret(s)]);
        assert_eq!(v.verify_at(&headers("msg_p5jXN8AQM9LWM0D4loKWxJeK", &ts.to_string(), good), body.as_bytes(), ts), Err(VerifyError::NoMatchingSignature));
        assert_eq!(v.verify_at(&headers(id, &(ts + 1).to_string(), good), body.as_bytes(), ts), Err(VerifyError::NoMatchingSignature));
        assert_eq!(v.verify_at(&headers(id, &ts.to_string(), good), br#"{"test": 2432232315}"#, ts), Err(VerifyError::NoMatchingSignature));
        assert_eq!(v.verify_at(&headers(id, &ts.to_string(), good), format!("{body}\n").as_bytes(), ts), Err(VerifyError::NoMatchingSignature));
    }

    #[test]
    fn timestamp_tolerance() {
        let (_, _, ts, _, good) = OFFICIAL;
        assert!(official(good, ts + 300).is_ok());
        assert!(official(good, ts - 300).is_ok());
        assert_eq!(official(good, ts + 301), Err(VerifyError::TooOld { timestamp: ts, age: 301, tolerance: 300 }));
        assert_eq!(official(good, ts - 301), Err(VerifyError::TooNew { timestamp: ts, ahead: 301, tolerance: 300 }));
        let (s, id, _, body, _) = OFFICIAL;
        let strict = Verifier::new([secret(s)]).with_tolerance(Duration::ZERO);
        assert!(strict.verify_at(&headers(id, &ts.to_string(), good), body.as_bytes(), ts).is_ok());
        assert!(strict.verify_at(&headers(id, &ts.to_string(), good), body.as_bytes(), ts + 1).is_err());
        // Extremes neither overflow nor panic.
        assert!(matches!(official(good, i64::MIN), Err(VerifyError::TooNew { .. })));
        assert!(matches!(official(good, i64::MAX), Err(VerifyError::TooOld { .. })));
        // The system clock: the vector is from 2021, far outside the tolerance.
        let h = headers(OFFICIAL.1, &ts.to_string(), good);
        assert!(matches!(verify(&[secret(s)], &h, body.as_bytes()), Err(VerifyError::TooOld { .. })));
    }

    #[test]
    fn headers_missing_or_malformed() {
        let (s, id, ts, body, good) = OFFICIAL;
        let v = Verifier::new([secret(s)]);
        let ts = ts.to_string();
        let drop = |name: &str| headers(id, &ts, good).into_iter().filter(|(k, _)| k != name).collect::<Vec<_>>();
        for name in [ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER] {
            let err = v.verify_at(&drop(name), body.as_bytes(), 1614265330).unwrap_err();
            assert_eq!(err, VerifyError::MissingHeader(name));
            assert_eq!(err.code(), "missing_header");
            assert_eq!(err.header(), Some(name));
            assert!(!err.is_unauthenticated());
        }
        assert_eq!(v.verify_at(&headers("", &ts, good), body.as_bytes(), 0), Err(VerifyError::MissingHeader(ID_HEADER)));
        for bad in ["abc", "1614265330.5", "1e9", "+1614265330", "0x10"] {
            assert_eq!(v.verify_at(&headers(id, bad, good), body.as_bytes(), 1614265330), Err(VerifyError::InvalidTimestamp(bad.into())), "{bad}");
        }
        // Header names are case-insensitive, and an http::HeaderMap works the same.
        let upper = [("Webhook-Id", id), ("WEBHOOK-TIMESTAMP", ts.as_str()), ("Webhook-Signature", good)];
        assert!(v.verify_at(&upper[..], body.as_bytes(), 1614265330).is_ok());
        let mut map = http::HeaderMap::new();
        map.insert("webhook-id", id.parse().unwrap());
        map.insert("webhook-timestamp", ts.parse().unwrap());
        map.insert("webhook-signature", good.parse().unwrap());
        assert!(v.verify_at(&map, body.as_bytes(), 1614265330).is_ok());
        map.insert("webhook-id", http::HeaderValue::from_bytes(b"msg_\xff").unwrap());
        assert_eq!(v.verify_at(&map, body.as_bytes(), 1614265330), Err(VerifyError::InvalidHeader(ID_HEADER)));
    }

    #[test]
    fn signature_header_parsing() {
        let (_, _, ts, _, good) = OFFICIAL;
        let at = |sig: &str| official(sig, ts);
        assert_eq!(at("   ").unwrap_err(), VerifyError::MissingHeader(SIGNATURE_HEADER));
        assert_eq!(at("v2,abc v1a,xyz"), Err(VerifyError::NoSupportedVersion));
        assert_eq!(at("v1,AAAA"), Err(VerifyError::NoMatchingSignature));
        assert_eq!(at("v1,not*base64"), Err(VerifyError::MalformedSignature));
        assert_eq!(at("garbage"), Err(VerifyError::MalformedSignature));
        assert!(at(&format!("v2,abc  {good} v1a,zzz")).is_ok());
        assert!(at(good.trim_end_matches('=')).is_ok(), "unpadded base64 is accepted");
        assert!(at(&format!("junk v1,%%% {good}")).is_ok(), "a valid entry wins over junk beside it");
        assert_eq!(at(&good.replacen("v1", "V1", 1)), Err(VerifyError::NoSupportedVersion));
        // A truncated or extended tag does not match.
        let tag = LENIENT.decode(&good[3..]).unwrap();

        for bad in [&tag[..31], &[&tag[..], &[0u8]].concat()[..]] {
            assert_eq!(at(&format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(bad))), Err(VerifyError::NoMatchingSignature));
        }
        let err = at("v1,AAAA").unwrap_err();
        assert_eq!((err.code(), err.header(), err.is_unauthenticated()), ("no_matching_signature", Some(SIGNATURE_HEADER), true));
    }

    #[test]
    fn secrets() {
        assert_eq!(Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap_err(), SecretError::MissingPrefix);
        assert_eq!(Secret::parse("whsec_not base64!").unwrap_err(), SecretError::NotBase64);
        assert_eq!(Secret::parse("whsec_").unwrap_err(), SecretError::Empty);
        // Padded and unpadded are the same key; surrounding whitespace (a copied line) is ignored.
        let padded = VECTORS[2].0;
        let a = secret(padded).sign("m", 1, b"x");
        assert_eq!(a, secret(padded.trim_end_matches('=')).sign("m", 1, b"x"));
        assert_eq!(a, secret(&format!(" {padded}\n")).sign("m", 1, b"x"));
        assert!(!format!("{:?}", secret(padded)).contains("AAEC"));
    }

    /// Hostile headers of many shapes never panic and never verify.
    #[test]
    fn hostile_headers_never_verify() {
        let (_, _, ts, _, _) = OFFICIAL;
        let pieces = ["v1", ",", " ", "=", "g0hM9SsE", "+/", "v2", "\u{0}", "\u{e9}", "AAAA", "v1,", ",,"];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..5_000 {
            let n = next() % 12;
            let header: String = (0..n).map(|_| pieces[(next() % pieces.len() as u64) as usize]).collect();
            assert!(official(&header, ts).is_err(), "{header:?}");
        }
        let many = vec!["v1,AAAA"; 100_000].join(" ");
        assert_eq!(official(&many, ts), Err(VerifyError::NoMatchingSignature));
        assert!(official(&format!("{many} {}", OFFICIAL.4), ts).is_ok());
    }
}
