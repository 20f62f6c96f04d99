//! `sluice-bench`: the benchmark of the performance targets (docs/benchmark.md), run on demand (never as a
//! timed test). It starts its own nats-server and clickhouse-server on loopback,
//! publishes the rows, and in one run measures the minimal reference loop and the real
//! `sluice run` binary side by side on the same servers and rows:
//!
//! - `reference`: pull, batch, one HTTP insert, ack each (a child process of its own);
//! - `sluice`: Sluice draining pre-published rows, first delivery to last row counted;
//! - `live`: Sluice while the rows are being published (informative);
//! - `bad`: like `sluice` with one bad row per 10,000 (bisection and the DLQ);
//! - `outage`: ClickHouse stopped, rows published, ClickHouse started after the outage:
//!   the drain of the backlog;
//! - `batched`: like `sluice`, the rows published 100 to a message;
//! - `api`: a load generator (a child process of its own) posting 1,000-row NDJSON
//!   requests to Sluice's ingest API while Sluice drains them, first request to last
//!   row counted; `api-unbatched` the same with `[api] chunk_rows = 1`, one row per
//!   message, as the API published before it chunked;
//! - `exactly-once`: like `sluice`, into a `ReplicatedMergeTree` table (ZooKeeper
//!   started for it): every batch recorded in the manifest bucket before its insert;
//! - `cluster`: like `exactly-once`, into a cluster of 2 shards × 2 replicas on the same
//!   machine (each shard's Replicated local table, counted through a `Distributed`
//!   table): the rate and Sluice's CPU per row against `exactly-once`'s one server.
//!
//! It prints rows/s, CPU µs per row (utime+stime from /proc ÷ rows), peak RSS (VmHWM)
//! and each target's ratio, as a table and as JSON. See docs/benchmark.md.
//!
//!     scripts/bench                 # builds sluice + sluice-bench (release), runs all
//!     scripts/bench --quick         # 100k rows, short outage: a smoke check

mod bench;
mod load;
mod partitions;
mod procfs;
mod publish;
mod reference;
mod report;
mod rows;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "sluice-bench",
    about = "Benchmarks Sluice against a minimal reference loop on the same servers and rows."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The reference loop (started by the benchmark as a child process).
    #[command(hide = true)]
    Reference(reference::ReferenceArgs),
    /// The load generator of the `api` phases (started by the benchmark).
    #[command(hide = true)]
    Load(load::LoadArgs),
    /// The queue in 1, 3 and 6 partitions on a three-node NATS cluster: how the
    /// nodes share the work (docs/benchmark.md, "Partitions").
    Partitions(partitions::PartitionsArgs),
}

/// A part of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Phase {
    /// (a) the minimal reference loop draining pre-published rows.
    Reference,
    /// (b) Sluice draining pre-published rows.
    Sluice,
    /// (b') Sluice while the rows are being published.
    Live,
    /// (c) Sluice draining rows with one bad row per 10,000.
    Bad,
    /// (d) the drain of a backlog published during a ClickHouse outage.
    Outage,
    /// (e) Sluice draining rows published `--message-rows` (100) to a message.
    Batched,
    /// (f) the ingest API fed `--request-rows` (1,000) rows per request, at its chunking.
    Api,
    /// (f') the same, one row per message (`[api] chunk_rows = 1`): the API before it
    /// chunked, the reference of (f).
    ApiUnbatched,
    /// (g) as (b), into a `ReplicatedMergeTree` table: exactly-once, every batch
    /// recorded in the manifest bucket (the stack gets a ZooKeeper for it).
    ExactlyOnce,
    /// (h) as (g), into a cluster of 2 shards × 2 replicas (started for it, beside the
    /// one server): batches spread over the shards, each recorded with its shard.
    Cluster,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Reference => "reference",
            Phase::Sluice => "sluice",
            Phase::Live => "live",
            Phase::Bad => "bad",
            Phase::Outage => "outage",
            Phase::Batched => "batched",
            Phase::Api => "api",
            Phase::ApiUnbatched => "api-unbatched",
            Phase::ExactlyOnce => "exactly-once",
            Phase::Cluster => "cluster",
        }
    }
}

#[derive(Clone, Debug, clap::Args)]
pub struct RunArgs {
    /// Rows per phase (default 1,000,000; 100,000 with --quick).
    #[arg(long, short = 'n')]
    rows: Option<u64>,
    /// Bytes per row (JSON object of 10 columns).
    #[arg(long, default_value_t = 200)]
    row_bytes: usize,
    /// Which phases, in order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "reference,sluice,exactly-once,cluster,batched,live,bad,outage,api,api-unbatched"
    )]
    phases: Vec<Phase>,
    /// Run the phases this many times (interleaved: a b c... a b c...); figures are medians.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// A smoke check: 100,000 rows and a 5 s outage, unless given explicitly.
    #[arg(long)]
    quick: bool,
    /// How long ClickHouse stays down in the outage phase (default 20; 5 with --quick).
    #[arg(long)]
    outage_secs: Option<u64>,
    /// One bad row per this many in the `bad` phase.
    #[arg(long, default_value_t = 10_000)]
    bad_every: u64,
    /// Write the JSON report here (`-` for stdout, after the table).
    #[arg(long)]
    json: Option<PathBuf>,
    /// The sluice binary (default: `sluice` beside this binary).
    #[arg(long, env = "SLUICE_BENCH_BIN")]
    sluice: Option<PathBuf>,
    /// nats-server: `debian` (2.9.10) or `current` (default from SLUICE_TEST_NATS).
    #[arg(long)]
    nats: Option<String>,
    /// Rows per pull request, for Sluice (`pipeline.pull_batch`) and the reference alike.
    #[arg(long, default_value_t = 1000)]
    pull_batch: usize,
    /// Rows per insert, for Sluice (`ingest.batch_rows`) and the reference alike.
    #[arg(long, default_value_t = 10_000)]
    batch_rows: usize,
    /// The consumer's `max_ack_pending`, for Sluice and the reference alike.
    #[arg(long, default_value_t = 20_000)]
    max_ack_pending: i64,
    /// Rows per message in the `batched` phase.
    #[arg(long, default_value_t = 100)]
    message_rows: usize,
    /// Rows per request of the load generator in the `api` phases.
    #[arg(long, default_value_t = 1000)]
    request_rows: u64,
    /// Requests the load generator keeps in flight.
    #[arg(long, default_value_t = 4)]
    load_concurrency: usize,
    /// Extra Sluice configuration, `dotted.key=toml-value` (e.g.
    /// `pipeline.max_inflight_flushes=4`); repeatable. Sluice only.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Exit 2 when a target is missed (by default only lost rows fail the run).
    #[arg(long)]
    check_targets: bool,
}

impl RunArgs {
    pub fn rows(&self) -> u64 {
        self.rows
            .unwrap_or(if self.quick { 100_000 } else { 1_000_000 })
    }

    pub fn outage(&self) -> Duration {
        Duration::from_secs(self.outage_secs.unwrap_or(if self.quick { 5 } else { 20 }))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let child = match cli.command {
        Some(Command::Reference(args)) => Some(("reference loop", reference::main(args))),
        Some(Command::Load(args)) => Some(("load generator", load::main(args))),
        Some(Command::Partitions(args)) => Some(("partitions", partitions::main(args))),
        None => None,
    };
    if let Some((what, outcome)) = child {
        return match outcome {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{what}: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SLUICE_BENCH_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bench::run(cli.run)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sluice-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
