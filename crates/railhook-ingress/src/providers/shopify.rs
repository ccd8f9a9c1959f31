//! Shopify, following "Verify webhooks"
//! (<https://shopify.dev/docs/apps/build/webhooks/subscribe/https#step-5-verify-the-webhook>):
//! `X-Shopify-Hmac-Sha256: <base64 HMAC-SHA256(app client secret, raw body)>`. No time is
//! signed.
//!
//! Event id: `X-Shopify-Webhook-Id`, the same on every retry of one webhook. (Shopify also
//! sends `X-Shopify-Event-Id`, shared by the webhooks of one event across subscriptions; the
//! webhook id is the narrower key, so it never merges two different webhooks.) Not signed.

use std::time::SystemTime;

use crate::{
    event_id, mac, HmacAlgorithm, IncomingRequest, Provider, Refusal, Secret, Verified, Verifier,
};

pub const SIGNATURE_HEADER: &str = "X-Shopify-Hmac-Sha256";
pub const WEBHOOK_ID_HEADER: &str = "X-Shopify-Webhook-Id";

/// Shopify's verifier: constant-time comparison of the body's HMAC-SHA256; no time signed;
/// dedupes on `X-Shopify-Webhook-Id`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Shopify;

impl Verifier for Shopify {
    fn provider(&self) -> Provider {
        Provider::Shopify
    }

    fn verify(
        &self,
        req: &IncomingRequest<'_>,
        secrets: &[Secret],
        _now: SystemTime,
    ) -> Result<Verified, Refusal> {
        let tag = mac::decode(req.headers.required(SIGNATURE_HEADER)?, mac::decode_base64)?;
        let secret_index = mac::matching_secret(secrets, &[tag], |secret| {
            mac::hmac(HmacAlgorithm::Sha256, secret.key(), &[req.body])
        })?;
        let event_id = event_id::from_header(&req.headers, WEBHOOK_ID_HEADER)?;
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
    use base64::Engine;

    const SECRET: &str = "shpss_0123456789abcdef";
    const BODY: &[u8] = br#"{"id":820982911946154508,"email":"jon@example.com"}"#;
    const WEBHOOK_ID: &str = "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043";

    fn sign(secret: &str, body: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(mac::hmac(
            HmacAlgorithm::Sha256,
            secret.as_bytes(),
            &[body],
        ))
    }

    fn signed() -> Request {
        Request::post("https://hooks.example.com/ingress/tok", BODY)
            .header("X-Shopify-Hmac-Sha256", sign(SECRET, BODY))
            .header("X-Shopify-Topic", "orders/create")
            .header("X-Shopify-Webhook-Id", WEBHOOK_ID)
    }

    #[test]
    fn table() {
        let cases = vec![
            Case::new("valid", signed(), &[SECRET], accepted(Some(WEBHOOK_ID))),
            Case::new(
                "unpadded base64",
                signed().set(
                    "X-Shopify-Hmac-Sha256",
                    sign(SECRET, BODY).trim_end_matches('='),
                ),
                &[SECRET],
                accepted(Some(WEBHOOK_ID)),
            ),
            Case::new(
                "rotation",
                signed(),
                &["old", SECRET],
                Expect::Accepted {
                    event_id: Some(WEBHOOK_ID.into()),
                    secret_index: 1,
                },
            ),
            Case::new(
                "tampered body",
                signed().body(&BODY[1..]),
                &[SECRET],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "wrong secret",
                signed(),
                &["shpss_other"],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "hex instead of base64",
                signed().set("X-Shopify-Hmac-Sha256", hex::encode([0u8; 32])),
                &[SECRET],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "not base64",
                signed().set("X-Shopify-Hmac-Sha256", "***"),
                &[SECRET],
                Expect::Refused(Refusal::MalformedHeader),
            ),
            Case::new(
                "missing header",
                signed().without("X-Shopify-Hmac-Sha256"),
                &[SECRET],
                Expect::Refused(Refusal::MissingHeader),
            ),
            Case::new(
                "overlong webhook id",
                signed().set("X-Shopify-Webhook-Id", "x".repeat(300)),
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
        run(&Shopify, cases);
    }
}
