//! `railhook replay`: start, follow, show and cancel Replays (the Time Machine) through a
//! running server's HTTP API (`/v1/replays`), with a project API key.
//!
//! Why the API and not the database like `railhook admin`: a Replay belongs to a Project,
//! and the key is what says which one and what its holder may do; the API applies the same
//! checks (range limit, one running Replay, Endpoints of this Project) for the CLI as for any
//! client, and the CLI needs no database credentials. `railhook admin` stays on the database
//! because it creates the tenancy the keys belong to.
//!
//! Following: one `GET /v1/replays/{id}` a second; on a terminal a progress bar redrawn in
//! place, otherwise one plain line per second. Ctrl-C stops the following only: the Replay
//! runs on in the workers (`railhook replay cancel` stops it).

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use railhook_config::Config;
use serde_json::{json, Value};

/// Exit status of a followed Replay that ended cancelled (completed is 0).
const EXIT_CANCELLED: u8 = 4;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The API's base URL. Default: http://<api.listen> of the configuration (0.0.0.0 as
    /// 127.0.0.1).
    #[arg(long, global = true, env = "RAILHOOK_API_URL", value_name = "URL")]
    api_url: Option<String>,
    #[command(subcommand)]
    command: ReplayCommand,
}

#[derive(Debug, Subcommand)]
pub enum ReplayCommand {
    /// Start a Replay of the Events stored in [--from, --to), or count it with --dry-run;
    /// then follow its progress until it completes (unless --no-follow).
    Create {
        /// Start of the range, inclusive (RFC 3339, e.g. 2026-12-01T00:00:00Z).
        #[arg(long, value_name = "TIME")]
        from: String,
        /// End of the range, exclusive (RFC 3339); later than now is taken as now.
        #[arg(long, value_name = "TIME")]
        to: String,
        /// Only Events of this type pattern (order.paid, order.*, order.**, **); repeatable.
        /// Default: every type.
        #[arg(long = "event-type", value_name = "PATTERN")]
        event_types: Vec<String>,
        /// Only to this Endpoint (ep_...); repeatable. Default: every Endpoint of the project.
        #[arg(long = "endpoint", value_name = "ID")]
        endpoints: Vec<String>,
        /// Count the Deliveries it would make; start nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        output: FollowArgs,
    },
    /// Show a Replay's progress; --follow waits until it completes or is cancelled.
    Status {
        /// The Replay (rpl_...).
        id: String,
        /// Follow the progress until the Replay ends.
        #[arg(long)]
        follow: bool,
        /// Print the Replay as JSON (when following: once, at the end).
        #[arg(long)]
        json: bool,
    },
    /// Cancel a running Replay: no Delivery is made after this returns; those made stay.
    Cancel {
        /// The Replay (rpl_...).
        id: String,
    },
    /// List the project's Replays, oldest first.
    List,
}

#[derive(Debug, Args)]
pub struct FollowArgs {
    /// Return once the Replay is started, without following it.
    #[arg(long)]
    no_follow: bool,
    /// Print the result as JSON (when following: once, at the end).
    #[arg(long)]
    json: bool,
}

/// The API as the CLI sees it: a base URL and a project key.
struct Api {
    base: String,
    key: String,
    http: reqwest::Client,
}

/// An error answer of the API, shown as the API wrote it.
fn api_error(status: reqwest::StatusCode, body: &Value) -> anyhow::Error {
    let e = &body["error"];
    match (e["code"].as_str(), e["message"].as_str()) {
        (Some(code), Some(message)) => match e["field"].as_str() {
            Some(field) => anyhow::anyhow!("{status}: {code}: {message} (field {field})"),
            None => anyhow::anyhow!("{status}: {code}: {message}"),
        },
        _ => anyhow::anyhow!("{status}: {body}"),
    }
}

impl Api {
    fn new(config: &Config, url: Option<&str>) -> anyhow::Result<Api> {
        let key = std::env::var("RAILHOOK_API_KEY").ok().filter(|k| !k.trim().is_empty()).context(
            "RAILHOOK_API_KEY is not set: export a project API key (rhk_...; `railhook admin create-api-key --project prj_...` makes one)",
        )?;
        let base = match url {
            Some(u) => u.trim_end_matches('/').to_string(),
            None => {
                let mut listen = config.api.listen;
                if listen.ip().is_unspecified() {
                    listen.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
                }
                format!("http://{listen}")
            }
        };
        let parsed = url::Url::parse(&base).with_context(|| format!("--api-url {base}: not a URL"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            bail!("--api-url {base}: the scheme must be http or https");
        }
        let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
        Ok(Api { base, key, http })
    }

    async fn send(&self, request: reqwest::RequestBuilder, what: &str) -> anyhow::Result<(reqwest::StatusCode, Value)> {
        let response = request.bearer_auth(&self.key).send().await.with_context(|| format!("{what}: no answer from {}", self.base))?;
        let status = response.status();
        let text = response.text().await.with_context(|| format!("{what}: reading the answer"))?;
        let body: Value = serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text));
        if status.is_success() {
            Ok((status, body))
        } else {
            Err(api_error(status, &body).context(what.to_string()))
        }
    }

    async fn get(&self, path: &str, what: &str) -> anyhow::Result<Value> {
        Ok(self.send(self.http.get(format!("{}{path}", self.base)), what).await?.1)
    }

    async fn post(&self, path: &str, body: &Value, what: &str) -> anyhow::Result<Value> {
        Ok(self.send(self.http.post(format!("{}{path}", self.base)).json(body), what).await?.1)
    }
}

/// A Replay id as the API's path wants it (checked here for a precise error; the API checks
/// it again).
fn replay_id(id: &str) -> anyhow::Result<String> {
    let parsed: railhook_core::ReplayId = id.trim().parse().map_err(|e| anyhow::anyhow!("'{id}' is not a Replay id (rpl_...): {e}"))?;
    Ok(parsed.to_string())
}

/// An RFC 3339 time, normalised to UTC.
fn rfc3339(flag: &str, raw: &str) -> anyhow::Result<String> {
    let t = chrono::DateTime::parse_from_rfc3339(raw.trim()).with_context(|| format!("{flag} '{raw}': not an RFC 3339 time such as 2026-12-01T00:00:00Z"))?;
    Ok(t.with_timezone(&chrono::Utc).to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
}

pub async fn run(config: &Config, args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(config, args.api_url.as_deref())?;
    match args.command {
        ReplayCommand::Create { from, to, event_types, endpoints, dry_run, output } => {
            let mut body = json!({"from": rfc3339("--from", &from)?, "to": rfc3339("--to", &to)?, "dry_run": dry_run});
            if !event_types.is_empty() {
                body["event_types"] = json!(event_types);
            }
            if !endpoints.is_empty() {
                body["endpoint_ids"] = json!(endpoints);
            }
            let answer = api.post("/v1/replays", &body, "starting the replay").await?;
            if dry_run {
                if output.json {
                    println!("{}", serde_json::to_string_pretty(&answer)?);
                } else {
                    let capped = if answer["capped"].as_bool() == Some(true) { " at least (the count stopped at its cap)" } else { "" };
                    println!("would make {} Deliveries from {} Events{capped}; nothing started", n(&answer["deliveries"]), n(&answer["events"]));
                }
                return Ok(ExitCode::SUCCESS);
            }
            let id = answer["id"].as_str().context("the API answered a Replay without an id")?.to_string();
            if output.no_follow {
                if output.json {
                    println!("{}", serde_json::to_string_pretty(&answer)?);
                } else {
                    println!("started replay {id}: {} Deliveries to make; follow it with `railhook replay status {id} --follow`", n(&answer["total"]));
                }
                return Ok(ExitCode::SUCCESS);
            }
            if !output.json {
                eprintln!("started replay {id}: {} Deliveries to make (Ctrl-C stops following; the replay runs on)", n(&answer["total"]));
            }
            follow(&api, &id, output.json).await
        }
        ReplayCommand::Status { id, follow: true, json } => follow(&api, &replay_id(&id)?, json).await,
        ReplayCommand::Status { id, follow: false, json } => {
            let replay = api.get(&format!("/v1/replays/{}", replay_id(&id)?), "reading the replay").await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&replay)?);
            } else {
                println!("{}", Progress::of(&replay).line(None));
            }
            Ok(ExitCode::SUCCESS)
        }
        ReplayCommand::Cancel { id } => {
            let replay = api.post(&format!("/v1/replays/{}/cancel", replay_id(&id)?), &json!({}), "cancelling the replay").await?;
            println!("{}", Progress::of(&replay).line(None));
            Ok(ExitCode::SUCCESS)
        }
        ReplayCommand::List => {
            let mut cursor: Option<String> = None;
            loop {
                let path = match &cursor {
                    Some(c) => format!("/v1/replays?limit=200&cursor={c}"),
                    None => "/v1/replays?limit=200".to_string(),
                };
                let page = api.get(&path, "listing replays").await?;
                for r in page["data"].as_array().into_iter().flatten() {
                    println!("{}", Progress::of(r).line(None));
                }
                match page["next_cursor"].as_str() {
                    Some(c) => cursor = Some(c.to_string()),
                    None => return Ok(ExitCode::SUCCESS),
                }
            }
        }
    }
}

/// A count with thousands separators (a missing one as "?").
fn n(v: &Value) -> String {
    let Some(x) = v.as_i64() else { return "?".into() };
    let digits = x.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if x < 0 {
        out.insert(0, '-');
    }
    out
}

/// What a progress line shows of a Replay.
struct Progress<'a> {
    id: &'a str,
    state: &'a str,
    made: i64,
    total: i64,
    events_done: i64,
}

impl<'a> Progress<'a> {
    fn of(r: &'a Value) -> Progress<'a> {
        Progress {
            id: r["id"].as_str().unwrap_or("?"),
            state: r["state"].as_str().unwrap_or("?"),
            made: r["made"].as_i64().unwrap_or(0),
            total: r["total"].as_i64().unwrap_or(0),
            events_done: r["events_done"].as_i64().unwrap_or(0),
        }
    }

    fn done(&self) -> bool {
        self.state != "running"
    }

    /// Percent of `total` made; a completed Replay is 100 whatever the count said.
    fn percent(&self) -> f64 {
        match (self.state, self.total) {
            ("completed", _) => 100.0,
            (_, t) if t <= 0 => 0.0,
            (_, t) => (self.made as f64 / t as f64 * 100.0).min(100.0),
        }
    }

    fn line(&self, rate: Option<f64>) -> String {
        let rate = rate.map(|r| format!(", {r:.0} Deliveries/s")).unwrap_or_default();
        format!(
            "replay {} {}: {} of {} Deliveries made ({:.1} %), {} Events done{rate}",
            self.id, self.state, n(&json!(self.made)), n(&json!(self.total)), self.percent(), n(&json!(self.events_done))
        )
    }

    fn bar(&self, rate: Option<f64>) -> String {
        const WIDTH: usize = 30;
        let filled = ((self.percent() / 100.0) * WIDTH as f64).round() as usize;
        let rate = rate.map(|r| format!(" {r:.0}/s")).unwrap_or_default();
        format!(
            "[{}{}] {:>5.1} % {}/{} Deliveries, {} Events{rate} {}",
            "#".repeat(filled.min(WIDTH)), "-".repeat(WIDTH - filled.min(WIDTH)), self.percent(),
            n(&json!(self.made)), n(&json!(self.total)), n(&json!(self.events_done)), self.state
        )
    }
}

/// Polls the Replay each second until it is no longer running. Completed: exit 0; cancelled:
/// [`EXIT_CANCELLED`].
async fn follow(api: &Api, id: &str, as_json: bool) -> anyhow::Result<ExitCode> {
    let tty = !as_json && std::io::stderr().is_terminal();
    let path = format!("/v1/replays/{id}");
    let mut last: Option<(Instant, i64)> = None;
    let mut rate: Option<f64> = None;
    loop {
        let replay = api.get(&path, "reading the replay").await?;
        let p = Progress::of(&replay);
        let now = Instant::now();
        if let Some((at, made)) = last {
            let secs = now.duration_since(at).as_secs_f64();
            if secs > 0.0 {
                rate = Some((p.made - made).max(0) as f64 / secs);
            }
        }
        last = Some((now, p.made));
        if tty {
            eprint!("\r\x1b[2K{}", p.bar(rate));
            std::io::stderr().flush().ok();
        } else if !as_json {
            println!("{}", p.line(rate));
        }
        if p.done() {
            if tty {
                eprintln!();
                println!("{}", p.line(None));
            }
            if as_json {
                println!("{}", serde_json::to_string_pretty(&replay)?);
            }
            return Ok(if p.state == "completed" { ExitCode::SUCCESS } else { ExitCode::from(EXIT_CANCELLED) });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_have_separators() {
        assert_eq!(n(&json!(0)), "0");
        assert_eq!(n(&json!(999)), "999");
        assert_eq!(n(&json!(1000)), "1,000");
        assert_eq!(n(&json!(100000)), "100,000");
        assert_eq!(n(&json!(-1234567)), "-1,234,567");
        assert_eq!(n(&json!("x")), "?");
    }

    #[test]
    fn ids_and_times_are_checked_before_the_request() {
        let id = railhook_core::ReplayId::new().to_string();
        assert_eq!(replay_id(&format!(" {id} ")).unwrap(), id);
        assert!(replay_id("ep_0123").is_err());
        assert!(replay_id("rpl_../x").is_err());
        assert_eq!(rfc3339("--from", "2026-12-01T01:00:00+01:00").unwrap(), "2026-12-01T00:00:00Z");
        let e = rfc3339("--from", "yesterday").unwrap_err().to_string();
        assert!(e.contains("--from 'yesterday'"), "{e}");
    }

    #[test]
    fn the_bar_fills_with_progress() {
        let r = json!({"id": "rpl_x", "state": "running", "made": 50, "total": 100, "events_done": 50});
        let bar = Progress::of(&r).bar(Some(10.0));
        assert!(bar.starts_with("[###############---------------]  50.0 %"), "{bar}");
        let done = json!({"id": "rpl_x", "state": "completed", "made": 0, "total": 0, "events_done": 0});
        assert_eq!(Progress::of(&done).percent(), 100.0);
    }
}
