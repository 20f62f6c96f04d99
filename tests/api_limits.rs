//! The ingest API's limits at the door against hostile input, on real servers: what it
//! answers (status, body), what lands in ClickHouse, that ClickHouse stays up, and what
//! one request costs the process (peak RSS) and its metrics.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};
use sluice_harness::{loopback_client, wait_for, Stack, StackOptions, TENANT};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");
const LAND: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(200);

const NDJSON: &str = "application/x-ndjson";
const JSON: &str = "application/json";

async fn stack_with(tables: &[&str], settings: &[(&str, toml::Value)]) -> Result<Stack> {
    let mut stack = Stack::start(StackOptions::default()).await?;
    for table in tables {
        stack
            .clickhouse
            .exec(&format!(
                "CREATE TABLE {table} (id UInt64, s String) ENGINE = MergeTree ORDER BY id"
            ))
            .await?;
    }
    for (key, value) in settings {
        stack.set(key, value.clone());
    }
    stack.start_sluice(SLUICE).await?;
    Ok(stack)
}

/// POST a body as the stack's tenant; the status and the answer as JSON.
async fn post(
    stack: &Stack,
    table: &str,
    content_type: &str,
    body: impl Into<Vec<u8>>,
) -> Result<(u16, Value)> {
    stack
        .ingest_raw(table, content_type, body.into(), &[])
        .await
}

fn n(body: &Value, field: &str) -> u64 {
    body.get(field).and_then(Value::as_u64).unwrap_or(u64::MAX)
}

/// Waits until `sql` counts exactly `n`; fails at once if it counts more.
async fn wait_exactly(stack: &Stack, sql: &str, n: u64) -> Result<()> {
    wait_for(&format!("`{sql}` = {n}"), LAND, POLL, || async move {
        let c = stack.count(sql).await?;
        if c > n {
            return Ok(Err(anyhow::anyhow!("`{sql}` counted {c}, more than {n}")));
        }
        if c == n {
            Ok(Ok(()))
        } else {
            bail!("{c} so far")
        }
    })
    .await?
}

/// A column of `events`-like `table`, its rows in id order, as ClickHouse prints it.
async fn stored(stack: &Stack, column: &str, table: &str) -> Result<String> {
    let sql =
        format!("SELECT groupArray({column}) FROM (SELECT {column} FROM {table} ORDER BY id)");
    Ok(stack.clickhouse.exec(&sql).await?.trim().to_string())
}

/// A row nested `levels` deep in a field the table does not have: the row object is
/// level 1, the rest are arrays around a number.
fn nested(id: u64, levels: usize) -> String {
    let arrays = levels - 1;
    format!(
        "{{\"id\":{id},\"s\":\"deep\",\"x\":{}1{}}}",
        "[".repeat(arrays),
        "]".repeat(arrays)
    )
}

/// Issue 13.1: a row nested 100,000 deep, skipped as an unknown field, crashed
/// ClickHouse 18.16 on every resend. The API refuses it by index in every framing;
/// ClickHouse stays up and every other row lands, one at exactly the limit included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nesting_bomb_is_refused_by_index_and_clickhouse_stays_up() -> Result<()> {
    let mut stack = stack_with(
        &["events"],
        &[(
            &format!("tables.\"{TENANT}.events\".skip_unknown_fields"),
            true.into(),
        )],
    )
    .await?;
    let bomb = nested(3, 100_000);
    let body = format!(
        "{}\n{}\n{bomb}\n{}\n{}\n",
        json!({"id": 1, "s": "a"}),
        json!({"id": 2, "s": "b"}),
        nested(4, 64),
        json!({"id": 5, "s": "c"}),
    );
    let (status, r) = post(&stack, "events", NDJSON, body).await?;
    assert_eq!(status, 400, "{r}");
    assert_eq!((n(&r, "accepted"), n(&r, "rejected")), (4, 1), "{r}");
    assert_eq!(r["errors"][0]["index"], 2, "{r}");
    assert_eq!(r["errors"][0]["line"], 3, "{r}");
    let reason = r["errors"][0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("64 levels") && reason.contains("max_json_depth"),
        "{r}"
    );

    // The same bomb as an element of a JSON array, and as a lone JSON object.
    let array = format!("[{}, {bomb}]", json!({"id": 6, "s": "d"}));
    let (status, r) = post(&stack, "events", JSON, array).await?;
    assert_eq!(status, 400, "{r}");
    assert_eq!(
        (n(&r, "accepted"), r["errors"][0]["index"].clone()),
        (1, json!(1)),
        "{r}"
    );
    let (status, r) = post(&stack, "events", JSON, bomb).await?;
    assert_eq!(status, 400, "{r}");
    assert_eq!((n(&r, "accepted"), n(&r, "rejected")), (0, 1), "{r}");

    wait_exactly(&stack, "SELECT count() FROM events", 5).await?;
    assert_eq!(stored(&stack, "id", "events").await?, "[1,2,4,5,6]");
    ensure!(
        stack.clickhouse.is_running(),
        "clickhouse-server is gone:\n{}",
        stack.clickhouse.log_tail(20)
    );
    stack.clickhouse.ping(Duration::from_secs(5)).await?;
    Ok(())
}

/// Issue 13.6: invalid UTF-8 sent as NDJSON was stored raw. It is refused by row, as
/// an `application/json` body is refused whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_is_refused_in_ndjson_too() -> Result<()> {
    let stack = stack_with(&["events"], &[]).await?;
    let mut body = Vec::new();
    body.extend_from_slice(b"{\"id\":1,\"s\":\"ok\"}\n");
    body.extend_from_slice(b"{\"id\":2,\"s\":\"\xc3\x28 latin-1 \xe9\"}\n");
    body.extend_from_slice("{\"id\":3,\"s\":\"€ fine\"}\n".as_bytes());
    let (status, r) = post(&stack, "events", NDJSON, body).await?;
    assert_eq!(status, 400, "{r}");
    assert_eq!((n(&r, "accepted"), n(&r, "rejected")), (2, 1), "{r}");
    assert_eq!(
        (
            r["errors"][0]["index"].clone(),
            r["errors"][0]["line"].clone()
        ),
        (json!(1), json!(2)),
        "{r}"
    );
    assert!(
        r["errors"][0]["reason"]
            .as_str()
            .is_some_and(|e| e.contains("not valid UTF-8")),
        "{r}"
    );
    // As application/json, the whole body is refused.
    let (status, r) = post(&stack, "events", JSON, &b"{\"id\":4,\"s\":\"\xff\"}"[..]).await?;
    assert_eq!((status, n(&r, "accepted")), (400, 0), "{r}");
    assert!(
        r["error"].as_str().is_some_and(|e| e.contains("UTF-8")),
        "{r}"
    );

    wait_exactly(&stack, "SELECT count() FROM events", 2).await?;
    assert_eq!(stored(&stack, "s", "events").await?, "['ok','€ fine']");
    Ok(())
}

/// Issue 12: `application/json-seq` (RFC 7464) records start with 0x1E; each record is
/// one row (before, every record was refused as "not a JSON object").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_text_sequence_records_are_rows() -> Result<()> {
    let stack = stack_with(&["events"], &[]).await?;
    let body = "\u{1e}{\"id\":1,\"s\":\"a\"}\n\u{1e}{\n  \"id\": 2,\n  \"s\": \"pretty\"\n}\n\u{1e}[3]\n\u{1e}{\"id\":4,\"s\":\"d\"}\n";
    let (status, r) = post(&stack, "events", "application/json-seq", body).await?;
    assert_eq!(status, 400, "{r}");
    assert_eq!((n(&r, "accepted"), n(&r, "rejected")), (3, 1), "{r}");
    assert_eq!(r["errors"][0]["index"], 2, "{r}");
    let (status, r) = post(
        &stack,
        "events",
        "application/json-seq",
        "\u{1e}{\"id\":5,\"s\":\"e\"}\n",
    )
    .await?;
    assert_eq!((status, n(&r, "accepted")), (202, 1), "{r}");
    wait_exactly(&stack, "SELECT count() FROM events", 4).await?;
    assert_eq!(
        stored(&stack, "s", "events").await?,
        "['a','pretty','d','e']"
    );
    Ok(())
}

/// The most memory the sluice process has used so far (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .context("no VmHWM in /proc/<pid>/status")?;
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .context("VmHWM without a value")?
        .parse()?;
    Ok(kib * 1024)
}

/// Issue 13.3: 5,000,000 lines that are not objects (10 MB) made a 363 MB answer and
/// 847 MiB peak RSS, four in parallel 2.1 GiB. Now each answer lists the first 100
/// errors with the total, stays under 1 MiB, and four at once keep the process under
/// 200 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_million_bad_lines_answer_small_and_memory_stays_bounded() -> Result<()> {
    const LINES: usize = 5_000_000;
    let stack = stack_with(&["events"], &[]).await?;
    let pid = stack.sluice[0].pid().context("sluice is not running")?;
    let before = peak_rss(pid)?;
    let body = "1\n".repeat(LINES);
    assert_eq!(body.len(), 10_000_000);
    let http = loopback_client(Duration::from_secs(300))?;
    let url = format!("{}/v1/ingest/events", stack.api_url());
    let requests = (0..4).map(|_| {
        http.post(&url)
            .header("X-Tenant", TENANT)
            .header("Content-Type", NDJSON)
            .body(body.clone())
            .send()
    });
    let started = Instant::now();
    let mut largest = 0;
    for response in futures::future::join_all(requests).await {
        let response = response?;
        let status = response.status().as_u16();
        let text = response.bytes().await?;
        assert!(
            text.len() < 1 << 20,
            "the answer is {} bytes, over 1 MiB",
            text.len()
        );
        largest = largest.max(text.len());
        let r: Value = serde_json::from_slice(&text)?;
        assert_eq!(status, 400, "{r}");
        assert_eq!(
            (n(&r, "accepted"), n(&r, "rejected")),
            (0, LINES as u64),
            "{r}"
        );
        let errors = r["errors"].as_array().context("errors[]")?;
        assert_eq!(errors.len(), 100, "the first 100 errors are listed");
        assert_eq!(
            (errors[0]["index"].clone(), errors[99]["index"].clone()),
            (json!(0), json!(99))
        );
    }
    let elapsed = started.elapsed();
    let peak = peak_rss(pid)?;
    println!(
        "4 x 5,000,000 bad lines: {:.1}s, answers of {largest} bytes at most, peak RSS {} MiB (before: {} MiB)",
        elapsed.as_secs_f64(),
        peak >> 20,
        before >> 20
    );
    assert!(
        peak < 200 << 20,
        "peak RSS {} MiB is over 200 MiB",
        peak >> 20
    );
    Ok(())
}

/// Issue 13.5: 2,000 made-up table names made 2,003 table actors and grew `/metrics`
/// from 11 KB to 7.9 MB. A table the tenant's ClickHouse target lacks is 404 and gets
/// neither an actor nor a series; a table created later is taken within a second or so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_clickhouse_does_not_have_are_404_and_cost_nothing() -> Result<()> {
    let stack = stack_with(&["events"], &[]).await?;
    let row = json!({"id": 1, "s": "x"}).to_string();
    let (status, r) = post(&stack, "events", JSON, row.clone()).await?;
    assert_eq!(status, 202, "{r}");
    // The real table's row inserted first: its insert adds series of its own (the
    // insert duration's buckets...), which must not be taken for the made-up tables'.
    wait_for("the real table's row inserted", LAND, POLL, || async {
        let text = stack.metrics().await?;
        let inserted = sluice_harness::chaos::metric_value(
            &text,
            "sluice_rows_inserted_total",
            &[("table", "events")],
        );
        anyhow::ensure!(inserted >= 1.0, "{inserted} rows inserted so far");
        Ok(())
    })
    .await?;
    let metrics_before = stack.metrics().await?.len();

    for i in 0..100 {
        let table = format!("madeup_{i}");
        let (status, r) = post(&stack, &table, JSON, row.clone()).await?;
        assert_eq!(status, 404, "{table}: {r}");
        assert!(
            r["error"]
                .as_str()
                .is_some_and(|e| e.contains("has no table") && e.contains(&table)),
            "{r}"
        );
    }
    let metrics = stack.metrics().await?;
    assert!(!metrics.contains("madeup_"), "a made-up table has series");
    let (_, tree) = stack.admin_get("/admin/actors").await?;
    assert!(
        !tree.to_string().contains("madeup_"),
        "a made-up table has an actor"
    );
    // Ingest answers add a few series of their own (the 404 count); nothing per table.
    assert!(
        metrics.len() < metrics_before + 2048,
        "/metrics grew from {metrics_before} to {} bytes",
        metrics.len()
    );

    // A table created now is taken once the catalog reads the list again (at most
    // once a second), and its row lands.
    stack
        .clickhouse
        .exec("CREATE TABLE late (id UInt64, s String) ENGINE = MergeTree ORDER BY id")
        .await?;
    let stack_ref = &stack;
    wait_for(
        "the new table is taken",
        Duration::from_secs(10),
        POLL,
        || {
            let row = row.clone();
            async move {
                let (status, r) = post(stack_ref, "late", JSON, row).await?;
                match status {
                    202 => Ok(Ok(())),
                    404 => bail!("still 404"),
                    // Not retried: anything else is a failure, not a wait.
                    _ => Ok(Err(anyhow::anyhow!("unexpected answer {status} {r}"))),
                }
            }
        },
    )
    .await??;
    wait_exactly(&stack, "SELECT count() FROM late", 1).await?;
    Ok(())
}

/// When ClickHouse cannot be asked which tables it has, rows are not refused on a guess:
/// they are taken and land once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_for_a_table_that_cannot_be_checked_are_taken_during_an_outage() -> Result<()> {
    let mut stack = stack_with(
        &["events"],
        &[
            ("pipeline.backoff_initial", "200ms".into()),
            ("pipeline.backoff_max", "1s".into()),
        ],
    )
    .await?;
    stack.clickhouse.stop().await?;
    let (status, r) = post(
        &stack,
        "events",
        JSON,
        json!({"id": 1, "s": "x"}).to_string(),
    )
    .await?;
    assert_eq!((status, n(&r, "accepted")), (202, 1), "{r}");
    stack.clickhouse.start_again().await?;
    wait_exactly(&stack, "SELECT count() FROM events", 1).await?;
    // Back up, the catalog reads the list again (at most once a second): a made-up
    // table is refused.
    let stack = &stack;
    wait_for(
        "a made-up table is 404 again",
        Duration::from_secs(10),
        POLL,
        || async move {
            let (status, r) = post(stack, "nope", JSON, json!({"id": 2}).to_string()).await?;
            ensure!(status == 404, "{status} {r}");
            Ok(())
        },
    )
    .await?;
    Ok(())
}

/// Issue 13.5: the number of tables per tenant is capped, with a clear error beyond it;
/// the tables in use stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_per_tenant_are_capped() -> Result<()> {
    let stack = stack_with(
        &["t1", "t2", "t3"],
        &[("api.max_tables_per_tenant", 2.into())],
    )
    .await?;
    let row = |id: u64| json!({"id": id, "s": "x"}).to_string();
    for (table, id) in [("t1", 1), ("t2", 2)] {
        let (status, r) = post(&stack, table, JSON, row(id)).await?;
        assert_eq!(status, 202, "{table}: {r}");
    }
    let (status, r) = post(&stack, "t3", JSON, row(3)).await?;
    assert_eq!(status, 403, "{r}");
    assert!(
        r["error"]
            .as_str()
            .is_some_and(|e| e.contains("max_tables_per_tenant") && e.contains("t3")),
        "{r}"
    );
    let (status, r) = post(&stack, "t1", JSON, row(4)).await?;
    assert_eq!(status, 202, "{r}");
    wait_exactly(&stack, "SELECT count() FROM t1", 2).await?;
    wait_exactly(&stack, "SELECT count() FROM t2", 1).await?;
    assert_eq!(stack.count("SELECT count() FROM t3").await?, 0);
    Ok(())
}
