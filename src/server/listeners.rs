//! The two HTTP listeners: the API (ingest, query) and the admin endpoint, each with
//! its timeouts and connection cap (`accept`, `connection`), the caps leaving a reserve
//! of descriptors (`descriptors`).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::task::JoinHandle;

use super::connection::Bounds;
use super::descriptors::{self, Caps};
use super::{accept, PipelineAdapter};
use crate::admin::{self, AdminState, NatsView};
use crate::api::ingest::idempotency::{self, Idempotency};
use crate::api::ingest::{self, ChunkLimits, IngestState, TenantTables};
use crate::api::ApiState;
use crate::clickhouse::catalog::{self, Catalog};
use crate::clickhouse::clients::TargetCatalog;
use crate::clickhouse::clients::TargetClients;
use crate::config::Config;
use crate::http::tenant::TenantResolver;
use crate::nats::{Dlq, IngestStreams, KeyStore, KeyStoreSettings, LandedChunks, PublisherRoutes};
use crate::telemetry::table_rows::TableRows;
use tokio_util::sync::CancellationToken;

pub struct Listeners {
    pub api: SocketAddr,
    pub admin: SocketAddr,
    tasks: Vec<JoinHandle<std::io::Result<()>>>,
    failed: tokio::sync::watch::Receiver<Option<String>>,
}

impl Listeners {
    /// Resolves if a listener stops on its own (its socket failed).
    pub async fn failed(&self) -> String {
        let mut rx = self.failed.clone();
        let failure = match rx.wait_for(|f| f.is_some()).await {
            Ok(f) => f.clone(),
            Err(_) => None,
        };
        match failure {
            Some(f) => f,
            None => std::future::pending().await,
        }
    }

    pub async fn join(self) {
        for task in self.tasks {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), task).await;
        }
    }
}

/// What the listeners serve, made by `server::run`.
pub struct Parts {
    /// The insert clients of each target, by name: the table catalogs read through them.
    pub inserters: BTreeMap<String, Arc<TargetClients>>,
    /// The ingest streams' publishers (one per partition).
    pub publisher: IngestStreams,
    pub dlq: Dlq,
    pub pipeline: Arc<PipelineAdapter>,
    pub client: async_nats::Client,
    /// What the last check of other publishers' subjects found (`GET /admin/nats`).
    pub publisher_routes: tokio::sync::watch::Receiver<Option<PublisherRoutes>>,
    pub metrics: PrometheusHandle,
    /// Each table's row totals, sampled for the admin page's rates.
    pub table_rows: Arc<TableRows>,
}

/// The bucket of `Idempotency-Key` records, and of the marks of the keyed chunks the
/// consumer settled (`nats::LandedChunks`): one bucket, written by the ingest API and
/// by the consumer, so both build it from here.
pub fn idempotency_keys(config: &Config, js: async_nats::jetstream::Context) -> Arc<KeyStore> {
    let key_lease = idempotency::lease(config.api.limits.body_timeout);
    Arc::new(KeyStore::new(
        js,
        KeyStoreSettings {
            bucket: config.nats.idempotency_bucket.clone(),
            purpose: "idempotency",
            description: "Sluice Idempotency-Key records: each keyed ingest request's body fingerprint and answer, and the keyed chunks settled",
            max_bytes: config.nats.idempotency_max_bytes,
            full_hint: "[nats] idempotency_max_bytes; its records expire after [nats] duplicate_window",
            replicas: config.nats.streams.replicas,
            max_age: idempotency::record_age(config.nats.streams.duplicate_window, key_lease),
            no_leader_wait: config.api.publish_retry_for,
        },
    ))
}

pub async fn start(
    config: &Arc<Config>,
    parts: Parts,
    shutdown: CancellationToken,
) -> anyhow::Result<Listeners> {
    let Parts {
        inserters,
        publisher,
        dlq,
        pipeline,
        client,
        publisher_routes,
        metrics,
        table_rows,
    } = parts;
    let ingest_state = ingest_state(config, &inserters, publisher);
    let query_state =
        crate::query::QueryState::new(config.clone()).context("setting up the query gateway")?;
    let api = crate::api::router(
        ApiState {
            ingest: ingest_state,
            query: query_state,
        },
        config.api.max_request_bytes,
        config.api.auth,
    );

    if config.admin.token.is_none() {
        tracing::warn!(listen = %config.admin.listen, "no admin token configured: the admin endpoint listens on loopback only");
    }
    let admin_state = Arc::new(AdminState {
        token: config.admin.token.clone(),
        pipeline,
        nats: NatsView::new(
            client,
            config.nats.seeds_text(),
            config.nats.streams.clone(),
            publisher_routes,
        ),
        dlq,
        metrics,
        history: admin::history::sample_table_rows(table_rows),
        fault_injection: config.admin.fault_injection,
    });
    let admin = admin::router(admin_state);

    let caps = connection_caps(config)?;
    let (failed_tx, failed) = tokio::sync::watch::channel(None);
    let failed_tx = Arc::new(failed_tx);
    let mut tasks = Vec::new();
    let mut bound = Vec::new();
    for (name, addr, router, bounds, cap) in [
        (
            "api",
            config.api.listen,
            api,
            Bounds::new("[api]", &config.api.limits),
            caps.api,
        ),
        (
            "admin",
            config.admin.listen,
            admin,
            Bounds::new("[admin]", &config.admin.limits),
            caps.admin,
        ),
    ] {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the {name} listener to {addr}"))?;
        bound.push(listener.local_addr()?);
        let shutdown = shutdown.clone();
        let failed_tx = failed_tx.clone();
        tasks.push(tokio::spawn(async move {
            let served = accept::serve(name, listener, router, bounds, cap, shutdown).await;
            if let Err(e) = &served {
                failed_tx.send_replace(Some(format!("the {name} listener failed: {e}")));
            }
            served
        }));
    }
    Ok(Listeners {
        api: bound[0],
        admin: bound[1],
        tasks,
        failed,
    })
}

/// The ingest API's state: its tenants, its publisher and limits, the tables' catalogs,
/// the idempotency keys.
fn ingest_state(
    config: &Arc<Config>,
    inserters: &BTreeMap<String, Arc<TargetClients>>,
    publisher: IngestStreams,
) -> Arc<IngestState> {
    let tenants = TenantResolver::new(config.clone());
    let key_lease = idempotency::lease(config.api.limits.body_timeout);
    let keys = idempotency_keys(config, publisher.first().context().clone());
    Arc::new(IngestState {
        tenants,
        publishing: tokio::sync::Semaphore::new(ingest::MAX_PUBLISHING),
        publisher,
        max_request_bytes: config.api.max_request_bytes,
        memory: ingest::IngestMemory::new(
            config.api.ingest_memory,
            config.api.max_request_bytes,
            config.api.limits.body_timeout,
        ),
        max_row_bytes: config.api.max_row_bytes,
        chunks: ChunkLimits {
            rows: config.api.chunk_rows,
            bytes: config.api.chunk_bytes,
        },
        compression: config.api.compression,
        max_json_depth: config.api.max_json_depth,
        retry_after: config.api.retry_after,
        publish_retry_for: config.api.publish_retry_for,
        catalogs: catalogs(config, inserters),
        tables: TenantTables::new(config.api.max_tables_per_tenant),
        landed: LandedChunks::new(keys.clone()),
        keys: Idempotency::new(keys, key_lease, &config.nats.streams.stream),
        key_lease,
    })
}

/// Raise the descriptor limit and derive the connection caps from it, keeping
/// `[api] fd_reserve` free for NATS, ClickHouse and files; log the figures.
fn connection_caps(config: &Config) -> anyhow::Result<Caps> {
    let limit = descriptors::raise_limit().context("reading the descriptor limit")?;
    let (caps, lowered) = descriptors::caps(
        limit.now,
        config.api.fd_reserve,
        config.api.max_connections,
        config.admin.max_connections,
    )
    .map_err(anyhow::Error::msg)?;
    if let Some(warning) = lowered {
        tracing::warn!("{warning}");
    }
    tracing::info!(
        limit = limit.now,
        raised_from = limit.was,
        reserve = config.api.fd_reserve,
        api_connections = caps.api,
        admin_connections = caps.admin,
        "file descriptors"
    );
    Ok(caps)
}

/// A table catalog per target, on the target's insert clients and database.
fn catalogs(
    config: &Config,
    inserters: &BTreeMap<String, Arc<TargetClients>>,
) -> HashMap<String, TargetCatalog> {
    config
        .targets
        .values()
        .filter_map(|target| {
            let inserter = inserters.get(&target.name)?.clone();
            let catalog = Catalog::new(
                &target.name,
                &target.database,
                inserter,
                catalog::READ_TIMEOUT,
            );
            Some((target.name.clone(), catalog))
        })
        .collect()
}
