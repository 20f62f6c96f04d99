//! Workload isolation: a flood of slow queries does not stop ingest.
//!
//! A whole deployment (nats-server, clickhouse-server, the sluice binary ingesting)
//! and the query gateway in-process against the same ClickHouse. The gateway admits
//! only `[query] concurrency` slow scans (the rest get 429 at once, nothing queues),
//! they run as their own ClickHouse user, and rows sent to the ingest API meanwhile
//! land in ClickHouse while the scans are still running.

mod query_common;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Result};
use query_common::{config, crypto_provider, Gateway, HEAVY};
use serde_json::json;
use sluice_harness::{available, wait_until, ClickHouseServer, Stack, StackOptions};

/// The gateway's scans still on ClickHouse (the probe's own text excluded).
async fn scans_running(ch: &ClickHouseServer) -> Result<u64> {
    ch.count(
        "SELECT count() FROM system.processes WHERE query LIKE '%sipHash64%' AND query NOT LIKE '%system.processes%'",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_land_while_a_flood_of_slow_queries_runs() -> Result<()> {
    crypto_provider();
    if available("query_isolation", sluice_harness::clickhouse::binary())?.is_none() {
        return Ok(());
    }
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack
        .clickhouse
        .exec("CREATE TABLE events (id UInt64) ENGINE = MergeTree ORDER BY id")
        .await?;
    stack.set("ingest.batch_age", "200ms");
    stack.start_sluice(env!("CARGO_BIN_EXE_sluice")).await?;
    let (status, reply) = stack.ingest("events", &[json!({"id": 0})]).await?;
    ensure!(status == 202, "{status} {reply}");
    stack
        .wait_for_count("events", 1, Duration::from_secs(20))
        .await?;

    // 10 slow scans at once against a gateway that admits 6: ClickHouse would stop
    // each at 4 s; the other 4 are turned away at once.
    let gw = Arc::new(
        Gateway::start(&config(
            &stack.clickhouse.http_url(),
            "concurrency = 6\ntenant_concurrency = 6",
        ))
        .await?,
    );
    let flood: Vec<_> = (0..10)
        .map(|_| {
            let gw = gw.clone();
            tokio::spawn(async move {
                gw.query("acme", json!({"sql": HEAVY, "timeout_ms": 5000}))
                    .await
            })
        })
        .collect();
    let ch = &stack.clickhouse;
    wait_until(
        "6 scans to run on ClickHouse",
        Duration::from_secs(5),
        Duration::from_millis(20),
        || async { matches!(scans_running(ch).await, Ok(6)) },
    )
    .await?;

    // Rows sent now land while every scan is still running.
    let flood_running = tokio::time::Instant::now();
    for batch in 0..5u64 {
        let rows: Vec<_> = (0..20u64)
            .map(|i| json!({"id": 1 + batch * 20 + i}))
            .collect();
        let (status, reply) = stack.ingest("events", &rows).await?;
        ensure!(status == 202, "{status} {reply}");
    }
    stack
        .wait_for_count("events", 101, Duration::from_secs(3))
        .await?;
    eprintln!(
        "100 rows landed {:?} after they were sent, under 6 scans",
        flood_running.elapsed()
    );
    let running = scans_running(ch).await?;
    ensure!(
        running == 6,
        "the rows must land while the scans run; {running} still running"
    );

    let mut statuses = Vec::new();
    for task in flood {
        statuses.push(task.await??.status);
    }
    statuses.sort_unstable();
    ensure!(
        statuses == [429, 429, 429, 429, 504, 504, 504, 504, 504, 504],
        "{statuses:?}"
    );
    Ok(())
}
