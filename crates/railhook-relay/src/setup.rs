//! Startup checks and setup: the server must do logical replication, the publication must be
//! insert-only on the outbox, the slot must use pgoutput. Missing pieces are created when
//! `relay.create_slot` allows it, the publication before the slot.

use railhook_config::RelayConfig;
use railhook_core::Lsn;
use railhook_store::server::server_facts;
use tokio_postgres::Client;

use crate::RelayError;

#[derive(Debug, Clone)]
pub struct SlotState {
    pub confirmed_flush: Lsn,
    pub created: bool,
}

pub async fn prepare(client: &Client, config: &RelayConfig) -> Result<SlotState, RelayError> {
    let facts = server_facts(client).await?;
    facts.check_logical_replication().map_err(|e| RelayError::Misconfigured(e.to_string()))?;

    let publication = client
        .query_opt("SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = $1", &[&config.publication_name])
        .await?;
    match publication {
        None if config.create_slot => {
            client
                .batch_execute(&format!("CREATE PUBLICATION {} FOR TABLE outbox WITH (publish = 'insert')", config.publication_name))
                .await?;
            tracing::info!(publication = %config.publication_name, "created publication");
        }
        None => {
            return Err(RelayError::Misconfigured(format!(
                "publication {0} does not exist: run CREATE PUBLICATION {0} FOR TABLE outbox WITH (publish = 'insert'), or set relay.create_slot = true",
                config.publication_name
            )))
        }
        Some(row) => {
            let (ins, upd, del, trunc): (bool, bool, bool, bool) = (row.get(0), row.get(1), row.get(2), row.get(3));
            if !ins || upd || del || trunc {
                return Err(RelayError::Misconfigured(format!(
                    "publication {0} must publish inserts only: ALTER PUBLICATION {0} SET (publish = 'insert')",
                    config.publication_name
                )));
            }
        }
    }
    let tables: Vec<String> = client
        .query("SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1", &[&config.publication_name])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if !tables.iter().any(|t| t.ends_with(".outbox")) {
        return Err(RelayError::Misconfigured(format!(
            "publication {0} does not include the outbox table (it has {tables:?}): ALTER PUBLICATION {0} ADD TABLE outbox",
            config.publication_name
        )));
    }

    let slot = client
        .query_opt(
            "SELECT plugin, confirmed_flush_lsn::text, wal_status, database = current_database() FROM pg_replication_slots WHERE slot_name = $1",
            &[&config.slot_name],
        )
        .await?;
    let (confirmed, created) = match slot {
        None if config.create_slot => {
            let row = client
                .query_one("SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')", &[&config.slot_name])
                .await?;
            tracing::info!(slot = %config.slot_name, "created replication slot");
            (row.get::<_, String>(0), true)
        }
        None => {
            return Err(RelayError::Misconfigured(format!(
                "replication slot {0} does not exist: SELECT pg_create_logical_replication_slot('{0}', 'pgoutput'), or set relay.create_slot = true",
                config.slot_name
            )))
        }
        Some(row) => {
            let plugin: String = row.get(0);
            if plugin != "pgoutput" {
                return Err(RelayError::Misconfigured(format!(
                    "slot {} uses plugin {plugin}, not pgoutput: drop it (railhook slot drop) and let the relay recreate it",
                    config.slot_name
                )));
            }
            if !row.get::<_, bool>(3) {
                return Err(RelayError::Misconfigured(format!("slot {} belongs to another database", config.slot_name)));
            }
            if row.get::<_, Option<String>>(2).as_deref() == Some("lost") {
                return Err(RelayError::SlotLost(config.slot_name.clone()));
            }
            (row.get::<_, Option<String>>(1).unwrap_or_else(|| "0/0".into()), false)
        }
    };
    let confirmed_flush = confirmed.parse().map_err(|e| RelayError::Misconfigured(format!("slot LSN: {e}")))?;
    Ok(SlotState { confirmed_flush, created })
}
