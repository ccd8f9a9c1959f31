//! One batch of records (of one lane, `crate::Lane`): mapped (`crate::record`), their
//! Projects checked, the good ones ingested in ONE statement and transaction, the set form of
//! the statement of `POST /v1/events` (`railhook_store::events::ingest_batch`), the others
//! produced to the dead-letter topic.
//! [`Batch::ingest`] returns only when every record of the batch has its outcome stored
//! (an Event committed, or a dead-letter copy acknowledged): the caller commits the offsets
//! after that, and not before.
//!
//! A database error that is the data's (SQLSTATE classes 22, 23, 54: one record Postgres
//! refuses) would fail the batch for ever; the batch is then made one record per
//! transaction, so the record at fault goes to the dead-letter topic (`rejected`) and its
//! neighbours are ingested. Any other error (connection, pool, deadlock, serialisation) is
//! the caller's to make again: nothing of the batch was kept.

use std::collections::HashSet;

use railhook_core::ProjectId;
use railhook_core::TraceContext;
use railhook_store::events::{self, IngestOutcome, NewEvent};
use railhook_telemetry::traces;
use railhook_store::StoreError;

use crate::dead_letter::DeadLetters;
use crate::error::SourceError;
use crate::metrics::SourceMetrics;
use crate::record::{Mapped, Mapping, Reason, Record, Refusal};

/// What became of one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Created,
    /// Its idempotency key had made its Event already (read twice, or sent again).
    Replayed,
    DeadLetter(Refusal),
}

/// A batch of records with the message keys the dead-letter copies keep.
pub struct Batch<'a> {
    pub records: Vec<Record<'a>>,
    pub keys: Vec<Option<&'a [u8]>>,
}

impl Batch<'_> {
    /// Ingests the batch (see the module doc); the outcome of each record, in order.
    pub async fn ingest(&self, mapping: &Mapping, pool: &railhook_store::Pool, dead_letters: &DeadLetters, metrics: &SourceMetrics) -> Result<Vec<Outcome>, SourceError> {
        let mapped: Vec<Result<Mapped, Refusal>> = self.records.iter().map(|r| mapping.map(r)).collect();
        let mut outcomes: Vec<Option<Outcome>> = mapped.iter().map(|m| m.as_ref().err().map(|r| Outcome::DeadLetter(r.clone()))).collect();
        let client = pool.get().await.map_err(|e| SourceError::unavailable("getting a Postgres connection", e))?;

        let named: Vec<ProjectId> = mapped.iter().filter_map(|m| m.as_ref().ok().map(|m| m.project)).collect::<HashSet<_>>().into_iter().collect();
        let existing: HashSet<ProjectId> = if named.is_empty() {
            HashSet::new()
        } else {
            events::existing_projects(&client, &named).await.map_err(store_error("looking up the records' Projects"))?.into_iter().collect()
        };
        let mut good: Vec<(usize, &Mapped)> = Vec::with_capacity(mapped.len());
        for (i, m) in mapped.iter().enumerate() {
            let Ok(m) = m else { continue };
            if existing.contains(&m.project) {
                good.push((i, m));
            } else {
                outcomes[i] = Some(Outcome::DeadLetter(Refusal::new(Reason::UnknownProject, format!("Project {} does not exist", m.project))));
            }
        }

        drop(client);
        if !good.is_empty() {
            // An `ingest` span per record (issue 33), as `POST /v1/events` makes per request:
            // a child of the record's own context, or a new trace; the Event keeps the span's
            // context. From here to the batch's outcome. With export off: none, and the
            // record's context passes through unchanged.
            let spans: Vec<tracing::Span> = good
                .iter()
                .map(|(i, m)| {
                    let r = &self.records[*i];
                    let span = tracing::info_span!(target: traces::TARGET, parent: None, traces::span::INGEST,
                        otel.kind = "consumer", messaging.system = "kafka", messaging.destination.name = r.topic,
                        messaging.destination.partition.id = r.partition, messaging.kafka.offset = r.offset, railhook.event_type = %m.event_type);
                    traces::continue_from(&span, m.trace.as_ref());
                    span
                })
                .collect();
            let contexts: Vec<Option<TraceContext>> = spans.iter().zip(&good).map(|(span, (_, m))| traces::context_of(span, m.trace.as_ref())).collect();
            let results = match ingest_group(pool, &good, &contexts, metrics).await {
                Ok(results) => results,
                Err(e) => {
                    spans.iter().for_each(|span| traces::fail(span, "ingest failed"));
                    return Err(e);
                }
            };
            for (((i, _), outcome), span) in good.iter().zip(results).zip(&spans) {
                if let Outcome::DeadLetter(refusal) = &outcome {
                    traces::fail(span, refusal.reason.as_str());
                }
                outcomes[*i] = Some(outcome);
            }
        }

        let outcomes: Vec<Outcome> = outcomes.into_iter().map(|o| o.unwrap_or(Outcome::DeadLetter(Refusal::new(Reason::Rejected, "no outcome")))).collect();
        let refused: Vec<(Record<'_>, Option<&[u8]>, Refusal)> = outcomes
            .iter()
            .enumerate()
            .filter_map(|(i, o)| match o {
                Outcome::DeadLetter(r) => Some((self.records[i].clone(), self.keys[i], r.clone())),
                _ => None,
            })
            .collect();
        if !refused.is_empty() {
            dead_letters.send(&refused).await?;
            for (record, _, refusal) in &refused {
                tracing::warn!(topic = record.topic, partition = record.partition, offset = record.offset, reason = refusal.reason.as_str(), message = %refusal.message, "Kafka record sent to the dead-letter topic");
            }
        }
        Ok(outcomes)
    }
}

/// The batch's good records in one transaction on one connection; the data-error fallback
/// (one record per transaction) when Postgres refuses it for a record's sake.
async fn ingest_group(pool: &railhook_store::Pool, group: &[(usize, &Mapped)], contexts: &[Option<TraceContext>], metrics: &SourceMetrics) -> Result<Vec<Outcome>, SourceError> {
    let mut client = pool.get().await.map_err(|e| SourceError::unavailable("getting a Postgres connection", e))?;
    let news: Vec<_> = group.iter().zip(contexts).map(|((_, m), trace)| NewEvent { trace: trace.clone(), ..m.new_event() }).collect();
    let started = std::time::Instant::now();
    match events::ingest_batch(&mut client, &news).await {
        Ok(results) => {
            metrics.batch_seconds.observe(started.elapsed().as_secs_f64());
            metrics.batch_records.observe(news.len() as f64);
            Ok(results.into_iter().map(outcome_of).collect())
        }
        Err(e) if is_the_datas(&e) => {
            tracing::warn!(error = %e, records = news.len(), "Postgres refused a Kafka source batch; ingesting its records one by one");
            let mut outcomes = Vec::with_capacity(news.len());
            for new in news {
                outcomes.push(match events::ingest_batch(&mut client, std::slice::from_ref(&new)).await {
                    Ok(mut one) => outcome_of(one.pop().unwrap_or(IngestOutcome::Unauthenticated)),
                    Err(e) if is_the_datas(&e) => Outcome::DeadLetter(refused_by_postgres(&e)),
                    Err(e) => return Err(store_error("ingesting a Kafka record")(e)),
                });
            }
            Ok(outcomes)
        }
        Err(e) => Err(store_error("ingesting a batch of Kafka records")(e)),
    }
}

fn outcome_of(result: IngestOutcome) -> Outcome {
    match result {
        IngestOutcome::Created(_) => Outcome::Created,
        IngestOutcome::Replayed(_) => Outcome::Replayed,
        IngestOutcome::KeyReused => Outcome::DeadLetter(Refusal::new(Reason::IdempotencyKeyReused, "this idempotency key was used before with a different type or payload")),
        // A `Caller::Project` always names a Project; kept total all the same.
        IngestOutcome::Unauthenticated => Outcome::DeadLetter(Refusal::new(Reason::UnknownProject, "the Project was not found")),
    }
}

/// SQLSTATE classes 22 (data exception), 23 (integrity constraint) and 54 (program limit,
/// e.g. a jsonb too large): the statement's data is at fault, so making it again cannot help.
fn is_the_datas(e: &StoreError) -> bool {
    match e {
        StoreError::Db(db) => db.code().is_some_and(|c| ["22", "23", "54"].iter().any(|class| c.code().starts_with(class))),
        _ => false,
    }
}

/// A record Postgres refused alone: the SQLSTATE and the server's primary message (for the
/// operator reading the dead-letter topic; no client sees it).
fn refused_by_postgres(e: &StoreError) -> Refusal {
    let (code, message) = match e {
        StoreError::Db(db) => (db.code().map(|c| c.code().to_string()).unwrap_or_default(), db.as_db_error().map(|d| d.message().to_string()).unwrap_or_default()),
        _ => (String::new(), e.to_string()),
    };
    if code == "23503" {
        return Refusal::new(Reason::UnknownProject, "the Project was deleted while the record was ingested");
    }
    Refusal::new(Reason::Rejected, format!("Postgres refused the Event (SQLSTATE {code}): {message}"))
}

fn store_error(context: &'static str) -> impl Fn(StoreError) -> SourceError {
    move |e| SourceError::unavailable(context, e)
}
