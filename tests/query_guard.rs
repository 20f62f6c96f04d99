//! The query gateway's guard against a real ClickHouse (Debian's 18.16 unless
//! `SLUICE_CLICKHOUSE_SERVER_BIN` says otherwise): a query cannot lift the gateway's
//! limits, reach out with a table function or read the server's own tables, however it
//! is quoted, commented or cased; and the queries a tenant needs still run.
//!
//! Each refused query must answer 400 with a JSON error naming what was refused, and
//! nothing may reach ClickHouse (the proxy in front of it counts requests) or the
//! address the query pointed at.

mod query_common;

use anyhow::{ensure, Result};
use query_common::{clickhouse, config, Gateway};
use serde_json::json;
use sluice_harness::{FaultProxy, Respond};

#[tokio::test]
async fn queries_that_would_lift_the_limits_or_reach_around_them_are_refused() -> Result<()> {
    let Some(ch) = clickhouse("query_guard_refusals").await? else {
        return Ok(());
    };
    ch.exec("CREATE TABLE events (id UInt64) ENGINE = MergeTree ORDER BY id")
        .await?;
    ch.exec("INSERT INTO events VALUES (1), (2)").await?;
    let proxy = FaultProxy::start(ch.http_addr()).await?;
    let gw = Gateway::start(&config(&proxy.url(), "")).await?;
    // A stand-in for Sluice's admin port: it answers /metrics to anyone who asks, and
    // counts who did.
    let admin = FaultProxy::start("127.0.0.1:9".parse()?).await?;
    admin
        .set_mode(Respond::ok("sluice_rows_inserted_total 42\n"))
        .await?;
    let metrics_url = format!("{}/metrics", admin.url());
    let tcp = ch.tcp_port();

    let cases: Vec<(String, &str)> = vec![
        // The limits, as the issue lifted them: quoted names, then every other spelling.
        (
            "SELECT count() FROM numbers(10) SETTINGS `max_execution_time` = 0, `max_threads` = 64".into(),
            "SETTINGS",
        ),
        ("SELECT 1 SETTINGS \"max_result_rows\" = 0".into(), "SETTINGS"),
        ("SELECT 1 settings /* x */ max_execution_time = 0".into(), "SETTINGS"),
        ("SELECT 1 SETTINGS -- x\n max_execution_time = 0".into(), "SETTINGS"),
        ("SELECT 1 SeTtInGs timeout_overflow_mode = 'break'".into(), "SETTINGS"),
        // Table functions: Sluice's own metrics, another user's view of a table.
        (
            format!("SELECT * FROM url('{metrics_url}', 'TSV', 'line String')"),
            "url()",
        ),
        (
            format!("SELECT * FROM `url`('{metrics_url}', 'TSV', 'line String')"),
            "url()",
        ),
        (
            format!("SELECT * FROM /* c */ URL /* c */ ('{metrics_url}', 'TSV', 'line String')"),
            "URL()",
        ),
        (
            format!("SELECT * FROM events, \"url\"('{metrics_url}', 'TSV', 'line String')"),
            "url()",
        ),
        (
            format!("SELECT * FROM remote('127.0.0.1:{tcp}', 'default', 'events', 'default', '')"),
            "remote()",
        ),
        (
            format!("SELECT id FROM events WHERE id IN (SELECT id FROM remote('127.0.0.1:{tcp}', default.events))"),
            "remote()",
        ),
        // The server's own tables.
        ("SELECT query FROM system.processes".into(), "system.processes"),
        ("SELECT query FROM `system`.`processes`".into(), "system.processes"),
        ("SELECT query FROM \"system\" . \"processes\"".into(), "system.processes"),
        ("SELECT query FROM system /* x */ .processes".into(), "system.processes"),
        ("SELECT * FROM SYSTEM.PROCESSES".into(), "SYSTEM.PROCESSES"),
        ("SELECT name FROM system.users".into(), "system.users"),
        ("SHOW PROCESSLIST".into(), "SHOW PROCESSLIST"),
    ];
    for (sql, named) in &cases {
        let r = gw.query("acme", json!({ "sql": sql })).await?;
        r.check_error_body()?;
        ensure!(r.status == 400, "{sql}: {} {}", r.status, r.body);
        ensure!(
            r.body["class"] == "rejected" && r.body["retryable"] == false,
            "{sql}: {}",
            r.body
        );
        ensure!(
            r.error().contains(named) && r.error().contains("not accepted"),
            "{sql}: the error does not name {named:?}: {}",
            r.error()
        );
    }
    // A table named by a parameter, where the SQL never shows it (current servers).
    let r = gw
        .query(
            "acme",
            json!({"sql": "SELECT query FROM {t:Identifier}", "params": {"t": "system.processes"}}),
        )
        .await?;
    r.check_error_body()?;
    ensure!(
        r.status == 400 && r.error().contains("{t:Identifier}"),
        "{} {}",
        r.status,
        r.body
    );
    ensure!(
        proxy.requests_seen() == 0,
        "refused before ClickHouse, yet {} requests reached it: {:?}",
        proxy.requests_seen(),
        proxy
            .requests()
            .iter()
            .map(|r| r.sql_text())
            .collect::<Vec<_>>()
    );
    ensure!(
        admin.requests_seen() == 0,
        "the admin stand-in was asked {} times",
        admin.requests_seen()
    );
    Ok(())
}

#[tokio::test]
async fn the_queries_a_tenant_needs_still_run() -> Result<()> {
    let Some(ch) = clickhouse("query_guard_allowed").await? else {
        return Ok(());
    };
    ch.exec("CREATE TABLE events (id UInt64, name String) ENGINE = MergeTree ORDER BY id")
        .await?;
    ch.exec("INSERT INTO events VALUES (1, 'a'), (2, 'b'), (3, 'c')")
        .await?;
    let gw = Gateway::start(&config(&ch.http_url(), "")).await?;

    for (sql, rows) in [
        ("SELECT count() AS n FROM numbers(10)", 1),
        ("SELECT number FROM system.numbers LIMIT 3", 3),
        ("SELECT dummy FROM system.one", 1),
        ("SELECT * FROM `system`.`one`", 1),
        ("SELECT id, lower(name) AS n FROM events WHERE id IN (SELECT number FROM numbers(3)) ORDER BY id, lower(name)", 2),
        ("SELECT e.id FROM events AS e CROSS JOIN (SELECT 1 AS one) AS o WHERE e.id = o.one", 1),
        ("SELECT x FROM events ARRAY JOIN [id, id * 10] AS x WHERE id = 1", 2),
        ("SELECT `settings` FROM (SELECT 1 AS `settings`) AS t", 1),
        ("SELECT 'SETTINGS max_threads = 64, url(), system.processes' AS text", 1),
        ("/* a comment */ SELECT name FROM events -- and another\nWHERE id = 2", 1),
    ] {
        let r = gw.query("acme", json!({ "sql": sql })).await?;
        ensure!(r.status == 200, "{sql}: {} {}", r.status, r.body);
        ensure!(
            r.body["rows"] == rows,
            "{sql}: expected {rows} rows: {}",
            r.body
        );
    }
    for sql in [
        "SHOW TABLES",
        "DESCRIBE TABLE events",
        "EXISTS TABLE events",
    ] {
        let r = gw.query("acme", json!({ "sql": sql })).await?;
        ensure!(r.status == 200, "{sql}: {} {}", r.status, r.body);
    }
    Ok(())
}
