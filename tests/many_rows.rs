//! Many rows per JetStream message on real servers (issue 15): what the ingest API
//! publishes and what the pipeline counts (rows apart from messages), a bad row inside
//! a 100-row message parked alone, and an outage in the middle of isolating such a
//! message inserting no row twice. The same decisions are tested against fakes in
//! `actors/tests/exactly_once.rs`; here ClickHouse counts the rows and the DLQ holds
//! them.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use async_nats::jetstream;
use serde_json::{json, Value};
use sluice_harness::{wait_for, Mode, Rule, Stack, StackOptions, TENANT};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");
const DEADLINE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(200);

const EVENTS: &str = "CREATE TABLE events (id UInt64, name String) ENGINE = MergeTree ORDER BY id";

/// A good row, and a bad one (a string id: ClickHouse rejects it for UInt64).
fn row(id: u64) -> String {
    json!({"id": id, "name": format!("row {id}")}).to_string()
}

fn bad_row(id: u64) -> String {
    json!({"id": format!("bad-{id}"), "name": "bad"}).to_string()
}

/// Rows `ids` as one NDJSON message, the row at `bad` (an index) made bad.
fn message(ids: std::ops::Range<u64>, bad: Option<usize>) -> String {
    ids.enumerate()
        .map(|(i, id)| if Some(i) == bad { bad_row(id) } else { row(id) })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn jetstream_of(stack: &Stack) -> Result<jetstream::Context> {
    let client = async_nats::connect(stack.nats.url())
        .await
        .context("connecting to NATS")?;
    Ok(jetstream::new(client))
}

/// Publishes one message to the stack's ingest subject for `table` and waits for its ack.
async fn publish(js: &jetstream::Context, table: &str, payload: String) -> Result<()> {
    js.publish(format!("ingest.{TENANT}.{table}"), payload.into())
        .await
        .context("publishing")?
        .await
        .context("the publish ack")?;
    Ok(())
}

/// Waits until `sql` counts exactly `n`; fails at once if it ever counts more.
async fn wait_exactly(stack: &Stack, sql: &str, n: u64) -> Result<()> {
    wait_for(&format!("`{sql}` = {n}"), DEADLINE, POLL, || async move {
        let c = stack.count(sql).await?;
        if c > n {
            return Ok(Err(anyhow!("`{sql}` counted {c}, more than {n}")));
        }
        if c == n {
            Ok(Ok(()))
        } else {
            bail!("{c} so far")
        }
    })
    .await?
}

/// Waits until exactly `n` rows of `table` are parked; returns them.
async fn parked(stack: &Stack, table: &str, n: usize) -> Result<Vec<Value>> {
    wait_for(
        &format!("{n} rows of {table} parked"),
        DEADLINE,
        POLL,
        || async {
            let rows = stack.dlq_rows(table).await?;
            if rows.len() == n {
                Ok(rows)
            } else {
                Err(anyhow!("{} parked so far", rows.len()))
            }
        },
    )
    .await
}

/// Waits until the ingest stream holds no message (every one acked).
async fn queue_empty(js: &jetstream::Context) -> Result<()> {
    wait_for("the ingest stream to be empty", DEADLINE, POLL, || async {
        let mut stream = js.get_stream("INGEST").await?;
        match stream.info().await?.state.messages {
            0 => Ok(()),
            n => bail!("{n} messages in INGEST"),
        }
    })
    .await
}

/// The consumer's node of the live actor tree.
async fn consumer_node(stack: &Stack) -> Result<Value> {
    let (status, tree) = stack.admin_get("/admin/actors").await?;
    if status != 200 {
        bail!("/admin/actors answered {status}: {tree}");
    }
    let mut nodes = vec![&tree];
    while let Some(node) = nodes.pop() {
        if node["kind"] == "consumer" {
            return Ok(node.clone());
        }
        if let Some(children) = node["children"].as_array() {
            nodes.extend(children);
        }
    }
    bail!("no consumer node in {tree}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_and_messages_are_counted_apart() -> Result<()> {
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack.set("api.chunk_rows", 100);
    stack.start_sluice(SLUICE).await?;

    // 250 rows through the API: three messages of 100, 100 and 50 rows.
    let body: String = (0..250).map(|id| row(id) + "\n").collect();
    let (status, reply) = stack
        .ingest_raw("events", "application/x-ndjson", body.into_bytes(), &[])
        .await?;
    assert_eq!(status, 202, "{reply}");
    assert_eq!(reply["accepted"], 250, "{reply}");
    // One message of 100 rows straight to JetStream.
    let js = jetstream_of(&stack).await?;
    publish(&js, "events", message(1000..1100, None)).await?;
    wait_exactly(&stack, "SELECT count() FROM events", 350).await?;
    assert_eq!(stack.count("SELECT uniqExact(id) FROM events").await?, 350);

    let counted = wait_for("the counters to settle", DEADLINE, POLL, || async {
        let m = stack.metrics_parsed().await?;
        let table = [("tenant", TENANT), ("table", "events")];
        let get = |name: &str| m.value(name, &table).unwrap_or(-1.0);
        let counted = [
            get("sluice_ingest_rows_total"),
            get("sluice_ingest_messages_total"),
            get("sluice_rows_received_total"),
            get("sluice_messages_received_total"),
            get("sluice_rows_inserted_total"),
        ];
        if counted[4] == 350.0 {
            Ok(counted)
        } else {
            bail!("{counted:?}")
        }
    })
    .await?;
    assert_eq!(counted, [250.0, 3.0, 350.0, 4.0, 350.0]);

    // The tree shows both too (its snapshots are published a little behind).
    wait_for(
        "the consumer's snapshot to count both",
        DEADLINE,
        POLL,
        || async {
            let node = consumer_node(&stack).await?;
            let state = &node["state"];
            match (
                state["pulled_total"].as_u64(),
                state["pulled_rows_total"].as_u64(),
            ) {
                (Some(4), Some(350)) => Ok(()),
                _ => bail!("{node}"),
            }
        },
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_row_in_the_middle_of_a_hundred_row_message_is_parked_alone() -> Result<()> {
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack.start_sluice(SLUICE).await?;
    let js = jetstream_of(&stack).await?;
    publish(&js, "events", message(0..100, Some(50))).await?;

    let rows = parked(&stack, "events", 1).await?;
    let parked = &rows[0];
    assert_eq!(
        sluice_harness::parked_json(parked)["id"],
        "bad-50",
        "{parked}"
    );
    let headers = &parked["headers"];
    assert_eq!(headers["Sluice-Original-Line"], "50", "{parked}");
    assert_eq!(headers["Sluice-Error-Class"], "Rejected", "{parked}");
    assert_eq!(
        headers["Sluice-Original-Subject"],
        format!("ingest.{TENANT}.events"),
        "{parked}"
    );
    // Its 99 neighbours land, each once.
    wait_exactly(&stack, "SELECT count() FROM events", 99).await?;
    assert_eq!(stack.count("SELECT uniqExact(id) FROM events").await?, 99);
    assert_eq!(
        stack
            .count("SELECT count() FROM events WHERE id IN (49, 51)")
            .await?,
        2
    );
    // Nothing is left in the queue: the message was acked once all its rows were
    // settled.
    queue_empty(&js).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_while_isolating_a_many_row_message_inserts_no_row_twice() -> Result<()> {
    let mut stack = Stack::start(StackOptions::default().with_proxy()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    // The message comes back soon after the outage.
    stack.set("pipeline.backoff_initial", "200ms");
    stack.set("pipeline.backoff_max", "1s");
    stack.start_sluice(SLUICE).await?;
    let proxy = stack.proxy.as_ref().context("a stack with a proxy")?;

    // Row 80 is in the whole batch (rejected for row 60, the bad one) and then in the
    // rows after the bad one, where isolation goes on: that insert meets an outage.
    let marker = "\"row 80\"";
    proxy.add_rule(Rule::contains(marker, Mode::PassThrough).times(1));
    proxy.add_rule(Rule::contains(marker, Mode::Reset).times(1));
    let js = jetstream_of(&stack).await?;
    publish(&js, "events", message(0..100, Some(60))).await?;

    let rows = parked(&stack, "events", 1).await?;
    assert_eq!(
        sluice_harness::parked_json(&rows[0])["id"],
        "bad-60",
        "{}",
        rows[0]
    );
    wait_exactly(&stack, "SELECT count() FROM events", 99).await?;
    assert_eq!(stack.count("SELECT uniqExact(id) FROM events").await?, 99);
    // The outage did happen where it was meant to: an insert was reset after the first.
    let resets = proxy
        .requests()
        .iter()
        .filter(|r| r.action.ends_with("reset"))
        .count();
    assert_eq!(resets, 1, "{:?}", proxy.requests());
    // Once the message has left the queue nothing can come again: still 99.
    queue_empty(&js).await?;
    assert_eq!(stack.count("SELECT count() FROM events").await?, 99);
    Ok(())
}

/// `[pipeline] max_held_rows` bounds what the whole pipeline pulls and has not settled,
/// in rows: with ClickHouse hanging on every insert (nothing is settled), 50 messages
/// of 100 rows waiting, an instance bounded at 300 rows takes three messages and no
/// more; once ClickHouse answers, every row lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rows_held_by_the_pipeline_stay_within_max_held_rows() -> Result<()> {
    const BOUND: u64 = 300;
    if sluice_harness::available(
        "the_rows_held_by_the_pipeline_stay_within_max_held_rows",
        sluice_harness::clickhouse::binary(),
    )?
    .is_none()
    {
        return Ok(());
    }
    let mut stack = Stack::start(StackOptions::default().with_proxy()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack.set("pipeline.max_held_rows", BOUND as i64);
    stack.set("ingest.batch_rows", BOUND as i64);
    stack.set("ingest.batch_age", "200ms");
    stack.set("clickhouse.targets.main.insert_timeout", "120s");
    let sluice = stack.start_sluice(SLUICE).await?;
    let proxy = stack.proxy.as_ref().context("the proxy")?;
    proxy.add_rule(Rule::query_contains("INSERT", Mode::Stall));
    let js = jetstream_of(&stack).await?;
    for m in 0..50u64 {
        publish(&js, "events", message(m * 100..m * 100 + 100, None)).await?;
    }
    let received = || async {
        let text = stack.metrics_of(sluice).await?;
        anyhow::Ok(sluice_harness::chaos::metric_value(
            &text,
            "sluice_rows_received_total",
            &[("table", "events")],
        ) as u64)
    };
    // The bound is reached (inserts hang, so nothing leaves)...
    wait_for(
        "the pipeline holds rows up to its bound",
        DEADLINE,
        POLL,
        || async {
            let n = received().await?;
            if n > BOUND {
                return Ok(Err(anyhow!("{n} rows pulled and held, over {BOUND}")));
            }
            if n == BOUND {
                Ok(Ok(()))
            } else {
                bail!("{n} rows pulled so far")
            }
        },
    )
    .await??;
    // ...and held: 20 looks over two seconds while the inserts hang.
    for _ in 0..20 {
        let n = received().await?;
        anyhow::ensure!(n <= BOUND, "{n} rows pulled and held, over {BOUND}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let proxy = stack.proxy.as_ref().context("the proxy")?;
    proxy.clear_rules();
    // Refusing resets the hung inserts' connections; then ClickHouse answers.
    proxy.set_mode(Mode::Refuse).await?;
    proxy.set_mode(Mode::PassThrough).await?;
    wait_exactly(&stack, "SELECT count() FROM events", 5000)
        .await
        .with_context(|| stack.sluice[sluice].log_tail(40))?;
    Ok(())
}
