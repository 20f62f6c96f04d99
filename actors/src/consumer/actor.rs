//! The ConsumerActor itself: pulls from the source, groups each pulled batch by
//! subject and sends one message per group to the table's target.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{ActorProcessingErr, ActorRef, DerivedActorRef, MessagingErr, RpcReplyPort};
use tokio::time::Instant;

use super::messages::{ConsumerDebug, ConsumerMsg};
use crate::backoff::Backoff;
use crate::context::Common;
use crate::ledger::{Changes, LedgerChange};
use crate::lifecycle::{Behaviour, Lifecycle};
use crate::metrics;
use crate::observe::{consumer_id, ConsumerSnapshot, Frame, NodeId, NodeState, Observed};
use crate::ports::{Delivery, Source, SourceFactory};
use crate::routing::{Route, Routed, Router};
use crate::rows::row_count;
use crate::settle::{hand_back, park_all, ParkReason};

type DeliveryOf<F> = <<F as SourceFactory>::Source as Source>::Delivery;

/// A target as the consumer knows it: where its rows go.
pub type TargetLink<D> = DerivedActorRef<Routed<D>>;

/// The ConsumerActor: its state, run by the tree's one lifecycle.
pub type ConsumerActor<F> = Lifecycle<ConsumerState<F>>;

pub struct ConsumerArgs<F: SourceFactory> {
    pub factory: Arc<F>,
    /// Which of the factory's sources this actor pulls from (0 when there is one).
    pub partition: usize,
    /// That source's stream (the consumer's label in the tree, logs and metrics).
    pub stream: Arc<str>,
    pub router: Arc<Router>,
    pub common: Arc<Common>,
    /// The targets that run now, by index (`None`: restarting).
    pub targets: Vec<Option<TargetLink<DeliveryOf<F>>>>,
    /// Fault injection: fail in `pre_start` (the root's debug message asks for it).
    pub fail_spawn: bool,
}

pub struct ConsumerState<F: SourceFactory> {
    args: ConsumerArgs<F>,
    source: Option<F::Source>,
    failures: u32,
    stopped: bool,
    snap: ConsumerSnapshot,
    routes: HashMap<Box<str>, Route>,
    next_pending: Instant,
    pending_gauge: ::metrics::Gauge,
    /// Its place in the live tree.
    frame: Frame,
    node: NodeId,
}

/// Cap on cached subject routes (a stream of garbage subjects must not grow memory).
const MAX_ROUTES: usize = 10_000;

impl<F: SourceFactory> ConsumerState<F> {
    fn retry_in(&self) -> Duration {
        Backoff::base(
            &self.args.common.settings.reconnect,
            self.failures.saturating_sub(1),
        )
    }

    /// Group a pulled batch by subject and send one message per group.
    fn route_batch(&mut self, batch: Vec<DeliveryOf<F>>) {
        self.snap.pulled_total += batch.len() as u64;
        let mut groups: Vec<(Box<str>, Vec<DeliveryOf<F>>)> = Vec::new();
        let mut last = 0usize;
        for d in batch {
            if d.undecodable().is_some() {
                self.park_undecodable(d);
                continue;
            }
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

    /// The route of a subject, cached.
    fn route_of(&mut self, subject: &str) -> &Route {
        if !self.routes.contains_key(subject) {
            if self.routes.len() >= MAX_ROUTES {
                self.routes.clear();
            }
            let route = self.args.router.route(subject, &self.args.common.tables);
            self.routes.insert(Box::from(subject), route);
        }
        &self.routes[subject]
    }

    /// A message whose payload cannot be decoded is parked whole, with the reason, on
    /// its table's DLQ subject (as one row: its rows cannot be told apart).
    fn park_undecodable(&mut self, d: DeliveryOf<F>) {
        let reason: Arc<str> = Arc::from(d.undecodable().unwrap_or_default());
        let subject = d.subject().to_owned();
        let (key, dlq, metrics) = match self.route_of(&subject).clone() {
            Route::Table { key, metrics, .. } => {
                let dlq = self.args.common.tables.resolve(&key).dlq;
                (key, dlq, metrics)
            }
            Route::Park {
                key, dlq, metrics, ..
            } => (key, dlq, metrics),
        };
        metrics.received(1, 1);
        self.snap.pulled_rows_total += 1;
        let common = &self.args.common;
        common.stats.received(1);
        park_all(
            common,
            key,
            reason,
            dlq,
            ParkReason::Undecodable,
            metrics,
            vec![d],
        );
    }

    fn dispatch(&mut self, subject: Box<str>, rows: Vec<DeliveryOf<F>>) {
        self.route_of(&subject);
        let route = &self.routes[&*subject];
        let common = &self.args.common;
        // A message carries one row or many: the row counters count rows.
        let row_total: usize = rows.iter().map(|d| row_count(d.payload())).sum();
        self.snap.pulled_rows_total += row_total as u64;
        common.stats.received(row_total);
        match route {
            Route::Table {
                key,
                target,
                metrics,
            } => {
                metrics.received(rows.len(), row_total);
                let restarting = common.settings.handback_while_restarting;
                match self.args.targets.get(*target).and_then(Option::as_ref) {
                    Some(p) => {
                        let routed = Routed::Messages {
                            key: key.clone(),
                            messages: rows,
                        };
                        if let Err(MessagingErr::SendErr(Routed::Messages { messages, .. })) =
                            p.send_message(routed)
                        {
                            hand_back(common, Some(metrics), messages, restarting);
                        }
                    }
                    // The target is restarting: its rows come back shortly.
                    None => hand_back(common, Some(metrics), rows, restarting),
                }
            }
            Route::Park {
                key,
                error,
                dlq,
                reason,
                metrics,
            } => {
                metrics.received(rows.len(), row_total);
                park_all(
                    common,
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

impl<F: SourceFactory> ConsumerState<F> {
    async fn on_connect(&mut self, myself: &ActorRef<ConsumerMsg<DeliveryOf<F>>>) {
        if self.stopped || self.source.is_some() {
            return;
        }
        let stop = self.args.common.stop_pulling.clone();
        let connected = tokio::select! {
            biased;
            r = self.args.factory.connect(self.args.partition) => Some(r),
            _ = stop.cancelled() => None,
        };
        let stream = self.args.stream.clone();
        match connected {
            None => self.stopped = true,
            Some(Ok(source)) => {
                self.source = Some(source);
                self.failures = 0;
                self.snap.connected = true;
                tracing::info!(stream = %stream, "consumer connected");
                self.frame.transition();
                let _ = myself.cast(ConsumerMsg::Pull);
            }
            Some(Err(e)) => {
                self.failures += 1;
                let delay = self.retry_in();
                tracing::warn!(stream = %stream, error = %e,
                    retry_in_ms = delay.as_millis() as u64, "consumer cannot connect");
                self.snap.last_error = Some(e.to_string());
                self.frame.transition();
                myself.send_after(delay, || ConsumerMsg::Connect);
            }
        }
    }

    /// One pull: waits (at most the source's idle wait) for rows, routes them, asks
    /// for the next pull by message so other messages get their turn in between.
    async fn on_pull(&mut self, myself: &ActorRef<ConsumerMsg<DeliveryOf<F>>>) {
        if self.stopped {
            return;
        }
        let Some(source) = self.source.as_mut() else {
            return;
        };
        let max = self.args.common.settings.pull_batch.max(1);
        let stop = self.args.common.stop_pulling.clone();
        let pulled = tokio::select! {
            biased;
            r = source.pull(max) => Some(r),
            _ = stop.cancelled() => None,
        };
        match pulled {
            None => self.stopped = true,
            Some(Ok(batch)) => {
                self.take_source_status();
                // The store's changes first: a table has heard of every batch recorded
                // before one of its messages this consumer pulled arrives. (With
                // partitions, whichever consumer pulls next takes the changes: a
                // message another one routes a moment earlier may reach its table
                // first; the claim of a batch checks every record, so such a message
                // joins no second batch, it goes back and comes again.)
                self.route_ledger_changes();
                if !batch.is_empty() {
                    self.route_batch(batch);
                    self.frame.changed();
                }
                self.poll_pending().await;
                let _ = myself.cast(ConsumerMsg::Pull);
            }
            Some(Err(e)) => self.source_failed(myself, e.to_string()),
        }
    }

    /// What the source says of itself (stalls, waits, the NATS side), into the
    /// snapshot; a change of what it waits for is published at once (readiness).
    fn take_source_status(&mut self) {
        let Some(source) = self.source.as_ref() else {
            return;
        };
        let status = source.status();
        let snap = &mut self.snap;
        if snap.waiting_for != status.waiting_for {
            snap.waiting_for = status.waiting_for;
            self.frame.transition();
        }
        if snap.stalls != status.stalls || snap.last_stall != status.last_stall {
            snap.stalls = status.stalls;
            snap.last_stall = status.last_stall;
            self.frame.transition();
        }
        if snap.nats != status.nats {
            snap.nats = status.nats;
            self.frame.changed();
        }
    }

    /// The manifest store's changes since the last pull, to the tables they concern
    /// (through their targets, in the order the store saw them).
    fn route_ledger_changes(&mut self) {
        match self.args.common.ledger.changes() {
            Changes::None => {}
            Changes::Resync => {
                for target in self.args.targets.iter().flatten() {
                    let _ = target.send_message(Routed::LedgerResync);
                }
            }
            Changes::Some(changes) => {
                let mut by_table: Vec<(crate::ports::TableKey, Vec<LedgerChange>)> = Vec::new();
                for change in changes {
                    match by_table.iter_mut().find(|(k, _)| k == change.table()) {
                        Some((_, v)) => v.push(change),
                        None => by_table.push((change.table().clone(), vec![change])),
                    }
                }
                for (key, changes) in by_table {
                    let target = self.args.router.target_of_tenant(&key.tenant);
                    if let Some(p) = target
                        .and_then(|i| self.args.targets.get(i))
                        .and_then(Option::as_ref)
                    {
                        let _ = p.send_message(Routed::Ledger { key, changes });
                    }
                }
            }
        }
    }

    /// The lag, every `pending_every`.
    async fn poll_pending(&mut self) {
        let now = Instant::now();
        if now < self.next_pending {
            return;
        }
        self.next_pending = now + self.args.common.settings.pending_every;
        let Some(source) = self.source.as_mut() else {
            return;
        };
        if let Some(p) = source.pending().await {
            self.snap.pending = Some(p);
            self.pending_gauge.set(p as f64);
            self.frame.changed();
        }
    }

    fn source_failed(&mut self, myself: &ActorRef<ConsumerMsg<DeliveryOf<F>>>, error: String) {
        self.source = None;
        self.snap.connected = false;
        self.snap.waiting_for = None;
        self.snap.reconnects += 1;
        self.failures = 1;
        let delay = self.retry_in();
        tracing::warn!(stream = %self.args.stream, error = %error,
            retry_in_ms = delay.as_millis() as u64, "pull failed: reconnecting");
        self.snap.last_error = Some(error);
        self.frame.transition();
        myself.send_after(delay, || ConsumerMsg::Connect);
    }

    fn on_target_up(&mut self, index: usize, target: TargetLink<DeliveryOf<F>>) {
        if let Some(slot) = self.args.targets.get_mut(index) {
            *slot = Some(target);
        }
    }

    fn on_target_down(&mut self, index: usize) {
        if let Some(slot) = self.args.targets.get_mut(index) {
            *slot = None;
        }
    }

    fn on_stop_pulling(&mut self, reply: RpcReplyPort<()>) {
        self.stopped = true;
        self.source = None;
        self.snap.connected = false;
        self.frame.transition();
        let _ = reply.send(());
    }

    fn on_debug(&self, debug: ConsumerDebug) {
        match debug {
            ConsumerDebug::Panic => panic!("injected panic in the consumer actor"),
        }
    }
}

impl<F: SourceFactory> Observed for ConsumerState<F> {
    fn frame(&mut self) -> &mut Frame {
        &mut self.frame
    }

    fn snapshot(&self) -> NodeState {
        NodeState::Consumer(self.snap.clone())
    }
}

impl<F: SourceFactory> Behaviour for ConsumerState<F> {
    type Msg = ConsumerMsg<DeliveryOf<F>>;
    type Args = ConsumerArgs<F>;

    fn build(args: ConsumerArgs<F>) -> Result<Self, ActorProcessingErr> {
        if args.fail_spawn {
            return Err("injected spawn failure of the consumer".into());
        }
        let node = consumer_id(args.partition);
        let frame = args.common.frame(&node);
        let gauge = metrics::consumer_pending(&args.stream);
        Ok(ConsumerState {
            args,
            source: None,
            failures: 0,
            stopped: false,
            snap: ConsumerSnapshot::default(),
            routes: HashMap::new(),
            next_pending: Instant::now(),
            pending_gauge: gauge,
            frame,
            node,
        })
    }

    async fn started(&mut self, myself: &ActorRef<Self::Msg>) {
        self.publish(true);
        let _ = myself.cast(ConsumerMsg::Connect);
    }

    async fn receive(&mut self, myself: &ActorRef<Self::Msg>, msg: Self::Msg) {
        match msg {
            ConsumerMsg::Connect => self.on_connect(myself).await,
            ConsumerMsg::Pull => self.on_pull(myself).await,
            ConsumerMsg::TargetUp { index, target } => self.on_target_up(index, target),
            ConsumerMsg::TargetDown { index } => self.on_target_down(index),
            ConsumerMsg::StopPulling(reply) => self.on_stop_pulling(reply),
            ConsumerMsg::Debug(debug) => self.on_debug(debug),
        }
        self.args.common.registry.beat(&self.node);
        self.publish(false);
    }
}
