//! The minimal reference loop, run as a child process of its own (`sluice-bench
//! reference ...`) so its CPU and memory are measured exactly as Sluice's are: pull
//! from a durable consumer, batch up to `batch_rows`, one HTTP insert, ack each row,
//! repeat — sequentially, nothing else. It is the simplest thing that could work, and
//! what Sluice's supervision, routing, classification and metrics are measured against.

use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use async_nats::jetstream::{self, consumer};
use clap::Args;
use futures::StreamExt as _;

/// Arguments of the hidden `reference` subcommand (passed by the benchmark itself).
#[derive(Args, Clone, Debug)]
pub struct ReferenceArgs {
    #[arg(long)]
    pub nats: String,
    #[arg(long)]
    pub stream: String,
    #[arg(long)]
    pub consumer: String,
    /// ClickHouse HTTP URL (`http://127.0.0.1:PORT`).
    #[arg(long)]
    pub clickhouse: String,
    #[arg(long)]
    pub table: String,
    /// Stop (and wait for SIGTERM) after this many rows.
    #[arg(long)]
    pub rows: u64,
    #[arg(long)]
    pub pull_batch: usize,
    #[arg(long)]
    pub batch_rows: usize,
    #[arg(long)]
    pub max_ack_pending: i64,
    /// A partial batch is inserted after this long without a full one (Sluice's
    /// `batch_age`).
    #[arg(long, default_value = "1s", value_parser = humantime_duration)]
    pub batch_age: Duration,
}

fn humantime_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Some(ms) = s.strip_suffix("ms") {
        return ms
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|e| e.to_string());
    }
    if let Some(secs) = s.strip_suffix('s') {
        return secs
            .parse::<f64>()
            .map(Duration::from_secs_f64)
            .map_err(|e| e.to_string());
    }
    Err(format!("{s:?}: expected a duration like 1s or 200ms"))
}

pub fn main(args: ReferenceArgs) -> Result<()> {
    // The same runtime as `sluice run`: multi-threaded, one worker per core.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(run(args))
}

async fn run(args: ReferenceArgs) -> Result<()> {
    let client = async_nats::connect(&args.nats)
        .await
        .with_context(|| format!("connecting to {}", args.nats))?;
    let js = jetstream::new(client);
    let stream = js
        .get_stream(&args.stream)
        .await
        .with_context(|| format!("stream {}", args.stream))?;
    // The consumer Sluice makes, with the same knobs.
    let consumer: consumer::PullConsumer = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some(args.consumer.clone()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(60),
            max_ack_pending: args.max_ack_pending,
            max_deliver: -1,
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow::anyhow!("creating consumer {}: {e}", args.consumer))?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(args.pull_batch)
        .heartbeat(Duration::from_secs(5))
        .expires(Duration::from_secs(30))
        .messages()
        .await
        .map_err(|e| anyhow::anyhow!("pulling: {e}"))?;
    let http = sluice_harness::http_client_builder()?
        .tcp_nodelay(true)
        .build()?;
    let url = reqwest::Url::parse_with_params(
        &format!("{}/", args.clickhouse.trim_end_matches('/')),
        &[(
            "query",
            format!("INSERT INTO {} FORMAT JSONEachRow", args.table),
        )],
    )?;
    println!("ready");

    let mut done = 0u64;
    let mut batch = Vec::with_capacity(args.batch_rows);
    while done < args.rows {
        // Fill a batch: wait for the first row, then up to `batch_age` for the rest.
        match messages.next().await {
            Some(Ok(m)) => batch.push(m),
            Some(Err(e)) => bail!("pulling: {e}"),
            None => bail!("the message stream ended"),
        }
        let age = tokio::time::sleep(args.batch_age);
        tokio::pin!(age);
        while batch.len() < args.batch_rows {
            tokio::select! {
                m = messages.next() => match m {
                    Some(Ok(m)) => batch.push(m),
                    Some(Err(e)) => bail!("pulling: {e}"),
                    None => bail!("the message stream ended"),
                },
                _ = &mut age => break,
            }
        }
        let len: usize = batch.iter().map(|m| m.payload.len() + 1).sum();
        let mut body = Vec::with_capacity(len);
        for m in &batch {
            body.extend_from_slice(&m.payload);
            body.push(b'\n');
        }
        let response = http
            .post(url.clone())
            .body(body)
            .send()
            .await
            .context("inserting")?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        if !status.is_success() {
            bail!("insert answered {status}: {}", text.trim());
        }
        for m in batch.drain(..) {
            m.ack().await.map_err(|e| anyhow::anyhow!("acking: {e}"))?;
            done += 1;
        }
    }
    let _ = js.client().flush().await;
    println!("done {done}");
    // Stay alive until told to stop, so the benchmark reads this process's CPU time and
    // peak memory after the last row, exactly as it does for Sluice.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
