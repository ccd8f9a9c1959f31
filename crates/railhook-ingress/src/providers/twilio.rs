//! Twilio, following "Webhooks security" (<https://www.twilio.com/docs/usage/webhooks/webhooks-security>)
//! and the request validators of Twilio's helper libraries.
//!
//! `X-Twilio-Signature: <base64 HMAC-SHA1(auth token, content)>`, where content is:
//! - form-encoded requests (and GET): the full URL as configured in Twilio, followed by every
//!   POST parameter as `name` + `value`, sorted by name then value (byte order), no separators;
//! - JSON requests: Twilio adds `bodySHA256=<hex SHA-256 of the raw body>` to the URL's query;
//!   the content is the URL alone, and the body must hash to that value.
//!
//! As Twilio's libraries do, the URL is tried as given and with its default port toggled
//! (`https://host/...` and `https://host:443/...`), since Twilio may sign either form.
//! When a Webhooks Rule applies, Twilio sends `X-Twilio-Webhooks-Signature-Settings:
//! key=...,algorithm=HMAC_SHA256` and signs with HMAC-SHA256 and that rule's shared key
//! (configure the shared key as the Source's secret). No time is signed.
//!
//! Event id: `I-Twilio-Idempotency-Token`, kept across Twilio's retries. Not signed.

use std::time::SystemTime;

use sha2::{Digest, Sha256};

use crate::providers::absolute_http_url;
use crate::{
    event_id, mac, HmacAlgorithm, IncomingRequest, Provider, Refusal, Secret, Verified, Verifier,
};

pub const SIGNATURE_HEADER: &str = "X-Twilio-Signature";
pub const SIGNATURE_SETTINGS_HEADER: &str = "X-Twilio-Webhooks-Signature-Settings";
pub const IDEMPOTENCY_HEADER: &str = "I-Twilio-Idempotency-Token";
/// The query parameter carrying the body's hash on JSON requests.
pub const BODY_HASH_PARAM: &str = "bodySHA256";

/// Twilio's verifier: constant-time comparison of the HMAC-SHA1 (or rule-selected SHA-256)
/// over URL and sorted parameters; no time signed; dedupes on `I-Twilio-Idempotency-Token`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Twilio;

impl Verifier for Twilio {
    fn provider(&self) -> Provider {
        Provider::Twilio
    }

    fn verify(
        &self,
        req: &IncomingRequest<'_>,
        secrets: &[Secret],
        _now: SystemTime,
    ) -> Result<Verified, Refusal> {
        let tag = mac::decode(req.headers.required(SIGNATURE_HEADER)?, mac::decode_base64)?;
        let algorithm = algorithm(req.headers.single(SIGNATURE_SETTINGS_HEADER)?)?;
        absolute_http_url(req.url)?;
        let body_hash = query_param(req.url, BODY_HASH_PARAM);
        let params = if body_hash.is_some() {
            Vec::new()
        } else {
            sorted_params(req.body)
        };

        let mut urls = vec![req.url.to_string()];
        urls.extend(with_default_port_toggled(req.url));
        let mut secret_index = Err(Refusal::BadSignature);
        for url in &urls {
            let tags =
                |secret: &Secret| mac::hmac(algorithm, secret.key(), &[url.as_bytes(), &params]);
            match mac::matching_secret(secrets, std::slice::from_ref(&tag), tags) {
                Err(Refusal::BadSignature) => continue,
                found => {
                    secret_index = found;
                    break;
                }
            }
        }
        let secret_index = secret_index?;
        if let Some(expected) = body_hash {
            // The hash is not a secret; an ordinary comparison is fine.
            if !hex::encode(Sha256::digest(req.body)).eq_ignore_ascii_case(&expected) {
                return Err(Refusal::BadSignature);
            }
        }
        let event_id = event_id::from_header(&req.headers, IDEMPOTENCY_HEADER)?;
        Ok(Verified {
            event_id,
            challenge: None,
            secret_index,
        })
    }
}

/// The algorithm named by `X-Twilio-Webhooks-Signature-Settings` (HMAC-SHA1 without it).
fn algorithm(settings: Option<&str>) -> Result<HmacAlgorithm, Refusal> {
    let named = settings.and_then(|s| {
        s.split(',')
            .find_map(|item| item.trim().strip_prefix("algorithm="))
    });
    match named.map(str::trim) {
        None | Some("HMAC_SHA1") => Ok(HmacAlgorithm::Sha1),
        Some("HMAC_SHA256") => Ok(HmacAlgorithm::Sha256),
        Some(_) => Err(Refusal::MalformedHeader),
    }
}

/// The first value of query parameter `name` in `url` (decoded).
fn query_param(url: &str, name: &str) -> Option<String> {
    let query = url.split_once('?')?.1;
    let query = query.split_once('#').map_or(query, |(q, _)| q);
    url::form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// The form body's parameters, decoded, sorted by name then value, concatenated
/// `name value name value ...` without separators.
fn sorted_params(body: &[u8]) -> Vec<u8> {
    let mut pairs: Vec<(String, String)> = url::form_urlencoded::parse(body).into_owned().collect();
    pairs.sort();
    let mut out = Vec::with_capacity(body.len());
    for (name, value) in pairs {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// `url` with its scheme's default port added (if it has no port) or removed (if it has the
/// default one); `None` if it has another port or no recognisable authority.
fn with_default_port_toggled(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let default = match scheme.to_ascii_lowercase().as_str() {
        "https" => "443",
        "http" => "80",
        _ => return None,
    };
    let (authority, tail) = rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()));
    let host_start = authority.rfind('@').map_or(0, |at| at + 1);
    let (userinfo, host_port) = authority.split_at(host_start);
    match host_port.rfind(':') {
        // A ':' inside an IPv6 literal is not a port separator.
        Some(colon) if !host_port[colon..].contains(']') => (&host_port[colon + 1..] == default)
            .then(|| format!("{scheme}://{userinfo}{}{tail}", &host_port[..colon])),
        _ if host_port.is_empty() => None,
        _ => Some(format!("{scheme}://{authority}:{default}{tail}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::table::{accepted, run, Case, Expect, Request};
    use base64::Engine;

    const TOKEN: &str = "12345";
    const URL: &str = "https://mycompany.com/myapp.php?foo=1&bar=2";
    const FORM: &[u8] = b"CallSid=CA1234567890ABCDE&Caller=%2B14158675309&Digits=1234&From=%2B14158675309&To=%2B18005551212";
    /// Twilio's documented example: this token, URL and form give this signature.
    const DOCUMENTED: &str = "RSOYDt4T1cUTdK1PDd93/VVr8B8=";
    const IDEMPOTENCY: &str = "d47e5f5d-4f7b-4d3a-8c0f-6a0c1c1c1c1c";

    fn sign(algorithm: HmacAlgorithm, token: &str, content: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(mac::hmac(
            algorithm,
            token.as_bytes(),
            &[content.as_bytes()],
        ))
    }

    fn form_request() -> Request {
        Request::post(URL, FORM)
            .header("Content-Type", "application/x-www-form-urlencoded")
            .header("X-Twilio-Signature", DOCUMENTED)
            .header("I-Twilio-Idempotency-Token", IDEMPOTENCY)
    }

    #[test]
    fn documented_example_by_hand() {
        let content = "https://mycompany.com/myapp.php?foo=1&bar=2CallSidCA1234567890ABCDECaller+14158675309Digits1234From+14158675309To+18005551212";
        assert_eq!(sign(HmacAlgorithm::Sha1, TOKEN, content), DOCUMENTED);
    }

    #[test]
    fn ports() {
        assert_eq!(
            with_default_port_toggled("https://a.com/x").as_deref(),
            Some("https://a.com:443/x")
        );
        assert_eq!(
            with_default_port_toggled("https://a.com:443/x?y").as_deref(),
            Some("https://a.com/x?y")
        );
        assert_eq!(
            with_default_port_toggled("http://a.com?q").as_deref(),
            Some("http://a.com:80?q")
        );
        assert_eq!(with_default_port_toggled("https://a.com:8443/x"), None);
        assert_eq!(
            with_default_port_toggled("https://u:p@[::1]/x").as_deref(),
            Some("https://u:p@[::1]:443/x")
        );
        assert_eq!(
            with_default_port_toggled("https://[::1]:443").as_deref(),
            Some("https://[::1]")
        );
        assert_eq!(with_default_port_toggled("ftp://a.com/x"), None);
        assert_eq!(with_default_port_toggled("https:///x"), None);
    }

    #[test]
    fn table() {
        let json = br#"{"property": "value", "boolean": true}"#;
        let json_url = format!(
            "https://mycompany.com/myapp.php?foo=1&bar=2&bodySHA256={}",
            hex::encode(Sha256::digest(json))
        );
        let json_request = Request::post(&json_url, json)
            .header("Content-Type", "application/json")
            .header(
                "X-Twilio-Signature",
                sign(HmacAlgorithm::Sha1, TOKEN, &json_url),
            );
        let shuffled = b"To=%2B18005551212&Digits=1234&From=%2B14158675309&Caller=%2B14158675309&CallSid=CA1234567890ABCDE";
        let with_port = "https://mycompany.com:443/myapp.php?foo=1&bar=2";
        let sha256_content = format!("{URL}CallSidCA1234567890ABCDECaller+14158675309Digits1234From+14158675309To+18005551212");
        let cases = vec![
            Case::new(
                "documented form example",
                form_request(),
                &[TOKEN],
                accepted(Some(IDEMPOTENCY)),
            ),
            Case::new(
                "parameter order does not matter",
                form_request().body(shuffled),
                &[TOKEN],
                accepted(Some(IDEMPOTENCY)),
            ),
            Case::new(
                "called with the default port written out",
                form_request().url(with_port),
                &[TOKEN],
                accepted(Some(IDEMPOTENCY)),
            ),
            Case::new(
                "rotation",
                form_request(),
                &["00000", TOKEN],
                Expect::Accepted {
                    event_id: Some(IDEMPOTENCY.into()),
                    secret_index: 1,
                },
            ),
            Case::new(
                "JSON body with bodySHA256",
                json_request.clone(),
                &[TOKEN],
                accepted(None),
            ),
            Case::new(
                "webhooks rule: HMAC-SHA256",
                form_request()
                    .set(
                        "X-Twilio-Signature",
                        sign(HmacAlgorithm::Sha256, TOKEN, &sha256_content),
                    )
                    .header(
                        "X-Twilio-Webhooks-Signature-Settings",
                        "key=KS123,algorithm=HMAC_SHA256",
                    ),
                &[TOKEN],
                accepted(Some(IDEMPOTENCY)),
            ),
            Case::new(
                "unknown algorithm",
                form_request().header("X-Twilio-Webhooks-Signature-Settings", "algorithm=MD5"),
                &[TOKEN],
                Expect::Refused(Refusal::MalformedHeader),
            ),
            Case::new(
                "tampered form body",
                form_request().body(
                    FORM.iter()
                        .map(|&b| if b == b'4' { b'5' } else { b })
                        .collect::<Vec<u8>>(),
                ),
                &[TOKEN],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "extra form parameter",
                form_request().body([FORM, b"&Extra=1"].concat()),
                &[TOKEN],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "tampered JSON body",
                json_request
                    .clone()
                    .body(r#"{"property": "other", "boolean": true}"#),
                &[TOKEN],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "other URL",
                form_request().url("https://mycompany.com/myapp.php?foo=1&bar=3"),
                &[TOKEN],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "other port",
                form_request().url("https://mycompany.com:8443/myapp.php?foo=1&bar=2"),
                &[TOKEN],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "wrong secret",
                form_request(),
                &["54321"],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "missing header",
                form_request().without("X-Twilio-Signature"),
                &[TOKEN],
                Expect::Refused(Refusal::MissingHeader),
            ),
            Case::new(
                "not base64",
                form_request().set("X-Twilio-Signature", "!!"),
                &[TOKEN],
                Expect::Refused(Refusal::MalformedHeader),
            ),
            Case::new(
                "relative URL",
                form_request().url("/myapp.php?foo=1&bar=2"),
                &[TOKEN],
                Expect::Refused(Refusal::MalformedUrl),
            ),
            Case::new(
                "no secret",
                form_request(),
                &[],
                Expect::Refused(Refusal::NoSecret),
            ),
        ];
        run(&Twilio, cases);
    }
}
