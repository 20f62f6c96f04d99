//! A graceful stop (SIGTERM) as an operator sees it, on real servers: how long the
//! process takes, and where the rows it held are afterwards.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use sluice_harness::chaos::table_state;
use sluice_harness::{wait_for, Stack, StackOptions};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");
const POLL: Duration = Duration::from_millis(100);
/// The shutdown deadline of these tests.
const DEADLINE: Duration = Duration::from_secs(3);
/// What a stop may take beyond the deadline: handing back, stopping the tree and the
/// listeners, writing the naks out, exiting.
const STOP_MARGIN: Duration = Duration::from_secs(2);
/// `config.toml`'s `ack_wait`: a row JetStream redelivers only after this was left
/// pending, not handed back.
const ACK_WAIT: Duration = Duration::from_secs(60);
/// How soon a row handed back at the stop lands once ClickHouse answers again (a
/// restart, a first probe, a batch): far below `ACK_WAIT`.
const LANDS_WITHIN: Duration = Duration::from_secs(20);

/// The flights a table has out, as `/admin/actors` shows them.
async fn flights_out(stack: &Stack, table: &str) -> Result<Vec<Value>> {
    let (status, tree) = stack.admin_get("/admin/actors").await?;
    ensure!(status == 200, "/admin/actors answered {status}: {tree}");
    Ok(table_state(&tree, table)
        .and_then(|t| t["flights_out"].as_array().cloned())
        .unwrap_or_default())
}

/// issue 37.1: SIGTERM while ClickHouse is frozen (SIGSTOP) and a row is in flight,
/// with `config.toml`'s timings (`insert_timeout` 30 s, `batch_age` 1 s, `ack_wait`
/// 60 s) and a 3 s shutdown deadline. The process exits within the deadline and a
/// small margin, and the row it held was handed back: once ClickHouse answers again
/// it lands at once, not after `ack_wait` (the redelivery of a row left pending).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_clickhouse_is_frozen_hands_the_rows_back_within_the_deadline() -> Result<()>
{
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack
        .clickhouse
        .exec("CREATE TABLE events (id UInt64, name String) ENGINE = MergeTree ORDER BY id")
        .await?;
    stack.set("pipeline.shutdown_deadline", "3s");
    stack.set("clickhouse.targets.main.insert_timeout", "30s");
    stack.set("ingest.batch_age", "1s");
    stack.set("nats.ack_wait", "60s");
    let index = stack.start_sluice(SLUICE).await?;

    stack.clickhouse.sigstop().await?;
    let (status, reply) = stack
        .ingest("events", &[json!({"id": 1, "name": "a"})])
        .await?;
    ensure!(status == 202, "{status} {reply}");
    let stack_ref = &stack;
    let flights = wait_for(
        "the row in a flight",
        Duration::from_secs(20),
        POLL,
        || async {
            let flights = flights_out(stack_ref, "events").await?;
            ensure!(!flights.is_empty(), "no flight out yet");
            Ok(flights)
        },
    )
    .await?;

    let asked = tokio::time::Instant::now();
    stack.sluice[index].sigterm()?;
    let exit = stack.sluice[index].wait_exit(Duration::from_secs(60)).await;
    let took = asked.elapsed();
    let logs = stack.sluice[index].log_tail(60);
    let exit = exit?;
    ensure!(exit.code() == Some(0), "exited with {exit}\n{logs}");
    ensure!(
        took <= DEADLINE + STOP_MARGIN,
        "took {took:?} to stop with a {DEADLINE:?} deadline (flights then: {flights:?})\n{logs}"
    );
    stack.clickhouse.sigcont().await?;
    let continued = tokio::time::Instant::now();
    stack.restart_sluice(index).await?;
    stack
        .wait_for_count("events", 1, LANDS_WITHIN)
        .await
        .with_context(|| stack.sluice[index].log_tail(60))?;
    ensure!(
        continued.elapsed() < ACK_WAIT / 2,
        "the row landed {:?} after ClickHouse was continued",
        continued.elapsed()
    );
    ensure!(stack.count("events").await? == 1);
    Ok(())
}
