//! The query gateway against a real ClickHouse (Debian's 18.16 unless
//! `SLUICE_CLICKHOUSE_SERVER_BIN` says otherwise), driven in-process through a real
//! TCP listener, with the harness's fault proxy in between where a fault is needed.
//!
//! Every test asserts what a user sees (status, body fields, headers) and what
//! ClickHouse holds afterwards (`system.processes`, row counts, what the proxy
//! received). Waits poll with deadlines; nothing sleeps and hopes.

mod query_common;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use query_common::{clickhouse, config, wait_gone, Gateway, HEAVY};
use serde_json::json;
use sluice::query;
use sluice_harness::{wait_until, FaultProxy, Mode, Respond, Rule};

// === timeouts ===

#[tokio::test]
async fn a_query_past_its_deadline_is_killed_before_the_504_and_leaves_clickhouse() -> Result<()> {
    let Some(ch) = clickhouse("query_deadline_kill").await? else {
        return Ok(());
    };
    let proxy = FaultProxy::start(ch.http_addr()).await?;
    let gw = Gateway::start(&config(&proxy.url(), "")).await?;

    // 800 ms: ClickHouse's limit cannot go below 1 s, so the client deadline passes
    // first and Sluice has to kill the query itself.
    let r = gw
        .query("acme", json!({"sql": HEAVY, "timeout_ms": 800}))
        .await?;
    r.check_error_body()?;
    ensure!(r.status == 504, "status {} {}", r.status, r.body);
    ensure!(
        r.elapsed < Duration::from_millis(1800),
        "504 after {:?}",
        r.elapsed
    );
    let b = &r.body;
    ensure!(b["class"] == "timeout" && b["retryable"] == false, "{b}");
    ensure!(b["stopped_by"] == "sluice" && b["timeout_ms"] == 800, "{b}");
    ensure!(b["kill_sent"] == true && b["kill_confirmed"] == true, "{b}");
    let id = r.query_id().to_string();
    wait_gone(&ch, &id, Duration::from_secs(2)).await?;

    // What ClickHouse was asked: the query with its id and limits, then the kill and
    // the confirmation, on the same id.
    let requests = proxy.requests();
    let first = requests.first().context("no request reached the proxy")?;
    ensure!(first.query_param("query_id").as_deref() == Some(id.as_str()));
    ensure!(first.query_param("max_execution_time").as_deref() == Some("1"));
    ensure!(first.query_param("readonly").as_deref() == Some("2"));
    ensure!(first.query_param("wait_end_of_query").as_deref() == Some("1"));
    ensure!(first.query_param("timeout_overflow_mode").as_deref() == Some("throw"));
    let kill = format!("KILL QUERY WHERE query_id = '{id}' SYNC");
    ensure!(
        requests.iter().any(|r| r.sql_text().contains(&kill)),
        "no KILL QUERY: {:?}",
        requests.iter().map(|r| r.sql_text()).collect::<Vec<_>>()
    );
    ensure!(
        requests
            .iter()
            .filter(|r| r.sql_text().contains("sipHash64"))
            .count()
            == 1,
        "a timed-out query is never retried"
    );
    Ok(())
}

#[tokio::test]
async fn a_kill_that_cannot_be_confirmed_still_answers_504_within_the_kill_timeout() -> Result<()> {
    let Some(ch) = clickhouse("query_deadline_stalled").await? else {
        return Ok(());
    };
    let proxy = FaultProxy::start(ch.http_addr()).await?;
    let gw = Gateway::start(&config(&proxy.url(), "")).await?;

    // A hung server answers neither the query nor the kill: the client still gets its
    // 504 no later than its timeout plus `kill_timeout` (1 s), told the kill is
    // unconfirmed, and the query is not retried.
    proxy.set_mode(Mode::Stall).await?;
    let r = gw
        .query("acme", json!({"sql": "SELECT 1", "timeout_ms": 800}))
        .await?;
    r.check_error_body()?;
    ensure!(r.status == 504, "status {} {}", r.status, r.body);
    ensure!(
        r.elapsed >= Duration::from_millis(800) && r.elapsed < Duration::from_millis(2300),
        "504 after {:?}",
        r.elapsed
    );
    let b = &r.body;
    ensure!(
        b["class"] == "timeout" && b["kill_confirmed"] == false,
        "{b}"
    );
    // The stalled server took no KILL QUERY either, and the text says what the fields
    // say: the kill was not taken.
    let error = b["error"].as_str().unwrap_or_default();
    ensure!(b["kill_sent"] == false, "{b}");
    ensure!(
        error.contains("did not take Sluice's KILL QUERY")
            && !error.contains("Sluice sent KILL QUERY"),
        "{b}"
    );
    let texts: Vec<String> = proxy.requests().iter().map(|r| r.sql_text()).collect();
    ensure!(
        texts.iter().filter(|t| t.contains("SELECT 1")).count() == 1,
        "an unconfirmed kill is never followed by a retry: {texts:#?}"
    );
    Ok(())
}

#[tokio::test]
async fn clickhouse_own_time_limit_is_a_504_and_never_retried() -> Result<()> {
    let Some(ch) = clickhouse("query_server_limit").await? else {
        return Ok(());
    };
    let proxy = FaultProxy::start(ch.http_addr()).await?;
    let gw = Gateway::start(&config(&proxy.url(), "max_attempts = 3")).await?;

    // 2600 ms less the 500 ms margin: ClickHouse stops the scan at 2 s (code 159).
    let r = gw
        .query("acme", json!({"sql": HEAVY, "timeout_ms": 2600}))
        .await?;
    r.check_error_body()?;
    ensure!(r.status == 504, "status {} {}", r.status, r.body);
    ensure!(
        r.elapsed < Duration::from_millis(3600),
        "504 after {:?}",
        r.elapsed
    );
    let b = &r.body;
    ensure!(b["code"] == 159 && b["stopped_by"] == "clickhouse", "{b}");
    ensure!(b["kill_sent"] == false && b["retryable"] == false, "{b}");
    wait_gone(&ch, r.query_id(), Duration::from_secs(2)).await?;
    let requests = proxy.requests();
    ensure!(
        requests.len() == 1,
        "one attempt, no kill: {} requests",
        requests.len()
    );
    ensure!(requests[0].query_param("max_execution_time").as_deref() == Some("2"));
    Ok(())
}

// === retries ===

#[tokio::test]
async fn unavailable_answers_are_retried_until_the_proxy_heals() -> Result<()> {
    let Some(ch) = clickhouse("query_retry_heals").await? else {
        return Ok(());
    };
    let proxy = FaultProxy::start(ch.http_addr()).await?;
    let gw = Gateway::start(&config(&proxy.url(), "max_attempts = 4")).await?;

    // A current server's 745 (header and body), then an old server's, then healed.
    proxy
        .script(
            [
                Respond::clickhouse_modern(745, "SERVER_OVERLOADED", "too many queries"),
                Respond::clickhouse_old(745, "too many queries"),
            ],
            Mode::PassThrough,
        )
        .await?;
    let r = gw
        .query(
            "acme",
            json!({"sql": "SELECT 42 AS answer", "format": "JSONCompact"}),
        )
        .await?;
    ensure!(r.status == 200, "status {} {}", r.status, r.body);
    ensure!(r.body["data"] == json!([[42]]), "{}", r.body);
    ensure!(r.body["meta"][0]["name"] == "answer", "{}", r.body);
    ensure!(r.header(query::ATTEMPTS_HEADER) == Some("3"));
    let requests = proxy.requests();
    ensure!(requests.len() == 3, "{} requests", requests.len());
    for req in &requests {
        ensure!(req.query_param("query_id").as_deref() == Some(r.query_id()));
        ensure!(req.query_param("replace_running_query").as_deref() == Some("1"));
    }
    Ok(())
}

#[tokio::test]
async fn a_codeless_503_is_retried_only_after_the_attempt_is_confirmed_gone() -> Result<()> {
    let Some(ch) = clickhouse("query_retry_codeless").await? else {
        return Ok(());
    };
    let proxy = FaultProxy::start(ch.http_addr()).await?;
    let gw = Gateway::start(&config(&proxy.url(), "max_attempts = 3")).await?;

    // A load balancer's bare 503 says nothing about the query behind it: before each
    // retry Sluice kills it by id and checks system.processes.
    proxy.add_rule(Rule::body_contains("SELECT 43", Respond::status_only(503)).times(2));
    let r = gw.query("acme", json!({"sql": "SELECT 43 AS n"})).await?;
    ensure!(r.status == 200, "status {} {}", r.status, r.body);
    ensure!(r.body["data"] == json!([{"n": 43}]), "{}", r.body);
    let texts: Vec<String> = proxy.requests().iter().map(|r| r.sql_text()).collect();
    let id = r.query_id();
    let kills = texts
        .iter()
        .filter(|t| t.contains(&format!("KILL QUERY WHERE query_id = '{id}'")))
        .count();
    let probes = texts
        .iter()
        .filter(|t| t.contains("system.processes") && t.contains(id))
        .count();
    ensure!(
        kills == 2 && probes >= 2,
        "kills {kills} probes {probes}: {texts:#?}"
    );
    // Order: query, kill, probe, query, kill, probe, query.
    let queries: Vec<usize> = texts
        .iter()
        .enumerate()
        .filter(|(_, t)| t.contains("SELECT 43"))
        .map(|(i, _)| i)
        .collect();
    ensure!(queries.len() == 3, "{texts:#?}");
    ensure!(
        texts[queries[0]..queries[1]]
            .iter()
            .any(|t| t.contains("KILL QUERY")),
        "kill before the first retry"
    );
    Ok(())
}

#[tokio::test]
async fn an_empty_retry_budget_answers_503_at_once_without_another_request() -> Result<()> {
    let Some(ch) = clickhouse("query_budget").await? else {
        return Ok(());
    };
    let proxy = FaultProxy::start(ch.http_addr()).await?;
    let gw = Gateway::start(&config(
        &proxy.url(),
        "max_attempts = 5\nretry_budget = 1.0\nretry_refill_per_sec = 0.0",
    ))
    .await?;
    proxy
        .set_mode(Respond::clickhouse_modern(
            745,
            "SERVER_OVERLOADED",
            "overloaded",
        ))
        .await?;

    // The only token pays for one retry, then the budget is spent.
    let r = gw.query("acme", json!({"sql": "SELECT 1"})).await?;
    r.check_error_body()?;
    ensure!(r.status == 503, "status {} {}", r.status, r.body);
    ensure!(proxy.requests_seen() == 2, "seen {}", proxy.requests_seen());
    ensure!(
        r.body["attempts"] == 2 && r.body["retryable"] == true,
        "{}",
        r.body
    );

    // Next failure: answered at once, and ClickHouse never sees a retry.
    let r = gw.query("acme", json!({"sql": "SELECT 1"})).await?;
    r.check_error_body()?;
    ensure!(r.status == 503, "status {} {}", r.status, r.body);
    ensure!(r.header("retry-after").is_some(), "no Retry-After");
    ensure!(
        r.body["class"] == "unavailable" && r.body["code"] == 745,
        "{}",
        r.body
    );
    ensure!(r.error().contains("retry budget"), "{}", r.error());
    ensure!(
        r.elapsed < Duration::from_millis(500),
        "took {:?}",
        r.elapsed
    );
    ensure!(proxy.requests_seen() == 3, "seen {}", proxy.requests_seen());
    Ok(())
}

#[tokio::test]
async fn with_no_budget_the_first_failure_is_the_answer() -> Result<()> {
    let Some(ch) = clickhouse("query_budget_zero").await? else {
        return Ok(());
    };
    let proxy = FaultProxy::start(ch.http_addr()).await?;
    let gw = Gateway::start(&config(&proxy.url(), "retry_budget = 0.0")).await?;
    proxy.set_mode(Respond::status_only(503)).await?;
    let r = gw.query("acme", json!({"sql": "SELECT 1"})).await?;
    r.check_error_body()?;
    ensure!(
        r.status == 503 && r.body["code"].is_null(),
        "{} {}",
        r.status,
        r.body
    );
    ensure!(r.header("retry-after").is_some());
    ensure!(
        proxy.requests_seen() == 1,
        "no kill, no retry: seen {}",
        proxy.requests_seen()
    );
    Ok(())
}

#[tokio::test]
async fn clickhouse_stopped_is_503_retryable_and_recovers() -> Result<()> {
    let Some(mut ch) = clickhouse("query_clickhouse_stopped").await? else {
        return Ok(());
    };
    let gw = Gateway::start(&config(&ch.http_url(), "max_attempts = 3")).await?;
    ensure!(gw.query("acme", json!({"sql": "SELECT 1"})).await?.status == 200);

    ch.stop().await?;
    let r = gw.query("acme", json!({"sql": "SELECT 1"})).await?;
    r.check_error_body()?;
    ensure!(r.status == 503, "status {} {}", r.status, r.body);
    ensure!(
        r.body["retryable"] == true && r.body["class"] == "unavailable",
        "{}",
        r.body
    );
    ensure!(r.body["attempts"] == 3, "{}", r.body);
    ensure!(
        r.header("retry-after") == Some("5"),
        "{:?}",
        r.header("retry-after")
    );

    ch.start_again().await?;
    let r = gw.query("acme", json!({"sql": "SELECT 1 AS one"})).await?;
    ensure!(r.status == 200, "status {} {}", r.status, r.body);
    Ok(())
}

// === error mapping ===

#[tokio::test]
async fn clickhouse_errors_map_to_statuses() -> Result<()> {
    let Some(ch) = clickhouse("query_error_mapping").await? else {
        return Ok(());
    };
    ch.exec("CREATE TABLE t (x UInt64) ENGINE = MergeTree ORDER BY x")
        .await?;
    ch.exec("INSERT INTO t VALUES (1), (2)").await?;
    let gw = Gateway::start(&config(&ch.http_url(), "")).await?;

    let ok = gw
        .query("acme", json!({"sql": "SELECT x FROM t ORDER BY x"}))
        .await?;
    ensure!(ok.status == 200, "{} {}", ok.status, ok.body);
    ensure!(ok.body["rows"] == 2, "{}", ok.body);
    ensure!(ok
        .header("content-type")
        .is_some_and(|c| c.starts_with("application/json")));

    let cases: &[(&str, u16, Option<u64>)] = &[
        ("SELECT * FROM nope", 404, Some(60)),
        ("SELECT * FROM nodb.t", 404, Some(81)),
        ("SELECT nocol FROM t", 404, Some(47)),
        ("SELECT FROM WHERE", 400, Some(62)),
        ("SELECT nofunc(1)", 400, Some(46)),
        ("SELECT 1; SELECT 2", 400, None),
        ("SELECT 1 SETTINGS max_execution_time = 3600", 400, None),
        ("SELECT 1 FORMAT TSV", 400, None),
    ];
    for (sql, status, code) in cases {
        let r = gw.query("acme", json!({ "sql": sql })).await?;
        r.check_error_body()?;
        ensure!(r.status == *status, "{sql}: {} {}", r.status, r.body);
        ensure!(r.body["code"] == json!(code), "{sql}: {}", r.body);
        ensure!(
            r.body["class"] == "rejected" && r.body["retryable"] == false,
            "{sql}: {}",
            r.body
        );
        ensure!(r.header("retry-after").is_none(), "{sql}");
    }
    // Query parameters: 18.16 has none; the answer says so instead of "unknown setting".
    let r = gw
        .query(
            "acme",
            json!({"sql": "SELECT {x:UInt8} AS x", "params": {"x": 7}}),
        )
        .await?;
    if ch.version().await?.starts_with("18.") {
        ensure!(
            r.status == 400 && r.error().contains("query parameters"),
            "{}",
            r.body
        );
    } else {
        ensure!(
            r.status == 200 && r.body["data"] == json!([{"x": 7}]),
            "{}",
            r.body
        );
    }
    Ok(())
}

#[tokio::test]
async fn writes_are_refused_and_nothing_is_written() -> Result<()> {
    let Some(ch) = clickhouse("query_writes_refused").await? else {
        return Ok(());
    };
    ch.exec("CREATE TABLE w (x UInt64) ENGINE = MergeTree ORDER BY x")
        .await?;
    ch.exec("INSERT INTO w VALUES (1)").await?;
    let proxy = FaultProxy::start(ch.http_addr()).await?;
    let gw = Gateway::start(&config(&proxy.url(), "")).await?;

    for sql in [
        "INSERT INTO w VALUES (2)",
        "insert into w select number from numbers(10)",
        "ALTER TABLE w DELETE WHERE 1",
        "DROP TABLE w",
        "/* looks harmless */ TRUNCATE TABLE w",
        "CREATE TABLE x (a UInt8) ENGINE = Memory",
    ] {
        let r = gw.query("acme", json!({ "sql": sql })).await?;
        r.check_error_body()?;
        ensure!(r.status == 403, "{sql}: {} {}", r.status, r.body);
        ensure!(r.error().contains("read-only"), "{sql}: {}", r.error());
        ensure!(
            r.body["class"] == "denied" && r.body["retryable"] == false,
            "{}",
            r.body
        );
    }
    ensure!(proxy.requests_seen() == 0, "refused before sending");
    ensure!(ch.count("w").await? == 1, "rows changed");
    ensure!(
        ch.count("SELECT count() FROM system.tables WHERE name = 'x'")
            .await?
            == 0
    );

    // Were a write to slip through, ClickHouse's readonly answer (code 164, which the
    // ingest path waits out as Unavailable) is a 403 here, never retried.
    proxy
        .set_mode(Respond::clickhouse_old(
            164,
            "Cannot insert into table in readonly mode",
        ))
        .await?;
    let r = gw.query("acme", json!({"sql": "SELECT 1"})).await?;
    r.check_error_body()?;
    ensure!(
        r.status == 403 && r.body["code"] == 164,
        "{} {}",
        r.status,
        r.body
    );
    ensure!(
        r.body["retryable"] == false && r.error().contains("read-only"),
        "{}",
        r.body
    );
    ensure!(
        proxy.requests_seen() == 1,
        "not retried: {}",
        proxy.requests_seen()
    );
    Ok(())
}

#[tokio::test]
async fn a_wrong_password_is_403_denied() -> Result<()> {
    let Some(ch) = clickhouse("query_wrong_password").await? else {
        return Ok(());
    };
    let gw = Gateway::start_with(&config(&ch.http_url(), ""), &[("QUERY_PW", "not-it")]).await?;
    let r = gw.query("acme", json!({"sql": "SELECT 1"})).await?;
    r.check_error_body()?;
    ensure!(r.status == 403, "{} {}", r.status, r.body);
    let (wrong_password, _) = ch.flavor().refused_login_codes();
    ensure!(
        r.body["class"] == "denied" && r.body["code"] == wrong_password,
        "{}",
        r.body
    );
    ensure!(
        r.body["retryable"] == false && r.body["attempts"] == 1,
        "{}",
        r.body
    );
    Ok(())
}

// === isolation ===

#[tokio::test]
async fn over_the_tenant_or_gateway_limit_is_429_not_a_queue() -> Result<()> {
    let Some(ch) = clickhouse("query_limits").await? else {
        return Ok(());
    };
    let gw = Arc::new(
        Gateway::start(&config(
            &ch.http_url(),
            "concurrency = 2\ntenant_concurrency = 1",
        ))
        .await?,
    );

    // acme's one slot: a scan ClickHouse stops after 2 s.
    let slow = {
        let gw = gw.clone();
        tokio::spawn(async move {
            gw.query("acme", json!({"sql": HEAVY, "timeout_ms": 3000}))
                .await
        })
    };
    wait_until(
        "the slow query to run on ClickHouse",
        Duration::from_secs(5),
        Duration::from_millis(10),
        || async {
            matches!(
                ch.count("SELECT count() FROM system.processes WHERE query LIKE '%sipHash64%' AND query NOT LIKE '%system.processes%'").await,
                Ok(1)
            )
        },
    )
    .await?;

    let r = gw.query("acme", json!({"sql": "SELECT 1"})).await?;
    r.check_error_body()?;
    ensure!(r.status == 429, "{} {}", r.status, r.body);
    ensure!(r.header("retry-after") == Some("1"));
    ensure!(
        r.body["retryable"] == true && r.error().contains("acme"),
        "{}",
        r.body
    );
    ensure!(
        r.elapsed < Duration::from_millis(500),
        "answered at once: {:?}",
        r.elapsed
    );

    // Another tenant still gets through; with both gateway slots taken, a third
    // tenant is turned away by the workload-class limit.
    let globex = {
        let gw = gw.clone();
        tokio::spawn(async move {
            gw.query("globex", json!({"sql": HEAVY, "timeout_ms": 3000}))
                .await
        })
    };
    wait_until(
        "both slow queries to run",
        Duration::from_secs(5),
        Duration::from_millis(10),
        || async {
            matches!(
                ch.count("SELECT count() FROM system.processes WHERE query LIKE '%sipHash64%' AND query NOT LIKE '%system.processes%'").await,
                Ok(2)
            )
        },
    )
    .await?;
    let r = gw.query("initech", json!({"sql": "SELECT 1"})).await?;
    ensure!(r.status == 429, "{} {}", r.status, r.body);
    ensure!(r.error().contains("concurrency"), "{}", r.error());

    let slow = slow.await??;
    ensure!(slow.status == 504, "{} {}", slow.status, slow.body);
    let globex = globex.await??;
    ensure!(globex.status == 504, "{} {}", globex.status, globex.body);
    // Slots are back.
    let r = gw.query("acme", json!({"sql": "SELECT 1"})).await?;
    ensure!(r.status == 200, "{} {}", r.status, r.body);
    Ok(())
}

// === result caps ===

#[tokio::test]
async fn results_over_the_cap_are_a_clear_error() -> Result<()> {
    let Some(ch) = clickhouse("query_result_cap").await? else {
        return Ok(());
    };
    let gw = Gateway::start(&config(
        &ch.http_url(),
        "max_result_rows = 1000\nmax_result_bytes = \"4KiB\"",
    ))
    .await?;

    // ClickHouse's own limit (rows, in-memory bytes) arrives as an error status.
    let r = gw
        .query("acme", json!({"sql": "SELECT number FROM numbers(5000)"}))
        .await?;
    r.check_error_body()?;
    ensure!(
        r.status == 400 && r.body["code"] == 396,
        "{} {}",
        r.status,
        r.body
    );
    ensure!(r.error().contains("LIMIT"), "{}", r.error());

    // 300 UInt64 are 2.4 KB in memory, under ClickHouse's limit, but about 10 KB of
    // JSON: the gateway's own cap catches it before the status goes out.
    let r = gw
        .query("acme", json!({"sql": "SELECT number FROM numbers(300)"}))
        .await?;
    r.check_error_body()?;
    ensure!(
        r.status == 400 && r.body["limit_bytes"] == 4096,
        "{} {}",
        r.status,
        r.body
    );
    ensure!(
        r.error().contains("larger than the gateway relays"),
        "{}",
        r.error()
    );

    let r = gw
        .query("acme", json!({"sql": "SELECT number FROM numbers(10)"}))
        .await?;
    ensure!(
        r.status == 200 && r.body["rows"] == 10,
        "{} {}",
        r.status,
        r.body
    );
    ensure!(r.header(query::RESULT_CAP_HEADER) == Some("4096"));
    Ok(())
}

#[tokio::test]
async fn a_streamed_result_crossing_the_cap_is_cut_off_never_truncated_silently() -> Result<()> {
    let Some(ch) = clickhouse("query_result_stream_cap").await? else {
        return Ok(());
    };
    let gw = Gateway::start(&config(
        &ch.http_url(),
        "max_result_rows = 0\nmax_result_bytes = \"3MiB\"",
    ))
    .await?;
    // 200k UInt64: 1.6 MB in memory (under the cap), about 7 MB of JSON.
    let response = gw
        .client
        .post(format!("{}/v1/query", gw.base))
        .header("x-tenant", "acme")
        .body(json!({"sql": "SELECT number FROM numbers(200000)"}).to_string())
        .send()
        .await?;
    ensure!(response.status() == 200, "{}", response.status());
    ensure!(response
        .headers()
        .get(query::RESULT_CAP_HEADER)
        .is_some_and(|v| v == "3145728"));
    let body = response.bytes().await;
    ensure!(
        body.is_err(),
        "the body must end in an error, not a short JSON"
    );

    // Under the cap, the same path streams a complete result.
    let r = gw
        .query(
            "acme",
            json!({"sql": "SELECT number FROM numbers(60000)", "format": "JSONCompact"}),
        )
        .await?;
    ensure!(r.status == 200 && r.body["rows"] == 60000, "{}", r.status);
    Ok(())
}

// === refusals that need no ClickHouse ===

#[tokio::test]
async fn requests_refused_before_clickhouse() -> Result<()> {
    // Nothing listens on port 9: any request that got that far would be a 503.
    let gw = Gateway::start(&config("http://127.0.0.1:9", "max_timeout = \"30s\"")).await?;
    let q = |body: &str| gw.post_raw(&[("x-tenant", "acme")], body.to_string());

    for (body, needle) in [
        ("not json", "JSON object"),
        (r#"{"sql": ""}"#, "sql is empty"),
        (r#"{"sql": "   -- nothing"}"#, "sql is empty"),
        (
            r#"{"sql": "SELECT 1", "timeout_ms": 30001}"#,
            "maximum of 30000 ms",
        ),
        (r#"{"sql": "SELECT 1", "timeot_ms": 5}"#, "timeot_ms"),
        (
            r#"{"sql": "SELECT 1", "params": {"a b": 1}}"#,
            "not an identifier",
        ),
        (r#"{"sql": "SELECT 1", "format": "CSV"}"#, "JSONCompact"),
    ] {
        let r = q(body).await?;
        r.check_error_body()?;
        ensure!(r.status == 400, "{body}: {} {}", r.status, r.body);
        ensure!(r.error().contains(needle), "{body}: {}", r.error());
    }

    let r = gw.post_raw(&[], r#"{"sql": "SELECT 1"}"#.into()).await?;
    ensure!(
        r.status == 400 && r.error().contains("X-Tenant"),
        "{} {}",
        r.status,
        r.body
    );
    let r = gw
        .post_raw(&[("x-tenant", "acme'--")], r#"{"sql": "SELECT 1"}"#.into())
        .await?;
    ensure!(r.status == 400, "{} {}", r.status, r.body);
    let r = gw
        .post_raw(&[("x-tenant", "umbrella")], r#"{"sql": "SELECT 1"}"#.into())
        .await?;
    ensure!(
        r.status == 404 && r.body["class"] == "rejected",
        "{} {}",
        r.status,
        r.body
    );
    Ok(())
}

#[tokio::test]
async fn bearer_tokens_pick_the_tenant() -> Result<()> {
    let text = r#"
[clickhouse.targets.main]
url = "http://127.0.0.1:9"
[tenants.acme]
target = "main"
token_env = "ACME_TOKEN"
[query]
target = "main"
"#;
    let gw = Gateway::start_with(text, &[("ACME_TOKEN", "t-acme")]).await?;
    let body = r#"{"sql": "DROP TABLE t"}"#.to_string();
    let r = gw.post_raw(&[], body.clone()).await?;
    r.check_error_body()?;
    ensure!(
        r.status == 401 && r.header("www-authenticate") == Some("Bearer"),
        "{}",
        r.status
    );
    let r = gw
        .post_raw(
            &[("authorization", "Bearer nope"), ("x-tenant", "acme")],
            body.clone(),
        )
        .await?;
    ensure!(
        r.status == 403 && r.body["class"] == "denied",
        "{} {}",
        r.status,
        r.body
    );
    let r = gw
        .post_raw(&[("authorization", "Bearer t-acme")], body)
        .await?;
    ensure!(
        r.status == 403 && r.error().contains("read-only"),
        "authenticated, then refused as a write: {} {}",
        r.status,
        r.body
    );
    Ok(())
}

#[tokio::test]
async fn without_a_query_section_the_gateway_says_it_is_off() -> Result<()> {
    let gw = Gateway::start("[api]\nauth = \"none\"\n").await?;
    let r = gw.query("acme", json!({"sql": "SELECT 1"})).await?;
    r.check_error_body()?;
    ensure!(
        r.status == 404 && r.error().contains("gateway is off"),
        "{} {}",
        r.status,
        r.body
    );
    Ok(())
}
