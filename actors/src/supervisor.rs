//! RootSupervisor: spawns a ConsumerActor per partition of the queue and one TargetActor per ClickHouse target,
//! respawns a failed child with backoff (100 ms doubling to 10 s), counts restarts per
//! kind, keeps what each target must not forget (its [`TargetMemory`]: its servers'
//! breakers, its tables' backoffs) for its successor, tells the consumer where the
//! targets are, and makes the pipeline fatal when a core actor cannot be spawned again.
//!
//! ractor restarts nothing by itself and its default `handle_supervisor_evt` stops the
//! parent: the tree's one lifecycle (`lifecycle.rs`) overrides it, and hands a child's
//! end to this actor (and to a TargetActor) as `child_gone`.

use std::collections::HashMap;
use std::sync::Arc;

use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, DerivedActorRef, RpcReplyPort,
};
use tokio::time::Instant;

use crate::consumer::{ConsumerActor, ConsumerArgs, ConsumerMsg, TargetLink};
use crate::context::Common;
use crate::lifecycle::{Behaviour, Lifecycle};
use crate::messaging::carried;
use crate::metrics;
use crate::observe::{consumer_id, NodeState, ROOT_ID};
use crate::placement::TargetServers;
use crate::ports::{Inserter, Source, SourceFactory};
use crate::protocol::TableReport;
use crate::restart::RestartRecord;
use crate::routing::Router;
use crate::targets::{TargetActor, TargetArgs, TargetMemory, TargetMsg, TargetReport};

type DeliveryOf<F> = <<F as SourceFactory>::Source as Source>::Delivery;

pub enum RootMsg<D> {
    RespawnConsumer(usize),
    RespawnTarget(usize),
    /// What a target says (through a derived reference).
    FromTarget(TargetReport),
    /// A flight's report that found neither its table, nor its replica's pool, nor its
    /// target (they died while it flew): forwarded to the target's successor, which
    /// hands it to the pool's, whose breaker must hear it.
    Orphan(TableReport),
    /// The children that run now (for the pipeline handle: shutdown, debug).
    Children(RpcReplyPort<Children<D>>),
    /// Shutdown: stop respawning children.
    Stopping(RpcReplyPort<()>),
    /// Fault injection (tests).
    Debug(RootDebug),
}

/// The RootSupervisor's one debug message.
pub enum RootDebug {
    /// The next `n` spawns of the consumer (`"consumer"`) or of any target
    /// (`"target"`) fail in their `pre_start`.
    FailSpawns { kind: &'static str, n: u32 },
}

/// The children that run now; `None` while one is restarting.
pub struct Children<D> {
    /// One per partition of the queue.
    pub consumers: Vec<Option<ActorRef<ConsumerMsg<D>>>>,
    pub targets: Vec<Option<ActorRef<TargetMsg<D>>>>,
}

/// One target as the root knows it.
pub struct TargetSpec<I> {
    pub servers: Arc<TargetServers<I>>,
    /// Where the target starts from: a first memory, then whatever it last reported.
    pub memory: TargetMemory,
}

pub struct RootArgs<F: SourceFactory, I> {
    pub common: Arc<Common>,
    pub factory: Arc<F>,
    /// The streams of the factory's sources (see `SourceFactory::partitions`).
    pub partitions: Vec<Arc<str>>,
    pub router: Arc<Router>,
    pub targets: Vec<TargetSpec<I>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Child {
    /// The ConsumerActor of a partition.
    Consumer(usize),
    Target(usize),
}

impl Child {
    fn kind(self) -> &'static str {
        match self {
            Child::Consumer(_) => "consumer",
            Child::Target(_) => "target",
        }
    }
}

/// A child's life as its supervisor follows it.
#[derive(Default)]
struct ChildState {
    cell: Option<ActorCell>,
    restarts: RestartRecord,
    spawn_failures: u32,
}

pub struct RootState<F: SourceFactory, I> {
    common: Arc<Common>,
    factory: Arc<F>,
    router: Arc<Router>,
    specs: Vec<TargetSpec<I>>,
    /// The partitions' streams, by index (one ConsumerActor each).
    partitions: Vec<Arc<str>>,
    consumers: Vec<ChildState>,
    consumer_refs: Vec<Option<ActorRef<ConsumerMsg<DeliveryOf<F>>>>>,
    targets: Vec<ChildState>,
    target_refs: Vec<Option<ActorRef<TargetMsg<DeliveryOf<F>>>>>,
    by_id: HashMap<ActorId, Child>,
    /// Spawns still to fail on purpose (the debug message), by kind.
    failing_spawns: HashMap<&'static str, u32>,
    stopping: bool,
}

/// The RootSupervisor: its state, run by the tree's one lifecycle.
pub type RootSupervisor<F, I> = Lifecycle<RootState<F, I>>;

// === impl RootState ===

impl<F: SourceFactory, I: Inserter> RootState<F, I> {
    fn node_id(&self, c: Child) -> String {
        match c {
            Child::Consumer(p) => consumer_id(p),
            Child::Target(i) => crate::observe::target_id(&self.specs[i].servers.target),
        }
    }

    fn child(&mut self, c: Child) -> &mut ChildState {
        match c {
            Child::Consumer(p) => &mut self.consumers[p],
            Child::Target(i) => &mut self.targets[i],
        }
    }

    fn take_failing_spawn(&mut self, kind: &'static str) -> bool {
        match self.failing_spawns.get_mut(kind) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }

    fn target_links(&self) -> Vec<Option<TargetLink<DeliveryOf<F>>>> {
        self.target_refs
            .iter()
            .map(|p| p.as_ref().map(|p| p.get_derived()))
            .collect()
    }

    async fn spawn(&mut self, myself: &ActorRef<RootMsg<DeliveryOf<F>>>, c: Child) {
        if self.stopping {
            return;
        }
        let spawned = match c {
            Child::Consumer(p) => self.spawn_consumer(myself, p).await,
            Child::Target(i) => self.spawn_target(myself, i).await,
        };
        match spawned {
            Ok(cell) => {
                self.by_id.insert(cell.get_id(), c);
                let st = self.child(c);
                st.cell = Some(cell);
                st.spawn_failures = 0;
            }
            Err(e) => self.spawn_failed(myself, c, e),
        }
    }

    async fn spawn_consumer(
        &mut self,
        myself: &ActorRef<RootMsg<DeliveryOf<F>>>,
        partition: usize,
    ) -> Result<ActorCell, String> {
        let args = ConsumerArgs {
            factory: self.factory.clone(),
            partition,
            stream: self.partitions[partition].clone(),
            router: self.router.clone(),
            common: self.common.clone(),
            targets: self.target_links(),
            fail_spawn: self.take_failing_spawn(Child::Consumer(partition).kind()),
        };
        let (actor, _) =
            Actor::spawn_linked(None, ConsumerActor::<F>::default(), args, myself.get_cell())
                .await
                .map_err(|e| e.to_string())?;
        self.consumer_refs[partition] = Some(actor.clone());
        Ok(actor.get_cell())
    }

    async fn spawn_target(
        &mut self,
        myself: &ActorRef<RootMsg<DeliveryOf<F>>>,
        index: usize,
    ) -> Result<ActorCell, String> {
        let fail_spawn = self.take_failing_spawn(Child::Target(index).kind());
        let spec = &self.specs[index];
        let root: DerivedActorRef<TargetReport> = myself.get_derived();
        let orphans: DerivedActorRef<TableReport> = myself.get_derived();
        let args = TargetArgs {
            index,
            servers: spec.servers.clone(),
            common: self.common.clone(),
            memory: spec.memory.clone(),
            root,
            orphans,
            fail_spawn,
        };
        let (actor, _) = Actor::spawn_linked(
            None,
            TargetActor::<I, DeliveryOf<F>>::default(),
            args,
            myself.get_cell(),
        )
        .await
        .map_err(|e| e.to_string())?;
        self.target_refs[index] = Some(actor.clone());
        for consumer in self.consumer_refs.iter().flatten() {
            let _ = consumer.cast(ConsumerMsg::TargetUp {
                index,
                target: actor.get_derived(),
            });
        }
        Ok(actor.get_cell())
    }

    fn spawn_failed(&mut self, myself: &ActorRef<RootMsg<DeliveryOf<F>>>, c: Child, e: String) {
        let id = self.node_id(c);
        let common = self.common.clone();
        let max = common.settings.restart.max_spawn_failures;
        let st = self.child(c);
        st.spawn_failures += 1;
        let n = st.spawn_failures;
        common.registry.failed(&id, &e, n < max);
        if n >= max {
            common.set_fatal(format!(
                "{} actor {id} could not be spawned {n} times in a row: {e}",
                c.kind()
            ));
            return;
        }
        let delay = common.restart_delay(n);
        tracing::error!(actor = %id, error = %e, retry_in_ms = delay.as_millis() as u64, "spawn failed");
        schedule(myself, c, delay);
    }

    fn child_down(&mut self, myself: &ActorRef<RootMsg<DeliveryOf<F>>>, id: ActorId, why: String) {
        let Some(c) = self.by_id.remove(&id) else {
            return;
        };
        match c {
            Child::Consumer(p) => self.consumer_refs[p] = None,
            Child::Target(i) => {
                self.target_refs[i] = None;
                for consumer in self.consumer_refs.iter().flatten() {
                    let _ = consumer.cast(ConsumerMsg::TargetDown { index: i });
                }
            }
        }
        if self.stopping {
            return;
        }
        let common = self.common.clone();
        let node = self.node_id(c);
        let st = self.child(c);
        st.cell = None;
        let delay = st.restarts.failed(Instant::now(), &common.settings.restart);
        metrics::restarts(c.kind()).increment(1);
        common.registry.count_restart(&node);
        common.registry.failed(&node, &why, true);
        tracing::warn!(actor = %node, error = %why, restart_in_ms = delay.as_millis() as u64,
            "{} actor failed: respawning", c.kind());
        schedule(myself, c, delay);
    }

    async fn on_respawn(&mut self, myself: &ActorRef<RootMsg<DeliveryOf<F>>>, c: Child) {
        let down = match c {
            Child::Consumer(p) => self.consumers.get(p).is_some_and(|c| c.cell.is_none()),
            Child::Target(i) => self.targets.get(i).is_some_and(|p| p.cell.is_none()),
        };
        if down {
            self.spawn(myself, c).await;
        }
    }

    fn on_target_report(&mut self, report: TargetReport) {
        match report {
            TargetReport::Remember { index, memory } => {
                if let Some(spec) = self.specs.get_mut(index) {
                    spec.memory = *memory;
                }
            }
        }
    }

    /// Forward an orphaned flight report to the current target of its table's tenant.
    fn on_orphan(&self, report: TableReport) {
        let key = match &report {
            TableReport::Verdict(v) => &v.key,
            // Only verdicts outlive their table; anything else is its table's business.
            _ => return,
        };
        let target = self
            .router
            .target_of_tenant(&key.tenant)
            .and_then(|i| self.target_refs.get(i).cloned().flatten());
        if let Some(target) = target {
            let _ = target.cast(TargetMsg::FromTable(report));
        }
    }

    fn on_children(&self, reply: RpcReplyPort<Children<DeliveryOf<F>>>) {
        let _ = reply.send(Children {
            consumers: self.consumer_refs.clone(),
            targets: self.target_refs.clone(),
        });
    }

    fn on_stopping(&mut self, reply: RpcReplyPort<()>) {
        self.stopping = true;
        let _ = reply.send(());
    }

    fn on_debug(&mut self, debug: RootDebug) {
        match debug {
            RootDebug::FailSpawns { kind, n } => {
                self.failing_spawns.insert(kind, n);
            }
        }
    }
}

fn schedule<D: Send + 'static>(
    myself: &ActorRef<RootMsg<D>>,
    c: Child,
    delay: std::time::Duration,
) {
    myself.send_after(delay, move || match c {
        Child::Consumer(p) => RootMsg::RespawnConsumer(p),
        Child::Target(i) => RootMsg::RespawnTarget(i),
    });
}

// === conversions for derived references ===

carried!(<D> TableReport => RootMsg<D>, RootMsg::Orphan);
carried!(<D> TargetReport => RootMsg<D>, RootMsg::FromTarget);

impl<F: SourceFactory, I: Inserter> Behaviour for RootState<F, I> {
    type Msg = RootMsg<DeliveryOf<F>>;
    type Args = RootArgs<F, I>;

    fn build(args: RootArgs<F, I>) -> Result<Self, ActorProcessingErr> {
        let n = args.targets.len();
        let p = args.partitions.len();
        Ok(RootState {
            common: args.common,
            factory: args.factory,
            router: args.router,
            specs: args.targets,
            partitions: args.partitions,
            consumers: (0..p).map(|_| ChildState::default()).collect(),
            consumer_refs: vec![None; p],
            targets: (0..n).map(|_| ChildState::default()).collect(),
            target_refs: vec![None; n],
            by_id: HashMap::new(),
            failing_spawns: HashMap::new(),
            stopping: false,
        })
    }

    async fn started(&mut self, myself: &ActorRef<Self::Msg>) {
        self.common.registry.publish(ROOT_ID, NodeState::None {});
        for i in 0..self.targets.len() {
            self.spawn(myself, Child::Target(i)).await;
        }
        for p in 0..self.consumers.len() {
            self.spawn(myself, Child::Consumer(p)).await;
        }
    }

    async fn receive(&mut self, myself: &ActorRef<Self::Msg>, msg: Self::Msg) {
        match msg {
            RootMsg::RespawnConsumer(p) => self.on_respawn(myself, Child::Consumer(p)).await,
            RootMsg::RespawnTarget(i) => self.on_respawn(myself, Child::Target(i)).await,
            RootMsg::FromTarget(report) => self.on_target_report(report),
            RootMsg::Orphan(report) => self.on_orphan(report),
            RootMsg::Children(reply) => self.on_children(reply),
            RootMsg::Stopping(reply) => self.on_stopping(reply),
            RootMsg::Debug(debug) => self.on_debug(debug),
        }
    }

    fn child_gone(&mut self, myself: &ActorRef<Self::Msg>, id: ActorId, why: String) {
        self.child_down(myself, id, why);
    }
}
