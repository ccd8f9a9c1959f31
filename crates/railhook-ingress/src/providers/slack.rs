//! Slack, following "Verifying requests from Slack"
//! (<https://api.slack.com/authentication/verifying-requests-from-slack>) and the Events API's
//! `url_verification` handshake (<https://api.slack.com/events/url_verification>).
//!
//! `X-Slack-Signature: v0=<hex HMAC-SHA256(signing secret, "v0:{ts}:{raw body}")>` with
//! `X-Slack-Request-Timestamp: <unix seconds>`, which must be within 300 s of now (Slack's
//! own advice: five minutes).
//!
//! Bodies: the Events API sends JSON; slash commands and interactivity send form-encoded
//! bodies, which are accepted without an event id. A JSON `{"type": "url_verification",
//! "challenge": ...}` yields [`Verified::challenge`] for the ingress to echo.
//!
//! Event id: the body's `event_id` (`Ev...`), the same on Slack's retries (which add
//! `X-Slack-Retry-Num`).

use std::time::SystemTime;

use crate::{
    clock, event_id, mac, HmacAlgorithm, IncomingRequest, Provider, Refusal, Secret, Verified,
    Verifier,
};

pub const SIGNATURE_HEADER: &str = "X-Slack-Signature";
pub const TIMESTAMP_HEADER: &str = "X-Slack-Request-Timestamp";

/// Longest `url_verification` challenge echoed (Slack's are ~50 characters).
const MAX_CHALLENGE_LEN: usize = 1024;

/// Slack's verifier: constant-time comparison of the `v0` HMAC-SHA256; tolerance
/// [`crate::TOLERANCE_SECS`] on `X-Slack-Request-Timestamp`; dedupes on the body's `event_id`;
/// answers `url_verification` through [`Verified::challenge`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Slack;

impl Verifier for Slack {
    fn provider(&self) -> Provider {
        Provider::Slack
    }

    fn verify(
        &self,
        req: &IncomingRequest<'_>,
        secrets: &[Secret],
        now: SystemTime,
    ) -> Result<Verified, Refusal> {
        let signature = req.headers.required(SIGNATURE_HEADER)?;
        let timestamp_text = req.headers.required(TIMESTAMP_HEADER)?;
        let timestamp = clock::parse_timestamp(timestamp_text).ok_or(Refusal::MalformedHeader)?;
        let hex_tag = signature
            .strip_prefix("v0=")
            .ok_or(Refusal::MalformedHeader)?;
        let tag = mac::decode(hex_tag, mac::decode_hex)?;
        let secret_index = mac::matching_secret(secrets, &[tag], |secret| {
            mac::hmac(
                HmacAlgorithm::Sha256,
                secret.key(),
                &[b"v0:", timestamp_text.as_bytes(), b":", req.body],
            )
        })?;
        if !clock::within(timestamp, clock::unix_seconds(now), clock::TOLERANCE_SECS) {
            return Err(Refusal::TimestampOutOfTolerance);
        }
        let (event_id, challenge) = read_body(req.body)?;
        Ok(Verified {
            event_id,
            challenge,
            secret_index,
        })
    }
}

/// The event id and the `url_verification` challenge of a JSON body; a form body has neither.
fn read_body(body: &[u8]) -> Result<(Option<String>, Option<String>), Refusal> {
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Ok((None, None));
    }
    let json = event_id::json(body)?;
    let challenge = match (
        json.get("type").and_then(|t| t.as_str()),
        json.get("challenge"),
    ) {
        (Some("url_verification"), Some(serde_json::Value::String(c)))
            if !c.is_empty() && c.len() <= MAX_CHALLENGE_LEN =>
        {
            Some(c.clone())
        }
        (Some("url_verification"), _) => return Err(Refusal::BodyNotParsable),
        _ => None,
    };
    Ok((event_id::from_json_field(&json, "event_id")?, challenge))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::table::{accepted, run, Case, Expect, Request, NOW};

    const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    const EVENT: &[u8] = br#"{"token":"z","team_id":"T1","type":"event_callback","event":{"type":"app_mention"},"event_id":"Ev08MFMKH6","event_time":1700000000}"#;

    fn sign(secret: &str, ts: i64, body: &[u8]) -> String {
        let mut base = format!("v0:{ts}:").into_bytes();
        base.extend_from_slice(body);
        format!(
            "v0={}",
            hex::encode(mac::hmac(
                HmacAlgorithm::Sha256,
                secret.as_bytes(),
                &[&base]
            ))
        )
    }

    fn signed(ts: i64, body: &[u8]) -> Request {
        Request::post("https://hooks.example.com/ingress/tok", body)
            .header("X-Slack-Signature", sign(SECRET, ts, body))
            .header("X-Slack-Request-Timestamp", ts.to_string())
    }

    #[test]
    fn table() {
        let challenge = br#"{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
        let command = b"token=gIkuvaNzQIHg97ATvDxqgjtO&team_id=T0001&command=%2Fweather&text=94070";
        let cases = vec![
            Case::new(
                "event callback",
                signed(NOW, EVENT),
                &[SECRET],
                accepted(Some("Ev08MFMKH6")),
            ),
            Case::new(
                "rotation",
                signed(NOW, EVENT),
                &["old", SECRET],
                Expect::Accepted {
                    event_id: Some("Ev08MFMKH6".into()),
                    secret_index: 1,
                },
            ),
            Case::new(
                "slash command (form body)",
                signed(NOW, command),
                &[SECRET],
                accepted(None),
            ),
            Case::new(
                "tampered body",
                signed(NOW, EVENT).body(&EVENT[..EVENT.len() - 1]),
                &[SECRET],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "wrong secret",
                signed(NOW, EVENT),
                &["other"],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "timestamp header changed",
                signed(NOW, EVENT).set("X-Slack-Request-Timestamp", (NOW + 1).to_string()),
                &[SECRET],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "old timestamp",
                signed(NOW - 301, EVENT),
                &[SECRET],
                Expect::Refused(Refusal::TimestampOutOfTolerance),
            ),
            Case::new(
                "old but within 300 s",
                signed(NOW - 300, EVENT),
                &[SECRET],
                accepted(Some("Ev08MFMKH6")),
            ),
            Case::new(
                "missing signature",
                signed(NOW, EVENT).without("X-Slack-Signature"),
                &[SECRET],
                Expect::Refused(Refusal::MissingHeader),
            ),
            Case::new(
                "missing timestamp",
                signed(NOW, EVENT).without("X-Slack-Request-Timestamp"),
                &[SECRET],
                Expect::Refused(Refusal::MissingHeader),
            ),
            Case::new(
                "timestamp not a number",
                signed(NOW, EVENT).set("X-Slack-Request-Timestamp", "soon"),
                &[SECRET],
                Expect::Refused(Refusal::MalformedHeader),
            ),
            Case::new(
                "wrong version",
                signed(NOW, EVENT).set(
                    "X-Slack-Signature",
                    sign(SECRET, NOW, EVENT).replacen("v0=", "v1=", 1),
                ),
                &[SECRET],
                Expect::Refused(Refusal::MalformedHeader),
            ),
            Case::new(
                "signed broken JSON",
                signed(NOW, b"{\"type\":"),
                &[SECRET],
                Expect::Refused(Refusal::BodyNotParsable),
            ),
            Case::new(
                "url_verification without challenge",
                signed(NOW, br#"{"type":"url_verification"}"#),
                &[SECRET],
                Expect::Refused(Refusal::BodyNotParsable),
            ),
        ];
        run(&Slack, cases);

        let verified = Slack
            .verify(
                &signed(NOW, challenge).as_incoming(),
                &[Secret::new(SECRET)],
                crate::providers::table::at(NOW),
            )
            .unwrap();
        assert_eq!(
            verified.challenge.as_deref(),
            Some("3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P")
        );
        assert_eq!(verified.event_id, None);
        let unsigned =
            signed(NOW, challenge).set("X-Slack-Signature", sign("other", NOW, challenge));
        assert_eq!(
            Slack.verify(
                &unsigned.as_incoming(),
                &[Secret::new(SECRET)],
                crate::providers::table::at(NOW)
            ),
            Err(Refusal::BadSignature)
        );
    }
}
