//! Metric names used by the binary crate; the actor crate's `metrics` module holds the
//! rest (and re-exported here, every name is reachable from one place).

pub use sluice_actors::metrics::*;

/// `POST /v1/ingest` requests by HTTP status.
pub const INGEST_REQUESTS: &str = "sluice_ingest_requests_total";
/// Rows the ingest API stored in the stream, by tenant and table.
pub const INGEST_ROWS: &str = "sluice_ingest_rows_total";
/// Rows the ingest API refused (bad JSON, not an object, too large), by tenant and table.
pub const INGEST_ROWS_REJECTED: &str = "sluice_ingest_rows_rejected_total";

pub fn describe() {
    use metrics::{describe_counter, Unit};
    describe_counter!(
        INGEST_REQUESTS,
        Unit::Count,
        "Ingest API requests, by HTTP status."
    );
    describe_counter!(
        INGEST_ROWS,
        Unit::Count,
        "Rows the ingest API stored in the stream, by tenant and table."
    );
    describe_counter!(
        INGEST_ROWS_REJECTED,
        Unit::Count,
        "Rows the ingest API refused, by tenant and table."
    );
}
