//! The phases and how each is measured.
//!
//! Every drain is timed the same way, for the reference loop and for Sluice: from the
//! first delivery (the consumer's delivered sequence moves) to the moment ClickHouse
//! counts the last row (polled every 20 ms). CPU is the process's utime+stime over that
//! same window, read from /proc at both ends; start-up (spawn → ready) is reported
//! apart. Peak RSS is the process's VmHWM when the last row is counted.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use async_nats::jetstream;
use sluice_harness::clickhouse::{distributed, ClickHouseCluster};
use sluice_harness::{NatsFlavor, ProcessSpec, SluiceProcess, Stack, StackOptions, TENANT};

use crate::procfs;
use crate::publish::{self, Batch};
use crate::report::{self, Measured, Report};
use crate::rows::{create_table_sql, RowGen, COLUMNS};
use crate::{Phase, RunArgs};

/// The reference loop's stream (a work queue allows one unfiltered consumer, so the
/// reference and Sluice each have their own stream on the same server).
const REF_STREAM: &str = "BENCH_REF";
const REF_PREFIX: &str = "benchref";
const REF_CONSUMER: &str = "reference";
/// How often the watcher looks at ClickHouse, the consumer and /readyz.
const POLL: Duration = Duration::from_millis(20);
/// The `cluster` phase's layout: shards, replicas.
const CLUSTER: (usize, usize) = (2, 2);

pub async fn run(args: RunArgs) -> Result<ExitCode> {
    let sluice_bin = sluice_binary(args.sluice.as_deref())?;
    let flavor = match &args.nats {
        Some(name) => NatsFlavor::parse(name)?,
        None => NatsFlavor::from_env()?,
    };
    eprintln!(
        "sluice-bench: {} rows of {} B per phase, phases {:?} x{}; sluice = {}",
        args.rows(),
        args.row_bytes,
        args.phases.iter().map(|p| p.name()).collect::<Vec<_>>(),
        args.repeat,
        sluice_bin.display()
    );
    let mut bench = Bench::start(args.clone(), sluice_bin, flavor).await?;
    let mut measured = Vec::new();
    for rep in 1..=args.repeat.max(1) {
        for &phase in &args.phases {
            eprintln!("-- {} (run {rep}) ...", phase.name());
            let m = bench
                .phase(phase, rep)
                .await
                .with_context(|| format!("phase {} (run {rep})", phase.name()))?;
            eprintln!("   {}", report::one_line(&m));
            measured.push(m);
        }
    }
    let report = Report::new(bench.context().await, measured);
    print!("{}", report.table());
    let json = report.json();
    match args.json.as_deref() {
        Some(p) if p == Path::new("-") => {
            println!("{}", serde_json::to_string_pretty(&json)?);
        }
        Some(p) => {
            std::fs::write(p, serde_json::to_string_pretty(&json)? + "\n")
                .with_context(|| format!("writing {}", p.display()))?;
            eprintln!("JSON report written to {}", p.display());
        }
        None => {}
    }
    if report.lost_rows() > 0 {
        eprintln!("sluice-bench: rows were lost");
        return Ok(ExitCode::FAILURE);
    }
    if args.check_targets && !report.all_targets_met() {
        return Ok(ExitCode::from(2));
    }
    Ok(ExitCode::SUCCESS)
}

/// `--sluice`, else `sluice` beside this binary (`scripts/bench` builds both, so the
/// binary measured is the one of the source at hand).
pub(crate) fn sluice_binary(given: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    let me = std::env::current_exe().context("locating this binary")?;
    let dir = me
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent directory", me.display()))?;
    let path = dir.join("sluice");
    if !path.is_file() {
        bail!(
            "{} is missing: build it with `cargo build --release -p sluice -p sluice-bench` \
             (scripts/bench does), or pass --sluice PATH",
            path.display()
        );
    }
    Ok(path)
}

/// The servers, the benchmark's own NATS connection and the bookkeeping.
struct Bench {
    args: RunArgs,
    stack: Stack,
    js: jetstream::Context,
    gen: RowGen,
    sluice_bin: PathBuf,
    bench_bin: PathBuf,
    next_id: u64,
    nats_version: String,
    clickhouse_version: String,
    /// The `cluster` phase's servers, started for its first run (on the stack's
    /// ZooKeeper), and the tables made on them.
    cluster: Option<ClickHouseCluster>,
    cluster_tables: Vec<String>,
}

/// One reading of every clock the figures come from.
#[derive(Clone, Copy, Debug)]
pub struct Snap {
    pub at: Instant,
    /// The process under test.
    pub proc_cpu: Option<f64>,
    /// Its kernel part.
    pub proc_sys: Option<f64>,
    pub nats_cpu: Option<f64>,
    pub clickhouse_cpu: Option<f64>,
    pub bench_cpu: Option<f64>,
    /// The `api` phases' load generator.
    pub loader_cpu: Option<f64>,
    pub machine_busy: Option<f64>,
}

/// What the watcher waits for.
struct Watch<'a> {
    table: &'a str,
    rows: u64,
    /// DLQ messages to reach (absolute count on the DLQ stream).
    dlq_messages: Option<u64>,
    /// Start the clock when this consumer's delivered sequence passes the baseline;
    /// without one the clock starts at once.
    consumer: Option<(&'a str, &'a str, u64)>,
    /// Record when this URL first answers 200 (Sluice's /readyz).
    ready_url: Option<String>,
    pid: Option<u32>,
    /// A load generator whose CPU is read apart.
    loader: Option<u32>,
    deadline: Duration,
}

#[derive(Debug)]
struct Watched {
    start: Snap,
    end: Snap,
    ready_at: Option<Instant>,
    first_row: Option<(Instant, u64)>,
    peak_rss: Option<u64>,
    /// (seconds since the watch began, rows counted), every ~200 ms.
    progress: Vec<(f64, u64)>,
    /// The first readings at or past 10% and 90% of the rows: the slope between them
    /// is the phase's rate without its start (first batch, breaker probe) and its tail
    /// (a last partial batch waits `batch_age`).
    bulk: [Option<(Instant, u64)>; 2],
}

impl Bench {
    async fn start(args: RunArgs, sluice_bin: PathBuf, flavor: NatsFlavor) -> Result<Self> {
        let mut options = StackOptions {
            nats: Some(flavor),
            ..StackOptions::default()
        };
        if args.phases.contains(&Phase::ExactlyOnce) || args.phases.contains(&Phase::Cluster) {
            options = options.with_zookeeper();
        }
        let mut stack = Stack::start(options)
            .await
            .context("starting nats-server and clickhouse-server")?;
        // Sluice at its defaults (config.toml), but for the stack's test-speed batch
        // age and a stream large enough for a million rows.
        stack.unset("ingest.batch_age");
        stack.set("nats.max_bytes", "4GiB");
        stack.set("nats.ack_wait", "60s");
        stack.set("nats.max_ack_pending", args.max_ack_pending);
        stack.set("clickhouse.targets.main.insert_timeout", "30s");
        stack.set("ingest.batch_rows", args.batch_rows as i64);
        stack.set("pipeline.pull_batch", args.pull_batch as i64);
        stack.set("log.level", "warn");
        for kv in &args.sets {
            let (key, value) = kv
                .split_once('=')
                .ok_or_else(|| anyhow!("--set {kv}: expected KEY=VALUE"))?;
            let value: toml::Value = toml::from_str::<toml::Table>(&format!("v = {value}"))
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or_else(|| toml::Value::String(value.to_string()));
            stack.set(key, value);
        }
        let client = async_nats::connect(stack.nats.url())
            .await
            .context("connecting to nats-server")?;
        let js = publish::context(client);
        // The streams exactly as Sluice makes them (so it finds them as it wants them),
        // and the reference loop's twin.
        let config_path = stack.write_config()?;
        let config = sluice::config::Config::load(Some(&config_path))
            .map_err(|e| anyhow!("the benchmark's sluice config: {e}"))?;
        let settings = config.nats.streams.clone();
        sluice::nats::ensure_streams(&js, &settings).await?;
        let ingest = js.get_stream(&settings.stream).await?.cached_info().clone();
        let mut reference = ingest.config.clone();
        reference.name = REF_STREAM.to_string();
        reference.subjects = vec![format!("{REF_PREFIX}.>")];
        reference.description = Some("sluice-bench: the reference loop's rows".into());
        js.create_stream(reference)
            .await
            .map_err(|e| anyhow!("creating stream {REF_STREAM}: {e}"))?;
        let nats_version = stack.nats.version().to_string();
        let clickhouse_version = stack.clickhouse.version().await?;
        let bench_bin = std::env::current_exe()?;
        Ok(Self {
            gen: RowGen::new(args.row_bytes),
            args,
            stack,
            js,
            sluice_bin,
            bench_bin,
            next_id: 1,
            nats_version,
            clickhouse_version,
            cluster: None,
            cluster_tables: Vec::new(),
        })
    }

    /// The `cluster` phase's table: each shard's Replicated local table, and a
    /// `Distributed` one over them to count through (the cluster started first).
    async fn cluster_table(&mut self, table: &str) -> Result<()> {
        if self.cluster.is_none() {
            let zookeeper = self
                .stack
                .zookeeper
                .as_ref()
                .context("the cluster phase needs the stack's ZooKeeper")?;
            let root = zookeeper.new_root().await?;
            let (shards, replicas) = CLUSTER;
            let started = Instant::now();
            self.cluster = Some(ClickHouseCluster::start(&root, shards, replicas).await?);
            eprintln!(
                "   started a cluster of {shards} shards x {replicas} replicas in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        let cluster = self.cluster.as_ref().context("started above")?;
        cluster.create_table(table, COLUMNS, "id").await?;
        self.cluster_tables.push(table.to_owned());
        Ok(())
    }

    /// Where Sluice's target points for `table`'s phase: the cluster's shards for the
    /// `cluster` phase (its `url` unset), the stack's server otherwise (`None`: unset).
    fn target_overrides(&self, table: &str) -> Vec<(&'static str, Option<toml::Value>)> {
        let Some(cluster) = self.cluster.as_ref().filter(|_| self.is_cluster(table)) else {
            return Vec::new();
        };
        let shards = cluster.shard_urls().into_iter().map(toml::Value::String);
        vec![
            ("clickhouse.targets.main.url", None),
            (
                "clickhouse.targets.main.shards",
                Some(toml::Value::Array(shards.collect())),
            ),
        ]
    }

    fn is_cluster(&self, table: &str) -> bool {
        self.cluster_tables.iter().any(|t| t == table)
    }

    /// Rows `table` holds: on the stack's server, or on a cluster through its
    /// `Distributed` table.
    async fn landed(&self, table: &str) -> Result<u64> {
        match self.cluster.as_ref().filter(|_| self.is_cluster(table)) {
            Some(cluster) => cluster.node(0, 0).count(&distributed(table)).await,
            None => self.stack.clickhouse.count(table).await,
        }
    }

    async fn context(&self) -> report::Context {
        let sluice_version = std::process::Command::new(&self.sluice_bin)
            .arg("--version")
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        report::Context {
            rows: self.args.rows(),
            row_bytes: self.args.row_bytes,
            pull_batch: self.args.pull_batch,
            batch_rows: self.args.batch_rows,
            max_ack_pending: self.args.max_ack_pending,
            outage_secs: self.args.outage().as_secs(),
            bad_every: self.args.bad_every,
            message_rows: self.args.message_rows,
            request_rows: self.args.request_rows,
            load_concurrency: self.args.load_concurrency,
            sets: self.args.sets.clone(),
            nats_version: self.nats_version.clone(),
            clickhouse_version: self.clickhouse_version.clone(),
            sluice_version,
            sluice_config: self.stack.config_text(),
            cpus: procfs::cpus(),
            kernel: procfs::kernel(),
            load_at_end: procfs::loadavg(),
        }
    }

    async fn phase(&mut self, phase: Phase, rep: usize) -> Result<Measured> {
        // Table names take no `-` (api-unbatched).
        let table = format!("{}_{rep}", phase.name().replace('-', "_"));
        if phase == Phase::Cluster {
            self.cluster_table(&table).await?;
        } else if phase == Phase::ExactlyOnce {
            // A plain table to copy the columns from, then the Replicated one.
            let plain = format!("{table}_plain");
            self.stack
                .clickhouse
                .exec(&create_table_sql(&plain))
                .await?;
            self.stack.create_replicated_table(&table, &plain).await?;
        } else {
            self.stack
                .clickhouse
                .exec(&create_table_sql(&table))
                .await?;
        }
        let load_before = procfs::loadavg();
        let mut m = match phase {
            Phase::Reference => self.reference(&table).await?,
            Phase::Sluice => self.sluice_drain(&table, false, 1).await?,
            Phase::Bad => self.sluice_drain(&table, true, 1).await?,
            Phase::Batched => {
                let per_message = self.args.message_rows;
                self.sluice_drain(&table, false, per_message).await?
            }
            Phase::Live => self.live(&table).await?,
            Phase::Outage => self.outage(&table).await?,
            Phase::Api => self.api(&table, None).await?,
            Phase::ApiUnbatched => self.api(&table, Some(1)).await?,
            Phase::ExactlyOnce | Phase::Cluster => self.sluice_drain(&table, false, 1).await?,
        };
        m.phase = phase.name();
        m.run = rep;
        m.load_before = load_before;
        m.load_after = procfs::loadavg();
        self.verify(&table, &mut m).await?;
        Ok(m)
    }

    fn batch(&mut self, subject: String, bad: bool) -> Batch {
        let count = self.args.rows();
        let batch = Batch {
            subject,
            first_id: self.next_id,
            count,
            bad_every: bad.then_some(self.args.bad_every),
            rows_per_message: 1,
        };
        self.next_id += count;
        batch
    }

    async fn publish(&self, batch: &Batch) -> Result<Duration> {
        let took = publish::publish(&self.js, &self.gen, batch).await?;
        eprintln!(
            "   published {} rows in {:.2} s ({:.0} rows/s)",
            batch.count,
            took.as_secs_f64(),
            batch.count as f64 / took.as_secs_f64()
        );
        Ok(took)
    }

    /// (a) The reference loop drains pre-published rows.
    async fn reference(&mut self, table: &str) -> Result<Measured> {
        let batch = self.batch(format!("{REF_PREFIX}.{TENANT}.{table}"), false);
        let published = self.publish(&batch).await?;
        let baseline = self.delivered(REF_STREAM, REF_CONSUMER).await;
        let spec = ProcessSpec::new(&self.bench_bin)
            .name("reference")
            .arg("reference")
            .args(["--nats", &self.stack.nats.url()])
            .args(["--stream", REF_STREAM, "--consumer", REF_CONSUMER])
            .args(["--clickhouse", &self.stack.clickhouse.http_url()])
            .args(["--table", table])
            .args(["--rows", &batch.count.to_string()])
            .args(["--pull-batch", &self.args.pull_batch.to_string()])
            .args(["--batch-rows", &self.args.batch_rows.to_string()])
            .args(["--max-ack-pending", &self.args.max_ack_pending.to_string()]);
        let spawned = Instant::now();
        let mut child = SluiceProcess::start_spec(spec)?;
        let watched = self
            .watch(Watch {
                table,
                rows: batch.count,
                dlq_messages: None,
                consumer: Some((REF_STREAM, REF_CONSUMER, baseline)),
                ready_url: None,
                pid: child.pid(),
                loader: None,
                deadline: self.deadline(),
            })
            .await
            .map_err(|e| anyhow!("{e:#}\nreference log:\n{}", child.log_tail(20)))?;
        let cpu_total = child.pid().and_then(procfs::cpu_seconds);
        child.stop(Duration::from_secs(10)).await?;
        let mut m = Measured::from_watch(&watched, batch.count, spawned, cpu_total);
        m.publish_seconds = Some(published.as_secs_f64());
        Ok(m)
    }

    /// (b) / (c) / (e) Sluice drains pre-published rows (with bad ones for (c), many to
    /// a message for (e)).
    async fn sluice_drain(
        &mut self,
        table: &str,
        bad: bool,
        per_message: usize,
    ) -> Result<Measured> {
        let mut batch = self.batch(format!("ingest.{TENANT}.{table}"), bad);
        batch.rows_per_message = per_message;
        let bad_rows = batch.bad_rows();
        let published = self.publish(&batch).await?;
        let dlq_before = self.stream_messages("DLQ").await?;
        let baseline = self.delivered("INGEST", "sluice").await;
        // Many rows to a message: the same knobs as the one-row phases, which count
        // rows (`pull_batch`, `max_held_rows`: the source asks for messages by the rows
        // they bring), so the same rows are in flight and per pull.
        let overrides = self.target_overrides(table);
        let spawned = Instant::now();
        let index = self.sluice_with(&overrides, false).await?;
        let pid = self.stack.sluice[index].pid();
        let ready_url = format!("{}/readyz", self.stack.admin_url());
        let watched = self
            .watch(Watch {
                table,
                rows: batch.count - bad_rows,
                dlq_messages: bad.then_some(dlq_before + bad_rows),
                consumer: Some(("INGEST", "sluice", baseline)),
                ready_url: Some(ready_url),
                pid,
                loader: None,
                deadline: self.deadline(),
            })
            .await;
        let watched = self.or_log(index, watched)?;
        let cpu_total = pid.and_then(procfs::cpu_seconds);
        let counters = self.sluice_counters().await;
        // Idle cost: the drained process's CPU over a few quiet seconds (pull timeouts,
        // heartbeats, table ticks).
        let idle = Duration::from_secs(3);
        let before = pid.and_then(procfs::cpu_seconds);
        tokio::time::sleep(idle).await;
        let after = pid.and_then(procfs::cpu_seconds);
        self.stop_sluice(index).await?;
        let mut m = Measured::from_watch(&watched, batch.count, spawned, cpu_total);
        m.sluice_counters = counters;
        m.publish_seconds = Some(published.as_secs_f64());
        m.bad_rows = bad_rows;
        if per_message > 1 {
            m.note = Some(format!(
                "{per_message} rows per message; pull_batch {} rows, max_held_rows as many rows as max_ack_pending {} counts messages",
                self.args.pull_batch, self.args.max_ack_pending
            ));
        }
        if let (Some(a), Some(b)) = (before, after) {
            m.idle_cpu_percent = Some((b - a) * 100.0 / idle.as_secs_f64());
        }
        Ok(m)
    }

    /// (b') Sluice running while the rows are published; the clock starts with the
    /// first publish.
    async fn live(&mut self, table: &str) -> Result<Measured> {
        let batch = self.batch(format!("ingest.{TENANT}.{table}"), false);
        let spawned = Instant::now();
        let index = self.start_sluice().await?;
        let startup = spawned.elapsed();
        let pid = self.stack.sluice[index].pid();
        let start = self.snap(pid, None);
        let publish = async {
            publish::publish(&self.js, &self.gen, &batch)
                .await
                .map(|d| d.as_secs_f64())
        };
        let watch = self.watch(Watch {
            table,
            rows: batch.count,
            dlq_messages: None,
            consumer: None,
            ready_url: None,
            pid,
            loader: None,
            deadline: self.deadline(),
        });
        let (published, watched) = tokio::join!(publish, watch);
        let mut watched = self.or_log(index, watched)?;
        watched.start = start;
        let cpu_total = pid.and_then(procfs::cpu_seconds);
        let counters = self.sluice_counters().await;
        self.stop_sluice(index).await?;
        let mut m = Measured::from_watch(&watched, batch.count, spawned, cpu_total);
        m.sluice_counters = counters;
        m.startup_seconds = Some(startup.as_secs_f64());
        m.publish_seconds = Some(published?);
        Ok(m)
    }

    /// (d) Sluice up, ClickHouse stopped, the rows published during the outage,
    /// ClickHouse started again when the outage is over: the drain of the backlog.
    async fn outage(&mut self, table: &str) -> Result<Measured> {
        let batch = self.batch(format!("ingest.{TENANT}.{table}"), false);
        let spawned = Instant::now();
        let index = self.start_sluice().await?;
        let startup = spawned.elapsed();
        let pid = self.stack.sluice[index].pid();
        let down = Instant::now();
        self.stack.clickhouse.stop().await?;
        let published = self.publish(&batch).await?;
        let outage = self.args.outage();
        if let Some(rest) = outage.checked_sub(down.elapsed()) {
            tokio::time::sleep(rest).await;
        } else {
            eprintln!(
                "   note: publishing took longer than the {} s outage",
                outage.as_secs()
            );
        }
        let rss_during_outage = pid.and_then(|p| procfs::vm_bytes(p, "VmHWM"));
        self.stack.clickhouse.start_again().await?;
        let outage_took = down.elapsed();
        let watched = self
            .watch(Watch {
                table,
                rows: batch.count,
                dlq_messages: None,
                consumer: None,
                ready_url: None,
                pid,
                loader: None,
                deadline: self.deadline() + Duration::from_secs(60),
            })
            .await;
        let watched = self.or_log(index, watched)?;
        let cpu_total = pid.and_then(procfs::cpu_seconds);
        let counters = self.sluice_counters().await;
        self.stop_sluice(index).await?;
        let mut m = Measured::from_watch(&watched, batch.count, spawned, cpu_total);
        m.sluice_counters = counters;
        m.startup_seconds = Some(startup.as_secs_f64());
        m.publish_seconds = Some(published.as_secs_f64());
        m.outage_seconds = Some(outage_took.as_secs_f64());
        m.rss_during_outage = rss_during_outage;
        // The drain proper: from the first rows counted after the restart to the last,
        // over the rows in between; the wait for the breaker's probe is reported apart.
        if let Some((first_at, first_count)) = watched.first_row {
            let up = watched.start.at;
            m.recovery_seconds = Some(first_at.duration_since(up).as_secs_f64());
            let secs = watched.end.at.duration_since(first_at).as_secs_f64();
            let rows = batch.count.saturating_sub(first_count);
            if secs > 0.0 && rows > 0 {
                m.drain_rows_per_sec = Some(rows as f64 / secs);
            }
        }
        Ok(m)
    }

    /// (f) / (f') The ingest API under a load generator of `--request-rows` NDJSON
    /// requests, Sluice draining meanwhile; timed from the first request to the last row
    /// counted. `chunk_rows` overrides `[api] chunk_rows` for this phase (1: one row per
    /// message, the API before it chunked).
    async fn api(&mut self, table: &str, chunk_rows: Option<usize>) -> Result<Measured> {
        let (first_id, count) = (self.next_id, self.args.rows());
        self.next_id += count;
        let overrides: Vec<(&str, Option<toml::Value>)> = chunk_rows
            .map(|rows| ("api.chunk_rows", Some(toml::Value::from(rows as i64))))
            .into_iter()
            .collect();
        let spawned = Instant::now();
        let index = self.sluice_with(&overrides, true).await?;
        let startup = spawned.elapsed();
        let pid = self.stack.sluice[index].pid();
        let dlq_before = self.stream_messages("DLQ").await?;
        let report = tempfile::NamedTempFile::new().context("the load report's file")?;
        let spec = ProcessSpec::new(&self.bench_bin)
            .name("load")
            .arg("load")
            .args(["--api", &self.stack.api_url()])
            .args(["--tenant", TENANT, "--table", table])
            .args(["--first-id", &first_id.to_string()])
            .args(["--rows", &count.to_string()])
            .args(["--row-bytes", &self.args.row_bytes.to_string()])
            .args(["--request-rows", &self.args.request_rows.to_string()])
            .args(["--concurrency", &self.args.load_concurrency.to_string()])
            .arg("--report")
            .arg(report.path().as_os_str());
        let start = self.snap(pid, None);
        let mut loader = SluiceProcess::start_spec(spec)?;
        let watched = self
            .watch(Watch {
                table,
                rows: count,
                dlq_messages: None,
                consumer: None,
                ready_url: None,
                pid,
                loader: loader.pid(),
                deadline: self.deadline(),
            })
            .await;
        let mut watched = self
            .or_log(index, watched)
            .map_err(|e| anyhow!("{e:#}\nload generator log:\n{}", loader.log_tail(20)))?;
        // The clock started before the load generator did (its CPU then was nil).
        watched.start = Snap {
            loader_cpu: Some(0.0),
            ..start
        };
        let cpu_total = pid.and_then(procfs::cpu_seconds);
        let counters = self.sluice_counters().await;
        let answered = self.load_report(report.path(), &mut loader).await;
        loader.stop(Duration::from_secs(10)).await?;
        self.stop_sluice(index).await?;
        let answered = answered?;
        let mut m = Measured::from_watch(&watched, count, spawned, cpu_total);
        m.sluice_counters = counters;
        m.startup_seconds = Some(startup.as_secs_f64());
        m.accepted = answered["accepted"].as_u64();
        m.load_unavailable = answered["unavailable"].as_u64().unwrap_or(0);
        m.parked = self
            .stream_messages("DLQ")
            .await?
            .saturating_sub(dlq_before);
        Ok(m)
    }

    /// What the load generator says the API answered (it writes it once every request
    /// is answered, which is before its last rows can be counted).
    async fn load_report(
        &self,
        path: &Path,
        loader: &mut SluiceProcess,
    ) -> Result<serde_json::Value> {
        let text = sluice_harness::wait_for(
            "the load generator's report",
            Duration::from_secs(60),
            POLL,
            || async {
                match std::fs::read_to_string(path) {
                    Ok(text) if !text.is_empty() => Ok(text),
                    _ => bail!("not written yet"),
                }
            },
        )
        .await
        .map_err(|e| anyhow!("{e:#}\nload generator log:\n{}", loader.log_tail(20)))?;
        serde_json::from_str(&text).with_context(|| format!("the load report {text:?}"))
    }

    /// Starts Sluice with `overrides` on top of the run's configuration, for this phase
    /// only; waits for `/readyz` when `ready`. Returns its index.
    async fn sluice_with(
        &mut self,
        overrides: &[(&str, Option<toml::Value>)],
        ready: bool,
    ) -> Result<usize> {
        let saved: Vec<(&str, Option<toml::Value>)> = overrides
            .iter()
            .map(|(key, _)| (*key, self.config_value(key)))
            .collect();
        for (key, value) in overrides {
            match value {
                Some(value) => self.stack.set(key, value.clone()),
                None => self.stack.unset(key),
            }
        }
        let started = if ready {
            self.start_sluice().await
        } else {
            self.stack.spawn_sluice(&self.sluice_bin)
        };
        for (key, value) in saved {
            match value {
                Some(value) => self.stack.set(key, value),
                None => self.stack.unset(key),
            }
        }
        started
    }

    /// A key of the run's Sluice configuration (`section.key`).
    fn config_value(&self, dotted: &str) -> Option<toml::Value> {
        let mut parts = dotted.split('.');
        let mut value = self.stack.config.get(parts.next()?)?;
        for part in parts {
            value = value.get(part)?;
        }
        Some(value.clone())
    }

    async fn start_sluice(&mut self) -> Result<usize> {
        let index = self.stack.spawn_sluice(&self.sluice_bin)?;
        self.stack
            .wait_ready(index, Duration::from_secs(60))
            .await?;
        Ok(index)
    }

    async fn stop_sluice(&mut self, index: usize) -> Result<()> {
        let process = &mut self.stack.sluice[index];
        let status = process.stop(Duration::from_secs(30)).await?;
        if !status.success() {
            eprintln!(
                "   note: sluice exited with {status}\n{}",
                process.log_tail(20)
            );
        }
        Ok(())
    }

    /// Sluice's own counters at the end of a phase (inserts by outcome, rows handed
    /// back, batch sizes): what it did, beside how fast.
    async fn sluice_counters(&self) -> Vec<(String, f64)> {
        let Ok(text) = self.stack.metrics().await else {
            return Vec::new();
        };
        let mut out: Vec<(String, f64)> = Vec::new();
        for line in text.lines() {
            let wanted = [
                "sluice_insert_requests_total",
                "sluice_retries_total",
                "sluice_batch_rows_sum",
                "sluice_batch_rows_count",
                "sluice_rows_parked_total",
                "sluice_rows_received_total",
                "sluice_messages_received_total",
                "sluice_ingest_rows_total",
                "sluice_ingest_messages_total",
            ];
            if !wanted.iter().any(|w| line.starts_with(w)) {
                continue;
            }
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            if value != 0.0 {
                out.push((name.to_string(), value));
            }
        }
        out
    }

    fn or_log<T>(&self, index: usize, r: Result<T>) -> Result<T> {
        r.map_err(|e| {
            let tail = self
                .stack
                .sluice
                .get(index)
                .map(|p| p.log_tail(30))
                .unwrap_or_default();
            anyhow!("{e:#}\nsluice log:\n{tail}")
        })
    }

    fn deadline(&self) -> Duration {
        Duration::from_secs(120) + Duration::from_millis(self.args.rows() / 5)
    }

    fn snap(&self, pid: Option<u32>, loader: Option<u32>) -> Snap {
        Snap {
            at: Instant::now(),
            loader_cpu: loader.and_then(procfs::cpu_seconds),
            proc_cpu: pid.and_then(procfs::cpu_seconds),
            proc_sys: pid.and_then(procfs::system_seconds),
            nats_cpu: self
                .stack
                .nats
                .node(0)
                .ok()
                .and_then(|n| n.pid())
                .and_then(procfs::cpu_seconds),
            clickhouse_cpu: self.clickhouse_cpu(),
            bench_cpu: procfs::self_cpu_seconds(),
            machine_busy: procfs::machine_busy_seconds(),
        }
    }

    /// Every ClickHouse server's CPU (the stack's, and a cluster's once started).
    fn clickhouse_cpu(&self) -> Option<f64> {
        let cluster = self.cluster.iter().flat_map(|c| &c.nodes);
        std::iter::once(&self.stack.clickhouse)
            .chain(cluster)
            .map(|server| server.pid().and_then(procfs::cpu_seconds))
            .sum()
    }

    /// The consumer's delivered sequence (0 before it exists).
    async fn delivered(&self, stream: &str, consumer: &str) -> u64 {
        match self.js.get_stream(stream).await {
            Ok(s) => s
                .consumer_info(consumer)
                .await
                .map(|i| i.delivered.consumer_sequence)
                .unwrap_or(0),
            Err(_) => 0,
        }
    }

    async fn stream_messages(&self, stream: &str) -> Result<u64> {
        let mut s = self
            .js
            .get_stream(stream)
            .await
            .with_context(|| format!("stream {stream}"))?;
        Ok(s.info().await?.state.messages)
    }

    /// Poll until the table holds the rows (and the DLQ the parked ones).
    async fn watch(&self, w: Watch<'_>) -> Result<Watched> {
        let began = Instant::now();
        let http = self.stack.http().clone();
        let mut start = if w.consumer.is_none() {
            Some(self.snap(w.pid, w.loader))
        } else {
            None
        };
        let mut ready_at = None;
        let mut first_row = None;
        let mut count = 0;
        let mut parked = 0;
        let mut progress: Vec<(f64, u64)> = Vec::new();
        let mut bulk = [None, None];
        loop {
            if start.is_none() {
                if let Some((stream, consumer, baseline)) = w.consumer {
                    if self.delivered(stream, consumer).await > baseline {
                        start = Some(self.snap(w.pid, w.loader));
                    }
                }
            }
            if ready_at.is_none() {
                if let Some(url) = &w.ready_url {
                    if matches!(http.get(url).send().await, Ok(r) if r.status().is_success()) {
                        ready_at = Some(Instant::now());
                    }
                }
            }
            count = self.landed(w.table).await.unwrap_or(count);
            if count > 0 && first_row.is_none() {
                first_row = Some((Instant::now(), count));
            }
            for (slot, share) in bulk.iter_mut().zip([0.1, 0.9]) {
                if slot.is_none() && count as f64 >= w.rows as f64 * share {
                    *slot = Some((Instant::now(), count));
                }
            }
            let t = began.elapsed().as_secs_f64();
            if progress.last().is_none_or(|&(last, _)| t - last >= 0.2) {
                progress.push(((t * 100.0).round() / 100.0, count));
            }
            if let Some(want) = w.dlq_messages {
                parked = self.stream_messages("DLQ").await.unwrap_or(parked);
                if count >= w.rows && parked >= want {
                    break;
                }
            } else if count >= w.rows {
                break;
            }
            if let Some(pid) = w.pid {
                if !procfs::is_alive(pid) {
                    bail!(
                        "the process under test (pid {pid}) exited with {count} of {} rows in {}",
                        w.rows,
                        w.table
                    );
                }
            }
            if began.elapsed() > w.deadline {
                bail!(
                    "{} holds {count} of {} rows after {:?} (DLQ {parked})",
                    w.table,
                    w.rows,
                    w.deadline
                );
            }
            tokio::time::sleep(POLL).await;
        }
        let end = self.snap(w.pid, w.loader);
        let start = start.ok_or_else(|| anyhow!("the rows landed before any was delivered?"))?;
        Ok(Watched {
            start,
            end,
            ready_at,
            first_row,
            peak_rss: w.pid.and_then(|p| procfs::vm_bytes(p, "VmHWM")),
            progress,
            bulk,
        })
    }

    /// Count what landed: distinct ids, duplicates, lost rows, parked rows (a
    /// cluster's through its `Distributed` table, once every replica fetched its
    /// twin's parts).
    async fn verify(&self, table: &str, m: &mut Measured) -> Result<()> {
        let sql = |t: &str| format!("SELECT count(), uniqExact(id) FROM {t}");
        let answer = match self.cluster.as_ref().filter(|_| self.is_cluster(table)) {
            Some(cluster) => {
                cluster.sync_replicas(table).await?;
                cluster.node(0, 0).exec(&sql(&distributed(table))).await?
            }
            None => self.stack.clickhouse.exec(&sql(table)).await?,
        };
        let mut it = answer.split_whitespace().map(|v| v.parse::<u64>());
        let (Some(Ok(count)), Some(Ok(distinct))) = (it.next(), it.next()) else {
            bail!("unexpected answer to the count of {table}: {answer:?}");
        };
        let expected = m.published - m.bad_rows;
        m.inserted_distinct = distinct;
        m.duplicates = count - distinct;
        m.lost = expected.saturating_sub(distinct);
        Ok(())
    }
}

impl Measured {
    fn from_watch(w: &Watched, rows: u64, spawned: Instant, cpu_total: Option<f64>) -> Self {
        let secs = w.end.at.duration_since(w.start.at).as_secs_f64().max(1e-9);
        let per_row =
            |a: Option<f64>, b: Option<f64>| -> Option<f64> { Some((b? - a?) * 1e6 / rows as f64) };
        let others = (|| {
            let busy = w.end.machine_busy? - w.start.machine_busy?;
            let ours = [
                (w.start.proc_cpu, w.end.proc_cpu),
                (w.start.nats_cpu, w.end.nats_cpu),
                (w.start.clickhouse_cpu, w.end.clickhouse_cpu),
                (w.start.bench_cpu, w.end.bench_cpu),
                (w.start.loader_cpu, w.end.loader_cpu),
            ]
            .iter()
            .filter_map(|(a, b)| Some(b.as_ref()? - a.as_ref()?))
            .sum::<f64>();
            Some(((busy - ours) / secs).max(0.0))
        })();
        Measured {
            published: rows,
            seconds: secs,
            rows_per_sec: rows as f64 / secs,
            cpu_us_per_row: per_row(w.start.proc_cpu, w.end.proc_cpu),
            sys_us_per_row: per_row(w.start.proc_sys, w.end.proc_sys),
            cpu_total_seconds: cpu_total,
            nats_us_per_row: per_row(w.start.nats_cpu, w.end.nats_cpu),
            clickhouse_us_per_row: per_row(w.start.clickhouse_cpu, w.end.clickhouse_cpu),
            bench_us_per_row: per_row(w.start.bench_cpu, w.end.bench_cpu),
            loader_us_per_row: per_row(w.start.loader_cpu, w.end.loader_cpu),
            others_cores: others,
            peak_rss: w.peak_rss,
            startup_seconds: w.ready_at.map(|r| r.duration_since(spawned).as_secs_f64()),
            progress: w.progress.clone(),
            bulk_rows_per_sec: match w.bulk {
                [Some((t0, c0)), Some((t1, c1))] if t1 > t0 && c1 > c0 => {
                    Some((c1 - c0) as f64 / t1.duration_since(t0).as_secs_f64())
                }
                _ => None,
            },
            ..Default::default()
        }
    }
}
