//! Which provider a Source verifies, with that provider's configuration, and the validation
//! the Sources API turns into 422s.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::providers::{sendgrid, standard_webhooks};

/// The providers Railhook verifies. Serialised snake_case (`stripe`, `github`, ...,
/// `standard_webhooks`, `generic_hmac`), as in the API and the metrics labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    Stripe,
    Github,
    Gitlab,
    Shopify,
    Slack,
    Twilio,
    Square,
    Hubspot,
    Sendgrid,
    StandardWebhooks,
    GenericHmac,
}

impl Provider {
    pub const ALL: [Provider; 11] = [
        Provider::Stripe,
        Provider::Github,
        Provider::Gitlab,
        Provider::Shopify,
        Provider::Slack,
        Provider::Twilio,
        Provider::Square,
        Provider::Hubspot,
        Provider::Sendgrid,
        Provider::StandardWebhooks,
        Provider::GenericHmac,
    ];

    /// The snake_case name (API value and metrics label).
    pub const fn as_str(self) -> &'static str {
        match self {
            Provider::Stripe => "stripe",
            Provider::Github => "github",
            Provider::Gitlab => "gitlab",
            Provider::Shopify => "shopify",
            Provider::Slack => "slack",
            Provider::Twilio => "twilio",
            Provider::Square => "square",
            Provider::Hubspot => "hubspot",
            Provider::Sendgrid => "sendgrid",
            Provider::StandardWebhooks => "standard_webhooks",
            Provider::GenericHmac => "generic_hmac",
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Provider {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Provider, ConfigError> {
        Provider::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = Provider::ALL.iter().map(|p| p.as_str()).collect();
                ConfigError::new(
                    "provider",
                    format!("unknown provider; expected one of {}", known.join(", ")),
                )
            })
    }
}

/// A Source's provider with its configuration. Only `generic_hmac` has any; the secret is not
/// part of it (secrets rotate and are passed to each verification).
///
/// Serialised adjacently tagged: `{"provider": "stripe"}`,
/// `{"provider": "generic_hmac", "config": {"header": "X-Signature", "algorithm": "sha256",
/// "encoding": "hex", "prefix": "sha256="}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "provider", content = "config", rename_all = "snake_case")]
pub enum ProviderConfig {
    Stripe,
    Github,
    Gitlab,
    Shopify,
    Slack,
    Twilio,
    Square,
    Hubspot,
    Sendgrid,
    StandardWebhooks,
    GenericHmac(GenericHmacConfig),
}

/// A generic HMAC scheme, for providers without a verifier of their own.
///
/// The signed content is the raw body; with `timestamp_header`, it is
/// `"{timestamp}.{body}"` (unix seconds, as sent) and the timestamp must be within the
/// tolerance. The header holds `prefix` (if any) followed by the encoded tag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenericHmacConfig {
    /// The header carrying the signature, e.g. `X-Signature`.
    pub header: String,
    pub algorithm: HmacAlgorithm,
    pub encoding: SignatureEncoding,
    /// Text before the encoded tag, e.g. `sha256=`; matched exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// A header carrying the signed unix time in seconds, e.g. `X-Timestamp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp_header: Option<String>,
    /// A header carrying the sender's event id, used for dedupe (unsigned unless the sender
    /// puts it in the body too: it dedupes resends, it does not stop a deliberate replay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id_header: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HmacAlgorithm {
    Sha1,
    Sha256,
    Sha512,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SignatureEncoding {
    Hex,
    Base64,
}

/// A provider configuration or secret the API must refuse (422), naming the offending field:
/// `provider`, `config`, `config.<name>` or `secret`. The message never contains the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl ConfigError {
    pub(crate) fn new(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Longest secret accepted (PEM public keys are ~180 bytes; HMAC secrets far less).
const MAX_SECRET_LEN: usize = 4096;
/// Longest header name or prefix accepted in a generic configuration.
const MAX_NAME_LEN: usize = 128;

impl ProviderConfig {
    pub fn provider(&self) -> Provider {
        match self {
            ProviderConfig::Stripe => Provider::Stripe,
            ProviderConfig::Github => Provider::Github,
            ProviderConfig::Gitlab => Provider::Gitlab,
            ProviderConfig::Shopify => Provider::Shopify,
            ProviderConfig::Slack => Provider::Slack,
            ProviderConfig::Twilio => Provider::Twilio,
            ProviderConfig::Square => Provider::Square,
            ProviderConfig::Hubspot => Provider::Hubspot,
            ProviderConfig::Sendgrid => Provider::Sendgrid,
            ProviderConfig::StandardWebhooks => Provider::StandardWebhooks,
            ProviderConfig::GenericHmac(_) => Provider::GenericHmac,
        }
    }

    /// Builds and validates the configuration from an API request's `provider` and optional
    /// `config` object. Providers other than `generic_hmac` take no config (absent, `null` or
    /// `{}`); `generic_hmac` requires one, and unknown fields are refused.
    pub fn from_parts(
        provider: Provider,
        config: Option<&serde_json::Value>,
    ) -> Result<ProviderConfig, ConfigError> {
        let config = config.filter(|c| !c.is_null());
        let built = match provider {
            Provider::GenericHmac => {
                let value = config.ok_or_else(|| {
                    ConfigError::new(
                        "config",
                        "generic_hmac needs a config with header, algorithm and encoding",
                    )
                })?;
                let parsed: GenericHmacConfig =
                    serde_path_to_error::deserialize(value).map_err(|e| {
                        let path = e.path().to_string();
                        let field = if path == "." {
                            "config".to_string()
                        } else {
                            format!("config.{path}")
                        };
                        ConfigError::new(field, e.into_inner().to_string())
                    })?;
                ProviderConfig::GenericHmac(parsed)
            }
            other => {
                if config.is_some_and(|c| c.as_object().is_none_or(|o| !o.is_empty())) {
                    return Err(ConfigError::new(
                        "config",
                        format!("{other} takes no config"),
                    ));
                }
                Self::without_config(other)
                    .ok_or_else(|| ConfigError::new("config", format!("{other} needs a config")))?
            }
        };
        built.validate()?;
        Ok(built)
    }

    /// The configuration of a provider that has none to give (`None` for `generic_hmac`).
    fn without_config(provider: Provider) -> Option<ProviderConfig> {
        Some(match provider {
            Provider::Stripe => ProviderConfig::Stripe,
            Provider::Github => ProviderConfig::Github,
            Provider::Gitlab => ProviderConfig::Gitlab,
            Provider::Shopify => ProviderConfig::Shopify,
            Provider::Slack => ProviderConfig::Slack,
            Provider::Twilio => ProviderConfig::Twilio,
            Provider::Square => ProviderConfig::Square,
            Provider::Hubspot => ProviderConfig::Hubspot,
            Provider::Sendgrid => ProviderConfig::Sendgrid,
            Provider::StandardWebhooks => ProviderConfig::StandardWebhooks,
            Provider::GenericHmac => return None,
        })
    }

    /// Checks the configuration itself (only `generic_hmac` has anything to check): header
    /// names are HTTP tokens and distinct, the prefix is visible ASCII.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let ProviderConfig::GenericHmac(config) = self else {
            return Ok(());
        };
        check_header_name("config.header", &config.header)?;
        for (field, name) in [
            ("config.timestamp_header", &config.timestamp_header),
            ("config.event_id_header", &config.event_id_header),
        ] {
            if let Some(name) = name {
                check_header_name(field, name)?;
                if name.eq_ignore_ascii_case(&config.header) {
                    return Err(ConfigError::new(field, "must differ from config.header"));
                }
            }
        }
        if let (Some(ts), Some(id)) = (&config.timestamp_header, &config.event_id_header) {
            if ts.eq_ignore_ascii_case(id) {
                return Err(ConfigError::new(
                    "config.event_id_header",
                    "must differ from config.timestamp_header",
                ));
            }
        }
        if let Some(prefix) = &config.prefix {
            if prefix.is_empty()
                || prefix.len() > MAX_NAME_LEN
                || !prefix.bytes().all(|b| b.is_ascii_graphic())
            {
                return Err(ConfigError::new(
                    "config.prefix",
                    format!(
                        "must be 1 to {MAX_NAME_LEN} visible ASCII characters (omit it for none)"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks a secret before it is stored, so that a Source never holds one its verifier
    /// cannot use: non-empty, at most 4096 bytes; for HMAC providers no surrounding whitespace
    /// (a pasted newline would make every signature fail); for `standard_webhooks` a
    /// `whsec_`-prefixed (or bare) base64 key of 24 to 64 bytes; for `sendgrid` a P-256 public
    /// key, base64 DER or PEM.
    pub fn validate_secret(&self, secret: &str) -> Result<(), ConfigError> {
        if secret.trim().is_empty() {
            return Err(ConfigError::new("secret", "must not be empty"));
        }
        if secret.len() > MAX_SECRET_LEN {
            return Err(ConfigError::new(
                "secret",
                format!("must be at most {MAX_SECRET_LEN} bytes"),
            ));
        }
        match self {
            ProviderConfig::Sendgrid => {
                sendgrid::parse_public_key(secret).map(drop).ok_or_else(|| {
                    ConfigError::new(
                        "secret",
                        "must be the P-256 verification key from SendGrid, base64 DER or PEM",
                    )
                })
            }
            _ if secret.trim() != secret => Err(ConfigError::new(
                "secret",
                "has leading or trailing whitespace; paste the secret alone",
            )),
            ProviderConfig::StandardWebhooks => standard_webhooks::parse_secret(secret)
                .map(drop)
                .map_err(|e| ConfigError::new("secret", e.to_string())),
            _ => Ok(()),
        }
    }
}

/// An HTTP header name (RFC 9110 token), at most 128 characters.
fn check_header_name(field: &str, name: &str) -> Result<(), ConfigError> {
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || name.len() > MAX_NAME_LEN || !name.bytes().all(tchar) {
        return Err(ConfigError::new(
            field,
            format!(
                "must be an HTTP header name (letters, digits, '-', ...; at most {MAX_NAME_LEN})"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_round_trip() {
        for p in Provider::ALL {
            assert_eq!(serde_json::to_value(p).unwrap(), json!(p.as_str()));
            assert_eq!(p.as_str().parse::<Provider>().unwrap(), p);
            let config = if p == Provider::GenericHmac {
                Some(json!({"header": "X-Sig", "algorithm": "sha256", "encoding": "hex"}))
            } else {
                None
            };
            let built = ProviderConfig::from_parts(p, config.as_ref()).unwrap();
            assert_eq!(built.provider(), p);
            let back: ProviderConfig =
                serde_json::from_value(serde_json::to_value(&built).unwrap()).unwrap();
            assert_eq!(back, built);
        }
        assert_eq!("Stripe".parse::<Provider>().unwrap_err().field, "provider");
        assert_eq!(
            serde_json::to_value(ProviderConfig::Stripe).unwrap(),
            json!({"provider": "stripe"})
        );
    }

    #[test]
    fn config_errors_name_the_field() {
        let err = |p: Provider, c: serde_json::Value| {
            ProviderConfig::from_parts(p, Some(&c)).unwrap_err().field
        };
        let g = Provider::GenericHmac;
        assert_eq!(
            ProviderConfig::from_parts(g, None).unwrap_err().field,
            "config"
        );
        assert_eq!(
            err(
                g,
                json!({"header": "X-Sig", "algorithm": "md5", "encoding": "hex"})
            ),
            "config.algorithm"
        );
        assert_eq!(
            err(
                g,
                json!({"header": "X-Sig", "algorithm": "sha1", "encoding": "base32"})
            ),
            "config.encoding"
        );
        assert_eq!(
            err(g, json!({"algorithm": "sha1", "encoding": "hex"})),
            "config"
        );
        assert_eq!(
            err(
                g,
                json!({"header": "X Sig", "algorithm": "sha1", "encoding": "hex"})
            ),
            "config.header"
        );
        assert_eq!(
            err(
                g,
                json!({"header": "X-Sig", "algorithm": "sha1", "encoding": "hex", "prefix": ""})
            ),
            "config.prefix"
        );
        assert_eq!(
            err(
                g,
                json!({"header": "X-Sig", "algorithm": "sha1", "encoding": "hex", "timestamp_header": "x-sig"})
            ),
            "config.timestamp_header"
        );
        assert_eq!(
            err(
                g,
                json!({"header": "X-Sig", "algorithm": "sha1", "encoding": "hex", "extra": 1})
            ),
            "config.extra"
        );
        assert_eq!(err(Provider::Stripe, json!({"header": "x"})), "config");
        assert!(ProviderConfig::from_parts(Provider::Stripe, Some(&json!({}))).is_ok());
        assert!(ProviderConfig::from_parts(Provider::Stripe, Some(&json!(null))).is_ok());
    }

    #[test]
    fn secrets_are_checked_per_provider() {
        let ok = |c: &ProviderConfig, s: &str| c.validate_secret(s);
        assert!(ok(&ProviderConfig::Github, "s3cret").is_ok());
        for bad in ["", "  ", "s3cret\n", " s3cret"] {
            let e = ok(&ProviderConfig::Github, bad).unwrap_err();
            assert_eq!(e.field, "secret");
            assert!(
                bad.trim().is_empty() || !e.message.contains("s3cret"),
                "{e}"
            );
        }
        assert!(ok(&ProviderConfig::Github, &"x".repeat(5000)).is_err());
        assert!(ok(
            &ProviderConfig::StandardWebhooks,
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
        )
        .is_ok());
        assert!(ok(
            &ProviderConfig::StandardWebhooks,
            "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
        )
        .is_ok());
        assert!(ok(&ProviderConfig::StandardWebhooks, "whsec_short").is_err());
        let key = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA==";
        assert!(ok(&ProviderConfig::Sendgrid, key).is_ok());
        let pem = format!("-----BEGIN PUBLIC KEY-----\n{key}\n-----END PUBLIC KEY-----\n");
        assert!(ok(&ProviderConfig::Sendgrid, &pem).is_ok());
        assert!(ok(&ProviderConfig::Sendgrid, "not a key").is_err());
    }
}
