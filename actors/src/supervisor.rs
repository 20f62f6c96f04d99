//! RootSupervisor: spawns the ConsumerActor and one PoolActor per ClickHouse target,
//! respawns a failed child with backoff (100 ms doubling to 10 s), counts restarts per
//! kind, and makes the pipeline fatal when a core actor cannot be spawned again.
//!
//! ractor restarts nothing by itself and its default `handle_supervisor_evt` stops the
//! parent: this one (like the PoolActor's) overrides it.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;

use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent,
};
use tokio::time::Instant;

use crate::consumer::{ConsumerActor, ConsumerArgs, ConsumerMsg, Router};
use crate::context::Common;
use crate::metrics;
use crate::observe::{NodeState, CONSUMER_ID};
use crate::pool::{PoolActor, PoolShared};
use crate::ports::{Inserter, Source, SourceFactory};

type DeliveryOf<F> = <<F as SourceFactory>::Source as Source>::Delivery;

pub enum RootMsg {
    RespawnConsumer,
    RespawnPool(usize),
    /// Shutdown: stop respawning children.
    Stopping(RpcReplyPort<()>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Child {
    Consumer,
    Pool(usize),
}

impl Child {
    fn kind(self) -> &'static str {
        match self {
            Child::Consumer => "consumer",
            Child::Pool(_) => "pool",
        }
    }
}

#[derive(Default)]
struct ChildState {
    cell: Option<ActorCell>,
    failures_in_row: u32,
    last_failure: Option<Instant>,
    spawn_failures: u32,
}

pub struct RootArgs<F: SourceFactory, I> {
    pub common: Arc<Common>,
    pub factory: Arc<F>,
    pub router: Arc<Router<DeliveryOf<F>>>,
    pub pools: Vec<Arc<PoolShared<I>>>,
    /// Where the live consumer is, for the handle (shutdown, panic injection).
    pub consumer_slot: Arc<std::sync::RwLock<Option<ActorRef<ConsumerMsg>>>>,
}

pub struct RootState<F: SourceFactory, I> {
    args: RootArgs<F, I>,
    consumer: ChildState,
    pools: Vec<ChildState>,
    by_id: HashMap<ActorId, Child>,
    stopping: bool,
}

pub struct RootSupervisor<F, I>(PhantomData<fn() -> (F, I)>);

impl<F, I> Default for RootSupervisor<F, I> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<F: SourceFactory, I: Inserter> RootState<F, I> {
    fn node_id(&self, c: Child) -> String {
        match c {
            Child::Consumer => CONSUMER_ID.to_owned(),
            Child::Pool(i) => self.args.pools[i].node_id.clone(),
        }
    }

    fn child(&mut self, c: Child) -> &mut ChildState {
        match c {
            Child::Consumer => &mut self.consumer,
            Child::Pool(i) => &mut self.pools[i],
        }
    }

    async fn spawn(&mut self, myself: &ActorRef<RootMsg>, c: Child) {
        if self.stopping {
            return;
        }
        let res = match c {
            Child::Consumer => {
                let args = ConsumerArgs {
                    factory: self.args.factory.clone(),
                    router: self.args.router.clone(),
                    common: self.args.common.clone(),
                };
                Actor::spawn_linked(None, ConsumerActor::<F>::default(), args, myself.get_cell())
                    .await
                    .map(|(a, _)| {
                        *self
                            .args
                            .consumer_slot
                            .write()
                            .unwrap_or_else(|e| e.into_inner()) = Some(a.clone());
                        a.get_cell()
                    })
            }
            Child::Pool(i) => {
                let shared = self.args.pools[i].clone();
                Actor::spawn_linked(
                    None,
                    PoolActor::<I, DeliveryOf<F>>::default(),
                    shared,
                    myself.get_cell(),
                )
                .await
                .map(|(a, _)| {
                    self.args.router.set_pool(i, Some(a.clone()));
                    a.get_cell()
                })
            }
        };
        let id = self.node_id(c);
        let common = self.args.common.clone();
        match res {
            Ok(cell) => {
                self.by_id.insert(cell.get_id(), c);
                let st = self.child(c);
                st.cell = Some(cell);
                st.spawn_failures = 0;
            }
            Err(e) => {
                let max = common.settings.restart.max_spawn_failures;
                let st = self.child(c);
                st.spawn_failures += 1;
                let n = st.spawn_failures;
                common.registry.failed(&id, &e.to_string(), n < max);
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
        }
    }

    fn child_down(&mut self, myself: &ActorRef<RootMsg>, id: ActorId, why: String) {
        let Some(c) = self.by_id.remove(&id) else {
            return;
        };
        match c {
            Child::Consumer => {
                *self
                    .args
                    .consumer_slot
                    .write()
                    .unwrap_or_else(|e| e.into_inner()) = None;
            }
            Child::Pool(i) => self.args.router.set_pool(i, None),
        }
        if self.stopping {
            return;
        }
        let common = self.args.common.clone();
        let node = self.node_id(c);
        let now = Instant::now();
        let reset_after = common.settings.restart.reset_after;
        let st = self.child(c);
        st.cell = None;
        st.failures_in_row = match st.last_failure {
            Some(t) if now.saturating_duration_since(t) < reset_after => st.failures_in_row + 1,
            _ => 1,
        };
        st.last_failure = Some(now);
        let delay = common.restart_delay(st.failures_in_row);
        metrics::restarts(c.kind()).increment(1);
        common.registry.count_restart(&node);
        common.registry.failed(&node, &why, true);
        tracing::warn!(actor = %node, error = %why, restart_in_ms = delay.as_millis() as u64,
            "{} actor failed: respawning", c.kind());
        schedule(myself, c, delay);
    }
}

/// The child a supervision event reports gone, with why: a panic or error, or a stop
/// nobody asked for. Other events (starts, state changes) are `None`.
pub(crate) fn child_gone(evt: SupervisionEvent) -> Option<(ActorId, String)> {
    match evt {
        SupervisionEvent::ActorFailed(cell, err) => Some((cell.get_id(), err.to_string())),
        SupervisionEvent::ActorTerminated(cell, _, reason) => {
            Some((cell.get_id(), reason.unwrap_or_else(|| "stopped".into())))
        }
        _ => None,
    }
}

fn schedule(myself: &ActorRef<RootMsg>, c: Child, delay: std::time::Duration) {
    myself.send_after(delay, move || match c {
        Child::Consumer => RootMsg::RespawnConsumer,
        Child::Pool(i) => RootMsg::RespawnPool(i),
    });
}

impl<F: SourceFactory, I: Inserter> Actor for RootSupervisor<F, I> {
    type Msg = RootMsg;
    type State = RootState<F, I>;
    type Arguments = RootArgs<F, I>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let n = args.pools.len();
        Ok(RootState {
            args,
            consumer: ChildState::default(),
            pools: (0..n).map(|_| ChildState::default()).collect(),
            by_id: HashMap::new(),
            stopping: false,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state
            .args
            .common
            .registry
            .publish(crate::observe::ROOT_ID, NodeState::None {});
        for i in 0..state.pools.len() {
            state.spawn(&myself, Child::Pool(i)).await;
        }
        state.spawn(&myself, Child::Consumer).await;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RootMsg::RespawnConsumer => {
                if state.consumer.cell.is_none() {
                    state.spawn(&myself, Child::Consumer).await;
                }
            }
            RootMsg::RespawnPool(i) => {
                if state.pools.get(i).is_some_and(|p| p.cell.is_none()) {
                    state.spawn(&myself, Child::Pool(i)).await;
                }
            }
            RootMsg::Stopping(reply) => {
                state.stopping = true;
                let _ = reply.send(());
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        evt: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some((id, why)) = child_gone(evt) {
            state.child_down(&myself, id, why);
        }
        Ok(())
    }
}
