//! A ClickHouse that changes behind its URL while Sluice runs (issue 36, item 3): what
//! Sluice learnt of the server (its settings, its deduplication window) is learnt
//! again after an outage and at each table refresh, and a setting the server no longer
//! knows (code 115) makes Sluice ask again and retry, never park the rows.
//!
//! Both need clickhouse-server 18.16 itself: a server-wide `<merge_tree>` setting
//! changed across a restart, and a server that lacks settings current servers have
//! (scripts/test's "clickhouse current" phase does not run this binary).

use std::time::Duration;

use anyhow::{ensure, Result};
use serde_json::{json, Value};
use sluice_harness::chaos::metric_value;
use sluice_harness::{
    exactly_once_gauges, exactly_once_reports, wait_for, FaultProxy, Respond, Rule, Stack,
    StackOptions,
};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");
const DEADLINE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(200);

fn proxy_of(stack: &Stack) -> Result<&FaultProxy> {
    stack
        .proxy
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("the stack has no proxy"))
}

fn rows(ids: std::ops::Range<u64>) -> Vec<Value> {
    ids.map(|id| json!({"id": id, "name": format!("row {id}")}))
        .collect()
}

/// A stack whose server-wide `replicated_deduplication_window` is 1000 and whose table
/// `events` has no window of its own, Sluice running and reporting it exactly-once.
async fn stack_at_window_1000() -> Result<Stack> {
    let mut stack = Stack::start(StackOptions::default().with_zookeeper()).await?;
    stack
        .clickhouse
        .set_merge_tree_settings(&[("replicated_deduplication_window", 1000)])?;
    stack.clickhouse.restart().await?;
    stack
        .clickhouse
        .exec("CREATE TABLE events_plain (id UInt64, name String) ENGINE = MergeTree ORDER BY id")
        .await?;
    stack
        .create_replicated_table_at_default_window("events", "events_plain")
        .await?;
    stack.set("ingest.batch_age", "200ms");
    stack.start_sluice(SLUICE).await?;
    let (status, body) = stack.ingest("events", &rows(0..10)).await?;
    ensure!(status == 202, "{status} {body}");
    let reports = exactly_once_reports(&stack, &["events"]).await?;
    ensure!(
        reports[0].0 && reports[0].1.contains("last 1000 blocks"),
        "before: {reports:?}"
    );
    Ok(stack)
}

/// Polls until `events` is reported not exactly-once at a window of 10 blocks, in
/// `/admin/actors` and by the gauge, sending a row each time (every batch asks again
/// whether its table is exactly-once).
async fn reported_at_window_10(stack: &Stack, deadline: Duration) -> Result<()> {
    wait_for(
        "the table reported not exactly-once at the new window",
        deadline,
        Duration::from_secs(1),
        || async {
            let (status, body) = stack.ingest("events", &rows(0..1)).await?;
            ensure!(status == 202, "{status} {body}");
            let reports = exactly_once_reports(stack, &["events"]).await?;
            let gauges = exactly_once_gauges(stack, &["events"]).await?;
            let (exactly_once, why) = &reports[0];
            ensure!(
                !exactly_once && why.contains("last 10 blocks") && gauges == [0.0],
                "still {exactly_once} ({why}), gauge {gauges:?}"
            );
            Ok(())
        },
    )
    .await
}

/// The server stopped while Sluice inserts, its `replicated_deduplication_window`
/// lowered from 1000 to 10 blocks, started again: once the pool's breaker closes, the
/// server is asked again what it knows, and Sluice stops counting on the window (gauge
/// 0, `/admin/actors` false, the reason naming 10 blocks), since a redelivery past 10
/// blocks would go in twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_lowered_during_an_outage_is_seen_when_the_server_is_back() -> Result<()> {
    let mut stack = stack_at_window_1000().await?;
    stack.clickhouse.stop().await?;
    let (status, body) = stack.ingest("events", &rows(10..20)).await?;
    ensure!(status == 202, "{status} {body}");
    wait_for("the pool's breaker open", DEADLINE, POLL, || async {
        let metrics = stack.metrics().await?;
        let open = metric_value(&metrics, "sluice_breaker_state", &[]);
        ensure!(open > 0.0, "the breaker is still closed");
        Ok(())
    })
    .await?;
    stack
        .clickhouse
        .set_merge_tree_settings(&[("replicated_deduplication_window", 10)])?;
    stack.clickhouse.start_again().await?;
    stack.wait_for_count("events", 20, DEADLINE).await?;
    reported_at_window_10(&stack, DEADLINE).await
}

/// The same change across a restart Sluice did not notice (no insert or probe fell in
/// it): seen at the next refresh of what the server knows, within a minute
/// (`FEATURES_TTL`), where it used to be never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_lowered_across_a_quiet_restart_is_seen_within_the_refresh() -> Result<()> {
    let mut stack = stack_at_window_1000().await?;
    stack
        .clickhouse
        .set_merge_tree_settings(&[("replicated_deduplication_window", 10)])?;
    stack.clickhouse.restart().await?;
    reported_at_window_10(&stack, Duration::from_secs(90)).await
}

/// The server behind the URL downgraded while Sluice runs: it learnt a current
/// server's settings (a proxy answered the questions as one), and 18.16 now answers
/// the inserts that carry them with `Code: 115` (unknown setting). Sluice asks again
/// which settings the server knows and inserts every row; none is parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setting_refused_as_unknown_is_asked_again_and_no_row_is_parked() -> Result<()> {
    let mut stack = Stack::start(StackOptions::default().with_proxy()).await?;
    stack
        .clickhouse
        .exec("CREATE TABLE events (id UInt64, name String) ENGINE = MergeTree ORDER BY id")
        .await?;
    let proxy = proxy_of(&stack)?;
    proxy.add_rule(Rule::contains(
        "system.settings",
        Respond::ok(
            "async_insert\ndate_time_input_format\ninput_format_skip_unknown_fields\n\
             insert_deduplication_token\ninsert_deduplicate\ndeduplicate_insert\n\
             deduplicate_blocks_in_dependent_materialized_views\n",
        ),
    ));
    proxy.add_rule(Rule::contains("version()", Respond::ok("26.9.2.1\n")));
    stack.start_sluice(SLUICE).await?;
    let proxy = proxy_of(&stack)?;
    wait_for(
        "Sluice to have learnt the server's settings",
        DEADLINE,
        POLL,
        || async {
            let asked = proxy
                .requests()
                .iter()
                .any(|r| r.sql_text().contains("system.settings"));
            ensure!(asked, "not asked yet");
            Ok(())
        },
    )
    .await?;
    // The downgrade: 18.16 answers from now on.
    proxy.clear_rules();
    let (status, body) = stack.ingest("events", &rows(0..10)).await?;
    ensure!(status == 202, "{status} {body}");
    stack.wait_for_count("events", 10, DEADLINE).await?;
    let refused = proxy
        .requests()
        .iter()
        .filter(|r| r.query_param("async_insert").is_some())
        .count();
    ensure!(
        refused > 0,
        "no insert carried async_insert: the test did not downgrade anything"
    );
    let parked = stack.dlq_rows("events").await?;
    ensure!(parked.is_empty(), "rows parked: {parked:?}");
    ensure!(stack.count("events").await? == 10, "rows stored twice?");
    Ok(())
}
