//! Each listener's OpenAPI document (`GET /openapi.json` on the API and the admin
//! listener) held against a running Sluice on real servers: every documented method of
//! every path is routed and answers a documented status with a documented media type,
//! every other method answers 405 (`probe`); and schemathesis, with all its checks,
//! finds nothing on either document while nothing accepted during its fuzzing is lost
//! (`fuzz`).

mod fuzz;
mod probe;

use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::Value;
use sluice_harness::{Stack, StackOptions, ADMIN_TOKEN, QUERY_PASSWORD, QUERY_USER, TENANT};

pub const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");
/// The tenant's bearer token in these stacks (tenants are named by token, as in
/// production).
pub const TENANT_TOKEN: &str = "tenant-token-7f3e91c2";
pub const DEADLINE: Duration = Duration::from_secs(60);
pub const POLL: Duration = Duration::from_millis(200);

pub const EVENTS: &str =
    "CREATE TABLE events (id UInt64, name String) ENGINE = MergeTree ORDER BY id";

/// A stack configured as in production: tenants by token, the query gateway on, and
/// fault injection off (its routes answer 404, as documented).
pub async fn production_like_stack() -> Result<Stack> {
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack.set("api.auth", "token");
    stack.set(
        &format!("tenants.{TENANT}.token_env"),
        "SLUICE_TEST_TENANT_TOKEN",
    );
    stack.set("admin.fault_injection", false);
    stack.set("query.target", "main");
    stack.set("query.user", QUERY_USER);
    stack.set("query.password_env", "SLUICE_TEST_QUERY_PASSWORD");
    stack.env.extend([
        ("SLUICE_TEST_TENANT_TOKEN".into(), TENANT_TOKEN.into()),
        ("SLUICE_TEST_QUERY_PASSWORD".into(), QUERY_PASSWORD.into()),
    ]);
    stack.start_sluice(SLUICE).await?;
    Ok(stack)
}

/// A stack whose API takes the tenant from `X-Tenant` (`[api] auth = "none"`), the query
/// gateway on.
pub async fn header_tenant_stack() -> Result<Stack> {
    let mut stack = Stack::start(StackOptions::default()).await?;
    stack.clickhouse.exec(EVENTS).await?;
    stack.set("api.auth", "none");
    stack.set("query.target", "main");
    stack.set("query.user", QUERY_USER);
    stack.set("query.password_env", "SLUICE_TEST_QUERY_PASSWORD");
    stack
        .env
        .push(("SLUICE_TEST_QUERY_PASSWORD".into(), QUERY_PASSWORD.into()));
    stack.start_sluice(SLUICE).await?;
    Ok(stack)
}

/// The two listeners: a name, the base URL, the bearer token their routes take.
pub fn listeners(stack: &Stack) -> [(&'static str, String, &'static str); 2] {
    [
        ("api", stack.api_url(), TENANT_TOKEN),
        ("admin", stack.admin_url(), ADMIN_TOKEN),
    ]
}

/// A listener's document, as it serves it.
pub async fn document(stack: &Stack, base: &str) -> Result<Value> {
    let response = stack
        .http()
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .with_context(|| format!("GET {base}/openapi.json"))?;
    if response.status() != 200 {
        bail!("GET {base}/openapi.json answered {}", response.status());
    }
    serde_json::from_str(&response.text().await?).context("the document is not JSON")
}
