//! The ConsumerActor itself.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, MessagingErr, RpcReplyPort};
use tokio::time::Instant;

use super::routing::{ParkReason, Route, Router};
use crate::backoff::Backoff;
use crate::context::{Common, Faults, Stats};
use crate::metrics;
use crate::observe::{ConsumerSnapshot, NodeState, Publisher, CONSUMER_ID};
use crate::pool::PoolMsg;
use crate::ports::{Class, Delivery, Parking, Source, SourceFactory};
use crate::shutdown::Shutdown;
use crate::table::flush::hand_back;

type DeliveryOf<F> = <<F as SourceFactory>::Source as Source>::Delivery;

pub enum ConsumerMsg {
    Connect,
    Pull,
    /// Shutdown: stop pulling; answers once the batch in hand is routed.
    StopPulling(RpcReplyPort<()>),
    /// Test/debug hook.
    Panic,
}

pub struct ConsumerActor<F>(PhantomData<fn() -> F>);

impl<F> Default for ConsumerActor<F> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

pub struct ConsumerArgs<F: SourceFactory> {
    pub factory: Arc<F>,
    pub router: Arc<Router<DeliveryOf<F>>>,
    pub common: Arc<Common>,
}

pub struct ConsumerState<F: SourceFactory> {
    args: ConsumerArgs<F>,
    source: Option<F::Source>,
    failures: u32,
    stopped: bool,
    stop: Shutdown,
    snap: ConsumerSnapshot,
    routes: HashMap<Box<str>, Route>,
    next_pending: Instant,
    pending_gauge: ::metrics::Gauge,
    publisher: Publisher,
}

/// Cap on cached subject routes (a stream of garbage subjects must not grow memory).
const MAX_ROUTES: usize = 10_000;

impl<F: SourceFactory> ConsumerState<F> {
    fn publish(&mut self, force: bool) {
        if self.publisher.due(force) {
            self.args
                .common
                .registry
                .publish(CONSUMER_ID, NodeState::Consumer(self.snap.clone()));
        }
    }

    fn retry_in(&self) -> Duration {
        Backoff::base(
            &self.args.common.settings.reconnect,
            self.failures.saturating_sub(1),
        )
    }

    /// Group a pulled batch by subject and send one message per group.
    fn route_batch(&mut self, batch: Vec<DeliveryOf<F>>) {
        let n = batch.len();
        self.snap.pulled_total += n as u64;
        Stats::add(&self.args.common.stats.received, n);
        let mut groups: Vec<(Box<str>, Vec<DeliveryOf<F>>)> = Vec::new();
        let mut last = 0usize;
        for d in batch {
            let s = d.subject();
            if let Some((k, _)) = groups.get(last) {
                if &**k == s {
                    groups[last].1.push(d);
                    continue;
                }
            }
            match groups.iter().position(|(k, _)| &**k == s) {
                Some(i) => {
                    last = i;
                    groups[i].1.push(d);
                }
                None => {
                    last = groups.len();
                    groups.push((Box::from(s), vec![d]));
                }
            }
        }
        for (subject, rows) in groups {
            self.dispatch(subject, rows);
        }
    }

    fn dispatch(&mut self, subject: Box<str>, rows: Vec<DeliveryOf<F>>) {
        if !self.routes.contains_key(&*subject) {
            if self.routes.len() >= MAX_ROUTES {
                self.routes.clear();
            }
            let route = self.args.router.route(&subject, &self.args.common.tables);
            self.routes.insert(subject.clone(), route);
        }
        let route = &self.routes[&*subject];
        let common = &self.args.common;
        match route {
            Route::Table { key, pool, metrics } => {
                metrics.received.increment(rows.len() as u64);
                match self.args.router.pool(*pool) {
                    Some(p) => {
                        if let Err(MessagingErr::SendErr(PoolMsg::Rows { rows, .. })) =
                            p.cast(PoolMsg::Rows {
                                key: key.clone(),
                                rows,
                            })
                        {
                            hand_back(common, Some(metrics), rows, Duration::from_secs(1));
                        }
                    }
                    // The pool is restarting: its rows come back shortly.
                    None => hand_back(common, Some(metrics), rows, Duration::from_secs(1)),
                }
            }
            Route::Park {
                key,
                error,
                dlq,
                reason,
                metrics,
            } => {
                metrics.received.increment(rows.len() as u64);
                park_all(
                    common.clone(),
                    key.clone(),
                    error.clone(),
                    *dlq,
                    *reason,
                    metrics.clone(),
                    rows,
                );
            }
        }
    }
}

/// Park a whole group (no target, invalid subject) off the mailbox.
fn park_all<D: Delivery>(
    common: Arc<Common>,
    key: crate::ports::TableKey,
    error: Arc<str>,
    dlq: bool,
    reason: ParkReason,
    m: metrics::TableMetrics,
    rows: Vec<D>,
) {
    let guard = common.tracker.enter();
    tokio::spawn(async move {
        let _guard = guard;
        let cap = common.settings.pool_backoff.max;
        let parking = Parking {
            table: key.clone(),
            class: Class::Rejected,
            code: None,
            error: error.to_string(),
        };
        let (mut parked, mut failed, mut naked) = (0usize, 0usize, 0usize);
        for d in rows {
            if !dlq {
                naked += 1;
                let _ = d.nak(cap).await;
                continue;
            }
            match d.park(&parking).await {
                Ok(()) => parked += 1,
                Err((d, _)) => {
                    failed += 1;
                    let _ = d.nak(cap).await;
                }
            }
        }
        let counter = match reason {
            ParkReason::NoTarget => &m.parked_no_target,
            ParkReason::InvalidSubject => &m.parked_invalid,
        };
        counter.increment(parked as u64);
        m.dlq_failures.increment(failed as u64);
        Stats::add(&common.stats.parked, parked);
        Stats::add(&common.stats.dlq_failures, failed);
        Stats::add(&common.stats.handed_back, failed + naked);
        if parked + failed + naked > 0 {
            tracing::warn!(tenant = %key.tenant, table = %key.table, parked, dlq_failures = failed, left_unacked = naked,
                error = %error, "rows parked whole");
        }
    });
}

impl<F: SourceFactory> Actor for ConsumerActor<F> {
    type Msg = ConsumerMsg;
    type State = ConsumerState<F>;
    type Arguments = ConsumerArgs<F>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        if Faults::take(&args.common.faults.consumer_spawn) {
            return Err("injected spawn failure of the consumer".into());
        }
        let every = args.common.settings.snapshot_every;
        let gauge = metrics::consumer_pending(&args.common.settings.stream);
        Ok(ConsumerState {
            stop: args.common.stop_pulling.subscribe(),
            args,
            source: None,
            failures: 0,
            stopped: false,
            snap: ConsumerSnapshot::default(),
            routes: HashMap::new(),
            next_pending: Instant::now(),
            pending_gauge: gauge,
            publisher: Publisher::new(every),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.publish(true);
        let _ = myself.cast(ConsumerMsg::Connect);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ConsumerMsg::Connect => {
                if state.stopped || state.source.is_some() {
                    return Ok(());
                }
                let connected = tokio::select! {
                    biased;
                    r = state.args.factory.connect() => Some(r),
                    _ = state.stop.recv() => None,
                };
                match connected {
                    None => state.stopped = true,
                    Some(Ok(source)) => {
                        state.source = Some(source);
                        state.failures = 0;
                        state.snap.connected = true;
                        tracing::info!(stream = %state.args.common.settings.stream, "consumer connected");
                        state.publish(true);
                        let _ = myself.cast(ConsumerMsg::Pull);
                    }
                    Some(Err(e)) => {
                        state.failures += 1;
                        let delay = state.retry_in();
                        tracing::warn!(stream = %state.args.common.settings.stream, error = %e,
                            retry_in_ms = delay.as_millis() as u64, "consumer cannot connect");
                        state.snap.last_error = Some(e.to_string());
                        state.publish(true);
                        myself.send_after(delay, || ConsumerMsg::Connect);
                    }
                }
            }
            ConsumerMsg::Pull => {
                if state.stopped {
                    return Ok(());
                }
                let Some(source) = state.source.as_mut() else {
                    return Ok(());
                };
                let max = state.args.common.settings.pull_batch.max(1);
                let pulled = tokio::select! {
                    biased;
                    r = source.pull(max) => Some(r),
                    _ = state.stop.recv() => None,
                };
                match pulled {
                    None => {
                        state.stopped = true;
                        return Ok(());
                    }
                    Some(Ok(batch)) => {
                        if !batch.is_empty() {
                            state.route_batch(batch);
                            state.publisher.dirty = true;
                        }
                        let now = Instant::now();
                        if now >= state.next_pending {
                            state.next_pending = now + state.args.common.settings.pending_every;
                            if let Some(source) = state.source.as_mut() {
                                if let Some(p) = source.pending().await {
                                    state.snap.pending = Some(p);
                                    state.pending_gauge.set(p as f64);
                                    state.publisher.dirty = true;
                                }
                            }
                        }
                        state.publish(false);
                        let _ = myself.cast(ConsumerMsg::Pull);
                    }
                    Some(Err(e)) => {
                        state.source = None;
                        state.snap.connected = false;
                        state.snap.reconnects += 1;
                        state.snap.last_error = Some(e.to_string());
                        state.failures = 1;
                        let delay = state.retry_in();
                        tracing::warn!(stream = %state.args.common.settings.stream, error = %e,
                            retry_in_ms = delay.as_millis() as u64, "pull failed: reconnecting");
                        state.publish(true);
                        myself.send_after(delay, || ConsumerMsg::Connect);
                    }
                }
            }
            ConsumerMsg::StopPulling(reply) => {
                state.stopped = true;
                state.source = None;
                state.snap.connected = false;
                state.publish(true);
                let _ = reply.send(());
            }
            ConsumerMsg::Panic => panic!("injected panic in the consumer actor"),
        }
        Ok(())
    }
}
