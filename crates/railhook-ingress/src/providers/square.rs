//! Square, following "Verify and validate an event notification"
//! (<https://developer.squareup.com/docs/webhooks/step3validate>):
//! `x-square-hmacsha256-signature: <base64 HMAC-SHA256(signature key, notification URL +
//! raw body)>`. The URL is the subscription's notification URL, byte for byte: the ingress
//! passes the public URL the provider called. No time is signed. The legacy HMAC-SHA1
//! `x-square-signature` is not accepted.
//!
//! Event id: the body's `event_id`, Square's documented idempotency value. The body must be
//! JSON.

use std::time::SystemTime;

use crate::providers::absolute_http_url;
use crate::{
    event_id, mac, HmacAlgorithm, IncomingRequest, Provider, Refusal, Secret, Verified, Verifier,
};

pub const SIGNATURE_HEADER: &str = "X-Square-HmacSha256-Signature";

/// Square's verifier: constant-time comparison of HMAC-SHA256 over URL and body; no time
/// signed; dedupes on the body's `event_id`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Square;

impl Verifier for Square {
    fn provider(&self) -> Provider {
        Provider::Square
    }

    fn verify(
        &self,
        req: &IncomingRequest<'_>,
        secrets: &[Secret],
        _now: SystemTime,
    ) -> Result<Verified, Refusal> {
        let tag = mac::decode(req.headers.required(SIGNATURE_HEADER)?, mac::decode_base64)?;
        absolute_http_url(req.url)?;
        let secret_index = mac::matching_secret(secrets, &[tag], |secret| {
            mac::hmac(
                HmacAlgorithm::Sha256,
                secret.key(),
                &[req.url.as_bytes(), req.body],
            )
        })?;
        let event_id = event_id::from_json_field(&event_id::json(req.body)?, "event_id")?;
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

    const KEY: &str = "asdf1234";
    const URL: &str = "https://example.com/ingress/tok?x=1";
    const BODY: &[u8] = br#"{"merchant_id":"MLEFBHHSJGVHD","type":"payment.updated","event_id":"c0ec6b6e-6f6f-3a10-9d8c-7c6b3a6c9a1e","data":{}}"#;

    fn sign(key: &str, url: &str, body: &[u8]) -> String {
        let mut content = url.as_bytes().to_vec();
        content.extend_from_slice(body);
        base64::engine::general_purpose::STANDARD.encode(mac::hmac(
            HmacAlgorithm::Sha256,
            key.as_bytes(),
            &[&content],
        ))
    }

    fn signed() -> Request {
        Request::post(URL, BODY).header("x-square-hmacsha256-signature", sign(KEY, URL, BODY))
    }

    #[test]
    fn table() {
        let id = Some("c0ec6b6e-6f6f-3a10-9d8c-7c6b3a6c9a1e");
        let cases = vec![
            Case::new("valid", signed(), &[KEY], accepted(id)),
            Case::new(
                "rotation",
                signed(),
                &["old", KEY],
                Expect::Accepted {
                    event_id: id.map(String::from),
                    secret_index: 1,
                },
            ),
            Case::new(
                "tampered body",
                signed().body(&BODY[..BODY.len() - 2]),
                &[KEY],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "other URL",
                signed().url("https://example.com/ingress/tok?x=2"),
                &[KEY],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "default port written out",
                signed().url("https://example.com:443/ingress/tok?x=1"),
                &[KEY],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "wrong secret",
                signed(),
                &["other"],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "missing header",
                signed().without("x-square-hmacsha256-signature"),
                &[KEY],
                Expect::Refused(Refusal::MissingHeader),
            ),
            Case::new(
                "relative URL",
                signed().url("/ingress/tok?x=1"),
                &[KEY],
                Expect::Refused(Refusal::MalformedUrl),
            ),
            Case::new(
                "signed but not JSON",
                Request::post(URL, b"x")
                    .header("x-square-hmacsha256-signature", sign(KEY, URL, b"x")),
                &[KEY],
                Expect::Refused(Refusal::BodyNotParsable),
            ),
            Case::new(
                "no secret",
                signed(),
                &[],
                Expect::Refused(Refusal::NoSecret),
            ),
        ];
        run(&Square, cases);
    }
}
