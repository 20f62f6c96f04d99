//! The query gateway's metrics, read back from a Prometheus recorder.
//!
//! A binary of its own: the recorder is process-global, and counters from other tests
//! running in the same process (under `cargo test`) would blur exact counts.

mod query_common;

use std::time::Duration;

use anyhow::{ensure, Result};
use metrics_exporter_prometheus::PrometheusBuilder;
use query_common::{clickhouse, config, wait_gone, Gateway, HEAVY};
use serde_json::json;
use sluice::query::metrics as names;
use sluice_harness::{FaultProxy, Mode, Respond};

/// The value of the sample line that starts with `series` (name and labels).
fn sample(rendered: &str, series: &str) -> Option<f64> {
    rendered.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

#[tokio::test]
async fn retries_kills_budget_and_statuses_are_counted() -> Result<()> {
    let handle = PrometheusBuilder::new().install_recorder()?;
    let Some(ch) = clickhouse("query_metrics").await? else {
        return Ok(());
    };
    let proxy = FaultProxy::start(ch.http_addr()).await?;
    let gw = Gateway::start(&config(
        &proxy.url(),
        "max_attempts = 3\nretry_budget = 5.0\nretry_refill_per_sec = 0.0",
    ))
    .await?;

    // One overload answer, then healed: one retry, one token.
    proxy
        .script(
            [Respond::clickhouse_modern(745, "SERVER_OVERLOADED", "busy")],
            Mode::PassThrough,
        )
        .await?;
    let r = gw.query("acme", json!({"sql": "SELECT 1"})).await?;
    ensure!(r.status == 200, "{} {}", r.status, r.body);

    // A deadline Sluice enforces: one kill.
    let r = gw
        .query("acme", json!({"sql": HEAVY, "timeout_ms": 700}))
        .await?;
    ensure!(r.status == 504, "{} {}", r.status, r.body);
    wait_gone(&ch, r.query_id(), Duration::from_secs(2)).await?;

    // A refusal before ClickHouse.
    let r = gw.query("acme", json!({"sql": "DROP TABLE x"})).await?;
    ensure!(r.status == 403, "{} {}", r.status, r.body);

    let text = handle.render();
    let get = |series: &str| sample(&text, series);
    let total = |status: &str| get(&format!("{}{{status=\"{status}\"}}", names::QUERY_TOTAL));
    ensure!(total("200") == Some(1.0), "{text}");
    ensure!(total("504") == Some(1.0), "{text}");
    ensure!(total("403") == Some(1.0), "{text}");
    ensure!(get(names::QUERY_RETRIES_TOTAL) == Some(1.0), "{text}");
    ensure!(get(names::QUERY_KILLED_TOTAL) == Some(1.0), "{text}");
    ensure!(get(names::RETRY_BUDGET_TOKENS) == Some(4.0), "{text}");
    ensure!(
        get(&format!("{}_count", names::QUERY_DURATION_SECONDS)) == Some(3.0),
        "{text}"
    );
    Ok(())
}
