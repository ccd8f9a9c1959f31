//! A private Postgres cluster (initdb into a temp folder) for runs that stop and restart
//! Postgres, so the shared server of `scripts/infra` stays untouched.
//!
//! ```no_run
//! # async fn demo() {
//! use railhook_testkit::pg::PgCluster;
//! let mut pg = PgCluster::start().await;       // initdb, start, accepting connections
//! let url = pg.url("postgres");                // postgres://postgres@127.0.0.1:<port>/postgres
//! pg.fast_restart().await;                     // pg_ctl -m fast stop, then start
//! pg.stop().await;                             // pg_ctl -m fast stop
//! # }
//! ```
//!
//! The cluster has `wal_level = logical`, room for replication slots and walsenders, listens
//! on 127.0.0.1 only (a free port below the ephemeral range, so no client connection can
//! take it while the server is down) and trusts every local connection; the superuser is
//! `postgres`. Its Unix socket lives in its own folder.
//!
//! Postgres refuses to run as root: when the process runs as root, initdb and pg_ctl run as
//! the `postgres` user (`runuser -u postgres --`), and the folder is owned by that user and
//! placed where it can reach it (the temp dir, or `/tmp` when the temp dir is not reachable).
//!
//! [`PgCluster::start_on_tmpfs`] puts the data directory on a tmpfs of its own (root only),
//! with the WAL outside it, so that [`PgCluster::fill_disk`] can make the data's disk full
//! (the tmpfs is shrunk to what it holds) and [`PgCluster::free_disk`] give the space back.
//! [`PgCluster::crash`] is `kill -9` of the postmaster: what a power cut does to the WAL not
//! yet flushed.
//!
//! Drop stops the server (`-m immediate`) and removes the folder (`RAILHOOK_PG_KEEP=1` keeps
//! it). A watchdog shell, in its own process group, holds a pipe from this process and stops
//! the server when that pipe closes, so the server dies with the process even when Drop never
//! runs (SIGKILL, `process::exit`).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Stops the cluster when the owning process is gone. `$1` pg_ctl, `$2` the data folder,
/// `$3` the cluster folder, `$4` 1 to remove it, `$5` 1 to run pg_ctl through runuser, `$6` 1
/// when the data folder is a tmpfs mount (unmounted, so its memory goes back).
const WATCHDOG: &str = r#"read -r _
if [ "$5" = 1 ]; then
  (cd / && runuser -u postgres -- "$1" -D "$2" -m immediate -w -t 30 stop) >/dev/null 2>&1
else
  "$1" -D "$2" -m immediate -w -t 30 stop >/dev/null 2>&1
fi
[ "$6" = 1 ] && umount "$2" >/dev/null 2>&1
[ "$4" = 1 ] && rm -rf "$3"
exit 0"#;

/// A Postgres cluster that belongs to one run. See the module docs.
pub struct PgCluster {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    as_root: bool,
    running: bool,
    watchdog: Option<Child>,
    /// The data folder's tmpfs size in bytes, when it is one ([`PgCluster::start_on_tmpfs`]).
    tmpfs: Option<u64>,
}

impl PgCluster {
    /// initdb into a fresh folder, start the server and wait until it accepts connections.
    /// Panics (with the log's tail) if it cannot.
    pub async fn start() -> PgCluster {
        PgCluster::start_with(None).await
    }

    /// As [`PgCluster::start`], with the data folder on a tmpfs of `size` bytes and the WAL
    /// in the cluster's folder beside it (so a full data disk fails writes with `disk_full`,
    /// SQLSTATE 53100, instead of stopping the server for want of WAL). Mounting needs root:
    /// `None` when this process is not root.
    pub async fn start_on_tmpfs(size: u64) -> Option<PgCluster> {
        if !is_root() {
            return None;
        }
        Some(PgCluster::start_with(Some(size)).await)
    }

    async fn start_with(tmpfs: Option<u64>) -> PgCluster {
        let bin = pg_bin().unwrap_or_else(|| {
            panic!("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin (scripts/infra up installs them), and RAILHOOK_PG_BIN is not set")
        });
        let as_root = is_root();
        let dir = cluster_dir(as_root);
        let started = Instant::now();
        let mut cluster = PgCluster { dir, bin, port: 0, as_root, running: false, watchdog: None, tmpfs };
        if let Some(size) = tmpfs {
            cluster.mount_tmpfs(size);
        }
        cluster.initdb().await;
        cluster.spawn_watchdog();
        for attempt in 1..=3 {
            cluster.port = crate::free_port();
            cluster.write_port();
            match cluster.pg_ctl_start().await {
                Ok(()) => break,
                Err(e) if attempt < 3 && cluster.log_tail(20).contains("in use") => {
                    eprintln!("railhook-testkit: private Postgres port {} was taken ({e}); picking another", cluster.port);
                }
                Err(e) => panic!("private Postgres did not start: {e}\n{}", cluster.log_tail(30)),
            }
        }
        eprintln!(
            "railhook-testkit: private Postgres at 127.0.0.1:{} ready in {:.1} s (log {})",
            cluster.port,
            started.elapsed().as_secs_f64(),
            cluster.log_path().display()
        );
        cluster
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A URL for `database` as the superuser `postgres`, without TLS.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}?sslmode=disable", self.port)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    pub fn is_running(&self) -> bool {
        self.running
    }

    /// `pg_ctl -m fast stop` (sessions are terminated, a shutdown checkpoint is written),
    /// then start again on the same port and wait until it accepts connections. Not
    /// `pg_ctl restart`, which drops `-D` from the server's command line.
    pub async fn fast_restart(&mut self) {
        self.stop().await;
        self.start_again().await;
    }

    /// `pg_ctl -m fast stop`; returns once the server is gone. Does nothing if it is stopped.
    /// Panics if it is not gone within 60 s ([`PgCluster::try_stop`] says why instead).
    pub async fn stop(&mut self) {
        if let Err(e) = self.try_stop().await {
            panic!("{e}");
        }
    }

    /// `pg_ctl -m fast stop`, waiting at most 60 s: an error (pg_ctl's words and the
    /// server log's tail) if the server is still there then, for example a walsender waiting
    /// for its client to confirm what it was sent. The server then still runs (shutting
    /// down): [`PgCluster::stop_immediate`] ends it.
    pub async fn try_stop(&mut self) -> Result<(), String> {
        if !self.running {
            return Ok(());
        }
        let out = self.pg_ctl(&["-m", "fast", "-w", "-t", "60", "stop"]).await;
        if !out.status.success() {
            return Err(format!("pg_ctl stop failed: {}\n{}", String::from_utf8_lossy(&out.stderr).trim(), self.log_tail(20)));
        }
        self.running = false;
        Ok(())
    }

    /// `pg_ctl -m immediate stop`: every server process is told to quit at once (SIGQUIT),
    /// walsenders included, also when a fast stop is already under way (a `kill -9` of the
    /// postmaster would leave such a walsender holding the shared memory, and no new
    /// server could start until it noticed). Crash recovery at the next start. Panics if the
    /// server is not gone within 60 s.
    pub async fn stop_immediate(&mut self) {
        if !self.running {
            return;
        }
        let out = self.pg_ctl(&["-m", "immediate", "-w", "-t", "60", "stop"]).await;
        if !out.status.success() {
            panic!("pg_ctl -m immediate stop failed: {}\n{}", String::from_utf8_lossy(&out.stderr).trim(), self.log_tail(20));
        }
        self.running = false;
    }

    /// `kill -9` of the postmaster (a crash: what the WAL writer had not flushed is gone),
    /// then waits until it is gone. Its backends notice and exit by themselves; a start
    /// meanwhile is retried by [`PgCluster::start_again`]. Does nothing if it is stopped.
    pub async fn crash(&mut self) {
        if !self.running {
            return;
        }
        let pid_file = self.data().join("postmaster.pid");
        let pid: Option<i32> = std::fs::read_to_string(&pid_file).ok().and_then(|t| t.lines().next().and_then(|l| l.trim().parse().ok()));
        let Some(pid) = pid else { panic!("no postmaster pid in {}", pid_file.display()) };
        let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.running = false;
    }

    /// Makes the data folder's disk full: its tmpfs shrunk to what it holds now (so no
    /// memory is spent on a filler). Panics unless it started with [`PgCluster::start_on_tmpfs`].
    pub fn fill_disk(&self) {
        assert!(self.tmpfs.is_some(), "fill_disk needs a cluster started on a tmpfs");
        let used = statvfs_used(&self.data()).unwrap_or_else(|e| panic!("statvfs {}: {e}", self.data().display()));
        // tmpfs refuses a size below what it holds; a page over it leaves nothing usable.
        self.remount(used + 4096);
    }

    /// Gives the data folder's disk its size back after [`PgCluster::fill_disk`].
    pub fn free_disk(&self) {
        if let Some(size) = self.tmpfs {
            self.remount(size);
        }
    }

    /// Whether the data folder is on a tmpfs of its own ([`PgCluster::start_on_tmpfs`]).
    pub fn is_on_tmpfs(&self) -> bool {
        self.tmpfs.is_some()
    }

    /// Bytes free on the data folder's file system.
    pub fn disk_free(&self) -> u64 {
        statvfs_free(&self.data()).unwrap_or(0)
    }

    fn mount_tmpfs(&self, size: u64) {
        let data = self.data();
        std::fs::create_dir_all(&data).unwrap_or_else(|e| panic!("create {}: {e}", data.display()));
        let (uid, gid) = if self.as_root { postgres_ids() } else { (0, 0) };
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},uid={uid},gid={gid},mode=0700"), "railhook-pg-data"])
            .arg(&data)
            .output()
            .unwrap_or_else(|e| panic!("cannot run mount: {e}"));
        assert!(out.status.success(), "mount a tmpfs on {}: {}", data.display(), String::from_utf8_lossy(&out.stderr));
    }

    fn remount(&self, size: u64) {
        let out = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.data())
            .output()
            .unwrap_or_else(|e| panic!("cannot run mount: {e}"));
        assert!(out.status.success(), "remount {} with size {size}: {}", self.data().display(), String::from_utf8_lossy(&out.stderr));
    }

    /// Starts a stopped server again (same port and data) and waits until it accepts
    /// connections. Does nothing if it runs.
    pub async fn start_again(&mut self) {
        if self.running {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.pg_ctl_start().await {
                Ok(()) => return,
                // The port may still be held for a moment by a connection of the old server.
                Err(e) if Instant::now() < deadline => {
                    eprintln!("railhook-testkit: private Postgres did not start again ({e}); retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => panic!("private Postgres did not start again: {e}\n{}", self.log_tail(30)),
            }
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    async fn initdb(&self) {
        let initdb = self.bin.join("initdb");
        let mut cmd = self.command(&initdb);
        cmd.arg("-D").arg(self.data()).args(["-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"]);
        if self.tmpfs.is_some() {
            cmd.arg("-X").arg(self.dir.join("wal"));
        }
        let out = run(cmd).await;
        if !out.status.success() {
            panic!(
                "initdb for the private Postgres failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let conf = format!(
            "\n# railhook-testkit: a private cluster for one run.\n\
             listen_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{}'\n\
             wal_level = logical\n\
             max_replication_slots = 16\n\
             max_wal_senders = 16\n\
             max_connections = 200\n\
             shared_buffers = 128MB\n\
             wal_sender_timeout = 60s\n\
             include_if_exists = 'port.conf'\n",
            self.dir.display()
        );
        let path = self.data().join("postgresql.conf");
        let mut text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        text.push_str(&conf);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    fn write_port(&self) {
        let path = self.data().join("port.conf");
        std::fs::write(&path, format!("port = {}\n", self.port)).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        if self.as_root {
            chown_to_postgres(&path);
        }
    }

    async fn pg_ctl_start(&mut self) -> Result<(), String> {
        let log = self.log_path();
        let out = self.pg_ctl(&["-l", &log.display().to_string(), "-w", "-t", "60", "start"]).await;
        if out.status.success() {
            self.running = true;
            Ok(())
        } else {
            Err(format!("pg_ctl start: {}", String::from_utf8_lossy(&out.stderr).trim()))
        }
    }

    async fn pg_ctl(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = self.command(&self.bin.join("pg_ctl"));
        cmd.arg("-D").arg(self.data()).args(args);
        run(cmd).await
    }

    /// `program`, as the postgres user when this process is root.
    fn command(&self, program: &Path) -> Command {
        let mut cmd = if self.as_root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        cmd.current_dir("/").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd
    }

    fn spawn_watchdog(&mut self) {
        let keep = if keep_dir() { "0" } else { "1" };
        let watchdog = Command::new("sh")
            .args(["-c", WATCHDOG, "railhook-pg-watchdog"])
            .arg(self.bin.join("pg_ctl"))
            .arg(self.data())
            .arg(&self.dir)
            .arg(keep)
            .arg(if self.as_root { "1" } else { "0" })
            .arg(if self.tmpfs.is_some() { "1" } else { "0" })
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn();
        match watchdog {
            Ok(w) => self.watchdog = Some(w),
            Err(e) => eprintln!("railhook-testkit: no watchdog for the private Postgres ({e}); only Drop stops it"),
        }
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if self.running {
            let mut cmd = self.command(&self.bin.join("pg_ctl"));
            cmd.arg("-D").arg(self.data()).args(["-m", "immediate", "-w", "-t", "30", "stop"]);
            let _ = cmd.output();
            self.running = false;
        }
        if let Some(mut watchdog) = self.watchdog.take() {
            // Its stdin closes with it: it would stop the (already stopped) server; kill it.
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        if self.tmpfs.is_some() {
            let _ = Command::new("umount").arg(self.data()).output();
        }
        if !keep_dir() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

async fn run(mut cmd: Command) -> std::process::Output {
    let shown = format!("{cmd:?}");
    tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("postgres tool task")
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"))
}

/// `RAILHOOK_PG_BIN`, or the newest `/usr/lib/postgresql/<version>/bin` with a `postgres`.
pub fn pg_bin() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("RAILHOOK_PG_BIN").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let version: u32 = e.file_name().to_string_lossy().split('.').next()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
}

fn keep_dir() -> bool {
    std::env::var("RAILHOOK_PG_KEEP").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// A fresh folder the server's user can reach: under the temp dir, or `/tmp` when the
/// postgres user cannot enter the temp dir (e.g. TMPDIR under /root).
fn cluster_dir(as_root: bool) -> PathBuf {
    let name = format!("railhook-pg-{}-{}", std::process::id(), &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let mut base = std::env::temp_dir();
    if as_root && !postgres_can_enter(&base) {
        base = PathBuf::from("/tmp");
    }
    let dir = base.join(name);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    if as_root {
        chown_to_postgres(&dir);
    }
    dir
}

fn postgres_can_enter(dir: &Path) -> bool {
    Command::new("runuser")
        .args(["-u", "postgres", "--", "test", "-x"])
        .arg(dir)
        .current_dir("/")
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn postgres_ids() -> (u32, u32) {
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, "postgres"]).output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    let (Some(uid), Some(gid)) = (id("-u"), id("-g")) else {
        panic!("the postgres user is missing (it comes with Debian's postgresql package)");
    };
    (uid, gid)
}

fn chown_to_postgres(path: &Path) {
    let (uid, gid) = postgres_ids();
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
}

/// `df`'s used and free bytes of the file system holding `path`, from `stat -f`.
fn statvfs(path: &Path) -> std::io::Result<(u64, u64)> {
    let out = Command::new("stat").args(["-f", "-c", "%S %b %f"]).arg(path).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let n: Vec<u64> = text.split_whitespace().filter_map(|v| v.parse().ok()).collect();
    match n[..] {
        [size, blocks, free] => Ok((size * (blocks - free.min(blocks)), size * free)),
        _ => Err(std::io::Error::other(format!("stat -f printed {text:?}"))),
    }
}

fn statvfs_used(path: &Path) -> std::io::Result<u64> {
    statvfs(path).map(|(used, _)| used)
}

fn statvfs_free(path: &Path) -> std::io::Result<u64> {
    statvfs(path).map(|(_, free)| free)
}
