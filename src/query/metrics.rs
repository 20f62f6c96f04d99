//! The few helpers the query gateway records its metrics with.

use std::time::Duration;

// The names live with every other metric name (`actors/src/metrics.rs`); the labels:
// `sluice_query_total{status}` is the HTTP status a client saw (a small set).
pub use crate::telemetry::metrics::{
    QUERY_DURATION as QUERY_DURATION_SECONDS, QUERY_KILLED as QUERY_KILLED_TOTAL,
    QUERY_RETRIES as QUERY_RETRIES_TOTAL, QUERY_TOTAL, RETRY_BUDGET_TOKENS,
};

/// Count one answered query and how long it took to decide its status.
pub fn answered(status: u16, elapsed: Duration) {
    metrics::counter!(QUERY_TOTAL, "status" => status.to_string()).increment(1);
    metrics::histogram!(QUERY_DURATION_SECONDS).record(elapsed.as_secs_f64());
}

pub fn retried() {
    metrics::counter!(QUERY_RETRIES_TOTAL).increment(1);
}

pub fn killed() {
    metrics::counter!(QUERY_KILLED_TOTAL).increment(1);
}

pub fn budget_tokens(tokens: f64) {
    metrics::gauge!(RETRY_BUDGET_TOKENS).set(tokens);
}
