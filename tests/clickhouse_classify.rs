//! The insert client against a real ClickHouse (Debian's 18.16) and the fault proxy:
//! every failure an operator can meet comes back with the class the contract gives it (docs/architecture.md),
//! read from a real answer (status, `X-ClickHouse-Exception-Code`, body), and the
//! settings an insert pins are the ones the server knows.
//!
//! What is checked is what reaches the actors (`ClickHouseError`), the rows in ClickHouse,
//! and the requests the proxy saw.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use sluice::clickhouse::insert::HttpInserter;
use sluice::clickhouse::redelivery::{Pace, Paces, Redelivery};
use sluice::config::{Secret, TargetConfig};
use sluice_actors::{Class, ClickHouseError, InsertRequest, Inserter, NoAnswer, TableKey};
use sluice_harness::{
    available, clickhouse, free_port, ClickHouseServer, FaultProxy, Mode, RequestRecord, Respond,
    Rule, INGEST_PASSWORD, INGEST_USER,
};

/// A generous bound on how long any single insert here may take when nothing stalls.
const INSERT_TIMEOUT: Duration = Duration::from_secs(10);

/// ClickHouse for a test, or `None` (with a notice) when it is not installed.
async fn clickhouse_or_skip(test: &str) -> Result<Option<ClickHouseServer>> {
    if available(test, clickhouse::binary())?.is_none() {
        return Ok(None);
    }
    Ok(Some(ClickHouseServer::start().await?))
}

/// A target as `[clickhouse.targets.main]` would give it.
fn target(url: &str, user: &str, password: Option<&str>, insert_timeout: Duration) -> TargetConfig {
    TargetConfig {
        name: "main".into(),
        shards: vec![vec![url.into()]],
        user: user.into(),
        password: password.map(Secret::new),
        database: "default".into(),
        insert_timeout,
        connect_timeout: Duration::from_secs(1),
        insert_concurrency: 2,
        pool_idle_timeout: Duration::from_secs(2),
    }
}

fn inserter(url: &str, user: &str, password: Option<&str>) -> Result<HttpInserter> {
    client(&target(url, user, password, INSERT_TIMEOUT))
}

/// The insert client of `target`, its tables' windows held against Sluice's defaults.
fn client(target: &TargetConfig) -> Result<HttpInserter> {
    let redelivery = Redelivery {
        ack_wait: Duration::from_secs(60),
        reform_wait: Duration::from_secs(1),
        backoff_max: Duration::from_secs(30),
        insert_timeout: target.insert_timeout,
        paces: Paces::uniform(Pace {
            batch_age: Duration::from_secs(1),
            batch_rows: 10_000,
        }),
    };
    let url = target.urls().next().unwrap_or_default().to_owned();
    HttpInserter::new(target, &url, &target.name, redelivery)
}

/// One insert request for `table`, the rows as NDJSON.
fn request(table: &str, rows: &[&str], skip_unknown_fields: bool) -> InsertRequest {
    let mut body = String::new();
    for row in rows {
        body.push_str(row);
        body.push('\n');
    }
    InsertRequest {
        table: TableKey::new("acme", table),
        body: Bytes::from(body),
        rows: rows.len(),
        skip_unknown_fields,
        dedup_token: None,
    }
}

/// The insert's error, or a failure saying it unexpectedly succeeded.
async fn insert_err(inserter: &HttpInserter, request: InsertRequest) -> Result<ClickHouseError> {
    match inserter.insert(request).await {
        Ok(()) => bail!("the insert succeeded, a failure was expected"),
        Err(e) => {
            // Shown with --no-capture: what the real server answered.
            eprintln!("insert failed: {e:?}");
            Ok(e)
        }
    }
}

async fn events_table(ch: &ClickHouseServer) -> Result<()> {
    ch.exec("CREATE TABLE events (id UInt64, name String) ENGINE = MergeTree ORDER BY id")
        .await?;
    Ok(())
}

/// The INSERT requests the proxy saw (feature detection and probes left out).
fn inserts(proxy: &FaultProxy) -> Vec<RequestRecord> {
    proxy
        .requests()
        .into_iter()
        .filter(|r| {
            r.query_param("query")
                .is_some_and(|q| q.trim_start().starts_with("INSERT"))
        })
        .collect()
}

#[tokio::test]
async fn a_bad_value_is_rejected_and_good_rows_land() -> Result<()> {
    let Some(ch) = clickhouse_or_skip("a_bad_value_is_rejected_and_good_rows_land").await? else {
        return Ok(());
    };
    events_table(&ch).await?;
    let inserter = inserter(&ch.http_url(), INGEST_USER, Some(INGEST_PASSWORD))?;

    let error = insert_err(
        &inserter,
        request("events", &[r#"{"id": "not a number", "name": "a"}"#], false),
    )
    .await?;
    assert_eq!(error.class, Class::Rejected, "{error:?}");
    assert!(
        matches!(error.code, Some(26 | 27 | 6 | 72)),
        "a value that does not parse: {error:?}"
    );
    assert!(!error.table_scoped && !error.splittable, "{error:?}");
    assert!(
        error.message.len() <= 4096,
        "the body is capped: {}",
        error.message.len()
    );

    inserter
        .insert(request("events", &[r#"{"id": 1, "name": "a"}"#], false))
        .await
        .context("a good row")?;
    assert_eq!(
        ch.count("events").await?,
        1,
        "the good row landed, the bad one did not"
    );
    Ok(())
}

#[tokio::test]
async fn an_unknown_table_is_rejected() -> Result<()> {
    let Some(ch) = clickhouse_or_skip("an_unknown_table_is_rejected").await? else {
        return Ok(());
    };
    let inserter = inserter(&ch.http_url(), INGEST_USER, Some(INGEST_PASSWORD))?;
    let error = insert_err(
        &inserter,
        request("no_such_table", &[r#"{"id": 1}"#], false),
    )
    .await?;
    assert_eq!(error.class, Class::Rejected, "{error:?}");
    assert_eq!(error.code, Some(60), "{error:?}");
    assert!(!error.table_scoped, "{error:?}");
    Ok(())
}

#[tokio::test]
async fn a_wrong_password_and_an_unknown_user_are_denied() -> Result<()> {
    let Some(ch) = clickhouse_or_skip("a_wrong_password_and_an_unknown_user_are_denied").await?
    else {
        return Ok(());
    };
    events_table(&ch).await?;

    // WRONG_PASSWORD and UNKNOWN_USER on 18.16, AUTHENTICATION_FAILED for both on 26.x.
    let (wrong_code, unknown_code) = ch.flavor().refused_login_codes();
    let wrong_password = inserter(&ch.http_url(), INGEST_USER, Some("not-the-password"))?;
    let error = insert_err(&wrong_password, request("events", &[r#"{"id": 1}"#], false)).await?;
    assert_eq!(error.class, Class::Denied, "{error:?}");
    assert_eq!(error.code, Some(wrong_code), "a wrong password: {error:?}");

    let unknown_user = inserter(&ch.http_url(), "nobody", Some("x"))?;
    let error = insert_err(&unknown_user, request("events", &[r#"{"id": 1}"#], false)).await?;
    assert_eq!(error.class, Class::Denied, "{error:?}");
    assert_eq!(error.code, Some(unknown_code), "an unknown user: {error:?}");

    // The probe (readiness) says the same.
    let error = match wrong_password.probe().await {
        Ok(info) => bail!("the probe succeeded with a wrong password: {info:?}"),
        Err(e) => e,
    };
    assert_eq!(error.class, Class::Denied, "{error:?}");
    assert_eq!(ch.count("events").await?, 0);
    Ok(())
}

#[tokio::test]
async fn a_refused_port_is_unavailable() -> Result<()> {
    // Nothing listens on a port just found free.
    let url = format!("http://127.0.0.1:{}", free_port()?);
    let inserter = inserter(&url, INGEST_USER, Some(INGEST_PASSWORD))?;
    let started = Instant::now();
    let error = insert_err(&inserter, request("events", &[r#"{"id": 1}"#], false)).await?;
    assert_eq!(error.class, Class::Unavailable, "{error:?}");
    assert_eq!(error.code, None, "{error:?}");
    assert_eq!(error.status, None, "no answer, no status: {error:?}");
    assert_eq!(error.no_answer, Some(NoAnswer::Refused), "{error:?}");
    assert!(!error.lost_connection(), "the rows were never sent");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a refusal is immediate: {:?}",
        started.elapsed()
    );
    Ok(())
}

/// Feature detection through the proxy first, so the fault hits the insert itself.
async fn behind_proxy(
    test: &str,
    insert_timeout: Duration,
) -> Result<Option<(ClickHouseServer, FaultProxy, HttpInserter)>> {
    let Some(ch) = clickhouse_or_skip(test).await? else {
        return Ok(None);
    };
    events_table(&ch).await?;
    let proxy = FaultProxy::start(ch.http_addr()).await?;
    let inserter = client(&target(
        &proxy.url(),
        INGEST_USER,
        Some(INGEST_PASSWORD),
        insert_timeout,
    ))?;
    inserter
        .features()
        .await
        .map_err(|e| anyhow::anyhow!("feature detection through the proxy: {e}"))?;
    Ok(Some((ch, proxy, inserter)))
}

#[tokio::test]
async fn a_server_that_never_answers_is_unavailable_after_the_insert_timeout() -> Result<()> {
    let timeout = Duration::from_secs(2);
    let Some((ch, proxy, inserter)) = behind_proxy(
        "a_server_that_never_answers_is_unavailable_after_the_insert_timeout",
        timeout,
    )
    .await?
    else {
        return Ok(());
    };
    proxy.set_mode(Mode::Stall).await?;
    let started = Instant::now();
    let error = insert_err(&inserter, request("events", &[r#"{"id": 1}"#], false)).await?;
    let took = started.elapsed();
    assert_eq!(error.class, Class::Unavailable, "{error:?}");
    assert_eq!(error.code, None, "{error:?}");
    assert_eq!(error.no_answer, Some(NoAnswer::TimedOut), "{error:?}");
    assert!(!error.lost_connection(), "a frozen server is not a crash");
    assert!(
        took >= timeout,
        "gave up before the insert timeout: {took:?}"
    );
    assert!(
        took < timeout + Duration::from_secs(3),
        "gave up long after the insert timeout ({timeout:?}): {took:?}"
    );
    let stalled = inserts(&proxy);
    assert_eq!(stalled.len(), 1, "one insert request: {stalled:?}");
    assert_eq!(stalled[0].action, "stall");
    proxy.set_mode(Mode::PassThrough).await?;
    assert_eq!(ch.count("events").await?, 0);
    Ok(())
}

/// An insert that got no answer once it went out (timed out) may still run on its
/// server: it is killed there (`KILL QUERY` with its `query_id`, where the server still
/// answers) before the failure is reported, so a retry on another replica of the shard
/// does not run beside it.
#[tokio::test]
async fn an_insert_that_timed_out_is_killed_on_its_server_before_the_failure_is_reported(
) -> Result<()> {
    let Some((_ch, proxy, inserter)) = behind_proxy(
        "an_insert_that_timed_out_is_killed_on_its_server_before_the_failure_is_reported",
        Duration::from_secs(2),
    )
    .await?
    else {
        return Ok(());
    };
    // Only the INSERT stalls: the server still answers anything else.
    proxy.add_rule(Rule::query_contains("INSERT", Mode::Stall));
    let error = insert_err(&inserter, request("events", &[r#"{"id": 1}"#], false)).await?;
    assert_eq!(error.class, Class::Unavailable, "{error:?}");
    let stalled = inserts(&proxy);
    assert_eq!(stalled.len(), 1, "{stalled:?}");
    let query_id = stalled[0]
        .query_param("query_id")
        .expect("every insert carries a query_id");
    let kills: Vec<RequestRecord> = proxy
        .requests()
        .into_iter()
        .filter(|r| r.sql_text().contains("KILL QUERY"))
        .collect();
    assert_eq!(kills.len(), 1, "{kills:?}");
    assert!(
        kills[0]
            .sql_text()
            .contains(&format!("query_id = '{query_id}'")),
        "{kills:?}"
    );
    assert_eq!(kills[0].action, "pass", "it reached the server: {kills:?}");
    assert!(kills[0].seq > stalled[0].seq);
    proxy.clear_rules();
    // A refused connection carried no insert: nothing to kill.
    proxy.clear_requests();
    proxy.set_mode(Mode::Refuse).await?;
    let refused = insert_err(&inserter, request("events", &[r#"{"id": 2}"#], false)).await?;
    assert_eq!(refused.class, Class::Unavailable, "{refused:?}");
    assert!(
        !proxy
            .requests()
            .iter()
            .any(|r| r.sql_text().contains("KILL QUERY")),
        "{:?}",
        proxy.requests()
    );
    Ok(())
}

#[tokio::test]
async fn a_codeless_503_from_a_proxy_is_unavailable() -> Result<()> {
    let Some((_ch, proxy, inserter)) =
        behind_proxy("a_codeless_503_from_a_proxy_is_unavailable", INSERT_TIMEOUT).await?
    else {
        return Ok(());
    };
    proxy.set_mode(Respond::status_only(503)).await?;
    let error = insert_err(&inserter, request("events", &[r#"{"id": 1}"#], false)).await?;
    assert_eq!(error.class, Class::Unavailable, "{error:?}");
    assert_eq!(error.code, None, "{error:?}");
    assert_eq!(error.status, Some(503), "{error:?}");

    // The same answer with a page in the body (a load balancer's) is still codeless.
    proxy
        .set_mode(Respond::new(503).body("<html><body>No server is available</body></html>"))
        .await?;
    let error = insert_err(&inserter, request("events", &[r#"{"id": 1}"#], false)).await?;
    assert_eq!(error.class, Class::Unavailable, "{error:?}");
    assert_eq!(error.code, None, "{error:?}");
    Ok(())
}

#[tokio::test]
async fn the_modern_exception_header_is_read_first() -> Result<()> {
    let Some((_ch, proxy, inserter)) =
        behind_proxy("the_modern_exception_header_is_read_first", INSERT_TIMEOUT).await?
    else {
        return Ok(());
    };
    // A current server's overload answer.
    proxy
        .set_mode(Respond::clickhouse_modern(
            745,
            "SERVER_OVERLOADED",
            "(CPU) overloaded",
        ))
        .await?;
    let error = insert_err(&inserter, request("events", &[r#"{"id": 1}"#], false)).await?;
    assert_eq!(error.class, Class::Unavailable, "{error:?}");
    assert_eq!(error.code, Some(745), "{error:?}");
    assert!(error.message.contains("SERVER_OVERLOADED"), "{error:?}");

    // The header alone carries the code.
    proxy
        .set_mode(
            Respond::new(500)
                .header("X-ClickHouse-Exception-Code", "745")
                .body("the server is overloaded"),
        )
        .await?;
    let error = insert_err(&inserter, request("events", &[r#"{"id": 1}"#], false)).await?;
    assert_eq!(
        (error.class, error.code),
        (Class::Unavailable, Some(745)),
        "{error:?}"
    );

    // The header wins over a body that says otherwise.
    proxy
        .set_mode(
            Respond::new(500)
                .header("X-ClickHouse-Exception-Code", "745")
                .body("Code: 60. DB::Exception: Table default.events doesn't exist"),
        )
        .await?;
    let error = insert_err(&inserter, request("events", &[r#"{"id": 1}"#], false)).await?;
    assert_eq!(
        (error.class, error.code),
        (Class::Unavailable, Some(745)),
        "{error:?}"
    );

    // A modern 252 (too many parts): table-scoped and splittable.
    proxy
        .set_mode(Respond::clickhouse_modern(
            252,
            "TOO_MANY_PARTS",
            "Too many parts (300)",
        ))
        .await?;
    let error = insert_err(&inserter, request("events", &[r#"{"id": 1}"#], false)).await?;
    assert_eq!(error.class, Class::Unavailable, "{error:?}");
    assert!(error.table_scoped && error.splittable, "{error:?}");
    Ok(())
}

/// 18.16 is not sent `async_insert` (it would refuse it); the current engine, which
/// turns it on by default, is sent `async_insert=0`.
#[tokio::test]
async fn an_old_server_is_not_sent_async_insert() -> Result<()> {
    let Some((ch, proxy, inserter)) =
        behind_proxy("an_old_server_is_not_sent_async_insert", INSERT_TIMEOUT).await?
    else {
        return Ok(());
    };
    let asked = proxy
        .requests()
        .iter()
        .any(|r| r.sql_text().contains("system.settings"));
    assert!(
        asked,
        "the server was asked what it supports: {:?}",
        proxy.requests()
    );

    inserter
        .insert(request("events", &[r#"{"id": 1, "name": "a"}"#], false))
        .await
        .context("a good row against 18.16")?;
    assert_eq!(ch.count("events").await?, 1);
    let sent = inserts(&proxy);
    assert_eq!(sent.len(), 1, "{sent:?}");
    let pinned = ch.flavor().knows_current_settings().then(|| "0".to_owned());
    assert_eq!(
        sent[0].query_param("async_insert"),
        pinned,
        "async_insert=0 where the server knows it (18.16 would refuse it): {}",
        sent[0].uri
    );
    assert!(sent[0].query_param("query_id").is_some(), "{}", sent[0].uri);
    assert_eq!(
        sent[0]
            .query_param("input_format_skip_unknown_fields")
            .as_deref(),
        Some("0"),
        "18.16 knows the setting: the strict default is sent, not left to the profile: {}",
        sent[0].uri
    );
    Ok(())
}

/// A proxy in front of `ch` that answers as a current server: the feature questions
/// (every setting Sluice looks for is known, version 24.8), and every insert itself,
/// which pins `async_insert=0` there (18.16 behind it would refuse the settings it
/// does not know).
async fn current_server_proxy(ch: &ClickHouseServer) -> Result<FaultProxy> {
    let proxy = FaultProxy::start(ch.http_addr()).await?;
    proxy.add_rule(Rule::contains(
        "system.settings",
        Respond::ok(
            "async_insert\ndate_time_input_format\ninput_format_skip_unknown_fields\ninsert_deduplication_token\ninsert_deduplicate\ndeduplicate_blocks_in_dependent_materialized_views\n",
        ),
    ));
    proxy.add_rule(Rule::contains("version()", Respond::ok("24.8.1.1\n")));
    proxy.add_rule(Rule::query_contains("async_insert=0", Respond::ok("")));
    Ok(proxy)
}

/// A recorded batch (exactly-once) carries its deduplication token only where the
/// server knows the setting: 18.16 would refuse it (`Code: 115`), and deduplicates a
/// Replicated table by the block's hash alone. The same for
/// `deduplicate_blocks_in_dependent_materialized_views=1` (a retry reaches the views).
/// `insert_deduplicate` goes everywhere: 1 for a recorded batch, 0 for any other.
#[tokio::test]
async fn a_recorded_batch_carries_its_token_only_where_the_server_knows_it() -> Result<()> {
    let Some((ch, proxy, old)) = behind_proxy(
        "a_recorded_batch_carries_its_token_only_where_the_server_knows_it",
        INSERT_TIMEOUT,
    )
    .await?
    else {
        return Ok(());
    };
    let recorded = |id: u64| {
        let mut r = request(
            "events",
            &[&format!(r#"{{"id": {id}, "name": "a"}}"#)],
            false,
        );
        r.dedup_token = Some(format!("{id}-{id}-5f3a"));
        r
    };
    old.insert(recorded(1))
        .await
        .context("a recorded batch against 18.16")?;
    assert_eq!(ch.count("events").await?, 1);
    let sent = inserts(&proxy);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(
        sent[0].query_param("insert_deduplicate").as_deref(),
        Some("1"),
        "{}",
        sent[0].uri
    );
    // 18.16 does not know these and would refuse the insert; the current engine
    // does, and is sent them.
    let knows = ch.flavor().knows_current_settings();
    for (name, value) in [
        ("insert_deduplication_token", "1-1-5f3a"),
        ("deduplicate_blocks_in_dependent_materialized_views", "1"),
        ("deduplicate_insert", "enable"),
    ] {
        assert_eq!(
            sent[0].query_param(name),
            knows.then(|| value.to_owned()),
            "{name}: {}",
            sent[0].uri
        );
    }

    // The same through a proxy that answers the feature questions as a current server.
    let modern = current_server_proxy(&ch).await?;
    let current = inserter(&modern.url(), INGEST_USER, Some(INGEST_PASSWORD))?;
    current
        .insert(recorded(2))
        .await
        .context("a recorded batch against a current server")?;
    let sent = inserts(&modern);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(
        sent[0].query_param("insert_deduplication_token").as_deref(),
        Some("2-2-5f3a"),
        "{}",
        sent[0].uri
    );
    assert_eq!(
        sent[0].query_param("insert_deduplicate").as_deref(),
        Some("1"),
        "{}",
        sent[0].uri
    );
    assert_eq!(
        sent[0]
            .query_param("deduplicate_blocks_in_dependent_materialized_views")
            .as_deref(),
        Some("1"),
        "{}",
        sent[0].uri
    );
    assert!(
        sent[0].action.starts_with("rule"),
        "the canned answer took it: {}",
        sent[0].action
    );
    // A batch that is not recorded is not deduplicated: no token, insert_deduplicate=0.
    current
        .insert(request("events", &[r#"{"id": 3, "name": "a"}"#], false))
        .await
        .context("a plain insert against a current server")?;
    let plain = inserts(&modern);
    let plain = plain.last().context("no second insert")?;
    assert_eq!(
        plain.query_param("insert_deduplicate").as_deref(),
        Some("0"),
        "{}",
        plain.uri
    );
    assert_eq!(
        plain.query_param("insert_deduplication_token"),
        None,
        "{}",
        plain.uri
    );
    Ok(())
}

#[tokio::test]
async fn a_modern_server_is_sent_async_insert_0() -> Result<()> {
    let Some(ch) = clickhouse_or_skip("a_modern_server_is_sent_async_insert_0").await? else {
        return Ok(());
    };
    events_table(&ch).await?;
    let proxy = current_server_proxy(&ch).await?;
    let inserter = inserter(&proxy.url(), INGEST_USER, Some(INGEST_PASSWORD))?;

    inserter
        .insert(request("events", &[r#"{"id": 1, "name": "a"}"#], false))
        .await
        .context("an insert to a modern server")?;
    let features = inserter
        .features()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    assert_eq!(features.version, "24.8.1.1");
    assert!(features.async_insert, "{features:?}");

    let sent = inserts(&proxy);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(
        sent[0].query_param("async_insert").as_deref(),
        Some("0"),
        "{}",
        sent[0].uri
    );
    assert_eq!(
        sent[0].query_param("date_time_input_format").as_deref(),
        Some("best_effort"),
        "{}",
        sent[0].uri
    );
    assert_eq!(
        sent[0]
            .query_param("input_format_skip_unknown_fields")
            .as_deref(),
        Some("0"),
        "a current server defaults it to 1: {}",
        sent[0].uri
    );
    assert!(
        sent[0].action.starts_with("rule"),
        "the canned answer took it: {}",
        sent[0].action
    );
    Ok(())
}

#[tokio::test]
async fn unknown_fields_are_rejected_unless_the_table_skips_them() -> Result<()> {
    let Some((ch, proxy, inserter)) = behind_proxy(
        "unknown_fields_are_rejected_unless_the_table_skips_them",
        INSERT_TIMEOUT,
    )
    .await?
    else {
        return Ok(());
    };
    let row = r#"{"id": 1, "name": "a", "added_later": "x"}"#;

    let error = insert_err(&inserter, request("events", &[row], false)).await?;
    assert_eq!(error.class, Class::Rejected, "{error:?}");
    assert_eq!(
        error.code,
        Some(117),
        "INCORRECT_DATA (unknown field): {error:?}"
    );
    assert_eq!(ch.count("events").await?, 0);

    inserter
        .insert(request("events", &[row], true))
        .await
        .context("the same row with skip_unknown_fields")?;
    assert_eq!(ch.count("events").await?, 1);
    assert_eq!(ch.exec("SELECT id, name FROM events").await?.trim(), "1\ta");

    let sent = inserts(&proxy);
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(
        sent[0]
            .query_param("input_format_skip_unknown_fields")
            .as_deref(),
        Some("0")
    );
    assert_eq!(
        sent[1]
            .query_param("input_format_skip_unknown_fields")
            .as_deref(),
        Some("1")
    );
    Ok(())
}

/// A server whose profile skips unknown fields (current releases default
/// `input_format_skip_unknown_fields` to 1; here an 18.16 profile does): a row with a
/// field the table lacks is still rejected (117) for a table that did not opt in, and
/// lands without that field for one that did.
#[tokio::test]
async fn unknown_fields_are_rejected_even_where_the_profile_skips_them() -> Result<()> {
    let Some(ch) =
        clickhouse_or_skip("unknown_fields_are_rejected_even_where_the_profile_skips_them").await?
    else {
        return Ok(());
    };
    events_table(&ch).await?;
    let (user, password) = (clickhouse::SKIPPING_USER, clickhouse::SKIPPING_PASSWORD);
    // The premise: this user's inserts drop unknown fields unless told otherwise.
    let setting = ch
        .exec_as(
            user,
            password,
            "SELECT value FROM system.settings WHERE name = 'input_format_skip_unknown_fields'",
        )
        .await?;
    assert_eq!(setting.trim(), "1", "the profile's default");
    let row = r#"{"id": 1, "name": "a", "added_later": "x"}"#;
    ch.exec_as(
        user,
        password,
        &format!("INSERT INTO events FORMAT JSONEachRow {row}"),
    )
    .await
    .context("an insert that pins nothing drops the unknown field")?;
    assert_eq!(ch.count("events").await?, 1);
    ch.exec("TRUNCATE TABLE events").await?;

    let inserter = inserter(&ch.http_url(), user, Some(password))?;
    let error = insert_err(&inserter, request("events", &[row], false)).await?;
    assert_eq!(
        (error.class, error.code),
        (Class::Rejected, Some(117)),
        "INCORRECT_DATA (unknown field), not silently dropped: {error:?}"
    );
    assert_eq!(ch.count("events").await?, 0);

    inserter
        .insert(request("events", &[row], true))
        .await
        .context("the same row for a table that skips unknown fields")?;
    assert_eq!(ch.exec("SELECT id, name FROM events").await?.trim(), "1\ta");
    Ok(())
}

/// The overload codes of the Unavailable list, answered through the real insert
/// path as a current server (header) and as 18.16 (body only) answers them: the batch is
/// never a verdict on its rows. 241 (memory) is splittable too: a smaller batch may fit.
#[tokio::test]
async fn overload_answers_are_unavailable_through_the_insert_path() -> Result<()> {
    let Some((ch, proxy, inserter)) = behind_proxy(
        "overload_answers_are_unavailable_through_the_insert_path",
        INSERT_TIMEOUT,
    )
    .await?
    else {
        return Ok(());
    };
    let answers = [
        (
            "202 with the modern header",
            Respond::clickhouse_modern(
                202,
                "TOO_MANY_SIMULTANEOUS_QUERIES",
                "Too many simultaneous queries. Maximum: 100",
            ),
            202,
            false,
        ),
        (
            "202 in an 18.16 body",
            Respond::clickhouse_old(202, "Too many simultaneous queries. Maximum: 100"),
            202,
            false,
        ),
        (
            "241 with the modern header",
            Respond::clickhouse_modern(
                241,
                "MEMORY_LIMIT_EXCEEDED",
                "Memory limit (total) exceeded: would use 9.31 GiB",
            ),
            241,
            true,
        ),
        (
            "241 in an 18.16 body",
            Respond::clickhouse_old(241, "Memory limit (for query) exceeded: would use 9.31 GiB"),
            241,
            true,
        ),
    ];
    for (what, answer, code, splittable) in answers {
        proxy.clear_requests();
        proxy.set_mode(answer).await?;
        let error = insert_err(
            &inserter,
            request("events", &[r#"{"id": 1}"#, r#"{"id": 2}"#], false),
        )
        .await?;
        assert_eq!(
            (error.class, error.code, error.status),
            (Class::Unavailable, Some(code), Some(500)),
            "{what}: {error:?}"
        );
        assert_eq!(error.splittable, splittable, "{what}: {error:?}");
        assert!(!error.table_scoped, "{what}: {error:?}");
        let sent = inserts(&proxy);
        assert_eq!(
            sent.len(),
            1,
            "{what}: one insert, answered by the proxy: {sent:?}"
        );
        assert!(
            sent[0].action.starts_with("respond"),
            "{what}: {}",
            sent[0].action
        );
    }
    proxy.set_mode(Mode::PassThrough).await?;
    assert_eq!(ch.count("events").await?, 0);
    Ok(())
}

#[tokio::test]
async fn a_reset_connection_is_unavailable() -> Result<()> {
    let Some((ch, proxy, inserter)) =
        behind_proxy("a_reset_connection_is_unavailable", INSERT_TIMEOUT).await?
    else {
        return Ok(());
    };
    proxy.set_mode(Mode::Reset).await?;
    let error = insert_err(&inserter, request("events", &[r#"{"id": 1}"#], false)).await?;
    assert_eq!(error.class, Class::Unavailable, "{error:?}");
    assert_eq!((error.code, error.status), (None, None), "{error:?}");
    assert_eq!(error.no_answer, Some(NoAnswer::Lost), "{error:?}");
    assert!(
        error.lost_connection(),
        "what a crash on the rows looks like"
    );
    proxy.set_mode(Mode::PassThrough).await?;
    assert_eq!(ch.count("events").await?, 0);
    Ok(())
}

#[tokio::test]
async fn a_huge_error_body_is_read_to_4_kib_only() -> Result<()> {
    let Some((_ch, proxy, inserter)) =
        behind_proxy("a_huge_error_body_is_read_to_4_kib_only", INSERT_TIMEOUT).await?
    else {
        return Ok(());
    };
    let mut body = String::from(
        "Code: 27, e.displayText() = DB::Exception: Cannot parse input: expected , before: ",
    );
    body.push_str(&"x".repeat(8 << 20));
    proxy.set_mode(Respond::new(500).body(body)).await?;
    let error = insert_err(&inserter, request("events", &[r#"{"id": 1}"#], false)).await?;
    assert_eq!(
        (error.class, error.code),
        (Class::Rejected, Some(27)),
        "{}",
        error.class
    );
    assert!(
        error.message.len() <= 4096,
        "the message holds {} bytes",
        error.message.len()
    );
    Ok(())
}

#[tokio::test]
async fn a_failed_feature_lookup_never_passes_for_a_rejected_row() -> Result<()> {
    let Some(ch) =
        clickhouse_or_skip("a_failed_feature_lookup_never_passes_for_a_rejected_row").await?
    else {
        return Ok(());
    };
    events_table(&ch).await?;
    let proxy = FaultProxy::start(ch.http_addr()).await?;
    // Something in front of ClickHouse (a proxy allowing inserts only, a server hiding
    // its system tables) answers the lookup with an error that would be a verdict on
    // rows if an insert had drawn it. No row was looked at: parking the batch for it
    // would park good rows.
    proxy.add_rule(Rule::contains(
        "system.settings",
        Respond::clickhouse_modern(60, "UNKNOWN_TABLE", "Table system.settings does not exist"),
    ));
    let inserter = inserter(&proxy.url(), INGEST_USER, Some(INGEST_PASSWORD))?;
    let error = insert_err(&inserter, request("events", &[r#"{"id": 1}"#], false)).await?;
    assert_ne!(error.class, Class::Rejected, "{error:?}");
    assert!(error.class.is_outage(), "{error:?}");
    assert!(
        error.message.contains("system.settings"),
        "says what failed: {error:?}"
    );
    assert!(inserts(&proxy).is_empty(), "no insert was sent");

    // Once the lookup answers, inserts go through.
    proxy.clear_rules();
    inserter
        .insert(request("events", &[r#"{"id": 1}"#], false))
        .await
        .context("after the lookup recovered")?;
    assert_eq!(ch.count("events").await?, 1);
    Ok(())
}
