//! The public face: start the tree, get a [`PipelineHandle`].
//!
//! ```ignore
//! let handle = sluice_actors::start(PipelineConfig {
//!     source: my_source_factory,
//!     targets: vec![Target::new("main", Arc::new(my_clickhouse_inserter))],
//!     tenants: [("acme".into(), "main".into())].into(),
//!     tables: TableSettingsResolver::new(TableSettings::default()),
//!     settings: PipelineSettings::default(),
//! }).await?;
//! tokio::select! {
//!     why = handle.fatal() => { eprintln!("{why}"); std::process::exit(1) }
//!     _ = sigterm() => { let summary = handle.shutdown().await; }
//! }
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};
use serde::Serialize;
use tokio::time::Instant;

use crate::consumer::{ConsumerDebug, ConsumerMsg};
use crate::context::Common;
use crate::ledger::ManifestStore;
use crate::metrics::TargetMetrics;
use crate::observe::{self, NodeKind, Registry, StatsSnapshot, TreeNode, CONSUMER_ID, ROOT_ID};
use crate::pool::{PoolDebug, PoolMemory, PoolMsg};
use crate::ports::{Delivery, Inserter, Source, SourceFactory, TableKey};
use crate::routing::Router;
use crate::settings::{PipelineSettings, TableSettingsResolver};
use crate::supervisor::{Children, PoolSpec, RootArgs, RootDebug, RootMsg, RootSupervisor};

type DeliveryOf<F> = <<F as SourceFactory>::Source as Source>::Delivery;

/// One ClickHouse target (URL + user + database) and its inserter.
pub struct Target<I> {
    pub name: String,
    pub inserter: Arc<I>,
}

impl<I> Target<I> {
    pub fn new(name: &str, inserter: Arc<I>) -> Self {
        Self {
            name: name.to_owned(),
            inserter,
        }
    }
}

pub struct PipelineConfig<F, I> {
    /// Opens the durable consumer (again after a failure).
    pub source: F,
    /// One PoolActor per target.
    pub targets: Vec<Target<I>>,
    /// tenant → target name.
    pub tenants: HashMap<String, String>,
    pub tables: TableSettingsResolver,
    pub settings: PipelineSettings,
    /// Where batch manifests are recorded: exactly-once on the tables ClickHouse
    /// deduplicates. `None`: every table is at-least-once.
    pub manifests: Option<Arc<dyn ManifestStore>>,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("tenant {tenant} names target {target}, which is not configured")]
    UnknownTarget { tenant: String, target: String },
    #[error("target {0} is configured twice")]
    DuplicateTarget(String),
    #[error("the root supervisor could not start: {0}")]
    Spawn(String),
}

/// What a graceful shutdown did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ShutdownSummary {
    /// Rows inserted (and acked) during the shutdown.
    pub rows_flushed: u64,
    pub rows_parked: u64,
    /// Rows naked for redelivery during the shutdown.
    pub rows_handed_back: u64,
    /// The deadline passed with flights still running (their rows were handed back).
    pub deadline_hit: bool,
    pub took_ms: u64,
}

pub struct PipelineHandle<D> {
    common: Arc<Common>,
    router: Arc<Router>,
    root: ActorRef<RootMsg<D>>,
    root_done: tokio::sync::watch::Receiver<bool>,
}

/// Start the actor tree.
pub async fn start<F, I>(
    cfg: PipelineConfig<F, I>,
) -> Result<PipelineHandle<DeliveryOf<F>>, StartError>
where
    F: SourceFactory,
    I: Inserter,
{
    let mut names: Vec<Arc<str>> = Vec::new();
    for t in &cfg.targets {
        if names.iter().any(|n| **n == *t.name) {
            return Err(StartError::DuplicateTarget(t.name.clone()));
        }
        names.push(Arc::from(t.name.as_str()));
    }
    let mut tenants = HashMap::new();
    for (tenant, target) in &cfg.tenants {
        let idx = names.iter().position(|n| **n == **target).ok_or_else(|| {
            StartError::UnknownTarget {
                tenant: tenant.clone(),
                target: target.clone(),
            }
        })?;
        tenants.insert(tenant.clone(), idx);
    }
    let registry = Registry::new(cfg.settings.stale_after);
    let common = Common::new(cfg.settings, cfg.tables, registry.clone(), cfg.manifests);
    registry.register(ROOT_ID, NodeKind::Root, "sluice", None);
    registry.register(
        CONSUMER_ID,
        NodeKind::Consumer,
        &common.settings.stream,
        Some(ROOT_ID),
    );
    let pools: Vec<PoolSpec<I>> = cfg
        .targets
        .into_iter()
        .zip(&names)
        .map(|(t, name)| {
            registry.register(&observe::pool_id(name), NodeKind::Pool, name, Some(ROOT_ID));
            PoolSpec {
                memory: PoolMemory::new(name, &common, &TargetMetrics::new(name)),
                target: name.clone(),
                inserter: t.inserter,
            }
        })
        .collect();
    let router = Arc::new(Router::new(&common.settings.subject_prefix, names, tenants));
    let args = RootArgs {
        common: common.clone(),
        factory: Arc::new(cfg.source),
        router: router.clone(),
        pools,
    };
    let (root, join) = Actor::spawn(None, RootSupervisor::<F, I>::default(), args)
        .await
        .map_err(|e| StartError::Spawn(e.to_string()))?;
    let (done_tx, root_done) = tokio::sync::watch::channel(false);
    {
        let common = common.clone();
        tokio::spawn(async move {
            let _ = join.await;
            let _ = done_tx.send(true);
            if !common.shutdown.is_cancelled() {
                common.set_fatal("the root supervisor stopped".into());
            }
        });
    }
    Ok(PipelineHandle {
        common,
        router,
        root,
        root_done,
    })
}

// === impl PipelineHandle ===

impl<D: Delivery> PipelineHandle<D> {
    pub fn registry(&self) -> &Arc<Registry> {
        &self.common.registry
    }

    /// The live actor tree (never waits on an actor).
    pub fn tree(&self) -> Option<TreeNode> {
        self.common.registry.tree()
    }

    pub fn tree_json(&self) -> serde_json::Value {
        self.common.registry.tree_json()
    }

    /// `/readyz`: consumer connected and running, every target probed once.
    pub fn readiness(&self) -> Result<(), Vec<String>> {
        self.common.registry.readiness()
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.common.stats.snapshot()
    }

    /// Resolves when the pipeline cannot go on (a core actor cannot be respawned, the
    /// root stopped): the process must exit non-zero.
    pub async fn fatal(&self) -> String {
        let mut rx = self.common.fatal.subscribe();
        let why = match rx.wait_for(|f| f.is_some()).await {
            Ok(f) => f.clone().unwrap_or_default(),
            Err(_) => "the pipeline is gone".into(),
        };
        why
    }

    pub fn fatal_reason(&self) -> Option<String> {
        self.common.fatal.borrow().clone()
    }

    /// The children that run now, asked of the root.
    async fn children(&self) -> Result<Children<D>, String> {
        match self
            .root
            .call(RootMsg::Children, Some(self.common.settings.call_timeout))
            .await
        {
            Ok(CallResult::Success(children)) => Ok(children),
            _ => Err("the root supervisor did not answer".into()),
        }
    }

    async fn pool_of(&self, target_index: usize) -> Result<ActorRef<PoolMsg<D>>, String> {
        self.children()
            .await?
            .pools
            .get(target_index)
            .cloned()
            .flatten()
            .ok_or_else(|| "the pool is restarting".to_string())
    }

    /// Debug hook: panic inside the TableActor of `key` (if it runs).
    pub async fn inject_panic(&self, key: &TableKey) -> Result<(), String> {
        let index = self
            .router
            .pool_of_tenant(&key.tenant)
            .ok_or_else(|| format!("tenant {} has no target", key.tenant))?;
        let pool = self.pool_of(index).await?;
        let asked = pool
            .call(
                |tx| PoolMsg::Debug(PoolDebug::PanicTable(key.clone(), tx)),
                Some(self.common.settings.call_timeout),
            )
            .await;
        match asked {
            Ok(CallResult::Success(true)) => Ok(()),
            Ok(CallResult::Success(false)) => Err(format!("no table actor runs for {key}")),
            _ => Err("the pool did not answer".into()),
        }
    }

    /// Debug hook: panic inside the PoolActor of `target`.
    pub async fn inject_pool_panic(&self, target: &str) -> Result<(), String> {
        let index = self
            .router
            .pool_index(target)
            .ok_or_else(|| format!("no target {target}"))?;
        self.pool_of(index)
            .await?
            .cast(PoolMsg::Debug(PoolDebug::Panic))
            .map_err(|_| "the pool is gone".to_string())
    }

    /// Debug hook: panic inside the ConsumerActor.
    pub async fn inject_consumer_panic(&self) -> Result<(), String> {
        self.children()
            .await?
            .consumer
            .ok_or("the consumer is restarting")?
            .cast(ConsumerMsg::Debug(ConsumerDebug::Panic))
            .map_err(|_| "the consumer is gone".to_string())
    }

    /// Debug hook (tests): the next `n` spawns of `kind` (`"consumer"` or `"pool"`)
    /// fail in their `pre_start`.
    #[doc(hidden)]
    pub fn fail_spawns(&self, kind: &'static str, n: u32) {
        let _ = self
            .root
            .cast(RootMsg::Debug(RootDebug::FailSpawns { kind, n }));
    }

    /// Graceful shutdown: stop pulling, flush every buffer now, wait for the flights up
    /// to the deadline, hand back whatever is left (at once), stop the tree. A second
    /// call only waits for the tree to be stopped.
    pub async fn shutdown(&self) -> ShutdownSummary {
        let started = Instant::now();
        let before = self.stats();
        let settings = &self.common.settings;
        let deadline = started + settings.shutdown_deadline;
        if self.common.shutdown.is_cancelled() {
            let mut done = self.root_done.clone();
            let _ =
                tokio::time::timeout_at(deadline + settings.call_timeout, done.wait_for(|d| *d))
                    .await;
            return ShutdownSummary {
                rows_flushed: 0,
                rows_parked: 0,
                rows_handed_back: 0,
                deadline_hit: false,
                took_ms: started.elapsed().as_millis() as u64,
            };
        }
        self.common.shutdown.cancel();
        tracing::info!("shutdown: stop pulling, flush every buffer");
        let step = Some(settings.call_timeout);
        let _ = self.root.call(RootMsg::Stopping, step).await;
        let children = self.children().await.ok();
        let (consumer, pools) = match children {
            Some(c) => (c.consumer, c.pools.into_iter().flatten().collect()),
            None => (None, Vec::new()),
        };
        if let Some(c) = consumer {
            let _ = c.call(ConsumerMsg::StopPulling, step).await;
        }
        let flush_for = Some(deadline.saturating_duration_since(Instant::now()));
        for p in &pools {
            let _ = p.call(PoolMsg::FlushAll, flush_for).await;
        }
        let tracker = self.common.tracker.clone();
        tracker.close();
        let deadline_hit = tokio::time::timeout_at(deadline, tracker.wait())
            .await
            .is_err();
        if deadline_hit {
            tracing::warn!(
                flights = tracker.len(),
                "shutdown deadline: handing back what is still in flight"
            );
            self.common.cancel_flights.cancel();
        }
        for p in &pools {
            let _ = p.call(PoolMsg::HandBackAll, step).await;
        }
        let _ = tokio::time::timeout(settings.call_timeout, tracker.wait()).await;
        self.root.stop(Some("shutdown".into()));
        let mut done = self.root_done.clone();
        let _ = tokio::time::timeout(settings.call_timeout, done.wait_for(|d| *d)).await;
        let after = self.stats();
        let summary = ShutdownSummary {
            rows_flushed: after.inserted - before.inserted,
            rows_parked: after.parked - before.parked,
            rows_handed_back: after.handed_back - before.handed_back,
            deadline_hit,
            took_ms: started.elapsed().as_millis() as u64,
        };
        tracing::info!(
            flushed = summary.rows_flushed,
            handed_back = summary.rows_handed_back,
            deadline_hit,
            "shutdown complete"
        );
        summary
    }
}
