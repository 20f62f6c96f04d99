//! The insert client: NDJSON rows into `database.table` over ClickHouse's HTTP
//! interface, every failure classified.
//!
//! Why not the `clickhouse` crate: its `BadResponse` drops the HTTP status whenever the
//! body is non-empty and collects an error body without bound, while the classifier
//! needs the status, the `X-ClickHouse-Exception-Code` header and at most 4 KiB of the
//! body; and its typed rows need a schema at compile time, where Sluice forwards rows
//! as they came. A plain HTTP client gives all three with a bounded read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use rand::RngExt as _;
use sluice_actors::{Class, Dedup, InsertError, InsertRequest, Inserter, ServerInfo, TableKey};
use tokio::sync::{OnceCell, Semaphore};

use super::classify::{self, MAX_ERROR_BODY};
use crate::config::TargetConfig;

/// The settings an insert pins where the server knows them. Learnt once per target:
/// an old server answers an unknown setting with an error (code 115).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerFeatures {
    pub version: String,
    /// `async_insert` (21.11+): pinned to 0 so one bad row cannot fail a neighbour's
    /// batch merged by the server.
    pub async_insert: bool,
    pub date_time_input_format: bool,
    /// `input_format_skip_unknown_fields`: sent on every insert, 0 unless the table opts
    /// in, because current servers default it to 1 and would drop an unknown field
    /// silently where DESIGN.md parks the row (code 117).
    pub skip_unknown_fields: bool,
    pub insert_deduplication_token: bool,
}

/// Inserts into one ClickHouse target (URL + user + database).
pub struct HttpInserter {
    target: String,
    url: String,
    user: String,
    password: Option<String>,
    database: String,
    client: reqwest::Client,
    insert_timeout: Duration,
    /// Insert requests in flight: the ingest workload class, apart from queries.
    permits: Semaphore,
    features: OnceCell<ServerFeatures>,
    /// A per-process counter in each query id, so ids stay unique and readable.
    sequence: AtomicU64,
    instance: u32,
}

// === impl HttpInserter ===

impl HttpInserter {
    pub fn new(target: &TargetConfig) -> anyhow::Result<Self> {
        let client = super::http::client_builder()
            .connect_timeout(target.connect_timeout)
            .pool_idle_timeout(target.pool_idle_timeout)
            .pool_max_idle_per_host(target.insert_concurrency.max(1) * 2)
            .build()?;
        Ok(Self {
            target: target.name.clone(),
            url: format!("{}/", target.url.trim_end_matches('/')),
            user: target.user.clone(),
            password: target.password.as_ref().map(|s| s.expose().to_string()),
            database: target.database.clone(),
            client,
            insert_timeout: target.insert_timeout,
            permits: Semaphore::new(target.insert_concurrency.max(1)),
            features: OnceCell::new(),
            sequence: AtomicU64::new(0),
            instance: rand::rng().random(),
        })
    }

    pub fn target(&self) -> &str {
        &self.target
    }

    /// What the server supports, asked once and remembered; a failure is not
    /// remembered, so the next call asks again.
    ///
    /// The lookup runs before the first insert, so its failure comes back as that
    /// insert's: see [`lookup_failed`] for why it is never a verdict on rows.
    pub async fn features(&self) -> Result<&ServerFeatures, InsertError> {
        self.features
            .get_or_try_init(|| async { self.detect().await.map_err(lookup_failed) })
            .await
    }

    async fn detect(&self) -> Result<ServerFeatures, InsertError> {
        let version = self.query("SELECT version()").await?;
        let names = self
            .query(
                "SELECT name FROM system.settings WHERE name IN \
                 ('async_insert', 'date_time_input_format', 'input_format_skip_unknown_fields', 'insert_deduplication_token')",
            )
            .await?;
        let has = |name: &str| names.lines().any(|l| l.trim() == name);
        let features = ServerFeatures {
            version: version.trim().to_string(),
            async_insert: has("async_insert"),
            date_time_input_format: has("date_time_input_format"),
            skip_unknown_fields: has("input_format_skip_unknown_fields"),
            insert_deduplication_token: has("insert_deduplication_token"),
        };
        tracing::info!(pool = %self.target, version = %features.version, async_insert = features.async_insert, "ClickHouse target answered");
        Ok(features)
    }

    /// A small read on this target, with the ingest credentials (the table catalog's
    /// too, so it needs no HTTP client of its own).
    pub async fn query(&self, sql: &str) -> Result<String, InsertError> {
        let request = self
            .authorized(self.client.post(&self.url))
            .timeout(self.insert_timeout)
            .body(sql.to_string());
        let response = request.send().await.map_err(transport)?;
        let status = response.status();
        if status.is_success() {
            return response.text().await.map_err(transport);
        }
        Err(failure(response).await)
    }

    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        request.basic_auth(&self.user, self.password.as_deref())
    }

    fn query_id(&self) -> String {
        let n = self.sequence.fetch_add(1, Ordering::Relaxed);
        format!("sluice-insert-{:08x}-{n}", self.instance)
    }
}

impl Inserter for HttpInserter {
    async fn insert(&self, request: InsertRequest) -> Result<(), InsertError> {
        let features = self.features().await?.clone();
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| classify::transport("the insert client is shutting down"))?;
        let sql = format!(
            "INSERT INTO `{}`.`{}` FORMAT JSONEachRow",
            self.database, request.table.table
        );
        let query_id = self.query_id();
        let mut params: Vec<(&str, &str)> = vec![("query", &sql), ("query_id", &query_id)];
        if features.async_insert {
            params.push(("async_insert", "0"));
        }
        if features.date_time_input_format {
            params.push(("date_time_input_format", "best_effort"));
        }
        if features.skip_unknown_fields {
            let skip = if request.skip_unknown_fields {
                "1"
            } else {
                "0"
            };
            params.push(("input_format_skip_unknown_fields", skip));
        }
        let url = reqwest::Url::parse_with_params(&self.url, &params)
            .map_err(|e| classify::transport(format!("building the insert URL: {e}")))?;
        let response = self
            .authorized(self.client.post(url))
            .timeout(self.insert_timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/x-ndjson")
            .body(request.body)
            .send()
            .await
            .map_err(transport)?;
        if response.status().is_success() {
            // Read the (empty) body so the connection goes back to the pool.
            let _ = response.bytes().await;
            return Ok(());
        }
        Err(failure(response).await)
    }

    async fn deduplicates(&self, _table: &TableKey) -> Result<Dedup, InsertError> {
        Ok(Dedup {
            exactly_once: false,
            why: "not asked yet".into(),
        })
    }

    async fn probe(&self) -> Result<ServerInfo, InsertError> {
        let features = self.features().await?;
        // Features are remembered; the probe must still prove the server answers now.
        self.query("SELECT 1").await?;
        Ok(ServerInfo {
            version: features.version.clone(),
        })
    }
}

/// A failed feature lookup judged no row, whatever its code: a proxy that lets only
/// inserts through, or a server that hides its system tables, can answer the lookup
/// with a code that would be a verdict on rows had an insert drawn it (60, 62...).
/// Returned as such, the batch would be bisected and every good row parked. So a
/// `Rejected` lookup is `Unknown` (back off, keep the rows), and no flag of a table or a
/// batch applies: the lookup is about the whole target.
fn lookup_failed(mut error: InsertError) -> InsertError {
    if error.class == Class::Rejected {
        error.class = Class::Unknown;
    }
    error.table_scoped = false;
    error.splittable = false;
    error.message = format!(
        "asking the server which settings it knows (before any insert): {}",
        error.message
    );
    error
}

/// Classify a non-success answer from its status, exception header and at most
/// `MAX_ERROR_BODY` bytes of its body.
pub async fn failure(mut response: reqwest::Response) -> InsertError {
    let status = response.status().as_u16();
    let header = response
        .headers()
        .get("X-ClickHouse-Exception-Code")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = read_capped(&mut response, MAX_ERROR_BODY).await;
    classify::from_response(status, header.as_deref(), &String::from_utf8_lossy(&body))
}

/// Read at most `max` bytes of a body; the rest is never collected.
pub async fn read_capped(response: &mut reqwest::Response, max: usize) -> Bytes {
    let mut out = Vec::new();
    while out.len() < max {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let take = chunk.len().min(max - out.len());
                out.extend_from_slice(&chunk[..take]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    Bytes::from(out)
}

/// A request that got no answer: refused, reset, timed out, DNS...
pub fn transport(e: reqwest::Error) -> InsertError {
    use std::error::Error as _;
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    if e.is_timeout() && !message.contains("timed out") {
        message.push_str(" (timed out)");
    }
    classify::transport(message)
}
