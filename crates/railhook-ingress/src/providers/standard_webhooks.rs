//! Standard Webhooks (<https://www.standardwebhooks.com>, the specification's "Verifying
//! webhooks"), the scheme Railhook itself signs with (DESIGN.md 7); verification is
//! [`railhook_core::signing::verify`], shared with the outgoing side.
//!
//! `webhook-signature: v1,<base64 HMAC-SHA256(key, "{webhook-id}.{webhook-timestamp}.{body}")>`
//! (several space-separated entries during the sender's rotation; any may match), the key being
//! the base64 after `whsec_`. `webhook-timestamp` (unix seconds) must be within 300 s of now.
//! Senders using Svix's original header names (`svix-id`, `svix-timestamp`,
//! `svix-signature`) are accepted too; the scheme is the same.
//!
//! Event id: `webhook-id`, which is signed, so it dedupes deliberate replays as well.

use std::time::SystemTime;

use railhook_core::signing::{self, EndpointSecret, SecretError, VerifyError, SECRET_PREFIX};

use crate::{clock, event_id, IncomingRequest, Provider, Refusal, Secret, Verified, Verifier};

pub const ID_HEADER: &str = "webhook-id";
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
pub const SIGNATURE_HEADER: &str = "webhook-signature";

/// Standard Webhooks' verifier: constant-time comparison (`hmac`'s `verify_slice`, in
/// railhook-core); tolerance [`crate::TOLERANCE_SECS`]; dedupes on `webhook-id`.
#[derive(Debug, Clone, Copy, Default)]
pub struct StandardWebhooks;

impl Verifier for StandardWebhooks {
    fn provider(&self) -> Provider {
        Provider::StandardWebhooks
    }

    fn verify(
        &self,
        req: &IncomingRequest<'_>,
        secrets: &[Secret],
        now: SystemTime,
    ) -> Result<Verified, Refusal> {
        let [id_header, timestamp_header, signature_header] =
            if req.headers.get(SIGNATURE_HEADER).is_none()
                && req.headers.get("svix-signature").is_some()
            {
                ["svix-id", "svix-timestamp", "svix-signature"]
            } else {
                [ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER]
            };
        let signature = req.headers.required(signature_header)?;
        let timestamp = clock::parse_timestamp(req.headers.required(timestamp_header)?)
            .ok_or(Refusal::MalformedHeader)?;
        let id = event_id::from_header(&req.headers, id_header)?.ok_or(Refusal::MissingHeader)?;
        if secrets.is_empty() {
            return Err(Refusal::NoSecret);
        }
        let mut usable_secret = false;
        let mut secret_index = None;
        for (index, secret) in secrets.iter().enumerate() {
            let Ok(secret) = parse_secret(secret.text()) else {
                continue;
            };
            usable_secret = true;
            // `now` = the timestamp with no tolerance: the signature alone is checked here;
            // the tolerance is applied after, so that a stale genuine request is reported so.
            match signing::verify(&secret, &id, timestamp, req.body, signature, timestamp, 0) {
                Ok(()) => {
                    secret_index = Some(index);
                    break;
                }
                Err(VerifyError::Mismatch) => continue,
                // The header's shape is the same for every secret.
                Err(_) => return Err(Refusal::MalformedHeader),
            }
        }
        let secret_index = match (secret_index, usable_secret) {
            (Some(index), _) => index,
            (None, true) => return Err(Refusal::BadSignature),
            (None, false) => return Err(Refusal::InvalidSecret),
        };
        if !clock::within(timestamp, clock::unix_seconds(now), clock::TOLERANCE_SECS) {
            return Err(Refusal::TimestampOutOfTolerance);
        }
        Ok(Verified {
            event_id: Some(id),
            challenge: None,
            secret_index,
        })
    }
}

/// A Standard Webhooks secret: `whsec_` + base64, or the bare base64 (which some senders show).
pub(crate) fn parse_secret(text: &str) -> Result<EndpointSecret, SecretError> {
    if text.starts_with(SECRET_PREFIX) {
        EndpointSecret::parse(text)
    } else {
        EndpointSecret::parse(&format!("{SECRET_PREFIX}{text}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::table::{accepted, run, Case, Expect, Request};
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;

    // The specification's test vector.
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TS: i64 = 1_614_265_330;
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn request() -> Request {
        Request::post("https://hooks.example.com/ingress/tok", BODY)
            .header("webhook-id", ID)
            .header("webhook-timestamp", TS.to_string())
            .header("webhook-signature", SIGNATURE)
    }

    /// The documented algorithm, written out: HMAC-SHA256 with the base64-decoded key.
    fn sign(secret: &str, id: &str, ts: i64, body: &[u8]) -> String {
        let key = STANDARD
            .decode(secret.trim_start_matches("whsec_"))
            .unwrap();
        let mut content = format!("{id}.{ts}.").into_bytes();
        content.extend_from_slice(body);
        format!(
            "v1,{}",
            STANDARD.encode(crate::mac::hmac(
                crate::HmacAlgorithm::Sha256,
                &key,
                &[&content]
            ))
        )
    }

    #[test]
    fn table() {
        assert_eq!(sign(SECRET, ID, TS, BODY), SIGNATURE);
        let other = "whsec_QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=";
        let svix = Request::post("https://hooks.example.com/ingress/tok", BODY)
            .header("svix-id", ID)
            .header("svix-timestamp", TS.to_string())
            .header("svix-signature", SIGNATURE);
        let cases = vec![
            Case::new(
                "specification vector",
                request(),
                &[SECRET],
                accepted(Some(ID)),
            )
            .now(TS),
            Case::new(
                "bare base64 secret",
                request(),
                &[&SECRET[6..]],
                accepted(Some(ID)),
            )
            .now(TS),
            Case::new("svix header names", svix, &[SECRET], accepted(Some(ID))).now(TS),
            Case::new(
                "sender rotating: two entries",
                request().set(
                    "webhook-signature",
                    format!("{} {SIGNATURE}", sign(other, ID, TS, BODY)),
                ),
                &[SECRET],
                accepted(Some(ID)),
            )
            .now(TS),
            Case::new(
                "our rotation",
                request(),
                &[other, SECRET],
                Expect::Accepted {
                    event_id: Some(ID.into()),
                    secret_index: 1,
                },
            )
            .now(TS),
            Case::new(
                "tampered body",
                request().body(r#"{"test": 2432232315}"#),
                &[SECRET],
                Expect::Refused(Refusal::BadSignature),
            )
            .now(TS),
            Case::new(
                "tampered id",
                request().set("webhook-id", "msg_other"),
                &[SECRET],
                Expect::Refused(Refusal::BadSignature),
            )
            .now(TS),
            Case::new(
                "wrong secret",
                request(),
                &[other],
                Expect::Refused(Refusal::BadSignature),
            )
            .now(TS),
            Case::new(
                "old timestamp",
                request(),
                &[SECRET],
                Expect::Refused(Refusal::TimestampOutOfTolerance),
            )
            .now(TS + 301),
            Case::new(
                "missing signature",
                request().without("webhook-signature"),
                &[SECRET],
                Expect::Refused(Refusal::MissingHeader),
            )
            .now(TS),
            Case::new(
                "missing id",
                request().without("webhook-id"),
                &[SECRET],
                Expect::Refused(Refusal::MissingHeader),
            )
            .now(TS),
            Case::new(
                "missing timestamp",
                request().without("webhook-timestamp"),
                &[SECRET],
                Expect::Refused(Refusal::MissingHeader),
            )
            .now(TS),
            Case::new(
                "malformed signature",
                request().set("webhook-signature", "garbage"),
                &[SECRET],
                Expect::Refused(Refusal::MalformedHeader),
            )
            .now(TS),
            Case::new(
                "unusable secret",
                request(),
                &["whsec_short"],
                Expect::Refused(Refusal::InvalidSecret),
            )
            .now(TS),
            Case::new(
                "no secret",
                request(),
                &[],
                Expect::Refused(Refusal::NoSecret),
            )
            .now(TS),
        ];
        run(&StandardWebhooks, cases);
    }
}
