//! Stripe, following "Verify webhook signatures manually"
//! (<https://docs.stripe.com/webhooks#verify-manually>).
//!
//! `Stripe-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>...][,v0=...]`. Each `v1` is
//! hex HMAC-SHA256 keyed with the endpoint secret (`whsec_...`, used as given) over
//! `"{t}.{raw body}"`. Stripe sends several `v1` values while an endpoint secret is being
//! rolled; any one matching any of our secrets is enough. Other schemes (`v0`, test-mode) are
//! ignored. The timestamp must be within 300 s of now (Stripe's libraries' default).
//!
//! Event id: the body's `id` (`evt_...`), the same on every retry of the event. The body must
//! be JSON (`body_not_parsable` otherwise, after the signature is verified).

use std::time::SystemTime;

use crate::{
    clock, event_id, mac, HmacAlgorithm, IncomingRequest, Provider, Refusal, Secret, Verified,
    Verifier,
};

pub const SIGNATURE_HEADER: &str = "Stripe-Signature";

/// Stripe's verifier. Constant-time comparison of every `v1` against every secret's tag;
/// tolerance [`crate::TOLERANCE_SECS`]; dedupes on the body's `id`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stripe;

impl Verifier for Stripe {
    fn provider(&self) -> Provider {
        Provider::Stripe
    }

    fn verify(
        &self,
        req: &IncomingRequest<'_>,
        secrets: &[Secret],
        now: SystemTime,
    ) -> Result<Verified, Refusal> {
        let header = req.headers.required(SIGNATURE_HEADER)?;
        let (timestamp_text, candidates) = parse_header(header)?;
        let timestamp = clock::parse_timestamp(timestamp_text).ok_or(Refusal::MalformedHeader)?;
        let secret_index = mac::matching_secret(secrets, &candidates, |secret| {
            mac::hmac(
                HmacAlgorithm::Sha256,
                secret.key(),
                &[timestamp_text.as_bytes(), b".", req.body],
            )
        })?;
        if !clock::within(timestamp, clock::unix_seconds(now), clock::TOLERANCE_SECS) {
            return Err(Refusal::TimestampOutOfTolerance);
        }
        let event_id = event_id::from_json_field(&event_id::json(req.body)?, "id")?;
        Ok(Verified {
            event_id,
            challenge: None,
            secret_index,
        })
    }
}

/// The header's timestamp text and its decoded `v1` tags. Items without `=` and unknown
/// schemes are skipped, as Stripe's libraries do; a repeated `t` is ambiguous and refused; a
/// header without a `t` or without any well-formed `v1` is `malformed_header`.
fn parse_header(header: &str) -> Result<(&str, Vec<Vec<u8>>), Refusal> {
    let mut timestamp = None;
    let mut tags = Vec::new();
    for item in header.split(',') {
        let Some((key, value)) = item.trim().split_once('=') else {
            continue;
        };
        match key {
            "t" if timestamp.replace(value).is_some() => return Err(Refusal::MalformedHeader),
            "v1" => tags.extend(mac::decode_hex(value).filter(|tag| tag.len() == 32)),
            _ => {}
        }
    }
    match timestamp {
        Some(t) if !tags.is_empty() => Ok((t, tags)),
        _ => Err(Refusal::MalformedHeader),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::table::{accepted, run, Case, Expect, Request, NOW};

    const SECRET: &str = "whsec_test_secret_for_stripe";
    const BODY: &[u8] = br#"{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","type":"payment_intent.succeeded"}"#;

    /// Stripe's documented algorithm, written out independently of the verifier.
    fn v1(secret: &str, t: i64, body: &[u8]) -> String {
        let mut content = format!("{t}.").into_bytes();
        content.extend_from_slice(body);
        hex::encode(mac::hmac(
            HmacAlgorithm::Sha256,
            secret.as_bytes(),
            &[&content],
        ))
    }

    fn signed(header: String) -> Request {
        Request::post("https://hooks.example.com/ingress/tok", BODY)
            .header("Stripe-Signature", header)
    }

    #[test]
    fn table() {
        let good = format!("t={NOW},v1={}", v1(SECRET, NOW, BODY));
        let old = NOW - 301;
        let rolled = format!(
            "t={NOW},v1={},v1={},v0=abc",
            v1("whsec_other", NOW, BODY),
            v1(SECRET, NOW, BODY)
        );
        let cases = vec![
            Case::new(
                "valid",
                signed(good.clone()),
                &[SECRET],
                accepted(Some("evt_1NG8Du2eZvKYlo2CUI79vXWy")),
            ),
            Case::new(
                "header name is case-insensitive",
                signed(good.clone())
                    .without("Stripe-Signature")
                    .header("stripe-signature", &good),
                &[SECRET],
                accepted(Some("evt_1NG8Du2eZvKYlo2CUI79vXWy")),
            ),
            Case::new(
                "several v1, the second matches",
                signed(rolled),
                &[SECRET],
                accepted(Some("evt_1NG8Du2eZvKYlo2CUI79vXWy")),
            ),
            Case::new(
                "rotation: the second secret matches",
                signed(good.clone()),
                &["whsec_new", SECRET],
                Expect::Accepted {
                    event_id: Some("evt_1NG8Du2eZvKYlo2CUI79vXWy".into()),
                    secret_index: 1,
                },
            ),
            Case::new(
                "within tolerance, 300 s late",
                signed(good.clone()),
                &[SECRET],
                accepted(Some("evt_1NG8Du2eZvKYlo2CUI79vXWy")),
            )
            .now(NOW + 300),
            Case::new(
                "tampered body",
                signed(good.clone()).body(&BODY[..BODY.len() - 1]),
                &[SECRET],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "wrong secret",
                signed(good.clone()),
                &["whsec_wrong"],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "tampered timestamp",
                signed(format!("t={},v1={}", NOW + 1, v1(SECRET, NOW, BODY))),
                &[SECRET],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "old timestamp",
                signed(format!("t={old},v1={}", v1(SECRET, old, BODY))),
                &[SECRET],
                Expect::Refused(Refusal::TimestampOutOfTolerance),
            ),
            Case::new(
                "future timestamp",
                signed(good.clone()),
                &[SECRET],
                Expect::Refused(Refusal::TimestampOutOfTolerance),
            )
            .now(NOW - 301),
            Case::new(
                "missing header",
                signed(good.clone()).without("Stripe-Signature"),
                &[SECRET],
                Expect::Refused(Refusal::MissingHeader),
            ),
            Case::new(
                "no v1",
                signed(format!("t={NOW},v0={}", v1(SECRET, NOW, BODY))),
                &[SECRET],
                Expect::Refused(Refusal::MalformedHeader),
            ),
            Case::new(
                "no t",
                signed(format!("v1={}", v1(SECRET, NOW, BODY))),
                &[SECRET],
                Expect::Refused(Refusal::MalformedHeader),
            ),
            Case::new(
                "two t",
                signed(format!("t={NOW},t={NOW},v1={}", v1(SECRET, NOW, BODY))),
                &[SECRET],
                Expect::Refused(Refusal::MalformedHeader),
            ),
            Case::new(
                "no secret",
                signed(good.clone()),
                &[],
                Expect::Refused(Refusal::NoSecret),
            ),
            Case::new(
                "signed but not JSON",
                signed(format!("t={NOW},v1={}", v1(SECRET, NOW, b"nope"))).body("nope"),
                &[SECRET],
                Expect::Refused(Refusal::BodyNotParsable),
            ),
            Case::new(
                "signed JSON without id",
                signed(format!("t={NOW},v1={}", v1(SECRET, NOW, b"{}"))).body("{}"),
                &[SECRET],
                accepted(None),
            ),
        ];
        run(&Stripe, cases);
    }
}
