//! Many Events in one statement: the set form of [`super::INGEST_SQL`] for callers that
//! already know their Projects (the Kafka source, issue 33).
//!
//! The same rows as one `POST /v1/events` per Event, in one transaction: each Event, its
//! Deliveries (one per matching enabled Subscription of an enabled Endpoint), their ordering
//! sequence numbers in the Events' order, and their announcements (ONE `railhook_announce`
//! call for the whole batch: one logical decoding message in CDC mode). The statement takes
//! arrays (`unnest`), so a batch costs one plan and one execution instead of one per Event:
//! the Kafka source's batches of several hundred records went from about 0.87 ms of Postgres
//! per record (the single statement pipelined) to what `docs/BENCHMARKS.md` "Kafka source"
//! shows.
//!
//! Idempotency keys as in the single statement: `ON CONFLICT DO NOTHING` on
//! `(project_id, idempotency_key)`, which waits for a concurrent writer of the key; an Event
//! not inserted is then read back by its key (one statement for all of them) and is a replay
//! (same type and payload hash) or a key reused. Two records of one batch with the same key
//! are one Event: the second finds the first's row, as it would in the next transaction.
//! `tests/ingest_batch.rs` checks that both forms write the same rows.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use railhook_core::{DeliveryId, DeliveryStatus, EndpointId, EventId, SubscriptionId, TraceContext};
use tokio_postgres::types::Json;

use super::{Caller, DeliverySummary, Event, IngestOutcome, NewEvent, DEFAULT_OUTGOING_DELAYS};
use crate::StoreError;

/// The set form of the ingest statement. Per Event (aligned arrays, `$1`-`$8` and `$12`): id,
/// Project (NULL for an API key's caller), type, payload, idempotency key, request hash,
/// traceparent, tracestate, and the SHA-256 of the caller's API key (NULL for a Project's);
/// the candidate patterns as pairs (`$9` the Event's position from 1, `$10` a pattern); `$11`
/// the default ladder. One row per Delivery made (an Event with none: one row with NULLs),
/// with the Event's position and its Project; an Event not inserted has one row without
/// `created_at`: its key existed (Project set) or its API key is unknown or revoked
/// (Project NULL).
pub const INGEST_BATCH_SQL: &str = concat!(
    "
WITH input AS MATERIALIZED (
    -- The caller's Project: given, or the one of the API key whose SHA-256 is given (unknown
    -- or revoked: NULL, nothing written, the Event's row below says so).
    SELECT i.id, coalesce(i.project_id, k.project_id) AS project_id, i.event_type, i.payload, i.idempotency_key,
           i.request_sha256, i.traceparent, i.tracestate, i.ord
    FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::jsonb[], $5::text[], $6::bytea[], $7::text[], $8::text[], $12::bytea[])
        WITH ORDINALITY AS i(id, project_id, event_type, payload, idempotency_key, request_sha256, traceparent, tracestate, key_sha256, ord)
    LEFT JOIN api_keys k ON k.secret_sha256 = i.key_sha256 AND k.revoked_at IS NULL
),
ev AS (
    INSERT INTO events (id, project_id, event_type, payload, idempotency_key, request_sha256, traceparent, tracestate)
    SELECT id, project_id, event_type, payload, idempotency_key, request_sha256, traceparent, tracestate FROM input
    WHERE project_id IS NOT NULL ORDER BY ord
    ON CONFLICT (project_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, project_id, created_at
),
made AS (
    SELECT i.ord, ev.id, ev.project_id, ev.created_at, i.traceparent, i.tracestate FROM ev JOIN input i ON i.id = ev.id
),
subs AS (
    SELECT made.ord, made.id AS event_id, s.id, s.project_id, s.endpoint_id, s.ordering, s.max_attempts, s.timeout_seconds,
           COALESCE(s.retry_delays, $11::int[]) AS retry_delays
    FROM made
    JOIN unnest($9::int8[], $10::text[]) AS c(ord, pattern) ON c.ord = made.ord
    JOIN subscriptions s ON s.project_id = made.project_id AND s.event_type_pattern = c.pattern
    JOIN endpoints e ON e.id = s.endpoint_id AND e.enabled
    WHERE s.enabled
),
dl AS (
    INSERT INTO deliveries (id, project_id, event_id, endpoint_id, subscription_id,
                            max_attempts, retry_delays, timeout_seconds, ordered)
    SELECT railhook_uuid_v7(), subs.project_id, subs.event_id, subs.endpoint_id, subs.id,
           subs.max_attempts, subs.retry_delays, subs.timeout_seconds, subs.ordering
    FROM subs
    ORDER BY subs.ord, subs.id
    RETURNING id, project_id, event_id, endpoint_id, subscription_id, sequence_number
),
ob AS (
    -- One call for the batch, in the Events' order; each announcement carries its Event's
    -- trace context (NULL elements: none), so the function looks nothing up.
    SELECT railhook_announce('d', array_agg(dl.project_id ORDER BY made.ord, dl.id), array_agg(dl.id ORDER BY made.ord, dl.id),
                             array_agg(dl.endpoint_id ORDER BY made.ord, dl.id), 'created', NULL,
                             coalesce(array_agg(made.traceparent ORDER BY made.ord, dl.id), '{}'),
                             coalesce(array_agg(made.tracestate ORDER BY made.ord, dl.id), '{}')) AS n
    FROM dl JOIN made ON made.id = dl.event_id
)
SELECT i.ord, made.created_at, dl.id, dl.endpoint_id, dl.subscription_id, dl.sequence_number, i.project_id
FROM input i CROSS JOIN ob LEFT JOIN made ON made.ord = i.ord LEFT JOIN dl ON dl.event_id = made.id
ORDER BY i.ord, dl.id"
);

/// The Events of a batch not inserted (their keys existed), read back by key.
const BY_KEY_SQL: &str = "
SELECT k.ord, e.id, e.event_type, e.created_at, e.request_sha256
FROM unnest($1::uuid[], $2::text[]) WITH ORDINALITY AS k(project_id, idempotency_key, ord)
JOIN events e ON e.project_id = k.project_id AND e.idempotency_key = k.idempotency_key";

const DELIVERIES_OF_SQL: &str = "
SELECT event_id, id, endpoint_id, subscription_id, status::text, attempt_count, sequence_number, next_retry_at, created_at
FROM deliveries WHERE event_id = ANY($1) ORDER BY id";

/// Ingests `events` with [`INGEST_BATCH_SQL`] on `db` (a transaction: the caller commits);
/// the outcomes in the order of `events`; an API key that is unknown or revoked is
/// [`IngestOutcome::Unauthenticated`] for its Event alone.
pub async fn ingest_set<C: deadpool_postgres::GenericClient + Sync>(db: &C, events: &[NewEvent<'_>]) -> Result<Vec<IngestOutcome>, StoreError> {
    let mut inserted = insert_set(db, events).await?;
    inserted.resolve(db, events).await?;
    inserted.finish()
}

/// What [`INGEST_BATCH_SQL`] did for each Event of a batch: its outcome, or `None` while its
/// key existed and the Event it names is not read yet ([`Inserted::resolve`]).
pub struct Inserted {
    pub outcomes: Vec<Option<IngestOutcome>>,
    /// Each Event's Project (an API key's caller: the key's).
    projects: Vec<Option<uuid::Uuid>>,
}

/// [`INGEST_BATCH_SQL`] alone: one statement, so on a client (not a transaction) it is its
/// own transaction, and an error means nothing of the batch was written (the API's batches
/// of POSTs, `railhook_api::ingest`, then ingest each Event on its own).
pub async fn insert_set<C: deadpool_postgres::GenericClient + Sync>(db: &C, events: &[NewEvent<'_>]) -> Result<Inserted, StoreError> {
    let n = events.len();
    let ids: Vec<EventId> = (0..n).map(|_| EventId::new()).collect();
    let mut projects: Vec<Option<uuid::Uuid>> = Vec::with_capacity(n);
    let mut key_hashes: Vec<Option<Vec<u8>>> = Vec::with_capacity(n);
    for e in events {
        match e.caller {
            Caller::Project(p) => {
                projects.push(Some(p.0));
                key_hashes.push(None);
            }
            // A key without the prefix cannot exist: no hash, no Project, Unauthenticated.
            Caller::ApiKey(secret) => {
                projects.push(None);
                key_hashes.push(secret.starts_with(crate::tenancy::API_KEY_PREFIX).then(|| crate::tenancy::hash_key(secret)));
            }
        }
    }
    let uuids: Vec<uuid::Uuid> = ids.iter().map(|i| i.0).collect();
    let types: Vec<&str> = events.iter().map(|e| e.event_type).collect();
    let payloads: Vec<Json<&serde_json::Value>> = events.iter().map(|e| Json(e.payload)).collect();
    let keys: Vec<Option<&str>> = events.iter().map(|e| e.idempotency_key).collect();
    let hashes: Vec<&[u8]> = events.iter().map(|e| e.request_sha256.as_slice()).collect();
    let parents: Vec<Option<String>> = events.iter().map(|e| e.trace.as_ref().map(TraceContext::traceparent)).collect();
    let states: Vec<Option<&str>> = events.iter().map(|e| e.trace.as_ref().and_then(|t| t.state.as_deref())).collect();
    let (mut cand_ord, mut cand_pattern) = (Vec::new(), Vec::new());
    for (i, e) in events.iter().enumerate() {
        for p in &e.candidate_patterns {
            cand_ord.push(i as i64 + 1);
            cand_pattern.push(p.as_str());
        }
    }
    let delays: Vec<i32> = DEFAULT_OUTGOING_DELAYS.to_vec();
    let statement = db.prepare_cached(INGEST_BATCH_SQL).await?;
    let rows = db
        .query(&statement, &[&uuids, &projects, &types, &payloads, &keys, &hashes, &parents, &states, &cand_ord, &cand_pattern, &delays, &key_hashes])
        .await?;

    let mut outcomes: Vec<Option<IngestOutcome>> = (0..n).map(|_| None).collect();
    for r in &rows {
        let i = usize::try_from(r.try_get::<_, i64>(0)? - 1).map_err(|_| StoreError::Misconfigured("ingest batch: bad position".into()))?;
        let slot = outcomes.get_mut(i).ok_or_else(|| StoreError::Misconfigured("ingest batch: position out of range".into()))?;
        let Some(project) = r.try_get::<_, Option<uuid::Uuid>>(6)? else {
            *slot = Some(IngestOutcome::Unauthenticated);
            continue;
        };
        // Not inserted: the key existed (read back below).
        let Some(created_at) = r.try_get::<_, Option<DateTime<Utc>>>(1)? else {
            projects[i] = Some(project);
            continue;
        };
        let IngestOutcome::Created(event) = slot.get_or_insert_with(|| {
            IngestOutcome::Created(Event {
                id: ids[i],
                event_type: events[i].event_type.to_string(),
                payload: None,
                created_at,
                deliveries: Some(Vec::new()),
                trace_id: events[i].trace.as_ref().map(|t| t.parent.trace_id_hex()),
            })
        }) else {
            continue;
        };
        // The Event's row without a Delivery (LEFT JOIN): no Subscription matched.
        let Some(id) = r.try_get::<_, Option<uuid::Uuid>>(2)? else { continue };
        event.deliveries.get_or_insert_with(Vec::new).push(DeliverySummary {
            id: DeliveryId(id),
            endpoint_id: EndpointId(r.try_get(3)?),
            subscription_id: r.try_get::<_, Option<uuid::Uuid>>(4)?.map(SubscriptionId),
            status: DeliveryStatus::Pending,
            attempt_count: 0,
            sequence_number: r.try_get(5)?,
            next_retry_at: None,
            created_at,
        });
    }

    Ok(Inserted { outcomes, projects })
}

impl Inserted {
    /// Reads the Events not inserted by their keys (they existed before the batch, or earlier
    /// in it): a replay of the same request, or a key reused. Read after the insert committed
    /// or within its transaction; an error leaves the outcomes known so far.
    pub async fn resolve<C: deadpool_postgres::GenericClient + Sync>(&mut self, db: &C, events: &[NewEvent<'_>]) -> Result<(), StoreError> {
        let (outcomes, projects) = (&mut self.outcomes, &self.projects);
        let n = outcomes.len();
        let missing: Vec<usize> = (0..n).filter(|&i| outcomes[i].is_none()).collect();
        if !missing.is_empty() {
            let key_projects: Vec<Option<uuid::Uuid>> = missing.iter().map(|&i| projects[i]).collect();
            let key_names: Vec<&str> = missing.iter().map(|&i| events[i].idempotency_key.unwrap_or_default()).collect();
            let found = db.query(BY_KEY_SQL, &[&key_projects, &key_names]).await?;
            let mut events_of: Vec<(usize, Event)> = Vec::new();
            for r in &found {
                let i = missing[usize::try_from(r.try_get::<_, i64>(0)? - 1).map_err(|_| StoreError::Misconfigured("ingest batch: bad key position".into()))?];
                let hash: Option<Vec<u8>> = r.try_get(4)?;
                if hash.as_deref() != Some(events[i].request_sha256.as_slice()) {
                    outcomes[i] = Some(IngestOutcome::KeyReused);
                    continue;
                }
                let id: uuid::Uuid = r.try_get(1)?;
                events_of.push((
                    i,
                    Event {
                        id: EventId(id),
                        event_type: r.try_get(2)?,
                        payload: None,
                        created_at: r.try_get(3)?,
                        deliveries: Some(Vec::new()),
                        trace_id: None,
                    },
                ));
            }
            // A replay is answered only with its Deliveries: the outcomes are set once they
            // are read (an error leaves the replays without an outcome, not without
            // Deliveries).
            if !events_of.is_empty() {
                let mut event_ids: Vec<uuid::Uuid> = events_of.iter().map(|(_, e)| e.id.0).collect();
                event_ids.sort_unstable();
                event_ids.dedup();
                let mut deliveries: HashMap<uuid::Uuid, Vec<super::DeliverySummary>> = HashMap::new();
                for r in db.query(DELIVERIES_OF_SQL, &[&event_ids]).await? {
                    deliveries.entry(r.try_get::<_, uuid::Uuid>(0)?).or_default().push(super::delivery_summary(&r, 1)?);
                }
                for (i, mut event) in events_of {
                    event.deliveries = Some(deliveries.get(&event.id.0).cloned().unwrap_or_default());
                    outcomes[i] = Some(IngestOutcome::Replayed(event));
                }
            }
        }
        Ok(())
    }

    /// Every Event's outcome, once [`Inserted::resolve`] ran.
    pub fn finish(self) -> Result<Vec<IngestOutcome>, StoreError> {
        self.outcomes
            .into_iter()
            .enumerate()
            .map(|(i, o)| o.ok_or_else(|| StoreError::Misconfigured(format!("ingest batch: the Event at {i} was neither inserted nor found by its key"))))
            .collect()
    }
}
