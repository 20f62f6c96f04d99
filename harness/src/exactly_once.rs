//! Which tables a running Sluice reports exactly-once, as an operator looks it up: the
//! table's node in `/admin/actors` (with the reason) and the gauge
//! `sluice_table_exactly_once`; and before it runs, `sluice check-config`.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};

use crate::chaos::{metric_value, table_state};
use crate::stack::Stack;
use crate::wait_for;

/// `exactly_once` and its reason for each of `tables` in `/admin/actors` of the first
/// instance, once every one of them has taken an insert.
pub async fn exactly_once_reports(stack: &Stack, tables: &[&str]) -> Result<Vec<(bool, String)>> {
    wait_for(
        "the tables' nodes to say whether they are exactly-once",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let (status, tree) = stack.admin_get("/admin/actors").await?;
            ensure!(status == 200, "/admin/actors answered {status}");
            tables
                .iter()
                .map(|table| {
                    let state = table_state(&tree, table)
                        .with_context(|| format!("no node for {table} yet"))?;
                    let exactly_once = state["exactly_once"]
                        .as_bool()
                        .with_context(|| format!("{table} not known yet: {state}"))?;
                    let why = state["exactly_once_why"].as_str().unwrap_or_default();
                    Ok((exactly_once, why.to_owned()))
                })
                .collect()
        },
    )
    .await
}

/// `sluice_table_exactly_once` of each of `tables` on the first instance.
pub async fn exactly_once_gauges(stack: &Stack, tables: &[&str]) -> Result<Vec<f64>> {
    let metrics = stack.metrics_of(0).await?;
    Ok(tables
        .iter()
        .map(|table| metric_value(&metrics, "sluice_table_exactly_once", &[("table", table)]))
        .collect())
}

/// What `sluice check-config` (the binary `sluice`) prints for the stack's configuration;
/// an error with its output when it fails.
pub async fn check_config(stack: &Stack, sluice: impl AsRef<Path>) -> Result<String> {
    let config = stack.write_config()?;
    let out = tokio::process::Command::new(sluice.as_ref())
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .await
        .context("running sluice check-config")?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "sluice check-config failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}
