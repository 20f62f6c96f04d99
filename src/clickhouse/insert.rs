//! The insert client of one ClickHouse server: NDJSON rows into `database.table` over
//! its HTTP interface, every failure classified. After an ambiguous failure (a timeout,
//! a connection lost once the request went out) it sends `KILL QUERY` for the attempt,
//! where the server still answers, before the failure is reported: the retry may go to
//! another replica of the shard, and the first attempt must not keep running beside
//! it.
//!
//! Why not the `clickhouse` crate: its `BadResponse` drops the HTTP status whenever the
//! body is non-empty and collects an error body without bound, while the classifier
//! needs the status, the `X-ClickHouse-Exception-Code` header and at most 4 KiB of the
//! body; and its typed rows need a schema at compile time, where Sluice forwards rows
//! as they came. A plain HTTP client gives all three with a bounded read.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::RngExt as _;
use sluice_actors::{
    Class, ClickHouseError, Dedup, InsertRequest, Inserter, NoAnswer, ServerInfo, TableKey,
};
use tokio::sync::Semaphore;

use super::classify;
use super::dedup::{dedup_of, ServerDedup};
use super::endpoint::{read_error, transport_error, Endpoint};
use super::features::KnownFeatures;
pub use super::features::ServerFeatures;
use super::pinned::pinned_settings;
use super::ranges::{may_be_out_of_range, IntegerColumns, COLUMNS_SQL, OUT_OF_RANGE};
use super::redelivery::Redelivery;
use super::shard::ShardReplicas;
use super::table_info::{TableInfo, TABLE_INFO_COLUMNS};
use crate::config::TargetConfig;

/// Inserts into one ClickHouse server of a target (URL + user + database).
pub struct HttpInserter {
    target: String,
    /// The server's name (`host:port`; the target's for a target of one server).
    replica: String,
    endpoint: Endpoint,
    /// How long the `KILL QUERY` after an ambiguous failure may take.
    kill_within: Duration,
    database: String,
    insert_timeout: Duration,
    /// Insert requests in flight: the ingest workload class, apart from queries.
    permits: Semaphore,
    /// What the server said of itself: asked again at the table refresh, after an
    /// outage and after a setting refused as unknown.
    features: KnownFeatures,
    /// A per-process counter in each query id, so ids stay unique and readable.
    sequence: AtomicU64,
    instance: u32,
    /// What a table's deduplication window must cover (Sluice's settings).
    redelivery: Redelivery,
    /// What `system.tables` says of each table, asked at most every [`DEDUP_TTL`].
    tables: Mutex<HashMap<String, (TableInfo, Instant)>>,
    /// Each table's integer columns (`system.columns`), asked at most every
    /// [`DEDUP_TTL`]: a row holding a number out of range for one is refused here.
    integers: Mutex<HashMap<String, (Arc<IntegerColumns>, Instant)>>,
    /// The servers of its shard, when it has others: a table they do not replicate as
    /// one is not exactly-once (a retry may move to another of them).
    shard: Option<Arc<ShardReplicas>>,
}

/// How long a table's engine, settings and views are kept (they rarely change; a table
/// altered or recreated is seen within this).
const DEDUP_TTL: Duration = Duration::from_secs(60);

/// The longest a `KILL QUERY` after an ambiguous failure may take (less when the
/// target's `connect_timeout` is shorter): a frozen server never answers it, and the
/// failure waits for it before it is reported.
const KILL_WITHIN: Duration = Duration::from_secs(2);

// === impl HttpInserter ===

impl HttpInserter {
    /// The client of server `url` (named `replica`) of `target`; `redelivery` is what
    /// its tables' deduplication windows are held against ([`Redelivery::of`] the
    /// configuration).
    pub fn new(
        target: &TargetConfig,
        url: &str,
        replica: &str,
        redelivery: Redelivery,
    ) -> anyhow::Result<Self> {
        let endpoint = Endpoint::of_target(target, url, target.insert_concurrency.max(1) * 2)?;
        Ok(Self {
            target: target.name.clone(),
            replica: replica.to_owned(),
            kill_within: target.connect_timeout.min(KILL_WITHIN),
            endpoint,
            database: target.database.clone(),
            insert_timeout: target.insert_timeout,
            permits: Semaphore::new(target.insert_concurrency.max(1)),
            features: KnownFeatures::default(),
            sequence: AtomicU64::new(0),
            instance: rand::rng().random(),
            redelivery,
            tables: Mutex::new(HashMap::new()),
            integers: Mutex::new(HashMap::new()),
            shard: None,
        })
    }

    /// The same client, one of `shard`'s servers.
    pub fn in_shard(mut self, shard: Arc<ShardReplicas>) -> Self {
        self.shard = Some(shard);
        self
    }

    pub fn target(&self) -> &str {
        &self.target
    }

    /// The server's name (`host:port`; the target's for a target of one server).
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// What this target's tables' windows are held against.
    pub fn redelivery(&self) -> &Redelivery {
        &self.redelivery
    }

    /// What the server supports: remembered for the table refresh's period
    /// ([`super::features::FEATURES_TTL`]) and asked again after it, or at once after an
    /// outage or a setting refused as unknown (the server may have changed behind the
    /// URL). A failure is not remembered, so the next call asks again.
    ///
    /// The lookup runs before the first insert, so its failure comes back as that
    /// insert's: see [`lookup_failed`] for why it is never a verdict on rows.
    pub async fn features(&self) -> Result<Arc<ServerFeatures>, ClickHouseError> {
        if let Some(known) = self.features.fresh() {
            return Ok(known);
        }
        let detected = self.detect().await.map_err(lookup_failed)?;
        let (features, before) = self.features.remember(detected);
        match before {
            Some(before) => tracing::warn!(pool = %self.target, replica = %self.replica,
                before = %before.describe(), now = %features.describe(),
                "the ClickHouse server changed behind its URL"),
            None => tracing::debug!(pool = %self.target, replica = %self.replica,
                features = %features.describe(), "ClickHouse server asked what it knows"),
        }
        Ok(features)
    }

    /// After a failure: an outage (the server may come back another) or a setting
    /// refused as unknown makes the next call ask the server again what it knows; the
    /// latter is no verdict on rows.
    fn after_failure(&self, error: ClickHouseError) -> ClickHouseError {
        if error.code == Some(classify::UNKNOWN_SETTING) {
            self.features.forget();
            return classify::setting_refused_on_insert(error);
        }
        if error.class.is_outage() && error.code.is_none() {
            self.features.forget();
        }
        error
    }

    /// Every table of the target's database, and whether its inserts are exactly-once
    /// (what `sluice check-config` shows before anything runs), at the pace of the
    /// tenant that needs the most of its window.
    pub async fn dedup_of_tables(&self) -> Result<Vec<(TableInfo, Dedup)>, String> {
        let server = self
            .features()
            .await
            .map_err(|e| e.message.clone())?
            .dedup
            .clone();
        let tables = super::catalog::TableSource::list_tables(self, &self.database).await?;
        Ok(tables
            .into_iter()
            .map(|t| {
                let dedup = dedup_of(&t, &server, &self.redelivery.strictest_need(&t.name));
                (t, dedup)
            })
            .collect())
    }

    async fn detect(&self) -> Result<ServerFeatures, ClickHouseError> {
        let version = self.query("SELECT version()").await?;
        let names = self
            .query(
                "SELECT name FROM system.settings WHERE name IN \
                 ('async_insert', 'date_time_input_format', 'input_format_skip_unknown_fields', \
                  'insert_deduplication_token', 'insert_deduplicate', 'deduplicate_insert', \
                  'deduplicate_blocks_in_dependent_materialized_views')",
            )
            .await?;
        let has = |name: &str| names.lines().any(|l| l.trim() == name);
        let windows = self
            .query(
                "SELECT name, value FROM system.merge_tree_settings WHERE name IN \
                 ('replicated_deduplication_window', 'replicated_deduplication_window_seconds', \
                  'non_replicated_deduplication_window')",
            )
            .await?;
        let window = |name: &str| {
            windows.lines().find_map(|l| {
                let (key, value) = l.split_once('\t')?;
                (key.trim() == name).then(|| value.trim().parse().ok())?
            })
        };
        let features = ServerFeatures {
            version: version.trim().to_string(),
            async_insert: has("async_insert"),
            date_time_input_format: has("date_time_input_format"),
            skip_unknown_fields: has("input_format_skip_unknown_fields"),
            insert_deduplication_token: has("insert_deduplication_token"),
            insert_deduplicate: has("insert_deduplicate"),
            deduplicate_insert: has("deduplicate_insert"),
            dedup: ServerDedup {
                replicated_window: window("replicated_deduplication_window"),
                replicated_window_seconds: window("replicated_deduplication_window_seconds"),
                non_replicated_window: window("non_replicated_deduplication_window"),
                views_see_retries: has("deduplicate_blocks_in_dependent_materialized_views"),
            },
        };
        Ok(features)
    }

    /// A small read on this server, with the ingest credentials (the table catalog's
    /// too, so it needs no HTTP client of its own).
    pub async fn query(&self, sql: &str) -> Result<String, ClickHouseError> {
        self.query_within(sql, self.insert_timeout).await
    }

    async fn query_within(&self, sql: &str, timeout: Duration) -> Result<String, ClickHouseError> {
        let response = self
            .endpoint
            .post::<&str, &str>(&[], sql.to_string())
            .timeout(timeout)
            .send()
            .await
            .map_err(transport_error)?;
        if response.status().is_success() {
            return response.text().await.map_err(transport_error);
        }
        Err(read_error(response).await)
    }

    fn table_cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, (TableInfo, Instant)>> {
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn known_table(&self, table: &str) -> Option<TableInfo> {
        let cache = self.table_cache();
        let (info, at) = cache.get(table)?;
        (at.elapsed() < DEDUP_TTL).then(|| info.clone())
    }

    /// What `system.tables` says of `table`; `None`: it does not exist (not cached: the
    /// insert's answer decides what follows).
    async fn table_info(&self, table: &str) -> Result<Option<TableInfo>, ClickHouseError> {
        if let Some(known) = self.known_table(table) {
            return Ok(Some(known));
        }
        // Both are identifiers (checked by the configuration and the subject parser).
        let sql = format!(
            "SELECT {TABLE_INFO_COLUMNS} FROM system.tables WHERE database = '{}' AND name = '{table}' FORMAT JSONEachRow",
            self.database
        );
        let text = self.query(&sql).await.map_err(dedup_lookup_failed)?;
        let Some(line) = text.lines().find(|l| !l.trim().is_empty()) else {
            return Ok(None);
        };
        let info: TableInfo = serde_json::from_str(line).map_err(|e| {
            dedup_lookup_failed(classify::unreadable_answer(format!(
                "an unexpected line in system.tables ({e}): {line}"
            )))
        })?;
        self.table_cache()
            .insert(table.to_string(), (info.clone(), Instant::now()));
        Ok(Some(info))
    }

    /// `table`'s integer columns, from the cache or `system.columns` (none for a table
    /// that does not exist: the insert's own answer says so).
    async fn integer_columns(&self, table: &str) -> Result<Arc<IntegerColumns>, ClickHouseError> {
        let cached = {
            let cache = self.integers.lock().unwrap_or_else(|e| e.into_inner());
            cache
                .get(table)
                .filter(|(_, at)| at.elapsed() < DEDUP_TTL)
                .map(|(columns, _)| columns.clone())
        };
        if let Some(columns) = cached {
            return Ok(columns);
        }
        // Both are identifiers (checked by the configuration and the subject parser).
        let sql = format!(
            "{COLUMNS_SQL} WHERE database = '{}' AND table = '{table}' FORMAT TSV",
            self.database
        );
        let text = self.query(&sql).await.map_err(columns_lookup_failed)?;
        let columns = Arc::new(IntegerColumns::from_tsv(&text));
        self.integers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(table.to_owned(), (columns.clone(), Instant::now()));
        Ok(columns)
    }

    fn query_id(&self) -> String {
        let n = self.sequence.fetch_add(1, Ordering::Relaxed);
        format!("sluice-insert-{:08x}-{n}", self.instance)
    }

    /// An attempt ended without an answer after it went out: it may still run on the
    /// server. `KILL QUERY` for it, where the server still answers (a frozen or dead one
    /// does not: then it is killed with it), so a retry on another replica of the shard
    /// does not run beside it (the retry is deduplicated either way: same rows, same
    /// token, the shard's shared block ids).
    async fn kill_after_ambiguous(&self, query_id: &str, error: &ClickHouseError) {
        // `query_id` is Sluice's own: `sluice-insert-<hex>-<n>`.
        let sql = format!("KILL QUERY WHERE query_id = '{query_id}' SYNC");
        match self.query_within(&sql, self.kill_within).await {
            Ok(killed) => tracing::info!(pool = %self.target, replica = %self.replica, query_id,
                found = !killed.trim().is_empty(), error = %error,
                "an insert ended without an answer: KILL QUERY sent (its retry may go to another replica of the shard)"),
            Err(e) => tracing::info!(pool = %self.target, replica = %self.replica, query_id,
                error = %error, kill_error = %e,
                "an insert ended without an answer and the server does not answer KILL QUERY either"),
        }
    }
}

impl Inserter for HttpInserter {
    async fn insert(&self, request: InsertRequest) -> Result<(), ClickHouseError> {
        let features = self.features().await?;
        if may_be_out_of_range(&request.body) {
            let integers = self.integer_columns(&request.table.table).await?;
            if let Some(why) = integers.first_out_of_range(&request.body) {
                return Err(classify::from_code(OUT_OF_RANGE, None, why));
            }
        }
        // Each step of an insert, at TRACE: what a flight that never ends waits for.
        tracing::trace!(pool = %self.target, replica = %self.replica, table = %request.table.table,
            free = self.permits.available_permits(), "insert: waiting for a permit");
        let _permit = self.permits.acquire().await.map_err(|_| {
            classify::transport(NoAnswer::Refused, "the insert client is shutting down")
        })?;
        let sql = format!(
            "INSERT INTO `{}`.`{}` FORMAT JSONEachRow",
            self.database, request.table.table
        );
        let query_id = self.query_id();
        let mut params: Vec<(&str, &str)> = vec![("query", &sql), ("query_id", &query_id)];
        let token = request.dedup_token.clone();
        params.extend(pinned_settings(
            &features,
            token.as_deref(),
            request.skip_unknown_fields,
        ));
        tracing::trace!(pool = %self.target, replica = %self.replica, query_id, "insert: sending");
        let sent = self
            .endpoint
            .post(&params, request.body)
            .timeout(self.insert_timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/x-ndjson")
            .send()
            .await;
        tracing::trace!(pool = %self.target, replica = %self.replica, query_id,
            status = sent.as_ref().ok().map(|r| r.status().as_u16()), "insert: answered");
        let response = match sent {
            Ok(response) => response,
            Err(e) => {
                // A connection never made carried no insert; anything later may have.
                let maybe_running = !e.is_connect();
                let error = transport_error(e);
                if maybe_running {
                    self.kill_after_ambiguous(&query_id, &error).await;
                }
                return Err(self.after_failure(error));
            }
        };
        if response.status().is_success() {
            // Read the (empty) body so the connection goes back to the pool.
            let _ = response.bytes().await;
            return Ok(());
        }
        Err(self.after_failure(read_error(response).await))
    }

    async fn deduplicates(&self, table: &TableKey) -> Result<Dedup, ClickHouseError> {
        let server = self.features().await?.dedup.clone();
        let Some(info) = self.table_info(&table.table).await? else {
            return Ok(Dedup {
                exactly_once: false,
                why: "the table does not exist".into(),
                window: None,
            });
        };
        let need = self.redelivery.need(&table.tenant, &table.table);
        let dedup = dedup_of(&info, &server, &need);
        if !dedup.exactly_once {
            return Ok(dedup);
        }
        let Some(shard) = &self.shard else {
            return Ok(dedup);
        };
        match shard.not_one_table(&table.table).await {
            Some(why) => Ok(Dedup {
                exactly_once: false,
                why,
                window: dedup.window,
            }),
            None => Ok(dedup),
        }
    }

    async fn probe(&self) -> Result<ServerInfo, ClickHouseError> {
        let features = self.features().await?;
        // Features are remembered; the probe must still prove the server answers now.
        self.query("SELECT 1")
            .await
            .map_err(|e| self.after_failure(e))?;
        Ok(ServerInfo {
            version: features.version.clone(),
        })
    }
}

/// A failed lookup (features, a table's engine) judged no row, whatever its code: a proxy that lets only
/// inserts through, or a server that hides its system tables, can answer the lookup
/// with a code that would be a verdict on rows had an insert drawn it (60, 62...).
/// Returned as such, the batch would be bisected and every good row parked. So a
/// `Rejected` lookup is `Unknown` (back off, keep the rows), and no flag of a table or a
/// batch applies: the lookup is about the whole target.
fn lookup_failed(error: ClickHouseError) -> ClickHouseError {
    not_a_verdict(
        "asking the server which settings it knows (before any insert)",
        error,
    )
}

/// The same for the lookup of a table's column types (before its rows are sent).
fn columns_lookup_failed(error: ClickHouseError) -> ClickHouseError {
    not_a_verdict(
        "asking the server the table's column types (before its rows are sent)",
        error,
    )
}

/// The same for the lookup of whether a table deduplicates (before its batches are
/// formed).
fn dedup_lookup_failed(error: ClickHouseError) -> ClickHouseError {
    not_a_verdict(
        "asking the server whether the table deduplicates inserts (before its batch is formed)",
        error,
    )
}

fn not_a_verdict(what: &str, mut error: ClickHouseError) -> ClickHouseError {
    if error.class == Class::Rejected {
        error.class = Class::Unknown;
    }
    error.table_scoped = false;
    error.splittable = false;
    error.missing_table = false;
    error.message = format!("{what}: {}", error.message);
    error
}

// === impl TableSource for HttpInserter ===

impl super::catalog::TableSource for HttpInserter {
    async fn list_tables(&self, database: &str) -> Result<Vec<TableInfo>, String> {
        // `database` is an identifier (checked by the configuration): safe to quote.
        let sql = format!(
            "SELECT {TABLE_INFO_COLUMNS} FROM system.tables WHERE database = '{database}' FORMAT JSONEachRow"
        );
        let text = self.query(&sql).await.map_err(|e| e.message)?;
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str::<TableInfo>(l)
                    .map_err(|e| format!("an unexpected line in system.tables ({e}): {l}"))
            })
            .collect()
    }
}
