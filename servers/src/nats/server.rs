//! A real `nats-server -js` on free loopback ports in a temp dir.

use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use tempfile::TempDir;

use super::flavor::{version_of, NatsFlavor};
use crate::ports::free_port;
use crate::process::{server_lifecycle, start_ready, ManagedProcess, ProcessSpec};

/// How long a (re)started server gets to answer its health check.
pub const NATS_READY_DEADLINE: Duration = Duration::from_secs(30);

/// The server's configuration file: JetStream's file storage limit, set. Left unset,
/// nats-server takes the disk space free when it starts as the limit and refuses a
/// stream whose `max_bytes` does not fit in what is left of it: Sluice's default
/// streams reserve 2.25 GiB, so a test would fail on a machine with less than about
/// 3 GiB free (measured: "insufficient storage resources available" for the DLQ with
/// 2-3 GiB free) although it writes a few MiB.
const NATS_CONFIG: &str = "# Written by the test harness (sluice-servers).
jetstream {
  max_file_store: 64GB
}
";

/// A running nats-server with JetStream, its store in a temp dir that is removed when
/// this is dropped (after the process is killed).
#[derive(Debug)]
pub struct NatsServer {
    // Field order matters: the process is killed before its directory is removed.
    process: ManagedProcess,
    flavor: NatsFlavor,
    binary: PathBuf,
    version: String,
    port: u16,
    monitor_port: u16,
    store_dir: PathBuf,
    http: reqwest::Client,
    dir: TempDir,
}

// === impl NatsServer ===

impl NatsServer {
    /// Starts `nats-server -js` of `flavor` and waits until it is healthy.
    pub async fn start(flavor: NatsFlavor) -> Result<Self> {
        Self::start_with_args(flavor, Vec::<OsString>::new()).await
    }

    /// Like [`NatsServer::start`], with extra command-line arguments.
    pub async fn start_with_args<I, S>(flavor: NatsFlavor, extra_args: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        Self::start_configured(flavor, extra_args, "").await
    }

    /// Like [`NatsServer::start_with_args`], with `extra_config` added to its
    /// configuration file (a `mappings` block, say).
    pub async fn start_configured<I, S>(
        flavor: NatsFlavor,
        extra_args: I,
        extra_config: &str,
    ) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let binary = flavor.binary()?;
        let version = version_of(&binary)?;
        let extra: Vec<OsString> = extra_args.into_iter().map(Into::into).collect();
        let dir = tempfile::Builder::new()
            .prefix("sluice-nats-")
            .tempdir()
            .context("creating a temp dir for nats-server")?;
        let store_dir = dir.path().join("store");
        let config = dir.path().join("nats.conf");
        std::fs::write(&config, format!("{NATS_CONFIG}{extra_config}"))
            .with_context(|| format!("writing {}", config.display()))?;
        let http = crate::http::loopback_client(Duration::from_secs(2))?;

        let prepare = || {
            let (port, monitor_port) = (free_port()?, free_port()?);
            let spec = ProcessSpec::new(&binary)
                .name("nats-server")
                .arg("-c")
                .arg(&config)
                .args(["-js", "-a", "127.0.0.1"])
                .arg("-p")
                .arg(port.to_string())
                .arg("-m")
                .arg(monitor_port.to_string())
                .arg("-sd")
                .arg(&store_dir)
                .args(&extra);
            Ok((spec, (port, monitor_port)))
        };
        let check = |&(_, monitor_port): &(u16, u16)| {
            let http = http.clone();
            async move { check_health(&http, &monitor_url(monitor_port)).await }
        };
        let what = format!("nats-server {version}");
        let logs = dir.path().join("logs");
        let (process, (port, monitor_port)) =
            start_ready(&what, &logs, NATS_READY_DEADLINE, prepare, check).await?;
        Ok(Self {
            process,
            flavor,
            binary,
            version,
            port,
            monitor_port,
            store_dir,
            http,
            dir,
        })
    }

    /// Polls the monitoring endpoint until the server is healthy with JetStream on,
    /// failing early (with the log tail) if the process exits.
    pub(crate) async fn wait_ready(&mut self) -> Result<()> {
        let what = format!("nats-server {}", self.version);
        let (http, monitor) = (self.http.clone(), self.monitor_url());
        self.process
            .wait_ready(&what, NATS_READY_DEADLINE, || check_health(&http, &monitor))
            .await
    }

    /// The JetStream report from the monitoring endpoint (`/jsz`).
    pub async fn jsz(&self) -> Result<serde_json::Value> {
        jsz(&self.http, &self.monitor_url()).await
    }

    /// A stream's state from the monitoring endpoint (`/jsz?streams=true`): the
    /// `state` object (`messages`, `bytes`, `first_seq`, `last_seq`, ...), or an error
    /// when no account has the stream.
    pub async fn stream_state(&self, stream: &str) -> Result<serde_json::Value> {
        let response = self
            .http
            .get(format!(
                "{}/jsz?accounts=true&streams=true",
                self.monitor_url()
            ))
            .send()
            .await
            .context("GET /jsz?streams=true")?;
        let body = response.text().await.context("reading /jsz")?;
        let jsz: serde_json::Value =
            serde_json::from_str(&body).with_context(|| format!("/jsz is not JSON: {body}"))?;
        let details = jsz
            .get("account_details")
            .and_then(|a| a.as_array())
            .into_iter()
            .flatten()
            .filter_map(|a| a.get("stream_detail").and_then(|s| s.as_array()))
            .flatten();
        for detail in details {
            if detail.get("name").and_then(|n| n.as_str()) == Some(stream) {
                return detail
                    .get("state")
                    .cloned()
                    .ok_or_else(|| anyhow!("stream {stream} has no state in /jsz"));
            }
        }
        bail!("no stream {stream} in /jsz")
    }

    /// Whether the monitoring endpoint reports JetStream enabled.
    pub async fn jetstream_enabled(&self) -> Result<bool> {
        Ok(self.jsz().await?.get("config").is_some())
    }

    /// `nats://127.0.0.1:PORT`, for clients.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:MONITOR_PORT`, the monitoring endpoint.
    pub fn monitor_url(&self) -> String {
        monitor_url(self.monitor_port)
    }

    /// The JetStream store directory (`-sd`), kept across restarts.
    pub fn store_dir(&self) -> &Path {
        &self.store_dir
    }

    /// The temp dir holding the store and the logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn flavor(&self) -> &NatsFlavor {
        &self.flavor
    }

    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The server's version (`2.9.10`).
    pub fn version(&self) -> &str {
        &self.version
    }

    // --- lifecycle ---

    server_lifecycle!();
}

fn monitor_url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// `/healthz` answers ok (which, with JetStream on, includes its streams having
/// recovered) and `/jsz` shows a JetStream configuration.
async fn check_health(http: &reqwest::Client, monitor_url: &str) -> Result<()> {
    let response = http
        .get(format!("{monitor_url}/healthz"))
        .send()
        .await
        .context("GET /healthz")?;
    let status = response.status();
    let body = response.text().await.context("reading /healthz")?;
    if !status.is_success() {
        bail!("/healthz answered {status}: {body}");
    }
    let jsz = jsz(http, monitor_url).await?;
    if jsz.get("config").is_none() {
        bail!("JetStream is not enabled: /jsz answered {jsz}");
    }
    Ok(())
}

/// `GET /jsz`, parsed.
async fn jsz(http: &reqwest::Client, monitor_url: &str) -> Result<serde_json::Value> {
    let response = http
        .get(format!("{monitor_url}/jsz"))
        .send()
        .await
        .context("GET /jsz")?;
    let status = response.status();
    let body = response.text().await.context("reading /jsz")?;
    if !status.is_success() {
        bail!("/jsz answered {status}: {body}");
    }
    serde_json::from_str(&body).with_context(|| format!("/jsz is not JSON: {body}"))
}
