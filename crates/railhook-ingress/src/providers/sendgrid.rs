//! SendGrid's signed Event Webhook, following "Getting Started with the Event Webhook
//! Security Features"
//! (<https://www.twilio.com/docs/sendgrid/for-developers/tracking-events/getting-started-event-webhook-security-features>).
//!
//! SendGrid signs with an ECDSA P-256 key of its own; the Source's "secret" is the
//! verification (public) key shown in SendGrid's settings, base64 DER (SubjectPublicKeyInfo)
//! or PEM. `X-Twilio-Email-Event-Webhook-Signature` holds the base64 DER signature over
//! SHA-256 of `timestamp + raw body`, the timestamp being
//! `X-Twilio-Email-Event-Webhook-Timestamp` (unix seconds), here held to 300 s of now.
//! Public-key verification has no secret to leak, so no constant-time comparison is needed.
//!
//! Event id: the body is a JSON array of events, each with a unique `sg_event_id`. A batch of
//! one yields its `sg_event_id`; a larger batch yields `batch:<hex SHA-256 of the sorted ids,
//! newline-separated>`, so that SendGrid's retry of the same batch dedupes. No id if any event
//! lacks one.

use std::time::SystemTime;

use p256::ecdsa::signature::hazmat::PrehashVerifier;
use p256::ecdsa::{Signature, VerifyingKey};
use p256::pkcs8::DecodePublicKey;
use sha2::{Digest, Sha256};

use crate::{clock, event_id, mac, IncomingRequest, Provider, Refusal, Secret, Verified, Verifier};

pub const SIGNATURE_HEADER: &str = "X-Twilio-Email-Event-Webhook-Signature";
pub const TIMESTAMP_HEADER: &str = "X-Twilio-Email-Event-Webhook-Timestamp";

/// SendGrid's verifier: ECDSA P-256 / SHA-256 with the Source's public key(s); tolerance
/// [`crate::TOLERANCE_SECS`]; dedupes on `sg_event_id` (or the batch's digest).
#[derive(Debug, Clone, Copy, Default)]
pub struct Sendgrid;

impl Verifier for Sendgrid {
    fn provider(&self) -> Provider {
        Provider::Sendgrid
    }

    fn verify(
        &self,
        req: &IncomingRequest<'_>,
        secrets: &[Secret],
        now: SystemTime,
    ) -> Result<Verified, Refusal> {
        let signature_text = req.headers.required(SIGNATURE_HEADER)?;
        let timestamp_text = req.headers.required(TIMESTAMP_HEADER)?;
        let timestamp = clock::parse_timestamp(timestamp_text).ok_or(Refusal::MalformedHeader)?;
        let der = mac::decode(signature_text, mac::decode_base64)?;
        let signature = Signature::from_der(&der).map_err(|_| Refusal::MalformedHeader)?;
        // (r, s) and (r, n - s) are the same signature; some signers emit the high form.
        let signature = signature.normalize_s().unwrap_or(signature);
        if secrets.is_empty() {
            return Err(Refusal::NoSecret);
        }
        let digest = Sha256::new()
            .chain_update(timestamp_text.as_bytes())
            .chain_update(req.body)
            .finalize();
        let mut usable_key = false;
        let mut secret_index = None;
        for (index, secret) in secrets.iter().enumerate() {
            let Some(key) = parse_public_key(secret.text()) else {
                continue;
            };
            usable_key = true;
            if key.verify_prehash(&digest, &signature).is_ok() {
                secret_index = Some(index);
                break;
            }
        }
        let secret_index = match (secret_index, usable_key) {
            (Some(index), _) => index,
            (None, true) => return Err(Refusal::BadSignature),
            (None, false) => return Err(Refusal::InvalidSecret),
        };
        if !clock::within(timestamp, clock::unix_seconds(now), clock::TOLERANCE_SECS) {
            return Err(Refusal::TimestampOutOfTolerance);
        }
        let event_id = batch_event_id(&event_id::json(req.body)?)?;
        Ok(Verified {
            event_id,
            challenge: None,
            secret_index,
        })
    }
}

/// A P-256 public key, base64 of its SubjectPublicKeyInfo DER, or that DER as PEM
/// (`-----BEGIN PUBLIC KEY-----`). Whitespace and line breaks are ignored.
pub(crate) fn parse_public_key(text: &str) -> Option<VerifyingKey> {
    let base64_text: String = text
        .lines()
        .filter(|line| !line.trim_start().starts_with("-----"))
        .flat_map(|line| line.chars())
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    let der = mac::decode_base64(&base64_text)?;
    VerifyingKey::from_public_key_der(&der).ok()
}

/// The id of a batch: see the module doc.
fn batch_event_id(body: &serde_json::Value) -> Result<Option<String>, Refusal> {
    let Some(events) = body.as_array() else {
        return Ok(None);
    };
    let mut ids = Vec::with_capacity(events.len());
    for event in events {
        match event_id::from_json_field(event, "sg_event_id")? {
            Some(id) => ids.push(id),
            None => return Ok(None),
        }
    }
    if ids.len() <= 1 {
        return Ok(ids.pop());
    }
    ids.sort_unstable();
    Ok(Some(format!(
        "batch:{}",
        hex::encode(Sha256::digest(ids.join("\n").as_bytes()))
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::table::{accepted, run, Case, Expect, Request, NOW};
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    use p256::ecdsa::signature::Signer;
    use p256::ecdsa::SigningKey;

    /// SendGrid's production fixture from its helper libraries: key, signature, timestamp and
    /// body (note the trailing CRLF, which is signed).
    const FIXTURE_KEY: &str = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE83T4O/n84iotIvIW4mdBgQ/7dAfSmpqIM8kF9mN1flpVKS3GRqe62gw+2fNNRaINXvVpiglSI8eNEc6wEA3F+g==";
    const FIXTURE_SIGNATURE: &str = "MEUCIGHQVtGj+Y3LkG9fLcxf3qfI10QysgDWmMOVmxG0u6ZUAiEAyBiXDWzM+uOe5W0JuG+luQAbPIqHh89M15TluLtEZtM=";
    const FIXTURE_TIMESTAMP: i64 = 1_600_112_502;
    const FIXTURE_BODY: &str = "[{\"email\":\"hello@world.com\",\"event\":\"dropped\",\"reason\":\"Bounced Address\",\"sg_event_id\":\"ZHJvcC0xMDk5NDkxOS1MUnpYbF9OSFN0T0doUTRrb2ZTbV9BLTA\",\"sg_message_id\":\"LRzXl_NHStOGhQ4kofSm_A.filterdrecv-p3mdw1-756b745b58-kmzbl-18-5F5FC76C-9.0\",\"smtp-id\":\"<LRzXl_NHStOGhQ4kofSm_A@ismtpd0039p1iad1.sendgrid.net>\",\"timestamp\":1600112492}]\r\n";
    /// SendGrid's older fixture: a single object body, no event id.
    const OLD_KEY: &str = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA==";
    const OLD_SIGNATURE: &str = "MEUCIQCtIHJeH93Y+qpYeWrySphQgpNGNr/U+UyUlBkU6n7RAwIgJTz2C+8a8xonZGi6BpSzoQsbVRamr2nlxFDWYNH2j/0=";
    const OLD_BODY: &str =
        r#"{"category":"example_payload","event":"test_event","message_id":"message_id"}"#;

    fn signing_key(seed: u8) -> SigningKey {
        SigningKey::from_slice(&[seed; 32]).unwrap()
    }

    /// The SubjectPublicKeyInfo DER of a P-256 key, base64, as SendGrid shows it: the fixed
    /// header for id-ecPublicKey/prime256v1, then the uncompressed point.
    fn public_key(key: &SigningKey) -> String {
        let mut der = hex::decode("3059301306072a8648ce3d020106082a8648ce3d030107034200").unwrap();
        der.extend_from_slice(key.verifying_key().to_encoded_point(false).as_bytes());
        STANDARD.encode(der)
    }

    /// SendGrid's documented scheme: ECDSA P-256 with SHA-256 over timestamp + body, DER, base64.
    fn sign(key: &SigningKey, ts: i64, body: &[u8]) -> String {
        let mut content = ts.to_string().into_bytes();
        content.extend_from_slice(body);
        let signature: Signature = key.sign(&content);
        STANDARD.encode(signature.to_der().as_bytes())
    }

    fn signed(key: &SigningKey, ts: i64, body: &[u8]) -> Request {
        Request::post("https://hooks.example.com/ingress/tok", body)
            .header(SIGNATURE_HEADER, sign(key, ts, body))
            .header(TIMESTAMP_HEADER, ts.to_string())
    }

    #[test]
    fn sendgrid_fixtures() {
        let fixture = Request::post(
            "https://hooks.example.com/ingress/tok",
            FIXTURE_BODY.as_bytes(),
        )
        .header(SIGNATURE_HEADER, FIXTURE_SIGNATURE)
        .header(TIMESTAMP_HEADER, FIXTURE_TIMESTAMP.to_string());
        let old = Request::post("https://hooks.example.com/ingress/tok", OLD_BODY.as_bytes())
            .header(SIGNATURE_HEADER, OLD_SIGNATURE)
            .header(TIMESTAMP_HEADER, "1588788367");
        let pem = format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n{}\n-----END PUBLIC KEY-----\n",
            &FIXTURE_KEY[..64],
            &FIXTURE_KEY[64..]
        );
        let cases = vec![
            Case::new(
                "production fixture",
                fixture.clone(),
                &[FIXTURE_KEY],
                accepted(Some("ZHJvcC0xMDk5NDkxOS1MUnpYbF9OSFN0T0doUTRrb2ZTbV9BLTA")),
            )
            .now(FIXTURE_TIMESTAMP + 10),
            Case::new(
                "production fixture, PEM key",
                fixture.clone(),
                &[&pem],
                accepted(Some("ZHJvcC0xMDk5NDkxOS1MUnpYbF9OSFN0T0doUTRrb2ZTbV9BLTA")),
            )
            .now(FIXTURE_TIMESTAMP),
            Case::new(
                "fixture without the trailing CRLF",
                fixture.clone().body(FIXTURE_BODY.trim_end()),
                &[FIXTURE_KEY],
                Expect::Refused(Refusal::BadSignature),
            )
            .now(FIXTURE_TIMESTAMP),
            Case::new(
                "fixture with the other key",
                fixture.clone(),
                &[OLD_KEY],
                Expect::Refused(Refusal::BadSignature),
            )
            .now(FIXTURE_TIMESTAMP),
            Case::new(
                "fixture, today",
                fixture,
                &[FIXTURE_KEY],
                Expect::Refused(Refusal::TimestampOutOfTolerance),
            ),
            Case::new("older fixture", old, &[OLD_KEY], accepted(None)).now(1_588_788_367),
        ];
        run(&Sendgrid, cases);
    }

    #[test]
    fn table() {
        let key = signing_key(7);
        let pk = public_key(&key);
        let other = public_key(&signing_key(9));
        let one = br#"[{"email":"a@example.com","event":"delivered","sg_event_id":"ZGVsaXZlcmVk","timestamp":1700000000}]"#;
        let two = br#"[{"event":"open","sg_event_id":"b"},{"event":"click","sg_event_id":"a"}]"#;
        let two_reordered =
            br#"[{"event":"click","sg_event_id":"a"},{"event":"open","sg_event_id":"b"}]"#;
        let batch = format!("batch:{}", hex::encode(Sha256::digest(b"a\nb")));
        let cases = vec![
            Case::new(
                "one event",
                signed(&key, NOW, one),
                &[&pk],
                accepted(Some("ZGVsaXZlcmVk")),
            ),
            Case::new(
                "a batch",
                signed(&key, NOW, two),
                &[&pk],
                accepted(Some(&batch)),
            ),
            Case::new(
                "the batch reordered has the same id",
                signed(&key, NOW, two_reordered),
                &[&pk],
                accepted(Some(&batch)),
            ),
            Case::new(
                "an event without id",
                signed(&key, NOW, br#"[{"event":"open"},{"sg_event_id":"a"}]"#),
                &[&pk],
                accepted(None),
            ),
            Case::new(
                "rotation",
                signed(&key, NOW, one),
                &[&other, &pk],
                Expect::Accepted {
                    event_id: Some("ZGVsaXZlcmVk".into()),
                    secret_index: 1,
                },
            ),
            Case::new(
                "tampered body",
                signed(&key, NOW, one).body(two),
                &[&pk],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "timestamp changed",
                signed(&key, NOW, one).set(TIMESTAMP_HEADER, (NOW + 1).to_string()),
                &[&pk],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "wrong key",
                signed(&key, NOW, one),
                &[&other],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "old timestamp",
                signed(&key, NOW - 301, one),
                &[&pk],
                Expect::Refused(Refusal::TimestampOutOfTolerance),
            ),
            Case::new(
                "missing signature",
                signed(&key, NOW, one).without(SIGNATURE_HEADER),
                &[&pk],
                Expect::Refused(Refusal::MissingHeader),
            ),
            Case::new(
                "missing timestamp",
                signed(&key, NOW, one).without(TIMESTAMP_HEADER),
                &[&pk],
                Expect::Refused(Refusal::MissingHeader),
            ),
            Case::new(
                "signature not DER",
                signed(&key, NOW, one).set(SIGNATURE_HEADER, STANDARD.encode([1u8; 64])),
                &[&pk],
                Expect::Refused(Refusal::MalformedHeader),
            ),
            Case::new(
                "unusable key",
                signed(&key, NOW, one),
                &["not a key"],
                Expect::Refused(Refusal::InvalidSecret),
            ),
            Case::new(
                "an unusable key next to the right one",
                signed(&key, NOW, one),
                &["not a key", &pk],
                Expect::Accepted {
                    event_id: Some("ZGVsaXZlcmVk".into()),
                    secret_index: 1,
                },
            ),
            Case::new(
                "signed but not JSON",
                signed(&key, NOW, b"nope"),
                &[&pk],
                Expect::Refused(Refusal::BodyNotParsable),
            ),
            Case::new(
                "no secret",
                signed(&key, NOW, one),
                &[],
                Expect::Refused(Refusal::NoSecret),
            ),
        ];
        run(&Sendgrid, cases);
    }
}
