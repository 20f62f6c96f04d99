//! A cluster target whose `shards` list puts servers of different shards together
//! (issue 36, item 5): each server's table deduplicates, but a retry moved to the
//! "twin" of its shard would land in another shard's table as a new block. Sluice
//! compares the replication paths of each shard's servers: `sluice check-config`,
//! `/admin/actors` and the gauge say the table is not exactly-once, and why.
//!
//! Needs Replicated tables (a 2 × 2 cluster on ZooKeeper): clickhouse-server 18.16 only
//! (scripts/test's "clickhouse current" phase does not run this binary).

use anyhow::{ensure, Result};
use serde_json::json;
use sluice_harness::{
    check_config, exactly_once_gauges, exactly_once_reports, Stack, StackOptions,
};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_whose_servers_do_not_replicate_one_table_is_not_exactly_once() -> Result<()> {
    let mut stack = Stack::start(StackOptions::default().with_cluster(2, 2)).await?;
    stack
        .create_cluster_table("events", "id UInt64, name String", "id")
        .await?;
    // Swapped: each of Sluice's shards lists replica 1 of one real shard and replica 2
    // of the other.
    let swapped = vec![
        format!(
            "{},{}",
            stack.node(0, 0).http_url(),
            stack.node(1, 1).http_url()
        ),
        format!(
            "{},{}",
            stack.node(1, 0).http_url(),
            stack.node(0, 1).http_url()
        ),
    ];
    stack.set("clickhouse.targets.main.shards", swapped);

    let stdout = check_config(&stack, SLUICE).await?;
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("no  events:"))
        .unwrap_or_default();
    for part in [
        "shard 1: the servers of shard 1 do not replicate one table (",
        "/clickhouse/tables/01/default/events",
        "/clickhouse/tables/02/default/events",
        "shard 2: the servers of shard 2 do not replicate one table (",
    ] {
        ensure!(
            line.contains(part),
            "{part:?} not in the line of events:\n{stdout}"
        );
    }

    stack.set("ingest.batch_age", "200ms");
    stack.start_sluice(SLUICE).await?;
    let rows: Vec<_> = (0..10).map(|id| json!({"id": id, "name": "x"})).collect();
    let (status, body) = stack.ingest("events", &rows).await?;
    ensure!(status == 202, "{status} {body}");
    let reports = exactly_once_reports(&stack, &["events"]).await?;
    let (exactly_once, why) = &reports[0];
    ensure!(
        !exactly_once && why.contains("do not replicate one table"),
        "events: {exactly_once} {why}"
    );
    let gauges = exactly_once_gauges(&stack, &["events"]).await?;
    ensure!(gauges == [0.0], "sluice_table_exactly_once: {gauges:?}");
    // Inserted at least once: every row is in.
    stack
        .wait_for_count("events_all", 10, std::time::Duration::from_secs(30))
        .await?;
    Ok(())
}
