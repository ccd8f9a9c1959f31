//! A private, single-node Kafka broker (KRaft: broker and controller in one JVM) for tests
//! that stop, kill and restart Kafka, so the shared broker of `scripts/infra` stays untouched.
//!
//! ```no_run
//! # async fn demo() {
//! use railhook_testkit::kafka::KafkaBroker;
//! let mut kafka = KafkaBroker::start().await; // ready: it has answered a metadata request
//! let brokers = kafka.brokers();               // "127.0.0.1:<port>"
//! kafka.stop().await;                          // SIGTERM, bounded wait, then SIGKILL
//! kafka.restart().await;                       // same ports and data, waits until ready
//! kafka.kill().await;                          // SIGKILL
//! # }
//! ```
//!
//! It runs the jars `scripts/infra up` fetches into `.local/kafka/libs` (or the folder named
//! by `RAILHOOK_KAFKA_LIBS`) with `infra/kafka/server.properties` and
//! `infra/kafka/log4j2.properties`, but with its own ports, node id and data directory, all
//! in a fresh folder under the temp dir. The broker's stdout and stderr go to `kafka.log`
//! there. Ports are picked below the ephemeral range, so no client connection can take the
//! broker's port while it is down.
//!
//! [`KafkaBroker::start_with_listeners`] adds named listeners, each on a port of its own and
//! advertised at a port the caller chooses: a fault-injecting proxy listens there and forwards
//! to the listener, so that the clients behind one proxy reach the broker only through it
//! (a client is sent, in metadata, the advertised address of the listener it came in on).
//!
//! Drop kills the JVM and removes the folder (`RAILHOOK_KAFKA_KEEP=1` keeps it). The JVM runs
//! in its own process group; a small watchdog shell, also in its own group, holds a pipe from
//! the test process and kills the JVM when that pipe closes, so the broker dies with the test
//! process even when Drop never runs (SIGKILL, Ctrl-C, `process::exit`).
//!
//! The methods are async and block no runtime thread for long (the JVM runs for the storage
//! format step go through `spawn_blocking`), so they work in any `#[tokio::test]`.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::BaseConsumer;

/// The private broker's `node.id` (the shared broker is node 1).
pub const NODE_ID: i32 = 100;

/// How long `start` and `restart` wait for the broker to serve metadata, unless
/// `RAILHOOK_KAFKA_START_TIMEOUT_SECS` says otherwise.
const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `stop` waits after SIGTERM before it sends SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Lines of `kafka.log` quoted in a panic.
const TAIL_LINES: usize = 40;
/// The log line Kafka writes once the broker is unfenced and serving.
const STARTED: &str = "Kafka Server started";

/// Kills the broker when the test process is gone. `$1` the JVM's pid, `$2` its folder (also
/// in its command line, checked so a reused pid is left alone), `$3` 1 to remove the folder.
const WATCHDOG: &str = r#"read -r _
case "$(tr '\000' ' ' < "/proc/$1/cmdline" 2>/dev/null)" in
  *"-Drailhook.testkit.broker=$2 "*) kill -KILL "$1" 2>/dev/null ;;
esac
i=0
while [ -e "/proc/$1" ] && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ "$3" = 1 ] && rm -rf "$2"
exit 0"#;

/// A Kafka broker process that belongs to one test. See the module docs.
pub struct KafkaBroker {
    dir: PathBuf,
    libs: PathBuf,
    repo: PathBuf,
    port: u16,
    controller_port: u16,
    child: Option<Child>,
    watchdog: Option<Child>,
    /// Where the current run's output starts in `kafka.log`.
    run_offset: u64,
    /// Extra listeners: (name, the broker's port, the advertised port).
    listeners: Vec<(String, u16, u16)>,
}

enum NotReady {
    Exited { status: ExitStatus, port_in_use: bool },
    TimedOut { started_line: bool },
}

impl KafkaBroker {
    /// Creates the folder, formats the storage, starts the broker and waits until it answers
    /// a metadata request. Panics (with the log's tail) if it cannot.
    pub async fn start() -> KafkaBroker {
        KafkaBroker::start_with_listeners(&[]).await
    }

    /// As [`KafkaBroker::start`], with one more listener per `(name, advertised_port)`: the
    /// broker listens on a port of its own ([`KafkaBroker::listener_port`]) and tells the
    /// clients that came in on it to connect to `advertised_port`. Names are upper case
    /// letters and `_`, other than `PLAINTEXT` and `CONTROLLER`.
    pub async fn start_with_listeners(listeners: &[(&str, u16)]) -> KafkaBroker {
        for (name, _) in listeners {
            assert!(
                !name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') && *name != "PLAINTEXT" && *name != "CONTROLLER",
                "listener name {name:?}"
            );
        }
        let libs = libs_dir();
        let repo = repo_root();
        let dir = std::env::temp_dir().join(format!(
            "railhook-kafka-{}-{}",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let started = Instant::now();
        let listeners = listeners.iter().map(|(name, advertised)| (name.to_string(), 0, *advertised)).collect();
        let mut broker = KafkaBroker { dir, libs, repo, port: 0, controller_port: 0, child: None, watchdog: None, run_offset: 0, listeners };
        let mut held = broker.pick_ports();
        broker.write_properties();
        broker.format().await;

        let deadline = Instant::now() + start_timeout();
        let mut attempt = 1;
        loop {
            drop(held);
            broker.launch();
            match broker.wait_ready(deadline).await {
                Ok(()) => break,
                // Someone took a port between our check and the broker's bind: new ports.
                Err(NotReady::Exited { port_in_use: true, .. }) if attempt < 3 && Instant::now() < deadline => {
                    eprintln!("railhook-testkit: private Kafka ports {}/{} were taken; picking others", broker.port, broker.controller_port);
                    broker.reap().await;
                    held = broker.pick_ports();
                    broker.write_properties();
                    attempt += 1;
                }
                Err(why) => panic!("{}", broker.failure("start", why)),
            }
        }
        eprintln!(
            "railhook-testkit: private Kafka at {} ready in {:.1} s (log {})",
            broker.brokers(),
            started.elapsed().as_secs_f64(),
            broker.log_path().display()
        );
        broker
    }

    /// `127.0.0.1:<port>`, for `bootstrap.servers`.
    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn controller_port(&self) -> u16 {
        self.controller_port
    }

    /// The broker's own port of the extra listener `name` (what its proxy forwards to).
    pub fn listener_port(&self, name: &str) -> Option<u16> {
        self.listeners.iter().find(|(n, _, _)| n == name).map(|(_, port, _)| *port)
    }

    /// The JVM's pid while it runs (or has exited but not been stopped, killed or restarted).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the JVM is alive.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    /// The broker's folder: `server.properties`, `format.log`, `kafka.log`, `data/`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The broker's stdout and stderr, all runs appended.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("kafka.log")
    }

    /// The last `lines` lines of `kafka.log`.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log_path(), lines)
    }

    /// Graceful stop: SIGTERM, then waits (bounded) for the JVM to exit; SIGKILL if it does
    /// not. Returns once the process is gone. Does nothing if it is not running.
    pub async fn stop(&mut self) {
        let Some(child) = self.child.as_mut() else { return };
        if matches!(child.try_wait(), Ok(None)) {
            let pid = child.id().to_string();
            let _ = Command::new("sh").args(["-c", r#"kill -s TERM "$1""#, "sh", &pid]).status();
            if wait_exit(child, STOP_TIMEOUT).await.is_none() {
                eprintln!("railhook-testkit: private Kafka (pid {pid}) did not stop within {STOP_TIMEOUT:?}; killing it");
            }
        }
        self.reap().await;
    }

    /// SIGKILL, then waits until the process is gone. Does nothing if it is not running.
    pub async fn kill(&mut self) {
        self.reap().await;
    }

    /// Starts the broker again with the same ports and data (no reformat) and waits until it
    /// answers a metadata request; stops it first (gracefully) if it still runs. A port still
    /// held (TIME_WAIT without SO_REUSEADDR, or a slow exit) is retried until the deadline.
    pub async fn restart(&mut self) {
        self.stop().await;
        let deadline = Instant::now() + start_timeout();
        loop {
            self.launch();
            match self.wait_ready(deadline).await {
                Ok(()) => return,
                Err(NotReady::Exited { port_in_use: true, .. }) if Instant::now() + Duration::from_secs(1) < deadline => {
                    eprintln!("railhook-testkit: private Kafka port {} or {} still in use; retrying", self.port, self.controller_port);
                    self.reap().await;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(why) => panic!("{}", self.failure("restart", why)),
            }
        }
    }

    /// Finds free loopback ports below the ephemeral range (the broker's, the controller's,
    /// one per extra listener); the listeners hold them until the broker is about to bind.
    fn pick_ports(&mut self) -> Vec<TcpListener> {
        let low = ephemeral_low();
        let mut held = Vec::new();
        let mut tries = 0;
        let wanted = 2 + self.listeners.len();
        while held.len() < wanted {
            tries += 1;
            let port = if low > 21_000 && tries < 500 {
                20_000 + (uuid::Uuid::new_v4().as_u128() % u128::from(low - 20_000)) as u16
            } else {
                0
            };
            if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
                held.push(listener);
            }
        }
        self.port = held[0].local_addr().unwrap().port();
        self.controller_port = held[1].local_addr().unwrap().port();
        for (i, listener) in self.listeners.iter_mut().enumerate() {
            listener.1 = held[2 + i].local_addr().unwrap().port();
        }
        held
    }

    fn write_properties(&self) {
        let template_path = self.repo.join("infra/kafka/server.properties");
        let template = std::fs::read_to_string(&template_path)
            .unwrap_or_else(|e| panic!("read {}: {e}", template_path.display()));
        let data = self.dir.join("data");
        let mut out = String::new();
        let (mut node_id, mut voters) = (false, false);
        for line in template.lines() {
            if line.starts_with("node.id=") {
                out.push_str(&format!("node.id={NODE_ID}\n"));
                node_id = true;
            } else if line.starts_with("controller.quorum.voters=") {
                out.push_str(&format!("controller.quorum.voters={NODE_ID}@127.0.0.1:{}\n", self.controller_port));
                voters = true;
            } else if let Some(line) = self.with_listeners(line) {
                out.push_str(&line);
                out.push('\n');
            } else {
                let line = line
                    .replace("@KAFKA_PORT@", &self.port.to_string())
                    .replace("@CONTROLLER_PORT@", &self.controller_port.to_string())
                    .replace("@DATA_DIR@", &data.display().to_string());
                out.push_str(&line);
                out.push('\n');
            }
        }
        assert!(node_id && voters, "{} has no node.id or controller.quorum.voters line", template_path.display());
        out.push_str(
            "\n# railhook-testkit: a private broker for one test.\n\
             share.coordinator.state.topic.replication.factor=1\n\
             share.coordinator.state.topic.min.isr=1\n\
             # After a SIGKILL the restarted broker cannot register until the old registration's\n\
             # session expires (DUPLICATE_BROKER_REGISTRATION): 4 s instead of 9 s.\n\
             broker.heartbeat.interval.ms=1000\n\
             broker.session.timeout.ms=4000\n",
        );
        let path = self.dir.join("server.properties");
        std::fs::write(&path, out).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    /// The template's `listeners`, `advertised.listeners` and `listener.security.protocol.map`
    /// lines with the extra listeners added; `None` for any other line, or without extras.
    fn with_listeners(&self, line: &str) -> Option<String> {
        if self.listeners.is_empty() {
            return None;
        }
        let (key, _) = line.split_once('=')?;
        let extra: Vec<String> = match key {
            "listeners" => self.listeners.iter().map(|(n, port, _)| format!("{n}://127.0.0.1:{port}")).collect(),
            "advertised.listeners" => self.listeners.iter().map(|(n, _, advertised)| format!("{n}://127.0.0.1:{advertised}")).collect(),
            "listener.security.protocol.map" => self.listeners.iter().map(|(n, _, _)| format!("{n}:PLAINTEXT")).collect(),
            _ => return None,
        };
        let line = line
            .replace("@KAFKA_PORT@", &self.port.to_string())
            .replace("@CONTROLLER_PORT@", &self.controller_port.to_string());
        Some(format!("{line},{}", extra.join(",")))
    }

    /// `java` with the flags of `scripts/infra` (smaller heap; C1 and the serial collector,
    /// which start faster), and a marker naming this broker's folder.
    fn java(&self) -> Command {
        let mut cmd = Command::new(java_bin());
        cmd.args(["-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData"])
            .arg("-Djava.awt.headless=true")
            .arg(format!("-Dlog4j2.configurationFile={}", self.repo.join("infra/kafka/log4j2.properties").display()))
            .arg(format!("-Drailhook.testkit.broker={}", self.dir.display()))
            .arg("-cp")
            .arg(format!("{}/*", self.libs.display()))
            .current_dir(&self.dir)
            .stdin(Stdio::null());
        cmd
    }

    async fn format(&self) {
        let log_path = self.dir.join("format.log");
        let log = File::create(&log_path).unwrap_or_else(|e| panic!("create {}: {e}", log_path.display()));
        let mut cmd = self.java();
        cmd.arg("kafka.tools.StorageTool")
            .arg("format")
            .arg("-t")
            .arg(cluster_id())
            .arg("-c")
            .arg(self.dir.join("server.properties"))
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log);
        let status = tokio::task::spawn_blocking(move || cmd.status())
            .await
            .expect("storage format task")
            .unwrap_or_else(|e| panic!("cannot run {}: {e}. Kafka needs Java 17 (scripts/infra up installs it)", java_bin()));
        if !status.success() {
            panic!(
                "formatting the private Kafka's storage failed ({status}); {}:\n{}",
                log_path.display(),
                tail(&log_path, TAIL_LINES)
            );
        }
    }

    /// Spawns the JVM (output appended to `kafka.log`) and its watchdog.
    fn launch(&mut self) {
        assert!(self.child.is_none(), "private Kafka launched twice");
        let path = self.log_path();
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        self.run_offset = log.metadata().map(|m| m.len()).unwrap_or(0);
        let mut cmd = self.java();
        cmd.arg("kafka.Kafka")
            .arg(self.dir.join("server.properties"))
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .process_group(0);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}. Kafka needs Java 17 (scripts/infra up installs it)", java_bin()));
        let keep = if keep_dir() { "0" } else { "1" };
        let watchdog = Command::new("sh")
            .args(["-c", WATCHDOG, "railhook-kafka-watchdog", &child.id().to_string()])
            .arg(&self.dir)
            .arg(keep)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn();
        self.child = Some(child);
        match watchdog {
            Ok(w) => self.watchdog = Some(w),
            Err(e) => eprintln!("railhook-testkit: no watchdog for the private Kafka ({e}); only Drop kills it"),
        }
    }

    /// Waits until this run has logged that it started and answers a metadata request that
    /// lists this broker.
    async fn wait_ready(&mut self, deadline: Instant) -> Result<(), NotReady> {
        let mut started_line = false;
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                let log = self.run_log();
                let port_in_use = log.contains("Address already in use") || log.contains("BindException");
                return Err(NotReady::Exited { status, port_in_use });
            }
            if !started_line {
                started_line = self.run_log().contains(STARTED);
            }
            if started_line && self.serves_metadata().await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(NotReady::TimedOut { started_line });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn serves_metadata(&self) -> bool {
        let brokers = self.brokers();
        let port = i32::from(self.port);
        tokio::task::spawn_blocking(move || {
            let Ok(consumer) = ClientConfig::new().set("bootstrap.servers", &brokers).create::<BaseConsumer>() else {
                return false;
            };
            match rdkafka::consumer::Consumer::fetch_metadata(&consumer, None, Duration::from_secs(3)) {
                Ok(metadata) => metadata.brokers().iter().any(|b| b.id() == NODE_ID && b.port() == port),
                Err(_) => false,
            }
        })
        .await
        .unwrap_or(false)
    }

    /// SIGKILL (if still alive), wait until the process is gone, then end its watchdog.
    async fn reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                if wait_exit(&mut child, Duration::from_secs(30)).await.is_none() {
                    panic!("private Kafka (pid {}) survived SIGKILL for 30 s", child.id());
                }
            }
        }
        self.end_watchdog();
    }

    fn end_watchdog(&mut self) {
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }

    /// This run's part of `kafka.log`.
    fn run_log(&self) -> String {
        let mut text = Vec::new();
        if let Ok(mut f) = File::open(self.log_path()) {
            if f.seek(SeekFrom::Start(self.run_offset)).is_ok() {
                let _ = f.read_to_end(&mut text);
            }
        }
        String::from_utf8_lossy(&text).into_owned()
    }

    fn failure(&self, what: &str, why: NotReady) -> String {
        let why = match why {
            NotReady::Exited { status, port_in_use } => {
                format!("the broker exited ({status}){}", if port_in_use { "; a port was in use" } else { "" })
            }
            NotReady::TimedOut { started_line } => format!(
                "the broker was not ready within {:?} ({})",
                start_timeout(),
                if started_line { "it logged that it started but answered no metadata request" } else { "it never logged that it started" }
            ),
        };
        format!(
            "private Kafka {what} at {} failed: {why}. Last lines of {} (the folder goes away on drop; RAILHOOK_KAFKA_KEEP=1 keeps it):\n{}",
            self.brokers(),
            self.log_path().display(),
            self.log_tail(TAIL_LINES)
        )
    }
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        self.end_watchdog();
        if !keep_dir() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Polls until the child exits; `None` on timeout.
async fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            // Not our child any more (already reaped): it is gone.
            Err(_) => return Some(std::os::unix::process::ExitStatusExt::from_raw(0)),
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The checkout's root (this crate lives in `crates/railhook-testkit`).
fn repo_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// The folder of broker jars: `RAILHOOK_KAFKA_LIBS`, or `.local/kafka/libs` of the checkout.
/// Panics if it holds no Kafka broker jar.
pub fn libs_dir() -> PathBuf {
    let dir = match std::env::var_os("RAILHOOK_KAFKA_LIBS") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => repo_root().join(".local/kafka/libs"),
    };
    let has_broker = std::fs::read_dir(&dir)
        .map(|entries| {
            entries.flatten().any(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with("kafka_") && name.ends_with(".jar")
            })
        })
        .unwrap_or(false);
    if !has_broker {
        panic!(
            "no Kafka broker jars (kafka_*.jar) in {}: run `scripts/infra up`, which fetches them, \
             or point RAILHOOK_KAFKA_LIBS at a folder that has them",
            dir.display()
        );
    }
    dir
}

fn java_bin() -> String {
    match std::env::var_os("JAVA_HOME") {
        Some(home) if Path::new(&home).join("bin/java").is_file() => Path::new(&home).join("bin/java").display().to_string(),
        _ => "java".into(),
    }
}

fn start_timeout() -> Duration {
    std::env::var("RAILHOOK_KAFKA_START_TIMEOUT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_START_TIMEOUT)
}

fn keep_dir() -> bool {
    std::env::var("RAILHOOK_KAFKA_KEEP").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The lowest ephemeral port (what outgoing connections get); 32768 if unknown.
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse().ok()))
        .unwrap_or(32_768)
}

/// A Kafka cluster id: 16 random bytes, URL-safe base64 without padding, not starting with
/// '-' (the storage tool would read it as an option).
fn cluster_id() -> String {
    loop {
        let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(uuid::Uuid::new_v4().as_bytes());
        if !id.starts_with('-') {
            return id;
        }
    }
}

fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ids_are_22_url_safe_chars() {
        for _ in 0..100 {
            let id = cluster_id();
            assert_eq!(id.len(), 22);
            assert!(!id.starts_with('-'));
            assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        }
    }

    #[test]
    fn repo_root_has_the_kafka_templates() {
        assert!(repo_root().join("infra/kafka/server.properties").is_file());
        assert!(repo_root().join("infra/kafka/log4j2.properties").is_file());
    }
}
