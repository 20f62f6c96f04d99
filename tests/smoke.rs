//! The shortest path through everything: rows in over HTTP, out in ClickHouse and on
//! the DLQ, on real servers.

use std::time::Duration;

use serde_json::json;
use sluice_harness::{Stack, StackOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_land_and_a_bad_one_is_parked() -> anyhow::Result<()> {
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack
        .clickhouse
        .exec("CREATE TABLE events (id UInt64, name String) ENGINE = MergeTree ORDER BY id")
        .await?;
    stack.start_sluice(env!("CARGO_BIN_EXE_sluice")).await?;
    let (status, reply) = stack
        .ingest(
            "events",
            &[
                json!({"id": 1, "name": "a"}),
                json!({"id": "not a number", "name": "b"}),
                json!({"id": 3, "name": "c"}),
            ],
        )
        .await?;
    assert_eq!(status, 202, "{reply}");
    assert_eq!(reply["accepted"], 3);
    stack
        .wait_for_count("events", 2, Duration::from_secs(20))
        .await?;
    let parked = sluice_harness::wait_for(
        "one row parked",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async {
            let rows = stack.dlq_rows("events").await?;
            if rows.len() == 1 {
                Ok(rows)
            } else {
                Err(anyhow::anyhow!("{} parked", rows.len()))
            }
        },
    )
    .await?;
    assert_eq!(
        sluice_harness::parked_json(&parked[0])["id"],
        "not a number"
    );
    assert_eq!(parked[0]["headers"]["Sluice-Error-Class"], "Rejected");
    assert_eq!(stack.count("events").await?, 2);
    Ok(())
}
