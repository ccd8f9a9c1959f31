//! The components as real processes of the `railhook` binary, each under a supervisor: a
//! process that is killed (by the fault controller) or exits on its own is started again
//! after a short delay, with the same configuration and ports. The controller may also hold
//! a process stopped (SIGTERM) until it resumes it, and start it again with other
//! environment variables (a failpoint), or without them again.
//!
//! A [`Supervised`] is a handle: its clones order the same supervisor. On the inline
//! transport one `railhook all` process is the run's api, relay and worker at once, so the
//! stack lists a clone of its handle in each role.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

/// What a supervisor saw of its process.
#[derive(Debug, Default, Clone, Serialize)]
pub struct ProcessStats {
    pub starts: u32,
    pub kills: u32,
    /// Exits nobody asked for (a crash, a fatal error): a finding in itself.
    pub unexpected_exits: Vec<String>,
}

enum Order {
    Kill(oneshot::Sender<DateTime<Utc>>),
    Stop(oneshot::Sender<()>),
    /// SIGTERM (SIGKILL after a bounded wait); started again only on `Resume`.
    Hold(oneshot::Sender<()>),
    Resume,
    /// SIGTERM (SIGKILL after a bounded wait), then start again at once with this change to
    /// its environment.
    Respawn(EnvChange, oneshot::Sender<()>),
}

/// Environment variables a respawn adds (`add`) or takes away (`remove`, by name).
#[derive(Debug, Default)]
struct EnvChange {
    add: Vec<(String, String)>,
    remove: Vec<String>,
}

impl EnvChange {
    fn apply(self, env: &mut Vec<(String, String)>) {
        env.retain(|(k, _)| !self.remove.contains(k) && !self.add.iter().any(|(a, _)| a == k));
        env.extend(self.add);
    }
}

/// One supervised component (`railhook <subcommand> --config <file>`); clones are handles
/// of the same process.
#[derive(Clone)]
pub struct Supervised {
    pub name: &'static str,
    orders: mpsc::Sender<Order>,
    stats: Arc<Mutex<ProcessStats>>,
    /// The supervisor, awaited by the first [`Supervised::stop`] of any clone.
    task: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
    pub log: PathBuf,
}

impl Supervised {
    /// Starts `bin subcommand --config config`, its stdout and stderr appended to
    /// `log_dir/<name>.log`, and keeps it running.
    pub fn start(name: &'static str, bin: &Path, subcommand: &str, config: &Path, log_dir: &Path, restart_delay: Duration) -> Supervised {
        Supervised::start_with_env(name, bin, subcommand, config, log_dir, restart_delay, Vec::new())
    }

    /// As [`Supervised::start`], with extra environment variables.
    pub fn start_with_env(name: &'static str, bin: &Path, subcommand: &str, config: &Path, log_dir: &Path, restart_delay: Duration, env: Vec<(String, String)>) -> Supervised {
        let log = log_dir.join(format!("{name}.log"));
        let (tx, rx) = mpsc::channel(4);
        let stats = Arc::new(Mutex::new(ProcessStats::default()));
        let spec = Spec { name, bin: bin.to_path_buf(), subcommand: subcommand.to_string(), config: config.to_path_buf(), log: log.clone(), restart_delay, env };
        let task = tokio::spawn(supervise(spec, rx, stats.clone()));
        Supervised { name, orders: tx, stats, task: Arc::new(Mutex::new(Some(task))), log }
    }

    /// kill -9; returns when it was sent (the supervisor starts the process again after its
    /// delay). The time is when the signal was sent.
    pub async fn kill(&self) -> DateTime<Utc> {
        let (tx, rx) = oneshot::channel();
        if self.orders.send(Order::Kill(tx)).await.is_err() {
            return Utc::now();
        }
        rx.await.unwrap_or_else(|_| Utc::now())
    }

    /// SIGTERM, a bounded wait, then SIGKILL; not started again until [`Supervised::resume`].
    pub async fn hold(&self) {
        let (tx, rx) = oneshot::channel();
        if self.orders.send(Order::Hold(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// Starts a held process again.
    pub async fn resume(&self) {
        let _ = self.orders.send(Order::Resume).await;
    }

    /// SIGTERM (SIGKILL after a bounded wait), then starts it again at once with `env` added
    /// (for the rest of its life).
    pub async fn respawn_with(&self, env: Vec<(String, String)>) {
        self.respawn(EnvChange { add: env, remove: Vec::new() }).await
    }

    /// SIGTERM (SIGKILL after a bounded wait), then starts it again at once without the
    /// environment variables named (added by [`Supervised::respawn_with`]).
    pub async fn respawn_without(&self, names: &[&str]) {
        self.respawn(EnvChange { add: Vec::new(), remove: names.iter().map(|n| n.to_string()).collect() }).await
    }

    async fn respawn(&self, change: EnvChange) {
        let (tx, rx) = oneshot::channel();
        if self.orders.send(Order::Respawn(change, tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// The log's text from byte `from` on (what the process wrote since then).
    pub fn log_since(&self, from: u64) -> String {
        let bytes = std::fs::read(&self.log).unwrap_or_default();
        String::from_utf8_lossy(bytes.get(from as usize..).unwrap_or_default()).into_owned()
    }

    /// The log's length now.
    pub fn log_len(&self) -> u64 {
        std::fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0)
    }

    /// SIGTERM, a bounded wait, then SIGKILL; the supervisor ends.
    pub async fn stop(&mut self) {
        let (tx, rx) = oneshot::channel();
        if self.orders.send(Order::Stop(tx)).await.is_ok() {
            let _ = rx.await;
        }
        let task = self.task.lock().unwrap().take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    pub fn stats(&self) -> ProcessStats {
        self.stats.lock().unwrap().clone()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

struct Spec {
    name: &'static str,
    bin: PathBuf,
    subcommand: String,
    config: PathBuf,
    log: PathBuf,
    restart_delay: Duration,
    /// Added to the process's otherwise empty environment.
    env: Vec<(String, String)>,
}

impl Spec {
    fn spawn(&self) -> std::io::Result<tokio::process::Child> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.arg(&self.subcommand)
            .arg("--config")
            .arg(&self.config)
            // Nothing from the caller's environment (scripts export RAILHOOK_* variables):
            // the configuration file says everything.
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_BACKTRACE", "1")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .current_dir(self.config.parent().unwrap_or(Path::new("/")))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe; the child dies with the thread that spawned it
        // (a runtime worker thread, which lives as long as the controller's runtime).
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        cmd.spawn()
    }
}

/// SIGTERM, then SIGKILL if it has not exited within 40 s.
async fn terminate(spec: &Spec, child: &mut tokio::process::Child) {
    if let Some(pid) = child.id() {
        // SAFETY: a plain kill(2) of our own child.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    if tokio::time::timeout(Duration::from_secs(40), child.wait()).await.is_err() {
        tracing::warn!(component = spec.name, "did not stop within 40 s of SIGTERM; killing it");
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}

async fn supervise(mut spec: Spec, mut orders: mpsc::Receiver<Order>, stats: Arc<Mutex<ProcessStats>>) {
    loop {
        let mut child = loop {
            match spec.spawn() {
                Ok(c) => break c,
                Err(e) => {
                    tracing::error!(component = spec.name, error = %e, "cannot start; retrying");
                    tokio::time::sleep(spec.restart_delay).await;
                }
            }
        };
        stats.lock().unwrap().starts += 1;
        // Until this child is gone; then the outer loop starts the next.
        loop {
            tokio::select! {
                status = child.wait() => {
                    let what = match status {
                        Ok(s) => s.to_string(),
                        Err(e) => e.to_string(),
                    };
                    tracing::warn!(component = spec.name, status = %what, "exited on its own; starting it again");
                    stats.lock().unwrap().unexpected_exits.push(format!("{} {what}", Utc::now().to_rfc3339()));
                    tokio::time::sleep(spec.restart_delay).await;
                    break;
                }
                order = orders.recv() => match order {
                    Some(Order::Kill(done)) => {
                        let at = Utc::now();
                        let _ = child.start_kill();
                        let _ = child.wait().await;
                        stats.lock().unwrap().kills += 1;
                        let _ = done.send(at);
                        tracing::info!(component = spec.name, "killed (SIGKILL); starting it again after {:?}", spec.restart_delay);
                        tokio::time::sleep(spec.restart_delay).await;
                        break;
                    }
                    Some(Order::Respawn(env, done)) => {
                        // Stopped as at a deploy (its Attempts drained), not killed: the
                        // fault is what the new environment does, not the stop.
                        terminate(&spec, &mut child).await;
                        env.apply(&mut spec.env);
                        let _ = done.send(());
                        break;
                    }
                    Some(Order::Hold(held)) => {
                        terminate(&spec, &mut child).await;
                        let _ = held.send(());
                        if !held_until_resumed(&mut spec, &mut orders).await {
                            return;
                        }
                        break;
                    }
                    Some(Order::Resume) => {}
                    other => {
                        terminate(&spec, &mut child).await;
                        if let Some(Order::Stop(done)) = other {
                            let _ = done.send(());
                        }
                        return;
                    }
                }
            }
        }
    }
}

/// A held process's orders until `Resume` (true) or `Stop` (false).
async fn held_until_resumed(spec: &mut Spec, orders: &mut mpsc::Receiver<Order>) -> bool {
    loop {
        match orders.recv().await {
            Some(Order::Resume) => return true,
            Some(Order::Hold(again)) => {
                let _ = again.send(());
            }
            Some(Order::Kill(done)) => {
                let _ = done.send(Utc::now());
            }
            Some(Order::Respawn(env, done)) => {
                env.apply(&mut spec.env);
                let _ = done.send(());
            }
            Some(Order::Stop(done)) => {
                let _ = done.send(());
                return false;
            }
            None => return false,
        }
    }
}
