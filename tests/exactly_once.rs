//! Exactly-once into a deduplicating table, against the real servers (nats-server,
//! clickhouse-server 18.16 with ZooKeeper, a `ReplicatedMergeTree` table): Sluice is
//! crashed on purpose at the two points where at-least-once would insert twice, and the
//! rows it held are picked up by another instance whose batches are grouped otherwise.
//!
//! - Killed after the insert and the record of its verdicts, before any ack: the next
//!   instance acks those rows without inserting them again.
//! - Killed after the insert, before its verdicts were recorded: the batch is open, so
//!   the next instance forms exactly that batch again (the same rows, apart from the
//!   fresh ones that came meanwhile) and ClickHouse deduplicates it.
//!
//! Each checks what a user would: `count()` against `uniqExact(id)` in ClickHouse, the
//! insert requests of the second instance, and the stream drained.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use sluice_harness::chaos::{counts, JetStreamView};
use sluice_harness::{wait_for, Stack, StackOptions};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");
const TABLE: &str = "events";

async fn stack() -> Result<Option<Stack>> {
    if sluice_harness::available("exactly_once", sluice_harness::clickhouse::binary())?.is_none() {
        return Ok(None);
    }
    let mut stack = Stack::start(StackOptions::default().with_zookeeper()).await?;
    stack
        .clickhouse
        .exec("CREATE TABLE events_plain (id UInt64, name String) ENGINE = MergeTree ORDER BY id")
        .await?;
    stack.create_replicated_table(TABLE, "events_plain").await?;
    // One batch per request (its rows flushed by age), ack_wait short for a quick
    // redelivery after the crash.
    stack.set("nats.ack_wait", "4s");
    stack.set("ingest.batch_age", "200ms");
    Ok(Some(stack))
}

fn rows(ids: std::ops::Range<u64>) -> Vec<Value> {
    ids.map(|id| json!({"id": id, "name": format!("row {id}")}))
        .collect()
}

/// Starts an instance that crashes at `failpoint` with its first batch; returns once it
/// has crashed, with the rows it inserted in ClickHouse.
async fn crash_at(stack: &mut Stack, failpoint: &str, first: std::ops::Range<u64>) -> Result<()> {
    stack
        .env
        .push(("SLUICE_TEST_FAILPOINT".into(), failpoint.into()));
    let doomed = stack.start_sluice(SLUICE).await?;
    stack.env.retain(|(k, _)| k != "SLUICE_TEST_FAILPOINT");
    let n = first.end - first.start;
    let (status, body) = stack.ingest(TABLE, &rows(first)).await?;
    ensure!(status == 202, "ingest answered {status}: {body}");
    wait_for(
        "the instance to crash at its failpoint",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            let running = stack.sluice[doomed].is_running();
            async move {
                if running {
                    anyhow::bail!("still running")
                } else {
                    Ok(())
                }
            }
        },
    )
    .await
    .with_context(|| stack.sluice[doomed].log_tail(40))?;
    ensure!(
        stack.count(TABLE).await? == n,
        "the crashed instance's batch is not in ClickHouse"
    );
    Ok(())
}

/// The survivor: fresh rows published meanwhile (so its batches are grouped otherwise
/// than the crashed one's), then everything drained.
async fn survive(stack: &mut Stack, fresh: std::ops::Range<u64>, total: u64) -> Result<usize> {
    let survivor = stack.start_sluice(SLUICE).await?;
    let (status, body) = stack.ingest(TABLE, &rows(fresh)).await?;
    ensure!(status == 202, "ingest answered {status}: {body}");
    let jet = JetStreamView::connect(&stack.nats.url()).await?;
    wait_for(
        "every row settled and the stream drained",
        Duration::from_secs(60),
        Duration::from_millis(250),
        || {
            let (jet, ch) = (&jet, &stack.clickhouse);
            async move {
                let backlog = jet.backlog().await?;
                let (total_rows, _) = counts(ch, TABLE).await?;
                if backlog.consumer_done() && total_rows >= total {
                    Ok(())
                } else {
                    anyhow::bail!("{backlog:?}, {total_rows} rows")
                }
            }
        },
    )
    .await
    .with_context(|| stack.sluice[survivor].log_tail(60))?;
    Ok(survivor)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_the_record_and_the_acks_the_rows_are_acked_without_another_insert(
) -> Result<()> {
    let Some(mut stack) = stack().await? else {
        return Ok(());
    };
    crash_at(&mut stack, "crash-after-verdicts", 0..200).await?;
    let survivor = survive(&mut stack, 1000..1100, 300).await?;
    let (total, distinct) = counts(&stack.clickhouse, TABLE).await?;
    ensure!(
        (total, distinct) == (300, 300),
        "count() = {total}, uniqExact(id) = {distinct}: a row went in twice or is missing"
    );
    // The survivor inserted only the fresh rows: the crashed batch's were acked by the
    // record of its verdicts, with no request.
    let metrics = stack.metrics_of(survivor).await?;
    let inserted = sluice_harness::chaos::metric_value(
        &metrics,
        "sluice_rows_inserted_total",
        &[("table", TABLE)],
    );
    ensure!(
        inserted == 100.0,
        "the survivor inserted {inserted} rows; only the 100 fresh ones were its to insert"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_redelivered_to_another_instance_is_formed_again_and_inserted_once() -> Result<()> {
    let Some(mut stack) = stack().await? else {
        return Ok(());
    };
    // Inserted, never recorded as inserted: the batch is open when its instance dies.
    crash_at(&mut stack, "crash-after-insert", 0..200).await?;
    survive(&mut stack, 1000..1100, 300).await?;
    let (total, distinct) = counts(&stack.clickhouse, TABLE).await?;
    ensure!(
        (total, distinct) == (300, 300),
        "count() = {total}, uniqExact(id) = {distinct}: the batch formed again was not the same block"
    );
    // The same rows into a plain MergeTree would have doubled: the open batch was sent
    // again whole, and ClickHouse deduplicated it.
    Ok(())
}

/// `sluice check-config` asks the target which tables deduplicate inserts: the
/// Replicated table is exactly-once (with its window named), the plain one is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_names_the_tables_that_are_exactly_once() -> Result<()> {
    let Some(stack) = stack().await? else {
        return Ok(());
    };
    let config = stack.write_config()?;
    let out = tokio::process::Command::new(SLUICE)
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "exactly-once (ClickHouse deduplicates inserts):",
        "yes events: ReplicatedMergeTree: the last 1000 inserted blocks",
        "no  events_plain: MergeTree without non_replicated_deduplication_window",
    ] {
        ensure!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
    ensure!(stdout.lines().last() == Some("ok"), "{stdout}");
    // Offline, ClickHouse is not asked.
    let out = tokio::process::Command::new(SLUICE)
        .args(["check-config", "--offline", "--config"])
        .arg(&config)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && !stdout.contains("(ClickHouse deduplicates inserts)"),
        "{stdout}"
    );
    Ok(())
}

/// The state of `table`'s node in an `/admin/actors` tree.
fn table_state<'a>(node: &'a Value, table: &str) -> Option<&'a Value> {
    if node["kind"] == "table" && node["state"]["table"] == table {
        return Some(&node["state"]);
    }
    node["children"]
        .as_array()?
        .iter()
        .find_map(|child| table_state(child, table))
}

/// Which tables are exactly-once, as an operator looks it up on a running instance:
/// the table's node in `/admin/actors` (with the reason) and the gauge
/// `sluice_table_exactly_once`, once each table has taken an insert.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_tree_and_a_gauge_say_which_tables_are_exactly_once() -> Result<()> {
    let Some(mut stack) = stack().await? else {
        return Ok(());
    };
    stack.start_sluice(SLUICE).await?;
    for table in [TABLE, "events_plain"] {
        let (status, body) = stack.ingest(table, &rows(0..10)).await?;
        ensure!(status == 202, "ingest to {table} answered {status}: {body}");
    }
    let tree = wait_for(
        "both tables' nodes to say whether they are exactly-once",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let (status, tree) = stack.admin_get("/admin/actors").await?;
            ensure!(status == 200, "/admin/actors answered {status}");
            for table in [TABLE, "events_plain"] {
                let known =
                    table_state(&tree, table).is_some_and(|s| s["exactly_once"].is_boolean());
                ensure!(known, "{table} not known yet: {tree}");
            }
            Ok(tree)
        },
    )
    .await?;
    let replicated = table_state(&tree, TABLE).context("the Replicated table's node")?;
    ensure!(replicated["exactly_once"] == true, "{replicated}");
    let why = replicated["exactly_once_why"].as_str().unwrap_or_default();
    ensure!(why.contains("ReplicatedMergeTree"), "{replicated}");
    let plain = table_state(&tree, "events_plain").context("the plain table's node")?;
    ensure!(plain["exactly_once"] == false, "{plain}");
    let why = plain["exactly_once_why"].as_str().unwrap_or_default();
    ensure!(
        why.contains("non_replicated_deduplication_window"),
        "{plain}"
    );

    let metrics = stack.metrics_of(0).await?;
    let gauge = |table: &str| {
        sluice_harness::chaos::metric_value(
            &metrics,
            "sluice_table_exactly_once",
            &[("table", table)],
        )
    };
    ensure!(
        gauge(TABLE) == 1.0 && gauge("events_plain") == 0.0,
        "sluice_table_exactly_once: events {}, events_plain {}",
        gauge(TABLE),
        gauge("events_plain")
    );
    Ok(())
}
