//! `sluice-bench partitions`: the ingest queue on a three-node NATS cluster in 1, 3
//! and 6 partitions (`[nats] partitions`, issue 40): how the nodes share the work.
//!
//! For each count: a fresh three-node cluster (streams of three replicas) with the
//! subject mapping for that count, one ClickHouse, one Sluice; the rows are published
//! first (one row a message on `ingest.acme.events.<key>`, 64 keys, by three publishers,
//! one connected to each node, so no one node takes every publisher), then Sluice is
//! started and drains them. Each nats-server's CPU (utime+stime from /proc) is read
//! over the publish and over the drain; printed: rows/s of each, each node's CPU µs per
//! row, and the busiest node's share of the three nodes' work. With one partition its
//! leader's node does the leader's work for every row; spread over partitions whose
//! leaders are on every node, the busiest node's share falls toward a third.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use async_nats::jetstream;
use futures::future::try_join_all;
use sluice_harness::nats_cluster::ClusterView;
use sluice_harness::{Stack, StackOptions, TENANT};

use crate::procfs;

#[derive(Debug, clap::Args)]
pub struct PartitionsArgs {
    /// The partition counts to measure, in turn.
    #[arg(long, value_delimiter = ',', default_value = "1,3,6")]
    counts: Vec<usize>,
    /// Rows per count (one row a message).
    #[arg(long, default_value_t = 120_000)]
    rows: u64,
    /// The streams' replicas (`[nats] replicas`): 3, every node stores every row; 1,
    /// each partition's rows on its leader's node alone.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// The sluice binary (default: `sluice` beside this binary).
    #[arg(long)]
    sluice: Option<PathBuf>,
}

/// What one count measured.
struct Measured {
    partitions: usize,
    leaders: Vec<String>,
    publish_rows_per_s: f64,
    drain_rows_per_s: f64,
    /// Each node's CPU seconds over the publish and over the drain.
    publish_cpu: Vec<f64>,
    drain_cpu: Vec<f64>,
}

pub fn main(args: PartitionsArgs) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(run(args))
}

async fn run(args: PartitionsArgs) -> Result<()> {
    let sluice = crate::bench::sluice_binary(args.sluice.as_deref())?;
    let mut all = Vec::new();
    for &n in &args.counts {
        eprintln!("-- {n} partition(s), {} rows ...", args.rows);
        let m = measure(&sluice, n, args.rows, args.replicas)
            .await
            .with_context(|| format!("{n} partition(s)"))?;
        print_one(&m, args.rows);
        all.push(m);
    }
    println!();
    println!(
        "{} rows, one a message, streams of {} replica(s):",
        args.rows, args.replicas
    );
    println!("| partitions | leaders | publish rows/s | drain rows/s | node CPU µs/row (publish+drain) | busiest node µs/row | busiest's share |");
    println!("|---|---|---|---|---|---|---|");
    for m in &all {
        let per_row: Vec<f64> = (0..m.publish_cpu.len())
            .map(|i| (m.publish_cpu[i] + m.drain_cpu[i]) * 1e6 / args.rows as f64)
            .collect();
        let busiest = per_row.iter().copied().fold(0.0, f64::max);
        let total: f64 = per_row.iter().sum();
        println!(
            "| {} | {} | {:.0} | {:.0} | {} | {:.1} | {:.2} |",
            m.partitions,
            m.leaders.join(" "),
            m.publish_rows_per_s,
            m.drain_rows_per_s,
            per_row
                .iter()
                .map(|v| format!("{v:.1}"))
                .collect::<Vec<_>>()
                .join(" / "),
            busiest,
            busiest / total.max(f64::EPSILON)
        );
    }
    Ok(())
}

fn print_one(m: &Measured, rows: u64) {
    let per_row = |cpu: &[f64]| {
        cpu.iter()
            .map(|c| format!("{:.1}", c * 1e6 / rows as f64))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    eprintln!(
        "   leaders {:?}; publish {:.0} rows/s, nodes µs/row {}; drain {:.0} rows/s, nodes µs/row {}",
        m.leaders,
        m.publish_rows_per_s,
        per_row(&m.publish_cpu),
        m.drain_rows_per_s,
        per_row(&m.drain_cpu)
    );
}

/// Each node's CPU seconds now.
fn nodes_cpu(stack: &Stack) -> Result<Vec<f64>> {
    stack
        .nats
        .nodes()
        .iter()
        .map(|node| {
            node.pid()
                .and_then(procfs::cpu_seconds)
                .context("a nats-server's CPU")
        })
        .collect()
}

fn minus(after: &[f64], before: &[f64]) -> Vec<f64> {
    after.iter().zip(before).map(|(a, b)| a - b).collect()
}

async fn measure(
    sluice: &std::path::Path,
    partitions: usize,
    rows: u64,
    replicas: usize,
) -> Result<Measured> {
    let mapping = sluice_actors::server_mapping("ingest", partitions);
    let mut options = StackOptions::default().with_nats_cluster();
    if partitions > 1 {
        options = options.with_nats_config(mapping);
    }
    let mut stack = Stack::start(options).await?;
    stack
        .clickhouse
        .exec("CREATE TABLE events (id UInt64, v String) ENGINE = MergeTree ORDER BY id")
        .await?;
    stack.set("nats.partitions", partitions as i64);
    stack.set("nats.replicas", replicas as i64);
    stack.set("nats.max_bytes", "2GiB");
    stack.set("ingest.exactly_once", false);
    stack.set("log.level", "warn");
    // The streams, made by a first start (Sluice makes them), then left idle.
    let first = stack.start_sluice(sluice).await?;
    stack.sluice[first].sigterm()?;
    stack.sluice[first]
        .wait_exit(Duration::from_secs(30))
        .await?;
    let streams: Vec<String> = match partitions {
        1 => vec!["INGEST".into()],
        n => (0..n).map(|p| format!("INGEST_{p}")).collect(),
    };
    let names: Vec<&str> = streams.iter().map(String::as_str).collect();
    let view = ClusterView::connect(&stack.nats).await?;
    let leaders = if partitions > 1 {
        view.spread_stream_leaders(&names[..names.len().min(3)])
            .await?
    } else {
        vec![view.stream("INGEST").await?.leader]
    };

    let before = nodes_cpu(&stack)?;
    let started = Instant::now();
    publish_through_every_node(&stack, rows).await?;
    let published_in = started.elapsed();
    let after_publish = nodes_cpu(&stack)?;

    let drain_started = Instant::now();
    stack.start_sluice(sluice).await?;
    let deadline = drain_started + Duration::from_secs(600);
    // Bounded by the deadline.
    loop {
        let n = stack.count("events").await?;
        if n >= rows {
            break;
        }
        if Instant::now() > deadline {
            bail!("{n} of {rows} rows in ClickHouse after 600 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drained_in = drain_started.elapsed();
    let after_drain = nodes_cpu(&stack)?;
    let distinct = stack.count("SELECT uniqExact(id) FROM events").await?;
    if distinct != rows {
        bail!("{distinct} distinct rows of {rows}");
    }
    Ok(Measured {
        partitions,
        leaders,
        publish_rows_per_s: rows as f64 / published_in.as_secs_f64(),
        drain_rows_per_s: rows as f64 / drained_in.as_secs_f64(),
        publish_cpu: minus(&after_publish, &before),
        drain_cpu: minus(&after_drain, &after_publish),
    })
}

/// One row a message, on 64 keys of one table, by a publisher connected to each node
/// (a third of the rows each), 1,000 acks outstanding per publisher.
async fn publish_through_every_node(stack: &Stack, rows: u64) -> Result<()> {
    let urls = stack.nats.urls();
    let nodes = urls.len() as u64;
    let publishers = urls.iter().enumerate().map(|(i, url)| async move {
        let js = jetstream::new(async_nats::connect(url.as_str()).await?);
        let mine: Vec<u64> = (0..rows).filter(|id| id % nodes == i as u64).collect();
        for ids in mine.chunks(1_000) {
            let mut acks = Vec::with_capacity(ids.len());
            for &id in ids {
                let row = format!("{{\"id\":{id},\"v\":\"{}\"}}", "x".repeat(100));
                let subject = format!("ingest.{TENANT}.events.k{}", id % 64);
                acks.push(js.publish(subject, row.into()).await?);
            }
            for ack in acks {
                ack.await?;
            }
        }
        anyhow::Ok(())
    });
    try_join_all(publishers).await?;
    Ok(())
}
