//! The layers, later ones win: defaults, `railhook.toml` (or `--config`), `RAILHOOK_*`
//! environment variables, command-line flags ([`Overrides`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use figment::providers::{Format, Serialized, Toml};
use figment::Figment;

use crate::{Config, ConfigError};

/// Environment variables that are shorter than their `SECTION__KEY` spelling, because
/// operators expect them: `(variable, dotted key)`.
pub const ENV_ALIASES: &[(&str, &str)] = &[
    ("RAILHOOK_ADMIN_TOKEN", "api.admin_token"),
    ("RAILHOOK_DATABASE_URL", "database.url"),
    ("RAILHOOK_KAFKA_BROKERS", "kafka.brokers"),
    ("RAILHOOK_TRANSPORT", "transport"),
];

/// Values from command-line flags: the last layer. Keys are dotted paths
/// (`api.listen`), values are TOML literals or bare strings.
#[derive(Debug, Default, Clone)]
pub struct Overrides(pub Vec<(String, String)>);

impl Overrides {
    pub fn set(&mut self, key: &str, value: impl Into<String>) {
        self.0.push((key.to_string(), value.into()));
    }
}

/// Where to look for the file layer.
#[derive(Debug, Clone)]
pub enum FileSource {
    /// `railhook.toml` in the working directory, if it exists.
    Default,
    /// A file the user named: it must exist.
    Explicit(PathBuf),
}

impl Config {
    /// Loads all four layers from the process environment and validates the result.
    pub fn load(file: FileSource, overrides: &Overrides) -> Result<Config, ConfigError> {
        let env: Vec<(String, String)> = std::env::vars().collect();
        Self::load_from(file, &env, overrides)
    }

    /// As [`Config::load`], with the environment given explicitly (for tests).
    pub fn load_from(
        file: FileSource,
        env: &[(String, String)],
        overrides: &Overrides,
    ) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        match file {
            FileSource::Default => {
                let path = Path::new("railhook.toml");
                if path.exists() {
                    figment = figment.merge(Toml::file(path));
                }
            }
            FileSource::Explicit(path) => {
                if !path.exists() {
                    return Err(ConfigError::File {
                        path,
                        message: "no such file; pass an existing path to --config".into(),
                    });
                }
                figment = figment.merge(Toml::file(path));
            }
        }

        // RAILHOOK_SECTION__KEY, read from the given environment rather than the process's.
        let env_map: BTreeMap<String, String> = env.iter().cloned().collect();
        let mut nested = toml::Table::new();
        for (name, value) in &env_map {
            let Some(rest) = name.strip_prefix("RAILHOOK_") else { continue };
            if let Some((_, key)) = ENV_ALIASES.iter().find(|(alias, _)| alias == name) {
                insert_dotted(&mut nested, key, value);
            } else if rest.contains("__") {
                let key = rest.to_ascii_lowercase().replace("__", ".");
                insert_dotted(&mut nested, &key, value);
            }
        }
        figment = figment.merge(Serialized::defaults(nested));

        let mut flags = toml::Table::new();
        for (key, value) in &overrides.0 {
            insert_dotted(&mut flags, key, value);
        }
        figment = figment.merge(Serialized::defaults(flags));

        let config: Config = figment.extract().map_err(|e| ConfigError::Parse(describe_figment_error(e)))?;
        config.validate()?;
        Ok(config)
    }
}

fn insert_dotted(table: &mut toml::Table, key: &str, raw: &str) {
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().unwrap_or_default();
    let mut current = table;
    for part in parts {
        let entry = current
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        let toml::Value::Table(next) = entry else { return };
        current = next;
    }
    current.insert(last.to_string(), parse_scalar(raw));
}

/// Environment and flag values are strings; numbers, booleans and arrays are read as TOML
/// when they parse as such, so `RAILHOOK_KAFKA__PARTITIONS=12` is an integer.
fn parse_scalar(raw: &str) -> toml::Value {
    let probe = format!("v = {raw}");
    match probe.parse::<toml::Table>() {
        Ok(mut t) => match t.remove("v") {
            Some(v @ (toml::Value::Integer(_) | toml::Value::Boolean(_) | toml::Value::Array(_) | toml::Value::Float(_))) => v,
            _ => toml::Value::String(raw.to_string()),
        },
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

fn describe_figment_error(e: figment::Error) -> String {
    e.into_iter()
        .map(|err| {
            // The key and what is wrong with its value; not where figment's layers came
            // from (its `Display` names a source file of this crate).
            let path = err.path.join(".");
            if path.is_empty() {
                err.kind.to_string()
            } else {
                format!("{path}: {}", err.kind)
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// The transport: `auto` by default, resolved from `kafka.brokers`; a value that is not
    /// one of the three names the key; RAILHOOK_TRANSPORT sets it.
    #[test]
    fn the_transport_follows_the_brokers_unless_set() {
        let load = |pairs: &[(&str, &str)]| Config::load_from(FileSource::Explicit("/dev/null".into()), &env(pairs), &Overrides::default());
        let c = load(&[]).unwrap();
        assert_eq!((c.transport, c.transport()), (crate::Transport::Auto, crate::TransportKind::Inline), "no brokers: inline");
        let c = load(&[("RAILHOOK_KAFKA_BROKERS", "127.0.0.1:19092")]).unwrap();
        assert_eq!(c.transport(), crate::TransportKind::Kafka, "brokers set: kafka");
        let c = load(&[("RAILHOOK_KAFKA_BROKERS", "127.0.0.1:19092"), ("RAILHOOK_TRANSPORT", "inline")]).unwrap();
        assert_eq!(c.transport(), crate::TransportKind::Inline, "set explicitly, inline wins over the brokers");
        let e = load(&[("RAILHOOK_TRANSPORT", "kafak")]).unwrap_err().to_string();
        assert!(e.contains("transport: unknown variant") && e.contains("kafak") && e.contains("inline") && !e.contains(".rs"), "{e}");
        let e = load(&[("RAILHOOK_TRANSPORT", "kafka")]).unwrap_err().to_string();
        assert!(e.contains("transport is kafka but kafka.brokers is empty"), "{e}");
    }

    #[test]
    fn layers_apply_in_order() {
        let dir = std::env::temp_dir().join(format!("railhook-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("railhook.toml");
        std::fs::write(&file, "[kafka]\npartitions = 3\nbrokers = \"file:1\"\n[api]\nlisten = \"127.0.0.1:7000\"\n").unwrap();
        let mut flags = Overrides::default();
        flags.set("api.listen", "127.0.0.1:7001");
        let config = Config::load_from(
            FileSource::Explicit(file),
            &env(&[("RAILHOOK_KAFKA__PARTITIONS", "12"), ("RAILHOOK_ADMIN_TOKEN", "0123456789abcdef0123")]),
            &flags,
        )
        .unwrap();
        assert_eq!(config.kafka.partitions, 12, "env beats file");
        assert_eq!(config.kafka.brokers, "file:1", "file beats defaults");
        assert_eq!(config.api.listen.port(), 7001, "flags beat file");
        assert_eq!(config.api.admin_token, "0123456789abcdef0123", "alias applies");
        assert_eq!(config.relay.slot_name, "railhook_outbox", "defaults remain");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = Config::load_from(FileSource::Default, &env(&[("RAILHOOK_API__LISTN", "x")]), &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("listn"), "{err}");
    }
}
