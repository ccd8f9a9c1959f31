//! Replays (the Time Machine, issue 17): a background job that makes a *new* Delivery of each
//! stored Event in a time range to each chosen Endpoint whose Subscription matches now.
//!
//! - The job is its row (`replays`, migration 0016): state, filter, `total` (the dry-run count
//!   at creation), `made`, and a cursor: the last Event done, in `(created_at, id)` order.
//! - [`run_batch`] does one bounded batch: under the [`crate::locks::REPLAY`] try-lock (one
//!   batch at a time across processes), it takes the least recently advanced running Replay
//!   (`FOR UPDATE`, so a cancel waits for the batch), reads the next Events after the cursor,
//!   matches them in Rust with `railhook_core::pattern` against the Subscriptions as they are
//!   now, makes the Deliveries and their announcements
//!   ([`crate::lifecycle::replay::insert_batch`]) and moves the cursor, all in one
//!   transaction. A crash anywhere leaves either the whole batch or none of it, so a restart
//!   resumes at the cursor and makes each (replay, event, endpoint) exactly once (also
//!   enforced by `deliveries_replay_once_idx`).
//! - [`count`] is the dry run: the distinct event types of the project (a loose index scan,
//!   at most [`MAX_TYPES`]), each weighted in Rust by the number of chosen Endpoints with a
//!   matching Subscription, then one bounded COUNT over `events_project_type_idx`.
//! - One running Replay per Project: `replays_one_running_idx`.
//! - [`step`] is the runner's call: the batch above, but only when the shared pace
//!   (`replay_pace`, migration 0019) allows it, and moving the pace on by the Deliveries it
//!   made over `replay.max_deliveries_per_second`: one cap for all Replays in all processes.
//!
//! Per (Event, Endpoint) one Delivery is made, whatever the number of matching
//! Subscriptions of that Endpoint: the first of them with ordering, else the first by id.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use railhook_core::{EndpointId, EventId, EventType, EventTypePattern, ProjectId, ReplayId, SubscriptionId};
use serde::Serialize;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::lifecycle::replay::{insert_batch, ReplayTarget};
use crate::StoreError;

/// Distinct event types a count considers (a project with more counts only these).
pub const MAX_TYPES: i64 = 1_000;
/// Events one count reads at most; above it the count is a lower bound (`capped`).
pub const COUNT_CAP: i64 = 1_000_000;

/// Where a Replay is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReplayState {
    Running,
    Completed,
    Cancelled,
}

impl ReplayState {
    fn parse(s: &str) -> Result<ReplayState, StoreError> {
        match s {
            "running" => Ok(ReplayState::Running),
            "completed" => Ok(ReplayState::Completed),
            "cancelled" => Ok(ReplayState::Cancelled),
            other => Err(StoreError::Misconfigured(format!("unknown replay state {other}"))),
        }
    }
}

/// A Replay as the API shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Replay {
    #[schema(value_type = String)]
    pub id: ReplayId,
    pub state: ReplayState,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub event_types: Option<Vec<String>>,
    #[schema(value_type = Option<Vec<String>>)]
    pub endpoint_ids: Option<Vec<EndpointId>>,
    /// Deliveries it would make, counted when it was created.
    pub total: i64,
    /// The count stopped at its cap: `total` is a lower bound.
    pub total_capped: bool,
    /// Deliveries made so far.
    pub made: i64,
    /// Events of the range done so far.
    pub events_done: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "id, state, range_from, range_to, event_types, endpoint_ids, total, total_capped, made, events_done, created_at, updated_at, finished_at";

fn replay_from(r: &Row) -> Result<Replay, StoreError> {
    Ok(Replay {
        id: ReplayId(r.try_get(0)?),
        state: ReplayState::parse(r.try_get(1)?)?,
        from: r.try_get(2)?,
        to: r.try_get(3)?,
        event_types: r.try_get(4)?,
        endpoint_ids: r.try_get::<_, Option<Vec<Uuid>>>(5)?.map(|v| v.into_iter().map(EndpointId).collect()),
        total: r.try_get(6)?,
        total_capped: r.try_get(7)?,
        made: r.try_get(8)?,
        events_done: r.try_get(9)?,
        created_at: r.try_get(10)?,
        updated_at: r.try_get(11)?,
        finished_at: r.try_get(12)?,
    })
}

/// What a Replay replays: `[from, to)`, the event type patterns (none: every type) and the
/// Endpoints (none: every Endpoint of the project).
#[derive(Debug, Clone)]
pub struct ReplayFilter {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub event_types: Option<Vec<EventTypePattern>>,
    pub endpoint_ids: Option<Vec<EndpointId>>,
}

impl ReplayFilter {
    fn wants(&self, t: &EventType) -> bool {
        self.event_types.as_ref().is_none_or(|ps| ps.iter().any(|p| p.matches(t)))
    }
}

// ---- Matching ---------------------------------------------------------------------------

/// An enabled Subscription of an enabled, chosen Endpoint, as matching needs it.
#[derive(Debug, Clone)]
struct Candidate {
    endpoint: EndpointId,
    subscription: SubscriptionId,
    pattern: EventTypePattern,
}

/// The chosen Endpoints' Subscriptions as they are now, each Endpoint's in preference order.
async fn candidates<C: GenericClient + Sync>(db: &C, project: ProjectId, endpoints: Option<&[EndpointId]>) -> Result<Vec<Candidate>, StoreError> {
    let rows = db
        .query(
            "SELECT s.endpoint_id, s.id, s.event_type_pattern FROM subscriptions s
             JOIN endpoints e ON e.id = s.endpoint_id AND e.enabled
             WHERE s.project_id = $1 AND s.enabled AND ($2::uuid[] IS NULL OR s.endpoint_id = ANY($2))
             ORDER BY s.endpoint_id, s.ordering DESC, s.id",
            &[&project, &endpoints],
        )
        .await?;
    let mut candidates = Vec::with_capacity(rows.len());
    for r in &rows {
        // A pattern stored before its rules changed, no longer valid: it matches nothing.
        let Ok(pattern) = EventTypePattern::parse(r.try_get(2)?) else { continue };
        candidates.push(Candidate { endpoint: EndpointId(r.try_get(0)?), subscription: SubscriptionId(r.try_get(1)?), pattern });
    }
    Ok(candidates)
}

/// Per chosen Endpoint, the first Subscription matching `t` (candidates are grouped by
/// Endpoint, in preference order).
fn targets_of<'a>(t: &'a EventType, candidates: &'a [Candidate]) -> impl Iterator<Item = (EndpointId, SubscriptionId)> + 'a {
    let mut last: Option<EndpointId> = None;
    candidates.iter().filter_map(move |c| {
        if last == Some(c.endpoint) || !c.pattern.matches(t) {
            return None;
        }
        last = Some(c.endpoint);
        Some((c.endpoint, c.subscription))
    })
}

// ---- The dry run ----------------------------------------------------------------------------

/// Deliveries a Replay would make now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ReplayCount {
    /// Deliveries it would make.
    pub deliveries: i64,
    /// Events of the range it would replay (those with at least one Delivery).
    pub events: i64,
    /// The count stopped after [`COUNT_CAP`] Events (or the cap of [`count_upto`]): both
    /// figures are lower bounds.
    pub capped: bool,
}

const TYPES_SQL: &str = "
WITH RECURSIVE t AS (
    (SELECT event_type FROM events WHERE project_id = $1 ORDER BY event_type LIMIT 1)
    UNION ALL
    SELECT (SELECT e.event_type FROM events e WHERE e.project_id = $1 AND e.event_type > t.event_type ORDER BY e.event_type LIMIT 1)
    FROM t WHERE t.event_type IS NOT NULL
)
SELECT event_type FROM t WHERE event_type IS NOT NULL LIMIT $2";

/// Per type an index-only range scan of `events_project_type_idx` (the LATERAL keeps the
/// planner from a bitmap heap scan of the whole range by `events_project_created_idx`: 41 ms
/// against 254 ms for 23,000 of 57,000 Events in the range).
const COUNT_SQL: &str = "
SELECT count(*), COALESCE(sum(n), 0)::bigint FROM (
    SELECT w.n FROM unnest($2::text[], $3::int[]) AS w(t, n)
    CROSS JOIN LATERAL (
        SELECT 1 FROM events e
        WHERE e.project_id = $1 AND e.event_type = w.t AND e.created_at >= $4 AND e.created_at < $5
        LIMIT $6
    ) e
    LIMIT $6
) x";

/// The dry run: what [`run_batch`] would make for `filter` if it ran now.
pub async fn count<C: GenericClient + Sync>(db: &C, project: ProjectId, filter: &ReplayFilter) -> Result<ReplayCount, StoreError> {
    count_upto(db, project, filter, COUNT_CAP).await
}

/// [`count`] reading at most `cap` Events (the dashboard's estimate stops sooner, to render
/// in under 200 ms with a million Events in the range); past it both figures are lower
/// bounds (`capped`).
pub async fn count_upto<C: GenericClient + Sync>(db: &C, project: ProjectId, filter: &ReplayFilter, cap: i64) -> Result<ReplayCount, StoreError> {
    let candidates = candidates(db, project, filter.endpoint_ids.as_deref()).await?;
    let mut types = Vec::new();
    let mut weights = Vec::new();
    for row in db.query(TYPES_SQL, &[&project, &MAX_TYPES]).await? {
        let Ok(t) = EventType::parse(row.try_get(0)?) else { continue };
        let n = if filter.wants(&t) { targets_of(&t, &candidates).count() as i32 } else { 0 };
        if n > 0 {
            types.push(t.as_str().to_string());
            weights.push(n);
        }
    }
    if types.is_empty() {
        return Ok(ReplayCount { deliveries: 0, events: 0, capped: false });
    }
    let row = db.query_one(COUNT_SQL, &[&project, &types, &weights, &filter.from, &filter.to, &cap]).await?;
    let events: i64 = row.try_get(0)?;
    Ok(ReplayCount { deliveries: row.try_get(1)?, events, capped: events >= cap })
}

// ---- Create, read, cancel ---------------------------------------------------------------

pub enum CreateOutcome {
    Created(Replay),
    /// The project has a running Replay already: its id.
    AlreadyRunning(ReplayId),
}

/// Starts a Replay of `filter` with `total` (its dry-run count) Deliveries expected. At most
/// one runs per project: the unique index decides between two concurrent requests.
pub async fn create<C: GenericClient + Sync>(db: &C, project: ProjectId, filter: &ReplayFilter, total: ReplayCount) -> Result<CreateOutcome, StoreError> {
    let types: Option<Vec<&str>> = filter.event_types.as_ref().map(|ps| ps.iter().map(|p| p.as_str()).collect());
    let sql = format!(
        "INSERT INTO replays (id, project_id, range_from, range_to, event_types, endpoint_ids, total, total_capped, cursor_created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $3)
         ON CONFLICT (project_id) WHERE state = 'running' DO NOTHING
         RETURNING {COLUMNS}"
    );
    let row = db.query_opt(&sql, &[&ReplayId::new(), &project, &filter.from, &filter.to, &types, &filter.endpoint_ids, &total.deliveries, &total.capped]).await?;
    if let Some(row) = row {
        return Ok(CreateOutcome::Created(replay_from(&row)?));
    }
    match running(db, project).await? {
        Some(id) => Ok(CreateOutcome::AlreadyRunning(id)),
        // It finished between the insert and the read: the caller may try again.
        None => Err(StoreError::Misconfigured("a running replay blocked the insert and then vanished".into())),
    }
}

/// The project's running Replay, if any (checked before the count, which costs more).
pub async fn running<C: GenericClient + Sync>(db: &C, project: ProjectId) -> Result<Option<ReplayId>, StoreError> {
    let row = db.query_opt("SELECT id FROM replays WHERE project_id = $1 AND state = 'running'", &[&project]).await?;
    row.map(|r| Ok(ReplayId(r.try_get(0)?))).transpose()
}

/// The given Endpoint ids that are not Endpoints of `project`.
pub async fn unknown_endpoints<C: GenericClient + Sync>(db: &C, project: ProjectId, ids: &[EndpointId]) -> Result<Vec<EndpointId>, StoreError> {
    let rows = db.query("SELECT id FROM endpoints WHERE project_id = $1 AND id = ANY($2)", &[&project, &ids]).await?;
    let known: Vec<EndpointId> = rows.iter().map(|r| Ok(EndpointId(r.try_get(0)?))).collect::<Result<_, StoreError>>()?;
    Ok(ids.iter().filter(|id| !known.contains(id)).copied().collect())
}

pub async fn get<C: GenericClient + Sync>(db: &C, project: ProjectId, id: ReplayId) -> Result<Option<Replay>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM replays WHERE id = $1 AND project_id = $2");
    db.query_opt(&sql, &[&id, &project]).await?.as_ref().map(replay_from).transpose()
}

/// The project's Replays in id (= creation) order, after `cursor`, `limit` rows.
pub async fn list<C: GenericClient + Sync>(db: &C, project: ProjectId, cursor: Option<ReplayId>, limit: i64) -> Result<Vec<Replay>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM replays WHERE project_id = $1 AND ($2::uuid IS NULL OR id > $2) ORDER BY id LIMIT $3");
    db.query(&sql, &[&project, &cursor, &limit]).await?.iter().map(replay_from).collect()
}

pub enum CancelOutcome {
    Cancelled(Replay),
    /// Only a running Replay can be cancelled; this one is in this state.
    NotRunning(ReplayState),
    NotFound,
}

/// Cancels a running Replay. It waits for a batch in progress (the runner holds the row), so
/// once this returns no further Delivery is made; those made stay.
pub async fn cancel<C: GenericClient + Sync>(db: &C, project: ProjectId, id: ReplayId) -> Result<CancelOutcome, StoreError> {
    let sql = format!(
        "UPDATE replays SET state = 'cancelled', finished_at = now(), updated_at = now()
         WHERE id = $1 AND project_id = $2 AND state = 'running' RETURNING {COLUMNS}"
    );
    if let Some(row) = db.query_opt(&sql, &[&id, &project]).await? {
        return Ok(CancelOutcome::Cancelled(replay_from(&row)?));
    }
    Ok(match get(db, project, id).await? {
        Some(r) => CancelOutcome::NotRunning(r.state),
        None => CancelOutcome::NotFound,
    })
}

// ---- The runner's batch -------------------------------------------------------------------

/// One batch's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    pub replay: ReplayId,
    pub events: u64,
    pub made: u64,
    /// The range is done: the Replay is completed.
    pub finished: bool,
}

/// A running Replay as the runner reads it.
struct Running {
    id: ReplayId,
    project: ProjectId,
    filter: ReplayFilter,
    cursor: (DateTime<Utc>, Uuid),
}

const PICK_SQL: &str = "
SELECT id, project_id, range_from, range_to, event_types, endpoint_ids, cursor_created_at, cursor_event_id
FROM replays WHERE state = 'running' ORDER BY updated_at LIMIT 1 FOR UPDATE SKIP LOCKED";

fn running_from(r: &Row) -> Result<Running, StoreError> {
    let types: Option<Vec<String>> = r.try_get(4)?;
    Ok(Running {
        id: ReplayId(r.try_get(0)?),
        project: ProjectId(r.try_get(1)?),
        filter: ReplayFilter {
            from: r.try_get(2)?,
            to: r.try_get(3)?,
            event_types: types.map(|ts| ts.iter().filter_map(|t| EventTypePattern::parse(t).ok()).collect()),
            endpoint_ids: r.try_get::<_, Option<Vec<Uuid>>>(5)?.map(|v| v.into_iter().map(EndpointId).collect()),
        },
        cursor: (r.try_get(6)?, r.try_get(7)?),
    })
}

const EVENTS_SQL: &str = "
SELECT id, event_type, created_at FROM events
WHERE project_id = $1 AND (created_at, id) > ($2, $3) AND created_at < $4
ORDER BY created_at, id LIMIT $5";

const ADVANCE_SQL: &str = "
UPDATE replays SET cursor_created_at = $2, cursor_event_id = $3, made = made + $4, events_done = events_done + $5,
       state = CASE WHEN $6 THEN 'completed' ELSE state END,
       finished_at = CASE WHEN $6 THEN now() END, updated_at = now()
WHERE id = $1";

/// Seconds until the next batch may run (0 when it may now), by the shared pace
/// (`replay_pace`, migration 0019).
const PACE_SQL: &str = "
SELECT CASE WHEN not_before > clock_timestamp() THEN EXTRACT(EPOCH FROM not_before - clock_timestamp()) ELSE 0 END::float8
FROM replay_pace";

/// A batch that made `$1` Deliveries moves the pace on by `$1 / max_per_second` seconds.
const PACE_ADVANCE_SQL: &str = "UPDATE replay_pace SET not_before = clock_timestamp() + make_interval(secs => $1::float8)";

/// What one [`step`] of the runner did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    /// A batch ran.
    Ran(Batch),
    /// The pace says the next batch may run in this long.
    NotBefore(std::time::Duration),
    /// Another process holds the runner's lock, or nothing runs.
    Idle,
}

/// One batch of at most `batch` Events of one running Replay, in one transaction (see the
/// module doc), with no pace. `None`: another process holds the runner's lock, or nothing
/// runs.
pub async fn run_batch(client: &mut deadpool_postgres::Client, batch: i64) -> Result<Option<Batch>, StoreError> {
    Ok(match step(client, batch, None).await? {
        Step::Ran(b) => Some(b),
        Step::NotBefore(_) | Step::Idle => None,
    })
}

/// The runner's step: under the runner's lock, when the shared pace allows it, one batch (as
/// [`run_batch`]); after it the pace moves on by `made / max_per_second` seconds, so all
/// Replays together make at most `max_per_second` Deliveries a second across every process.
pub async fn step(client: &mut deadpool_postgres::Client, batch: i64, max_per_second: Option<f64>) -> Result<Step, StoreError> {
    let tx = client.transaction().await?;
    let locked: bool = tx.query_one("SELECT pg_try_advisory_xact_lock($1)", &[&crate::locks::REPLAY.key]).await?.try_get(0)?;
    if !locked {
        return Ok(Step::Idle);
    }
    if max_per_second.is_some() {
        let wait: f64 = tx.query_one(PACE_SQL, &[]).await?.try_get(0)?;
        if wait > 0.0 {
            return Ok(Step::NotBefore(std::time::Duration::from_secs_f64(wait)));
        }
    }
    let Some(row) = tx.query_opt(PICK_SQL, &[]).await? else { return Ok(Step::Idle) };
    let r = running_from(&row)?;
    let events = tx.query(EVENTS_SQL, &[&r.project, &r.cursor.0, &r.cursor.1, &r.filter.to, &batch]).await?;
    let candidates = candidates(&tx, r.project, r.filter.endpoint_ids.as_deref()).await?;
    let targets = batch_targets(&events, &r.filter, &candidates)?;
    let made = insert_batch(&tx, r.id, r.project, &targets).await?;
    let finished = (events.len() as i64) < batch;
    let cursor = match events.last() {
        Some(e) => (e.try_get::<_, DateTime<Utc>>(2)?, e.try_get::<_, Uuid>(0)?),
        None => r.cursor,
    };
    tx.execute(ADVANCE_SQL, &[&r.id, &cursor.0, &cursor.1, &(made as i64), &(events.len() as i64), &finished]).await?;
    if let Some(rate) = max_per_second {
        tx.execute(PACE_ADVANCE_SQL, &[&(made as f64 / rate.max(0.001))]).await?;
    }
    tx.commit().await?;
    Ok(Step::Ran(Batch { replay: r.id, events: events.len() as u64, made, finished }))
}

/// The batch's Deliveries, in Event order.
fn batch_targets(events: &[Row], filter: &ReplayFilter, candidates: &[Candidate]) -> Result<Vec<ReplayTarget>, StoreError> {
    let mut by_type: HashMap<String, Vec<(EndpointId, SubscriptionId)>> = HashMap::new();
    let mut targets = Vec::new();
    for e in events {
        let raw: &str = e.try_get(1)?;
        let matched = by_type.entry(raw.to_string()).or_insert_with(|| match EventType::parse(raw) {
            Ok(t) if filter.wants(&t) => targets_of(&t, candidates).collect(),
            _ => Vec::new(),
        });
        let event = EventId(e.try_get(0)?);
        targets.extend(matched.iter().map(|&(endpoint, subscription)| ReplayTarget { event, endpoint, subscription }));
    }
    Ok(targets)
}
