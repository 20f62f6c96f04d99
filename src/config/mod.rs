//! Configuration: `config.toml`, strict, with environment overrides and secrets read
//! from the environment.
//!
//! Loading happens in three steps, and every problem of all three is reported at once,
//! each with the line of the key it is about (or the variable that set it), so an
//! operator fixes them all in one pass:
//! 1. the file is parsed (`document.rs`);
//! 2. `SLUICE_<SECTION>_<KEY>` variables are applied (`env.rs`);
//! 3. the document is read strictly into the file's types (`file.rs`: an unknown key,
//!    a wrong type, a size or duration without a unit, an unknown choice is a problem),
//!    and the whole is checked (`validate.rs`).
//!
//! `schema.rs` reads the keys off the types, for the overrides and the documentation.

mod document;
mod env;
mod file;
mod key;
mod log_filter;
mod nats_url;
mod schema;
mod secret;
mod summary;
pub mod units;
mod validate;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use document::{Document, Problem};
pub use file::{AuthMode, LogFormat, StreamCompression};
pub use secret::Secret;
/// The name rules, one for every place a name is taken (see `sluice_actors::routing`).
pub use sluice_actors::routing::{
    is_table as is_table_name, is_tenant as is_tenant_name, MAX_NAME_LEN, TABLE_NAME_RULE,
    TENANT_NAME_RULE,
};

/// Why a configuration cannot be used: every problem found, each on its own line.
#[derive(Debug)]
pub struct ConfigError {
    pub source_name: String,
    pub problems: Vec<String>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        writeln!(
            f,
            "{}: {n} problem{}",
            self.source_name,
            if n == 1 { "" } else { "s" }
        )?;
        for p in &self.problems {
            for (i, line) in p.lines().enumerate() {
                if i == 0 {
                    writeln!(f, "  - {line}")?;
                } else {
                    writeln!(f, "    {line}")?;
                }
            }
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// The validated configuration Sluice runs with.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where it came from, for messages.
    pub source_name: String,
    pub nats: NatsConfig,
    pub targets: BTreeMap<String, TargetConfig>,
    pub tenants: BTreeMap<String, TenantConfig>,
    pub ingest: TableSettings,
    /// `[ingest] exactly_once`: batches of tables ClickHouse deduplicates are recorded
    /// in the manifest bucket before their first insert. Off: every table is
    /// at-least-once.
    pub exactly_once: bool,
    /// Per-table settings that differ from `[ingest]`, keyed by (tenant, table).
    pub tables: BTreeMap<(String, String), TableSettings>,
    pub pipeline: PipelineConfig,
    pub api: ApiConfig,
    pub admin: AdminConfig,
    pub query: Option<QueryConfig>,
    pub log: LogConfig,
    /// Things that work but are probably not what was meant.
    pub warnings: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct NatsConfig {
    /// The seed servers of `[nats] url` (one, or every node of a cluster), without
    /// credentials (refused there: they come from `auth`), so they can be printed and
    /// logged. Never empty once validated.
    pub seeds: Vec<String>,
    /// What the streams and the durable consumer are made of.
    pub streams: StreamSettings,
    pub auth: NatsAuth,
    /// The key-value bucket of batch manifests (exactly-once); its stream is
    /// `KV_<manifest_bucket>`.
    pub manifest_bucket: String,
    /// The manifest bucket's budget: a record that would pass it fails, and the batch
    /// waits (nothing is inserted unrecorded).
    pub manifest_max_bytes: u64,
    /// The key-value bucket of the ingest API's `Idempotency-Key` records; its stream
    /// is `KV_<idempotency_bucket>`.
    pub idempotency_bucket: String,
    /// The idempotency bucket's budget: past it a keyed request answers 503.
    pub idempotency_max_bytes: u64,
}

/// What the streams and the durable consumer are made of, from `[nats]`.
#[derive(Clone, Debug)]
pub struct StreamSettings {
    pub stream: String,
    pub subject_prefix: String,
    pub consumer: String,
    pub dlq_stream: String,
    pub dlq_subject_prefix: String,
    pub max_bytes: u64,
    pub dlq_max_bytes: u64,
    pub duplicate_window: Duration,
    pub ack_wait: Duration,
    pub max_ack_pending: i64,
    pub replicas: usize,
    /// `[nats] stream_compression`: the server compresses the ingest and DLQ streams'
    /// blocks (2.10 and later; Sluice refuses to start on an older server).
    pub stream_compression: StreamCompression,
    /// `[nats] partitions`: the ingest queue in this many streams (`<stream>_<n>`, on
    /// subjects `<subject_prefix>_part.<n>.>`), each with its durable consumer; 1: the
    /// one `stream` on `<subject_prefix>.>` (see `nats::partitions`).
    pub partitions: usize,
}

impl NatsConfig {
    /// The seeds as one line, for logs and `check-config`.
    pub fn seeds_text(&self) -> String {
        self.seeds.join(", ")
    }
}

#[derive(Clone, Debug)]
pub enum NatsAuth {
    None,
    UserPassword { user: String, password: Secret },
    Token(Secret),
    CredsFile(PathBuf),
}

#[derive(Clone, Debug)]
pub struct TargetConfig {
    pub name: String,
    /// The target's servers: its shards, each the URLs of its replicas
    /// (`http://host:port` or `https://...`, without credentials), in the order the
    /// configuration lists them (a batch's shard is recorded by its position). A target
    /// of one server is one shard of one replica.
    pub shards: Vec<Vec<String>>,
    pub user: String,
    pub password: Option<Secret>,
    pub database: String,
    pub insert_timeout: Duration,
    pub connect_timeout: Duration,
    pub insert_concurrency: usize,
    pub pool_idle_timeout: Duration,
}

impl TargetConfig {
    /// Every server's URL, shard by shard.
    pub fn urls(&self) -> impl Iterator<Item = &str> {
        self.shards.iter().flatten().map(String::as_str)
    }

    /// Whether the target is one server.
    pub fn is_single(&self) -> bool {
        self.urls().nth(1).is_none()
    }

    /// The servers as `check-config` shows them: the URL of a target of one server, or
    /// `2 shards x 2 replicas (shard 1: URL, URL; shard 2: URL, URL)`.
    pub fn layout(&self) -> String {
        if self.is_single() {
            return self.urls().next().unwrap_or_default().to_owned();
        }
        let n = self.shards.len();
        let per_shard = self.shards[0].len();
        let counts = if self.shards.iter().all(|s| s.len() == per_shard) {
            format!(
                "{n} shard{} x {per_shard} replica{}",
                if n == 1 { "" } else { "s" },
                if per_shard == 1 { "" } else { "s" }
            )
        } else {
            format!("{n} shards")
        };
        let shards: Vec<String> = self
            .shards
            .iter()
            .enumerate()
            .map(|(i, urls)| format!("shard {}: {}", i + 1, urls.join(", ")))
            .collect();
        format!("{counts} ({})", shards.join("; "))
    }

    /// Each server's name, shard by shard, as metrics (`replica`) and the admin tree
    /// show it: its `host:port`, or the target's name for a target of one server.
    pub fn replica_names(&self) -> Vec<Vec<String>> {
        if self.is_single() {
            return vec![vec![self.name.clone()]];
        }
        self.shards
            .iter()
            .map(|replicas| replicas.iter().map(|u| host_port(u)).collect())
            .collect()
    }
}

/// `host:port` of a server's URL (the port as written, or the scheme's default).
pub fn host_port(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(u) => format!(
            "{}:{}",
            u.host_str().unwrap_or_default(),
            u.port_or_known_default().unwrap_or_default()
        ),
        Err(_) => url.to_owned(),
    }
}

#[derive(Clone, Debug)]
pub struct TenantConfig {
    pub name: String,
    pub target: Option<String>,
    pub token: Option<Secret>,
}

/// How one table is batched, after `[ingest]` defaults and `[tables]` overrides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableSettings {
    pub batch_rows: usize,
    pub batch_bytes: usize,
    pub batch_age: Duration,
    pub dlq: bool,
    pub skip_unknown_fields: bool,
    pub missing_table_grace: Duration,
    /// On a target of several shards, the column whose value places each row.
    pub shard_key: Option<String>,
}

#[derive(Clone, Debug)]
pub struct PipelineConfig {
    pub pull_batch: usize,
    /// Rows pulled and not settled, at most (`max_ack_pending` counts messages).
    pub max_held_rows: usize,
    pub max_inflight_flushes: usize,
    pub idle_table_after: Duration,
    pub shutdown_deadline: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
}

#[derive(Clone, Debug)]
pub struct ApiConfig {
    pub listen: SocketAddr,
    pub auth: AuthMode,
    pub max_request_bytes: usize,
    /// The bytes all ingest requests in progress may hold at once (bodies as read and
    /// their rows as published): a request over it waits briefly, then gets 503.
    pub ingest_memory: usize,
    pub max_row_bytes: usize,
    /// A request's rows are published in NDJSON messages of at most this many rows and
    /// bytes (the bytes also capped by the NATS server's `max_payload`).
    pub chunk_rows: usize,
    pub chunk_bytes: usize,
    /// How each message is stored (`[api] compression`, `compression_level`,
    /// `compress_from`); `None`: plain.
    pub compression: Option<Compression>,
    pub retry_after: Duration,
    /// A publish JetStream did not take (a NATS election, a lost ack) is sent again with
    /// the same message id for this long before the request answers 503.
    pub publish_retry_for: Duration,
    /// Rows nested deeper are refused: ClickHouse's JSON parser recurses per level.
    pub max_json_depth: usize,
    /// Distinct tables a tenant may write to: each costs an actor and metric series.
    pub max_tables_per_tenant: usize,
    /// Descriptors left free for NATS, ClickHouse and files by the connection caps.
    pub fd_reserve: usize,
    pub limits: ListenerLimits,
    /// Connections at once; `None`: what the descriptor limit leaves, found at start.
    pub max_connections: Option<usize>,
}

#[derive(Clone, Debug)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    /// `None`: no token configured, so the admin endpoint is bound to loopback only.
    pub token: Option<Secret>,
    pub fault_injection: bool,
    pub limits: ListenerLimits,
    /// Connections at once.
    pub max_connections: usize,
}

/// What bounds the clients of one HTTP listener, so that slow or idle ones cannot hold
/// it (and the process's descriptors) forever.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerLimits {
    /// From a request's first byte to the end of its headers.
    pub header_timeout: Duration,
    /// From the end of a request's headers to the end of its body.
    pub body_timeout: Duration,
    /// No request in progress, or an answer the client does not read, for this long:
    /// the connection is closed.
    pub idle_timeout: Duration,
}

#[derive(Clone, Debug)]
pub struct QueryConfig {
    pub target: String,
    /// The target's servers (any shard: a `Distributed` table answers from any), each
    /// as (`host:port` name, URL).
    pub servers: Vec<(String, String)>,
    pub database: String,
    pub user: String,
    pub password: Option<Secret>,
    pub connect_timeout: Duration,
    pub default_timeout: Duration,
    pub max_timeout: Duration,
    pub server_margin: Duration,
    pub kill_timeout: Duration,
    pub max_result_rows: u64,
    pub max_result_bytes: u64,
    pub concurrency: usize,
    pub tenant_concurrency: usize,
    pub max_attempts: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    pub retry_budget: f64,
    pub retry_refill_per_sec: f64,
}

#[derive(Clone, Debug)]
pub struct LogConfig {
    pub format: LogFormat,
    pub level: String,
}

// === impl Config ===

impl Config {
    /// Load from a file (or from the environment alone when `path` is `None`), with
    /// the process environment for overrides and secrets.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let vars: BTreeMap<String, String> = std::env::vars().collect();
        match path {
            Some(path) => {
                let name = path.display().to_string();
                let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
                    source_name: name.clone(),
                    problems: vec![format!("cannot read the file: {e}")],
                })?;
                Self::from_parts(&name, &text, &vars)
            }
            None => Self::from_parts("environment (no config file)", "", &vars),
        }
    }

    /// Load from text and a given environment: what `load` does, testable.
    pub fn from_parts(
        source_name: &str,
        text: &str,
        vars: &BTreeMap<String, String>,
    ) -> Result<Config, ConfigError> {
        let doc = Document::parse(text);
        // Overrides from the environment; the variables that hold secrets are none.
        let mut secrets = doc.secret_variables();
        secrets.extend(file::FileConfig::default().admin.token_env);
        let (overrides, env_errors, warnings) = env::overrides(vars, &secrets);
        let literals: Vec<String> = overrides.iter().map(|o| o.value.to_string()).collect();
        let mut doc = doc.apply(&overrides, &literals);
        let mut refused = Vec::new();
        for (key, text) in env_errors {
            doc.problems.push(Problem::general(text));
            refused.push(key);
        }

        // Where each value came from, before `read` takes refused ones out.
        let origins = doc.origins();
        let read = doc.read();
        let mut problems = std::mem::take(&mut doc.problems);
        let checked = match read {
            // A file with a syntax error is not checked further: what was read of it
            // may not be what was written.
            Some(read) if !doc.broken => {
                refused.extend(read.refused);
                validate::validate(source_name, read.file, vars, warnings, &refused)
            }
            _ => Err(Vec::new()),
        };
        match checked {
            Ok(config) if problems.is_empty() => return Ok(config),
            Ok(_) => {}
            Err(more) => problems.extend(more),
        }
        // In the file's order; problems of no line (defaults, variables) after.
        problems.sort_by_key(|p| origins.first_line(p).unwrap_or(usize::MAX));
        Err(ConfigError {
            source_name: source_name.to_string(),
            problems: problems.iter().map(|p| origins.show(p)).collect(),
        })
    }

    /// The settings of one table: `[ingest]` with its `[tables."tenant.table"]` overrides.
    pub fn table_settings(&self, tenant: &str, table: &str) -> &TableSettings {
        self.tables
            .get(&(tenant.to_string(), table.to_string()))
            .unwrap_or(&self.ingest)
    }

    /// The tenant whose bearer token this is. Every tenant's token is compared, each in
    /// constant time, and no comparison decides whether the next one runs: how long it
    /// takes tells nothing about which tenant's token, or how much of one, was guessed.
    pub fn tenant_for_token(&self, token: &str) -> Option<&TenantConfig> {
        let mut found = None;
        for tenant in self.tenants.values() {
            let Some(secret) = &tenant.token else {
                continue;
            };
            // Tokens are distinct (validated), so at most one matches.
            if secret.matches(token) {
                found = Some(tenant);
            }
        }
        found
    }

    /// Why no row could ever land with this configuration (`sluice run` and `sluice
    /// check-config` refuse it): no tenant to send rows, no ClickHouse target to take
    /// them, or no tenant with a target (every row would be parked). `None` when rows
    /// have a way in.
    pub fn takes_no_row(&self) -> Option<String> {
        let missing = match (self.targets.is_empty(), self.tenants.is_empty()) {
            (true, true) => "no ClickHouse target and no tenant: add [clickhouse.targets.<name>] (url) and [tenants.<name>] with target = \"<name>\"",
            (false, true) => "no tenant: add [tenants.<name>] with target = \"<target>\" (and its token_env, with [api] auth = \"token\")",
            (true, false) => "no ClickHouse target: add [clickhouse.targets.<name>] (url) and name it as each tenant's target; without one every row is parked",
            (false, false) if self.tenants.values().all(|t| t.target.is_none()) => {
                "no tenant has a target: set target = \"<target>\" under [tenants.<name>]; without one a tenant's rows are all parked"
            }
            (false, false) => return None,
        };
        Some(format!(
            "{}: the configuration can take no row: {missing}",
            self.source_name
        ))
    }

    /// A short human summary for `sluice check-config` (no secrets).
    pub fn summary(&self) -> String {
        summary::summary(self)
    }
}

/// How the ingest API stores the messages it publishes (`[api] compression`,
/// `compression_level`, `compress_from`, `compress_above`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compression {
    /// zstd's level: 1 (fastest) to 19; negative levels are faster still.
    pub level: i32,
    /// A payload shorter than this stays plain: a frame's overhead and a compression
    /// context's setup outweigh what a single short row saves.
    pub from_bytes: usize,
    /// Messages are compressed only while the stream holds more than this share of its
    /// budget: a backlog, which is what compression makes room for. Compressing every
    /// message cost the pipeline a quarter more CPU per row (compressed by the API,
    /// decoded by the source: docs/benchmark.md, "Compressed messages"), for rows that
    /// leave the stream within a second. Zero: every message.
    pub while_above: units::Share,
}

#[cfg(test)]
mod tests;
