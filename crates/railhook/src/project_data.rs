//! `railhook admin project export|erase`: a Project's data for the customers who ask under
//! GDPR (issue 17), straight on the database like the other `admin` commands.
//!
//! Export: JSON Lines, one object per row with a `type` (`organization`, `project`,
//! `api_key`, `endpoint`, `subscription`, `event`, `delivery`, `attempt`, `source`,
//! `destination`, `incoming_event`, `forward`, `replay`, and with `--include-secrets` also
//! `endpoint_secret` and `source_secret`), ids shown as the API shows them (`evt_...`). One
//! REPEATABLE READ, READ ONLY transaction, so the file is one consistent snapshot; each kind is
//! read through a portal (a server-side cursor) [`FETCH`] rows at a time, so memory stays
//! bounded whatever the Project's size. Without `--include-secrets` nothing that authenticates
//! is written: no signing secret (endpoint or source), no ingress token, no API key hash, no
//! Destination credentials (only their `type`), no header values of Endpoints or Destinations
//! (the names stay, values read `<redacted>`). Rows are whole (`to_jsonb`), so columns added
//! by later migrations are exported too.
//!
//! Erase: everything of the Project, in batches of [`ERASE_BATCH`] rows, each batch its own
//! short transaction, children before parents (so no `ON DELETE CASCADE` ever turns one
//! statement into an unbounded one), the `projects` row last. First the API keys go (no new
//! Event can arrive) and running Replays are cancelled. Every step deletes "what is left", so
//! a run killed anywhere is finished by running it again. Tables with a `project_id` column
//! this module does not know (added by later migrations) are emptied of the Project's rows
//! first, found through `information_schema`. The Organization stays (it may hold other
//! Projects).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use railhook_config::Config;
use railhook_core::{
    ApiKeyId, AttemptId, DeliveryId, DestinationId, EndpointId, EventId, ForwardId, IncomingEventId, OrganizationId, ProjectId, ReplayId, SourceId,
    SubscriptionId,
};
use serde_json::Value;
use tokio_postgres::Client;
use uuid::Uuid;

/// Rows a portal hands over at a time during an export.
pub const FETCH: i32 = 1_000;
/// Rows one erase batch deletes at most (per table; a Delivery batch also deletes its Attempts).
pub const ERASE_BATCH: i64 = 1_000;

#[derive(Debug, Subcommand)]
pub enum ProjectCommand {
    /// Write everything of a project as JSON Lines (one object per row, with a `type`), one
    /// consistent snapshot, streamed with bounded memory. Secrets are left out unless
    /// --include-secrets.
    Export {
        /// The project (proj_...).
        project: String,
        /// Write to FILE (FILE.partial until complete, then renamed) instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Also export signing secrets, ingress tokens, Destination credentials and header
        /// values.
        #[arg(long)]
        include_secrets: bool,
    },
    /// Delete everything of a project, in short batches, the project row last. Safe to run
    /// again after an interruption (it finishes the work). The organization stays.
    Erase {
        /// The project (proj_...).
        project: String,
        /// Required: erasing is not undoable.
        #[arg(long)]
        confirm: bool,
    },
}

pub async fn run(config: &Config, command: ProjectCommand) -> anyhow::Result<ExitCode> {
    match command {
        ProjectCommand::Export { project, out, include_secrets } => {
            let project = parse_project(&project)?;
            let mut client = connect(config).await?;
            export_to(&mut client, project, out.as_deref(), include_secrets).await
        }
        ProjectCommand::Erase { project, confirm } => {
            let project = parse_project(&project)?;
            if !confirm {
                eprintln!("erasing project {project} deletes all its data and cannot be undone; run again with --confirm");
                return Ok(ExitCode::from(2));
            }
            let client = connect(config).await?;
            let Some(report) = erase(&client, project, ERASE_BATCH, |table, n| eprintln!("deleted {n} rows of {table}")).await? else {
                eprintln!("project {project} does not exist (erased already, or a wrong id)");
                return Ok(ExitCode::from(3));
            };
            let total: u64 = report.iter().map(|(_, n)| n).sum();
            println!("erased project {project}: {total} rows");
            for (table, n) in report.iter().filter(|(_, n)| *n > 0) {
                println!("  {table:<24} {n}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn parse_project(raw: &str) -> anyhow::Result<ProjectId> {
    raw.trim().parse().map_err(|e| anyhow::anyhow!("'{raw}' is not a project id (proj_...): {e}"))
}

async fn connect(config: &Config) -> anyhow::Result<Client> {
    let (client, _connection) = railhook_store::connect_as(&config.database.url, railhook_store::application::CLI)
        .await
        .with_context(|| format!("connecting to {}", railhook_config::redact_url(&config.database.url)))?;
    Ok(client)
}

// ---- Export -------------------------------------------------------------------------------

/// One kind of row: its `type` and the query giving one JSON object per row (`$1`: project).
struct Kind {
    kind: &'static str,
    sql: &'static str,
    /// Only with `--include-secrets`.
    secret: bool,
}

/// Header values replaced by `<redacted>` (the names stay).
macro_rules! redacted_headers {
    ($col:literal) => {
        concat!("COALESCE((SELECT jsonb_object_agg(k, '<redacted>') FROM jsonb_object_keys(", $col, ") k), '{}'::jsonb)")
    };
}

/// In export order. The big tables are read in their physical order (no sort).
const KINDS: &[Kind] = &[
    Kind { kind: "organization", secret: false, sql: "SELECT to_jsonb(o)::text FROM organizations o JOIN projects p ON p.organization_id = o.id WHERE p.id = $1" },
    Kind { kind: "project", secret: false, sql: "SELECT to_jsonb(p)::text FROM projects p WHERE p.id = $1" },
    Kind { kind: "api_key", secret: false, sql: "SELECT (to_jsonb(k) - 'secret_sha256')::text FROM api_keys k WHERE k.project_id = $1 ORDER BY k.id" },
    Kind {
        kind: "endpoint",
        secret: false,
        sql: concat!("SELECT (to_jsonb(e) || jsonb_build_object('headers', ", redacted_headers!("e.headers"), "))::text FROM endpoints e WHERE e.project_id = $1 ORDER BY e.id"),
    },
    Kind { kind: "endpoint", secret: true, sql: "SELECT to_jsonb(e)::text FROM endpoints e WHERE e.project_id = $1 ORDER BY e.id" },
    Kind {
        kind: "endpoint_secret",
        secret: true,
        sql: "SELECT (to_jsonb(s) || jsonb_build_object('project_id', e.project_id))::text FROM endpoint_secrets s JOIN endpoints e ON e.id = s.endpoint_id WHERE e.project_id = $1 ORDER BY s.endpoint_id, s.created_at",
    },
    Kind { kind: "subscription", secret: false, sql: "SELECT to_jsonb(s)::text FROM subscriptions s WHERE s.project_id = $1 ORDER BY s.id" },
    Kind { kind: "source", secret: false, sql: "SELECT (to_jsonb(s) - 'secret' - 'ingress_token')::text FROM sources s WHERE s.project_id = $1 ORDER BY s.id" },
    Kind { kind: "source", secret: true, sql: "SELECT to_jsonb(s)::text FROM sources s WHERE s.project_id = $1 ORDER BY s.id" },
    Kind {
        kind: "source_secret",
        secret: true,
        sql: "SELECT (to_jsonb(r) || jsonb_build_object('project_id', s.project_id))::text FROM source_retired_secrets r JOIN sources s ON s.id = r.source_id WHERE s.project_id = $1 ORDER BY r.source_id, r.expires_at",
    },
    Kind {
        kind: "destination",
        secret: false,
        sql: concat!(
            "SELECT (to_jsonb(d) || jsonb_build_object('auth', jsonb_build_object('type', d.auth->'type'), 'headers', ",
            redacted_headers!("d.headers"),
            "))::text FROM destinations d WHERE d.project_id = $1 ORDER BY d.id"
        ),
    },
    Kind { kind: "destination", secret: true, sql: "SELECT to_jsonb(d)::text FROM destinations d WHERE d.project_id = $1 ORDER BY d.id" },
    Kind { kind: "event", secret: false, sql: "SELECT to_jsonb(e)::text FROM events e WHERE e.project_id = $1" },
    Kind { kind: "delivery", secret: false, sql: "SELECT to_jsonb(d)::text FROM deliveries d WHERE d.project_id = $1" },
    Kind { kind: "attempt", secret: false, sql: "SELECT to_jsonb(a)::text FROM attempts a WHERE a.project_id = $1" },
    Kind { kind: "incoming_event", secret: false, sql: "SELECT to_jsonb(i)::text FROM incoming_events i WHERE i.project_id = $1" },
    Kind { kind: "forward", secret: false, sql: "SELECT to_jsonb(f)::text FROM forwards f WHERE f.project_id = $1" },
    Kind { kind: "replay", secret: false, sql: "SELECT to_jsonb(r)::text FROM replays r WHERE r.project_id = $1 ORDER BY r.id" },
];

/// The kinds one export writes: for a kind with a secret-bearing variant, exactly one of them.
fn kinds(include_secrets: bool) -> impl Iterator<Item = &'static Kind> {
    KINDS.iter().filter(move |k| {
        let has_secret_variant = KINDS.iter().any(|o| o.kind == k.kind && o.secret);
        let has_plain_variant = KINDS.iter().any(|o| o.kind == k.kind && !o.secret);
        if include_secrets {
            k.secret || !has_secret_variant
        } else {
            !k.secret && has_plain_variant
        }
    })
}

async fn export_to(client: &mut Client, project: ProjectId, out: Option<&Path>, include_secrets: bool) -> anyhow::Result<ExitCode> {
    let Some(out) = out else {
        let stdout = std::io::stdout();
        let mut w = std::io::BufWriter::new(stdout.lock());
        let counts = export(client, project, &mut w, include_secrets).await?;
        w.flush()?;
        return finish(project, counts, None);
    };
    let partial = PathBuf::from(format!("{}.partial", out.display()));
    let file = std::fs::File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let mut w = std::io::BufWriter::new(file);
    let counts = match export(client, project, &mut w, include_secrets).await {
        Ok(c) => c,
        Err(e) => {
            drop(w);
            std::fs::remove_file(&partial).ok();
            return Err(e);
        }
    };
    w.into_inner().map_err(|e| e.into_error()).and_then(|f| f.sync_all()).with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, out).with_context(|| format!("renaming {} to {}", partial.display(), out.display()))?;
    finish(project, counts, Some(out))
}

fn finish(project: ProjectId, counts: Option<Vec<(&'static str, u64)>>, out: Option<&Path>) -> anyhow::Result<ExitCode> {
    let Some(counts) = counts else {
        eprintln!("project {project} does not exist");
        return Ok(ExitCode::from(3));
    };
    let total: u64 = counts.iter().map(|(_, n)| n).sum();
    let by_kind: Vec<String> = counts.iter().filter(|(_, n)| *n > 0).map(|(k, n)| format!("{k} {n}")).collect();
    let to = out.map(|p| p.display().to_string()).unwrap_or_else(|| "stdout".into());
    eprintln!("exported project {project} to {to}: {total} rows ({})", by_kind.join(", "));
    Ok(ExitCode::SUCCESS)
}

/// Writes the export to `w`; `None` when the project does not exist (nothing written).
pub async fn export(client: &mut Client, project: ProjectId, w: &mut impl Write, include_secrets: bool) -> anyhow::Result<Option<Vec<(&'static str, u64)>>> {
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .context("starting the export's snapshot")?;
    if tx.query_opt("SELECT 1 FROM projects WHERE id = $1", &[&project]).await?.is_none() {
        return Ok(None);
    }
    let mut counts = Vec::new();
    for kind in kinds(include_secrets) {
        let statement = tx.prepare(kind.sql).await.with_context(|| format!("preparing the {} query", kind.kind))?;
        let portal = tx.bind(&statement, &[&project]).await?;
        let mut n = 0u64;
        loop {
            let rows = tx.query_portal(&portal, FETCH).await.with_context(|| format!("reading {} rows", kind.kind))?;
            if rows.is_empty() {
                break;
            }
            for row in &rows {
                let text: &str = row.try_get(0)?;
                let line = export_line(kind.kind, text)?;
                w.write_all(line.as_bytes()).context("writing the export")?;
                w.write_all(b"\n").context("writing the export")?;
                n += 1;
            }
        }
        counts.push((kind.kind, n));
    }
    tx.commit().await?;
    Ok(Some(counts))
}

/// One row as its export line: `type` first, then the row with its ids as the API shows them.
fn export_line(kind: &str, row: &str) -> anyhow::Result<String> {
    let Value::Object(fields) = serde_json::from_str::<Value>(row).with_context(|| format!("a {kind} row is not JSON"))? else {
        anyhow::bail!("a {kind} row is not a JSON object");
    };
    let mut out = serde_json::Map::with_capacity(fields.len() + 1);
    out.insert("type".into(), Value::String(kind.to_string()));
    for (key, value) in fields {
        let value = match (id_prefix(kind, &key), value) {
            (Some(prefix), Value::String(s)) => Value::String(show_id(prefix, &s).unwrap_or(s)),
            (Some(prefix), Value::Array(items)) => Value::Array(
                items.into_iter().map(|v| match v {
                    Value::String(s) => Value::String(show_id(prefix, &s).unwrap_or(s)),
                    other => other,
                }).collect(),
            ),
            (_, v) => v,
        };
        out.insert(key, value);
    }
    Ok(serde_json::to_string(&Value::Object(out))?)
}

/// The prefix of the id in column `key` of a `kind` row, if it holds one.
fn id_prefix(kind: &str, key: &str) -> Option<&'static str> {
    let of_kind = |k: &str| -> Option<&'static str> {
        Some(match k {
            "organization" => "org",
            "project" => "proj",
            "api_key" => "key",
            "endpoint" => "ep",
            "subscription" => "sub",
            "event" => "evt",
            "delivery" => "dlv",
            "attempt" => "att",
            "source" => "src",
            "destination" => "dst",
            "incoming_event" => "ine",
            "forward" => "fwd",
            "replay" => "rpl",
            _ => return None,
        })
    };
    match key {
        "id" => of_kind(kind),
        "replay_of" => Some("dlv"),
        "endpoint_ids" => Some("ep"),
        k => of_kind(k.strip_suffix("_id")?),
    }
}

fn show_id(prefix: &str, raw: &str) -> Option<String> {
    let u: Uuid = raw.parse().ok()?;
    Some(match prefix {
        "org" => OrganizationId(u).to_string(),
        "proj" => ProjectId(u).to_string(),
        "key" => ApiKeyId(u).to_string(),
        "ep" => EndpointId(u).to_string(),
        "sub" => SubscriptionId(u).to_string(),
        "evt" => EventId(u).to_string(),
        "dlv" => DeliveryId(u).to_string(),
        "att" => AttemptId(u).to_string(),
        "src" => SourceId(u).to_string(),
        "dst" => DestinationId(u).to_string(),
        "ine" => IncomingEventId(u).to_string(),
        "fwd" => ForwardId(u).to_string(),
        "rpl" => ReplayId(u).to_string(),
        _ => return None,
    })
}

// ---- Erase --------------------------------------------------------------------------------

/// Tables [`erase`] empties by name (in its own order); others with a `project_id` column are
/// emptied generically before them.
const KNOWN: &[&str] = &[
    "api_keys", "outbox", "attempts", "deliveries", "forwards", "incoming_events", "events", "replays", "subscriptions", "claim_rates",
    "endpoints", "destinations", "sources",
];

// Each batch statement deletes up to `$2` rows of the project `$1` and answers the count.
const OUTBOX_SQL: &str = "WITH x AS (DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE project_id = $1 LIMIT $2) RETURNING 1) SELECT count(*) FROM x";
const EVENTS_SQL: &str = "WITH x AS (DELETE FROM events WHERE id IN (SELECT id FROM events WHERE project_id = $1 ORDER BY project_id, created_at, id LIMIT $2) RETURNING 1) SELECT count(*) FROM x";
const SUBSCRIPTIONS_SQL: &str = "WITH x AS (DELETE FROM subscriptions WHERE id IN (SELECT id FROM subscriptions WHERE project_id = $1 ORDER BY project_id, id LIMIT $2::bigint / 100 + 1) RETURNING 1) SELECT count(*) FROM x";
const DESTINATIONS_SQL: &str = "WITH x AS (DELETE FROM destinations WHERE id IN (SELECT id FROM destinations WHERE project_id = $1 ORDER BY project_id, source_id, id LIMIT $2::bigint / 100 + 1) RETURNING 1) SELECT count(*) FROM x";
const REPLAYS_SQL: &str = "WITH x AS (DELETE FROM replays WHERE id IN (SELECT id FROM replays WHERE project_id = $1 ORDER BY project_id, id LIMIT $2) RETURNING 1) SELECT count(*) FROM x";
const API_KEYS_SQL: &str = "WITH x AS (DELETE FROM api_keys WHERE id IN (SELECT id FROM api_keys WHERE project_id = $1 ORDER BY project_id, id LIMIT $2) RETURNING 1) SELECT count(*) FROM x";
/// Endpoints and Sources take their secrets, circuits and ordering rows along by cascade (a
/// few rows each), and each deleted Endpoint, Subscription or Destination costs Postgres a
/// scan of `deliveries` or `forwards` for its foreign key (no index on those columns; their
/// rows of this project are gone by then): a hundredth of a batch at a time.
const ENDPOINTS_SQL: &str = "WITH x AS (DELETE FROM endpoints WHERE id IN (SELECT id FROM endpoints WHERE project_id = $1 ORDER BY project_id, id LIMIT $2::bigint / 100 + 1) RETURNING 1) SELECT count(*) FROM x";
const SOURCES_SQL: &str = "WITH x AS (DELETE FROM sources WHERE id IN (SELECT id FROM sources WHERE project_id = $1 ORDER BY project_id, id LIMIT $2::bigint / 100 + 1) RETURNING 1) SELECT count(*) FROM x";
/// The rate windows of the project and its Endpoints (keyed by id, no foreign key).
const CLAIM_RATES_SQL: &str = "WITH x AS (DELETE FROM claim_rates WHERE (kind = 'project' AND id = $1)
       OR (kind = 'endpoint' AND id IN (SELECT id FROM endpoints WHERE project_id = $1 ORDER BY project_id, id LIMIT $2)) RETURNING 1) SELECT count(*) FROM x";

/// Deletes everything of `project` (see the module doc); `progress(table, rows)` after each
/// batch that deleted something. Returns the rows deleted per table, or `None` when the
/// project does not exist.
pub async fn erase(client: &Client, project: ProjectId, batch: i64, mut progress: impl FnMut(&str, u64)) -> anyhow::Result<Option<Vec<(String, u64)>>> {
    if client.query_opt("SELECT 1 FROM projects WHERE id = $1", &[&project]).await?.is_none() {
        return Ok(None);
    }
    let mut report: Vec<(String, u64)> = Vec::new();
    let mut add = |report: &mut Vec<(String, u64)>, table: &str, n: u64| {
        if n > 0 {
            progress(table, n);
        }
        match report.iter_mut().find(|(t, _)| t == table) {
            Some((_, total)) => *total += n,
            None => report.push((table.to_string(), n)),
        }
    };
    // No new Event (API keys) and no new Replay batch from here on.
    let n = repeat(client, API_KEYS_SQL, project, batch).await?;
    add(&mut report, "api_keys", n);
    client.execute("UPDATE replays SET state = 'cancelled', finished_at = now(), updated_at = now() WHERE project_id = $1 AND state = 'running'", &[&project]).await?;

    for table in other_tables(client).await? {
        let n = repeat_other(client, &table, project, batch).await?;
        add(&mut report, &table, n);
    }
    let n = repeat(client, OUTBOX_SQL, project, batch).await?;
    add(&mut report, "outbox", n);
    loop {
        let (deliveries, attempts) = delivery_batch(client, project, batch).await?;
        add(&mut report, "attempts", attempts);
        add(&mut report, "deliveries", deliveries);
        if deliveries == 0 {
            break;
        }
    }
    loop {
        let (incoming, forwards, attempts) = incoming_batch(client, project, batch).await?;
        add(&mut report, "attempts", attempts);
        add(&mut report, "forwards", forwards);
        add(&mut report, "incoming_events", incoming);
        if incoming == 0 {
            break;
        }
    }
    // Attempts and Forwards that lost their parent row some other way (none are expected).
    let n = repeat(client, "WITH x AS (DELETE FROM forwards WHERE id IN (SELECT id FROM forwards WHERE project_id = $1 LIMIT $2) RETURNING 1) SELECT count(*) FROM x", project, batch).await?;
    add(&mut report, "forwards", n);
    let n = repeat(client, "WITH x AS (DELETE FROM attempts WHERE id IN (SELECT id FROM attempts WHERE project_id = $1 LIMIT $2) RETURNING 1) SELECT count(*) FROM x", project, batch).await?;
    add(&mut report, "attempts", n);
    for (table, sql) in [
        ("events", EVENTS_SQL),
        ("replays", REPLAYS_SQL),
        ("subscriptions", SUBSCRIPTIONS_SQL),
        ("claim_rates", CLAIM_RATES_SQL),
        ("endpoints", ENDPOINTS_SQL),
        ("destinations", DESTINATIONS_SQL),
        ("sources", SOURCES_SQL),
    ] {
        let n = repeat(client, sql, project, batch).await?;
        add(&mut report, table, n);
    }
    let n = client.execute("DELETE FROM projects WHERE id = $1", &[&project]).await.context("deleting the project row")?;
    add(&mut report, "projects", n);
    Ok(Some(report))
}

/// Runs a batch statement until it deletes nothing; the rows deleted in all.
async fn repeat(client: &Client, sql: &str, project: ProjectId, batch: i64) -> anyhow::Result<u64> {
    let statement = client.prepare(sql).await.with_context(|| format!("preparing {sql}"))?;
    let mut total = 0u64;
    loop {
        let n: i64 = client.query_one(&statement, &[&project, &batch]).await.with_context(|| format!("erasing: {sql}"))?.try_get(0)?;
        total += n as u64;
        if n == 0 {
            return Ok(total);
        }
    }
}

/// Base tables (not partitions) of the current schema with a `project_id` column that
/// [`KNOWN`] does not name.
async fn other_tables(client: &Client) -> anyhow::Result<Vec<String>> {
    let rows = client
        .query(
            "SELECT c.table_name::text FROM information_schema.columns c
             JOIN pg_class k ON k.relname = c.table_name AND k.relnamespace = to_regnamespace(c.table_schema)
             WHERE c.table_schema = current_schema() AND c.column_name = 'project_id'
               AND k.relkind IN ('r', 'p') AND NOT k.relispartition AND c.table_name <> ALL($1)
             ORDER BY 1",
            &[&KNOWN],
        )
        .await?;
    Ok(rows.iter().map(|r| r.try_get(0)).collect::<Result<_, _>>()?)
}

async fn repeat_other(client: &Client, table: &str, project: ProjectId, batch: i64) -> anyhow::Result<u64> {
    let has_id: bool = client
        .query_one("SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1 AND column_name = 'id')", &[&table])
        .await?
        .try_get(0)?;
    let t = format!("\"{}\"", table.replace('"', "\"\""));
    // By id where there is one (unique across partitions); otherwise by ctid, still within
    // the project's rows.
    let key = if has_id { "id" } else { "ctid" };
    let sql = format!("WITH x AS (DELETE FROM {t} WHERE project_id = $1 AND {key} = ANY(ARRAY(SELECT {key} FROM {t} WHERE project_id = $1 LIMIT $2)) RETURNING 1) SELECT count(*) FROM x");
    repeat(client, &sql, project, batch).await
}

/// One batch of Deliveries with their Attempts, in one transaction: (deliveries, attempts).
async fn delivery_batch(client: &Client, project: ProjectId, batch: i64) -> anyhow::Result<(u64, u64)> {
    client.batch_execute("BEGIN").await?;
    let result = async {
        let ids: Vec<Uuid> = client
            .query("SELECT id FROM deliveries WHERE project_id = $1 ORDER BY project_id, created_at, id LIMIT $2", &[&project, &batch])
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        if ids.is_empty() {
            return Ok::<_, anyhow::Error>((0, 0));
        }
        let attempts = client.execute("DELETE FROM attempts WHERE delivery_id = ANY($1)", &[&ids]).await?;
        let deliveries = client.execute("DELETE FROM deliveries WHERE id = ANY($1)", &[&ids]).await?;
        Ok((deliveries, attempts))
    }
    .await;
    finish_tx(client, result).await.context("erasing a batch of deliveries")
}

/// One batch of Incoming Events with their Forwards and those Forwards' Attempts:
/// (incoming events, forwards, attempts).
async fn incoming_batch(client: &Client, project: ProjectId, batch: i64) -> anyhow::Result<(u64, u64, u64)> {
    client.batch_execute("BEGIN").await?;
    let result = async {
        let ids: Vec<Uuid> = client
            .query("SELECT id FROM incoming_events WHERE project_id = $1 ORDER BY project_id, id LIMIT $2", &[&project, &(batch / 10 + 1)])
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        if ids.is_empty() {
            return Ok::<_, anyhow::Error>((0, 0, 0));
        }
        let forwards: Vec<Uuid> = client.query("SELECT id FROM forwards WHERE incoming_event_id = ANY($1)", &[&ids]).await?.iter().map(|r| r.try_get(0)).collect::<Result<_, _>>()?;
        let attempts = client.execute("DELETE FROM attempts WHERE forward_id = ANY($1)", &[&forwards]).await?;
        let forwards = client.execute("DELETE FROM forwards WHERE id = ANY($1)", &[&forwards]).await?;
        let incoming = client.execute("DELETE FROM incoming_events WHERE id = ANY($1)", &[&ids]).await?;
        Ok((incoming, forwards, attempts))
    }
    .await;
    finish_tx(client, result).await.context("erasing a batch of incoming events")
}

async fn finish_tx<T>(client: &Client, result: anyhow::Result<T>) -> anyhow::Result<T> {
    match result {
        Ok(v) => {
            client.batch_execute("COMMIT").await?;
            Ok(v)
        }
        Err(e) => {
            client.batch_execute("ROLLBACK").await.ok();
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_variant_of_each_kind() {
        let plain: Vec<&str> = kinds(false).map(|k| k.kind).collect();
        let with: Vec<&str> = kinds(true).map(|k| k.kind).collect();
        for list in [&plain, &with] {
            let mut sorted = list.to_vec();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), list.len(), "{list:?}");
        }
        assert!(!plain.contains(&"endpoint_secret") && !plain.contains(&"source_secret"));
        assert!(with.contains(&"endpoint_secret") && with.contains(&"source_secret"));
        assert_eq!(plain.len() + 2, with.len());
    }

    #[test]
    fn ids_are_shown_as_the_api_shows_them() {
        let u = Uuid::now_v7();
        let row = serde_json::json!({"id": u, "project_id": u, "replay_of": u, "claim_token": u, "endpoint_ids": [u], "n": 1}).to_string();
        let line: Value = serde_json::from_str(&export_line("delivery", &row).unwrap()).unwrap();
        assert_eq!(line["type"], "delivery");
        assert!(line["id"].as_str().unwrap().starts_with("dlv_"));
        assert!(line["project_id"].as_str().unwrap().starts_with("proj_"));
        assert!(line["replay_of"].as_str().unwrap().starts_with("dlv_"));
        assert!(line["endpoint_ids"][0].as_str().unwrap().starts_with("ep_"));
        assert_eq!(line["claim_token"], u.to_string());
        assert!(export_line("event", "[1]").is_err());
    }
}
