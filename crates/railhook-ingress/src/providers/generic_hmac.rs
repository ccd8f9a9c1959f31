//! A generic HMAC scheme for providers without a verifier of their own, configured per Source
//! ([`GenericHmacConfig`]): which header carries the signature, the algorithm (SHA-1,
//! SHA-256, SHA-512), the encoding (hex, either case, or base64), an optional prefix such as
//! `sha256=`, an optional timestamp header and an optional event id header.
//!
//! Signed content: the raw body; with a timestamp header, `"{timestamp}.{body}"` where the
//! timestamp is the header's text (unix seconds), which must be within 300 s of now. This is
//! the convention of Stripe-like senders; a sender signing something else needs its own
//! verifier.
//!
//! Event id: the configured `event_id_header`, if any. Unless the sender signs it elsewhere
//! it is not authenticated: it dedupes resends, not deliberate replays.

use std::time::SystemTime;

use crate::{
    clock, event_id, mac, GenericHmacConfig, IncomingRequest, Provider, Refusal, Secret,
    SignatureEncoding, Verified, Verifier,
};

/// The generic verifier: constant-time comparison; tolerance [`crate::TOLERANCE_SECS`] when a
/// timestamp header is configured; dedupes on the configured id header.
#[derive(Debug, Clone)]
pub struct GenericHmac {
    config: GenericHmacConfig,
}

impl GenericHmac {
    pub fn new(config: GenericHmacConfig) -> GenericHmac {
        GenericHmac { config }
    }
}

impl Verifier for GenericHmac {
    fn provider(&self) -> Provider {
        Provider::GenericHmac
    }

    fn verify(
        &self,
        req: &IncomingRequest<'_>,
        secrets: &[Secret],
        now: SystemTime,
    ) -> Result<Verified, Refusal> {
        let config = &self.config;
        let value = req.headers.required(&config.header)?;
        let encoded = match &config.prefix {
            Some(prefix) => value
                .strip_prefix(prefix.as_str())
                .ok_or(Refusal::MalformedHeader)?,
            None => value,
        };
        let decoder = match config.encoding {
            SignatureEncoding::Hex => mac::decode_hex,
            SignatureEncoding::Base64 => mac::decode_base64,
        };
        let tag = mac::decode(encoded, decoder)?;
        let timestamp = match &config.timestamp_header {
            Some(name) => {
                let text = req.headers.required(name)?;
                Some((
                    text,
                    clock::parse_timestamp(text).ok_or(Refusal::MalformedHeader)?,
                ))
            }
            None => None,
        };
        let secret_index = mac::matching_secret(secrets, &[tag], |secret| match timestamp {
            Some((text, _)) => mac::hmac(
                config.algorithm,
                secret.key(),
                &[text.as_bytes(), b".", req.body],
            ),
            None => mac::hmac(config.algorithm, secret.key(), &[req.body]),
        })?;
        if let Some((_, signed)) = timestamp {
            if !clock::within(signed, clock::unix_seconds(now), clock::TOLERANCE_SECS) {
                return Err(Refusal::TimestampOutOfTolerance);
            }
        }
        let event_id = match &config.event_id_header {
            Some(name) => event_id::from_header(&req.headers, name)?,
            None => None,
        };
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
    use crate::providers::table::{accepted, run, Case, Expect, Request, NOW};
    use crate::HmacAlgorithm;
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;

    const SECRET: &str = "generic-secret";
    const BODY: &[u8] = br#"{"hello":"world"}"#;

    fn config(
        algorithm: HmacAlgorithm,
        encoding: SignatureEncoding,
        prefix: Option<&str>,
        ts: bool,
    ) -> GenericHmacConfig {
        GenericHmacConfig {
            header: "X-Signature".into(),
            algorithm,
            encoding,
            prefix: prefix.map(String::from),
            timestamp_header: ts.then(|| "X-Timestamp".into()),
            event_id_header: Some("X-Event-Id".into()),
        }
    }

    fn sign(c: &GenericHmacConfig, secret: &str, ts: Option<i64>, body: &[u8]) -> String {
        let mut content = ts.map(|t| format!("{t}.").into_bytes()).unwrap_or_default();
        content.extend_from_slice(body);
        let tag = mac::hmac(c.algorithm, secret.as_bytes(), &[&content]);
        let encoded = match c.encoding {
            SignatureEncoding::Hex => hex::encode(tag),
            SignatureEncoding::Base64 => STANDARD.encode(tag),
        };
        format!("{}{encoded}", c.prefix.as_deref().unwrap_or(""))
    }

    fn signed(c: &GenericHmacConfig, ts: i64) -> Request {
        let ts_opt = c.timestamp_header.as_ref().map(|_| ts);
        let mut r = Request::post("https://hooks.example.com/ingress/tok", BODY)
            .header("X-Signature", sign(c, SECRET, ts_opt, BODY))
            .header("X-Event-Id", "ev_42");
        if c.timestamp_header.is_some() {
            r = r.header("X-Timestamp", ts.to_string());
        }
        r
    }

    #[test]
    fn table_for_every_shape() {
        for algorithm in [
            HmacAlgorithm::Sha1,
            HmacAlgorithm::Sha256,
            HmacAlgorithm::Sha512,
        ] {
            for encoding in [SignatureEncoding::Hex, SignatureEncoding::Base64] {
                for prefix in [None, Some("sha256=")] {
                    for ts in [false, true] {
                        let c = config(algorithm, encoding, prefix, ts);
                        let mut cases = vec![
                            Case::new("valid", signed(&c, NOW), &[SECRET], accepted(Some("ev_42"))),
                            Case::new(
                                "no id header",
                                signed(&c, NOW).without("X-Event-Id"),
                                &[SECRET],
                                accepted(None),
                            ),
                            Case::new(
                                "rotation",
                                signed(&c, NOW),
                                &["old", SECRET],
                                Expect::Accepted {
                                    event_id: Some("ev_42".into()),
                                    secret_index: 1,
                                },
                            ),
                            Case::new(
                                "tampered body",
                                signed(&c, NOW).body("{}"),
                                &[SECRET],
                                Expect::Refused(Refusal::BadSignature),
                            ),
                            Case::new(
                                "wrong secret",
                                signed(&c, NOW),
                                &["other"],
                                Expect::Refused(Refusal::BadSignature),
                            ),
                            Case::new(
                                "missing header",
                                signed(&c, NOW).without("X-Signature"),
                                &[SECRET],
                                Expect::Refused(Refusal::MissingHeader),
                            ),
                            Case::new(
                                "no secret",
                                signed(&c, NOW),
                                &[],
                                Expect::Refused(Refusal::NoSecret),
                            ),
                        ];
                        if prefix.is_some() {
                            let bare = sign(&c, SECRET, ts.then_some(NOW), BODY)
                                .replacen("sha256=", "", 1);
                            cases.push(Case::new(
                                "prefix missing",
                                signed(&c, NOW).set("X-Signature", bare),
                                &[SECRET],
                                Expect::Refused(Refusal::MalformedHeader),
                            ));
                        }
                        if ts {
                            cases.push(Case::new(
                                "old timestamp",
                                signed(&c, NOW - 301),
                                &[SECRET],
                                Expect::Refused(Refusal::TimestampOutOfTolerance),
                            ));
                            cases.push(Case::new(
                                "timestamp changed",
                                signed(&c, NOW).set("X-Timestamp", (NOW + 1).to_string()),
                                &[SECRET],
                                Expect::Refused(Refusal::BadSignature),
                            ));
                            cases.push(Case::new(
                                "missing timestamp",
                                signed(&c, NOW).without("X-Timestamp"),
                                &[SECRET],
                                Expect::Refused(Refusal::MissingHeader),
                            ));
                        } else {
                            cases.push(
                                Case::new(
                                    "no time signed: old is fine",
                                    signed(&c, NOW),
                                    &[SECRET],
                                    accepted(Some("ev_42")),
                                )
                                .now(NOW + 86_400),
                            );
                        }
                        run(&GenericHmac::new(c), cases);
                    }
                }
            }
        }
    }
}
