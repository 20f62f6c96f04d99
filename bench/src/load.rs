//! The load generator of the `api` phases, run as a child process of its own
//! (`sluice-bench load ...`) so its CPU is read apart from Sluice's: it POSTs the rows
//! to the ingest API as NDJSON requests of `request_rows` rows, `concurrency` at once,
//! each with an `Idempotency-Key`, resending a request answered 503 after its
//! `Retry-After` (the same body under the same key, as a client should). It writes
//! what the API answered to `--report` as JSON, then waits for SIGTERM, so the
//! benchmark reads its CPU time after the last row as it does the others'.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::Args;
use serde_json::{json, Value};

use crate::rows::RowGen;

/// Arguments of the hidden `load` subcommand (passed by the benchmark itself).
#[derive(Args, Clone, Debug)]
pub struct LoadArgs {
    /// The API's base URL (`http://127.0.0.1:PORT`).
    #[arg(long)]
    pub api: String,
    #[arg(long)]
    pub tenant: String,
    #[arg(long)]
    pub table: String,
    /// Rows `first_id..first_id + rows`.
    #[arg(long)]
    pub first_id: u64,
    #[arg(long)]
    pub rows: u64,
    #[arg(long)]
    pub row_bytes: usize,
    /// Rows per request.
    #[arg(long)]
    pub request_rows: u64,
    /// Requests in flight at once.
    #[arg(long)]
    pub concurrency: usize,
    /// Where the answers' totals are written (JSON).
    #[arg(long)]
    pub report: PathBuf,
}

/// A request is given up on after this many 503 answers (a bound, not a policy).
const MAX_ATTEMPTS: u32 = 100;

/// What the API answered, summed over the requests.
#[derive(Debug, Default)]
struct Totals {
    requests: AtomicU64,
    accepted: AtomicU64,
    duplicates: AtomicU64,
    rejected: AtomicU64,
    /// 503 answers (each followed by a resend).
    unavailable: AtomicU64,
}

pub fn main(args: LoadArgs) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(run(args))
}

async fn run(args: LoadArgs) -> Result<()> {
    let http = sluice_harness::http_client_builder()?
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(120))
        .build()?;
    let requests = args.rows.div_ceil(args.request_rows.max(1));
    let next = Arc::new(AtomicU64::new(0));
    let totals = Arc::new(Totals::default());
    let started = Instant::now();
    println!("ready");
    let mut workers = Vec::new();
    for _ in 0..args.concurrency.max(1) {
        let (http, args, next, totals) = (http.clone(), args.clone(), next.clone(), totals.clone());
        workers.push(tokio::spawn(async move {
            let gen = RowGen::new(args.row_bytes);
            let mut body = String::new();
            let mut row = String::with_capacity(args.row_bytes + 64);
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= requests {
                    return Ok::<(), anyhow::Error>(());
                }
                let first = args.first_id + k * args.request_rows;
                let last = (first + args.request_rows).min(args.first_id + args.rows);
                body.clear();
                for id in first..last {
                    gen.row(id, false, &mut row);
                    body.push_str(&row);
                    body.push('\n');
                }
                let key = format!("bench-{}-{k}", args.table);
                send(&http, &args, &key, &body, &totals).await?;
            }
        }));
    }
    for worker in workers {
        worker.await.context("a load worker panicked")??;
    }
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let report = json!({
        "requests": get(&totals.requests),
        "accepted": get(&totals.accepted),
        "duplicates": get(&totals.duplicates),
        "rejected": get(&totals.rejected),
        "unavailable": get(&totals.unavailable),
        "seconds": started.elapsed().as_secs_f64(),
    });
    std::fs::write(&args.report, report.to_string())
        .with_context(|| format!("writing {}", args.report.display()))?;
    println!("done {}", get(&totals.accepted));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}

/// One request, resent after each 503 until the API takes it.
async fn send(
    http: &reqwest::Client,
    args: &LoadArgs,
    key: &str,
    body: &str,
    totals: &Totals,
) -> Result<()> {
    let url = format!("{}/v1/ingest/{}", args.api, args.table);
    for _ in 0..MAX_ATTEMPTS {
        let response = http
            .post(&url)
            .header("X-Tenant", &args.tenant)
            .header("Content-Type", "application/x-ndjson")
            .header("Idempotency-Key", key)
            .body(body.to_owned())
            .send()
            .await
            .with_context(|| format!("POST {url}"))?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let text = response.text().await.unwrap_or_default();
        let answer: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let n = |field: &str| answer[field].as_u64().unwrap_or(0);
        match status {
            202 | 400 => {
                totals.requests.fetch_add(1, Ordering::Relaxed);
                totals.accepted.fetch_add(n("accepted"), Ordering::Relaxed);
                totals
                    .duplicates
                    .fetch_add(n("duplicates"), Ordering::Relaxed);
                totals.rejected.fetch_add(n("rejected"), Ordering::Relaxed);
                return Ok(());
            }
            503 => {
                totals.unavailable.fetch_add(1, Ordering::Relaxed);
                let wait = Duration::from_secs(retry_after.unwrap_or(1).clamp(1, 5));
                tokio::time::sleep(wait).await;
            }
            _ => bail!("POST {url} answered {status}: {text}"),
        }
    }
    bail!("POST {url} (key {key}) was answered 503 {MAX_ATTEMPTS} times")
}
