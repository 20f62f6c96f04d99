//! `/readyz` and `/admin/actors` following ClickHouse: not ready before its first
//! answer, the pool's breaker open while it is down and closed when it is back, a
//! table's buffered rows.

use anyhow::{bail, Context, Result};
use reqwest::Method;
use serde_json::json;
use sluice_harness::{wait_for, Stack, StackOptions, TENANT};

use crate::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_and_the_breaker_follow_clickhouse() -> Result<()> {
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack.set("pipeline.backoff_initial", "300ms");
    stack.set("pipeline.backoff_max", "1s");
    stack.clickhouse.stop().await?;
    stack.spawn_sluice(SLUICE)?;

    // Alive but not ready: the target never answered a probe. The reasons say so.
    let (status, body) = wait_for("/readyz answers", DEADLINE, POLL, || async {
        let (status, _, body) = stack
            .admin_request(Method::GET, "/readyz", None, None)
            .await?;
        Ok((status, body))
    })
    .await?;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["ready"], false, "{body}");
    let reasons = body["reasons"].as_array().cloned().unwrap_or_default();
    assert!(
        reasons
            .iter()
            .any(|r| r.as_str().is_some_and(|r| r.contains("target main"))),
        "{body}"
    );
    let (status, _, body) = stack
        .admin_request(Method::GET, "/healthz", None, None)
        .await?;
    assert_eq!((status, body), (200, json!({"status": "alive"})));
    // The pool shows it has not been probed yet.
    let tree = tree(&stack).await?;
    let pool =
        find_node(&tree, "pool", "main").with_context(|| format!("no pool main in {tree}"))?;
    assert_eq!(pool["state"]["probed_ok"], false, "{pool}");

    // ClickHouse comes: ready.
    stack.clickhouse.start_again().await?;
    stack.wait_ready(0, DEADLINE).await?;
    let (status, _, body) = stack
        .admin_request(Method::GET, "/readyz", None, None)
        .await?;
    assert_eq!((status, body), (200, json!({"ready": true})));

    // ClickHouse goes while rows arrive: the breaker opens, with the error.
    stack.clickhouse.stop().await?;
    ingest_ok(
        &stack,
        "events",
        &[json!({"id": 1, "name": "a"}), json!({"id": 2, "name": "b"})],
    )
    .await?;
    let pool = wait_node(&stack, "pool", "main", "the breaker opens", |n| {
        n["state"]["breaker"]["state"] == "open"
    })
    .await?;
    let breaker = &pool["state"]["breaker"];
    assert!(
        breaker["last_error"]
            .as_str()
            .is_some_and(|e| !e.is_empty()),
        "{pool}"
    );
    assert!(breaker["window_until"].is_string(), "{pool}");
    assert!(breaker["window_remaining_ms"].is_u64(), "{pool}");
    let metrics = stack.metrics_parsed().await?;
    let gauge = metrics.value("sluice_breaker_state", &[("target", "main")]);
    assert!(
        matches!(gauge, Some(g) if g == 1.0 || g == 2.0),
        "breaker gauge {gauge:?}"
    );

    // Back: the breaker closes and the rows land.
    stack.clickhouse.start_again().await?;
    wait_node(&stack, "pool", "main", "the breaker closes", |n| {
        n["state"]["breaker"]["state"] == "closed"
    })
    .await?;
    wait_count(&stack, "SELECT count() FROM events", 2).await?;
    let metrics = stack.metrics_parsed().await?;
    assert_eq!(
        metrics.value("sluice_breaker_state", &[("target", "main")]),
        Some(0.0)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tables_buffered_rows_show_in_the_tree_and_the_gauge() -> Result<()> {
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack
        .clickhouse
        .exec("CREATE TABLE slow (id UInt64) ENGINE = MergeTree ORDER BY id")
        .await?;
    // Rows sit in `slow`'s buffer: neither full nor old enough to flush.
    stack.set(&format!("tables.\"{TENANT}.slow\".batch_rows"), 100_000);
    stack.set(&format!("tables.\"{TENANT}.slow\".batch_age"), "20s");
    stack.start_sluice(SLUICE).await?;

    let rows: Vec<_> = (0..5).map(|id| json!({"id": id})).collect();
    ingest_ok(&stack, "slow", &rows).await?;
    ingest_ok(&stack, "events", &[json!({"id": 1, "name": "x"})]).await?;
    let name = format!("{TENANT}.slow");
    let node = wait_node(&stack, "table", &name, "5 rows buffered", |n| {
        n["state"]["buffered_rows"] == 5
    })
    .await?;
    assert_eq!(node["status"], "running", "{node}");
    assert!(
        node["state"]["buffered_bytes"]
            .as_u64()
            .is_some_and(|b| b >= 5 * 8),
        "{node}"
    );
    assert_eq!(node["state"]["tenant"], TENANT, "{node}");
    assert_eq!(node["state"]["table"], "slow", "{node}");
    assert_eq!(node["state"]["backoff"]["state"], "closed", "{node}");
    assert_eq!(node["stale"], false, "{node}");
    // The neighbour flushed by age meanwhile, and shows nothing buffered.
    wait_count(&stack, "SELECT count() FROM events", 1).await?;
    wait_node(
        &stack,
        "table",
        &format!("{TENANT}.events"),
        "events inserted",
        |n| n["state"]["rows_inserted"] == 1 && n["state"]["buffered_rows"] == 0,
    )
    .await?;
    // The same in Prometheus.
    let metrics = wait_for("the buffered gauge says 5", DEADLINE, POLL, || async {
        let m = stack.metrics_parsed().await?;
        match m.value(
            "sluice_buffered_rows",
            &[("tenant", TENANT), ("table", "slow")],
        ) {
            Some(5.0) => Ok(m),
            other => bail!("sluice_buffered_rows{{table=slow}} = {other:?}"),
        }
    })
    .await?;
    assert_eq!(
        metrics.value("sluice_rows_received_total", &[("table", "slow")]),
        Some(5.0)
    );
    assert_eq!(
        stack.count("slow").await?,
        0,
        "nothing of slow was flushed yet"
    );
    // The tree nests: root > target > its server's pool and its tables, with the
    // consumer beside the target.
    let tree = tree(&stack).await?;
    assert_eq!(tree["kind"], "root", "{tree}");
    let kinds: Vec<_> = tree["children"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["kind"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        kinds.contains(&"consumer".to_string()) && kinds.contains(&"target".to_string()),
        "{tree}"
    );
    let target =
        find_node(&tree, "target", "main").with_context(|| format!("no target main in {tree}"))?;
    assert!(find_node(target, "pool", "main").is_some(), "{tree}");
    assert!(find_node(target, "table", &name).is_some(), "{tree}");
    Ok(())
}
