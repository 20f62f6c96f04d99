//! The batch ledger's promises on the real servers (nats-server, clickhouse-server 18.16
//! with ZooKeeper, a `ReplicatedMergeTree` table), each where an earlier Sluice broke
//! it:
//!
//! - a split batch is never sent whole again: an outage in the middle of an isolation
//!   resumes it from its recorded split (a whole batch after its first half went in as
//!   a block of its own inserted that half twice);
//! - a batch's token names the ingest stream's incarnation: a stream made again (or a
//!   second deployment on the same ClickHouse) numbers its messages from 1 again, and a
//!   server that takes `insert_deduplication_token` would drop its new rows as copies of
//!   the old ones.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use sluice_harness::chaos::{counts, JetStreamView};
use sluice_harness::{wait_for, Mode, Respond, Rule, Stack, StackOptions};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");
const TABLE: &str = "events";
const DEADLINE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(200);

/// A stack whose ClickHouse is behind the fault proxy, with a Replicated `events`.
async fn stack(test: &str) -> Result<Option<Stack>> {
    if sluice_harness::available(test, sluice_harness::clickhouse::binary())?.is_none() {
        return Ok(None);
    }
    let stack = Stack::start(StackOptions::default().with_zookeeper().with_proxy()).await?;
    stack
        .clickhouse
        .exec("CREATE TABLE events_plain (id UInt64, name String) ENGINE = MergeTree ORDER BY id")
        .await?;
    stack.create_replicated_table(TABLE, "events_plain").await?;
    Ok(Some(stack))
}

fn rows(ids: std::ops::Range<u64>) -> Vec<Value> {
    ids.map(|id| json!({"id": id, "name": format!("row {id}")}))
        .collect()
}

/// Every row ingested is settled (the stream drained) and `n` distinct ids are in.
async fn drained_with(stack: &Stack, n: u64) -> Result<(u64, u64)> {
    let jet = JetStreamView::connect(&stack.nats.url()).await?;
    wait_for("every row settled", DEADLINE, POLL, || {
        let (jet, ch) = (&jet, &stack.clickhouse);
        async move {
            let backlog = jet.backlog().await?;
            let (total, distinct) = counts(ch, TABLE).await?;
            if backlog.consumer_done() && distinct >= n {
                Ok((total, distinct))
            } else {
                anyhow::bail!("{backlog:?}, {total} rows, {distinct} ids")
            }
        }
    })
    .await
}

/// A 2,000-row batch: its first insert answered 252 (too many parts: split first), its
/// first row and first half inserted as blocks of their own, then ClickHouse gone (a
/// bare 502) for a while, then everything passes. Every id once: the batch resumed
/// its split; it was never sent whole again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_interrupted_by_an_outage_resumes_and_inserts_no_row_twice() -> Result<()> {
    let Some(mut stack) =
        stack("a_split_interrupted_by_an_outage_resumes_and_inserts_no_row_twice").await?
    else {
        return Ok(());
    };
    // One batch of all 2,000 rows (rows trigger it, not age).
    stack.set("ingest.batch_rows", 2000);
    stack.set("ingest.batch_age", "30s");
    let sluice = stack.start_sluice(SLUICE).await?;
    let proxy = stack.proxy.as_ref().context("the proxy")?;
    let too_many_parts = Respond::clickhouse_modern(
        252,
        "TOO_MANY_PARTS",
        "Too many parts (300). Merges are processing significantly slower than inserts",
    );
    proxy.add_rule(Rule::query_contains("INSERT", too_many_parts).times(1));
    // The first row alone, then the first half: in.
    proxy.add_rule(Rule::query_contains("INSERT", Mode::PassThrough).times(2));
    proxy.add_rule(Rule::query_contains("INSERT", Respond::status_only(502)));
    let (status, body) = stack.ingest(TABLE, &rows(0..2000)).await?;
    ensure!(status == 202, "ingest answered {status}: {body}");
    let proxy = stack.proxy.as_ref().context("the proxy")?;
    wait_for("the outage met the split", DEADLINE, POLL, || async {
        let outage = proxy
            .requests()
            .iter()
            .filter(|r| r.action.contains("respond 502"))
            .count();
        if outage >= 2 {
            Ok(())
        } else {
            anyhow::bail!("{outage} inserts met the outage")
        }
    })
    .await
    .with_context(|| stack.sluice[sluice].log_tail(40))?;
    let half = stack.count(TABLE).await?;
    ensure!(
        (1..2000).contains(&half),
        "{half} rows in before the outage: the split's first parts are meant to be in"
    );
    proxy.clear_rules();
    let (total, distinct) = drained_with(&stack, 2000)
        .await
        .with_context(|| stack.sluice[sluice].log_tail(60))?;
    ensure!(
        (total, distinct) == (2000, 2000),
        "count() = {total}, uniqExact(id) = {distinct}: a row went in twice"
    );
    // The whole batch was sent once, when ClickHouse answered 252; never again.
    let inserts: Vec<_> = proxy
        .requests()
        .into_iter()
        .filter(|r| r.uri.contains("INSERT"))
        .collect();
    let whole = inserts.first().context("no insert")?.body_len;
    let again = inserts[1..].iter().filter(|r| r.body_len == whole).count();
    ensure!(
        again == 0,
        "the whole batch ({whole} bytes) was sent {again} more times: {:?}",
        inserts
            .iter()
            .map(|r| (r.body_len, r.action.clone()))
            .collect::<Vec<_>>()
    );
    Ok(())
}

/// The token of a batch's insert, as the proxy saw it.
fn tokens(stack: &Stack) -> Result<Vec<String>> {
    let proxy = stack.proxy.as_ref().context("the proxy")?;
    Ok(proxy
        .requests()
        .iter()
        .filter_map(|r| r.query_param("insert_deduplication_token"))
        .collect())
}

/// A server that takes tokens (the proxy answers the feature questions as a current
/// ClickHouse does, and takes the inserts itself: 18.16 would refuse the token).
fn as_a_current_server(stack: &Stack) -> Result<()> {
    let proxy = stack.proxy.as_ref().context("the proxy")?;
    proxy.add_rule(Rule::contains(
        "system.settings",
        Respond::ok(
            "async_insert\ndate_time_input_format\ninput_format_skip_unknown_fields\ninsert_deduplication_token\n",
        ),
    ));
    proxy.add_rule(Rule::contains("version()", Respond::ok("24.8.1.1\n")));
    proxy.add_rule(Rule::query_contains(
        "insert_deduplication_token",
        Respond::ok(""),
    ));
    Ok(())
}

/// The ingest stream deleted and made again (its messages numbered from 1 again): the
/// same sequences make a batch of the same id, but its token is another, so a server
/// that deduplicates by token takes the new rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_made_again_never_reuses_a_token() -> Result<()> {
    let Some(mut stack) = stack("a_stream_made_again_never_reuses_a_token").await? else {
        return Ok(());
    };
    stack.set("ingest.batch_age", "200ms");
    as_a_current_server(&stack)?;
    let sluice = stack.start_sluice(SLUICE).await?;
    let (status, body) = stack.ingest(TABLE, &rows(0..3)).await?;
    ensure!(status == 202, "ingest answered {status}: {body}");
    let first = wait_for("the first batch's insert", DEADLINE, POLL, || async {
        let t = tokens(&stack)?;
        if t.is_empty() {
            anyhow::bail!("no insert yet")
        } else {
            Ok(t)
        }
    })
    .await
    .with_context(|| stack.sluice[sluice].log_tail(40))?;

    // Sluice stopped, the stream deleted, Sluice again: it makes the stream anew.
    stack.sluice[sluice].sigterm()?;
    stack.sluice[sluice]
        .wait_exit(Duration::from_secs(20))
        .await?;
    let jet = JetStreamView::connect(&stack.nats.url()).await?;
    jet.context().delete_stream("INGEST").await?;
    stack.restart_sluice(sluice).await?;
    let (status, body) = stack.ingest(TABLE, &rows(10..13)).await?;
    ensure!(status == 202, "ingest answered {status}: {body}");
    let all = wait_for("the second batch's insert", DEADLINE, POLL, || async {
        let t = tokens(&stack)?;
        if t.len() > first.len() {
            Ok(t)
        } else {
            anyhow::bail!("{} inserts with a token", t.len())
        }
    })
    .await
    .with_context(|| stack.sluice[sluice].log_tail(40))?;
    let second = &all[first.len()..];
    ensure!(
        second.iter().all(|t| !first.contains(t)),
        "a token of the old stream's batch came again: {first:?} then {second:?}"
    );
    Ok(())
}
