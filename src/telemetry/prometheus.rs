//! The Prometheus recorder behind `GET /metrics`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use super::table_rows::{TableRows, TappedRecorder};
use crate::config::Config;

/// What the installed recorder is read through.
pub struct Installed {
    /// Renders `GET /metrics`.
    pub handle: PrometheusHandle,
    /// Each table's row totals, for the admin page's rates.
    pub table_rows: Arc<TableRows>,
}

/// Install the global recorder (once per process), describe every metric and register
/// at 0 the series the configuration knows of.
pub fn install(config: &Config) -> anyhow::Result<Installed> {
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".into()),
            &[
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            ],
        )
        .context("histogram buckets")?
        .set_buckets_for_metric(
            Matcher::Full(sluice_actors::metrics::BATCH_ROWS.into()),
            &[
                1.0, 10.0, 100.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 50000.0,
            ],
        )
        .context("histogram buckets")?
        .build_recorder();
    let handle = recorder.handle();
    let table_rows = Arc::new(TableRows::default());
    metrics::set_global_recorder(TappedRecorder::new(recorder, table_rows.clone()))
        .context("installing the metrics recorder")?;
    super::metrics::describe(sluice_actors::metrics::ACTOR_METRICS);
    super::metrics::describe(super::metrics::BINARY_METRICS);
    super::metrics::register_known(config);
    // Histograms and summaries need periodic upkeep when no HTTP listener of the
    // exporter's own runs it.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(Installed { handle, table_rows })
}
