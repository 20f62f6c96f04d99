//! `sluice run`: the whole service from a validated configuration.
//!
//! Start order: metrics, NATS (retried in the background when it is not up yet: the
//! process starts and reports not-ready), the actor tree, then the two HTTP listeners.
//! Stop order on SIGTERM/SIGINT: stop taking HTTP requests, stop pulling, flush the
//! buffers within the deadline, hand back the rest, exit 0. A pipeline that cannot go
//! on (a core actor that cannot be restarted) exits 1, so the supervisor (systemd,
//! Kubernetes) restarts the process rather than leave it up doing nothing.

mod accept;
mod connection;
mod descriptors;
mod listeners;
mod memory;
mod pipeline;
mod signals;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;

use crate::clickhouse::clients::TargetClients;
use crate::config::Config;
use crate::config::StreamSettings;
use crate::nats::{self, IngestStreams};
use crate::telemetry;

pub use pipeline::PipelineAdapter;

/// Run until SIGTERM or SIGINT.
pub async fn run(config: Config) -> anyhow::Result<ExitCode> {
    run_until(config, signals::wait()).await
}

/// Run until `stop` resolves (with what stopped it, for the log) and then stop as on a
/// signal. For a caller that owns the signals itself: `sluice dev` must see Ctrl-C
/// even while its servers are still starting, and stop them after Sluice.
pub async fn run_until(
    config: Config,
    stop: impl std::future::Future<Output = &'static str>,
) -> anyhow::Result<ExitCode> {
    memory::keep_freed_memory();
    let config = Arc::new(config);
    for warning in &config.warnings {
        tracing::warn!("config: {warning}");
    }
    let installed = telemetry::prometheus::install(&config)?;

    let client = nats::connect(&config.nats, true).await?;
    let js = async_nats::jetstream::new(client.clone());
    let streams = config.nats.streams.clone();
    let connected = nats_at_start(&config, &client, &js, &streams).await?;
    // The ingest API's own context: enough ack permits for every publishing request's
    // window at once (see `api::ingest`), apart from the pipeline's DLQ publishes.
    let ingest_js = async_nats::jetstream::ContextBuilder::new()
        .max_ack_inflight(
            crate::api::ingest::MAX_PUBLISHING * crate::api::ingest::PIPELINE_WINDOW + 1024,
        )
        .build(client.clone());
    let ingest_publisher = IngestStreams::new(&ingest_js, &streams);
    // Streams of an earlier `[nats] partitions`: drained into these, then removed.
    tokio::spawn(nats::keep_retiring(
        js.clone(),
        streams.clone(),
        ingest_publisher.clone(),
    ));

    // One insert client per server of each target, shared by the actor tree and the
    // ingest API's table catalogs.
    let mut inserters = BTreeMap::new();
    for target in config.targets.values() {
        let clients = TargetClients::new(&config, target)
            .with_context(|| format!("setting up ClickHouse target {}", target.name))?;
        inserters.insert(target.name.clone(), Arc::new(clients));
    }
    // A crash on purpose, for the tests (never set in production): read once, for the
    // flights and the DLQ's replays alike.
    let failpoint = pipeline::failpoint_from_env();
    let pipeline =
        pipeline::start(&config, js.clone(), streams.clone(), &inserters, failpoint).await?;
    let adapter = Arc::new(PipelineAdapter::new(pipeline));

    // Whether other publishers' subjects reach the queue, asked now and every minute.
    let (routes, publisher_routes) = tokio::sync::watch::channel(None);
    tokio::spawn(nats::keep_checking_routes(
        client.clone(),
        streams.clone(),
        routes,
    ));

    // The listeners' stop: cancelled once the signal came (one token tree with the
    // pipeline's own, which stops the actors).
    let shutdown = tokio_util::sync::CancellationToken::new();
    let parts = listeners::Parts {
        inserters,
        publisher: ingest_publisher.clone(),
        dlq: nats::Dlq::new(js.clone(), streams.clone(), ingest_publisher).crashing_at(failpoint),
        pipeline: adapter.clone(),
        client: client.clone(),
        publisher_routes,
        metrics: installed.handle,
        table_rows: installed.table_rows,
    };
    let listeners = listeners::start(&config, parts, shutdown.clone())
        .await
        .context("starting the HTTP listeners")?;
    tracing::info!(
        api = %listeners.api,
        admin = %listeners.admin,
        nats = %config.nats.seeds_text(),
        "sluice is running"
    );

    let code = tokio::select! {
        signal = stop => {
            tracing::info!(%signal, "stopping");
            ExitCode::SUCCESS
        }
        why = adapter.handle().fatal() => {
            tracing::error!(reason = %why, "the pipeline cannot go on; exiting so the supervisor restarts sluice");
            ExitCode::FAILURE
        }
        failed = listeners.failed() => {
            tracing::error!(error = %failed, "an HTTP listener failed");
            ExitCode::FAILURE
        }
        // NATS was not reachable at the start: the same check once it is.
        why = nats::replicas_refused_once_connected(client.clone(), streams.replicas), if !connected => {
            tracing::error!(reason = %why, "sluice cannot start");
            ExitCode::FAILURE
        }
    };
    shutdown.cancel();
    stop_all(&adapter, listeners, &client).await;
    Ok(code)
}

/// NATS at the start: its version told (and warned of), the streams set up. Whether it
/// answered; an error when it cannot give the streams the replicas configured.
async fn nats_at_start(
    config: &Config,
    client: &async_nats::Client,
    js: &async_nats::jetstream::Context,
    streams: &StreamSettings,
) -> anyhow::Result<bool> {
    let connected = nats::wait_connected(client, std::time::Duration::from_secs(3)).await;
    if connected {
        let version = client.server_info().version;
        tracing::info!(server = %nats::version::describe(&version), "NATS server answered");
        if let Some(warning) = nats::version::warning(&version) {
            tracing::warn!("{warning}");
        }
        // No wait gives a single server more replicas: the start fails, with the reason
        // (rather than run unready while the API stores rows in the streams there are).
        let wait = std::time::Duration::from_secs(3);
        if let Some(why) = nats::replicas_beyond_server(client, streams.replicas, wait).await {
            anyhow::bail!(why);
        }
        if let Err(e) = nats::ensure_streams(js, streams).await {
            tracing::warn!(error = %format!("{e:#}"), "cannot set up the streams yet; retrying when the consumer connects");
        }
    } else {
        tracing::warn!(seeds = %config.nats.seeds_text(), "NATS is not reachable yet; retrying in the background (not ready until it is)");
    }
    Ok(connected)
}

/// The stop: the pipeline flushes and hands back, the listeners drain, the client
/// writes out its last acks and naks.
async fn stop_all(
    adapter: &PipelineAdapter,
    listeners: listeners::Listeners,
    client: &async_nats::Client,
) {
    let summary = adapter.handle().shutdown().await;
    tracing::info!(
        flushed = summary.rows_flushed,
        handed_back = summary.rows_handed_back,
        deadline_hit = summary.deadline_hit,
        took_ms = summary.took_ms,
        "stopped"
    );
    listeners.join().await;
    // Acks and naks are publishes: give the client a moment to write them out.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), client.flush()).await;
}
