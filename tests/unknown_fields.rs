//! An unknown field through the whole pipeline, on a ClickHouse whose profile skips
//! unknown fields by default (as current releases do): for a table that did not opt in
//! the row is parked with code 117, visibly, and its neighbours land; for a table with
//! `skip_unknown_fields = true` it lands without the field.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};
use sluice_harness::{clickhouse, wait_for, Stack, StackOptions};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");
const DEADLINE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(200);

async fn rows_in(stack: &Stack, table: &str, n: u64) -> Result<()> {
    stack.wait_for_count(table, n, DEADLINE).await?;
    Ok(())
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_field_is_parked_unless_the_table_skips_it() -> Result<()> {
    let mut stack = Stack::start(StackOptions::default()).await?;
    for table in ["strict", "loose"] {
        stack
            .clickhouse
            .exec(&format!(
                "CREATE TABLE {table} (id UInt64, name String) ENGINE = MergeTree ORDER BY id"
            ))
            .await?;
    }
    stack.set("clickhouse.targets.main.user", clickhouse::SKIPPING_USER);
    stack.set(
        "clickhouse.targets.main.password_env",
        "SLUICE_TEST_CH_PASSWORD",
    );
    stack.env.push((
        "SLUICE_TEST_CH_PASSWORD".into(),
        clickhouse::SKIPPING_PASSWORD.into(),
    ));
    stack.set("tables.\"acme.loose\".skip_unknown_fields", true);
    stack.start_sluice(SLUICE).await?;

    let rows = [
        json!({"id": 1, "name": "known fields only"}),
        json!({"id": 2, "name": "one field more", "added_later": "x"}),
        json!({"id": 3, "name": "known fields only"}),
    ];
    for table in ["strict", "loose"] {
        let (status, reply) = stack.ingest(table, &rows).await?;
        if status != 202 || reply["accepted"] != 3 {
            bail!("ingest into {table}: {status} {reply}");
        }
    }

    let parked_rows = parked(&stack, "strict", 1).await?;
    let row = &parked_rows[0];
    assert_eq!(sluice_harness::parked_json(row)["id"], 2, "{row}");
    assert_eq!(row["headers"]["Sluice-Error-Class"], "Rejected", "{row}");
    assert_eq!(row["headers"]["Sluice-Error-Code"], "117", "{row}");
    rows_in(&stack, "strict", 2).await?;
    assert_eq!(
        stack
            .clickhouse
            .exec("SELECT id FROM strict ORDER BY id FORMAT CSV")
            .await?
            .trim(),
        "1\n3"
    );

    rows_in(&stack, "loose", 3).await?;
    assert_eq!(
        stack
            .clickhouse
            .exec("SELECT id, name FROM loose WHERE id = 2 FORMAT CSV")
            .await?
            .trim(),
        "2,\"one field more\""
    );
    // A row is inserted or parked, never both.
    assert!(
        stack.dlq_rows("loose").await?.is_empty(),
        "nothing of the table that skips unknown fields is parked"
    );
    assert_eq!(
        stack.count("strict").await? + stack.count("loose").await?,
        5
    );
    Ok(())
}
