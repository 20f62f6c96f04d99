//! Metric names used by the binary crate; the actor crate's `metrics` module holds the
//! rest (and re-exported here, every name is reachable from one place).

use metrics::Unit;
pub use sluice_actors::metrics::*;
use sluice_actors::TableKey;

use crate::config::Config;

/// The query gateway's.
pub const QUERY_TOTAL: &str = "sluice_query_total";
pub const QUERY_RETRIES: &str = "sluice_query_retries_total";
pub const QUERY_KILLED: &str = "sluice_query_killed_total";
pub const RETRY_BUDGET_TOKENS: &str = "sluice_retry_budget_tokens";
pub const QUERY_DURATION: &str = "sluice_query_duration_seconds";

/// `POST /v1/ingest` requests by HTTP status.
pub const INGEST_REQUESTS: &str = "sluice_ingest_requests_total";
/// Rows the ingest API stored in the stream, by tenant and table.
pub const INGEST_ROWS: &str = "sluice_ingest_rows_total";
/// Messages the ingest API stored in the stream (each up to `[api] chunk_rows` rows),
/// by tenant and table: beside `INGEST_ROWS`, the rows per message NATS carries.
pub const INGEST_MESSAGES: &str = "sluice_ingest_messages_total";
/// Rows the ingest API refused (bad JSON, not an object, too large), by tenant and table.
pub const INGEST_ROWS_REJECTED: &str = "sluice_ingest_rows_rejected_total";
/// Bytes the ingest requests in progress have reserved of `[api] ingest_memory`.
pub const INGEST_MEMORY_RESERVED: &str = "sluice_ingest_memory_reserved_bytes";
/// Keyed ingest requests by what became of their `Idempotency-Key` (`claimed`,
/// `replayed`, `resumed`, `taken_over`, `in_progress`, `mismatch`, `unusable`; see
/// `api::ingest::idempotency::KeyOutcome`, which registers each at 0).
pub const INGEST_IDEMPOTENCY: &str = "sluice_ingest_idempotency_total";
/// Subjects other publishers use (`<subject_prefix>.<tenant>.<table>[.<key>]`) that
/// reached no stream of the queue when last asked (`nats::partitions::route_check`).
pub const NATS_SUBJECTS_ASTRAY: &str = "sluice_nats_subjects_astray";
/// Orphaned batch manifests the collector removed from the bucket, by reason
/// (`old_incarnation`, `acked`, `forgotten_after_reconnect`, `gone_from_stream`).
pub const MANIFESTS_COLLECTED: &str = "sluice_manifests_collected_total";

/// The statuses `POST /v1/ingest` answers with, registered at 0 at start (a status
/// left out here still appears when first answered, only not from 0).
pub const INGEST_STATUSES: &[u16] = &[202, 400, 401, 403, 404, 408, 409, 413, 415, 422, 503];

/// The statuses `POST /v1/query` answers with (see `query::errors`), registered at 0
/// when the gateway is on.
pub const QUERY_STATUSES: &[u16] = &[200, 400, 401, 403, 404, 408, 429, 502, 503, 504];

/// Registers at 0 every series whose labels the configuration tells before any traffic
/// (see [`sluice_actors::metrics::register_known`]), so that a scraper and an
/// `increase()` alert see each one before its first event.
pub fn register_known(config: &Config) {
    let tables: Vec<TableKey> = config
        .tables
        .keys()
        .map(|(tenant, table)| TableKey::new(tenant, table))
        .collect();
    let replicas: Vec<(String, String)> = config
        .targets
        .values()
        .flat_map(|t| {
            t.replica_names()
                .into_iter()
                .flatten()
                .map(|replica| (t.name.clone(), replica))
        })
        .collect();
    sluice_actors::metrics::register_known(
        replicas.iter().map(|(t, r)| (t.as_str(), r.as_str())),
        &config.nats.streams.stream,
        &tables,
    );
    // The ingest API's series of the tables configured by name: a table's first request
    // would otherwise make them at its own count, an increase no alert sees.
    for (tenant, table) in config.tables.keys() {
        let labels = [("tenant", tenant.clone()), ("table", table.clone())];
        for name in [INGEST_ROWS, INGEST_ROWS_REJECTED, INGEST_MESSAGES] {
            metrics::counter!(name, &labels).increment(0);
        }
    }
    for status in INGEST_STATUSES {
        metrics::counter!(INGEST_REQUESTS, "status" => status.to_string()).increment(0);
    }
    metrics::gauge!(INGEST_MEMORY_RESERVED).set(0.0);
    metrics::gauge!(NATS_SUBJECTS_ASTRAY).set(0.0);
    if config.query.is_some() {
        for status in QUERY_STATUSES {
            metrics::counter!(QUERY_TOTAL, "status" => status.to_string()).increment(0);
        }
        metrics::counter!(QUERY_RETRIES).increment(0);
        metrics::counter!(QUERY_KILLED).increment(0);
        // A histogram is registered by taking its handle; there is nothing to record.
        drop(metrics::histogram!(QUERY_DURATION));
    }
}

/// The metrics of the binary (the ingest API's, the collector's and the query
/// gateway's), described.
pub const BINARY_METRICS: &[Described] = &[
    gauge_in(INGEST_MEMORY_RESERVED, Unit::Bytes, "Bytes the ingest requests in progress have reserved of [api] ingest_memory (twice each body)."),
    counter(INGEST_REQUESTS, "Ingest API requests, by HTTP status."),
    counter(INGEST_ROWS, "Rows the ingest API stored in the stream, by tenant and table."),
    counter(MANIFESTS_COLLECTED, "Orphaned batch manifests removed by the collector, by reason."),
    counter(INGEST_MESSAGES, "Messages the ingest API stored in the stream (each carries up to [api] chunk_rows rows), by tenant and table."),
    counter(INGEST_ROWS_REJECTED, "Rows the ingest API refused, by tenant and table."),
    gauge(NATS_SUBJECTS_ASTRAY, "Subjects other publishers use that reached no stream of the queue when last asked (the nats-server's subject mapping does not match [nats] partitions)."),
    counter(INGEST_IDEMPOTENCY, "Keyed ingest requests by what became of their Idempotency-Key (claimed, replayed, resumed, taken_over, in_progress, mismatch, unusable)."),
    counter(QUERY_TOTAL, "Queries through the gateway, by status."),
    counter(QUERY_RETRIES, "Query retries spent from the retry budget."),
    counter(QUERY_KILLED, "Queries killed with KILL QUERY after a client timeout."),
    gauge(RETRY_BUDGET_TOKENS, "Tokens left in the query retry budget."),
    histogram_in(QUERY_DURATION, Unit::Seconds, "Duration of one gateway query."),
];

/// The design's metrics (docs/operations.md's table lists each): the actors' and the
/// query gateway's.
pub fn design_metrics() -> impl Iterator<Item = &'static str> {
    let query = [
        QUERY_TOTAL,
        QUERY_RETRIES,
        QUERY_KILLED,
        RETRY_BUDGET_TOKENS,
        QUERY_DURATION,
    ];
    sluice_actors::metrics::ACTOR_METRICS
        .iter()
        .map(|d| d.name)
        .chain(query)
}
