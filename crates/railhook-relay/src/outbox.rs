//! From decoded pgoutput inserts to outbox rows: the Relation cache (by OID, columns mapped
//! by name) and the typed row the relay announces.

use std::collections::HashMap;

use railhook_core::{AnnouncementReason, ClaimToken, DeliveryId, DestinationId, EndpointId, ForwardId, ProjectId};
use uuid::Uuid;

use crate::pgoutput::{Relation, TupleValue};

/// Columns the relay cannot work without. A Relation that lacks one is an error: the
/// table changed in a way this build does not understand.
pub const REQUIRED_COLUMNS: [&str; 5] = ["id", "project_id", "routing_id", "reason", "created_at"];

impl OutboxRow {
    /// The announcement of this row (`railhook_kafka::announcement`, the relay-worker
    /// contract). An unknown `reason` is an error, like an unknown column type: the table was
    /// written by a build this relay does not understand.
    pub fn announcement(&self) -> Result<railhook_kafka::Announcement, RowError> {
        let target = match (self.delivery_id, self.forward_id) {
            (Some(delivery), _) => railhook_kafka::Target::Delivery { delivery, endpoint: EndpointId(self.routing_id) },
            (None, Some(forward)) => railhook_kafka::Target::Forward { forward, destination: DestinationId(self.routing_id) },
            (None, None) => return Err(RowError::NoTarget(self.id)),
        };
        // A traceparent that does not parse is ignored (W3C), never an error of the row.
        let trace = railhook_core::TraceContext::from_text(self.traceparent.as_deref(), self.tracestate.as_deref());
        Ok(railhook_kafka::Announcement { outbox_id: self.id, target, reason: self.reason, claim_token: self.claim_token, created_at: self.created_at.clone(), trace })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    pub id: i64,
    pub project_id: ProjectId,
    pub delivery_id: Option<DeliveryId>,
    pub forward_id: Option<ForwardId>,
    /// The Kafka key: the Endpoint's id for a Delivery, the Destination's for a Forward
    /// (typed in [`OutboxRow::announcement`], once it is known which).
    pub routing_id: Uuid,
    pub reason: AnnouncementReason,
    pub claim_token: Option<ClaimToken>,
    /// As Postgres printed it (`2026-12-02 12:51:29.118468+00`).
    pub created_at: String,
    /// The work's W3C trace context (migration 0033; absent from older tables).
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowError {
    #[error("insert into relation {0} arrived before its Relation message")]
    UnknownRelation(u32),
    #[error("relation {table} has no column '{column}': is the schema newer than this relay?")]
    MissingColumn { table: String, column: &'static str },
    #[error("column '{column}' has value {value:?}, which is not a {kind}")]
    BadValue { column: &'static str, value: String, kind: &'static str },
    #[error("column '{0}' is NULL")]
    Null(&'static str),
    #[error("insert into {table} has {got} values for {want} columns")]
    Arity { table: String, got: usize, want: usize },
    #[error("neither delivery_id nor forward_id is set on outbox row {0}")]
    NoTarget(i64),
}

/// Column positions of one version of the outbox table.
#[derive(Debug, Clone)]
struct Layout {
    table: String,
    columns: usize,
    id: usize,
    project_id: usize,
    delivery_id: Option<usize>,
    forward_id: Option<usize>,
    routing_id: usize,
    reason: usize,
    claim_token: Option<usize>,
    created_at: usize,
    traceparent: Option<usize>,
    tracestate: Option<usize>,
}

/// Relation messages seen on the stream, by OID. Postgres sends one before the first change
/// of a table in a session and again after the table changes.
#[derive(Debug, Default)]
pub struct Relations {
    layouts: HashMap<u32, Layout>,
}

impl Relations {
    pub fn insert(&mut self, rel: &Relation) -> Result<(), RowError> {
        let table = format!("{}.{}", rel.namespace, rel.name);
        let need = |column: &'static str| rel.column_index(column).ok_or(RowError::MissingColumn { table: table.clone(), column });
        let layout = Layout {
            columns: rel.columns.len(),
            id: need("id")?,
            project_id: need("project_id")?,
            delivery_id: rel.column_index("delivery_id"),
            forward_id: rel.column_index("forward_id"),
            routing_id: need("routing_id")?,
            reason: need("reason")?,
            claim_token: rel.column_index("claim_token"),
            created_at: need("created_at")?,
            traceparent: rel.column_index("traceparent"),
            tracestate: rel.column_index("tracestate"),
            table,
        };
        self.layouts.insert(rel.id, layout);
        Ok(())
    }

    pub fn row(&self, relation_id: u32, tuple: &[TupleValue]) -> Result<OutboxRow, RowError> {
        let l = self.layouts.get(&relation_id).ok_or(RowError::UnknownRelation(relation_id))?;
        if tuple.len() != l.columns {
            return Err(RowError::Arity { table: l.table.clone(), got: tuple.len(), want: l.columns });
        }
        let id = text(tuple, l.id, "id")?.ok_or(RowError::Null("id"))?;
        let id: i64 = id.parse().map_err(|_| RowError::BadValue { column: "id", value: id.to_string(), kind: "bigint" })?;
        let reason = text(tuple, l.reason, "reason")?.ok_or(RowError::Null("reason"))?;
        let row = OutboxRow {
            id,
            project_id: uuid(tuple, Some(l.project_id), "project_id")?.map(ProjectId).ok_or(RowError::Null("project_id"))?,
            delivery_id: uuid(tuple, l.delivery_id, "delivery_id")?.map(DeliveryId),
            forward_id: uuid(tuple, l.forward_id, "forward_id")?.map(ForwardId),
            routing_id: uuid(tuple, Some(l.routing_id), "routing_id")?.ok_or(RowError::Null("routing_id"))?,
            reason: reason.parse().map_err(|_| RowError::BadValue { column: "reason", value: reason.to_string(), kind: "announcement reason" })?,
            claim_token: uuid(tuple, l.claim_token, "claim_token")?.map(ClaimToken),
            created_at: text(tuple, l.created_at, "created_at")?.ok_or(RowError::Null("created_at"))?.to_string(),
            traceparent: optional_text(tuple, l.traceparent),
            tracestate: optional_text(tuple, l.tracestate),
        };
        if row.delivery_id.is_none() && row.forward_id.is_none() {
            return Err(RowError::NoTarget(row.id));
        }
        Ok(row)
    }
}

fn text<'a>(tuple: &'a [TupleValue], i: usize, column: &'static str) -> Result<Option<&'a str>, RowError> {
    match tuple.get(i) {
        Some(TupleValue::Text(b)) => std::str::from_utf8(b)
            .map(Some)
            .map_err(|_| RowError::BadValue { column, value: String::from_utf8_lossy(b).into_owned(), kind: "UTF-8 text" }),
        Some(TupleValue::Null) | None => Ok(None),
        Some(other) => Err(RowError::BadValue { column, value: format!("{other:?}"), kind: "text value" }),
    }
}

/// An optional text column read leniently: what is not UTF-8 text is treated as absent
/// (the trace context is informational; the row is announced either way).
fn optional_text(tuple: &[TupleValue], i: Option<usize>) -> Option<String> {
    match tuple.get(i?) {
        Some(TupleValue::Text(b)) => std::str::from_utf8(b).ok().map(str::to_string),
        _ => None,
    }
}

fn uuid(tuple: &[TupleValue], i: Option<usize>, column: &'static str) -> Result<Option<Uuid>, RowError> {
    let Some(i) = i else { return Ok(None) };
    match text(tuple, i, column)? {
        None => Ok(None),
        Some(s) => Uuid::parse_str(s).map(Some).map_err(|_| RowError::BadValue { column, value: s.to_string(), kind: "uuid" }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pgoutput::fixtures::*;
    use crate::pgoutput::{decode, Message};

    #[test]
    fn maps_captured_inserts_by_column_name() {
        let Message::Relation(rel) = decode(&bytes(RELATION)).unwrap() else { panic!() };
        let mut relations = Relations::default();
        relations.insert(&rel).unwrap();
        let Message::Insert { relation_id, tuple } = decode(&bytes(INSERT_2)).unwrap() else { panic!() };
        let row = relations.row(relation_id, &tuple).unwrap();
        assert_eq!(row.id, 2);
        assert_eq!(row.reason, AnnouncementReason::Retry);
        assert_eq!(row.delivery_id, Some(DeliveryId("0190f0a0-0000-7000-8000-000000000004".parse().unwrap())));
        assert_eq!(row.routing_id, "0190f0a0-0000-7000-8000-000000000003".parse::<Uuid>().unwrap());
        assert_eq!(row.forward_id, None);
        assert!(row.created_at.starts_with("2026-12-02"));

        // Reordered columns still map by name.
        let mut reordered = rel.clone();
        reordered.columns.reverse();
        let mut reversed_tuple = tuple.clone();
        reversed_tuple.reverse();
        let mut relations = Relations::default();
        relations.insert(&reordered).unwrap();
        assert_eq!(relations.row(relation_id, &reversed_tuple).unwrap(), row);
    }

    #[test]
    fn missing_columns_and_unknown_relations_fail_loudly() {
        let Message::Relation(mut rel) = decode(&bytes(RELATION)).unwrap() else { panic!() };
        let relations = Relations::default();
        assert_eq!(relations.row(rel.id, &[]), Err(RowError::UnknownRelation(rel.id)));
        rel.columns.retain(|c| c.name != "routing_id");
        let mut relations = Relations::default();
        assert!(matches!(relations.insert(&rel), Err(RowError::MissingColumn { column: "routing_id", .. })));
    }
}
