//! An integer out of range for its column: ClickHouse's JSON input stores another
//! number without a word (on 18.16 and on 26.9), so Sluice refuses such a row itself
//! and parks it with the reason; its neighbours land, and no wrapped number is stored.
//! Runs on both engines (scripts/test's "clickhouse current" phase too).

use std::time::Duration;

use anyhow::{anyhow, ensure, Result};
use serde_json::{json, Value};
use sluice_harness::{wait_for, Stack, StackOptions};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");
const DEADLINE: Duration = Duration::from_secs(60);
const TABLE: &str =
    "CREATE TABLE events (id UInt64, n UInt32, small Int8) ENGINE = MergeTree ORDER BY id";

/// Why Sluice checks: the engine itself keeps the low bits of a number too large.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clickhouse_stores_an_integer_out_of_range_as_another_number() -> Result<()> {
    let stack = Stack::start(StackOptions::default()).await?;
    let ch = &stack.clickhouse;
    ch.exec(TABLE).await?;
    ch.exec("INSERT INTO events FORMAT JSONEachRow\n{\"id\":1,\"n\":99999999999,\"small\":300}\n")
        .await?;
    let stored = ch.exec("SELECT n, small FROM events FORMAT TSV").await?;
    ensure!(stored.trim() == "1215752191\t44", "stored: {stored:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_with_an_integer_out_of_range_is_parked_with_the_reason() -> Result<()> {
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack.clickhouse.exec(TABLE).await?;
    stack.set("ingest.batch_age", "200ms");
    stack.start_sluice(SLUICE).await?;
    let rows = [
        json!({"id": 1, "n": 1, "small": 1}),
        json!({"id": 2, "n": 99_999_999_999_u64, "small": 1}),
        json!({"id": 3, "n": 4_294_967_295_u64, "small": -128}),
        json!({"id": 4, "n": 1, "small": 300}),
        json!({"id": 5, "n": 5, "small": 5}),
    ];
    let (status, body) = stack.ingest("events", &rows).await?;
    ensure!(status == 202, "{status} {body}");
    stack.wait_for_count("events", 3, DEADLINE).await?;
    let parked: Vec<Value> = wait_for(
        "2 rows parked",
        DEADLINE,
        Duration::from_millis(200),
        || async {
            let parked = stack.dlq_rows("events").await?;
            if parked.len() == 2 {
                Ok(parked)
            } else {
                Err(anyhow!("{} parked so far", parked.len()))
            }
        },
    )
    .await?;
    let reason_of = |id: u64| {
        parked
            .iter()
            // `row` is the text parked, as it came.
            .find(|p| {
                p["row"]
                    .as_str()
                    .and_then(|row| serde_json::from_str::<Value>(row).ok())
                    .is_some_and(|row| row["id"] == id)
            })
            .map(|p| {
                p["headers"]["Sluice-Error"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .unwrap_or_default()
    };
    ensure!(
        reason_of(2).contains("The value 99999999999 of column n is out of range for UInt32"),
        "{parked:?}"
    );
    ensure!(
        reason_of(4).contains("The value 300 of column small is out of range for Int8"),
        "{parked:?}"
    );
    for p in &parked {
        ensure!(p["headers"]["Sluice-Error-Code"] == "321", "{p}");
    }
    let stored = stack
        .clickhouse
        .exec("SELECT id, n, small FROM events ORDER BY id FORMAT TSV")
        .await?;
    ensure!(
        stored == "1\t1\t1\n3\t4294967295\t-128\n5\t5\t5\n",
        "stored: {stored:?}"
    );
    Ok(())
}
