//! The public face: start the tree, get a [`PipelineHandle`].
//!
//! ```ignore
//! let handle = sluice_actors::start(PipelineConfig {
//!     source: my_source_factory,
//!     targets: vec![Target::new("main", Arc::new(my_clickhouse_inserter))],
//!     // or shards of replicas, each server with its own inserter:
//!     // Target::sharded("main", vec![vec![("a1:8123".into(), a1), ("a2:8123".into(), a2)], ...])
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
use crate::observe::{self, consumer_id, NodeKind, Registry, StatsSnapshot, TreeNode, ROOT_ID};
use crate::placement::TargetServers;
use crate::pool::PoolDebug;
use crate::ports::{Delivery, Inserter, Source, SourceFactory, TableKey};
use crate::routing::Router;
use crate::settings::{PipelineSettings, TableSettingsResolver};
use crate::supervisor::{Children, RootArgs, RootDebug, RootMsg, RootSupervisor, TargetSpec};
use crate::targets::{TargetDebug, TargetMemory, TargetMsg};

type DeliveryOf<F> = <<F as SourceFactory>::Source as Source>::Delivery;

/// One ClickHouse target (a user and a database) on one server, or on shards of
/// replicas: each server with its name (`host:port`) and its inserter.
pub struct Target<I> {
    pub name: String,
    /// The replicas of each shard, in the configuration's order: a batch's shard is
    /// recorded by its position here.
    pub shards: Vec<Vec<(String, Arc<I>)>>,
}

impl<I> Target<I> {
    /// A target of one server (its one replica is named after the target).
    pub fn new(name: &str, inserter: Arc<I>) -> Self {
        Self {
            name: name.to_owned(),
            shards: vec![vec![(name.to_owned(), inserter)]],
        }
    }

    /// A target of shards of replicas.
    pub fn sharded(name: &str, shards: Vec<Vec<(String, Arc<I>)>>) -> Self {
        Self {
            name: name.to_owned(),
            shards,
        }
    }
}

pub struct PipelineConfig<F, I> {
    /// Opens the durable consumer (again after a failure).
    pub source: F,
    /// One TargetActor per target, a PoolActor per server of it.
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
    #[error("target {target} has a shard without a server, or no shard")]
    EmptyShard { target: String },
    #[error("target {target} names server {replica} twice")]
    DuplicateReplica { target: String, replica: String },
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
    /// Each target's servers' names, by target index (the debug hooks name them).
    servers: Vec<Vec<Arc<str>>>,
    root: ActorRef<RootMsg<D>>,
    root_done: tokio::sync::watch::Receiver<bool>,
}

/// Every shard has a server, every server its own name within the target.
fn check_servers<I>(t: &Target<I>) -> Result<(), StartError> {
    if t.shards.is_empty() || t.shards.iter().any(Vec::is_empty) {
        return Err(StartError::EmptyShard {
            target: t.name.clone(),
        });
    }
    let mut seen = std::collections::HashSet::new();
    for (name, _) in t.shards.iter().flatten() {
        if !seen.insert(name.as_str()) {
            return Err(StartError::DuplicateReplica {
                target: t.name.clone(),
                replica: name.clone(),
            });
        }
    }
    Ok(())
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
        check_servers(t)?;
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
    let partitions: Vec<Arc<str>> = cfg
        .source
        .partitions()
        .unwrap_or_else(|| vec![common.settings.stream.clone()])
        .into_iter()
        .map(Arc::from)
        .collect();
    for (p, stream) in partitions.iter().enumerate() {
        registry.register(&consumer_id(p), NodeKind::Consumer, stream, Some(ROOT_ID));
    }
    let probe_wait = common.settings.pool_backoff.probe_handback_min;
    let targets: Vec<TargetSpec<I>> = cfg
        .targets
        .into_iter()
        .zip(&names)
        .map(|(t, name)| {
            let target_node = observe::target_id(name);
            registry.register(&target_node, NodeKind::Target, name, Some(ROOT_ID));
            let servers = TargetServers::new(name, t.shards, probe_wait);
            for r in &servers.replicas {
                let id = observe::pool_id(name, &r.name);
                registry.register(&id, NodeKind::Pool, &r.name, Some(&target_node));
            }
            TargetSpec {
                memory: TargetMemory::new(&servers, &common),
                servers: Arc::new(servers),
            }
        })
        .collect();
    let servers = targets
        .iter()
        .map(|t| t.servers.replicas.iter().map(|r| r.name.clone()).collect())
        .collect();
    let router = Arc::new(Router::new(&common.settings.subject_prefix, names, tenants));
    let args = RootArgs {
        common: common.clone(),
        factory: Arc::new(cfg.source),
        partitions,
        router: router.clone(),
        targets,
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
        servers,
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

    async fn target_of(&self, target_index: usize) -> Result<ActorRef<TargetMsg<D>>, String> {
        self.children()
            .await?
            .targets
            .get(target_index)
            .cloned()
            .flatten()
            .ok_or_else(|| "the target is restarting".to_string())
    }

    async fn target_named(&self, target: &str) -> Result<ActorRef<TargetMsg<D>>, String> {
        let index = self
            .router
            .target_index(target)
            .ok_or_else(|| format!("no target {target}"))?;
        self.target_of(index).await
    }

    /// Ask a target to inject a panic into one of its children; `what` names it.
    async fn panic_child(
        &self,
        target: ActorRef<TargetMsg<D>>,
        debug: impl FnOnce(ractor::RpcReplyPort<bool>) -> TargetDebug,
        what: &str,
    ) -> Result<(), String> {
        let asked = target
            .call(
                |tx| TargetMsg::Debug(debug(tx)),
                Some(self.common.settings.call_timeout),
            )
            .await;
        match asked {
            Ok(CallResult::Success(true)) => Ok(()),
            Ok(CallResult::Success(false)) => Err(format!("no actor runs for {what}")),
            _ => Err("the target did not answer".into()),
        }
    }

    /// Debug hook: panic inside the TableActor of `key` (if it runs).
    pub async fn inject_panic(&self, key: &TableKey) -> Result<(), String> {
        let index = self
            .router
            .target_of_tenant(&key.tenant)
            .ok_or_else(|| format!("tenant {} has no target", key.tenant))?;
        let target = self.target_of(index).await?;
        let key2 = key.clone();
        self.panic_child(
            target,
            |tx| TargetDebug::PanicTable(key2, tx),
            &key.to_string(),
        )
        .await
    }

    /// Debug hook: panic inside the PoolActor of every server of `target` (each
    /// respawned by its target with its breaker).
    pub async fn inject_pool_panic(&self, target: &str) -> Result<(), String> {
        self.pool_fault(target, PoolDebug::Panic).await
    }

    /// Debug hook: the PoolActor of every server of `target` panics on the next
    /// table's request for a flight, which it so never answers.
    pub async fn inject_pool_panic_on_next_flight_request(
        &self,
        target: &str,
    ) -> Result<(), String> {
        self.pool_fault(target, PoolDebug::PanicOnNextFlightRequest)
            .await
    }

    async fn pool_fault(&self, target: &str, how: PoolDebug) -> Result<(), String> {
        let actor = self.target_named(target).await?;
        let index = self
            .router
            .target_index(target)
            .ok_or_else(|| format!("no target {target}"))?;
        for replica in self.servers[index].iter().map(|r| r.to_string()) {
            let name = replica.clone();
            self.panic_child(
                actor.clone(),
                |tx| TargetDebug::PanicPool(name, how, tx),
                &replica,
            )
            .await?;
        }
        Ok(())
    }

    /// Debug hook: panic inside the TargetActor of `target` (its pools and tables go
    /// with it; the root respawns it with what they must not forget).
    pub async fn inject_target_panic(&self, target: &str) -> Result<(), String> {
        self.target_named(target)
            .await?
            .cast(TargetMsg::Debug(TargetDebug::Panic))
            .map_err(|_| "the target is gone".to_string())
    }

    /// Debug hook: panic inside the (first) ConsumerActor.
    pub async fn inject_consumer_panic(&self) -> Result<(), String> {
        self.children()
            .await?
            .consumers
            .into_iter()
            .next()
            .flatten()
            .ok_or("the consumer is restarting")?
            .cast(ConsumerMsg::Debug(ConsumerDebug::Panic))
            .map_err(|_| "the consumer is gone".to_string())
    }

    /// Debug hook (tests): the next `n` spawns of `kind` (`"consumer"` or `"target"`)
    /// fail in their `pre_start`.
    #[doc(hidden)]
    pub fn fail_spawns(&self, kind: &'static str, n: u32) {
        let _ = self
            .root
            .cast(RootMsg::Debug(RootDebug::FailSpawns { kind, n }));
    }

    /// Debug hook (the simulation's crash): every actor killed at once, with no step
    /// of a shutdown, and the flights cut off. What a killed process would leave,
    /// provided the caller also silences the ports (a dead process's rows are neither
    /// acked nor handed back: the simulation's fakes answer it nothing).
    #[doc(hidden)]
    pub fn kill(&self) {
        self.common.shutdown.cancel();
        self.common.cancel_flights.cancel();
        self.root.kill();
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
        let (consumers, targets) = match children {
            Some(c) => (c.consumers, c.targets.into_iter().flatten().collect()),
            None => (Vec::new(), Vec::new()),
        };
        for c in consumers.into_iter().flatten() {
            let _ = c.call(ConsumerMsg::StopPulling, step).await;
        }
        let flush_for = Some(deadline.saturating_duration_since(Instant::now()));
        for t in &targets {
            let _ = t.call(TargetMsg::FlushAll, flush_for).await;
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
        for t in &targets {
            let _ = t.call(TargetMsg::HandBackAll, step).await;
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
