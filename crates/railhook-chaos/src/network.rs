//! The network faults' proxy: Toxiproxy (Shopify's fault-injecting TCP proxy, a Go module
//! that `scripts/test` and `scripts/chaos` install with `go install` into
//! `.local/toxiproxy/bin`). One `toxiproxy-server` per run, on a free port, and one proxy per
//! [`Link`]: every process of a component reaches Postgres (or Kafka) through its link's
//! proxy, so a fault on the link hits exactly that component's connections to that server.
//!
//! Kafka needs the broker's help: a client connects to whatever address the broker
//! advertises, so the private broker gets one listener per proxied component, advertised at
//! the proxy's port (`railhook_testkit::kafka::KafkaBroker::start_with_listeners`).
//!
//! The toxics ([`Toxic`]): `latency` (200 ms added to every answer), `timeout` with a zero
//! timeout (a blackhole: nothing passes, connections stay open), `reset_peer` with a zero
//! timeout (every connection that carries data is closed with a TCP RST, and so is every
//! new one). Each is added to both directions of the link, and removed when the fault ends.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;

use crate::plan::Link;

/// Where the binary is: `RAILHOOK_TOXIPROXY_BIN`, or `.local/toxiproxy/bin/toxiproxy-server`
/// of the checkout (what the scripts install).
pub fn toxiproxy_bin() -> PathBuf {
    match std::env::var_os("RAILHOOK_TOXIPROXY_BIN") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.local/toxiproxy/bin/toxiproxy-server"),
    }
}

/// A fault on a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Toxic {
    /// Every answer `ms` later.
    Latency { ms: u32 },
    /// Nothing passes; connections stay open.
    Blackhole,
    /// Connections are reset (TCP RST).
    Reset,
}

impl Toxic {
    /// (toxiproxy type, streams, attributes)
    fn spec(self) -> (&'static str, &'static [&'static str], serde_json::Value) {
        match self {
            // Only the answers: 200 ms added per round trip, not 400.
            Toxic::Latency { ms } => ("latency", &["downstream"], json!({"latency": ms, "jitter": 0})),
            Toxic::Blackhole => ("timeout", &["upstream", "downstream"], json!({"timeout": 0})),
            Toxic::Reset => ("reset_peer", &["upstream", "downstream"], json!({"timeout": 0})),
        }
    }
}

/// A running `toxiproxy-server` and the run's proxies.
pub struct Toxiproxy {
    api: String,
    http: reqwest::Client,
    /// Each link's proxy: the port it listens on.
    listen: HashMap<Link, u16>,
    _server: tokio::process::Child,
}

impl Toxiproxy {
    /// Starts the server on a free port (its log in `log_dir/toxiproxy.log`) and waits until
    /// its API answers.
    pub async fn start(log_dir: &Path) -> anyhow::Result<Toxiproxy> {
        let bin = toxiproxy_bin();
        anyhow::ensure!(
            bin.is_file(),
            "no toxiproxy-server at {} (scripts/test and scripts/chaos install it: go install github.com/Shopify/toxiproxy/v2/cmd/server; or set RAILHOOK_TOXIPROXY_BIN)",
            bin.display()
        );
        let port = railhook_testkit::free_port();
        let log = std::fs::File::create(log_dir.join("toxiproxy.log"))?;
        let mut cmd = tokio::process::Command::new(&bin);
        cmd.args(["-host", "127.0.0.1", "-port", &port.to_string()]).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe; the proxy dies with this process.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let server = cmd.spawn().with_context(|| format!("start {}", bin.display()))?;
        let proxy = Toxiproxy { api: format!("http://127.0.0.1:{port}"), http: reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?, listen: HashMap::new(), _server: server };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if matches!(proxy.http.get(format!("{}/version", proxy.api)).send().await, Ok(r) if r.status().is_success()) {
                return Ok(proxy);
            }
            anyhow::ensure!(tokio::time::Instant::now() < deadline, "toxiproxy-server did not answer on port {port} within 20 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A proxy for `link` listening on 127.0.0.1:`listen`, forwarding to 127.0.0.1:`upstream`.
    pub async fn add_proxy(&mut self, link: Link, listen: u16, upstream: u16) -> anyhow::Result<()> {
        let body = json!({"name": link.name(), "listen": format!("127.0.0.1:{listen}"), "upstream": format!("127.0.0.1:{upstream}"), "enabled": true});
        let r = self.http.post(format!("{}/proxies", self.api)).json(&body).send().await?;
        anyhow::ensure!(r.status().is_success(), "create proxy {}: {} {}", link.name(), r.status(), r.text().await.unwrap_or_default());
        self.listen.insert(link, listen);
        Ok(())
    }

    /// The port `link`'s proxy listens on.
    pub fn port(&self, link: Link) -> Option<u16> {
        self.listen.get(&link).copied()
    }

    /// Adds `toxic` to `link` (both directions, except latency: the answers).
    pub async fn add(&self, link: Link, toxic: Toxic) -> anyhow::Result<()> {
        let (kind, streams, attributes) = toxic.spec();
        for stream in streams {
            let body = json!({"name": format!("{kind}_{stream}"), "type": kind, "stream": stream, "toxicity": 1.0, "attributes": attributes});
            let r = self.http.post(format!("{}/proxies/{}/toxics", self.api, link.name())).json(&body).send().await?;
            anyhow::ensure!(r.status().is_success(), "add {kind} to {}: {} {}", link.name(), r.status(), r.text().await.unwrap_or_default());
        }
        Ok(())
    }

    /// Removes `toxic` from `link`.
    pub async fn remove(&self, link: Link, toxic: Toxic) -> anyhow::Result<()> {
        let (kind, streams, _) = toxic.spec();
        for stream in streams {
            let r = self.http.delete(format!("{}/proxies/{}/toxics/{kind}_{stream}", self.api, link.name())).send().await?;
            anyhow::ensure!(r.status().is_success(), "remove {kind} from {}: {}", link.name(), r.status());
        }
        Ok(())
    }
}
