//! Migrations: plain SQL files in `migrations/`, applied in order, each in its own
//! transaction, and recorded with their SHA-256 in `railhook_migrations`.
//!
//! A migration that was applied and then edited is refused: the fix is a new migration.
//! Concurrent `migrate` runs serialise on an advisory lock, so parallel test binaries and
//! rolling deploys are safe.

use sha2::{Digest, Sha256};
use tokio_postgres::Client;

use crate::StoreError;

include!(concat!(env!("OUT_DIR"), "/migrations.rs"));

/// Advisory lock key held while migrating ("railhook" in ASCII, truncated).
const MIGRATION_LOCK: i64 = 0x7261_696c_686f_6f6b;

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
}

pub struct Migrator {
    migrations: Vec<Migration>,
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
        Migrator { migrations }
    }

    /// A custom list (tests use it to simulate an edited file).
    pub fn new(migrations: Vec<Migration>) -> Migrator {
        Migrator { migrations }
    }

    pub fn migrations(&self) -> &[Migration] {
        &self.migrations
    }

    /// SHA-256 over all migrations, used to tell whether a template database is current.
    pub fn fingerprint(&self) -> String {
        let mut hasher = Sha256::new();
        for m in &self.migrations {
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
        let applied: Vec<(i32, String, String)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();

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
        Ok(report)
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
