//! Shared by the ingest API's test binaries: a client's view of `POST /v1/ingest`
//! (answers with status, headers and body), stacks with the usual table, and a wait for
//! rows landed in ClickHouse that fails at once on one row too many.

#![allow(dead_code)]

use std::time::Duration;

use anyhow::{bail, Context, Result};
use reqwest::header::HeaderMap;
use serde_json::Value;
use sluice_harness::{wait_for, Stack, StackOptions, TENANT};

pub const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");
pub const LAND: Duration = Duration::from_secs(60);

/// An answer of the ingest API.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Reply {
    pub fn n(&self, field: &str) -> u64 {
        self.body.get(field).and_then(Value::as_u64).unwrap_or(0)
    }
}

impl std::fmt::Display for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.body)
    }
}

/// POST a body to `/v1/ingest/{table}` with exactly the headers given (no tenant added).
pub async fn post(
    http: &reqwest::Client,
    stack: &Stack,
    table: &str,
    body: impl Into<reqwest::Body>,
    headers: &[(&str, &str)],
) -> Result<Reply> {
    post_to(http, &stack.api_url(), table, body, headers).await
}

/// The same, to the API at `base_url` (one of several instances).
pub async fn post_to(
    http: &reqwest::Client,
    base_url: &str,
    table: &str,
    body: impl Into<reqwest::Body>,
    headers: &[(&str, &str)],
) -> Result<Reply> {
    let mut request = http
        .post(format!("{base_url}/v1/ingest/{table}"))
        .body(body);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = request.send().await.context("POST /v1/ingest")?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.context("reading the answer")?;
    let body = serde_json::from_str(&text).with_context(|| {
        format!("the ingest API answered {status} with a body that is not JSON: {text:?}")
    })?;
    Ok(Reply {
        status,
        headers,
        body,
    })
}

pub const JSON: (&str, &str) = ("Content-Type", "application/json");
pub const NDJSON: (&str, &str) = ("Content-Type", "application/x-ndjson");
pub const AS_TENANT: (&str, &str) = ("X-Tenant", TENANT);

pub fn ndjson(rows: impl IntoIterator<Item = Value>) -> String {
    rows.into_iter().map(|r| format!("{r}\n")).collect()
}

pub async fn stack_with(tables: &[&str], settings: &[(&str, toml::Value)]) -> Result<Stack> {
    let mut stack = Stack::start(StackOptions::default()).await?;
    for sql in tables {
        stack.clickhouse.exec(sql).await?;
    }
    for (key, value) in settings {
        stack.set(key, value.clone());
    }
    stack.start_sluice(SLUICE).await?;
    Ok(stack)
}

pub const EVENTS: &str =
    "CREATE TABLE events (id UInt64, name String) ENGINE = MergeTree ORDER BY id";

/// Waits until `sql` counts exactly `n`; fails at once if it ever counts more.
pub async fn wait_exactly(stack: &Stack, sql: &str, n: u64) -> Result<()> {
    wait_for(
        &format!("`{sql}` = {n}"),
        LAND,
        Duration::from_millis(200),
        || async move {
            let c = stack.count(sql).await?;
            if c > n {
                // Not retried: more rows than accepted is a failure, not a wait.
                return Ok(Err(anyhow::anyhow!(
                    "`{sql}` counted {c}, more than the {n} accepted"
                )));
            }
            if c == n {
                Ok(Ok(()))
            } else {
                bail!("{c} so far")
            }
        },
    )
    .await?
}

/// A stack whose ingest stream holds `max_bytes`, with ClickHouse stopped so that nothing
/// drains and the stream fills (a short outage backoff, so the rows drain soon after it
/// is back). Its messages are stored plain (`[api] compression = "none"`): these tests
/// fill the budget within a bounded number of requests, and compressed rows take about
/// five times as many (what compression holds is `tests/compressed.rs`'s and the
/// backlog benchmark's).
pub async fn filling_stack(max_bytes: &str, settings: &[(&str, toml::Value)]) -> Result<Stack> {
    let mut all: Vec<(&str, toml::Value)> = vec![
        ("nats.max_bytes", max_bytes.into()),
        ("api.compression", "none".into()),
        ("pipeline.backoff_initial", "200ms".into()),
        ("pipeline.backoff_max", "1s".into()),
    ];
    all.extend_from_slice(settings);
    let mut stack = stack_with(&[EVENTS], &all).await?;
    stack.clickhouse.stop().await?;
    Ok(stack)
}

/// Sends one row (`id`) after the others and waits for it to land, then checks that
/// `events` holds exactly `total` rows: JetStream delivers in order, so a duplicate of
/// an earlier row would have landed by then.
pub async fn settled_with(stack: &Stack, id: u64, total: u64) -> Result<()> {
    let row = format!("{{\"id\": {id}, \"name\": \"after\"}}");
    let r = post(stack.http(), stack, "events", row, &[AS_TENANT, JSON]).await?;
    anyhow::ensure!(r.status == 202, "the row after: {r}");
    wait_exactly(
        stack,
        &format!("SELECT count() FROM events WHERE id = {id}"),
        1,
    )
    .await?;
    let count = stack.count("SELECT count() FROM events").await?;
    anyhow::ensure!(count == total, "events holds {count} rows, not {total}");
    Ok(())
}
