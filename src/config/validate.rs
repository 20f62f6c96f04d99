//! From the file's shape to the validated `Config`: every problem collected.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::file::{
    AuthMode, ClickHouseFile, FileConfig, IngestFile, NatsFile, QueryFile, TableFile,
};
use super::nats_url::hide_credentials;
use super::units::Span;
use super::{
    is_table_name, is_tenant_name, AdminConfig, ApiConfig, Config, ListenerLimits, LogConfig,
    NatsAuth, NatsConfig, PipelineConfig, QueryConfig, Secret, TableSettings, TargetConfig,
    TenantConfig,
};

/// Problems and warnings found along the way.
struct Check<'v> {
    vars: &'v BTreeMap<String, String>,
    problems: Vec<String>,
    warnings: Vec<String>,
}

impl Check<'_> {
    fn problem(&mut self, p: impl Into<String>) {
        self.problems.push(p.into());
    }

    fn warn(&mut self, w: impl Into<String>) {
        self.warnings.push(w.into());
    }

    /// The secret in the variable `key` names; a named variable that is not set is a
    /// problem (an empty value is allowed: an empty password is a choice).
    fn secret(&mut self, key: &str, var: &Option<String>) -> Option<Secret> {
        let var = var.as_ref()?;
        match self.vars.get(var) {
            Some(value) => Some(Secret::new(value.clone())),
            None => {
                self.problem(format!(
                    "{key} = \"{var}\", but the environment variable {var} is not set"
                ));
                None
            }
        }
    }

    fn positive(&mut self, key: &str, value: Duration) {
        if value.is_zero() {
            self.problem(format!("{key} must be longer than zero"));
        }
    }

    fn at_least(&mut self, key: &str, value: usize, min: usize) {
        if value < min {
            self.problem(format!("{key} = {value}: must be at least {min}"));
        }
    }

    fn listen(&mut self, key: &str, value: &str) -> SocketAddr {
        match value.parse::<SocketAddr>() {
            Ok(addr) => addr,
            Err(_) => {
                self.problem(format!(
                    "{key} = \"{value}\" is not an address like \"127.0.0.1:8080\" or \"[::]:8080\""
                ));
                SocketAddr::from(([127, 0, 0, 1], 0))
            }
        }
    }
}

pub(super) fn validate(
    source_name: &str,
    file: FileConfig,
    vars: &BTreeMap<String, String>,
    warnings: Vec<String>,
) -> Result<Config, Vec<String>> {
    let mut c = Check {
        vars,
        problems: Vec::new(),
        warnings,
    };

    let nats = nats(&mut c, &file);
    let targets = targets(&mut c, &file);
    let tenants = tenants(&mut c, &file, &targets);
    let ingest = table_settings(&mut c, "[ingest]", &file.ingest, &TableFile::default());
    let mut tables = BTreeMap::new();
    for (key, over) in &file.tables {
        let Some((tenant, table)) = key.split_once('.') else {
            c.problem(format!(
                "[tables.\"{key}\"]: the key must be \"tenant.table\", like [tables.\"acme.events\"]"
            ));
            continue;
        };
        if !is_tenant_name(tenant) || !is_table_name(table) {
            c.problem(format!(
                "[tables.\"{key}\"]: \"{tenant}\" or \"{table}\" is not a valid name (tenant [A-Za-z_][A-Za-z0-9_-]*, table [A-Za-z_][A-Za-z0-9_]*)"
            ));
            continue;
        }
        if !tenants.contains_key(tenant) {
            c.problem(format!(
                "[tables.\"{key}\"]: tenant \"{tenant}\" is not defined under [tenants]"
            ));
        }
        let settings = table_settings(&mut c, &format!("[tables.\"{key}\"]"), &file.ingest, over);
        tables.insert((tenant.to_string(), table.to_string()), settings);
    }
    let pipeline = pipeline(&mut c, &file, &nats);
    let api = api(&mut c, &file, &tenants);
    let admin = admin(&mut c, &file);
    let query = query(&mut c, &file, &targets);
    let log = LogConfig {
        format: file.log.format,
        level: file.log.level.clone(),
    };
    if tracing_subscriber::EnvFilter::try_new(&log.level).is_err() {
        c.problem(format!(
            "[log] level = \"{}\" is not a filter like \"info\" or \"info,sluice_actors=debug\"",
            log.level
        ));
    }

    // Cross-section advice.
    let slowest_insert = targets
        .values()
        .map(|t| t.insert_timeout)
        .max()
        .unwrap_or_default();
    if nats.ack_wait <= ingest.batch_age + slowest_insert {
        c.warn(format!(
            "[nats] ack_wait = {} is not longer than batch_age + insert_timeout ({}): a row could be redelivered while one slow insert still holds it (Sluice sends in-progress signals, but a longer ack_wait is safer)",
            humantime::format_duration(nats.ack_wait),
            humantime::format_duration(ingest.batch_age + slowest_insert)
        ));
    }
    if (nats.max_ack_pending as u64) < ingest.batch_rows as u64 {
        c.warn(format!(
            "[nats] max_ack_pending = {} is below [ingest] batch_rows = {}: batches will be flushed by age, never full",
            nats.max_ack_pending, ingest.batch_rows
        ));
    }

    chunk_advice(&mut c, &api, &nats, &ingest, &tables);

    if !c.problems.is_empty() {
        return Err(c.problems);
    }
    Ok(Config {
        source_name: source_name.to_string(),
        nats,
        targets,
        tenants,
        ingest,
        exactly_once: file.ingest.exactly_once,
        tables,
        pipeline,
        api,
        admin,
        query,
        log,
        warnings: c.warnings,
    })
}

fn nats(c: &mut Check, file: &FileConfig) -> NatsConfig {
    let n = &file.nats;
    if n.url.trim().is_empty() {
        c.problem("[nats] url is empty");
    }
    if let Some(hidden) = hide_credentials(&n.url) {
        c.problem(format!(
            "[nats] url = \"{hidden}\" carries credentials: put the user in `user` and the password in the variable named by `password_env`, or the token in the variable named by `token_env` (secrets never go in the URL)"
        ));
    }
    for (key, name) in [
        ("stream", &n.stream),
        ("consumer", &n.consumer),
        ("dlq_stream", &n.dlq_stream),
    ] {
        if !is_nats_name(name) {
            c.problem(format!(
                "[nats] {key} = \"{name}\" is not a valid JetStream name (letters, digits, _ and -)"
            ));
        }
    }
    for (key, prefix) in [
        ("subject_prefix", &n.subject_prefix),
        ("dlq_subject_prefix", &n.dlq_subject_prefix),
    ] {
        if !is_subject_prefix(prefix) {
            c.problem(format!(
                "[nats] {key} = \"{prefix}\" is not a subject prefix like \"ingest\" (tokens of letters, digits, _ and -, separated by dots; no wildcards)"
            ));
        }
    }
    if n.stream == n.dlq_stream {
        c.problem("[nats] stream and dlq_stream must differ");
    }
    if !is_nats_name(&n.manifest_bucket) {
        c.problem(format!(
            "[nats] manifest_bucket = \"{}\" is not a valid key-value bucket name (letters, digits, _ and -)",
            n.manifest_bucket
        ));
    }
    let bucket_stream = format!("KV_{}", n.manifest_bucket);
    if bucket_stream == n.stream || bucket_stream == n.dlq_stream {
        c.problem(format!(
            "[nats] manifest_bucket = \"{}\" is kept in stream {bucket_stream}, which is the name of another of Sluice's streams",
            n.manifest_bucket
        ));
    }
    idempotency_bucket(c, n);
    if n.manifest_max_bytes.bytes() < MIN_MANIFEST_BYTES {
        c.problem(format!(
            "[nats] manifest_max_bytes = {}: must be at least 1MiB (one manifest of a 10,000-row batch takes about 10KiB)",
            n.manifest_max_bytes
        ));
    }
    if n.subject_prefix == n.dlq_subject_prefix
        || n.subject_prefix
            .starts_with(&format!("{}.", n.dlq_subject_prefix))
        || n.dlq_subject_prefix
            .starts_with(&format!("{}.", n.subject_prefix))
    {
        c.problem("[nats] subject_prefix and dlq_subject_prefix must not overlap");
    }
    if n.max_bytes.bytes() == 0 || n.dlq_max_bytes.bytes() == 0 {
        c.problem("[nats] max_bytes and dlq_max_bytes must be above zero: they bound the queue and the DLQ");
    }
    c.positive("[nats] ack_wait", n.ack_wait.get());
    c.positive("[nats] duplicate_window", n.duplicate_window.get());
    if n.max_ack_pending <= 0 {
        c.problem(format!(
            "[nats] max_ack_pending = {}: must be above zero (it bounds the rows Sluice holds in memory)",
            n.max_ack_pending
        ));
    }
    if n.replicas == 0 || n.replicas > 5 {
        c.problem(format!("[nats] replicas = {}: must be 1 to 5", n.replicas));
    }
    let mut methods = 0;
    let mut auth = NatsAuth::None;
    if let Some(user) = &n.user {
        methods += 1;
        match c.secret("[nats] password_env", &n.password_env) {
            Some(password) => {
                auth = NatsAuth::UserPassword {
                    user: user.clone(),
                    password,
                }
            }
            None if n.password_env.is_none() => {
                c.problem("[nats] user is set without password_env")
            }
            None => {}
        }
    } else if n.password_env.is_some() {
        c.problem("[nats] password_env is set without user");
    }
    if n.token_env.is_some() {
        methods += 1;
        if let Some(token) = c.secret("[nats] token_env", &n.token_env) {
            auth = NatsAuth::Token(token);
        }
    }
    if let Some(path) = &n.creds_file {
        methods += 1;
        let path = PathBuf::from(path);
        if !path.is_file() {
            c.problem(format!(
                "[nats] creds_file = \"{}\" does not exist",
                path.display()
            ));
        }
        auth = NatsAuth::CredsFile(path);
    }
    if methods > 1 {
        c.problem("[nats] choose one of user/password_env, token_env or creds_file");
    }
    NatsConfig {
        url: n.url.clone(),
        stream: n.stream.clone(),
        subject_prefix: n.subject_prefix.clone(),
        consumer: n.consumer.clone(),
        dlq_stream: n.dlq_stream.clone(),
        dlq_subject_prefix: n.dlq_subject_prefix.clone(),
        max_bytes: n.max_bytes.bytes(),
        dlq_max_bytes: n.dlq_max_bytes.bytes(),
        duplicate_window: n.duplicate_window.get(),
        ack_wait: n.ack_wait.get(),
        max_ack_pending: n.max_ack_pending,
        auth,
        replicas: n.replicas,
        manifest_bucket: n.manifest_bucket.clone(),
        manifest_max_bytes: n.manifest_max_bytes.bytes(),
        idempotency_bucket: n.idempotency_bucket.clone(),
        idempotency_max_bytes: n.idempotency_max_bytes.bytes(),
    }
}

/// `[nats] idempotency_bucket` and `idempotency_max_bytes`: a bucket name whose stream
/// is none of Sluice's others, and room for more than a handful of records.
fn idempotency_bucket(c: &mut Check, n: &NatsFile) {
    if !is_nats_name(&n.idempotency_bucket) {
        c.problem(format!(
            "[nats] idempotency_bucket = \"{}\" is not a valid key-value bucket name (letters, digits, _ and -)",
            n.idempotency_bucket
        ));
    }
    let stream = format!("KV_{}", n.idempotency_bucket);
    if stream == n.stream || stream == n.dlq_stream || n.idempotency_bucket == n.manifest_bucket {
        c.problem(format!(
            "[nats] idempotency_bucket = \"{}\" is kept in stream {stream}, which is the name of another of Sluice's streams",
            n.idempotency_bucket
        ));
    }
    if n.idempotency_max_bytes.bytes() < MIN_IDEMPOTENCY_BYTES {
        c.problem(format!(
            "[nats] idempotency_max_bytes = {}: must be at least 1MiB (a record takes about 300 bytes, up to 16KiB with refused rows listed)",
            n.idempotency_max_bytes
        ));
    }
}

/// The smallest idempotency bucket budget taken.
const MIN_IDEMPOTENCY_BYTES: u64 = 1 << 20;

/// The smallest manifest bucket budget taken.
const MIN_MANIFEST_BYTES: u64 = 1 << 20;

fn targets(c: &mut Check, file: &FileConfig) -> BTreeMap<String, TargetConfig> {
    let mut out = BTreeMap::new();
    for (name, t) in &file.clickhouse.targets {
        let key = format!("[clickhouse.targets.{name}]");
        if !is_table_name(name) {
            c.problem(format!(
                "{key}: \"{name}\" is not a valid target name ([A-Za-z_][A-Za-z0-9_]*)"
            ));
        }
        match reqwest::Url::parse(&t.url) {
            Ok(url) if url.scheme() != "http" && url.scheme() != "https" => c.problem(format!(
                "{key} url = \"{}\": the scheme must be http or https (ClickHouse's HTTP interface)",
                t.url
            )),
            Ok(url) if !url.username().is_empty() || url.password().is_some() => {
                c.problem(format!(
                    "{key} url carries credentials: put the user in `user` and the password in the variable named by `password_env`"
                ))
            }
            Ok(url) if url.host_str().is_none() => {
                c.problem(format!("{key} url = \"{}\" has no host", t.url))
            }
            Ok(_) => {}
            Err(e) => c.problem(format!("{key} url = \"{}\" is not a URL: {e}", t.url)),
        }
        if !is_table_name(&t.database) {
            c.problem(format!(
                "{key} database = \"{}\" is not a valid name",
                t.database
            ));
        }
        if t.user.trim().is_empty() {
            c.problem(format!("{key} user is empty"));
        }
        c.positive(&format!("{key} insert_timeout"), t.insert_timeout.get());
        c.positive(&format!("{key} connect_timeout"), t.connect_timeout.get());
        c.at_least(
            &format!("{key} insert_concurrency"),
            t.insert_concurrency,
            1,
        );
        if t.pool_idle_timeout.get() >= Duration::from_secs(3) {
            c.warn(format!(
                "{key} pool_idle_timeout = {}: ClickHouse closes idle keep-alive connections after 3 s by default; keep this below the server's keep_alive_timeout",
                t.pool_idle_timeout
            ));
        }
        let password = c.secret(&format!("{key} password_env"), &t.password_env);
        out.insert(
            name.clone(),
            TargetConfig {
                name: name.clone(),
                url: t.url.trim_end_matches('/').to_string(),
                user: t.user.clone(),
                password,
                database: t.database.clone(),
                insert_timeout: t.insert_timeout.get(),
                connect_timeout: t.connect_timeout.get(),
                insert_concurrency: t.insert_concurrency,
                pool_idle_timeout: t.pool_idle_timeout.get(),
            },
        );
    }
    out
}

fn tenants(
    c: &mut Check,
    file: &FileConfig,
    targets: &BTreeMap<String, TargetConfig>,
) -> BTreeMap<String, TenantConfig> {
    let mut out = BTreeMap::new();
    for (name, t) in &file.tenants {
        let key = format!("[tenants.{name}]");
        if !is_tenant_name(name) {
            c.problem(format!(
                "{key}: \"{name}\" is not a valid tenant name ([A-Za-z_][A-Za-z0-9_-]*)"
            ));
        }
        match &t.target {
            Some(target) if !targets.contains_key(target) => c.problem(format!(
                "{key} target = \"{target}\", which is not defined under [clickhouse.targets] (defined: {})",
                names(targets.keys())
            )),
            Some(_) => {}
            None => c.warn(format!(
                "{key} has no target: its rows are parked on the DLQ"
            )),
        }
        let token = c.secret(&format!("{key} token_env"), &t.token_env);
        out.insert(
            name.clone(),
            TenantConfig {
                name: name.clone(),
                target: t.target.clone(),
                token,
            },
        );
    }
    let tokens: Vec<_> = out.values().filter_map(|t| t.token.as_ref()).collect();
    for (i, a) in tokens.iter().enumerate() {
        if tokens[i + 1..].iter().any(|b| a.expose() == b.expose()) {
            c.problem("two tenants share the same token: each tenant needs its own");
            break;
        }
    }
    out
}

fn table_settings(
    c: &mut Check,
    key: &str,
    defaults: &IngestFile,
    over: &TableFile,
) -> TableSettings {
    let s = TableSettings {
        batch_rows: over.batch_rows.unwrap_or(defaults.batch_rows),
        batch_bytes: over.batch_bytes.unwrap_or(defaults.batch_bytes).as_usize(),
        batch_age: over.batch_age.unwrap_or(defaults.batch_age).get(),
        dlq: over.dlq.unwrap_or(defaults.dlq),
        skip_unknown_fields: over
            .skip_unknown_fields
            .unwrap_or(defaults.skip_unknown_fields),
        missing_table_grace: over
            .missing_table_grace
            .unwrap_or(defaults.missing_table_grace)
            .get(),
    };
    c.at_least(&format!("{key} batch_rows"), s.batch_rows, 1);
    if s.batch_bytes < 1024 {
        c.problem(format!("{key} batch_bytes must be at least 1KiB"));
    }
    c.positive(&format!("{key} batch_age"), s.batch_age);
    s
}

/// What the ingest API's chunks mean for the stream and the tables: a message is never
/// split across inserts, and a publish bigger than the stream's budget never fits.
fn chunk_advice(
    c: &mut Check,
    api: &ApiConfig,
    nats: &NatsConfig,
    ingest: &TableSettings,
    tables: &BTreeMap<(String, String), TableSettings>,
) {
    if api.chunk_bytes as u64 > nats.max_bytes / 4 {
        c.warn(format!(
            "[api] chunk_bytes = {} is more than a quarter of [nats] max_bytes = {}: a request's message that big is refused (503) long before the stream is full",
            super::units::Size(api.chunk_bytes as u64),
            super::units::Size(nats.max_bytes)
        ));
    }
    let smallest = tables
        .iter()
        .map(|((tenant, table), s)| (format!("[tables.\"{tenant}.{table}\"]"), s.batch_rows))
        .chain([("[ingest]".to_string(), ingest.batch_rows)])
        .min_by_key(|(_, rows)| *rows);
    if let Some((key, rows)) = smallest.filter(|(_, rows)| *rows < api.chunk_rows) {
        c.warn(format!(
            "[api] chunk_rows = {} is above {key} batch_rows = {rows}: a message is never split across inserts, so that table's inserts will carry up to {} rows",
            api.chunk_rows, api.chunk_rows
        ));
    }
}

fn pipeline(c: &mut Check, file: &FileConfig, nats: &NatsConfig) -> PipelineConfig {
    let p = &file.pipeline;
    c.at_least("[pipeline] pull_batch", p.pull_batch, 1);
    let max_held_rows = p
        .max_held_rows
        .unwrap_or(usize::try_from(nats.max_ack_pending).unwrap_or(1).max(1));
    c.at_least("[pipeline] max_held_rows", max_held_rows, 1);
    if max_held_rows < file.ingest.batch_rows {
        c.warn(format!(
            "[pipeline] max_held_rows = {max_held_rows} is below [ingest] batch_rows = {}: batches will be flushed by age, never full",
            file.ingest.batch_rows
        ));
    }
    c.at_least("[pipeline] max_inflight_flushes", p.max_inflight_flushes, 1);
    c.positive("[pipeline] idle_table_after", p.idle_table_after.get());
    c.positive("[pipeline] shutdown_deadline", p.shutdown_deadline.get());
    c.positive("[pipeline] backoff_initial", p.backoff_initial.get());
    if p.backoff_max < p.backoff_initial {
        c.problem("[pipeline] backoff_max must be at least backoff_initial");
    }
    PipelineConfig {
        pull_batch: p.pull_batch,
        max_held_rows,
        max_inflight_flushes: p.max_inflight_flushes,
        idle_table_after: p.idle_table_after.get(),
        shutdown_deadline: p.shutdown_deadline.get(),
        backoff_initial: p.backoff_initial.get(),
        backoff_max: p.backoff_max.get(),
    }
}

fn api(c: &mut Check, file: &FileConfig, tenants: &BTreeMap<String, TenantConfig>) -> ApiConfig {
    let a = &file.api;
    let listen = c.listen("[api] listen", &a.listen);
    // A tenant whose token_env names a missing variable is reported with its tenant.
    if a.auth == AuthMode::Token
        && !file.tenants.values().any(|t| t.token_env.is_some())
        && !tenants.is_empty()
    {
        c.problem(
            "[api] auth is \"token\" (the default), but no tenant has a token: give each tenant one with token_env = \"SLUICE_TOKEN_<TENANT>\" under [tenants.<name>] (the variable holds the tenant's bearer token), or set [api] auth = \"none\" to take the tenant from an X-Tenant header (only behind a proxy that authenticates)",
        );
    }
    if a.max_row_bytes > a.max_request_bytes {
        c.problem("[api] max_row_bytes must not exceed max_request_bytes");
    }
    if a.max_request_bytes.bytes() == 0 {
        c.problem("[api] max_request_bytes must be above zero");
    }
    if a.ingest_memory < a.max_request_bytes {
        c.problem(format!(
            "[api] ingest_memory = {} is below max_request_bytes = {}: the largest request the API takes could never be read",
            a.ingest_memory, a.max_request_bytes
        ));
    }
    if !(1..=MAX_CHUNK_ROWS).contains(&a.chunk_rows) {
        c.problem(format!(
            "[api] chunk_rows = {}: must be 1 to {MAX_CHUNK_ROWS} (the rows of a request published together as one NATS message)",
            a.chunk_rows
        ));
    }
    if a.chunk_bytes < a.max_row_bytes {
        c.problem(format!(
            "[api] chunk_bytes = {} is below max_row_bytes = {}: a row the API takes must fit one message (raise chunk_bytes or lower max_row_bytes)",
            a.chunk_bytes, a.max_row_bytes
        ));
    }
    if a.chunk_bytes.bytes() > MAX_CHUNK_BYTES {
        c.problem(format!(
            "[api] chunk_bytes = {}: at most 64MiB (nats-server's largest max_payload)",
            a.chunk_bytes
        ));
    }
    if !(1..=MAX_JSON_DEPTH).contains(&a.max_json_depth) {
        c.problem(format!(
            "[api] max_json_depth = {}: must be 1 to {MAX_JSON_DEPTH} (a row is level 1; ClickHouse's parser recurses once per level)",
            a.max_json_depth
        ));
    }
    c.at_least("[api] max_tables_per_tenant", a.max_tables_per_tenant, 1);
    let held = descriptors_held(&file.clickhouse, &file.query);
    if a.fd_reserve < held {
        c.warn(format!(
            "[api] fd_reserve = {}: NATS and ClickHouse may hold about {held} descriptors at once with these targets; the HTTP clients could leave them too few",
            a.fd_reserve
        ));
    }
    let limits = listener_limits(
        c,
        "[api]",
        (a.header_timeout, a.body_timeout, a.idle_timeout),
    );
    if let Some(n) = a.max_connections {
        c.at_least("[api] max_connections", n, 1);
    }
    ApiConfig {
        listen,
        auth: a.auth,
        max_request_bytes: a.max_request_bytes.as_usize(),
        ingest_memory: a.ingest_memory.as_usize(),
        max_row_bytes: a.max_row_bytes.as_usize(),
        chunk_rows: a.chunk_rows,
        chunk_bytes: a.chunk_bytes.as_usize(),
        retry_after: a.retry_after.get(),
        max_json_depth: a.max_json_depth,
        max_tables_per_tenant: a.max_tables_per_tenant,
        fd_reserve: a.fd_reserve,
        limits,
        max_connections: a.max_connections,
    }
}

/// The most rows `[api] chunk_rows` may put in one message: its rows are settled
/// together (a message is acked when every row in it is), so they wait for each other.
const MAX_CHUNK_ROWS: usize = 100_000;

/// nats-server refuses a `max_payload` above 64 MiB.
const MAX_CHUNK_BYTES: u64 = 64 << 20;

/// The deepest `[api] max_json_depth` may be: as deep as current ClickHouse parses
/// (its `max_parser_depth`).
const MAX_JSON_DEPTH: usize = 1000;

/// Descriptors NATS and ClickHouse may hold at once: pooled and in-flight insert
/// connections per target, the query gateway's, NATS, and the process's own files.
fn descriptors_held(clickhouse: &ClickHouseFile, query: &QueryFile) -> usize {
    let inserts: usize = clickhouse
        .targets
        .values()
        .map(|t| t.insert_concurrency * 3)
        .sum();
    let queries = if query.target.is_some() {
        query.concurrency * 2
    } else {
        0
    };
    32 + inserts + queries
}

fn listener_limits(
    c: &mut Check,
    section: &str,
    (header, body, idle): (Span, Span, Span),
) -> ListenerLimits {
    c.positive(&format!("{section} header_timeout"), header.get());
    c.positive(&format!("{section} body_timeout"), body.get());
    c.positive(&format!("{section} idle_timeout"), idle.get());
    ListenerLimits {
        header_timeout: header.get(),
        body_timeout: body.get(),
        idle_timeout: idle.get(),
    }
}

fn admin(c: &mut Check, file: &FileConfig) -> AdminConfig {
    let a = &file.admin;
    let mut listen = c.listen("[admin] listen", &a.listen);
    let token = match &a.token_env {
        Some(var) => match c.vars.get(var) {
            Some(v) if !v.is_empty() => Some(Secret::new(v.clone())),
            _ => None,
        },
        None => None,
    };
    if token.is_none() && !listen.ip().is_loopback() {
        c.warn(format!(
            "no admin token (set {} ): the admin endpoint listens on loopback only, 127.0.0.1:{}",
            a.token_env.as_deref().unwrap_or("[admin] token_env"),
            listen.port()
        ));
        listen = SocketAddr::from(([127, 0, 0, 1], listen.port()));
    }
    if a.fault_injection {
        c.warn("[admin] fault_injection is on: POST /admin/debug/panic can crash actors (for chaos tests only)");
    }
    let limits = listener_limits(
        c,
        "[admin]",
        (a.header_timeout, a.body_timeout, a.idle_timeout),
    );
    c.at_least("[admin] max_connections", a.max_connections, 1);
    AdminConfig {
        listen,
        token,
        fault_injection: a.fault_injection,
        limits,
        max_connections: a.max_connections,
    }
}

fn query(
    c: &mut Check,
    file: &FileConfig,
    targets: &BTreeMap<String, TargetConfig>,
) -> Option<QueryConfig> {
    let q = &file.query;
    let target_name = q.target.as_ref()?;
    let Some(target) = targets.get(target_name) else {
        c.problem(format!(
            "[query] target = \"{target_name}\", which is not defined under [clickhouse.targets] (defined: {})",
            names(targets.keys())
        ));
        return None;
    };
    let (user, password) = match &q.user {
        Some(user) => (
            user.clone(),
            c.secret("[query] password_env", &q.password_env),
        ),
        None => {
            c.warn(format!(
                "[query] has no user of its own: queries run as the ingest user \"{}\" (a separate read-only user keeps the two workloads apart)",
                target.user
            ));
            (target.user.clone(), target.password.clone())
        }
    };
    c.positive("[query] default_timeout", q.default_timeout.get());
    if q.default_timeout > q.max_timeout {
        c.problem("[query] default_timeout must not exceed max_timeout");
    }
    if q.server_margin.get() >= q.default_timeout.get() {
        c.problem("[query] server_margin must be shorter than default_timeout, so ClickHouse stops the query before the client gives up");
    }
    c.positive("[query] kill_timeout", q.kill_timeout.get());
    c.at_least("[query] concurrency", q.concurrency, 1);
    c.at_least("[query] tenant_concurrency", q.tenant_concurrency, 1);
    if q.max_attempts == 0 {
        c.problem("[query] max_attempts must be at least 1");
    }
    if !(q.retry_budget >= 0.0 && q.retry_refill_per_sec >= 0.0) {
        c.problem("[query] retry_budget and retry_refill_per_sec must not be negative");
    }
    if q.backoff_max < q.backoff_base {
        c.problem("[query] backoff_max must be at least backoff_base");
    }
    Some(QueryConfig {
        target: target_name.clone(),
        url: target.url.clone(),
        database: target.database.clone(),
        user,
        password,
        connect_timeout: target.connect_timeout,
        default_timeout: q.default_timeout.get(),
        max_timeout: q.max_timeout.get(),
        server_margin: q.server_margin.get(),
        kill_timeout: q.kill_timeout.get(),
        max_result_rows: q.max_result_rows,
        max_result_bytes: q.max_result_bytes.bytes(),
        concurrency: q.concurrency,
        tenant_concurrency: q.tenant_concurrency,
        max_attempts: q.max_attempts,
        backoff_base: q.backoff_base.get(),
        backoff_max: q.backoff_max.get(),
        retry_budget: q.retry_budget,
        retry_refill_per_sec: q.retry_refill_per_sec,
    })
}

fn names<'a>(keys: impl Iterator<Item = &'a String>) -> String {
    let list: Vec<_> = keys.map(String::as_str).collect();
    if list.is_empty() {
        "none".into()
    } else {
        list.join(", ")
    }
}

/// JetStream stream and consumer names: no whitespace, dots, wildcards or separators.
fn is_nats_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn is_subject_prefix(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|token| {
            !token.is_empty()
                && token
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        })
}

pub(super) fn summary(config: &Config) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "configuration: {}", config.source_name);
    let n = &config.nats;
    let _ = writeln!(
        out,
        "nats: {} stream {} (subjects {}.<tenant>.<table>, max {}) dlq {} (subjects {}.<tenant>.<table>, max {}) consumer {} ack_wait {} max_ack_pending {}",
        n.url,
        n.stream,
        n.subject_prefix,
        super::units::Size(n.max_bytes),
        n.dlq_stream,
        n.dlq_subject_prefix,
        super::units::Size(n.dlq_max_bytes),
        n.consumer,
        humantime::format_duration(n.ack_wait),
        n.max_ack_pending
    );
    let _ = writeln!(
        out,
        "exactly-once: {} (manifests in bucket {}, max {})",
        if config.exactly_once {
            "on for tables ClickHouse deduplicates"
        } else {
            "off: every table at-least-once"
        },
        n.manifest_bucket,
        super::units::Size(n.manifest_max_bytes)
    );
    let _ = writeln!(
        out,
        "idempotency keys: records in bucket {} (max {})",
        n.idempotency_bucket,
        super::units::Size(n.idempotency_max_bytes)
    );
    let _ = writeln!(out, "targets:");
    if config.targets.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for t in config.targets.values() {
        let _ = writeln!(
            out,
            "  {}: {} user {} database {} password {} insert_timeout {} concurrency {}",
            t.name,
            t.url,
            t.user,
            t.database,
            if t.password.is_some() {
                "from env"
            } else {
                "none"
            },
            humantime::format_duration(t.insert_timeout),
            t.insert_concurrency
        );
    }
    let _ = writeln!(out, "tenants:");
    if config.tenants.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for t in config.tenants.values() {
        let _ = writeln!(
            out,
            "  {}: target {} token {}",
            t.name,
            t.target.as_deref().unwrap_or("(none: rows parked)"),
            if t.token.is_some() { "set" } else { "none" }
        );
    }
    let _ = writeln!(out, "tables:");
    let _ = writeln!(out, "  (default): {}", describe(&config.ingest));
    for ((tenant, table), s) in &config.tables {
        let _ = writeln!(out, "  {tenant}.{table}: {}", describe(s));
    }
    let _ = writeln!(
        out,
        "api: {} (auth {}) {}, connections {}; json depth {}, {} tables per tenant, {} descriptors reserved; rows published in messages of at most {} rows and {}",
        config.api.listen,
        match config.api.auth {
            AuthMode::Token => "token",
            AuthMode::None => "none: tenant from X-Tenant",
        },
        describe_limits(&config.api.limits),
        config
            .api
            .max_connections
            .map_or("from the descriptor limit".to_string(), |n| n.to_string()),
        config.api.max_json_depth,
        config.api.max_tables_per_tenant,
        config.api.fd_reserve,
        config.api.chunk_rows,
        super::units::Size(config.api.chunk_bytes as u64)
    );
    let _ = writeln!(
        out,
        "admin: {} (token {}) {}, connections {}",
        config.admin.listen,
        if config.admin.token.is_some() {
            "set"
        } else {
            "none: loopback only"
        },
        describe_limits(&config.admin.limits),
        config.admin.max_connections
    );
    match &config.query {
        Some(q) => {
            let _ = writeln!(
                out,
                "query: target {} user {} timeout {} (max {}) concurrency {} per tenant {} retries {} budget {}+{}/s",
                q.target,
                q.user,
                humantime::format_duration(q.default_timeout),
                humantime::format_duration(q.max_timeout),
                q.concurrency,
                q.tenant_concurrency,
                q.max_attempts.saturating_sub(1),
                q.retry_budget,
                q.retry_refill_per_sec
            );
        }
        None => {
            let _ = writeln!(out, "query: off (set [query] target to enable /v1/query)");
        }
    }
    for w in &config.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    out
}

fn describe_limits(l: &ListenerLimits) -> String {
    format!(
        "timeouts header {} body {} idle {}",
        humantime::format_duration(l.header_timeout),
        humantime::format_duration(l.body_timeout),
        humantime::format_duration(l.idle_timeout),
    )
}

fn describe(s: &TableSettings) -> String {
    format!(
        "batch_rows {} batch_bytes {} batch_age {} dlq {} skip_unknown_fields {} missing_table_grace {}",
        s.batch_rows,
        super::units::Size(s.batch_bytes as u64),
        humantime::format_duration(s.batch_age),
        if s.dlq { "on" } else { "off" },
        s.skip_unknown_fields,
        humantime::format_duration(s.missing_table_grace)
    )
}
