//! `/metrics`: every metric name (docs/operations.md's table) after the traffic that makes it
//! appear, each with its labels, and values that match what happened; every series with
//! known labels there from start at 0; every page accepted by `promtool check metrics`;
//! and the shipped alert rules (`deploy/alerts.yaml`, checked by `promtool check rules`
//! and agreeing with docs/operations.md) and Grafana dashboard
//! (`deploy/grafana-dashboard.json`) using only metrics a scrape shows.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use sluice_harness::prom::{
    metric_names, promtool_binary, promtool_check_metrics, promtool_check_rules,
};
use sluice_harness::{available, wait_for, Metrics, Respond, Rule, Stack, StackOptions, TENANT};

use crate::*;

/// Every metric name and the labels it carries. `sluice_table_backoff` and
/// `sluice_buffered_rows` with `{table}`; they carry `tenant` too, so two tenants'
/// tables of the same name are two gauges instead of one overwritten (summing by table
/// gives the per-table view; see `sluice_actors::metrics`).
const EXPECTED: &[(&str, &[&str])] = &[
    ("sluice_rows_received_total", &["tenant", "table"]),
    ("sluice_messages_received_total", &["tenant", "table"]),
    ("sluice_rows_inserted_total", &["tenant", "table"]),
    ("sluice_rows_parked_total", &["tenant", "table", "reason"]),
    ("sluice_retries_total", &["table", "reason"]),
    (
        "sluice_insert_requests_total",
        &["target", "replica", "outcome"],
    ),
    ("sluice_insert_duration_seconds", &["target", "replica"]),
    ("sluice_batch_rows", &["table"]),
    ("sluice_breaker_state", &["target", "replica"]),
    ("sluice_table_backoff", &["tenant", "table"]),
    ("sluice_buffered_rows", &["tenant", "table"]),
    ("sluice_table_missing", &["tenant", "table"]),
    ("sluice_table_exactly_once", &["tenant", "table"]),
    ("sluice_manifest_failures_total", &["tenant", "table"]),
    (
        "sluice_batches_past_dedup_window_total",
        &["tenant", "table"],
    ),
    ("sluice_messages_split_total", &["tenant", "table"]),
    ("sluice_messages_uncovered_total", &["tenant", "table"]),
    ("sluice_split_copies_dropped_total", &["tenant", "table"]),
    ("sluice_split_parts_unrecorded_total", &["tenant", "table"]),
    ("sluice_consumer_pending", &["stream"]),
    ("sluice_consumer_stalls_total", &["stream", "reason"]),
    ("sluice_actor_restarts_total", &["kind"]),
    ("sluice_dlq_publish_failures_total", &["tenant", "table"]),
    ("sluice_query_total", &["status"]),
    ("sluice_query_retries_total", &[]),
    ("sluice_query_killed_total", &[]),
    ("sluice_retry_budget_tokens", &[]),
    ("sluice_query_duration_seconds", &[]),
];

/// Turns the query gateway on, as the harness's read-only query user.
fn with_query_gateway(stack: &mut Stack) {
    stack.set("query.target", "main");
    stack.set("query.user", sluice_harness::QUERY_USER);
    stack.set("query.password_env", "SLUICE_TEST_QUERY_PASSWORD");
    stack.env.push((
        "SLUICE_TEST_QUERY_PASSWORD".into(),
        sluice_harness::QUERY_PASSWORD.into(),
    ));
}

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
    // The list here is the design's list: a name added there must be added here.
    let listed: BTreeSet<&str> = sluice::telemetry::metrics::design_metrics().collect();
    let expected: BTreeSet<&str> = EXPECTED.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        listed, expected,
        "the design's metrics (telemetry::metrics::design_metrics) and this test disagree"
    );

    let mut stack = Stack::start(StackOptions::default().with_proxy()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack.set("pipeline.backoff_initial", "2s");
    stack.set("pipeline.backoff_max", "2s");
    with_query_gateway(&mut stack);
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
    let mut problems = undocumented(&m)?;
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
    // The lag counts messages: one row each here, so that it counts rows too.
    stack.set("api.chunk_rows", 1);
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

/// A file of the repository.
fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The `expr:` of every rule in `deploy/alerts.yaml`, with the alert's name. The file
/// keeps each expression on its line (no YAML block scalars), so it is read without a
/// YAML parser; a rule that breaks that is an error here, not a rule left unchecked.
fn alert_rules() -> Result<Vec<(String, String)>> {
    let path = repo_file("deploy/alerts.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut rules = Vec::new();
    let mut alert: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("- alert:") {
            alert = Some(name.trim().to_string());
        } else if let Some(expr) = line.strip_prefix("expr:") {
            let expr = expr.trim();
            let Some(name) = alert.take() else {
                bail!("an expr: outside an alert rule: {line}");
            };
            if expr.is_empty() || expr.starts_with(['|', '>', '"', '\'']) {
                bail!("{name}: write the expr on its line, unquoted: {line}");
            }
            rules.push((name, expr.to_string()));
        }
    }
    if let Some(name) = alert {
        bail!("alert {name} has no expr: line");
    }
    Ok(rules)
}

/// Every PromQL query of the Grafana dashboard: panel targets' `expr` and the template
/// variables' queries.
fn dashboard_queries() -> Result<Vec<String>> {
    let path = repo_file("deploy/grafana-dashboard.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let dashboard: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let mut queries = Vec::new();
    let mut stack = vec![&dashboard];
    // Bounded by the document's size: each value is visited once.
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(expr)) = map.get("expr") {
                    queries.push(expr.clone());
                }
                stack.extend(map.values());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if variable["type"] == "query" {
            let query = &variable["query"];
            let text = query["query"].as_str().or(query.as_str());
            queries.push(
                text.context("a query variable without its query")?
                    .to_string(),
            );
        }
    }
    Ok(queries)
}

/// Each query's metric names that `m` does not show (histogram `_bucket`, `_sum` and
/// `_count` belong to their histogram); a query that names no metric at all counts too.
fn unknown_metrics(m: &Metrics, queries: &[(String, String)]) -> Vec<String> {
    let mut problems = Vec::new();
    for (what, query) in queries {
        let names = metric_names(query);
        if names.is_empty() {
            problems.push(format!("{what}: no metric in `{query}`"));
        }
        for name in names {
            if m.family_of(&name).is_none() {
                problems.push(format!("{what}: {name} is not on /metrics (`{query}`)"));
            }
        }
    }
    problems
}

/// The "Metrics and alerts" section of docs/operations.md.
fn metrics_section() -> Result<String> {
    let doc = std::fs::read_to_string(repo_file("docs/operations.md"))?;
    let section = doc
        .split("## Metrics and alerts")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .context("docs/operations.md has a \"Metrics and alerts\" section")?;
    Ok(section.to_string())
}

/// Labels whose values come from the configuration (and a histogram's buckets): any
/// value goes. Every other label's values are the code's own, and the docs list them.
const NAMED_BY_CONFIGURATION: &[&str] = &["tenant", "table", "target", "replica", "stream", "le"];

/// docs/operations.md's metrics table: each metric a row names in its first cell
/// (`` `name{label,label}` ``), with those labels and the row's text.
fn documented_metrics() -> Result<BTreeMap<String, (BTreeSet<String>, String)>> {
    let section = metrics_section()?;
    let mut out = BTreeMap::new();
    for row in section.lines().filter(|l| l.starts_with("| `sluice_")) {
        let first_cell = row.split('|').nth(1).unwrap_or_default();
        for named in first_cell.split('`').skip(1).step_by(2) {
            let (name, labels) = match named.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (named, ""),
            };
            let labels: BTreeSet<String> = labels
                .split(',')
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect();
            out.insert(name.to_string(), (labels, row.to_string()));
        }
    }
    Ok(out)
}

/// What the metrics table of docs/operations.md does not say of this page: a family
/// (or a name of the actor crate's list) without a row, a row whose labels are not the
/// page's, and a value of a label the configuration does not name that its row does
/// not list (as `` `value` ``).
fn undocumented(m: &Metrics) -> Result<Vec<String>> {
    let doc = documented_metrics()?;
    let mut problems = BTreeSet::new();
    for name in sluice::telemetry::metrics::design_metrics() {
        if !doc.contains_key(name) {
            problems.insert(format!("{name} has no row in docs/operations.md's table"));
        }
    }
    let families = m
        .types
        .keys()
        .filter(|f| f.starts_with("sluice_") && !m.family(f).is_empty());
    for family in families {
        let Some((labels, row)) = doc.get(family) else {
            problems.insert(format!("{family} has no row in docs/operations.md's table"));
            continue;
        };
        let shown: BTreeSet<String> = m.label_sets(family).into_iter().flatten().collect();
        if &shown != labels {
            problems.insert(format!(
                "{family}: the page shows labels {shown:?}, the table {labels:?}"
            ));
        }
        for sample in m.family(family) {
            for (label, value) in &sample.labels {
                if !NAMED_BY_CONFIGURATION.contains(&label.as_str())
                    && !row.contains(&format!("`{value}`"))
                {
                    problems.insert(format!(
                        "{family}{{{label}=\"{value}\"}}: `{value}` is not in its row of docs/operations.md"
                    ));
                }
            }
        }
    }
    Ok(problems.into_iter().collect())
}

/// Series that must be on the page with value 0 before any traffic.
fn zero_at_start() -> Vec<(&'static str, Vec<(&'static str, &'static str)>)> {
    let mut series = Vec::new();
    for kind in ["consumer", "target", "pool", "table"] {
        series.push(("sluice_actor_restarts_total", vec![("kind", kind)]));
    }
    for outcome in ["ok", "rejected", "unavailable", "denied", "unknown"] {
        series.push((
            "sluice_insert_requests_total",
            vec![
                ("target", "main"),
                ("replica", "main"),
                ("outcome", outcome),
            ],
        ));
    }
    series.push((
        "sluice_insert_duration_seconds_count",
        vec![("target", "main"), ("replica", "main")],
    ));
    series.push((
        "sluice_breaker_state",
        vec![("target", "main"), ("replica", "main")],
    ));
    // The table configured by name under [tables."acme.events"].
    let events = [("tenant", TENANT), ("table", "events")];
    for name in [
        "sluice_rows_received_total",
        "sluice_rows_inserted_total",
        "sluice_dlq_publish_failures_total",
        "sluice_buffered_rows",
        "sluice_table_backoff",
    ] {
        series.push((name, events.to_vec()));
    }
    for reason in ["rejected", "missing_table", "no_target", "invalid_subject"] {
        let mut labels = events.to_vec();
        labels.push(("reason", reason));
        series.push(("sluice_rows_parked_total", labels));
    }
    // The ingest API's, before the table's first request: a request with refused rows
    // must raise them from 0, or the `SluiceIngestRowsRefused` alert misses it.
    for name in [
        "sluice_ingest_rows_total",
        "sluice_ingest_rows_rejected_total",
        "sluice_ingest_messages_total",
    ] {
        series.push((name, events.to_vec()));
    }
    for reason in ["unavailable", "denied", "unknown", "backoff"] {
        series.push((
            "sluice_retries_total",
            vec![("table", "events"), ("reason", reason)],
        ));
    }
    for status in ["202", "400", "409", "413", "422", "503"] {
        series.push(("sluice_ingest_requests_total", vec![("status", status)]));
    }
    for outcome in [
        "claimed",
        "replayed",
        "resumed",
        "taken_over",
        "in_progress",
        "mismatch",
        "unusable",
    ] {
        series.push((
            "sluice_ingest_idempotency_total",
            vec![("outcome", outcome)],
        ));
    }
    for status in ["200", "400", "403", "429", "503", "504"] {
        series.push(("sluice_query_total", vec![("status", status)]));
    }
    for name in [
        "sluice_query_retries_total",
        "sluice_query_killed_total",
        "sluice_query_duration_seconds_count",
    ] {
        series.push((name, vec![]));
    }
    series
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_exist_from_start_pass_promtool_and_back_every_alert_and_panel() -> Result<()> {
    let test = "metrics_exist_from_start_pass_promtool_and_back_every_alert_and_panel";
    let Some(promtool) = available(test, promtool_binary())? else {
        return Ok(());
    };
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack
        .clickhouse
        .exec("CREATE TABLE clicks (id UInt64) ENGINE = MergeTree ORDER BY id")
        .await?;
    stack.set("tables.\"acme.events\".batch_rows", 500);
    with_query_gateway(&mut stack);
    stack.start_sluice(SLUICE).await?;

    // Before any row or query: every series whose labels are known, at 0.
    let start = stack.metrics().await?;
    let m = Metrics::parse(&start)?;
    let missing: Vec<String> = zero_at_start()
        .into_iter()
        .filter(|(name, labels)| m.value(name, labels) != Some(0.0))
        .map(|(name, labels)| format!("{name}{labels:?} = {:?}", m.value(name, &labels)))
        .collect();
    assert!(missing.is_empty(), "not 0 at start: {missing:#?}\n{start}");
    assert!(
        m.value("sluice_consumer_pending", &[("stream", "INGEST")])
            .is_some(),
        "{start}"
    );
    promtool_check_metrics(&promtool, &start).context("the page at start")?;
    let problems = undocumented(&m)?;
    assert!(problems.is_empty(), "{problems:#?}\n{start}");

    // Rows that land, one ClickHouse rejects (parked), rows of a table met only now, a
    // request the API refuses, and a query.
    let rows: Vec<_> = (0..10).map(|id| json!({"id": id, "name": "ok"})).collect();
    ingest_ok(&stack, "events", &rows).await?;
    ingest_ok(&stack, "events", &[json!({"id": "x", "name": "bad"})]).await?;
    ingest_ok(&stack, "clicks", &[json!({"id": 1})]).await?;
    let (status, reply) = stack
        .ingest_raw(
            "clicks",
            "application/x-ndjson",
            b"{\"id\": 2}\n\"not an object\"\n".to_vec(),
            &[],
        )
        .await?;
    assert_eq!(
        (status, &reply["accepted"], &reply["rejected"]),
        (400, &json!(1), &json!(1)),
        "{reply}"
    );
    let answer = stack
        .http()
        .post(format!("{}/v1/query", stack.api_url()))
        .header("X-Tenant", TENANT)
        .header("Content-Type", "application/json")
        .body(json!({"sql": "SELECT count() FROM events"}).to_string())
        .send()
        .await?;
    assert_eq!(answer.status().as_u16(), 200, "{:?}", answer.text().await);
    wait_count(&stack, "SELECT count() FROM events", 10).await?;
    wait_count(&stack, "SELECT count() FROM clicks", 2).await?;
    let loaded = wait_for("the load shows on /metrics", DEADLINE, POLL, || async {
        let text = stack.metrics().await?;
        let m = Metrics::parse(&text)?;
        let parked = m.value(
            "sluice_rows_parked_total",
            &[("table", "events"), ("reason", "rejected")],
        );
        let clicks = m.value("sluice_rows_inserted_total", &[("table", "clicks")]);
        if parked == Some(1.0) && clicks == Some(2.0) {
            Ok(text)
        } else {
            bail!("parked {parked:?}, clicks inserted {clicks:?}")
        }
    })
    .await?;
    promtool_check_metrics(&promtool, &loaded).context("the page after load")?;
    let m = Metrics::parse(&loaded)?;
    let problems = undocumented(&m)?;
    assert!(problems.is_empty(), "{problems:#?}\n{loaded}");
    for kind in ["consumer", "pool", "table"] {
        assert_eq!(
            m.value("sluice_actor_restarts_total", &[("kind", kind)]),
            Some(0.0),
            "still there, and nothing restarted"
        );
    }

    // Every metric an alert or a panel uses is on the page.
    let mut queries: Vec<(String, String)> = alert_rules()?
        .into_iter()
        .map(|(name, expr)| (format!("alert {name}"), expr))
        .collect();
    queries.extend(
        dashboard_queries()?
            .into_iter()
            .map(|q| ("dashboard".to_string(), q)),
    );
    assert!(queries.len() > 20, "{queries:?}");
    let problems = unknown_metrics(&m, &queries);
    assert!(problems.is_empty(), "{problems:#?}\n{loaded}");
    Ok(())
}

#[test]
fn the_alert_rules_pass_promtool_and_agree_with_the_operations_doc() -> Result<()> {
    let test = "the_alert_rules_pass_promtool_and_agree_with_the_operations_doc";
    let Some(promtool) = available(test, promtool_binary())? else {
        return Ok(());
    };
    promtool_check_rules(&promtool, &repo_file("deploy/alerts.yaml"))?;

    let in_file: BTreeSet<String> = alert_rules()?.into_iter().map(|(name, _)| name).collect();
    let section = metrics_section()?;
    let in_doc: BTreeSet<String> = section
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|word| {
            word.starts_with("Sluice") && word.chars().all(|c| c.is_ascii_alphanumeric())
        })
        .map(str::to_string)
        .collect();
    assert_eq!(
        in_doc, in_file,
        "the alerts docs/operations.md names and those deploy/alerts.yaml defines"
    );
    Ok(())
}
