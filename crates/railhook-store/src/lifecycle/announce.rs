//! How announcements are written (issue 30): the SQL function every announcing statement
//! calls, `railhook_announce` (`announce.sql`, a repeatable migration), and the switch the
//! running relay sets, `railhook_announce_via` (migration 0030): outbox rows, which every
//! relay reads, or one transactional logical decoding message per statement, which only the
//! CDC relay reads (`railhook_kafka::announcement::Announcement::parse_message`).
//!
//! Who sets it: the CDC relay sets [`Via::Message`] once its stream is live; the polling relay
//! sets [`Via::Outbox`] when it starts and, when the switch said `message` before, re-announces
//! the PENDING work ([`super::reannounce_pending`]): what was announced by message while no
//! CDC relay read the slot would otherwise wait for the stranded sweep.

use tokio_postgres::GenericClient;

/// How `railhook_announce` writes an announcement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// One outbox row per announcement.
    Outbox,
    /// One logical decoding message per statement (CDC mode).
    Message,
}

impl Via {
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Outbox => "outbox",
            Via::Message => "message",
        }
    }

    fn parse(s: &str) -> Option<Via> {
        match s {
            "outbox" => Some(Via::Outbox),
            "message" => Some(Via::Message),
            _ => None,
        }
    }
}

/// Sets the switch; returns what it was when that changed it, `None` when it already said so.
pub async fn set_via(db: &impl GenericClient, via: Via) -> Result<Option<Via>, tokio_postgres::Error> {
    let row = db
        .query_opt(
            "UPDATE railhook_announce_via v SET via = $1, changed_at = now()
             FROM (SELECT via AS before FROM railhook_announce_via FOR UPDATE) o
             WHERE v.via <> $1 RETURNING o.before",
            &[&via.as_str()],
        )
        .await?;
    Ok(row.and_then(|r| r.try_get::<_, String>(0).ok()).and_then(|s| Via::parse(&s)))
}

/// What the switch says now.
pub async fn via(db: &impl GenericClient) -> Result<Via, tokio_postgres::Error> {
    let row = db.query_one("SELECT via FROM railhook_announce_via", &[]).await?;
    let text: String = row.try_get(0)?;
    Ok(Via::parse(&text).unwrap_or(Via::Outbox))
}
