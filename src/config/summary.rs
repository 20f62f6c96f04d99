//! What `sluice check-config` prints of a valid configuration: every setting that
//! shapes what Sluice does, as it will run (defaults and overrides applied), no secret.

use std::fmt::Write as _;

use super::units::Size;
use super::{AuthMode, Config, ListenerLimits, TableSettings};

pub fn summary(config: &Config) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "configuration: {}", config.source_name);
    nats_part(&mut out, config);
    routing_part(&mut out, config);
    listeners_part(&mut out, config);
    for w in &config.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    out
}

/// NATS: the streams, the ledger's and the keys' buckets, how messages are stored.
fn nats_part(out: &mut String, config: &Config) {
    let n = &config.nats;
    let s = &n.streams;
    let _ = writeln!(
        out,
        "nats: seeds {} replicas {} stream {} (subjects {}.<tenant>.<table>, max {}) dlq {} (subjects {}.<tenant>.<table>, max {}) consumer {} ack_wait {} max_ack_pending {}",
        n.seeds_text(),
        s.replicas,
        s.stream,
        s.subject_prefix,
        Size(s.max_bytes),
        s.dlq_stream,
        s.dlq_subject_prefix,
        Size(s.dlq_max_bytes),
        s.consumer,
        humantime::format_duration(s.ack_wait),
        s.max_ack_pending
    );
    if s.partitions > 1 {
        let _ = writeln!(
            out,
            "partitions: {} streams {}_0..{}_{} (subjects {}_part.<n>.<tenant>.<table>, max {} each), a consumer {} on each; publishers other than the API publish on {}.<tenant>.<table>[.<key>] through this mapping in the nats-server configuration:",
            s.partitions,
            s.stream,
            s.stream,
            s.partitions - 1,
            s.subject_prefix,
            Size(s.max_bytes / s.partitions as u64),
            s.consumer,
            s.subject_prefix
        );
        out.push_str(&sluice_actors::server_mapping(
            &s.subject_prefix,
            s.partitions,
        ));
    }
    let _ = writeln!(
        out,
        "exactly-once: {} (manifests in bucket {}, max {})",
        if config.exactly_once {
            "on for tables ClickHouse deduplicates"
        } else {
            "off: every table at-least-once"
        },
        n.manifest_bucket,
        Size(n.manifest_max_bytes)
    );
    let _ = writeln!(
        out,
        "idempotency keys: records in bucket {} (max {})",
        n.idempotency_bucket,
        Size(n.idempotency_max_bytes)
    );
    let _ = writeln!(
        out,
        "storage: messages {}; streams {}",
        match &config.api.compression {
            Some(c) if c.while_above.is_zero() => {
                format!("zstd level {} from {}", c.level, Size(c.from_bytes as u64))
            }
            Some(c) => format!(
                "zstd level {} from {} while the stream holds over {} of max_bytes (a backlog), plain otherwise",
                c.level,
                Size(c.from_bytes as u64),
                c.while_above
            ),
            None => "plain".into(),
        },
        match s.stream_compression {
            super::StreamCompression::S2 => "compressed by the server (s2, nats-server 2.10+)",
            super::StreamCompression::None => "not compressed by the server",
        }
    );
}

/// Where rows go: the ClickHouse targets, the tenants, the tables' settings.
fn routing_part(out: &mut String, config: &Config) {
    let targets = config.targets.values().map(|t| {
        format!(
            "{}: {} user {} database {} password {} insert_timeout {} concurrency {}",
            t.name,
            t.layout(),
            t.user,
            t.database,
            if t.password.is_some() {
                "from env"
            } else {
                "none"
            },
            humantime::format_duration(t.insert_timeout),
            t.insert_concurrency
        )
    });
    list(out, "targets", targets);
    let tenants = config.tenants.values().map(|t| {
        format!(
            "{}: target {} token {}",
            t.name,
            t.target.as_deref().unwrap_or("(none: rows parked)"),
            if t.token.is_some() { "set" } else { "none" }
        )
    });
    list(out, "tenants", tenants);
    let _ = writeln!(out, "tables:");
    let _ = writeln!(out, "  (default): {}", describe(&config.ingest));
    for ((tenant, table), s) in &config.tables {
        let _ = writeln!(out, "  {tenant}.{table}: {}", describe(s));
    }
}

/// `title:` and its items indented below it, or `(none)`.
fn list(out: &mut String, title: &str, items: impl Iterator<Item = String>) {
    let _ = writeln!(out, "{title}:");
    let mut none = true;
    for item in items {
        none = false;
        let _ = writeln!(out, "  {item}");
    }
    if none {
        let _ = writeln!(out, "  (none)");
    }
}

/// The HTTP surfaces: the API, the admin endpoint, the query gateway.
fn listeners_part(out: &mut String, config: &Config) {
    let _ = writeln!(
        out,
        "api: {} (auth {}) {}, connections {}; requests up to {}, rows up to {}, json depth {}, {} tables per tenant, {} descriptors reserved; rows published in messages of at most {} rows and {}",
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
        Size(config.api.max_request_bytes as u64),
        Size(config.api.max_row_bytes as u64),
        config.api.max_json_depth,
        config.api.max_tables_per_tenant,
        config.api.fd_reserve,
        config.api.chunk_rows,
        Size(config.api.chunk_bytes as u64)
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
    let shard_key = s
        .shard_key
        .as_ref()
        .map(|column| format!(" shard_key {column:?}"))
        .unwrap_or_default();
    format!(
        "batch_rows {} batch_bytes {} batch_age {} dlq {} skip_unknown_fields {} missing_table_grace {}{shard_key}",
        s.batch_rows,
        Size(s.batch_bytes as u64),
        humantime::format_duration(s.batch_age),
        if s.dlq { "on" } else { "off" },
        s.skip_unknown_fields,
        humantime::format_duration(s.missing_table_grace)
    )
}
