//! The shape of `config.toml`, exactly as operators write it.
//!
//! Every struct denies unknown fields, so a misspelt key is an error that names it and
//! its line instead of a setting silently ignored. Defaults live here, next to the key.
//! Secrets never appear in this file: a `*_env` key names the environment variable
//! that holds them.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::log_filter::LogFilter;
use super::units::{Share, Size, Span};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub nats: NatsFile,
    #[serde(default)]
    pub clickhouse: ClickHouseFile,
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantFile>,
    #[serde(default)]
    pub ingest: IngestFile,
    /// Per-table overrides of `[ingest]`, keyed `"tenant.table"`.
    #[serde(default)]
    pub tables: BTreeMap<String, TableFile>,
    #[serde(default)]
    pub pipeline: PipelineFile,
    #[serde(default)]
    pub api: ApiFile,
    #[serde(default)]
    pub admin: AdminFile,
    #[serde(default)]
    pub query: QueryFile,
    #[serde(default)]
    pub log: LogFile,
}

// === [nats] ===

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatsFile {
    pub url: String,
    /// The work-queue stream; subjects `<subject_prefix>.<tenant>.<table>`.
    pub stream: String,
    pub subject_prefix: String,
    /// The durable pull consumer shared by every Sluice instance.
    pub consumer: String,
    pub dlq_stream: String,
    pub dlq_subject_prefix: String,
    /// The ingest stream's budget: when full, publishes are refused (503), not dropped.
    pub max_bytes: Size,
    /// The DLQ's budget: when full, parking fails and the rows stay unacked.
    pub dlq_max_bytes: Size,
    /// How long JetStream remembers a message id (`Idempotency-Key`).
    pub duplicate_window: Span,
    pub ack_wait: Span,
    pub max_ack_pending: i64,
    /// Optional credentials: a user with a password from the environment, a token from
    /// the environment, or a `.creds` file.
    pub user: Option<String>,
    pub password_env: Option<String>,
    pub token_env: Option<String>,
    pub creds_file: Option<String>,
    /// Single-node servers take 1; a cluster can keep 3.
    pub replicas: usize,
    /// The key-value bucket where batch manifests are recorded (exactly-once).
    pub manifest_bucket: String,
    /// The manifest bucket's budget: when full, batches wait (records fail).
    pub manifest_max_bytes: Size,
    /// The key-value bucket of the ingest API's `Idempotency-Key` records.
    pub idempotency_bucket: String,
    /// Its budget: when full, keyed requests answer 503 until records expire.
    pub idempotency_max_bytes: Size,
    /// The server's own block compression of the ingest and DLQ streams (`s2`,
    /// nats-server 2.10 and later), on top of or instead of `[api] compression`.
    pub stream_compression: StreamCompression,
    /// How many streams the ingest queue is spread over, each with its own durable
    /// consumer and its own leader in a NATS cluster (1: the one `stream`).
    pub partitions: usize,
}

impl Default for NatsFile {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".into(),
            stream: "INGEST".into(),
            subject_prefix: "ingest".into(),
            consumer: "sluice".into(),
            dlq_stream: "DLQ".into(),
            dlq_subject_prefix: "dlq".into(),
            max_bytes: Size(1 << 30),
            dlq_max_bytes: Size(1 << 30),
            duplicate_window: Span(std::time::Duration::from_secs(120)),
            ack_wait: Span(std::time::Duration::from_secs(60)),
            max_ack_pending: 20_000,
            user: None,
            password_env: None,
            token_env: None,
            creds_file: None,
            replicas: 1,
            manifest_bucket: "SLUICE_MANIFESTS".into(),
            manifest_max_bytes: Size(256 << 20),
            idempotency_bucket: "SLUICE_IDEMPOTENCY".into(),
            idempotency_max_bytes: Size(256 << 20),
            stream_compression: StreamCompression::None,
            partitions: 1,
        }
    }
}

// === [clickhouse] ===

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClickHouseFile {
    #[serde(default)]
    pub targets: BTreeMap<String, TargetFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TargetFile {
    /// One server, or the replicas of one shard, comma-separated (unset, and no
    /// `shards`: the local default server).
    pub url: Option<String>,
    /// Shards, each the comma-separated URLs of its replicas (instead of `url`); `None`
    /// when not set, told apart from a list of none (`shards = []`, refused).
    pub shards: Option<Vec<String>>,
    pub user: String,
    pub password_env: Option<String>,
    pub database: String,
    pub insert_timeout: Span,
    pub connect_timeout: Span,
    /// Insert requests in flight to this target at once (the ingest workload class).
    pub insert_concurrency: usize,
    /// Idle keep-alive connections are dropped after this; keep it below the server's
    /// `keep_alive_timeout` (3 s by default) so a request never lands on a closing socket.
    pub pool_idle_timeout: Span,
}

impl Default for TargetFile {
    fn default() -> Self {
        Self {
            url: None,
            shards: None,
            user: "default".into(),
            password_env: None,
            database: "default".into(),
            insert_timeout: Span(std::time::Duration::from_secs(30)),
            connect_timeout: Span(std::time::Duration::from_secs(5)),
            insert_concurrency: 8,
            pool_idle_timeout: Span(std::time::Duration::from_secs(2)),
        }
    }
}

// === [tenants.<name>] ===

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantFile {
    /// The ClickHouse target this tenant's rows go to. A tenant without one has its
    /// rows parked on the DLQ.
    pub target: Option<String>,
    /// The environment variable holding this tenant's bearer token for the HTTP API.
    pub token_env: Option<String>,
}

// === [ingest] and [tables."tenant.table"] ===

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IngestFile {
    pub batch_rows: usize,
    pub batch_bytes: Size,
    pub batch_age: Span,
    pub dlq: bool,
    pub skip_unknown_fields: bool,
    /// How long rows wait for a table ClickHouse says does not exist before they are
    /// parked.
    pub missing_table_grace: Span,
    /// Record each batch of a deduplicating table in the manifest bucket before its
    /// first insert, so no row is inserted twice (`[ingest]` only: no per-table switch).
    pub exactly_once: bool,
}

impl Default for IngestFile {
    fn default() -> Self {
        Self {
            batch_rows: 10_000,
            batch_bytes: Size(8 << 20),
            batch_age: Span(std::time::Duration::from_secs(1)),
            dlq: true,
            skip_unknown_fields: false,
            missing_table_grace: Span(std::time::Duration::from_secs(600)),
            exactly_once: true,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableFile {
    pub batch_rows: Option<usize>,
    pub batch_bytes: Option<Size>,
    pub batch_age: Option<Span>,
    pub dlq: Option<bool>,
    pub skip_unknown_fields: Option<bool>,
    pub missing_table_grace: Option<Span>,
    /// The column whose value places each row on a shard (a table's own setting).
    pub shard_key: Option<String>,
}

// === [pipeline] ===

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineFile {
    /// Rows asked of the consumer per pull request (as messages, at the rows per
    /// message seen lately).
    pub pull_batch: usize,
    /// The most rows one instance holds pulled and not yet settled: a message carries
    /// one row or many, and `max_ack_pending` counts messages. Unset: as many rows as
    /// `[nats] max_ack_pending` counts messages.
    pub max_held_rows: Option<usize>,
    /// Flushes of one table in flight at once.
    pub max_inflight_flushes: usize,
    /// A table actor with nothing buffered for this long is stopped.
    pub idle_table_after: Span,
    /// On SIGTERM/SIGINT, buffers are flushed within this deadline; the rest is handed back.
    pub shutdown_deadline: Span,
    /// The outage backoff: the first delay, doubled on every failed probe up to the cap.
    pub backoff_initial: Span,
    pub backoff_max: Span,
}

impl Default for PipelineFile {
    fn default() -> Self {
        Self {
            pull_batch: 1000,
            max_held_rows: None,
            max_inflight_flushes: 2,
            idle_table_after: Span(std::time::Duration::from_secs(300)),
            shutdown_deadline: Span(std::time::Duration::from_secs(20)),
            backoff_initial: Span(std::time::Duration::from_secs(1)),
            backoff_max: Span(std::time::Duration::from_secs(30)),
        }
    }
}

// === [api] ===

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiFile {
    pub listen: String,
    /// `token`: the tenant comes from `Authorization: Bearer`, tokens mapped to tenants
    /// through `[tenants.<name>] token_env`. `none`: the tenant comes from `X-Tenant`.
    pub auth: AuthMode,
    pub max_request_bytes: Size,
    /// What the ingest requests in progress may hold together: each reserves twice its
    /// body before reading it (see `api::ingest::memory`).
    pub ingest_memory: Size,
    /// The largest row taken. Unset: 1 MiB, or `max_request_bytes` when that is
    /// smaller (a row is part of a request, so it is never larger).
    pub max_row_bytes: Option<Size>,
    /// The most rows of one request published as one NDJSON message: NATS costs per
    /// message, not per byte, so a request's rows travel in chunks.
    pub chunk_rows: usize,
    /// The most bytes of rows in one such message (at least `max_row_bytes`, so any
    /// row taken fits one); capped at what the NATS server takes in one message.
    pub chunk_bytes: Size,
    /// How the API stores each message in the stream: `zstd` (the default) or `none`.
    /// Rows compress about five times: the same `max_bytes` holds that much more of an
    /// outage's backlog.
    pub compression: CompressionMode,
    /// zstd's level (1 the fastest of the usual levels, 19 the smallest; -7 to -1
    /// faster still).
    pub compression_level: i32,
    /// A message shorter than this stays plain (a lone row saves little).
    pub compress_from: Size,
    /// Messages are compressed only while the ingest stream holds more than this share
    /// of `[nats] max_bytes` (a backlog: ClickHouse down or behind): compressing every
    /// message costs the pipeline a quarter more CPU per row for rows that stay in the
    /// stream a second. `0%`: every message.
    pub compress_above: Share,
    /// Answer 503 with this `Retry-After` when the queue is full or unreachable.
    pub retry_after: Span,
    /// How long a publish JetStream did not take (no stream leader during a NATS
    /// election, no ack in time) is sent again, with the same message id, before the
    /// request answers 503.
    pub publish_retry_for: Span,
    /// The deepest a row may nest arrays and objects (the row itself is level 1):
    /// ClickHouse's JSON parser recurses, and a deep enough row crashes the server.
    pub max_json_depth: usize,
    /// Distinct tables one tenant may write to (per process): each has an actor and
    /// metric series of its own.
    pub max_tables_per_tenant: usize,
    /// File descriptors kept free for NATS, ClickHouse and files, whatever the clients
    /// of both listeners hold: the connection caps come from the limit minus this.
    pub fd_reserve: usize,
    /// From a request's first byte to the end of its headers.
    pub header_timeout: Span,
    /// From the end of a request's headers to the end of its body.
    pub body_timeout: Span,
    /// A connection with no request in progress, or whose answer its client does not
    /// read, is closed after this.
    pub idle_timeout: Span,
    /// Connections open at once; further ones wait in the kernel's backlog. Unset: what
    /// the descriptor limit leaves after `fd_reserve` and the admin listener's cap.
    pub max_connections: Option<usize>,
}

impl Default for ApiFile {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            auth: AuthMode::Token,
            max_request_bytes: Size(10 << 20),
            ingest_memory: Size(128 << 20),
            max_row_bytes: None,
            chunk_rows: CHUNK_ROWS,
            chunk_bytes: Size(1 << 20),
            compression: CompressionMode::Zstd,
            compression_level: 1,
            compress_from: Size(512),
            compress_above: Share::percent(5),
            retry_after: Span(std::time::Duration::from_secs(5)),
            publish_retry_for: Span(std::time::Duration::from_secs(15)),
            max_json_depth: 64,
            max_tables_per_tenant: 500,
            fd_reserve: 256,
            header_timeout: HEADER_TIMEOUT,
            body_timeout: BODY_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            max_connections: None,
        }
    }
}

/// `[api] max_row_bytes` when unset (and `max_request_bytes` is not smaller).
pub const MAX_ROW_BYTES: Size = Size(1 << 20);

/// Rows per message of the ingest API by default: measured with `scripts/bench`'s `api`
/// phase (docs/benchmark.md, "Many rows per message").
const CHUNK_ROWS: usize = 100;

/// The timeouts both listeners start from.
const HEADER_TIMEOUT: Span = Span(std::time::Duration::from_secs(10));
const BODY_TIMEOUT: Span = Span(std::time::Duration::from_secs(30));
const IDLE_TIMEOUT: Span = Span(std::time::Duration::from_secs(60));

/// `[nats] stream_compression`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamCompression {
    None,
    S2,
}

/// `[api] compression`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompressionMode {
    Zstd,
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    Token,
    None,
}

// === [admin] ===

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminFile {
    pub listen: String,
    /// The environment variable holding the admin bearer token. Without a token the
    /// admin endpoint listens on loopback only.
    pub token_env: Option<String>,
    /// Lets `POST /admin/debug/panic/...` inject an actor panic (chaos tests). Off in
    /// production.
    pub fault_injection: bool,
    /// As under `[api]`.
    pub header_timeout: Span,
    pub body_timeout: Span,
    pub idle_timeout: Span,
    /// Probes, scrapes and an operator's page: a few connections are plenty.
    pub max_connections: usize,
}

impl Default for AdminFile {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9090".into(),
            token_env: Some("SLUICE_ADMIN_TOKEN".into()),
            fault_injection: false,
            header_timeout: HEADER_TIMEOUT,
            body_timeout: BODY_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            max_connections: 64,
        }
    }
}

// === [query] ===

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueryFile {
    /// The target whose URL and database queries go to; `None` disables `/v1/query`.
    pub target: Option<String>,
    /// Queries run as their own ClickHouse user, apart from ingest.
    pub user: Option<String>,
    pub password_env: Option<String>,
    pub default_timeout: Span,
    pub max_timeout: Span,
    /// ClickHouse's `max_execution_time` is the client deadline minus this margin, so
    /// the server normally stops the query first.
    pub server_margin: Span,
    /// Bounds the whole kill-and-confirm step after a deadline, so a 504 comes at most
    /// this long after the client's timeout; an unconfirmed kill is never retried.
    pub kill_timeout: Span,
    pub max_result_rows: u64,
    pub max_result_bytes: Size,
    /// Queries in flight at once (the query workload class), and per tenant.
    pub concurrency: usize,
    pub tenant_concurrency: usize,
    pub max_attempts: u32,
    pub backoff_base: Span,
    pub backoff_max: Span,
    /// The global retry budget: a token bucket every retry must take from.
    pub retry_budget: f64,
    pub retry_refill_per_sec: f64,
}

impl Default for QueryFile {
    fn default() -> Self {
        Self {
            target: None,
            user: None,
            password_env: None,
            default_timeout: Span(std::time::Duration::from_secs(10)),
            max_timeout: Span(std::time::Duration::from_secs(60)),
            server_margin: Span(std::time::Duration::from_millis(500)),
            kill_timeout: Span(std::time::Duration::from_secs(1)),
            max_result_rows: 100_000,
            max_result_bytes: Size(16 << 20),
            concurrency: 8,
            tenant_concurrency: 4,
            max_attempts: 3,
            backoff_base: Span(std::time::Duration::from_millis(100)),
            backoff_max: Span(std::time::Duration::from_secs(2)),
            retry_budget: 10.0,
            retry_refill_per_sec: 1.0,
        }
    }
}

// === [log] ===

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogFile {
    pub format: LogFormat,
    /// A `tracing` filter of levels, e.g. `info` or `info,sluice_actors=debug`.
    pub level: LogFilter,
}

impl Default for LogFile {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: LogFilter("info".into()),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}
