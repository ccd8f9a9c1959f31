//! One verifier per provider, each following that provider's own documentation; the module
//! of each names the page it follows, the signed content, and the event id it yields.
//!
//! | provider | signature header | signed content | time signed | event id |
//! |---|---|---|---|---|
//! | stripe | `Stripe-Signature` (`t=`, `v1=`...) | `{t}.{body}` | `t`, 300 s | body `id` (`evt_...`) |
//! | github | `X-Hub-Signature-256` | body | no | `X-GitHub-Delivery` |
//! | gitlab | `X-Gitlab-Token` (the secret itself) | nothing | no | `Idempotency-Key`, else `X-Gitlab-Event-UUID` |
//! | shopify | `X-Shopify-Hmac-Sha256` | body | no | `X-Shopify-Webhook-Id` |
//! | slack | `X-Slack-Signature` | `v0:{ts}:{body}` | `X-Slack-Request-Timestamp`, 300 s | body `event_id`; `url_verification` challenge |
//! | twilio | `X-Twilio-Signature` | URL + sorted form params, or URL with `bodySHA256` | no | `I-Twilio-Idempotency-Token` |
//! | square | `X-Square-HmacSha256-Signature` | URL + body | no | body `event_id` |
//! | hubspot | `X-HubSpot-Signature-v3` | method + URI + body + ts | `X-HubSpot-Request-Timestamp` (ms), 300 s | none (HubSpot's `eventId` is not unique) |
//! | sendgrid | `X-Twilio-Email-Event-Webhook-Signature` (ECDSA P-256) | ts + body | `...-Timestamp`, 300 s | `sg_event_id` (one event) or a digest of all of them |
//! | standard_webhooks | `webhook-signature` | `{id}.{ts}.{body}` | `webhook-timestamp`, 300 s | `webhook-id` |
//! | generic_hmac | configured | body, or `{ts}.{body}` | configured header, 300 s | configured header |

pub mod generic_hmac;
pub mod github;
pub mod gitlab;
pub mod hubspot;
pub mod sendgrid;
pub mod shopify;
pub mod slack;
pub mod square;
pub mod standard_webhooks;
pub mod stripe;
pub mod twilio;

use crate::Refusal;

/// Checks that `url` is an absolute http(s) URL, for the providers that sign it. The URL is
/// then signed as given, byte for byte: parsing would normalise it (default ports, escapes).
pub(crate) fn absolute_http_url(url: &str) -> Result<(), Refusal> {
    match url::Url::parse(url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") && parsed.has_host() => Ok(()),
        _ => Err(Refusal::MalformedUrl),
    }
}

/// Table-driven tests: every provider's test builds signed requests from the provider's
/// documented algorithm and runs a table of variations through its verifier.
#[cfg(test)]
pub(crate) mod table {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use crate::{Headers, IncomingRequest, Refusal, Secret, Verifier};

    /// A fixed "now" for the tables: 2023-11-14T22:13:20Z.
    pub const NOW: i64 = 1_700_000_000;

    pub fn at(unix_seconds: i64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(unix_seconds.unsigned_abs())
    }

    /// An owned request the tables mutate.
    #[derive(Debug, Clone)]
    pub struct Request {
        pub method: String,
        pub url: String,
        pub headers: Vec<(String, Vec<u8>)>,
        pub body: Vec<u8>,
    }

    impl Request {
        pub fn post(url: &str, body: &[u8]) -> Request {
            Request {
                method: "POST".into(),
                url: url.into(),
                headers: Vec::new(),
                body: body.to_vec(),
            }
        }

        pub fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> Request {
            self.headers.push((name.into(), value.as_ref().to_vec()));
            self
        }

        /// Replaces every value of `name` (case-insensitively) with `value`.
        pub fn set(self, name: &str, value: impl AsRef<[u8]>) -> Request {
            self.without(name).header(name, value)
        }

        pub fn without(mut self, name: &str) -> Request {
            self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
            self
        }

        pub fn body(mut self, body: impl AsRef<[u8]>) -> Request {
            self.body = body.as_ref().to_vec();
            self
        }

        pub fn url(mut self, url: &str) -> Request {
            self.url = url.into();
            self
        }

        pub fn as_incoming(&self) -> IncomingRequest<'_> {
            IncomingRequest {
                method: &self.method,
                url: &self.url,
                headers: self
                    .headers
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_slice()))
                    .collect::<Headers>(),
                body: &self.body,
            }
        }
    }

    /// The outcome a case expects.
    #[derive(Debug, Clone, PartialEq)]
    pub enum Expect {
        /// Accepted with this event id and the secret at this index.
        Accepted {
            event_id: Option<String>,
            secret_index: usize,
        },
        Refused(Refusal),
    }

    pub fn accepted(event_id: Option<&str>) -> Expect {
        Expect::Accepted {
            event_id: event_id.map(str::to_string),
            secret_index: 0,
        }
    }

    pub struct Case {
        pub name: &'static str,
        pub request: Request,
        pub secrets: Vec<Secret>,
        pub now: i64,
        pub expect: Expect,
    }

    impl Case {
        pub fn new(name: &'static str, request: Request, secrets: &[&str], expect: Expect) -> Case {
            Case {
                name,
                request,
                secrets: secrets.iter().map(|s| Secret::new(*s)).collect(),
                now: NOW,
                expect,
            }
        }

        pub fn now(mut self, now: i64) -> Case {
            self.now = now;
            self
        }
    }

    /// Runs every case and reports all failures at once.
    pub fn run(verifier: &dyn Verifier, cases: Vec<Case>) {
        let mut failures = Vec::new();
        for case in &cases {
            let got =
                match verifier.verify(&case.request.as_incoming(), &case.secrets, at(case.now)) {
                    Ok(v) => Expect::Accepted {
                        event_id: v.event_id,
                        secret_index: v.secret_index,
                    },
                    Err(r) => Expect::Refused(r),
                };
            if got != case.expect {
                failures.push(format!(
                    "{}: expected {:?}, got {:?}",
                    case.name, case.expect, got
                ));
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {} cases failed:\n{}",
            failures.len(),
            cases.len(),
            failures.join("\n")
        );
    }
}
