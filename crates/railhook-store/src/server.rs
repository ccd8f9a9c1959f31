//! Facts about the Postgres server that Railhook depends on, checked at start.

use tokio_postgres::Client;

use crate::StoreError;

#[derive(Debug, Clone)]
pub struct ServerFacts {
    pub server_version_num: i32,
    pub wal_level: String,
    pub max_replication_slots: i32,
    pub max_wal_senders: i32,
    /// In MiB; -1 means unlimited.
    pub max_slot_wal_keep_size_mb: i64,
}

pub async fn server_facts(client: &Client) -> Result<ServerFacts, StoreError> {
    let row = client
        .query_one(
            "SELECT current_setting('server_version_num')::int,
                    current_setting('wal_level'),
                    current_setting('max_replication_slots')::int,
                    current_setting('max_wal_senders')::int,
                    (SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size')",
            &[],
        )
        .await?;
    Ok(ServerFacts {
        server_version_num: row.try_get(0)?,
        wal_level: row.try_get(1)?,
        max_replication_slots: row.try_get(2)?,
        max_wal_senders: row.try_get(3)?,
        max_slot_wal_keep_size_mb: row.try_get(4)?,
    })
}

impl ServerFacts {
    /// What logical replication needs, each problem with its fix.
    pub fn check_logical_replication(&self) -> Result<(), StoreError> {
        let mut problems = Vec::new();
        if self.server_version_num < 140000 {
            problems.push(format!("Postgres {} is too old: use 14 or newer", self.server_version_num));
        }
        if self.wal_level != "logical" {
            problems.push(format!(
                "wal_level is '{}', it must be 'logical': run ALTER SYSTEM SET wal_level = 'logical' and restart Postgres",
                self.wal_level
            ));
        }
        if self.max_replication_slots < 1 || self.max_wal_senders < 1 {
            problems.push("max_replication_slots and max_wal_senders must be at least 1 (set both in postgresql.conf and restart)".into());
        }
        if problems.is_empty() { Ok(()) } else { Err(StoreError::Misconfigured(problems.join("; "))) }
    }
}
