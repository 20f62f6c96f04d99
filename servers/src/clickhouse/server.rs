//! A real clickhouse-server on free loopback ports in a temp dir.

use std::env;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tempfile::TempDir;

use super::config::{self, Ports, DEFAULT_USER};
use super::current;
use super::flavor::ClickHouseFlavor;
use super::replication::Replication;
use crate::ports::free_port;
use crate::process::{on_path, server_lifecycle, start_ready, ManagedProcess, ProcessSpec};

/// Runs this binary instead of Debian's `/usr/sbin/clickhouse-server`. A binary named
/// `clickhouse` (the current all-in-one build) is run as `clickhouse server`.
pub const CLICKHOUSE_BIN_ENV: &str = "SLUICE_CLICKHOUSE_SERVER_BIN";

/// Where Debian's package puts the server.
pub const CLICKHOUSE_DEBIAN_BIN: &str = "/usr/sbin/clickhouse-server";

/// How long a (re)started server gets to answer `/ping`.
pub const CLICKHOUSE_READY_DEADLINE: Duration = Duration::from_secs(30);

/// What 18.16 logs when it refuses to start a Replicated table whose parts on disk
/// differ too much from ZooKeeper's (after a kill -9 right after inserts).
const PARTS_UNLIKE_ZOOKEEPER: &str = "doesn't look like the set of parts in ZooKeeper";

/// How long one statement run through [`ClickHouseServer::exec`] may take.
const EXEC_TIMEOUT: Duration = Duration::from_secs(60);

/// A running clickhouse-server whose data lives in a temp dir removed on drop (after
/// the process is killed).
#[derive(Debug)]
pub struct ClickHouseServer {
    // Field order matters: the process is killed before its directory is removed.
    process: ManagedProcess,
    /// Which engine: clickhouse-server, or chdb behind the harness's front.
    flavor: ClickHouseFlavor,
    binary: PathBuf,
    ports: Ports,
    http: reqwest::Client,
    replication: Option<Replication>,
    /// Each start refused after a crash and tried once more
    /// ([`ClickHouseServer::start_again_after_crash`]): the refusal with its log tail.
    refused_starts: Vec<String>,
    dir: TempDir,
}

/// How to start a clickhouse-server; the default is what [`ClickHouseServer::start`]
/// does.
#[derive(Clone, Debug, Default)]
pub struct ClickHouseOptions {
    /// A ZooKeeper root and macros, so that Replicated tables can be created.
    pub replication: Option<Replication>,
    /// The engine; `None` reads `SLUICE_TEST_CLICKHOUSE`.
    pub flavor: Option<ClickHouseFlavor>,
}

// === impl ClickHouseOptions ===

impl ClickHouseOptions {
    pub fn replicated(mut self, replication: Replication) -> Self {
        self.replication = Some(replication);
        self
    }

    pub fn flavor(mut self, flavor: ClickHouseFlavor) -> Self {
        self.flavor = Some(flavor);
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
        let flavor = match options.flavor {
            Some(flavor) => flavor,
            None => ClickHouseFlavor::from_env()?,
        };
        if flavor == ClickHouseFlavor::Current {
            if options.replication.is_some() {
                bail!(
                    "the current ClickHouse engine (chdb behind the harness's front) cannot \
                     hold Replicated tables: the first insert into one hangs"
                );
            }
            return Self::start_current().await;
        }
        let binary = binary()?;
        let dir = tempfile::Builder::new()
            .prefix("sluice-clickhouse-")
            .tempdir()
            .context("creating a temp dir for clickhouse-server")?;
        let http = crate::http::loopback_client(EXEC_TIMEOUT)?;
        let prepare = || {
            let ports = Ports {
                http: free_port()?,
                tcp: free_port()?,
            };
            // Written with each attempt: its interserver port is picked like the others,
            // and a port taken meanwhile must not be tried again (a cluster's start failed
            // on it three times in a row under load).
            if let Some(replication) = &options.replication {
                replication.write(dir.path())?;
            }
            let config = config::write(dir.path(), ports)?;
            let mut spec = ProcessSpec::new(&binary).name("clickhouse-server");
            if binary.file_name().is_some_and(|name| name == "clickhouse") {
                spec = spec.arg("server");
            }
            spec = spec
                .arg(format!("--config-file={}", config.display()))
                .current_dir(dir.path());
            for path in config::log_files(dir.path()) {
                spec = spec.log_file(path);
            }
            Ok((spec, ports))
        };
        let check = |ports: &Ports| {
            let (http, url) = (http.clone(), http_url(ports.http));
            async move { ping(&http, &url, Duration::from_secs(1)).await }
        };
        let logs = dir.path().join("log");
        let (process, ports) = start_ready(
            "clickhouse-server",
            &logs,
            CLICKHOUSE_READY_DEADLINE,
            prepare,
            check,
        )
        .await?;
        Ok(Self {
            process,
            flavor,
            binary,
            ports,
            http,
            replication: options.replication,
            refused_starts: Vec::new(),
            dir,
        })
    }

    /// The current engine: chdb behind the harness's HTTP front, one port.
    async fn start_current() -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("sluice-chdb-")
            .tempdir()
            .context("creating a temp dir for the current ClickHouse engine")?;
        let http = crate::http::loopback_client(EXEC_TIMEOUT)?;
        let prepare = || {
            let ports = Ports {
                http: free_port()?,
                tcp: 0,
            };
            Ok((current::spec(dir.path(), ports.http)?, ports))
        };
        let check = |ports: &Ports| {
            let (http, url) = (http.clone(), http_url(ports.http));
            async move { ping(&http, &url, Duration::from_secs(1)).await }
        };
        let logs = dir.path().join("log");
        let (process, ports) = start_ready(
            "the current ClickHouse engine (chdb front)",
            &logs,
            CLICKHOUSE_READY_DEADLINE,
            prepare,
            check,
        )
        .await
        .with_context(current::install_hint)?;
        Ok(Self {
            process,
            flavor: ClickHouseFlavor::Current,
            binary: current::python(),
            ports,
            http,
            replication: None,
            refused_starts: Vec::new(),
            dir,
        })
    }

    /// Which engine this server runs.
    pub fn flavor(&self) -> ClickHouseFlavor {
        self.flavor
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
        http_url(self.ports.http)
    }

    /// The HTTP interface's address, e.g. as the upstream of a fault proxy.
    pub fn http_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.ports.http))
    }

    pub fn http_port(&self) -> u16 {
        self.ports.http
    }

    /// The native protocol port (clickhouse-client); 0 on the current engine, which
    /// has none.
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

    /// Sets a server-wide MergeTree setting (`<merge_tree>` in `config.d/`, as an
    /// operator would in the server's config), from the next start on: what a table
    /// without its own `SETTINGS` gets, e.g. `replicated_deduplication_window`. Each
    /// call replaces the previous one's settings.
    pub fn set_merge_tree_settings(&self, settings: &[(&str, u64)]) -> Result<()> {
        if self.flavor == ClickHouseFlavor::Current {
            bail!("the current engine's front has no server config to set MergeTree settings in");
        }
        config::write_merge_tree(self.dir.path(), settings)
    }

    /// The ZooKeeper root and macros it was started with, if any.
    pub fn replication(&self) -> Option<&Replication> {
        self.replication.as_ref()
    }

    /// Starts a server killed with -9 again as an operator would: if 18.16 refuses
    /// because a Replicated table's parts on disk no longer match ZooKeeper's ("The
    /// local set of parts of table … doesn't look like the set of parts in ZooKeeper",
    /// its check after a crash), it creates `flags/force_restore_data` in the data
    /// directory (the server then detaches the parts ZooKeeper does not know and
    /// fetches the ones it lacks) and starts it once more. docs/operations.md gives
    /// operators the same step.
    ///
    /// A start refused for another reason is tried once more, as the service manager
    /// of a deployed server does (ClickHouse's packaged systemd unit has
    /// `Restart=always`; Debian's has no `Restart=`, docs/operations.md says to add
    /// one): 18.16 has, twice in some hundred restarts after a kill -9 of both
    /// replicas of a shard under load, exited while loading its metadata
    /// ("std::system_error: Invalid argument", exit 70), a crash of its own start
    /// rather than of its data. The restarted server logs in detail
    /// (`config::log_in_detail`), and the refusal is kept
    /// ([`ClickHouseServer::refused_starts`], which a scenario puts on its line), so
    /// that it names the step that threw. A second refusal is returned as it is.
    pub async fn start_again_after_crash(&mut self) -> Result<()> {
        if self.flavor == ClickHouseFlavor::Current {
            return self.start_again().await;
        }
        config::log_in_detail(self.dir.path())?;
        let Err(refused) = self.start_again().await else {
            return Ok(());
        };
        if self.process.logs_contain(PARTS_UNLIKE_ZOOKEEPER) {
            let flags = self.dir.path().join("data").join("flags");
            std::fs::create_dir_all(&flags)
                .with_context(|| format!("creating {}", flags.display()))?;
            let flag = flags.join("force_restore_data");
            std::fs::write(&flag, b"").with_context(|| format!("creating {}", flag.display()))?;
            tracing::warn!(
                server = %self.http_url(),
                "clickhouse-server refused to start after a crash (parts unlike ZooKeeper's); \
                 starting it again with flags/force_restore_data"
            );
            return self
                .start_again()
                .await
                .context("starting clickhouse-server again with flags/force_restore_data");
        }
        tracing::warn!(
            server = %self.http_url(),
            "clickhouse-server refused to start after a crash; starting it once more, as its \
             service manager would: {refused:#}"
        );
        self.refused_starts.push(format!("{refused:#}"));
        self.start_again()
            .await
            .with_context(|| format!("starting clickhouse-server once more after: {refused:#}"))
    }

    /// For each start refused after a crash and tried once more, the line that names
    /// why (the first error logged) and the line logged before it: what a scenario
    /// notes on its line.
    pub fn refused_starts(&self) -> Vec<String> {
        self.refused_starts
            .iter()
            .map(|refusal| why_refused(refusal))
            .collect()
    }

    // --- lifecycle ---

    server_lifecycle!();
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

fn http_url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
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

/// From a refused start's error (its log tail included): the first line ClickHouse
/// logged as an error, after the line logged before it (at `debug`, the step it was
/// at); the error's first line when the tail has no `<Error>` line.
fn why_refused(refusal: &str) -> String {
    let lines: Vec<&str> = refusal.lines().collect();
    match lines.iter().position(|line| line.contains("<Error>")) {
        Some(0) => lines[0].trim().to_owned(),
        Some(at) => format!("{} / {}", lines[at - 1].trim(), lines[at].trim()),
        None => lines.first().map_or("", |line| line.trim()).to_owned(),
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

#[cfg(test)]
mod tests {
    use super::why_refused;

    #[test]
    fn a_refusal_is_named_by_its_first_error_and_the_step_logged_before_it() {
        let refusal = "clickhouse-server exited during startup with exit status: 70\n\
            --- logs of clickhouse-server ---\n\
            [/tmp/x/log/server.log]\n\
            2026.12.03 10:00:00.1 [ 1 ] {} <Debug> default.events: Loading data parts\n\
            2026.12.03 10:00:00.2 [ 1 ] {} <Error> Application: Caught exception while loading metadata: Invalid argument\n\
            2026.12.03 10:00:00.3 [ 1 ] {} <Error> Application: second\n";
        assert_eq!(
            why_refused(refusal),
            "2026.12.03 10:00:00.1 [ 1 ] {} <Debug> default.events: Loading data parts / \
             2026.12.03 10:00:00.2 [ 1 ] {} <Error> Application: Caught exception while \
             loading metadata: Invalid argument"
        );
    }

    #[test]
    fn a_refusal_without_an_error_line_is_named_by_its_first_line() {
        assert_eq!(
            why_refused("clickhouse-server was not ready within 30s: /ping\nmore"),
            "clickhouse-server was not ready within 30s: /ping"
        );
        assert_eq!(why_refused(""), "");
    }

    #[test]
    fn an_error_on_the_first_line_is_named_alone() {
        assert_eq!(why_refused(" <Error> at once \nnext"), "<Error> at once");
    }
}
