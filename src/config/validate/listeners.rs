//! `[api]` and `[admin]`: the two HTTP listeners and the limits at their doors.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use super::{Check, Key};
use crate::config::file::{
    ApiFile, AuthMode, ClickHouseFile, FileConfig, QueryFile, MAX_ROW_BYTES,
};
use crate::config::units::{Size, Span};
use crate::config::{AdminConfig, ApiConfig, ListenerLimits, Secret, TenantConfig};

pub(super) fn api(
    c: &mut Check,
    file: &FileConfig,
    tenants: &BTreeMap<String, TenantConfig>,
) -> ApiConfig {
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
            "[api] auth is \"token\" (the default), but no tenant has a token: give each tenant one with token_env = \"<TENANT>_TOKEN\" under [tenants.<name>] (the variable holds the tenant's bearer token), or set [api] auth = \"none\" to take the tenant from an X-Tenant header (only behind a proxy that authenticates)",
        );
    }
    let max_row_bytes = row_limit(c, a, &section);
    sizes(c, a, &section, max_row_bytes);
    let why = "a row is level 1; ClickHouse's parser recurses once per level";
    c.one_to(&k("max_json_depth"), a.max_json_depth, MAX_JSON_DEPTH, why);
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
        compression: super::compression::api(c, a, &section),
        retry_after: a.retry_after.get(),
        publish_retry_for: a.publish_retry_for.get(),
        max_json_depth: a.max_json_depth,
        max_tables_per_tenant: a.max_tables_per_tenant,
        fd_reserve: a.fd_reserve,
        limits,
        max_connections: a.max_connections,
    }
}

/// `[api]`'s sizes agree: a request fits the memory, a row fits a chunk, a chunk fits
/// a NATS message.
fn sizes(c: &mut Check, a: &ApiFile, section: &Key, max_row_bytes: Size) {
    let k = |name: &str| section.key(name);
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
    let why = "the rows of a request published together as one NATS message";
    c.one_to(&k("chunk_rows"), a.chunk_rows, MAX_CHUNK_ROWS, why);
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
}

/// `[api] max_row_bytes`: as set, which may not exceed `max_request_bytes` (a row is
/// part of a request); unset, 1 MiB or `max_request_bytes` when that is smaller, so
/// lowering the request limit alone lowers the row limit with it.
fn row_limit(c: &mut Check, a: &ApiFile, section: &Key) -> Size {
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

pub(super) fn admin(c: &mut Check, file: &FileConfig) -> AdminConfig {
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
            "no admin token (set {}): the admin endpoint listens on loopback only, 127.0.0.1:{}",
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
