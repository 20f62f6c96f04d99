//! Logs and metrics: the `tracing` subscriber and the Prometheus recorder.

pub mod logging;
pub mod metrics;
pub mod prometheus;
