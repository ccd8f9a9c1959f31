//! GitLab, following "Webhooks" (<https://docs.gitlab.com/user/project/integrations/webhooks/>):
//! the secret token configured on the webhook is sent as is in `X-Gitlab-Token`. Nothing is
//! signed: the token authenticates the sender, it does not protect the body (TLS does).
//!
//! The token is compared in constant time, lengths included: both sides are hashed with
//! SHA-256 first and the digests compared, so not even the token's length leaks.
//!
//! Event id, from GitLab's delivery headers: `Idempotency-Key` ("unique ID that remains
//! consistent across webhook retries", GitLab 17.4+), else `X-Gitlab-Event-UUID` (older
//! GitLab; shared by "recursive" webhooks, those triggered by an earlier webhook's receiver
//! calling back into GitLab, so two such webhooks to one Source would dedupe as one).

use std::time::SystemTime;

use sha2::{Digest, Sha256};

use crate::{event_id, mac, IncomingRequest, Provider, Refusal, Secret, Verified, Verifier};

pub const TOKEN_HEADER: &str = "X-Gitlab-Token";
pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";
pub const EVENT_UUID_HEADER: &str = "X-Gitlab-Event-UUID";

/// GitLab's verifier: constant-time token comparison; no time signed; dedupes on
/// `Idempotency-Key`, else `X-Gitlab-Event-UUID`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gitlab;

impl Verifier for Gitlab {
    fn provider(&self) -> Provider {
        Provider::Gitlab
    }

    fn verify(
        &self,
        req: &IncomingRequest<'_>,
        secrets: &[Secret],
        _now: SystemTime,
    ) -> Result<Verified, Refusal> {
        let token = req.headers.required(TOKEN_HEADER)?;
        let presented = Sha256::digest(token.as_bytes()).to_vec();
        let secret_index = mac::matching_secret(secrets, &[presented], |secret| {
            Sha256::digest(secret.key()).to_vec()
        })?;
        let event_id = match event_id::from_header(&req.headers, IDEMPOTENCY_HEADER)? {
            Some(id) => Some(id),
            None => event_id::from_header(&req.headers, EVENT_UUID_HEADER)?,
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
    use crate::providers::table::{accepted, run, Case, Expect, Request};

    const TOKEN: &str = "glpat-webhook-token-1";
    const KEY: &str = "f5e5f430-f57b-4e6e-9fac-d9128cd7232f";
    const UUID: &str = "13792a34-cac6-4fda-95a8-c58e00a3954e";

    fn request() -> Request {
        Request::post(
            "https://hooks.example.com/ingress/tok",
            br#"{"object_kind":"push"}"#,
        )
        .header("X-Gitlab-Token", TOKEN)
        .header("X-Gitlab-Event", "Push Hook")
        .header("Idempotency-Key", KEY)
        .header("X-Gitlab-Event-UUID", UUID)
    }

    #[test]
    fn table() {
        let cases = vec![
            Case::new(
                "valid: Idempotency-Key first",
                request(),
                &[TOKEN],
                accepted(Some(KEY)),
            ),
            Case::new(
                "older GitLab: X-Gitlab-Event-UUID",
                request().without("Idempotency-Key"),
                &[TOKEN],
                accepted(Some(UUID)),
            ),
            Case::new(
                "no id headers",
                request()
                    .without("Idempotency-Key")
                    .without("X-Gitlab-Event-UUID"),
                &[TOKEN],
                accepted(None),
            ),
            Case::new(
                "rotation",
                request(),
                &["old", TOKEN],
                Expect::Accepted {
                    event_id: Some(KEY.into()),
                    secret_index: 1,
                },
            ),
            // The body is not signed by GitLab: a changed body with the right token is accepted.
            Case::new(
                "body is not covered",
                request().body("{}"),
                &[TOKEN],
                accepted(Some(KEY)),
            ),
            Case::new(
                "wrong secret",
                request(),
                &["glpat-other"],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "token prefix only",
                request().set("X-Gitlab-Token", &TOKEN[..5]),
                &[TOKEN],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "token with suffix",
                request().set("X-Gitlab-Token", format!("{TOKEN}x")),
                &[TOKEN],
                Expect::Refused(Refusal::BadSignature),
            ),
            Case::new(
                "missing header",
                request().without("X-Gitlab-Token"),
                &[TOKEN],
                Expect::Refused(Refusal::MissingHeader),
            ),
            Case::new(
                "empty header",
                request().set("X-Gitlab-Token", ""),
                &[TOKEN],
                Expect::Refused(Refusal::MissingHeader),
            ),
            Case::new(
                "no secret",
                request(),
                &[],
                Expect::Refused(Refusal::NoSecret),
            ),
        ];
        run(&Gitlab, cases);
    }
}
