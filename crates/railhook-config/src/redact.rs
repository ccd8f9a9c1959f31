//! The effective configuration without its secrets (what `railhook config check` prints).

use crate::Config;

/// What is shown instead of a secret.
pub const REDACTED: &str = "<redacted>";

impl Config {
    /// The effective configuration as TOML, with every secret replaced by [`REDACTED`].
    pub fn redacted_toml(&self) -> String {
        let mut copy = self.clone();
        copy.database.url = redact_url(&copy.database.url);
        if !copy.api.admin_token.is_empty() {
            copy.api.admin_token = REDACTED.into();
        }
        for (key, value) in copy.kafka.properties.iter_mut().chain(copy.kafka_source.properties.iter_mut()) {
            if is_secret_property(key) {
                *value = REDACTED.into();
            }
        }
        toml::to_string_pretty(&copy).unwrap_or_else(|e| format!("# cannot render configuration: {e}\n"))
    }
}

fn is_secret_property(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key.contains("password") || key.contains("secret") || key.ends_with(".key.pem") || key.contains("sasl.oauthbearer.config")
}

/// Replaces the password of a URL (`postgres://user:pw@host/db`) with [`REDACTED`].
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let Some((userinfo, host)) = authority.rsplit_once('@') else { return url.to_string() };
    let redacted = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:{REDACTED}"),
        None => userinfo.to_string(),
    };
    let tail = redact_query_password(tail);
    format!("{scheme}://{redacted}@{host}{tail}")
}

fn redact_query_password(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else { return tail.to_string() };
    let query = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}={REDACTED}"),
            _ => kv.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&");
    format!("{path}?{query}")
}

#[cfg(test)]
mod tests {
    use crate::Config;

    #[test]
    fn secrets_are_redacted() {
        let mut config = Config::default();
        config.database.url = "postgres://rh:hunter2@db:5432/railhook?sslmode=require".into();
        config.api.admin_token = "supersecretadmintoken".into();
        config.kafka.properties.insert("sasl.password".into(), "kafkapw".into());
        config.kafka.properties.insert("linger.ms".into(), "5".into());
        let text = config.redacted_toml();
        for secret in ["hunter2", "supersecretadmintoken", "kafkapw"] {
            assert!(!text.contains(secret), "{secret} leaked in\n{text}");
        }
        assert!(text.contains("linger.ms"));
        assert!(text.contains("rh:<redacted>@db:5432"));
    }
}
