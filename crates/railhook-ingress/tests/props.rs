//! Property tests: whatever arrives at an ingress URL (headers with any names and values, any
//! URL, method and body) and whatever secrets a Source holds, no verifier panics, and none
//! accepts a request it was not given a signature for. Plus round trips through the public
//! API: what a provider's documented scheme signs, the verifier accepts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use proptest::collection::vec;
use proptest::prelude::*;
use railhook_ingress::{
    verifier, Headers, IncomingRequest, Provider, ProviderConfig, Refusal, Secret,
};
use sha2::Sha256;

/// Every provider, the generic one with a timestamp header so that both branches are reached.
fn configs() -> Vec<ProviderConfig> {
    Provider::ALL
        .into_iter()
        .map(|p| {
            let config = (p == Provider::GenericHmac).then(|| {
                serde_json::json!({"header": "X-Signature", "algorithm": "sha256", "encoding": "base64",
                    "prefix": "v1=", "timestamp_header": "X-Timestamp", "event_id_header": "X-Event-Id"})
            });
            ProviderConfig::from_parts(p, config.as_ref()).expect("valid config")
        })
        .collect()
}

/// The header names the verifiers read, so that random values reach their parsers.
const NAMES: &[&str] = &[
    "Stripe-Signature",
    "X-Hub-Signature-256",
    "X-GitHub-Delivery",
    "X-Gitlab-Token",
    "Idempotency-Key",
    "X-Gitlab-Event-UUID",
    "X-Shopify-Hmac-Sha256",
    "X-Shopify-Webhook-Id",
    "X-Slack-Signature",
    "X-Slack-Request-Timestamp",
    "X-Twilio-Signature",
    "X-Twilio-Webhooks-Signature-Settings",
    "I-Twilio-Idempotency-Token",
    "X-Square-HmacSha256-Signature",
    "X-HubSpot-Signature-v3",
    "X-HubSpot-Request-Timestamp",
    "X-Twilio-Email-Event-Webhook-Signature",
    "X-Twilio-Email-Event-Webhook-Timestamp",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "svix-id",
    "svix-timestamp",
    "svix-signature",
    "X-Signature",
    "X-Timestamp",
    "X-Event-Id",
    "Content-Type",
];

/// Values built from the pieces the parsers branch on, or arbitrary bytes.
fn value() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just("t=".to_string()),
        Just("v1=".to_string()),
        Just("v0=".to_string()),
        Just("v1,".to_string()),
        Just("sha256=".to_string()),
        Just(",".to_string()),
        Just(" ".to_string()),
        Just("=".to_string()),
        Just("1700000000".to_string()),
        Just("1700000000000".to_string()),
        Just("algorithm=HMAC_SHA256".to_string()),
        Just("MEUCIQ".to_string()),
        Just("%".to_string()),
        vec(any::<u8>(), 0..64).prop_map(hex::encode),
        vec(any::<u8>(), 0..72).prop_map(|b| STANDARD.encode(b)),
        "[ -~]{0,20}",
    ];
    prop_oneof![
        vec(piece, 0..8).prop_map(|p| p.concat().into_bytes()),
        vec(any::<u8>(), 0..100)
    ]
}

fn headers() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
    let name = prop_oneof![4 => proptest::sample::select(NAMES).prop_map(str::to_string), 1 => "[A-Za-z-]{1,20}"];
    vec((name, value()), 0..12)
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        vec(any::<u8>(), 0..300),
        Just(
            br#"{"id":"evt_1","event_id":"Ev1","type":"url_verification","challenge":"c"}"#
                .to_vec()
        ),
        Just(br#"[{"sg_event_id":"a"},{"sg_event_id":"b"}]"#.to_vec()),
        Just(b"a=1&b=%2&c=%zz&&=".to_vec()),
        "[ -~]{0,100}".prop_map(String::into_bytes),
    ]
}

fn url() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("https://hooks.example.com/ingress/tok".to_string()),
        Just("https://hooks.example.com:443/ingress/tok?bodySHA256=00&x=%3A".to_string()),
        Just("http://[::1]/i?a".to_string()),
        "[ -~]{0,60}",
        "https://[a-z.:@\\[\\]0-9]{0,20}/[ -~]{0,30}",
    ]
}

/// Secrets of every shape a Source may hold, never equal to a header value above by
/// construction (they contain a character the value strategies cannot produce in that place).
fn secrets() -> impl Strategy<Value = Vec<Secret>> {
    let secret = prop_oneof![
        "[a-z]{8,20}~".prop_map(Secret::new),
        vec(any::<u8>(), 24..=64).prop_map(|k| Secret::new(format!("whsec_{}", STANDARD.encode(k)))),
        Just(Secret::new("MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA==")),
        Just(Secret::new("")),
    ];
    vec(secret, 0..3)
}

fn now() -> impl Strategy<Value = SystemTime> {
    prop_oneof![
        Just(UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
        (0u64..=u64::from(u32::MAX) * 4).prop_map(|s| UNIX_EPOCH + Duration::from_secs(s)),
        (0u64..1_000_000).prop_map(|s| UNIX_EPOCH - Duration::from_secs(s)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_500))]

    /// No verifier panics on anything, and none accepts: there is no valid signature here.
    #[test]
    fn arbitrary_requests_never_panic_nor_verify(
        headers in headers(),
        method in prop_oneof![Just("POST".to_string()), "[ -~]{0,8}"],
        url in url(),
        body in body(),
        secrets in secrets(),
        now in now(),
    ) {
        let request = IncomingRequest {
            method: &method,
            url: &url,
            headers: headers.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect::<Headers>(),
            body: &body,
        };
        for config in configs() {
            let verifier = verifier(&config);
            prop_assert_eq!(verifier.provider(), config.provider());
            let outcome = verifier.verify(&request, &secrets, now);
            prop_assert!(outcome.is_err(), "{} accepted {:?}", config.provider(), outcome);
        }
    }

    /// Secrets of any text never panic validation, and validation never echoes them.
    #[test]
    fn secret_validation_never_panics(text in prop_oneof![any::<String>(), "[a-z]{1,8}".prop_map(|s| format!("whsec_{s}"))]) {
        for config in configs() {
            if let Err(e) = config.validate_secret(&text) {
                prop_assert_eq!(e.field.as_str(), "secret");
                prop_assert!(text.len() < 4 || !e.message.contains(&text));
            }
        }
    }

    /// GitHub's scheme, signed from its documentation, verifies for any body and secret, with
    /// the right secret among several; one flipped body byte is a bad signature.
    #[test]
    fn github_round_trip(body in vec(any::<u8>(), 0..500), secret in "[ -~]{1,40}", others in vec("[a-z]{1,10}", 0..3), flip in any::<proptest::sample::Index>()) {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(&body);
        let signature = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
        let mut secrets: Vec<Secret> = others.iter().filter(|o| **o != secret).map(|o| Secret::new(o.as_str())).collect();
        secrets.push(Secret::new(secret.as_str()));
        let v = verifier(&ProviderConfig::Github);
        let check = |body: &[u8]| {
            let request = IncomingRequest {
                method: "POST",
                url: "https://hooks.example.com/ingress/tok",
                headers: [("X-Hub-Signature-256", signature.as_bytes()), ("X-GitHub-Delivery", &b"d-1"[..])].into_iter().collect(),
                body,
            };
            v.verify(&request, &secrets, SystemTime::now())
        };
        let verified = check(&body).unwrap();
        prop_assert_eq!(verified.event_id.as_deref(), Some("d-1"));
        prop_assert_eq!(verified.secret_index, secrets.len() - 1);
        if !body.is_empty() {
            let mut tampered = body.clone();
            tampered[flip.index(body.len())] ^= 0x01;
            prop_assert_eq!(check(&tampered), Err(Refusal::BadSignature));
        }
    }

    /// Stripe's scheme verifies for any JSON id and any time within the tolerance, and is
    /// refused as stale just outside it.
    #[test]
    fn stripe_round_trip(id in "evt_[A-Za-z0-9]{1,40}", skew in -300i64..=300, outside in 301i64..100_000) {
        let now = 1_700_000_000i64;
        let body = format!(r#"{{"id":"{id}","object":"event"}}"#);
        let header = |t: i64| {
            let mut mac = Hmac::<Sha256>::new_from_slice(b"whsec_x").unwrap();
            mac.update(format!("{t}.{body}").as_bytes());
            format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
        };
        let v = verifier(&ProviderConfig::Stripe);
        let at = |t: i64| {
            let h = header(t);
            let request = IncomingRequest {
                method: "POST",
                url: "https://hooks.example.com/ingress/tok",
                headers: [("Stripe-Signature", h.as_bytes())].into_iter().collect(),
                body: body.as_bytes(),
            };
            v.verify(&request, &[Secret::new("whsec_x")], UNIX_EPOCH + Duration::from_secs(now as u64))
        };
        prop_assert_eq!(at(now + skew).map(|v| v.event_id), Ok(Some(id.clone())));
        prop_assert_eq!(at(now - outside), Err(Refusal::TimestampOutOfTolerance));
        prop_assert_eq!(at(now + outside), Err(Refusal::TimestampOutOfTolerance));
    }
}
