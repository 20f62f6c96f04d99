//! Shared by the query gateway's test binaries: the gateway served in-process on
//! 127.0.0.1:0, a configuration against a given ClickHouse URL, and polling helpers.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use serde_json::Value;
use sluice::config::Config;
use sluice::query::{self, QueryState};
use sluice_harness::{available, wait_until, ClickHouseServer, QUERY_PASSWORD, QUERY_USER};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A scan that runs for hours unless stopped. (`sleep()` on 18.16 is not interrupted
/// by `max_execution_time`, so a heavy scan stands in for a slow query.)
pub const HEAVY: &str = "SELECT count() FROM numbers(10000000000000) WHERE sipHash64(number) = 1";

/// The gateway served on 127.0.0.1:0.
pub struct Gateway {
    pub base: String,
    pub client: reqwest::Client,
    server: JoinHandle<()>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.server.abort();
    }
}

pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
    pub elapsed: Duration,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn query_id(&self) -> &str {
        self.header(query::QUERY_ID_HEADER).unwrap_or("")
    }

    pub fn error(&self) -> &str {
        self.body["error"].as_str().unwrap_or("")
    }

    /// The fields every error body carries, and the id matching the header.
    pub fn check_error_body(&self) -> Result<()> {
        for key in ["error", "code", "class", "retryable", "query_id"] {
            ensure!(self.body.get(key).is_some(), "{key} missing: {}", self.body);
        }
        ensure!(
            self.body["query_id"] == self.query_id() && !self.query_id().is_empty(),
            "query_id in body {} vs header {:?}",
            self.body["query_id"],
            self.query_id()
        );
        Ok(())
    }
}

impl Gateway {
    pub async fn start(config_text: &str) -> Result<Gateway> {
        Self::start_with(config_text, &[("QUERY_PW", QUERY_PASSWORD)]).await
    }

    pub async fn start_with(config_text: &str, vars: &[(&str, &str)]) -> Result<Gateway> {
        crypto_provider();
        let vars: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let config = Config::from_parts("test.toml", config_text, &vars)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let state = QueryState::new(Arc::new(config))?;
        let app = query::router(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()?;
        Ok(Gateway {
            base: format!("http://{addr}"),
            client,
            server,
        })
    }

    pub async fn post_raw(&self, headers: &[(&str, &str)], body: String) -> Result<Reply> {
        let started = Instant::now();
        let mut request = self.client.post(format!("{}/v1/query", self.base));
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let response = request.body(body).send().await.context("POST /v1/query")?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.context("reading the answer")?;
        let elapsed = started.elapsed();
        let body = serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "answer {status} is not JSON: {:?}",
                String::from_utf8_lossy(&bytes)
            )
        })?;
        Ok(Reply {
            status,
            headers,
            body,
            elapsed,
        })
    }

    /// A query as tenant `tenant` (`auth = "none"`: the X-Tenant header).
    pub async fn query(&self, tenant: &str, body: Value) -> Result<Reply> {
        self.post_raw(&[("x-tenant", tenant)], body.to_string())
            .await
    }
}

pub fn crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// `[query]` against `url` as the harness's read-only user, tenants acme and globex.
pub fn config(url: &str, query_extra: &str) -> String {
    format!(
        r#"
[api]
auth = "none"
retry_after = "5s"

[clickhouse.targets.main]
url = "{url}"

[tenants.acme]
target = "main"

[tenants.globex]
target = "main"

[tenants.initech]
target = "main"

[query]
target = "main"
user = "{QUERY_USER}"
password_env = "QUERY_PW"
server_margin = "500ms"
kill_timeout = "1s"
backoff_base = "20ms"
backoff_max = "200ms"
{query_extra}
"#
    )
}

/// The server, or `None` (test skipped) where clickhouse-server is not installed.
pub async fn clickhouse(test: &str) -> Result<Option<ClickHouseServer>> {
    crypto_provider();
    if available(test, sluice_harness::clickhouse::binary())?.is_none() {
        return Ok(None);
    }
    Ok(Some(ClickHouseServer::start().await?))
}

pub async fn running(ch: &ClickHouseServer, query_id: &str) -> Result<u64> {
    ch.count(&format!(
        "SELECT count() FROM system.processes WHERE query_id = '{query_id}'"
    ))
    .await
}

/// Poll until ClickHouse has no row for `query_id` in `system.processes`.
pub async fn wait_gone(ch: &ClickHouseServer, query_id: &str, deadline: Duration) -> Result<()> {
    wait_until(
        &format!("query {query_id} to leave system.processes"),
        deadline,
        Duration::from_millis(20),
        || async { matches!(running(ch, query_id).await, Ok(0)) },
    )
    .await
}
