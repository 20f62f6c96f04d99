//! A real clickhouse-server on free loopback ports in a temp dir.

use std::env;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use tempfile::TempDir;

use super::config::{self, Ports, DEFAULT_USER};
use super::replication::Replication;
use crate::ports::free_port;
use crate::process::{on_path, ManagedProcess, ProcessSpec, DEFAULT_STOP_GRACE};

/// Runs this binary instead of Debian's `/usr/sbin/clickhouse-server`. A binary named
/// `clickhouse` (the current all-in-one build) is run as `clickhouse server`.
pub const CLICKHOUSE_BIN_ENV: &str = "SLUICE_CLICKHOUSE_SERVER_BIN";

/// Where Debian's package puts the server.
pub const CLICKHOUSE_DEBIAN_BIN: &str = "/usr/sbin/clickhouse-server";

/// How long a (re)started server gets to answer `/ping`.
pub const CLICKHOUSE_READY_DEADLINE: Duration = Duration::from_secs(30);

/// How long one statement run through [`ClickHouseServer::exec`] may take.
const EXEC_TIMEOUT: Duration = Duration::from_secs(60);

/// Attempts with fresh ports when another process took ours between probe and bind.
const PORT_ATTEMPTS: usize = 3;

/// A running clickhouse-server whose data lives in a temp dir removed on drop (after
/// the process is killed).
#[derive(Debug)]
pub struct ClickHouseServer {
    // Field order matters: the process is killed before its directory is removed.
    process: ManagedProcess,
    binary: PathBuf,
    ports: Ports,
    http: reqwest::Client,
    replication: Option<Replication>,
    dir: TempDir,
}

/// How to start a clickhouse-server; the default is what [`ClickHouseServer::start`]
/// does.
#[derive(Clone, Debug, Default)]
pub struct ClickHouseOptions {
    /// A ZooKeeper root and macros, so that Replicated tables can be created.
    pub replication: Option<Replication>,
}

// === impl ClickHouseOptions ===

impl ClickHouseOptions {
    pub fn replicated(mut self, replication: Replication) -> Self {
        self.replication = Some(replication);
        self
    }
}

// === impl ClickHouseServer ===

impl ClickHouseServer {
    /// Starts clickhouse-server with this crate's config and waits for `/ping`.
    pub async fn start() -> Result<Self> {
        Self::start_with(ClickHouseOptions::default()).await
    }

    /// Like [`ClickHouseServer::start`], with `options`.
    pub async fn start_with(options: ClickHouseOptions) -> Result<Self> {
        let binary = binary()?;
        let mut dir = tempfile::Builder::new()
            .prefix("sluice-clickhouse-")
            .tempdir()
            .context("creating a temp dir for clickhouse-server")?;
        let http = crate::http::loopback_client(EXEC_TIMEOUT)?;
        if let Some(replication) = &options.replication {
            replication.write(dir.path())?;
        }

        let mut last_error = anyhow!("clickhouse-server was not started");
        for _ in 0..PORT_ATTEMPTS {
            let ports = Ports {
                http: free_port()?,
                tcp: free_port()?,
            };
            let config = config::write(dir.path(), ports)?;
            let mut spec = ProcessSpec::new(&binary).name("clickhouse-server");
            if binary.file_name().is_some_and(|name| name == "clickhouse") {
                spec = spec.arg("server");
            }
            let spec = spec
                .arg(format!("--config-file={}", config.display()))
                .current_dir(dir.path());
            let mut process = ManagedProcess::start(spec, dir.path().join("log"))?;
            for path in config::log_files(dir.path()) {
                process.add_log_file(path);
            }
            let mut server = Self {
                process,
                binary: binary.clone(),
                ports,
                http: http.clone(),
                replication: options.replication.clone(),
                dir,
            };
            match server.wait_ready().await {
                Ok(()) => return Ok(server),
                Err(error) => {
                    let port_taken = server.process.logs_contain("Address already in use");
                    last_error = error;
                    let _ = server.process.kill9().await;
                    if !port_taken {
                        break;
                    }
                    tracing::warn!("clickhouse-server's port was taken; retrying with new ports");
                    let Self {
                        process, dir: kept, ..
                    } = server;
                    drop(process);
                    dir = kept;
                }
            }
        }
        Err(last_error)
    }

    /// Polls `/ping` until it answers `Ok.`, failing early (with the log tail) if the
    /// process exits.
    async fn wait_ready(&mut self) -> Result<()> {
        let (http, url) = (self.http.clone(), self.http_url());
        self.process
            .wait_ready("clickhouse-server", CLICKHOUSE_READY_DEADLINE, || {
                ping(&http, &url, Duration::from_secs(1))
            })
            .await
    }

    /// `GET /ping` within `timeout`; Ok when it answers `Ok.`.
    pub async fn ping(&self, timeout: Duration) -> Result<()> {
        ping(&self.http, &self.http_url(), timeout).await
    }

    /// Runs one statement as the `default` user and returns the response body. An
    /// error carries ClickHouse's status and message.
    pub async fn exec(&self, sql: &str) -> Result<String> {
        self.exec_as(DEFAULT_USER, "", sql).await
    }

    /// Runs one statement as `user` (HTTP basic auth).
    pub async fn exec_as(&self, user: &str, password: &str, sql: &str) -> Result<String> {
        let mut request = self.http.post(format!("{}/", self.http_url()));
        if user != DEFAULT_USER || !password.is_empty() {
            request = request.basic_auth(user, Some(password));
        }
        let response = request
            .body(sql.to_owned())
            .send()
            .await
            .with_context(|| format!("sending to ClickHouse: {}", abbreviate(sql)))?;
        let status = response.status();
        let body = response
            .text()
            .await
            .with_context(|| format!("reading ClickHouse's answer to: {}", abbreviate(sql)))?;
        if !status.is_success() {
            bail!(
                "ClickHouse answered {status} to `{}`: {}",
                abbreviate(sql),
                body.trim()
            );
        }
        Ok(body)
    }

    /// Counts rows: `count("events")` runs `SELECT count() FROM events`; an argument
    /// starting with `SELECT` runs as given and must return one number.
    pub async fn count(&self, table_or_sql: &str) -> Result<u64> {
        let trimmed = table_or_sql.trim();
        let sql = if trimmed
            .get(..6)
            .is_some_and(|head| head.eq_ignore_ascii_case("select"))
        {
            trimmed.to_owned()
        } else {
            format!("SELECT count() FROM {trimmed}")
        };
        let answer = self.exec(&sql).await?;
        answer
            .trim()
            .parse()
            .with_context(|| format!("`{sql}` did not return one number: {answer:?}"))
    }

    /// The server's version (`18.16.1`).
    pub async fn version(&self) -> Result<String> {
        Ok(self.exec("SELECT version()").await?.trim().to_owned())
    }

    /// `http://127.0.0.1:HTTP_PORT`.
    pub fn http_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.http)
    }

    /// The HTTP interface's address, e.g. as the upstream of a fault proxy.
    pub fn http_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.ports.http))
    }

    pub fn http_port(&self) -> u16 {
        self.ports.http
    }

    /// The native protocol port (clickhouse-client).
    pub fn tcp_port(&self) -> u16 {
        self.ports.tcp
    }

    /// The temp dir with config, data and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The ZooKeeper root and macros it was started with, if any.
    pub fn replication(&self) -> Option<&Replication> {
        self.replication.as_ref()
    }

    // --- lifecycle ---

    /// Graceful stop (SIGTERM, then SIGKILL after 10 s). Tables stay.
    pub async fn stop(&mut self) -> Result<ExitStatus> {
        self.process.stop(DEFAULT_STOP_GRACE).await
    }

    /// SIGKILL: a crash.
    pub async fn kill9(&mut self) -> Result<ExitStatus> {
        self.process.kill9().await
    }

    /// Starts the stopped or killed server again on the same ports and data, and waits
    /// for `/ping`.
    pub async fn start_again(&mut self) -> Result<()> {
        self.process.start_again()?;
        self.wait_ready().await
    }

    /// Stops (gracefully) if running, then starts again on the same ports and data.
    pub async fn restart(&mut self) -> Result<()> {
        self.stop().await?;
        self.start_again().await
    }

    /// Freezes the server: connections are accepted by the kernel, nothing answers.
    pub async fn sigstop(&mut self) -> Result<()> {
        self.process.sigstop().await
    }

    pub async fn sigcont(&mut self) -> Result<()> {
        self.process.sigcont().await
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// The last `lines` lines of stdout, stderr, server.log and err.log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// The underlying child, for anything not wrapped here.
    pub fn process_mut(&mut self) -> &mut ManagedProcess {
        &mut self.process
    }
}

/// The binary to run: the override, Debian's, or one on `PATH`.
pub fn binary() -> Result<PathBuf> {
    if let Some(path) = env::var_os(CLICKHOUSE_BIN_ENV).filter(|path| !path.is_empty()) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        bail!("{CLICKHOUSE_BIN_ENV}={} is not a file", path.display());
    }
    let debian = PathBuf::from(CLICKHOUSE_DEBIAN_BIN);
    if debian.is_file() {
        return Ok(debian);
    }
    if let Some(found) = ["clickhouse-server", "clickhouse"]
        .into_iter()
        .find_map(on_path)
    {
        return Ok(found);
    }
    bail!(
        "clickhouse-server is not installed ({CLICKHOUSE_DEBIAN_BIN} is missing and none is \
         on PATH): run `apt-get install clickhouse-server clickhouse-client`, or set \
         {CLICKHOUSE_BIN_ENV}"
    )
}

/// `GET /ping` within `timeout`; Ok when it answers `Ok.`.
async fn ping(http: &reqwest::Client, url: &str, timeout: Duration) -> Result<()> {
    let response = http
        .get(format!("{url}/ping"))
        .timeout(timeout)
        .send()
        .await
        .context("GET /ping")?;
    let status = response.status();
    let body = response.text().await.context("reading /ping")?;
    if status.is_success() && body.trim() == "Ok." {
        Ok(())
    } else {
        bail!("/ping answered {status}: {body:?}")
    }
}

/// The first line of a statement, cut to 200 characters, for error messages.
fn abbreviate(sql: &str) -> String {
    let first_line = sql.trim().lines().next().unwrap_or_default();
    let mut short: String = first_line.chars().take(200).collect();
    if short.len() < sql.trim().len() {
        short.push('…');
    }
    short
}
