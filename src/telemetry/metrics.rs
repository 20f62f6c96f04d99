//! Metric names used by the binary crate (the actor crate holds the rest).

/// `POST /v1/ingest` requests by HTTP status.
pub const INGEST_REQUESTS: &str = "sluice_ingest_requests_total";
/// Rows the ingest API stored in the stream, by tenant and table.
pub const INGEST_ROWS: &str = "sluice_ingest_rows_total";
/// Rows the ingest API refused (bad JSON, not an object, too large), by tenant and table.
pub const INGEST_ROWS_REJECTED: &str = "sluice_ingest_rows_rejected_total";
