//! A table with a `shard_key` on a target of two shards: a message whose rows belong to
//! both is published again as one message per shard (its parts), each going to its
//! shard's lane, and acked (docs/operations.md, "ClickHouse clusters"). Its rows must go
//! into ClickHouse once whatever comes between the parts and the ack, without counting
//! on JetStream's duplicate window: a nats-server restart forgets the message ids of
//! the parts already consumed, and a split that keeps failing outlives any window.
//!
//! - The ack of the split message lost (Sluice aborted once its parts were stored),
//!   nats-server restarted past a 2 s duplicate window, Sluice started again: the
//!   message comes back and is not stored in parts a second time (a Replicated table
//!   on each shard, so `count()` against `uniqExact(id)` shows a row twice).
//! - The stream full when the parts are published: the small part stored, the big one
//!   refused, again and again for longer than the window, until room is made: the small
//!   part's rows go in once (a plain `MergeTree` on each shard: the at-least-once path,
//!   where nothing else would drop a copy).
//!
//! Real servers: nats-server, two clickhouse-server 18.16 shards on one ZooKeeper.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use bytes::Bytes;
use serde_json::{json, Value};
use sluice_harness::chaos::JetStreamView;
use sluice_harness::{wait_for, Stack, StackOptions, TENANT};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");
const TABLE: &str = "events";
/// `TABLE` over both shards, for reads.
const ALL: &str = "events_all";
const COLUMNS: &str = "id UInt64, s String";
/// The ingest stream's duplicate window in these tests: short, so that waiting it out
/// takes seconds.
const WINDOW: Duration = Duration::from_secs(2);

/// A stack on a cluster of two shards of one replica each, `TABLE` placed by `id`.
async fn two_shards() -> Result<Option<Stack>> {
    two_shards_in(1).await
}

/// [`two_shards`] with the queue in `partitions` partitions (and the nats-server's
/// subject mapping for them, for the test's own publishes).
async fn two_shards_in(partitions: usize) -> Result<Option<Stack>> {
    if sluice_harness::available("keyed_split", sluice_harness::clickhouse::binary())?.is_none() {
        return Ok(None);
    }
    let mut options = StackOptions::default().with_cluster(2, 1);
    if partitions > 1 {
        options = options.with_nats_config(sluice_actors::server_mapping("ingest", partitions));
    }
    let mut stack = Stack::start(options).await?;
    if partitions > 1 {
        stack.set("nats.partitions", partitions as i64);
    }
    stack.set(&format!("tables.\"{TENANT}.{TABLE}\".shard_key"), "id");
    stack.set("nats.duplicate_window", "2s");
    // A message left unacked comes back soon.
    stack.set("nats.ack_wait", "5s");
    Ok(Some(stack))
}

/// The first `n` ids (from 1) whose rows go to each of the two shards.
fn ids_by_shard(n: usize) -> [Vec<u64>; 2] {
    let key = sluice_actors::ShardKey::new("id");
    let mut by_shard = [Vec::new(), Vec::new()];
    for id in 1.. {
        let shard = key.shard_of_row(format!(r#"{{"id":{id}}}"#).as_bytes(), 2);
        if by_shard[shard].len() < n {
            by_shard[shard].push(id);
        }
        if by_shard.iter().all(|ids| ids.len() == n) {
            break;
        }
    }
    by_shard
}

fn row(id: u64, s: &str) -> Value {
    json!({ "id": id, "s": s })
}

/// Rows as one NDJSON message.
fn ndjson(rows: &[Value]) -> Bytes {
    let lines: Vec<String> = rows.iter().map(Value::to_string).collect();
    Bytes::from(lines.join("\n"))
}

/// Publishes `payload` to `<prefix>.acme.<table>` with the test's own client.
async fn publish(jet: &JetStreamView, table: &str, payload: Bytes) -> Result<u64> {
    let ack = jet
        .context()
        .publish(format!("ingest.{TENANT}.{table}"), payload)
        .await
        .context("publishing")?
        .await
        .context("the stream's ack")?;
    Ok(ack.sequence)
}

/// Waits until the consumer has settled every message and `n` rows are in the cluster
/// (`ALL`), then checks each is there once.
async fn every_row_once(stack: &Stack, index: usize, n: u64) -> Result<()> {
    let (total, distinct) = stack
        .wait_settled(ALL, n, Duration::from_secs(90))
        .await
        .with_context(|| stack.sluice[index].log_tail(60))?;
    ensure!(
        (total, distinct) == (n, n),
        "count() = {total}, uniqExact(id) = {distinct}: a row went in twice or is missing\n{}",
        stack.sluice[index].log_tail(60)
    );
    Ok(())
}

/// A message spanning both shards is split, and Sluice aborts once the parts are
/// stored (`crash-after-split-parts`): the message is not acked, its parts wait in the
/// stream. nats-server is restarted after the duplicate window has passed, so it knows
/// none of the parts' ids any more. Two more rows are published, one per shard, so the
/// parts are not inserted alone (18.16 tells blocks apart by their rows' hash only: a
/// part inserted alone twice would be dropped as a copy by ClickHouse, hiding the
/// second copy). Sluice started again inserts the parts, and the message comes back
/// after `ack_wait`: every row is stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_message_whose_ack_was_lost_is_not_stored_again_past_the_duplicate_window(
) -> Result<()> {
    ack_lost_after_the_parts(1).await
}

/// The same with the queue in three partitions: the message is split into its own
/// partition's stream, recorded in that stream's split records (`INGEST_<n>_SPLITS`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_partitioned_queue_a_split_message_whose_ack_was_lost_is_not_stored_again(
) -> Result<()> {
    ack_lost_after_the_parts(3).await
}

async fn ack_lost_after_the_parts(partitions: usize) -> Result<()> {
    let Some(mut stack) = two_shards_in(partitions).await? else {
        return Ok(());
    };
    stack.create_cluster_table(TABLE, COLUMNS, "id").await?;
    let [on_first, on_second] = ids_by_shard(11);
    let spanning: Vec<Value> = on_first[..10]
        .iter()
        .zip(&on_second[..10])
        .flat_map(|(a, b)| [row(*a, "spanning"), row(*b, "spanning")])
        .collect();

    stack.env.push((
        "SLUICE_TEST_FAILPOINT".into(),
        "crash-after-split-parts".into(),
    ));
    let doomed = stack.start_sluice(SLUICE).await?;
    stack.env.retain(|(k, _)| k != "SLUICE_TEST_FAILPOINT");
    let (status, body) = stack.ingest(TABLE, &spanning).await?;
    ensure!(status == 202, "ingest answered {status}: {body}");
    stack
        .wait_exited(doomed, Duration::from_secs(30))
        .await
        .context("the instance to crash once the parts are stored")?;
    let crashed = tokio::time::Instant::now();
    let jet = JetStreamView::connect(&stack.nats.url()).await?;
    let backlog = jet.backlog().await?;
    ensure!(
        backlog.messages == 3,
        "the message and its two parts should be in the stream: {backlog:?}"
    );
    drop(jet);

    // Restarted once the window has passed: it rebuilds its duplicate check from what
    // the stream holds, and the parts' ids are older than the window.
    stack.nats.stop().await?;
    tokio::time::sleep_until(crashed + WINDOW + Duration::from_secs(1)).await;
    stack.nats.start_again().await?;
    let jet = JetStreamView::connect(&stack.nats.url()).await?;
    for id in [on_first[10], on_second[10]] {
        publish(&jet, TABLE, ndjson(&[row(id, "neighbour")])).await?;
    }

    let survivor = stack.start_sluice(SLUICE).await?;
    every_row_once(&stack, survivor, 22).await
}

/// The stream near its `max_bytes`: a message spanning both shards whose part for the
/// first shard is one small row and whose part for the second is big. The small part
/// is stored, the big one refused, and the split fails and is tried again, for longer
/// than the duplicate window. Then room is made (the table whose message filled the
/// stream is created, and its row goes in): the big part is stored, and each row of the
/// message is stored once, the small part's row too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_refused_part_by_part_by_a_full_stream_stores_each_part_once() -> Result<()> {
    let Some(mut stack) = two_shards().await? else {
        return Ok(());
    };
    for node in stack.nodes() {
        node.exec(&format!(
            "CREATE TABLE {TABLE} ({COLUMNS}) ENGINE = MergeTree ORDER BY id"
        ))
        .await?;
        node.exec(&format!(
            "CREATE TABLE {ALL} AS {TABLE} ENGINE = Distributed(sluice, default, {TABLE})"
        ))
        .await?;
    }
    // 64 KiB: the filler (32 KiB) and the message (21 KiB) fit with the small part, not
    // with the big one (20 KiB); without the filler all of them fit.
    stack.set("nats.max_bytes", "64KiB");
    // The filler's table is tried again soon once it exists.
    stack.set("pipeline.backoff_max", "2s");
    let index = stack.start_sluice(SLUICE).await?;
    let jet = JetStreamView::connect(&stack.nats.url()).await?;
    let filler = ndjson(&[row(1, &"f".repeat(32 * 1024))]);
    publish(&jet, "filler", filler).await?;
    let [on_first, on_second] = ids_by_shard(20);
    let pad = "p".repeat(1000);
    let mut rows = vec![row(on_first[0], "small")];
    rows.extend(on_second.iter().map(|id| row(*id, &pad)));
    publish(&jet, TABLE, ndjson(&rows)).await?;

    // The split fails on the big part again and again, for longer than the window.
    let started = tokio::time::Instant::now();
    wait_for(
        "the split to be refused by the full stream several times",
        Duration::from_secs(60),
        Duration::from_millis(250),
        || {
            let output = stack.sluice_output(index);
            async move {
                let refused = output?.matches("could not be split").count();
                ensure!(refused >= 4, "refused {refused} times so far");
                Ok(())
            }
        },
    )
    .await
    .with_context(|| stack.sluice[index].log_tail(40))?;
    ensure!(
        started.elapsed() > WINDOW,
        "the split was refused for less than the duplicate window"
    );

    // Room: the filler's table exists, its row goes in and leaves the stream.
    for node in stack.nodes() {
        node.exec("CREATE TABLE filler (id UInt64, s String) ENGINE = MergeTree ORDER BY id")
            .await?;
    }
    every_row_once(&stack, index, 21).await
}
