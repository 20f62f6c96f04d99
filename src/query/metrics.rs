//! The query gateway's metric names (a contract: DESIGN.md "Metrics") and the few
//! helpers that record them.
//!
//! Kept in this one file so they can be folded into the crate-wide metrics module
//! later without hunting for string literals.

use std::time::Duration;

/// Queries answered, by HTTP status (`status="200"`, `"404"`, `"503"`, `"504"`...).
/// The status code is the label because it is what a client saw, and its set is small.
pub const QUERY_TOTAL: &str = "sluice_query_total";
/// Retries sent to ClickHouse (an attempt after the first, each paid for by a token).
pub const QUERY_RETRIES_TOTAL: &str = "sluice_query_retries_total";
/// `KILL QUERY` statements that found the query still running and stopped it.
pub const QUERY_KILLED_TOTAL: &str = "sluice_query_killed_total";
/// Tokens left in the global retry budget.
pub const RETRY_BUDGET_TOKENS: &str = "sluice_retry_budget_tokens";
/// Time from a request's arrival to its status being decided, in seconds.
pub const QUERY_DURATION_SECONDS: &str = "sluice_query_duration_seconds";

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
