//! HubSpot, signature v3, following "Validating requests"
//! (<https://developers.hubspot.com/docs/apps/developer-platform/build-apps/authentication/request-validation>).
//!
//! `X-HubSpot-Signature-v3: <base64 HMAC-SHA256(client secret, method + URI + raw body +
//! timestamp)>` with `X-HubSpot-Request-Timestamp: <unix milliseconds>`, rejected when more
//! than five minutes old (here: 300 s either way). In the URI, the escapes HubSpot lists are
//! decoded first (`%3A : %2F / %3F ? %40 @ %21 ! %24 $ %27 ' %28 ( %29 ) %2A * %2C , %3B ;`),
//! and nothing else. The older v1/v2 signatures (no timestamp) are not accepted.
//!
//! Event id: none. Webhook bodies are batches of up to 100 events whose `eventId`, HubSpot
//! documents, "is not guaranteed to be unique"; deduping on it could drop genuine events.

use std::time::SystemTime;

use crate::providers::absolute_http_url;
use crate::{
    clock, mac, HmacAlgorithm, IncomingRequest, Provider, Refusal, Secret, Verified, Verifier,
};

pub const SIGNATURE_HEADER: &str = "X-HubSpot-Signature-v3";
pub const TIMESTAMP_HEADER: &str = "X-HubSpot-Request-Timestamp";

/// HubSpot's verifier (v3): constant-time comparison; tolerance [`crate::TOLERANCE_SECS`] on
/// the millisecond timestamp; yields no event id.
#[derive(Debug, Clone, Copy, Default)]
pub struct Hubspot;

impl Verifier for Hubspot {
    fn provider(&self) -> Provider {
        Provider::Hubspot
    }

    fn verify(
        &self,
        req: &IncomingRequest<'_>,
        secrets: &[Secret],
        now: SystemTime,
    ) -> Result<Verified, Refusal> {
        let tag = mac::decode(req.headers.required(SIGNATURE_HEADER)?, mac::decode_base64)?;
        let timestamp_text = req.headers.required(TIMESTAMP_HEADER)?;
        let timestamp_ms =
            clock::parse_timestamp(timestamp_text).ok_or(Refusal::MalformedHeader)?;
        absolute_http_url(req.url)?;
        let uri = decode_listed_escapes(req.url);
        let secret_index = mac::matching_secret(secrets, &[tag], |secret| {
            let parts: [&[u8]; 4] = [
                req.method.as_bytes(),
                uri.as_bytes(),
                req.body,
                timestamp_text.as_bytes(),
            ];
            mac::hmac(HmacAlgorithm::Sha256, secret.key(), &parts)
        })?;
        if !clock::within(
            timestamp_ms,
            clock::unix_millis(now),
            clock::TOLERANCE_SECS * 1000,
        ) {
            return Err(Refusal::TimestampOutOfTolerance);
        }
        Ok(Verified {
            event_id: None,
            challenge: None,
            secret_index,
        })
    }
}

/// Decodes exactly the escapes HubSpot's table lists (hex digits in either case); every other
/// escape stays as sent.
fn decode_listed_escapes(url: &str) -> String {
    const LISTED: &[u8] = b":/?@!$'()*,;";
    let bytes = url.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let decoded = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(byte) = decoded.filter(|b| LISTED.contains(b)) {
                out.push(byte);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    // Only ASCII escapes are replaced by ASCII bytes, so the text stays UTF-8.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::table::{accepted, run, Case, Expect, Request, NOW};
    use base64::Engine;

    const SECRET: &str = "yyyyyyyy-yyyy-yyyy-yyyy-yyyyyyyyyyyy";
    const URL: &str = "https://hooks.example.com/ingress/tok?redirect=https%3A%2F%2Fx.io%2Fa%20b";
    /// The same URL with HubSpot's listed escapes decoded (`%20` is not listed).
    const URI: &str = "https://hooks.example.com/ingress/tok?redirect=https://x.io/a%20b";
    const BODY: &[u8] = br#"[{"eventId":1,"subscriptionId":12345,"portalId":62515,"occurredAt":1564113600000,"subscriptionType":"contact.creation","attemptNumber":0,"objectId":123}]"#;

    fn sign(secret: &str, method: &str, uri: &str, body: &[u8], ts_ms: i64) -> String {
        let mut content = format!("{method}{uri}").into_bytes();
        content.extend_from_slice(body);
        content.extend_from_slice(ts_ms.to_string().as_bytes());
        base64::engine::general_purpose::STANDARD.encode(mac::hmac(
            HmacAlgorithm::Sha256,
            secret.as_bytes(),
            &[&content],
        ))
    }

    fn signed(ts_ms: i64) -> Request {
        Request::post(URL, BODY)
            .header(
                "X-HubSpot-Signature-v3",
                sign(SECRET, "POST", URI, BODY, ts_ms),
            )
            .header("X-HubSpot-Request-Timestamp", ts_ms.to_string())
    }

    #[test]
    fn listed_escapes_only() {
        assert_eq!(decode_listed_escapes(URL), URI);
        assert_eq!(decode_listed_escapes("a%3a%2f%40%41%"), "a:/@%41%");
        assert_eq!(decode_listed_escapes("%2"), "%2");
        assert_eq!(decode_listed_escapes("%é%3B"), "%é;");
    }

    #[test]
    fn table() {
        let ms = NOW * 1000 + 123;
        let cases = vec![
            Case::new("valid", signed(ms), &[SECRET], accepted(None)),
            Case::new(
                "rotation",
                signed(ms),
                &["old", SECRET],
                Expect::Accepted {
                    event_id: None,
                    secret_index: 1,
                },
            ),
            Case::new(
                "tampered body",
                signed(ms).body("[]"),
                &[SECRET],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "other method",
                {
                    let mut r = signed(ms);
                    r.method = "PUT".into();
                    r
                },
                &[SECRET],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "wrong secret",
                signed(ms),
                &["other"],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "signed the raw URL instead",
                signed(ms).set(
                    "X-HubSpot-Signature-v3",
                    sign(SECRET, "POST", URL, BODY, ms),
                ),
                &[SECRET],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "old timestamp",
                signed(NOW * 1000 - 300_001),
                &[SECRET],
                Expect::Refused(Refusal::TimestampOutOfTolerance),
            ),
            Case::new(
                "exactly 300 s old",
                signed(NOW * 1000 - 300_000),
                &[SECRET],
                accepted(None),
            ),
            Case::new(
                "seconds instead of ms",
                signed(NOW),
                &[SECRET],
                Expect::Refused(Refusal::TimestampOutOfTolerance),
            ),
            Case::new(
                "missing signature",
                signed(ms).without("X-HubSpot-Signature-v3"),
                &[SECRET],
                Expect::Refused(Refusal::MissingHeader),
            ),
            Case::new(
                "missing timestamp",
                signed(ms).without("X-HubSpot-Request-Timestamp"),
                &[SECRET],
                Expect::Refused(Refusal::MissingHeader),
            ),
            Case::new(
                "no secret",
                signed(ms),
                &[],
                Expect::Refused(Refusal::NoSecret),
            ),
        ];
        run(&Hubspot, cases);
    }
}
