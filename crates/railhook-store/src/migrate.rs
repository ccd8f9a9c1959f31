//! Migrations: plain SQL files in `migrations/`, applied in order, each in its own
//! transaction, and recorded with their SHA-256 in `railhook_migrations`.
//!
//! A migration that was applied and then edited is refused: the fix is a new migration.
//! Concurrent `migrate` runs serialise on an advisory lock, so parallel test binaries and
//! rolling deploys are safe.
//!
//! Repeatable migrations (the Delivery lifecycle's rules, `lifecycle/rules.sql`) run after
//! the versioned ones, each again whenever its checksum differs from the one recorded in
//! `railhook_repeatables` (created by migration 0011): editing one is the way to change it.

use sha2::{Digest, Sha256};
use tokio_postgres::Client;

use crate::StoreError;

include!(concat!(env!("OUT_DIR"), "/migrations.rs"));

/// Advisory lock key held while migrating.
const MIGRATION_LOCK: i64 = crate::locks::MIGRATE.key;

#[derive(Debug, Clone)]
pub struct Migration {
    pub version: i32,
    pub name: String,
    pub sql: String,
}

impl Migration {
    pub fn checksum(&self) -> String {
        hex::encode(Sha256::digest(self.sql.as_bytes()))
    }
}

#[derive(Debug, Default)]
pub struct MigrationReport {
    pub applied: Vec<String>,
    pub already_applied: usize,
    /// Repeatable migrations applied because they were new or their text changed.
    pub repeatables_applied: Vec<String>,
}

pub struct Migrator {
    migrations: Vec<Migration>,
    /// Applied after `migrations`, again whenever their text changes (`version` unused).
    repeatables: Vec<Migration>,
}

impl Migrator {
    /// The migrations embedded in this build.
    pub fn embedded() -> Migrator {
        let migrations = MIGRATIONS
            .iter()
            .map(|(name, sql)| Migration {
                version: name.split('_').next().and_then(|v| v.parse().ok()).unwrap_or(0),
                name: name.to_string(),
                sql: sql.to_string(),
            })
            .collect();
        let repeatables = crate::lifecycle::REPEATABLES
            .iter()
            .map(|(name, sql)| Migration { version: 0, name: name.to_string(), sql: sql.to_string() })
            .collect();
        Migrator { migrations, repeatables }
    }

    /// A custom list (tests use it to simulate an edited file).
    pub fn new(migrations: Vec<Migration>) -> Migrator {
        Migrator { migrations, repeatables: Vec::new() }
    }

    /// The same list with these repeatable migrations (tests use it to simulate an edit).
    pub fn with_repeatables(mut self, repeatables: Vec<Migration>) -> Migrator {
        self.repeatables = repeatables;
        self
    }

    pub fn migrations(&self) -> &[Migration] {
        &self.migrations
    }

    /// SHA-256 over all migrations, used to tell whether a template database is current.
    pub fn fingerprint(&self) -> String {
        let mut hasher = Sha256::new();
        for m in self.migrations.iter().chain(&self.repeatables) {
            hasher.update(m.name.as_bytes());
            hasher.update(m.sql.as_bytes());
        }
        hex::encode(hasher.finalize())
    }

    pub async fn run(&self, client: &mut Client) -> Result<MigrationReport, StoreError> {
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS railhook_migrations (
                     version     integer PRIMARY KEY,
                     name        text NOT NULL,
                     checksum    text NOT NULL,
                     applied_at  timestamptz NOT NULL DEFAULT now()
                 )",
            )
            .await
            .or_else(|e| {
                // Two first-ever migrate runs can race on CREATE TABLE IF NOT EXISTS.
                if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) { Ok(()) } else { Err(e) }
            })?;
        client.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK]).await?;
        let result = self.run_locked(client).await;
        let unlock = client.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK]).await;
        let report = result?;
        unlock?;
        Ok(report)
    }

    async fn run_locked(&self, client: &mut Client) -> Result<MigrationReport, StoreError> {
        let rows = client.query("SELECT version, name, checksum FROM railhook_migrations ORDER BY version", &[]).await?;
        let applied: Vec<(i32, String, String)> = rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))).collect::<Result<_, tokio_postgres::Error>>()?;

        for (version, name, _) in &applied {
            if !self.migrations.iter().any(|m| m.version == *version) {
                return Err(StoreError::MigrationUnknown(format!("{name} (version {version})")));
            }
        }

        let mut report = MigrationReport::default();
        for migration in &self.migrations {
            let checksum = migration.checksum();
            if let Some((_, _, recorded)) = applied.iter().find(|(v, _, _)| *v == migration.version) {
                if *recorded != checksum {
                    return Err(StoreError::MigrationTampered {
                        name: migration.name.clone(),
                        applied: recorded.clone(),
                        found: checksum,
                    });
                }
                report.already_applied += 1;
                continue;
            }
            let tx = client.transaction().await?;
            tx.batch_execute(&migration.sql).await?;
            tx.execute(
                "INSERT INTO railhook_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                &[&migration.version, &migration.name, &checksum],
            )
            .await?;
            tx.commit().await?;
            tracing::info!(migration = %migration.name, "applied migration");
            report.applied.push(migration.name.clone());
        }
        self.apply_repeatables(client, &mut report).await?;
        Ok(report)
    }

    /// Each repeatable whose checksum differs from the recorded one (or that was never
    /// applied), in one transaction each.
    async fn apply_repeatables(&self, client: &mut Client, report: &mut MigrationReport) -> Result<(), StoreError> {
        if self.repeatables.is_empty() {
            return Ok(());
        }
        for repeatable in &self.repeatables {
            let checksum = repeatable.checksum();
            let recorded: Option<String> = client
                .query_opt("SELECT checksum FROM railhook_repeatables WHERE name = $1", &[&repeatable.name])
                .await?
                .map(|r| r.try_get(0))
                .transpose()?;
            if recorded.as_deref() == Some(checksum.as_str()) {
                continue;
            }
            let tx = client.transaction().await?;
            tx.batch_execute(&repeatable.sql).await?;
            tx.execute(
                "INSERT INTO railhook_repeatables (name, checksum) VALUES ($1, $2)
                 ON CONFLICT (name) DO UPDATE SET checksum = excluded.checksum, applied_at = now()",
                &[&repeatable.name, &checksum],
            )
            .await?;
            tx.commit().await?;
            tracing::info!(repeatable = %repeatable.name, "applied repeatable migration");
            report.repeatables_applied.push(repeatable.name.clone());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_migrations_are_ordered_and_numbered() {
        let m = Migrator::embedded();
        assert!(m.migrations().len() >= 5);
        let versions: Vec<i32> = m.migrations().iter().map(|m| m.version).collect();
        let mut sorted = versions.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(versions, sorted, "versions must be unique and increasing");
        assert!(versions.iter().all(|v| *v > 0));
    }
}
