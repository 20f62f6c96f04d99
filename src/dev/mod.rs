//! `sluice dev`: the zero-setup way to see Sluice work.
//!
//! Starts a nats-server (JetStream) and a clickhouse-server as children, each in a temp
//! dir on free loopback ports, creates a demo table, writes a configuration for them and
//! runs Sluice in this process with it. With `--demo-traffic` it also sends sample rows
//! through the ingest API (a few bad ones among them) and logs progress.
//!
//! Ctrl-C (or SIGTERM) stops Sluice first, as `sluice run` stops (buffers flushed, acks
//! settled), then both servers; a second Ctrl-C exits at once. The servers live in
//! process groups of their own, so the terminal's Ctrl-C reaches only this process, and
//! they are armed to die with it if it is killed outright.

mod servers;
pub mod traffic;

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _, Result};
use sluice_servers::{ClickHouseServer, NatsServer};
use tokio::sync::watch;

use crate::config::Config;

/// The tenant and table the demo uses.
pub const TENANT: &str = "demo";
pub const TABLE: &str = "events";

/// The demo table: a handful of typed columns, so a bad value has something to fail.
const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS default.events (
    ts DateTime,
    id UInt64,
    user_id UInt32,
    action String,
    amount Float64,
    duration_ms UInt32
) ENGINE = MergeTree ORDER BY (ts, id)";

/// How long Sluice gets to become ready before the demo gives up waiting on it.
const READY_DEADLINE: Duration = Duration::from_secs(60);

/// The variable the generated configuration names for the query user's password (the
/// ClickHouse of `sluice-servers` has a read-only user `query`).
const QUERY_PASSWORD_ENV: &str = "SLUICE_DEV_QUERY_PASSWORD";

/// How long each server gets to stop after being asked.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// What `sluice dev` was asked for.
#[derive(Clone, Debug)]
pub struct DevOptions {
    pub api: SocketAddr,
    pub admin: SocketAddr,
    pub demo_traffic: bool,
}

/// Runs everything until Ctrl-C; the exit code is Sluice's (0 after a clean stop).
pub async fn run(options: DevOptions) -> ExitCode {
    let stop = match watch_signals() {
        Ok(stop) => stop,
        Err(e) => {
            eprintln!("sluice dev: cannot listen for Ctrl-C: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    match run_inner(options, stop).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sluice dev: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run_inner(
    options: DevOptions,
    stop: watch::Receiver<Option<&'static str>>,
) -> Result<ExitCode> {
    // Everything that can be checked before a server starts, so a mistake costs no wait.
    port_is_free("API", "--api", options.api)?;
    port_is_free("admin", "--admin", options.admin)?;
    if !options.admin.ip().is_loopback() {
        bail!(
            "--admin {}: the admin endpoint of sluice dev has no token, so it listens on \
             loopback only; give a port or a 127.0.0.1 address",
            options.admin
        );
    }
    if options.api == options.admin {
        bail!(
            "--api and --admin are both {}: give them different ports",
            options.api
        );
    }
    let flavor = servers::nats_flavor()?;
    servers::check_clickhouse()?;

    tracing::info!(nats = %flavor, "starting nats-server and clickhouse-server");
    let started = tokio::select! {
        started = async { tokio::try_join!(NatsServer::start(flavor), ClickHouseServer::start()) } => started,
        signal = stopped(stop.clone()) => {
            // Dropping what was started kills it.
            tracing::info!(%signal, "interrupted while the servers were starting; stopped");
            return Ok(ExitCode::SUCCESS);
        }
    };
    let (mut nats, mut clickhouse) =
        started.map_err(|e| anyhow!("the local servers could not start: {e:#}"))?;

    let outcome = serve(&options, &nats, &clickhouse, stop).await;

    // Sluice has stopped (its rows flushed or handed back): now the servers. SIGINT is
    // nats-server's clean stop (it exits 1 on SIGTERM); clickhouse-server takes SIGTERM.
    let (n, c) = tokio::join!(
        stop_child(nats.process_mut(), libc::SIGINT),
        stop_child(clickhouse.process_mut(), libc::SIGTERM)
    );
    for (name, stopped) in [("nats-server", n), ("clickhouse-server", c)] {
        match stopped {
            Ok(status) if status.success() => tracing::info!("{name} stopped"),
            Ok(status) => tracing::warn!(%status, "{name} stopped"),
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "{name} did not stop cleanly"),
        }
    }
    outcome
}

/// Creates the table, writes the configuration and runs Sluice until told to stop.
async fn serve(
    options: &DevOptions,
    nats: &NatsServer,
    clickhouse: &ClickHouseServer,
    stop: watch::Receiver<Option<&'static str>>,
) -> Result<ExitCode> {
    clickhouse
        .exec(CREATE_TABLE)
        .await
        .context("creating the demo table default.events")?;
    let dir = tempfile::Builder::new()
        .prefix("sluice-dev-")
        .tempdir()
        .context("creating a temp dir for the configuration")?;
    let config_path = dir.path().join("config.toml");
    let text = config_text(options, &nats.url(), &clickhouse.http_url());
    std::fs::write(&config_path, &text)
        .with_context(|| format!("writing {}", config_path.display()))?;
    // The environment is left out on purpose: a SLUICE_* variable meant for another
    // deployment must not point the demo at it. Only the query user's password is there.
    let vars = BTreeMap::from([(
        QUERY_PASSWORD_ENV.to_string(),
        sluice_servers::QUERY_PASSWORD.to_string(),
    )]);
    let config = Config::from_parts(&config_path.display().to_string(), &text, &vars)
        .map_err(|e| anyhow!("the configuration sluice dev wrote is not valid: {e}"))?;

    let banner = Banner {
        options: options.clone(),
        nats,
        clickhouse,
        config_path: &config_path,
    }
    .to_string();
    let after_ready = tokio::spawn(when_ready(
        options.clone(),
        banner,
        clickhouse.http_url(),
        stop.clone(),
    ));
    let code = crate::server::run_until(config, stopped(stop)).await;
    after_ready.abort();
    code
}

/// Waits for Sluice to be ready, prints where everything listens, then sends the demo
/// traffic (if asked) until told to stop: at once, so that no row is sent to an API
/// that is shutting down.
async fn when_ready(
    options: DevOptions,
    banner: String,
    clickhouse_url: String,
    stop: watch::Receiver<Option<&'static str>>,
) {
    let admin = format!("http://{}", options.admin);
    let ready = match crate::clickhouse::endpoint::client_builder()
        .timeout(Duration::from_secs(2))
        .build()
    {
        Ok(client) => {
            let url = format!("{admin}/readyz");
            sluice_servers::wait_until(
                "sluice /readyz to answer 200",
                READY_DEADLINE,
                Duration::from_millis(100),
                || async {
                    matches!(client.get(&url).send().await, Ok(r) if r.status().is_success())
                },
            )
            .await
        }
        Err(e) => Err(e.into()),
    };
    if let Err(e) = ready {
        tracing::warn!(error = %format!("{e:#}"), "sluice is not ready yet; see {admin}/readyz");
    }
    println!("{banner}");
    if options.demo_traffic {
        let endpoints = traffic::Endpoints {
            api: format!("http://{}", options.api),
            admin,
            clickhouse: clickhouse_url,
            tenant: TENANT.into(),
            table: TABLE.into(),
        };
        tokio::select! {
            () = traffic::run(endpoints) => {}
            _ = stopped(stop) => {}
        }
    }
}

/// Asks a server to stop with `signal`, then kills it if it has not exited in time.
async fn stop_child(
    process: &mut sluice_servers::ManagedProcess,
    signal: i32,
) -> Result<std::process::ExitStatus> {
    if !process.is_running() {
        return process.wait_exit(Duration::ZERO).await;
    }
    process.signal(signal)?;
    match process.wait_exit(STOP_GRACE).await {
        Ok(status) => Ok(status),
        Err(_) => {
            tracing::warn!(grace = ?STOP_GRACE, "{} did not stop in time; killing it", process.spec().get_name());
            process.kill9().await
        }
    }
}

/// Fails with a clear message when something already listens on `addr`.
fn port_is_free(what: &str, flag: &str, addr: SocketAddr) -> Result<()> {
    match TcpListener::bind(addr) {
        Ok(listener) => {
            drop(listener);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => bail!(
            "the {what} port {} is taken: something already listens on {addr} (another \
             `sluice dev`?); choose a free one with {flag} PORT",
            addr.port()
        ),
        Err(e) => bail!("cannot listen on {addr} for the {what} ({flag}): {e}"),
    }
}

/// The first SIGINT or SIGTERM asks everything to stop; a second one exits at once
/// (the servers die with this process).
fn watch_signals() -> Result<watch::Receiver<Option<&'static str>>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt()).context("SIGINT")?;
    let mut term = signal(SignalKind::terminate()).context("SIGTERM")?;
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let first = tokio::select! {
            _ = int.recv() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        };
        tx.send_replace(Some(first));
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        eprintln!("sluice dev: second interrupt, exiting now");
        std::process::exit(130);
    });
    Ok(rx)
}

/// Resolves with the signal's name once one arrived.
async fn stopped(mut stop: watch::Receiver<Option<&'static str>>) -> &'static str {
    let signal = stop
        .wait_for(Option::is_some)
        .await
        .map(|signal| signal.unwrap_or("signal"));
    match signal {
        Ok(signal) => signal,
        // The watcher is gone: nothing will ever ask to stop.
        Err(_) => std::future::pending().await,
    }
}

/// The configuration `sluice dev` runs with; written next to its temp dir so it can be
/// read, or reused with `sluice run --config` while the servers run.
fn config_text(options: &DevOptions, nats_url: &str, clickhouse_url: &str) -> String {
    format!(
        r#"# Written by `sluice dev` for the servers it started; see config.toml in the
# repository for every key. To run it yourself while they run:
#   {QUERY_PASSWORD_ENV}={query_password} sluice run --config <this file>

[nats]
url = "{nats_url}"
max_bytes = "256MiB"
dlq_max_bytes = "64MiB"
ack_wait = "30s"

[clickhouse.targets.main]
url = "{clickhouse_url}"
user = "default"
database = "default"
insert_timeout = "10s"

[tenants.{TENANT}]
target = "main"

[ingest]
batch_rows = 1000
batch_age = "500ms"

[pipeline]
shutdown_deadline = "5s"

[query]
target = "main"
user = "{query_user}"
password_env = "{QUERY_PASSWORD_ENV}"

[api]
listen = "{api}"
auth = "none"

[admin]
listen = "{admin}"
"#,
        api = options.api,
        admin = options.admin,
        query_user = sluice_servers::QUERY_USER,
        query_password = sluice_servers::QUERY_PASSWORD,
    )
}

/// Where everything listens, and how to try it.
struct Banner<'a> {
    options: DevOptions,
    nats: &'a NatsServer,
    clickhouse: &'a ClickHouseServer,
    config_path: &'a Path,
}

impl std::fmt::Display for Banner<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let api = format!("http://{}", self.options.api);
        let admin = format!("http://{}", self.options.admin);
        let ch = self.clickhouse.http_url();
        let sample = traffic::sample_row(1).to_string();
        writeln!(f)?;
        writeln!(f, "sluice dev is running (Ctrl-C stops everything)")?;
        writeln!(f)?;
        writeln!(
            f,
            "  ingest API   {api}/v1/ingest/{{table}}   tenant {TENANT:?} from X-Tenant, no auth"
        )?;
        writeln!(f, "  admin page   {admin}/admin/")?;
        writeln!(f, "  metrics      {admin}/metrics")?;
        writeln!(f, "  parked rows  {admin}/admin/dlq/{TENANT}/{TABLE}")?;
        writeln!(
            f,
            "  NATS         {}   nats-server {}, store in {}",
            self.nats.url(),
            self.nats.version(),
            self.nats.dir().display()
        )?;
        writeln!(
            f,
            "  ClickHouse   {ch}   user default, no password; table default.{TABLE}; data in {}",
            self.clickhouse.dir().display()
        )?;
        writeln!(f, "  config       {}", self.config_path.display())?;
        writeln!(f)?;
        writeln!(f, "  ingest a row:")?;
        writeln!(
            f,
            "    curl -sS -X POST {api}/v1/ingest/{TABLE} -H 'X-Tenant: {TENANT}' -H 'Content-Type: application/json' -d '{sample}'"
        )?;
        writeln!(
            f,
            "  query through Sluice's gateway (read-only user {}):",
            sluice_servers::QUERY_USER
        )?;
        writeln!(
            f,
            "    curl -sS -X POST {api}/v1/query -H 'X-Tenant: {TENANT}' -H 'Content-Type: application/json' -d '{{\"sql\": \"SELECT action, count() AS rows FROM {TABLE} GROUP BY action\"}}'"
        )?;
        writeln!(f, "  query ClickHouse directly:")?;
        writeln!(
            f,
            "    curl -sS '{ch}/' --data-binary 'SELECT action, count(), sum(amount) FROM default.{TABLE} GROUP BY action'"
        )?;
        if self.options.demo_traffic {
            writeln!(f)?;
            writeln!(
                f,
                "  demo traffic: 50 rows/s through the ingest API, 1 in 50 with a string in the Float64 column amount (parked)"
            )?;
        }
        Ok(())
    }
}
