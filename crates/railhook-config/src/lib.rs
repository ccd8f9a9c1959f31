//! Railhook's configuration: one [`Config`] tree, loaded in layers and validated before any
//! component starts.
//!
//! Layers, later ones win:
//! 1. the defaults ([`Config::default`], in `sections`);
//! 2. `railhook.toml` (or the file named by `--config` / `RAILHOOK_CONFIG`);
//! 3. `RAILHOOK_*` environment variables: `RAILHOOK_DATABASE__URL` sets `database.url`
//!    (a double underscore separates sections), plus the short aliases listed in
//!    [`ENV_ALIASES`] such as `RAILHOOK_ADMIN_TOKEN`;
//! 4. command-line flags, passed in as [`Overrides`].
//!
//! Validation collects every problem at once and says how to fix each one.
//!
//! Modules by responsibility: `sections` (the tree, its defaults and what each key is for),
//! `layers` (reading the four layers), `validate` (every problem with its fix) and `redact`
//! (showing the effective configuration without its secrets).

mod layers;
mod redact;
mod sections;
mod validate;

pub use layers::{FileSource, Overrides, ENV_ALIASES};
pub use redact::{redact_url, REDACTED};
pub use sections::*;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration file {path}: {message}")]
    File { path: std::path::PathBuf, message: String },
    #[error("invalid configuration: {0}")]
    Parse(String),
    #[error("invalid configuration:\n{}", .0.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<String>),
}

#[cfg(test)]
mod docs_tests {
    use super::*;

    /// docs/CONFIGURATION.md lists every key with its default.
    #[test]
    fn every_key_is_documented() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/CONFIGURATION.md")).unwrap();
        let value = toml::Value::try_from(Config::default()).unwrap();
        let mut missing = Vec::new();
        for (section, table) in value.as_table().unwrap() {
            let Some(table) = table.as_table() else {
                // A top-level key (`transport`).
                let row = format!("| `{section}` | `{}` |", table.as_str().unwrap_or_default());
                if !doc.lines().any(|l| l.starts_with(&row)) {
                    missing.push(format!("{section} (row {row})"));
                }
                continue;
            };
            for (key, v) in table {
                let row = format!("| `{section}.{key}` | ");
                let Some(line) = doc.lines().find(|l| l.starts_with(&row)) else {
                    missing.push(format!("{section}.{key}"));
                    continue;
                };
                let shown = match v {
                    toml::Value::String(s) => s.clone(),
                    toml::Value::Table(_) => "{}".into(),
                    other => other.to_string(),
                };
                let shown = if shown.is_empty() { "\"\"".to_string() } else { shown };
                assert!(line.contains(&format!("`{shown}`")), "default of {section}.{key} is {shown}: {line}");
            }
        }
        assert!(missing.is_empty(), "undocumented keys: {missing:?}");
    }
}

