//! Logs and metrics: the `tracing` subscriber, the Prometheus recorder and the
//! per-table row totals read off it for the admin page.

pub mod logging;
pub mod metrics;
pub mod prometheus;
pub mod table_rows;
