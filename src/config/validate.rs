//! From the file's shape to the validated `Config`: every problem collected, each
//! naming the keys it is about (so that it can be shown with their lines).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::document::Problem;
use super::file::{
    AuthMode, ClickHouseFile, FileConfig, IngestFile, QueryFile, TableFile, MAX_ROW_BYTES,
};
use super::key::Key;
use super::log_filter::LogFilter;
use super::nats_url::hide_credentials;
use super::units::{Size, Span};
use super::{
    is_table_name, is_tenant_name, AdminConfig, ApiConfig, Config, ListenerLimits, LogConfig,
    NatsAuth, NatsConfig, PipelineConfig, QueryConfig, Secret, TableSettings, TargetConfig,
    TenantConfig, TABLE_NAME_RULE, TENANT_NAME_RULE,
};

/// Problems and warnings found along the way.
struct Check<'v> {
    vars: &'v BTreeMap<String, String>,
    problems: Vec<Problem>,
    warnings: Vec<String>,
}

impl Check<'_> {
    fn problem(&mut self, keys: &[&Key], text: impl Into<String>) {
        self.problems.push(Problem::about(keys, text));
    }

    fn warn(&mut self, w: impl Into<String>) {
        self.warnings.push(w.into());
    }

    /// The secret in the variable `key` names; a named variable that is not set is a
    /// problem (an empty value is allowed: an empty password is a choice).
    fn secret(&mut self, key: &Key, var: &Option<String>) -> Option<Secret> {
        let var = var.as_ref()?;
        match self.vars.get(var) {
            Some(value) => Some(Secret::new(value.clone())),
            None => {
                self.problem(
                    &[key],
                    format!("{key} = \"{var}\", but the environment variable {var} is not set"),
                );
                None
            }
        }
    }

    fn positive(&mut self, key: &Key, value: Duration) {
        if value.is_zero() {
            self.problem(&[key], format!("{key} must be longer than zero"));
        }
    }

    fn at_least(&mut self, key: &Key, value: usize, min: usize) {
        if value < min {
            self.problem(&[key], format!("{key} = {value}: must be at least {min}"));
        }
    }

    fn listen(&mut self, key: &Key, value: &str) -> SocketAddr {
        match value.parse::<SocketAddr>() {
            Ok(addr) => addr,
            Err(_) => {
                self.problem(
                    &[key],
                    format!(
                        "{key} = \"{value}\" is not an address like \"127.0.0.1:8080\" or \"[::]:8080\""
                    ),
                );
                SocketAddr::from(([127, 0, 0, 1], 0))
            }
        }
    }
}

/// Check the whole. `refused` are keys whose values could not be read (already
/// reported, now at their defaults): problems involving them are left out, as they
/// would be about the defaults rather than what was written.
pub(super) fn validate(
    source_name: &str,
    file: FileConfig,
    vars: &BTreeMap<String, String>,
    warnings: Vec<String>,
    refused: &[Key],
) -> Result<Config, Vec<Problem>> {
    let mut c = Check {
        vars,
        problems: Vec::new(),
        warnings,
    };

    let nats = nats(&mut c, &file);
    let targets = targets(&mut c, &file);
    let tenants = tenants(&mut c, &file, &targets);
    let ingest_key = Key::table(["ingest"]);
    let ingest = table_settings(&mut c, &ingest_key, &file.ingest, &TableFile::default());
    let mut tables = BTreeMap::new();
    for (name, over) in &file.tables {
        let section = Key::table(["tables", name.as_str()]);
        let Some((tenant, table)) = name.split_once('.') else {
            c.problem(
                &[&section],
                format!(
                    "{section}: the key must be \"tenant.table\", like [tables.\"acme.events\"]"
                ),
            );
            continue;
        };
        if !is_tenant_name(tenant) || !is_table_name(table) {
            c.problem(
                &[&section],
                format!(
                    "{section}: \"{tenant}\" or \"{table}\" is not a valid name (tenant {TENANT_NAME_RULE}; table {TABLE_NAME_RULE})"
                ),
            );
            continue;
        }
        if !tenants.contains_key(tenant) {
            c.problem(
                &[&section],
                format!("{section}: tenant \"{tenant}\" is not defined under [tenants]"),
            );
        }
        let settings = table_settings(&mut c, &section, &file.ingest, over);
        tables.insert((tenant.to_string(), table.to_string()), settings);
    }
    let pipeline = pipeline(&mut c, &file, &nats);
    let api = api(&mut c, &file, &tenants);
    let admin = admin(&mut c, &file);
    let query = query(&mut c, &file, &targets);
    let log = log(&mut c, &file);

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

    let mut problems = c.problems;
    problems.retain(|p| !p.keys.iter().any(|k| refused.iter().any(|r| r.contains(k))));
    if !problems.is_empty() {
        return Err(problems);
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
    let section = Key::table(["nats"]);
    let k = |name: &str| section.key(name);
    if n.url.trim().is_empty() {
        c.problem(&[&k("url")], "[nats] url is empty");
    }
    if let Some(hidden) = hide_credentials(&n.url) {
        c.problem(
            &[&k("url")],
            format!(
                "[nats] url = \"{hidden}\" carries credentials: put the user in `user` and the password in the variable named by `password_env`, or the token in the variable named by `token_env` (secrets never go in the URL)"
            ),
        );
    }
    for (name, value) in [
        ("stream", &n.stream),
        ("consumer", &n.consumer),
        ("dlq_stream", &n.dlq_stream),
    ] {
        if !is_nats_name(value) {
            let key = k(name);
            c.problem(
                &[&key],
                format!(
                    "{key} = \"{value}\" is not a valid JetStream name (letters, digits, _ and -)"
                ),
            );
        }
    }
    for (name, prefix) in [
        ("subject_prefix", &n.subject_prefix),
        ("dlq_subject_prefix", &n.dlq_subject_prefix),
    ] {
        if !is_subject_prefix(prefix) {
            let key = k(name);
            c.problem(
                &[&key],
                format!(
                    "{key} = \"{prefix}\" is not a subject prefix like \"ingest\" (tokens of letters, digits, _ and -, separated by dots; no wildcards)"
                ),
            );
        }
    }
    if n.stream == n.dlq_stream {
        c.problem(
            &[&k("stream"), &k("dlq_stream")],
            "[nats] stream and dlq_stream must differ",
        );
    }
    if !is_nats_name(&n.manifest_bucket) {
        c.problem(
            &[&k("manifest_bucket")],
            format!(
                "[nats] manifest_bucket = \"{}\" is not a valid key-value bucket name (letters, digits, _ and -)",
                n.manifest_bucket
            ),
        );
    }
    let bucket_stream = format!("KV_{}", n.manifest_bucket);
    if bucket_stream == n.stream || bucket_stream == n.dlq_stream {
        c.problem(
            &[&k("manifest_bucket"), &k("stream"), &k("dlq_stream")],
            format!(
                "[nats] manifest_bucket = \"{}\" is kept in stream {bucket_stream}, which is the name of another of Sluice's streams",
                n.manifest_bucket
            ),
        );
    }
    if n.manifest_max_bytes.bytes() < MIN_MANIFEST_BYTES {
        c.problem(
            &[&k("manifest_max_bytes")],
            format!(
                "[nats] manifest_max_bytes = {}: must be at least 1MiB (one manifest of a 10,000-row batch takes about 10KiB)",
                n.manifest_max_bytes
            ),
        );
    }
    if n.subject_prefix == n.dlq_subject_prefix
        || n.subject_prefix
            .starts_with(&format!("{}.", n.dlq_subject_prefix))
        || n.dlq_subject_prefix
            .starts_with(&format!("{}.", n.subject_prefix))
    {
        c.problem(
            &[&k("subject_prefix"), &k("dlq_subject_prefix")],
            "[nats] subject_prefix and dlq_subject_prefix must not overlap",
        );
    }
    if n.max_bytes.bytes() == 0 || n.dlq_max_bytes.bytes() == 0 {
        c.problem(
            &[&k("max_bytes"), &k("dlq_max_bytes")],
            "[nats] max_bytes and dlq_max_bytes must be above zero: they bound the queue and the DLQ",
        );
    }
    c.positive(&k("ack_wait"), n.ack_wait.get());
    c.positive(&k("duplicate_window"), n.duplicate_window.get());
    if n.max_ack_pending <= 0 {
        c.problem(
            &[&k("max_ack_pending")],
            format!(
                "[nats] max_ack_pending = {}: must be above zero (it bounds the rows Sluice holds in memory)",
                n.max_ack_pending
            ),
        );
    }
    if n.replicas == 0 || n.replicas > 5 {
        c.problem(
            &[&k("replicas")],
            format!("[nats] replicas = {}: must be 1 to 5", n.replicas),
        );
    }
    let auth = nats_auth(c, file, &section);
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
    }
}

/// The one way of authenticating to NATS the section chooses.
fn nats_auth(c: &mut Check, file: &FileConfig, section: &Key) -> NatsAuth {
    let n = &file.nats;
    let k = |name: &str| section.key(name);
    let mut methods = 0;
    let mut auth = NatsAuth::None;
    if let Some(user) = &n.user {
        methods += 1;
        match c.secret(&k("password_env"), &n.password_env) {
            Some(password) => {
                auth = NatsAuth::UserPassword {
                    user: user.clone(),
                    password,
                }
            }
            None if n.password_env.is_none() => {
                c.problem(&[&k("user")], "[nats] user is set without password_env")
            }
            None => {}
        }
    } else if n.password_env.is_some() {
        c.problem(
            &[&k("password_env")],
            "[nats] password_env is set without user",
        );
    }
    if n.token_env.is_some() {
        methods += 1;
        if let Some(token) = c.secret(&k("token_env"), &n.token_env) {
            auth = NatsAuth::Token(token);
        }
    }
    if let Some(path) = &n.creds_file {
        methods += 1;
        let path = PathBuf::from(path);
        if !path.is_file() {
            c.problem(
                &[&k("creds_file")],
                format!("[nats] creds_file = \"{}\" does not exist", path.display()),
            );
        }
        auth = NatsAuth::CredsFile(path);
    }
    if methods > 1 {
        c.problem(
            &[&k("user"), &k("token_env"), &k("creds_file")],
            "[nats] choose one of user/password_env, token_env or creds_file",
        );
    }
    auth
}

/// The smallest manifest bucket budget taken.
const MIN_MANIFEST_BYTES: u64 = 1 << 20;

fn targets(c: &mut Check, file: &FileConfig) -> BTreeMap<String, TargetConfig> {
    let mut out = BTreeMap::new();
    for (name, t) in &file.clickhouse.targets {
        let section = Key::table(["clickhouse", "targets", name.as_str()]);
        let k = |key: &str| section.key(key);
        if !is_table_name(name) {
            c.problem(
                &[&section],
                format!("{section}: \"{name}\" is not a valid target name ({TABLE_NAME_RULE})"),
            );
        }
        let url = k("url");
        match reqwest::Url::parse(&t.url) {
            Ok(parsed) if parsed.scheme() != "http" && parsed.scheme() != "https" => c.problem(
                &[&url],
                format!(
                    "{url} = \"{}\": the scheme must be http or https (ClickHouse's HTTP interface)",
                    t.url
                ),
            ),
            Ok(parsed) if !parsed.username().is_empty() || parsed.password().is_some() => c
                .problem(
                    &[&url],
                    format!(
                        "{url} carries credentials: put the user in `user` and the password in the variable named by `password_env`"
                    ),
                ),
            Ok(parsed) if parsed.host_str().is_none() => {
                c.problem(&[&url], format!("{url} = \"{}\" has no host", t.url))
            }
            Ok(_) => {}
            Err(e) => c.problem(&[&url], format!("{url} = \"{}\" is not a URL: {e}", t.url)),
        }
        if !is_table_name(&t.database) {
            let key = k("database");
            c.problem(
                &[&key],
                format!(
                    "{key} = \"{}\" is not a valid name ({TABLE_NAME_RULE})",
                    t.database
                ),
            );
        }
        if t.user.trim().is_empty() {
            let key = k("user");
            c.problem(&[&key], format!("{key} is empty"));
        }
        c.positive(&k("insert_timeout"), t.insert_timeout.get());
        c.positive(&k("connect_timeout"), t.connect_timeout.get());
        c.at_least(&k("insert_concurrency"), t.insert_concurrency, 1);
        if t.pool_idle_timeout.get() >= Duration::from_secs(3) {
            c.warn(format!(
                "{} = {}: ClickHouse closes idle keep-alive connections after 3 s by default; keep this below the server's keep_alive_timeout",
                k("pool_idle_timeout"),
                t.pool_idle_timeout
            ));
        }
        let password = c.secret(&k("password_env"), &t.password_env);
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
        let section = Key::table(["tenants", name.as_str()]);
        if !is_tenant_name(name) {
            c.problem(
                &[&section],
                format!("{section}: \"{name}\" is not a valid tenant name ({TENANT_NAME_RULE})"),
            );
        }
        let target_key = section.key("target");
        match &t.target {
            Some(target) if !targets.contains_key(target) => c.problem(
                &[&target_key],
                format!(
                    "{target_key} = \"{target}\", which is not defined under [clickhouse.targets] (defined: {})",
                    names(targets.keys())
                ),
            ),
            Some(_) => {}
            None => c.warn(format!(
                "{section} has no target: its rows are parked on the DLQ"
            )),
        }
        let token = c.secret(&section.key("token_env"), &t.token_env);
        out.insert(
            name.clone(),
            TenantConfig {
                name: name.clone(),
                target: t.target.clone(),
                token,
            },
        );
    }
    let tokens: Vec<_> = out
        .values()
        .filter_map(|t| Some((&t.name, t.token.as_ref()?)))
        .collect();
    let shared = tokens.iter().enumerate().find_map(|(i, (a, token))| {
        let (b, _) = tokens[i + 1..]
            .iter()
            .find(|(_, other)| other.expose() == token.expose())?;
        Some((*a, *b))
    });
    if let Some((a, b)) = shared {
        let (a, b) = (
            Key::table(["tenants", a.as_str()]).key("token_env"),
            Key::table(["tenants", b.as_str()]).key("token_env"),
        );
        c.problem(
            &[&a, &b],
            "two tenants share the same token: each tenant needs its own",
        );
    }
    out
}

/// One table's settings: `over` where it says, `[ingest]` (`defaults`) elsewhere;
/// `section` is the table's own section, or `[ingest]` itself.
fn table_settings(
    c: &mut Check,
    section: &Key,
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
    // Each value is checked where it is written: [ingest]'s once, a table's own ones.
    let own = |set: bool| set || section.path() == ["ingest"];
    let k = |name: &str| section.key(name);
    if own(over.batch_rows.is_some()) {
        c.at_least(&k("batch_rows"), s.batch_rows, 1);
    }
    if own(over.batch_bytes.is_some()) && s.batch_bytes < 1024 {
        let key = k("batch_bytes");
        c.problem(&[&key], format!("{key} must be at least 1KiB"));
    }
    if own(over.batch_age.is_some()) {
        c.positive(&k("batch_age"), s.batch_age);
    }
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
            Size(api.chunk_bytes as u64),
            Size(nats.max_bytes)
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
    let section = Key::table(["pipeline"]);
    let k = |name: &str| section.key(name);
    c.at_least(&k("pull_batch"), p.pull_batch, 1);
    let max_held_rows = p
        .max_held_rows
        .unwrap_or(usize::try_from(nats.max_ack_pending).unwrap_or(1).max(1));
    c.at_least(&k("max_held_rows"), max_held_rows, 1);
    if max_held_rows < file.ingest.batch_rows {
        c.warn(format!(
            "[pipeline] max_held_rows = {max_held_rows} is below [ingest] batch_rows = {}: batches will be flushed by age, never full",
            file.ingest.batch_rows
        ));
    }
    c.at_least(&k("max_inflight_flushes"), p.max_inflight_flushes, 1);
    c.positive(&k("idle_table_after"), p.idle_table_after.get());
    c.positive(&k("shutdown_deadline"), p.shutdown_deadline.get());
    c.positive(&k("backoff_initial"), p.backoff_initial.get());
    if p.backoff_max < p.backoff_initial {
        c.problem(
            &[&k("backoff_max"), &k("backoff_initial")],
            "[pipeline] backoff_max must be at least backoff_initial",
        );
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
    let section = Key::table(["api"]);
    let k = |name: &str| section.key(name);
    let listen = c.listen(&k("listen"), &a.listen);
    // A tenant whose token_env names a missing variable is reported with its tenant.
    if a.auth == AuthMode::Token
        && !file.tenants.values().any(|t| t.token_env.is_some())
        && !tenants.is_empty()
    {
        c.problem(
            &[&k("auth")],
            "[api] auth is \"token\" (the default), but no tenant has a token: give each tenant one with token_env = \"SLUICE_TOKEN_<TENANT>\" under [tenants.<name>] (the variable holds the tenant's bearer token), or set [api] auth = \"none\" to take the tenant from an X-Tenant header (only behind a proxy that authenticates)",
        );
    }
    let max_row_bytes = row_limit(c, a, &section);
    if a.max_request_bytes.bytes() == 0 {
        c.problem(
            &[&k("max_request_bytes")],
            "[api] max_request_bytes must be above zero",
        );
    }
    if a.ingest_memory < a.max_request_bytes {
        c.problem(
            &[&k("ingest_memory"), &k("max_request_bytes")],
            format!(
                "[api] ingest_memory = {} is below max_request_bytes = {}: the largest request the API takes could never be read",
                a.ingest_memory, a.max_request_bytes
            ),
        );
    }
    if !(1..=MAX_CHUNK_ROWS).contains(&a.chunk_rows) {
        c.problem(
            &[&k("chunk_rows")],
            format!(
                "[api] chunk_rows = {}: must be 1 to {MAX_CHUNK_ROWS} (the rows of a request published together as one NATS message)",
                a.chunk_rows
            ),
        );
    }
    if a.chunk_bytes < max_row_bytes {
        c.problem(
            &[&k("chunk_bytes"), &k("max_row_bytes"), &k("max_request_bytes")],
            format!(
                "[api] chunk_bytes = {} is below max_row_bytes = {max_row_bytes}: a row the API takes must fit one message (raise chunk_bytes or lower max_row_bytes)",
                a.chunk_bytes
            ),
        );
    }
    if a.chunk_bytes.bytes() > MAX_CHUNK_BYTES {
        c.problem(
            &[&k("chunk_bytes")],
            format!(
                "[api] chunk_bytes = {}: at most 64MiB (nats-server's largest max_payload)",
                a.chunk_bytes
            ),
        );
    }
    if !(1..=MAX_JSON_DEPTH).contains(&a.max_json_depth) {
        c.problem(
            &[&k("max_json_depth")],
            format!(
                "[api] max_json_depth = {}: must be 1 to {MAX_JSON_DEPTH} (a row is level 1; ClickHouse's parser recurses once per level)",
                a.max_json_depth
            ),
        );
    }
    c.at_least(&k("max_tables_per_tenant"), a.max_tables_per_tenant, 1);
    let held = descriptors_held(&file.clickhouse, &file.query);
    if a.fd_reserve < held {
        c.warn(format!(
            "[api] fd_reserve = {}: NATS and ClickHouse may hold about {held} descriptors at once with these targets; the HTTP clients could leave them too few",
            a.fd_reserve
        ));
    }
    let limits = listener_limits(
        c,
        &section,
        (a.header_timeout, a.body_timeout, a.idle_timeout),
    );
    if let Some(n) = a.max_connections {
        c.at_least(&k("max_connections"), n, 1);
    }
    ApiConfig {
        listen,
        auth: a.auth,
        max_request_bytes: a.max_request_bytes.as_usize(),
        ingest_memory: a.ingest_memory.as_usize(),
        max_row_bytes: max_row_bytes.as_usize(),
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

/// `[api] max_row_bytes`: as set, which may not exceed `max_request_bytes` (a row is
/// part of a request); unset, 1 MiB or `max_request_bytes` when that is smaller, so
/// lowering the request limit alone lowers the row limit with it.
fn row_limit(c: &mut Check, a: &super::file::ApiFile, section: &Key) -> Size {
    match a.max_row_bytes {
        Some(row) if row > a.max_request_bytes => {
            let (key, request) = (
                section.key("max_row_bytes"),
                section.key("max_request_bytes"),
            );
            c.problem(
                &[&key, &request],
                format!(
                    "{key} = {row} is above max_request_bytes = {}: a row is part of a request, so it cannot be larger (lower max_row_bytes or raise max_request_bytes; left unset, max_row_bytes is {MAX_ROW_BYTES}, or max_request_bytes when that is smaller)",
                    a.max_request_bytes
                ),
            );
            row
        }
        Some(row) => row,
        None => MAX_ROW_BYTES.min(a.max_request_bytes),
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
    section: &Key,
    (header, body, idle): (Span, Span, Span),
) -> ListenerLimits {
    c.positive(&section.key("header_timeout"), header.get());
    c.positive(&section.key("body_timeout"), body.get());
    c.positive(&section.key("idle_timeout"), idle.get());
    ListenerLimits {
        header_timeout: header.get(),
        body_timeout: body.get(),
        idle_timeout: idle.get(),
    }
}

fn admin(c: &mut Check, file: &FileConfig) -> AdminConfig {
    let a = &file.admin;
    let section = Key::table(["admin"]);
    let mut listen = c.listen(&section.key("listen"), &a.listen);
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
        &section,
        (a.header_timeout, a.body_timeout, a.idle_timeout),
    );
    c.at_least(&section.key("max_connections"), a.max_connections, 1);
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
    let section = Key::table(["query"]);
    let k = |name: &str| section.key(name);
    let target_name = q.target.as_ref()?;
    let Some(target) = targets.get(target_name) else {
        c.problem(
            &[&k("target")],
            format!(
                "[query] target = \"{target_name}\", which is not defined under [clickhouse.targets] (defined: {})",
                names(targets.keys())
            ),
        );
        return None;
    };
    let (user, password) = match &q.user {
        Some(user) => (user.clone(), c.secret(&k("password_env"), &q.password_env)),
        None => {
            c.warn(format!(
                "[query] has no user of its own: queries run as the ingest user \"{}\" (a separate read-only user keeps the two workloads apart)",
                target.user
            ));
            (target.user.clone(), target.password.clone())
        }
    };
    c.positive(&k("default_timeout"), q.default_timeout.get());
    if q.default_timeout > q.max_timeout {
        c.problem(
            &[&k("default_timeout"), &k("max_timeout")],
            "[query] default_timeout must not exceed max_timeout",
        );
    }
    if q.server_margin.get() >= q.default_timeout.get() {
        c.problem(
            &[&k("server_margin"), &k("default_timeout")],
            "[query] server_margin must be shorter than default_timeout, so ClickHouse stops the query before the client gives up",
        );
    }
    c.positive(&k("kill_timeout"), q.kill_timeout.get());
    c.at_least(&k("concurrency"), q.concurrency, 1);
    c.at_least(&k("tenant_concurrency"), q.tenant_concurrency, 1);
    if q.max_attempts == 0 {
        c.problem(
            &[&k("max_attempts")],
            "[query] max_attempts must be at least 1",
        );
    }
    if !(q.retry_budget >= 0.0 && q.retry_refill_per_sec >= 0.0) {
        c.problem(
            &[&k("retry_budget"), &k("retry_refill_per_sec")],
            "[query] retry_budget and retry_refill_per_sec must not be negative",
        );
    }
    if q.backoff_max < q.backoff_base {
        c.problem(
            &[&k("backoff_max"), &k("backoff_base")],
            "[query] backoff_max must be at least backoff_base",
        );
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

/// `[log]`, whose level was checked as it was read; `RUST_LOG`, which takes its place
/// when set, is checked by the same rule (a typo there silences the service as well).
fn log(c: &mut Check, file: &FileConfig) -> LogConfig {
    if let Some(rust_log) = c.vars.get("RUST_LOG").filter(|v| !v.trim().is_empty()) {
        if let Err(why) = LogFilter::parse(rust_log) {
            c.problem(
                &[],
                format!("RUST_LOG (set, it takes the place of [log] level): {why}"),
            );
        }
    }
    LogConfig {
        format: file.log.format,
        level: file.log.level.0.clone(),
    }
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
