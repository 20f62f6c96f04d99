//! `/metrics`: every metric name of DESIGN.md "Metrics" after the traffic that makes it
//! appear, each with its labels, and values that match what happened.

use std::collections::BTreeSet;

use anyhow::{bail, Context, Result};
use serde_json::json;
use sluice_harness::{wait_for, Metrics, Respond, Rule, Stack, StackOptions, TENANT};

use crate::*;

/// Every metric name and the labels it carries. DESIGN lists `sluice_table_backoff` and
/// `sluice_buffered_rows` with `{table}`; they carry `tenant` too, so two tenants'
/// tables of the same name are two gauges instead of one overwritten (summing by table
/// gives DESIGN's view; see `sluice_actors::metrics`).
const EXPECTED: &[(&str, &[&str])] = &[
    ("sluice_rows_received_total", &["tenant", "table"]),
    ("sluice_rows_inserted_total", &["tenant", "table"]),
    ("sluice_rows_parked_total", &["tenant", "table", "reason"]),
    ("sluice_retries_total", &["table", "reason"]),
    ("sluice_insert_requests_total", &["target", "outcome"]),
    ("sluice_insert_duration_seconds", &["target"]),
    ("sluice_batch_rows", &["table"]),
    ("sluice_breaker_state", &["target"]),
    ("sluice_table_backoff", &["tenant", "table"]),
    ("sluice_buffered_rows", &["tenant", "table"]),
    ("sluice_consumer_pending", &["stream"]),
    ("sluice_actor_restarts_total", &["kind"]),
    ("sluice_dlq_publish_failures_total", &["tenant", "table"]),
    ("sluice_query_total", &["status"]),
    ("sluice_query_retries_total", &[]),
    ("sluice_query_killed_total", &[]),
    ("sluice_retry_budget_tokens", &[]),
    ("sluice_query_duration_seconds", &[]),
];

fn labels_of(m: &Metrics, name: &str) -> Result<BTreeSet<String>> {
    let sets = m.label_sets(name);
    match sets.len() {
        0 => bail!("{name} is missing from /metrics"),
        1 => Ok(sets.into_iter().next().unwrap_or_default()),
        _ => bail!("{name} appears with different label sets: {sets:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_design_metric_appears_with_its_labels() -> Result<()> {
    // The list here is the actor crate's list: a name added there must be added here.
    let listed: BTreeSet<&str> = sluice_actors::metrics::ALL.iter().copied().collect();
    let expected: BTreeSet<&str> = EXPECTED.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        listed, expected,
        "sluice_actors::metrics::ALL and this test disagree"
    );

    let mut stack = Stack::start(StackOptions::default().with_proxy()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack.set("pipeline.backoff_initial", "2s");
    stack.set("pipeline.backoff_max", "2s");
    stack.set("query.target", "main");
    stack.set("query.user", sluice_harness::QUERY_USER);
    stack.set("query.password_env", "SLUICE_TEST_QUERY_PASSWORD");
    stack.env.push((
        "SLUICE_TEST_QUERY_PASSWORD".into(),
        sluice_harness::QUERY_PASSWORD.into(),
    ));
    stack.start_sluice(SLUICE).await?;
    let proxy = stack.proxy.as_ref().context("a stack with a proxy")?;

    // Rows that land, and one ClickHouse rejects (parked).
    let good: Vec<_> = (0..10).map(|id| json!({"id": id, "name": "ok"})).collect();
    ingest_ok(&stack, "events", &good).await?;
    ingest_ok(
        &stack,
        "events",
        &[json!({"id": "not a number", "name": "bad"})],
    )
    .await?;
    wait_count(&stack, "SELECT count() FROM events", 10).await?;
    wait_for("the bad row is parked", DEADLINE, POLL, || async {
        match dlq_count(&stack, TENANT, "events").await? {
            1 => Ok(()),
            n => bail!("{n} parked"),
        }
    })
    .await?;

    // A codeless 503 from "a proxy" in front of ClickHouse: the insert is retried after
    // the breaker's window, and rows arriving meanwhile are handed back (backoff).
    proxy.add_rule(Rule::contains("INSERT INTO", Respond::status_only(503)).times(1));
    ingest_ok(&stack, "events", &[json!({"id": 100, "name": "retried"})]).await?;
    wait_node(
        &stack,
        "pool",
        "main",
        "the breaker opens on the 503",
        |n| n["state"]["breaker"]["state"] != "closed",
    )
    .await?;
    ingest_ok(
        &stack,
        "events",
        &[json!({"id": 101, "name": "handed back"})],
    )
    .await?;
    wait_count(&stack, "SELECT count() FROM events", 12).await?;

    // A table actor panics (fault injection) and is respawned.
    panic_table_and_wait_respawn(&stack, TENANT, "events").await?;
    ingest_ok(
        &stack,
        "events",
        &[json!({"id": 102, "name": "after the restart"})],
    )
    .await?;
    wait_count(&stack, "SELECT count() FROM events", 13).await?;

    // Queries through the gateway: one answered at once, one retried after an
    // overload answer, one past its deadline (killed).
    let query = |body: serde_json::Value| {
        stack
            .http()
            .post(format!("{}/v1/query", stack.api_url()))
            .header("X-Tenant", TENANT)
            .header("Content-Type", "application/json")
            .body(body.to_string())
            .send()
    };
    let r = query(json!({"sql": "SELECT count() FROM events"})).await?;
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
    proxy.add_rule(
        Rule::contains(
            "SELECT 1 AS retried",
            Respond::clickhouse_modern(745, "SERVER_OVERLOADED", "busy"),
        )
        .times(1),
    );
    let r = query(json!({"sql": "SELECT 1 AS retried"})).await?;
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
    let heavy = "SELECT count() FROM numbers(10000000000000) WHERE sipHash64(number) = 1";
    let r = query(json!({"sql": heavy, "timeout_ms": 700})).await?;
    assert_eq!(r.status().as_u16(), 504, "{:?}", r.text().await);

    let m = wait_for("every metric has its value", DEADLINE, POLL, || async {
        let m = stack.metrics_parsed().await?;
        let checks = [
            (
                "sluice_rows_inserted_total",
                vec![("tenant", TENANT), ("table", "events")],
                13.0,
            ),
            (
                "sluice_rows_parked_total",
                vec![("table", "events"), ("reason", "rejected")],
                1.0,
            ),
            ("sluice_buffered_rows", vec![("table", "events")], 0.0),
            ("sluice_breaker_state", vec![("target", "main")], 0.0),
        ];
        for (name, labels, want) in checks {
            let got = m.value(name, &labels);
            if got != Some(want) {
                bail!("{name}{labels:?} = {got:?}, want {want}");
            }
        }
        // Every delivery counts: the rows handed back were received again.
        let received = m.value(
            "sluice_rows_received_total",
            &[("tenant", TENANT), ("table", "events")],
        );
        if !received.is_some_and(|r| r >= 14.0) {
            bail!("sluice_rows_received_total{{events}} = {received:?}, want at least 14");
        }
        let at_least = [
            (
                "sluice_retries_total",
                vec![("table", "events"), ("reason", "unavailable")],
            ),
            (
                "sluice_retries_total",
                vec![("table", "events"), ("reason", "backoff")],
            ),
            (
                "sluice_insert_requests_total",
                vec![("target", "main"), ("outcome", "ok")],
            ),
            (
                "sluice_insert_requests_total",
                vec![("target", "main"), ("outcome", "rejected")],
            ),
            (
                "sluice_insert_requests_total",
                vec![("target", "main"), ("outcome", "unavailable")],
            ),
            (
                "sluice_insert_duration_seconds_count",
                vec![("target", "main")],
            ),
            ("sluice_batch_rows_count", vec![("table", "events")]),
            ("sluice_actor_restarts_total", vec![("kind", "table")]),
            ("sluice_query_total", vec![("status", "200")]),
            ("sluice_query_total", vec![("status", "504")]),
            ("sluice_query_retries_total", vec![]),
            ("sluice_query_killed_total", vec![]),
            ("sluice_query_duration_seconds_count", vec![]),
        ];
        for (name, labels) in at_least {
            let got = m.value(name, &labels);
            if !got.is_some_and(|v| v >= 1.0) {
                bail!("{name}{labels:?} = {got:?}, want at least 1");
            }
        }
        Ok(m)
    })
    .await?;

    assert!(m
        .value("sluice_consumer_pending", &[("stream", "INGEST")])
        .is_some());
    assert_eq!(
        m.value("sluice_table_backoff", &[("table", "events")]),
        Some(0.0)
    );
    assert_eq!(
        m.value("sluice_dlq_publish_failures_total", &[("table", "events")]),
        Some(0.0)
    );
    let mut problems = Vec::new();
    for (name, labels) in EXPECTED {
        let want: BTreeSet<String> = labels.iter().map(|l| l.to_string()).collect();
        match labels_of(&m, name) {
            Ok(got) if got == want => {}
            Ok(got) => problems.push(format!("{name} has labels {got:?}, want {want:?}")),
            Err(e) => problems.push(e.to_string()),
        }
        let kind = m.types.get(*name).map(String::as_str).unwrap_or("untyped");
        let want_kind = if name.ends_with("_total") {
            "counter"
        } else if name.ends_with("_seconds") || *name == "sluice_batch_rows" {
            "histogram"
        } else {
            "gauge"
        };
        if kind != want_kind {
            problems.push(format!("{name} is a {kind}, want a {want_kind}"));
        }
    }
    assert!(
        problems.is_empty(),
        "{problems:#?}\n{}",
        stack.metrics().await?
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_pending_is_the_lag() -> Result<()> {
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    // The consumer holds at most 10 rows: with ClickHouse down the rest wait in the
    // stream, undelivered.
    stack.set("nats.max_ack_pending", 10);
    stack.set("pipeline.backoff_initial", "300ms");
    stack.set("pipeline.backoff_max", "1s");
    stack.start_sluice(SLUICE).await?;
    stack.clickhouse.stop().await?;
    let rows: Vec<_> = (0..100)
        .map(|id| json!({"id": id, "name": "lag"}))
        .collect();
    ingest_ok(&stack, "events", &rows).await?;

    let lag = wait_for("a lag of at least 80 rows", DEADLINE, POLL, || {
        lagging(&stack, 80.0, 100.0)
    })
    .await?;
    assert!(lag <= 90.0, "the consumer holds only 10: {lag}");

    stack.clickhouse.start_again().await?;
    wait_count(&stack, "SELECT count() FROM events", 100).await?;
    wait_for("no lag", DEADLINE, POLL, || lagging(&stack, 0.0, 0.0)).await?;
    Ok(())
}

/// The lag per `/metrics`, when it is in `low..=high` and the tree shows the same.
async fn lagging(stack: &Stack, low: f64, high: f64) -> Result<f64> {
    let m = stack.metrics_parsed().await?;
    let pending = m.value("sluice_consumer_pending", &[("stream", "INGEST")]);
    let tree = tree(stack).await?;
    let shown = find_node(&tree, "consumer", "INGEST").map(|c| c["state"]["pending"].clone());
    match pending {
        Some(p) if p >= low && p <= high && shown == Some(json!(p as u64)) => Ok(p),
        _ => bail!("sluice_consumer_pending = {pending:?}, the tree shows {shown:?}"),
    }
}
