//! The command line: `sluice run | dev | classify | check-config | healthcheck | dlq`.

mod admin_client;
mod check_config;
mod classify;
mod dev;
mod dlq;
mod healthcheck;
mod run;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::Config;

#[derive(Debug, Parser)]
#[command(
    name = "sluice",
    version,
    about = "Moves JSON rows from NATS JetStream into ClickHouse and never loses one."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run Sluice: pull rows from JetStream into ClickHouse, serve the ingest, query and
    /// admin endpoints. SIGTERM or SIGINT stops it gracefully.
    Run {
        /// The configuration file; without one, the configuration comes from SLUICE_* variables.
        #[arg(long, short, env = "SLUICE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Start a local nats-server and clickhouse-server (children in temp dirs), create a
    /// demo table and run Sluice against them: the zero-setup way to try it. Ctrl-C
    /// stops everything.
    Dev {
        /// Where the ingest API listens: a port (8080) or an address (127.0.0.1:8080).
        #[arg(long, default_value = "127.0.0.1:8080", value_parser = dev::parse_listen)]
        api: std::net::SocketAddr,
        /// Where the admin endpoint listens (loopback only: it has no token).
        #[arg(long, default_value = "127.0.0.1:9090", value_parser = dev::parse_listen)]
        admin: std::net::SocketAddr,
        /// Send sample rows through the ingest API (1 in 50 bad, to see rows parked) and
        /// log progress every few seconds.
        #[arg(long)]
        demo_traffic: bool,
    },
    /// Validate a configuration without starting anything; prints a summary or every
    /// problem, then which tables of each ClickHouse target are exactly-once.
    CheckConfig {
        /// The configuration file; without one, the configuration comes from SLUICE_* variables.
        #[arg(long, short, env = "SLUICE_CONFIG")]
        config: Option<PathBuf>,
        /// Do not ask ClickHouse which tables deduplicate inserts.
        #[arg(long)]
        offline: bool,
    },
    /// Exit 0 when the admin endpoint's /healthz answers 200 (a container HEALTHCHECK).
    Healthcheck {
        /// The configuration file, to find the admin listener; without one, SLUICE_* variables.
        #[arg(long, short, env = "SLUICE_CONFIG")]
        config: Option<PathBuf>,
        /// Ask this URL instead of the configured admin listener.
        #[arg(long)]
        url: Option<String>,
        /// Give up after this long.
        #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
    },
    /// Tell what Sluice does with a ClickHouse failure: a code (`252`), an error text
    /// (`"Code: 516. DB::Exception: ..."`) or a codeless HTTP status (`status:503`).
    Classify {
        /// The code, error text or `status:NNN`.
        #[arg(required = true, num_args = 1..)]
        what: Vec<String>,
    },
    /// The rows parked on the dead-letter queue: list them, peek at a table's with
    /// their reasons, replay them after a fix, or purge them; through the admin
    /// endpoint (SLUICE_ADMIN_URL, SLUICE_ADMIN_TOKEN), with the admin page's
    /// confirmations.
    Dlq(dlq::DlqArgs),
}

/// A one-thread runtime for a command that makes a few requests, or the exit code of a
/// failure to start one (said on stderr).
fn small_runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    runtime(tokio::runtime::Builder::new_current_thread())
}

/// The service's runtime (`run`, `dev`), or the exit code of a failure to start one.
fn service_runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    runtime(tokio::runtime::Builder::new_multi_thread())
}

fn runtime(mut builder: tokio::runtime::Builder) -> Result<tokio::runtime::Runtime, ExitCode> {
    builder.enable_all().build().map_err(|e| {
        eprintln!("cannot start the runtime: {e}");
        ExitCode::FAILURE
    })
}

/// The configuration at `path`, valid and taking rows, or the exit code of what is
/// wrong with it (said on stderr).
fn load_config(path: Option<&Path>) -> Result<Config, ExitCode> {
    let config = Config::load(path).map_err(|e| {
        eprint!("{e}");
        ExitCode::FAILURE
    })?;
    if let Some(why) = config.takes_no_row() {
        eprintln!("{why}");
        return Err(ExitCode::FAILURE);
    }
    Ok(config)
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run { config } => run::run(config.as_deref()),
        Command::Dev {
            api,
            admin,
            demo_traffic,
        } => dev::run(crate::dev::DevOptions {
            api,
            admin,
            demo_traffic,
        }),
        Command::CheckConfig { config, offline } => check_config::run(config.as_deref(), offline),
        Command::Classify { what } => classify::run(&what.join(" ")),
        Command::Healthcheck {
            config,
            url,
            timeout,
        } => healthcheck::run(config.as_deref(), url.as_deref(), timeout),
        Command::Dlq(args) => dlq::run(args),
    }
}
