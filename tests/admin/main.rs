//! The admin endpoint on real servers, as an operator uses it: readiness, the live
//! actor tree, Prometheus metrics, the token, the routes the page reads (rates, NATS,
//! paged parked rows), the DLQ tools (over HTTP and from `sluice dlq`), the logs and
//! the page in a real browser.

mod cli;
mod dlq;
mod logs;
mod metrics;
mod overview;
mod page;
mod security;
mod tree;

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use reqwest::Method;
use serde_json::Value;
use sluice_harness::{wait_for, Stack, ADMIN_TOKEN};

pub const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");
/// How long rows, states and counts get to show up.
pub const DEADLINE: Duration = Duration::from_secs(60);
pub const POLL: Duration = Duration::from_millis(200);

pub const EVENTS: &str =
    "CREATE TABLE events (id UInt64, name String) ENGINE = MergeTree ORDER BY id";
/// A table whose `v` refuses text: rows with `"v": "twenty"` are parked until it is
/// altered to take it.
pub const ORDERS: &str = "CREATE TABLE orders (id UInt64, v UInt32) ENGINE = MergeTree ORDER BY id";
/// A table with one column: rows with any other field are parked (code 117).
pub const STRICT: &str = "CREATE TABLE strict (id UInt64) ENGINE = MergeTree ORDER BY id";

/// A stack with `orders` and `strict`, and Sluice running.
pub async fn dlq_stack() -> Result<Stack> {
    let mut stack = Stack::start(sluice_harness::StackOptions::default()).await?;
    stack.clickhouse.exec(ORDERS).await?;
    stack.clickhouse.exec(STRICT).await?;
    stack.start_sluice(SLUICE).await?;
    Ok(stack)
}

/// A GET with the stack's admin token; the status and the JSON body.
pub async fn admin(stack: &Stack, path: &str) -> Result<(u16, Value)> {
    let (status, _, body) = stack
        .admin_request(Method::GET, path, Some(ADMIN_TOKEN), None)
        .await?;
    Ok((status, body))
}

/// The live actor tree.
pub async fn tree(stack: &Stack) -> Result<Value> {
    let (status, body) = admin(stack, "/admin/actors").await?;
    if status != 200 {
        bail!("/admin/actors answered {status}: {body}");
    }
    Ok(body)
}

/// The first node of the tree (depth first) of this kind and name.
pub fn find_node<'a>(node: &'a Value, kind: &str, name: &str) -> Option<&'a Value> {
    if node["kind"] == kind && node["name"] == name {
        return Some(node);
    }
    node["children"]
        .as_array()?
        .iter()
        .find_map(|c| find_node(c, kind, name))
}

/// Polls the tree until `check` accepts the node `kind`/`name`; returns that node.
pub async fn wait_node(
    stack: &Stack,
    kind: &str,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Result<Value> {
    let check = &check;
    wait_for(what, DEADLINE, POLL, || async move {
        let tree = tree(stack).await?;
        let node = find_node(&tree, kind, name)
            .ok_or_else(|| anyhow!("no {kind} node {name} in {tree}"))?;
        if check(node) {
            Ok(node.clone())
        } else {
            Err(anyhow!("{kind} {name} is {node}"))
        }
    })
    .await
}

/// Injects a panic into the TableActor of `tenant.table` (fault injection is on in
/// these stacks) and waits until the tree shows it respawned and running.
pub async fn panic_table_and_wait_respawn(stack: &Stack, tenant: &str, table: &str) -> Result<()> {
    let (status, _, body) = stack
        .admin_request(
            Method::POST,
            &format!("/admin/debug/panic/{tenant}/{table}"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await?;
    if status != 200 {
        bail!("injecting a panic into {tenant}.{table} answered {status}: {body}");
    }
    wait_node(
        stack,
        "table",
        &format!("{tenant}.{table}"),
        "the table respawned",
        |n| n["restarts"].as_u64().is_some_and(|r| r >= 1) && n["status"] == "running",
    )
    .await?;
    Ok(())
}

/// POSTs rows as NDJSON for the stack's tenant and insists on 202.
pub async fn ingest_ok(stack: &Stack, table: &str, rows: &[Value]) -> Result<()> {
    let (status, reply) = stack.ingest(table, rows).await?;
    if status != 202 || reply["accepted"].as_u64() != Some(rows.len() as u64) {
        bail!("ingest into {table}: {status} {reply}");
    }
    Ok(())
}

/// POSTs one NDJSON line to `table` as its producer wrote it, byte for byte, and
/// insists on 202.
pub async fn ingest_line_ok(stack: &Stack, table: &str, line: &str) -> Result<()> {
    let body = format!("{line}\n").into_bytes();
    let (status, reply) = stack
        .ingest_raw(table, "application/x-ndjson", body, &[])
        .await?;
    if status != 202 {
        bail!("ingest {line} into {table}: {status} {reply}");
    }
    Ok(())
}

/// Waits until `sql` counts exactly `n` (fails at once when it counts more).
pub async fn wait_count(stack: &Stack, sql: &str, n: u64) -> Result<()> {
    wait_for(&format!("`{sql}` = {n}"), DEADLINE, POLL, || async move {
        let c = stack.count(sql).await?;
        if c > n {
            return Ok(Err(anyhow!("`{sql}` counted {c}, more than {n}")));
        }
        if c == n {
            Ok(Ok(()))
        } else {
            bail!("{c} so far")
        }
    })
    .await?
}

/// Rows parked for `table` right now, per `GET /admin/dlq`.
pub async fn dlq_count(stack: &Stack, tenant: &str, table: &str) -> Result<u64> {
    let (status, body) = admin(stack, "/admin/dlq").await?;
    if status != 200 {
        bail!("/admin/dlq answered {status}: {body}");
    }
    let tables = body["tables"].as_array().context("tables[]")?;
    Ok(tables
        .iter()
        .find(|t| t["tenant"] == tenant && t["table"] == table)
        .and_then(|t| t["rows"].as_u64())
        .unwrap_or(0))
}

/// Sends `strict` two rows with a field it does not have, and waits until both are
/// parked.
pub async fn park_two_in_strict(stack: &Stack) -> Result<()> {
    let rows = [
        serde_json::json!({"id": 1, "extra": 1}),
        serde_json::json!({"id": 2, "extra": 2}),
    ];
    ingest_ok(stack, "strict", &rows).await?;
    wait_parked(stack, "strict", 2).await
}

/// Waits until exactly `n` rows of `table` are parked.
pub async fn wait_parked(stack: &Stack, table: &str, n: u64) -> Result<()> {
    wait_for(
        &format!("{n} rows of {table} parked"),
        DEADLINE,
        POLL,
        || async move {
            match dlq_count(stack, sluice_harness::TENANT, table).await? {
                c if c == n => Ok(()),
                c => bail!("{c} parked"),
            }
        },
    )
    .await
}
