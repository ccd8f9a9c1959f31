//! Railhook's components as real processes of the `railhook` binary (as they run in
//! production), and what the benchmarks read about processes from /proc: peak and current
//! RSS, CPU time.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use railhook_config::Config;

/// A free port on 127.0.0.1 (bound, read, released).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(railhook_testkit::free_port())
}

/// The `railhook` binary: `--bin`, else `RAILHOOK_BIN`, else next to this executable.
pub fn railhook_bin(flag: Option<&str>) -> anyhow::Result<PathBuf> {
    let path = match flag.map(PathBuf::from).or_else(|| std::env::var_os("RAILHOOK_BIN").map(PathBuf::from)) {
        Some(p) => p,
        None => std::env::current_exe()?.parent().context("executable has no directory")?.join("railhook"),
    };
    if !path.is_file() {
        bail!("railhook binary not found at {} (build it: cargo build --release -p railhook, or pass --bin)", path.display());
    }
    Ok(path)
}

/// One `railhook <subcommand>` process with its own configuration file and log.
pub struct Proc {
    pub name: &'static str,
    child: tokio::process::Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(bin: &Path, config: &Config, name: &'static str, args: &[&str], dir: &Path) -> anyhow::Result<Proc> {
        Proc::spawn_with(bin, config, name, args, dir, &[])
    }

    /// [`Proc::spawn`] with `env` set for the process; the `OTEL_*` variables are otherwise
    /// removed, so export is on only where a benchmark asks for it.
    pub fn spawn_with(bin: &Path, config: &Config, name: &'static str, args: &[&str], dir: &Path, env: &[(&str, String)]) -> anyhow::Result<Proc> {
        std::fs::create_dir_all(dir)?;
        let config_path = dir.join(format!("{name}.toml"));
        std::fs::write(&config_path, toml::to_string(config)?)?;
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log)?;
        let child = tokio::process::Command::new(bin)
            .arg("--config")
            .arg(&config_path)
            .args(args)
            .env_remove("RAILHOOK_DATABASE_URL")
            .env_remove("RAILHOOK_KAFKA_BROKERS")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} {name}", bin.display()))?;
        Ok(Proc { name, child, log })
    }

    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("railhook {} exited ({status}); its log {}:\n{}", self.name, self.log.display(), tail(&self.log, 20));
        }
        Ok(())
    }

    /// Peak resident set size (VmHWM), in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        status_kib(self.pid(), "VmHWM:")
    }

    pub fn rss_kib(&self) -> u64 {
        status_kib(self.pid(), "VmRSS:")
    }

    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.pid())
    }

    /// SIGTERM, then wait (bounded) for the exit.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            if tokio::time::timeout(Duration::from_secs(40), self.child.wait()).await.is_err() {
                let _ = self.child.kill().await;
            }
        }
    }
}

pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// utime + stime of a process, in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name is in parentheses and may hold spaces: fields start after the last ')'.
    let Some(rest) = text.rfind(')').map(|i| &text[i + 2..]) else { return 0.0 };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // After ')': state is field 3 (index 0); utime is field 14, stime 15.
    (ticks(11) + ticks(12)) / clock_ticks()
}

fn clock_ticks() -> f64 {
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// CPU seconds of every process whose command name is `comm` (e.g. all `postgres` backends;
/// backends that exited meanwhile are not counted, so compare snapshots of long-lived ones).
pub fn cpu_seconds_of_comm(comm: &str) -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0.0 };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|c| c.trim() == comm).unwrap_or(false))
        .map(cpu_seconds)
        .sum()
}

/// CPU seconds this process (the load generator and, in e2e, the receiver) used so far.
pub fn self_cpu_seconds() -> f64 {
    cpu_seconds(std::process::id())
}

/// Polls `url` until it answers 200, the process exits, or `timeout` passes.
pub async fn wait_ready(proc: &mut Proc, url: &str, contains: Option<&str>, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        proc.check_running()?;
        if let Ok(body) = crate::http::get_text(url).await {
            if contains.is_none_or(|c| body.lines().any(|l| l.trim() == c)) {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("railhook {} not ready at {url} within {timeout:?}; log:\n{}", proc.name, tail(&proc.log, 20));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
