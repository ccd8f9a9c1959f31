//! GitHub, following "Validating webhook deliveries"
//! (<https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries>).
//!
//! `X-Hub-Signature-256: sha256=<hex HMAC-SHA256(secret, raw body)>`. The legacy SHA-1
//! `X-Hub-Signature` is not accepted: GitHub sends both, and SHA-256 is the one it recommends.
//! GitHub signs no time, so a captured delivery stays valid; the delivery id dedupes resends.
//!
//! Event id: `X-GitHub-Delivery` (a GUID, kept by "Redeliver"). It is not signed: it dedupes
//! GitHub's resends, not a deliberate replay with a fresh id.

use std::time::SystemTime;

use crate::{
    event_id, mac, HmacAlgorithm, IncomingRequest, Provider, Refusal, Secret, Verified, Verifier,
};

pub const SIGNATURE_HEADER: &str = "X-Hub-Signature-256";
pub const DELIVERY_HEADER: &str = "X-GitHub-Delivery";

/// GitHub's verifier: constant-time comparison of the body's HMAC-SHA256; no time signed;
/// dedupes on `X-GitHub-Delivery`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Github;

impl Verifier for Github {
    fn provider(&self) -> Provider {
        Provider::Github
    }

    fn verify(
        &self,
        req: &IncomingRequest<'_>,
        secrets: &[Secret],
        _now: SystemTime,
    ) -> Result<Verified, Refusal> {
        let header = req.headers.required(SIGNATURE_HEADER)?;
        let hex_tag = header
            .strip_prefix("sha256=")
            .ok_or(Refusal::MalformedHeader)?;
        let tag = mac::decode(hex_tag, mac::decode_hex)?;
        let secret_index = mac::matching_secret(secrets, &[tag], |secret| {
            mac::hmac(HmacAlgorithm::Sha256, secret.key(), &[req.body])
        })?;
        let event_id = event_id::from_header(&req.headers, DELIVERY_HEADER)?;
        Ok(Verified {
            event_id,
            challenge: None,
            secret_index,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::table::{accepted, run, Case, Expect, Request};

    const SECRET: &str = "It's a Secret to Everybody";
    const BODY: &[u8] = b"Hello, World!";
    const DELIVERY: &str = "72d3162e-cc78-11e3-81ab-4c9367dc0958";

    fn sign(secret: &str, body: &[u8]) -> String {
        format!(
            "sha256={}",
            hex::encode(mac::hmac(HmacAlgorithm::Sha256, secret.as_bytes(), &[body]))
        )
    }

    fn signed() -> Request {
        Request::post("https://hooks.example.com/ingress/tok", BODY)
            .header("X-Hub-Signature-256", sign(SECRET, BODY))
            .header("X-GitHub-Delivery", DELIVERY)
            .header("X-GitHub-Event", "push")
    }

    /// GitHub's documented test values: this secret and payload give this signature.
    #[test]
    fn documented_example() {
        assert_eq!(
            sign(SECRET, BODY),
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        );
    }

    #[test]
    fn table() {
        let cases = vec![
            Case::new("valid", signed(), &[SECRET], accepted(Some(DELIVERY))),
            Case::new(
                "uppercase hex",
                signed().set(
                    "X-Hub-Signature-256",
                    sign(SECRET, BODY)
                        .to_uppercase()
                        .replace("SHA256=", "sha256="),
                ),
                &[SECRET],
                accepted(Some(DELIVERY)),
            ),
            Case::new(
                "no delivery id: kept without dedupe",
                signed().without("X-GitHub-Delivery"),
                &[SECRET],
                accepted(None),
            ),
            Case::new(
                "rotation",
                signed(),
                &["old", SECRET],
                Expect::Accepted {
                    event_id: Some(DELIVERY.into()),
                    secret_index: 1,
                },
            ),
            Case::new(
                "tampered body",
                signed().body("Hello, World?"),
                &[SECRET],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "wrong secret",
                signed(),
                &["not it"],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "missing header",
                signed().without("X-Hub-Signature-256"),
                &[SECRET],
                Expect::Refused(Refusal::MissingHeader),
            ),
            Case::new(
                "legacy sha1 header only",
                signed()
                    .without("X-Hub-Signature-256")
                    .header("X-Hub-Signature", "sha1=0123"),
                &[SECRET],
                Expect::Refused(Refusal::MissingHeader),
            ),
            Case::new(
                "no prefix",
                signed().set("X-Hub-Signature-256", &sign(SECRET, BODY)[7..]),
                &[SECRET],
                Expect::Refused(Refusal::MalformedHeader),
            ),
            Case::new(
                "not hex",
                signed().set("X-Hub-Signature-256", "sha256=zz"),
                &[SECRET],
                Expect::Refused(Refusal::MalformedHeader),
            ),
            Case::new(
                "truncated tag",
                signed().set("X-Hub-Signature-256", &sign(SECRET, BODY)[..69]),
                &[SECRET],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "repeated header",
                signed().header("X-Hub-Signature-256", sign(SECRET, BODY)),
                &[SECRET],
                Expect::Refused(Refusal::MalformedHeader),
            ),
            Case::new(
                "no secret",
                signed(),
                &[],
                Expect::Refused(Refusal::NoSecret),
            ),
        ];
        run(&Github, cases);
    }
}
