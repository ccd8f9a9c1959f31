//! Startup checks and setup: the server must do logical replication, the publication must be
//! insert-only on the outbox, the slot must use pgoutput. Missing pieces are created when
//! `relay.create_slot` allows it, the publication before the slot.

use railhook_config::RelayConfig;
use railhook_core::Lsn;
use railhook_store::locks::RELAY_SLOT_SETUP_SEED;
use railhook_store::server::server_facts;
use tokio_postgres::Client;

use crate::RelayError;

#[derive(Debug, Clone)]
pub struct SlotState {
    pub confirmed_flush: Lsn,
    /// The slot was created (or recreated) by this call: what was committed before it is
    /// not in its stream, so the caller re-announces what is still PENDING.
    pub created: bool,
    /// The slot was lost or had vanished after this process streamed from it.
    pub recovered: bool,
    /// How it was lost, when `recovered` (the relay says so once the re-announcement is done).
    pub loss: Option<SlotLoss>,
    /// The backend of the walsender streaming from the slot, when one is.
    pub active_pid: Option<i32>,
}

/// How a slot this process streamed from was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotLoss {
    /// Invalidated by Postgres (`wal_status` lost): it fell further behind than
    /// `max_slot_wal_keep_size` and a checkpoint removed WAL it still needed. The setting's
    /// value when the loss was found (it may have been raised since the invalidation).
    Invalidated { max_slot_wal_keep_size: String },
    /// It no longer existed: someone dropped it.
    Dropped,
}

/// What [`prepare`] may do about the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotPolicy {
    /// Create the slot when it is missing (`relay.create_slot`).
    pub create_missing: bool,
    /// This process streamed from the slot before, so a missing slot was dropped.
    pub known: bool,
    /// Drop and recreate a lost slot, recreate a dropped one (`relay.recreate_lost_slot`).
    pub recreate_lost: bool,
}

impl SlotPolicy {
    pub fn from_config(config: &RelayConfig, known: bool) -> SlotPolicy {
        SlotPolicy { create_missing: config.create_slot, known, recreate_lost: config.recreate_lost_slot }
    }
}

async fn create_slot(client: &Client, slot: &str) -> Result<String, RelayError> {
    let row = client.query_one("SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')", &[&slot]).await?;
    Ok(row.try_get(0)?)
}

/// How long a relay's setup waits for another relay's setup of the same slot.
const SETUP_LOCK_TIMEOUT: &str = "15s";
/// How long the setup's session may sit idle before Postgres ends it (`idle_session_timeout`),
/// which releases the lock: a relay that vanished while holding it (its host gone, a network
/// that drops everything) cannot keep the other relays from setting up for longer.
pub const SETUP_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Checks (and, as the policy allows, creates or recreates) the publication and the slot.
///
/// Relays sharing a slot run this one at a time, under a session advisory lock on the slot's
/// name (`locks::RELAY_SLOT_SETUP_SEED`): the relay that finds a slot lost (or dropped) drops
/// and recreates it and says so, and a relay started beside it finds the recreated slot, not
/// a missing one it would take for a first start (which would re-announce but never report
/// the loss). Waiting for the lock is bounded by `lock_timeout` (an error the supervisor
/// retries); the setup itself is not (creating a slot waits for the write transactions in
/// progress). The lock is released at the end, or with the session, which the caller closes
/// (or Postgres, after [`SETUP_IDLE_TIMEOUT`] idle).
///
/// When this call created the slot (`created`), the lock stays held: the caller owes the
/// re-announcement, which its own stream makes once live, and closes the session then. A
/// relay set up meanwhile thus finds the slot streamed and waits as a standby, instead of
/// winning START_REPLICATION and leaving the re-announcement with a standby.
pub async fn prepare(client: &Client, config: &RelayConfig, policy: SlotPolicy) -> Result<SlotState, RelayError> {
    client
        .batch_execute(&format!("SET lock_timeout = '{SETUP_LOCK_TIMEOUT}'; SET idle_session_timeout = '{}ms'", SETUP_IDLE_TIMEOUT.as_millis()))
        .await?;
    client.execute("SELECT pg_advisory_lock(hashtextextended($1, $2))", &[&config.slot_name, &RELAY_SLOT_SETUP_SEED]).await?;
    client.batch_execute("RESET lock_timeout").await?;
    let result = prepare_locked(client, config, policy).await;
    if matches!(&result, Ok(state) if state.created) {
        // Kept until the caller closes the session: see the doc above.
        return result;
    }
    // A failed unlock must not hide what the setup did: the lock then goes with the session,
    // which the caller closes.
    if let Err(e) = client.execute("SELECT pg_advisory_unlock(hashtextextended($1, $2))", &[&config.slot_name, &RELAY_SLOT_SETUP_SEED]).await {
        tracing::warn!(error = %e, slot = %config.slot_name, "could not release the slot setup lock; it goes with the session");
    }
    result
}

async fn prepare_locked(client: &Client, config: &RelayConfig, policy: SlotPolicy) -> Result<SlotState, RelayError> {
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
            let (ins, upd, del, trunc): (bool, bool, bool, bool) = (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?, row.try_get(3)?);
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
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?;
    if !tables.iter().any(|t| t.ends_with(".outbox")) {
        return Err(RelayError::Misconfigured(format!(
            "publication {0} does not include the outbox table (it has {tables:?}): ALTER PUBLICATION {0} ADD TABLE outbox",
            config.publication_name
        )));
    }

    let slot = client
        .query_opt(
            "SELECT plugin, confirmed_flush_lsn::text, wal_status, database = current_database(), active_pid FROM pg_replication_slots WHERE slot_name = $1",
            &[&config.slot_name],
        )
        .await?;
    let name = &config.slot_name;
    // A recovery is said once, in operator's words, when its re-announcement is done
    // (`stream::Reannounce`), not here.
    let (confirmed, created, loss, active_pid) = match slot {
        None if policy.known && policy.recreate_lost => (create_slot(client, name).await?, true, Some(SlotLoss::Dropped), None),
        None if policy.known => return Err(RelayError::SlotLost(name.clone())),
        None if policy.create_missing => {
            let lsn = create_slot(client, name).await?;
            tracing::info!(slot = %name, "created replication slot");
            (lsn, true, None, None)
        }
        None => {
            return Err(RelayError::Misconfigured(format!(
                "replication slot {name} does not exist: SELECT pg_create_logical_replication_slot('{name}', 'pgoutput'), or set relay.create_slot = true"
            )))
        }
        Some(row) => {
            let plugin: String = row.try_get(0)?;
            if plugin != "pgoutput" {
                return Err(RelayError::Misconfigured(format!(
                    "slot {name} uses plugin {plugin}, not pgoutput: drop it (railhook slot drop --confirm) and let the relay recreate it"
                )));
            }
            if !row.try_get::<_, bool>(3)? {
                return Err(RelayError::Misconfigured(format!("slot {name} belongs to another database")));
            }
            let active_pid: Option<i32> = row.try_get(4)?;
            if row.try_get::<_, Option<String>>(2)?.as_deref() == Some("lost") {
                if !policy.recreate_lost {
                    return Err(RelayError::SlotLost(name.clone()));
                }
                if active_pid.is_some() {
                    // Another relay still holds the invalidated slot; it will notice and stop.
                    return Err(RelayError::SlotState(format!("{name} is lost but still active for PID {active_pid:?}")));
                }
                let keep: String = client.query_one("SELECT current_setting('max_slot_wal_keep_size')", &[]).await?.try_get(0)?;
                client.execute("SELECT pg_drop_replication_slot($1)", &[name]).await?;
                (create_slot(client, name).await?, true, Some(SlotLoss::Invalidated { max_slot_wal_keep_size: keep }), None)
            } else {
                (row.try_get::<_, Option<String>>(1)?.unwrap_or_else(|| "0/0".into()), false, None, active_pid)
            }
        }
    };
    let confirmed_flush = confirmed.parse().map_err(|e| RelayError::Misconfigured(format!("slot LSN: {e}")))?;
    Ok(SlotState { confirmed_flush, created, recovered: loss.is_some(), loss, active_pid })
}
