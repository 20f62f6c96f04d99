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
//!
//! Then what Sluice reports, and what it does, for the tables it must not count on
//! ClickHouse to deduplicate: one left at 18.16's default window (100 blocks, fewer
//! than a redelivery at these settings comes after: 214), one with a materialized view
//! (18.16 skips the views of a retry it drops), and any table with `exactly_once =
//! false`. Each is inserted at least once: two batches that happen to carry the same
//! rows are both stored.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use sluice_harness::chaos::{counts, metric_value, JetStreamView};
use sluice_harness::{
    check_config, exactly_once_gauges, exactly_once_reports, wait_for, ClickHouseFlavor, Mode,
    Respond, Rule, Stack, StackOptions,
};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");
const TABLE: &str = "events";
/// A Replicated copy of `events_plain` left at the server's default window.
const DEFAULT_WINDOW: &str = "events_default";
/// What a window must hold at [`stack`]'s settings (docs/operations.md, "Delivery
/// guarantees"): a batch comes back up to 4s + 1s + 30s + 5s = 40s later, after 200
/// batches (one per 200 ms) and 14 blocks isolating a bad row among 10,000.
const NEEDED: &str = "214 blocks (200 batches in 40s, one per batch_age 200ms, + 14 isolating a bad row among batch_rows 10000)";

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
    stack
        .create_replicated_table_at_default_window(DEFAULT_WINDOW, "events_plain")
        .await?;
    // One batch per request (its rows flushed by age), ack_wait short for a quick
    // redelivery after the crash.
    stack.set("nats.ack_wait", "4s");
    stack.set("ingest.batch_age", "200ms");
    Ok(Some(stack))
}

/// How Sluice names a twin's window of `blocks`: a `ReplicatedMergeTree` on 18.16, a
/// `MergeTree` with `non_replicated_deduplication_window` on the current engine (which
/// holds no Replicated tables); and the setting to raise.
fn window_words(stack: &Stack, blocks: u32) -> (String, &'static str) {
    match stack.clickhouse.flavor() {
        ClickHouseFlavor::Debian => (
            format!("ReplicatedMergeTree keeps the hashes of its last {blocks} blocks (replicated_deduplication_window) for 7days"),
            "replicated_deduplication_window",
        ),
        ClickHouseFlavor::Current => (
            format!("MergeTree keeps the hashes of its last {blocks} blocks (non_replicated_deduplication_window)"),
            "non_replicated_deduplication_window",
        ),
    }
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
    stack
        .wait_exited(doomed, Duration::from_secs(30))
        .await
        .context("the instance to crash at its failpoint")?;
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
    stack
        .wait_settled(TABLE, total, Duration::from_secs(60))
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

/// [`stack`] with the queue in three partitions and 20 rows a message: a batch holds
/// messages of several partitions, its record names them by partition, and they are
/// read back (a batch formed again) and acked (one confirmed ack per partition) each in
/// its own stream.
async fn partitioned_stack() -> Result<Option<Stack>> {
    let Some(mut stack) = stack().await? else {
        return Ok(None);
    };
    stack.set("nats.partitions", 3);
    stack.set("api.chunk_rows", 20);
    Ok(Some(stack))
}

/// How many of the three partitions' streams hold or held a message.
async fn partitions_used(stack: &Stack) -> Result<usize> {
    let js = async_nats::jetstream::new(async_nats::connect(stack.nats.url()).await?);
    let mut used = 0;
    for n in 0..3 {
        let mut stream = js.get_stream(format!("INGEST_{n}")).await?;
        if stream.info().await?.state.last_sequence > 0 {
            used += 1;
        }
    }
    Ok(used)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_three_partitions_killed_after_the_record_the_rows_are_acked_without_another_insert(
) -> Result<()> {
    let Some(mut stack) = partitioned_stack().await? else {
        return Ok(());
    };
    crash_at(&mut stack, "crash-after-verdicts", 0..200).await?;
    ensure!(
        partitions_used(&stack).await? >= 2,
        "the crashed batch's ten messages all went to one partition"
    );
    let survivor = survive(&mut stack, 1000..1100, 300).await?;
    let (total, distinct) = counts(&stack.clickhouse, TABLE).await?;
    ensure!(
        (total, distinct) == (300, 300),
        "count() = {total}, uniqExact(id) = {distinct}: a row went in twice or is missing"
    );
    let inserted = metric_value(
        &stack.metrics_of(survivor).await?,
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
async fn across_three_partitions_a_batch_formed_again_from_their_streams_is_inserted_once(
) -> Result<()> {
    let Some(mut stack) = partitioned_stack().await? else {
        return Ok(());
    };
    crash_at(&mut stack, "crash-after-insert", 0..200).await?;
    ensure!(
        partitions_used(&stack).await? >= 2,
        "the crashed batch's ten messages all went to one partition"
    );
    survive(&mut stack, 1000..1100, 300).await?;
    let (total, distinct) = counts(&stack.clickhouse, TABLE).await?;
    ensure!(
        (total, distinct) == (300, 300),
        "count() = {total}, uniqExact(id) = {distinct}: the batch formed again was not the same block"
    );
    Ok(())
}

/// `sluice check-config` asks the target which tables are exactly-once, with the
/// arithmetic: the Replicated table at 1000 blocks is, the one left at 18.16's default
/// (100) is not and says what to set, the plain one does not deduplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_names_the_tables_that_are_exactly_once() -> Result<()> {
    let Some(stack) = stack().await? else {
        return Ok(());
    };
    let stdout = check_config(&stack, SLUICE).await?;
    let (long, _) = window_words(&stack, 1000);
    let (short, setting) = window_words(&stack, 100);
    for line in [
        "exactly-once (ClickHouse deduplicates the table's inserts for longer than a redelivery takes):",
        "  main: a batch retried after a crash comes back up to 40s (ack_wait 4s + reform_wait 1s + backoff_max 30s + insert_timeout 5s) later",
        &format!("    yes events: {long}, and one instance may insert {NEEDED} before a batch retried after a crash comes back: room for 4 times that"),
        &format!("    no  events_default: {short}, and one instance may insert {NEEDED} before a batch retried after a crash comes back: a retried batch could count twice, so Sluice inserts this table at least once. Set {setting} to at least 214 for each instance writing it"),
        "    no  events_plain: MergeTree without non_replicated_deduplication_window",
    ] {
        ensure!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
    ensure!(stdout.lines().last() == Some("ok"), "{stdout}");
    // Each server named with its version and what Sluice pins there; nats-server too,
    // with a WARN before 2.10.23 (a crash could delete a stream).
    let version = stack.clickhouse.version().await?;
    let pinned = match stack.clickhouse.flavor() {
        ClickHouseFlavor::Debian => "; pins insert_deduplicate, input_format_skip_unknown_fields",
        ClickHouseFlavor::Current => "; pins async_insert=0, insert_deduplicate, deduplicate_insert, insert_deduplication_token",
    };
    ensure!(
        stdout.contains(&format!(": ClickHouse {version}{pinned}")),
        "{stdout}"
    );
    let nats = stack.nats.version();
    ensure!(
        stdout.contains(&format!(
            "\nnats: nats-server {nats}: discard-new byte budget"
        )),
        "{stdout}"
    );
    let warned = stdout.contains(&format!("\nWARN nats-server {nats} is older than 2.10.23"));
    ensure!(warned == nats.starts_with("2.9."), "{stdout}");
    // Offline, ClickHouse is not asked.
    let config = stack.write_config()?;
    let out = tokio::process::Command::new(SLUICE)
        .args(["check-config", "--offline", "--config"])
        .arg(&config)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && !stdout.contains("exactly-once ("),
        "{stdout}"
    );
    Ok(())
}

/// Which tables are exactly-once, as an operator looks it up on a running instance:
/// the table's node in `/admin/actors` (with the reason) and the gauge
/// `sluice_table_exactly_once`, once each table has taken an insert. The table left at
/// 18.16's default window is not, and its reason gives the arithmetic and what to set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_tree_and_a_gauge_say_which_tables_are_exactly_once() -> Result<()> {
    let Some(mut stack) = stack().await? else {
        return Ok(());
    };
    stack.start_sluice(SLUICE).await?;
    let tables = [TABLE, DEFAULT_WINDOW, "events_plain"];
    for table in tables {
        let (status, body) = stack.ingest(table, &rows(0..10)).await?;
        ensure!(status == 202, "ingest to {table} answered {status}: {body}");
    }
    let reports = exactly_once_reports(&stack, &tables).await?;
    let (exactly_once, why) = &reports[0];
    ensure!(
        *exactly_once
            && why.contains("last 1000 blocks")
            && why.contains(NEEDED)
            && why.contains("room for 4 times that"),
        "{TABLE}: {exactly_once} {why}"
    );
    let (exactly_once, why) = &reports[1];
    ensure!(
        !*exactly_once
            && why.contains("last 100 blocks")
            && why.contains(&format!("one instance may insert {NEEDED}"))
            && why.contains(&format!(
                "Set {} to at least 214",
                window_words(&stack, 100).1
            )),
        "{DEFAULT_WINDOW}: {exactly_once} {why}"
    );
    let (exactly_once, why) = &reports[2];
    ensure!(
        !*exactly_once && why.contains("non_replicated_deduplication_window"),
        "events_plain: {exactly_once} {why}"
    );

    let gauges = exactly_once_gauges(&stack, &tables).await?;
    ensure!(
        gauges == [1.0, 0.0, 0.0],
        "sluice_table_exactly_once of {tables:?}: {gauges:?}"
    );
    Ok(())
}

/// Sends the same ten rows to `table` twice, the second time once the first ten are
/// in, waits until both are settled, and fails unless the table holds both.
async fn both_stored(stack: &Stack, table: &str) -> Result<()> {
    for round in 1..=2 {
        let (status, body) = stack.ingest(table, &rows(0..10)).await?;
        ensure!(status == 202, "ingest to {table} answered {status}: {body}");
        if round == 1 {
            stack
                .wait_for_count(table, 10, Duration::from_secs(30))
                .await?;
        }
    }
    let jet = JetStreamView::connect(&stack.nats.url()).await?;
    wait_for(
        "both batches settled and the stream drained",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let backlog = jet.backlog().await?;
            ensure!(backlog.consumer_done(), "{backlog:?}");
            Ok(())
        },
    )
    .await?;
    let count = stack.count(table).await?;
    ensure!(
        count == 20,
        "{table} holds {count} rows: the second batch was dropped as a duplicate"
    );
    Ok(())
}

/// A Replicated table with `exactly_once = false`: Sluice sends
/// `insert_deduplicate=0`, so a second batch that happens to carry the same rows as the
/// first is stored too (18.16 would drop it as the same block otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_exactly_once_off_two_batches_of_the_same_rows_are_both_stored() -> Result<()> {
    let Some(mut stack) = stack().await? else {
        return Ok(());
    };
    stack.set("ingest.exactly_once", false);
    stack.start_sluice(SLUICE).await?;
    both_stored(&stack, TABLE).await
}

/// A table Sluice does not treat as exactly-once although it deduplicates (left at
/// 18.16's default window) is inserted at least once: the same rows sent twice are
/// both stored, where counting on its 100 blocks would have dropped the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_at_the_default_window_stores_two_batches_of_the_same_rows() -> Result<()> {
    let Some(mut stack) = stack().await? else {
        return Ok(());
    };
    stack.start_sluice(SLUICE).await?;
    both_stored(&stack, DEFAULT_WINDOW).await?;
    let gauges = exactly_once_gauges(&stack, &[DEFAULT_WINDOW]).await?;
    ensure!(gauges == [0.0], "sluice_table_exactly_once: {gauges:?}");
    Ok(())
}

/// A Replicated table with a materialized view, on 18.16: a retry ClickHouse drops as a
/// duplicate skips the view (`harness/tests/replicated.rs`), so the table is reported
/// not exactly-once, with the view named, and inserted at least once: every row sent
/// reaches the view's table, the same rows sent twice are there twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_with_a_materialized_view_is_inserted_at_least_once_on_18_16() -> Result<()> {
    let Some(mut stack) = stack().await? else {
        return Ok(());
    };
    let clickhouse = &stack.clickhouse;
    clickhouse
        .exec("CREATE TABLE events_by_view (id UInt64, name String) ENGINE = MergeTree ORDER BY id")
        .await?;
    clickhouse
        .exec(
            "CREATE MATERIALIZED VIEW events_view TO events_by_view AS SELECT id, name FROM events",
        )
        .await?;
    if !clickhouse.version().await?.starts_with("18.") {
        eprintln!("not 18.16: a current server sends a retry to the views");
        return Ok(());
    }
    stack.start_sluice(SLUICE).await?;
    both_stored(&stack, TABLE).await?;
    let in_view = stack.count("events_by_view").await?;
    ensure!(
        in_view == 20,
        "the view's table holds {in_view} rows: every batch must reach it"
    );
    let reports = exactly_once_reports(&stack, &[TABLE]).await?;
    let (exactly_once, why) = &reports[0];
    ensure!(
        !*exactly_once
            && why.contains("materialized views (default.events_view)")
            && why.contains("Sluice inserts this table at least once"),
        "{TABLE}: {exactly_once} {why}"
    );
    let gauges = exactly_once_gauges(&stack, &[TABLE]).await?;
    ensure!(gauges == [0.0], "sluice_table_exactly_once: {gauges:?}");
    Ok(())
}

/// Issue 36 (1): ClickHouse commits a batch and the answer is lost (the proxy forwards
/// the INSERT, then resets the connection); the retry, the same rows under the same
/// token, is answered 252 TOO_MANY_PARTS (ClickHouse counts a partition's parts before
/// it looks at a block's id, on 18.16 as on current servers). Split then, its pieces
/// would go in as new blocks: every row twice. A batch that may already be in is never
/// split on an availability answer: the retry is waited out as an outage and sent whole
/// again, and ClickHouse drops it as the block it has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_answered_too_many_parts_after_a_committed_insert_is_not_split() -> Result<()> {
    if sluice_harness::available(
        "a_retry_answered_too_many_parts_after_a_committed_insert_is_not_split",
        sluice_harness::clickhouse::binary(),
    )?
    .is_none()
    {
        return Ok(());
    }
    let mut stack = Stack::start(StackOptions::default().with_zookeeper().with_proxy()).await?;
    stack
        .clickhouse
        .exec("CREATE TABLE events_plain (id UInt64, name String) ENGINE = MergeTree ORDER BY id")
        .await?;
    stack.create_replicated_table(TABLE, "events_plain").await?;
    stack.set("ingest.batch_age", "200ms");
    let insert = format!("`{TABLE}` FORMAT JSONEachRow");
    {
        let proxy = stack.proxy.as_ref().context("the stack's proxy")?;
        proxy.add_rule(Rule::query_contains(&insert, Mode::AnswerLost).times(1));
        proxy.add_rule(
            Rule::query_contains(
                &insert,
                Respond::clickhouse_modern(
                    252,
                    "TOO_MANY_PARTS",
                    "Too many parts (300). Merges are processing significantly slower than inserts",
                ),
            )
            .times(1),
        );
    }
    stack.start_sluice(SLUICE).await?;
    let (status, body) = stack.ingest(TABLE, &rows(0..500)).await?;
    ensure!(status == 202, "ingest answered {status}: {body}");
    let jet = JetStreamView::connect(&stack.nats.url()).await?;
    wait_for(
        "both faults met, every row settled and the stream drained",
        Duration::from_secs(60),
        Duration::from_millis(250),
        || {
            let (jet, ch, proxy) = (&jet, &stack.clickhouse, stack.proxy.as_ref());
            let insert = &insert;
            async move {
                let faults = proxy
                    .context("the stack's proxy")?
                    .requests()
                    .iter()
                    .filter(|r| {
                        r.action != "pass"
                            && r.query_param("query")
                                .is_some_and(|q| q.contains(insert.as_str()))
                    })
                    .count();
                let backlog = jet.backlog().await?;
                let (total_rows, _) = counts(ch, TABLE).await?;
                ensure!(
                    faults == 2 && backlog.consumer_done() && total_rows >= 500,
                    "{faults} faults met, {backlog:?}, {total_rows} rows"
                );
                Ok(())
            }
        },
    )
    .await
    .with_context(|| stack.sluice[0].log_tail(60))?;
    let (total, distinct) = counts(&stack.clickhouse, TABLE).await?;
    ensure!(
        (total, distinct) == (500, 500),
        "count() = {total}, uniqExact(id) = {distinct}: the retry of a committed batch was split and its rows went in again"
    );
    Ok(())
}

/// Issue 36, "also": a message delivered again that no record covers (here its batch's
/// record was removed while the batch was open, as one that expired after the
/// bucket's `max_age` would be) goes into a new batch: counted in
/// `sluice_messages_uncovered_total` and logged, so a duplicate can be traced to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_delivered_again_that_no_record_covers_are_counted_and_logged() -> Result<()> {
    let Some(mut stack) = stack().await? else {
        return Ok(());
    };
    crash_at(&mut stack, "crash-after-insert", 0..200).await?;
    // The crashed batch's record goes, as if it had expired.
    let js = async_nats::jetstream::new(
        async_nats::connect(stack.nats.url())
            .await
            .context("connecting to NATS")?,
    );
    let bucket = js
        .get_key_value("SLUICE_MANIFESTS")
        .await
        .context("the manifest bucket")?;
    let mut keys = bucket.keys().await.context("listing records")?;
    let mut removed = 0;
    while let Some(key) = futures::StreamExt::next(&mut keys).await {
        bucket
            .purge(key.context("a record's key")?)
            .await
            .context("removing a record")?;
        removed += 1;
    }
    ensure!(removed == 1, "{removed} records found of the crashed batch");
    let survivor = survive(&mut stack, 1000..1100, 300).await?;
    let metrics = stack.metrics_of(survivor).await?;
    let uncovered = metric_value(
        &metrics,
        "sluice_messages_uncovered_total",
        &[("table", TABLE)],
    );
    // 200 rows in one request: two messages of `[api] chunk_rows` (100) rows.
    ensure!(
        uncovered == 2.0,
        "sluice_messages_uncovered_total = {uncovered}; the crashed batch's 2 messages came again uncovered"
    );
    let log = stack.sluice_output(survivor)?;
    ensure!(
        log.contains("covered by no batch record"),
        "no line of the uncovered messages in the log: {}",
        stack.sluice[survivor].log_tail(40)
    );
    Ok(())
}

/// Issue 36 (1) on a real server's answer: the table throws TOO_MANY_PARTS at 4 parts of a
/// partition, 3 are made by hand with merges stopped, and Sluice's first insert is
/// carried out with its answer lost (the fourth part). Every retry of that batch, the
/// same rows and block, is refused with a real 252 until merges run again: it must be
/// waited out whole, then dropped by ClickHouse as the block it has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_refused_for_too_many_parts_by_clickhouse_itself_is_not_split() -> Result<()> {
    if sluice_harness::available(
        "a_retry_refused_for_too_many_parts_by_clickhouse_itself_is_not_split",
        sluice_harness::clickhouse::binary(),
    )?
    .is_none()
    {
        return Ok(());
    }
    let mut stack = Stack::start(StackOptions::default().with_zookeeper().with_proxy()).await?;
    let ch = &stack.clickhouse;
    // A deduplicating table: Replicated on 18.16, a MergeTree with a window of its own
    // on the current engine (which holds no Replicated tables).
    let (engine, window) = match ch.flavor() {
        ClickHouseFlavor::Debian => (
            sluice_harness::clickhouse::replicated_merge_tree("default", TABLE),
            "replicated_deduplication_window",
        ),
        ClickHouseFlavor::Current => (
            "MergeTree".to_owned(),
            "non_replicated_deduplication_window",
        ),
    };
    ch.exec(&format!(
        "CREATE TABLE {TABLE} (id UInt64, name String) ENGINE = {engine} ORDER BY id \
         SETTINGS {window} = 1000, parts_to_delay_insert = 4, parts_to_throw_insert = 4"
    ))
    .await?;
    ch.exec(&format!("SYSTEM STOP MERGES {TABLE}")).await?;
    for id in 0..3 {
        ch.exec(&format!(
            "INSERT INTO {TABLE} VALUES ({}, 'made by hand')",
            1_000_000 + id
        ))
        .await?;
    }
    stack.set("ingest.batch_age", "200ms");
    let insert = format!("`{TABLE}` FORMAT JSONEachRow");
    stack
        .proxy
        .as_ref()
        .context("the stack's proxy")?
        .add_rule(Rule::query_contains(&insert, Mode::AnswerLost).times(1));
    stack.start_sluice(SLUICE).await?;
    let (status, body) = stack.ingest(TABLE, &rows(0..500)).await?;
    ensure!(status == 202, "ingest answered {status}: {body}");
    // The lost answer, then retries refused by the server itself.
    wait_for(
        "three retries of the batch refused for too many parts",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let proxy = stack.proxy.as_ref().context("the stack's proxy")?;
            let inserts = proxy
                .requests()
                .iter()
                .filter(|r| r.query_param("query").is_some_and(|q| q.contains(&insert)))
                .count();
            ensure!(inserts >= 4, "{inserts} inserts of the batch so far");
            Ok(())
        },
    )
    .await
    .with_context(|| stack.sluice[0].log_tail(60))?;
    let ch = &stack.clickhouse;
    ch.exec(&format!("SYSTEM START MERGES {TABLE}")).await?;
    ch.exec(&format!("OPTIMIZE TABLE {TABLE} FINAL")).await?;
    let jet = JetStreamView::connect(&stack.nats.url()).await?;
    wait_for(
        "every row settled and the stream drained",
        Duration::from_secs(60),
        Duration::from_millis(250),
        || async {
            let backlog = jet.backlog().await?;
            ensure!(backlog.consumer_done(), "{backlog:?}");
            Ok(())
        },
    )
    .await
    .with_context(|| stack.sluice[0].log_tail(60))?;
    let (total, distinct) = counts(&stack.clickhouse, TABLE).await?;
    ensure!(
        (total, distinct) == (503, 503),
        "count() = {total}, uniqExact(id) = {distinct} (500 rows and 3 made by hand): the retry was split and its rows went in again"
    );
    Ok(())
}
