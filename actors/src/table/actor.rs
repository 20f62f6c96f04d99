//! The TableActor itself: one table's buffer and flush triggers, the owner of the
//! table's own backoff on each of its target's servers and of its part of the batch
//! ledger (its index of recorded batches, fed by the store's changes as messages). A
//! batch that is due picks a replica (of its recorded shard, or, fresh, of any shard
//! in turn), asks its own backoff there, then that replica's pool, for a flight; the
//! flight runs as a task and its verdict comes back as a message.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, DerivedActorRef, RpcReplyPort};
use tokio::time::Instant;

use super::buffer::weigh;
use super::lanes::Lanes;
use super::messages::{TableDebug, TableMsg};
use super::routes::TableRoutes;
use super::strikes::Strikes;
use crate::batch::keepalive::lease_ran_out;
use crate::batch::SettlePlan;
use crate::breaker::{Admission, Ticket};
use crate::flight::{spawn_flight, FlightCtx, FlightLinks};
use crate::ledger::{LedgerChange, Manifest, TableLedger};
use crate::observe::flight_watch::FlightWatch;
use crate::observe::{MissingTableSnapshot, NodeState, SnapshotThrottle, TableSnapshot};
use crate::placement::Pick;
use crate::ports::{ClickHouseError, Dedup, Delivery, Inserter};
use crate::protocol::{Cargo, FlightReport};
use crate::protocol::{FlightOutcome, FlightVerdict, PendingRows, PoolVerdict, Tickets, Verdict};
use crate::protocol::{
    FlightRequest, Permit, PoolLink, TableCarryOver, TableReport, VerdictReport,
};
use crate::settle::hand_back;

/// Messages spanning shards split at once by one table (see `split_spanning`).
const SPLITS_AT_ONCE: usize = 16;

pub struct TableActor<I, D>(PhantomData<fn() -> (I, D)>);

impl<I, D> Default for TableActor<I, D> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

pub struct TableArgs<I> {
    pub ctx: Arc<FlightCtx<I>>,
    /// The target, as far as a table speaks to it.
    pub target: DerivedActorRef<TableReport>,
    /// Each replica's pool (by replica index; `None` while it restarts).
    pub pools: Vec<Option<PoolLink>>,
    /// The root, for the reports of flights that outlive this table and its target.
    pub orphans: DerivedActorRef<TableReport>,
    pub node_id: String,
    /// What the table's predecessor left (a new backoff, no wait, when `None`).
    pub carry_over: Option<TableCarryOver>,
}

/// The table's totals, for its snapshot.
#[derive(Debug, Default)]
struct Totals {
    inserted: u64,
    parked: u64,
    handed_back: u64,
    dlq_failures: u64,
    past_dedup_window: u64,
    last_error: Option<String>,
}

/// The age trigger: armed for the oldest buffered row, generation-stamped so a timer
/// set for rows already flushed does nothing.
#[derive(Debug, Default)]
struct AgeTimer {
    generation: u64,
    armed: Option<Instant>,
}

/// Which batch a permit is asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Next {
    /// The next batch of a lane of the buffer: of the lane's shard (a table placed by a
    /// shard key), or of any shard.
    Fresh { lane: usize, shard: Option<usize> },
    /// A recorded batch (by id), gathered and ready: its own shard.
    Recorded { id: String, shard: usize },
}

impl Next {
    fn shard(&self) -> Option<usize> {
        match self {
            Next::Fresh { shard, .. } => *shard,
            Next::Recorded { shard, .. } => Some(*shard),
        }
    }
}

/// A flight asked of a replica's pool, its answer not come yet (one at a time).
#[derive(Debug)]
struct Asking {
    next: Next,
    replica: usize,
    /// The table's own ticket for that replica.
    ticket: Ticket,
    /// Replicas that turned this batch away already.
    turned: Vec<usize>,
}

pub struct TableState<I, D> {
    ctx: Arc<FlightCtx<I>>,
    target: DerivedActorRef<TableReport>,
    orphans: DerivedActorRef<TableReport>,
    node_id: String,
    /// The buffered messages: one lane, or one per shard (a table with a shard key).
    lanes: Lanes<D>,
    /// The table's backoff on each replica, the pools, whose turn it is.
    routes: TableRoutes,
    flights: usize,
    /// What each flight out is doing (read for the snapshot, logged when one stays in
    /// a stage far too long).
    flights_out: Vec<Arc<FlightWatch>>,
    asking: Option<Asking>,
    age: AgeTimer,
    /// Shutdown: flush everything at once; answered once the buffer is empty.
    draining: Option<Vec<RpcReplyPort<()>>>,
    /// Reaped: flush what is left, then stop.
    retiring: bool,
    totals: Totals,
    last_activity: Instant,
    idle_reported: bool,
    throttle: SnapshotThrottle,
    publish_armed: bool,
    /// When the buffered rows last got `progress()` (rows buffered past `ack_wait / 2`,
    /// e.g. with a long `batch_age` or while the flights are full).
    last_progress: Option<Instant>,
    /// Since when ClickHouse says this table (or its database) does not exist: its rows
    /// wait, table-scoped, for `missing_table_grace` (a deploy race is the usual cause),
    /// then are parked (a producer's typo must not fill the stream).
    missing_since: Option<Instant>,
    /// The table's part of the batch ledger: which recorded batch each message belongs
    /// to, the batches gathered to fly again, the lines settled of messages that went
    /// back.
    ledger: TableLedger<D>,
    /// Whether ClickHouse deduplicates this table's inserts, as the last flight found.
    dedup: Option<Dedup>,
    /// Messages suspected of crashing ClickHouse.
    strikes: Strikes,
}

// === impl TableState ===

impl<I: Inserter, D: Delivery> TableState<I, D> {
    fn new(args: TableArgs<I>) -> Self {
        let now = Instant::now();
        let ctx = args.ctx;
        let (carried, missing_since) = match args.carry_over {
            Some(TableCarryOver {
                backoffs,
                missing_since,
            }) => (Some(backoffs), missing_since),
            None => (None, None),
        };
        let routes = TableRoutes::new(&ctx, &args.node_id, args.pools, carried, now);
        let lanes = Lanes::new(ctx.settings.shard_key.clone(), ctx.servers.layout.shards());
        Self {
            throttle: SnapshotThrottle::new(ctx.common.settings.snapshot_every),
            ctx,
            target: args.target,
            orphans: args.orphans,
            node_id: args.node_id,
            lanes,
            routes,
            flights: 0,
            flights_out: Vec::new(),
            asking: None,
            age: AgeTimer::default(),
            draining: None,
            retiring: false,
            totals: Totals::default(),
            last_activity: now,
            idle_reported: false,
            publish_armed: false,
            last_progress: None,
            missing_since,
            ledger: TableLedger::default(),
            dedup: None,
            strikes: Strikes::default(),
        }
    }

    fn snapshot(&self) -> TableSnapshot {
        TableSnapshot {
            tenant: self.ctx.key.tenant.to_string(),
            table: self.ctx.key.table.to_string(),
            buffered_rows: self.lanes.len() + self.ledger.gathered(),
            buffered_bytes: self.lanes.bytes(),
            flights: self.flights,
            flights_out: self
                .flights_out
                .iter()
                .filter(|w| Arc::strong_count(w) > 1)
                .map(|w| w.snapshot(Instant::now()))
                .collect(),
            backoff: self.routes.summary(Instant::now()),
            replica_backoffs: self.routes.per_replica(&self.ctx, Instant::now()),
            shards: self.ctx.servers.layout.shards(),
            shard_key: self.lanes.key().map(|k| k.column().to_owned()),
            last_batches: self.routes.last_batches(),
            rows_inserted: self.totals.inserted,
            rows_parked: self.totals.parked,
            rows_handed_back: self.totals.handed_back,
            dlq_failures: self.totals.dlq_failures,
            missing_table: self.missing_since.map(|since| {
                let waited = Instant::now().saturating_duration_since(since);
                MissingTableSnapshot {
                    for_ms: waited.as_millis() as u64,
                    grace_left_ms: self
                        .ctx
                        .settings
                        .missing_table_grace
                        .saturating_sub(waited)
                        .as_millis() as u64,
                }
            }),
            exactly_once: self.dedup.as_ref().map(|d| d.exactly_once),
            exactly_once_why: self.dedup.as_ref().map(|d| d.why.clone()),
            recorded_batches: self.ledger.recorded(),
            batches_past_dedup_window: self.totals.past_dedup_window,
            last_error: self.totals.last_error.clone(),
        }
    }

    /// Publish now if due; if something changed but it is too soon, arm one publication
    /// for when it is due (so a burst followed by silence is still shown).
    fn publish_or_arm(&mut self, myself: &ActorRef<TableMsg<D>>) {
        self.publish(false);
        if self.throttle.dirty && !self.publish_armed {
            self.publish_armed = true;
            myself.send_after(self.ctx.common.settings.snapshot_every, || {
                TableMsg::Publish
            });
        }
    }

    fn publish(&mut self, force: bool) {
        if self.throttle.due(force) {
            self.ctx.metrics.buffered.set(self.lanes.len() as f64);
            self.ctx
                .common
                .registry
                .publish(&self.node_id, NodeState::Table(self.snapshot()));
        }
    }

    fn hand_back(&mut self, rows: Vec<D>, delay: Duration) {
        self.totals.handed_back += rows.len() as u64;
        hand_back(&self.ctx.common, Some(&self.ctx.metrics), rows, delay);
    }

    fn on_messages(&mut self, myself: &ActorRef<TableMsg<D>>, rows: Vec<D>) {
        let now = Instant::now();
        self.last_activity = now;
        self.idle_reported = false;
        if let Some(delay) = self.routes.arrival_delay(now) {
            // The table's window is open on every replica, or its probes are out:
            // nothing is buffered.
            self.hand_back(rows, delay);
            return;
        }
        let fresh = self.sort_out_recorded(myself, rows, now);
        let weight = weigh(&fresh);
        let s = &self.ctx.settings;
        let cap = self.ctx.common.settings.buffer_cap_batches.max(1);
        let over = self.lanes.len() + weight.0 > s.batch_rows.saturating_mul(cap)
            || self.lanes.bytes() + weight.1 > s.batch_bytes.saturating_mul(cap);
        if self.draining.is_none() && over && !self.lanes.is_empty() {
            // Memory bound: the table is behind (flights full); let the queue keep them.
            let delay = self.ctx.common.settings.table_backoff.initial;
            self.hand_back(fresh, delay);
        } else {
            let placed = self.lanes.place(fresh);
            self.split_spanning(placed.spanning);
            self.lanes.push_placed(placed.by_lane, weight, now);
        }
        self.pump(myself);
    }

    /// Messages whose rows belong to several shards: each is published again as one
    /// message per shard and acked, from a task (its parts come back as messages of
    /// their own, each into its shard's lane); one that cannot be goes back.
    fn split_spanning(&self, spanning: Vec<(D, Vec<(usize, bytes::Bytes)>)>) {
        if spanning.is_empty() {
            return;
        }
        let delay = self.ctx.common.settings.store_retry;
        let split = self.ctx.metrics.messages_split.clone();
        let key = self.ctx.key.clone();
        self.ctx.common.tracker.spawn(async move {
            // Each split is a few round trips (its record read and written, its parts
            // published, its ack confirmed): a pull's worth go side by side.
            futures::StreamExt::for_each_concurrent(
                futures::stream::iter(spanning),
                SPLITS_AT_ONCE,
                |(d, parts)| {
                    let (split, key) = (&split, &key);
                    async move {
                        match d.split(parts).await {
                            Ok(()) => split.increment(1),
                            Err((d, e)) => {
                                tracing::warn!(tenant = %key.tenant, table = %key.table, error = %e,
                                    "a message whose rows belong to several shards could not be split: it goes back");
                                let _ = d.nak(delay).await;
                            }
                        }
                    }
                },
            )
            .await;
        });
    }

    /// Messages may belong to a recorded batch: one whose verdicts are recorded is
    /// settled by them at once; one still open is gathered to fly again as that batch.
    /// Returns the others.
    fn sort_out_recorded(
        &mut self,
        myself: &ActorRef<TableMsg<D>>,
        rows: Vec<D>,
        now: Instant,
    ) -> Vec<D> {
        if !self.ctx.common.ledger.records() {
            return rows;
        }
        let sorted = self.ledger.sort(rows, now);
        self.count_uncovered(sorted.uncovered, now);
        for id in sorted.opened {
            let wait = self.ctx.common.settings.reform_wait;
            myself.send_after(wait, move || TableMsg::ReformDue(id));
        }
        self.settle_by_records(sorted.settled);
        sorted.fresh
    }

    /// Messages delivered again that no record covers, into a table reported
    /// exactly-once: counted, and the first of each minute logged, so a duplicate can
    /// be traced to its cause (a record expired, or removed while a copy was out).
    fn count_uncovered(&mut self, uncovered: usize, now: Instant) {
        let exactly_once = self.dedup.as_ref().is_some_and(|d| d.exactly_once);
        if uncovered == 0 || !exactly_once {
            return;
        }
        self.ctx
            .metrics
            .messages_uncovered
            .increment(uncovered as u64);
        if self.ledger.log_uncovered(now) {
            tracing::warn!(tenant = %self.ctx.key.tenant, table = %self.ctx.key.table, messages = uncovered,
                "messages delivered again are covered by no batch record: they go into a new batch (their rows are in ClickHouse twice if an earlier batch of theirs went in and its record expired or was removed; sluice_messages_uncovered_total counts them)");
        }
    }

    /// Messages of batches whose verdicts are recorded: settled by them, from a task.
    fn settle_by_records(&self, settled: Vec<(Arc<Manifest>, Vec<D>)>) {
        for (manifest, held) in settled {
            let ctx = self.ctx.clone();
            self.ctx.common.tracker.spawn(async move {
                let plan = SettlePlan {
                    table: &ctx.key,
                    dlq: ctx.settings.dlq,
                    cap_delay: ctx.common.settings.pool_backoff.max,
                    pending_delay: ctx.common.settings.store_retry,
                    confirm: false,
                };
                ctx.common
                    .ledger
                    .settle_by_record(&manifest, held, &plan)
                    .await;
            });
        }
    }

    /// Changes of the table's recorded batches, from the store.
    fn on_ledger(&mut self, changes: Vec<LedgerChange>) {
        self.last_activity = Instant::now();
        let settled = self.ledger.apply(changes);
        self.settle_by_records(settled);
    }

    /// Start the ledger's index again from the store's snapshot of the table.
    fn load_ledger(&mut self) {
        if let Some(snapshot) = self.ctx.common.ledger.snapshot_of(&self.ctx.key) {
            self.ledger.load(snapshot);
        }
    }

    fn on_reform_due(&mut self, myself: &ActorRef<TableMsg<D>>, id: String) {
        self.ledger.wait_over(&id);
        self.pump(myself);
    }

    /// Ask for the next flight if a batch is due and allowed: a replica is picked (of the
    /// batch's recorded shard, or of any shard in turn), the table's own backoff there
    /// admits it (it owns it), then the replica's pool (by message; the answer is a
    /// `Permit`).
    fn pump(&mut self, myself: &ActorRef<TableMsg<D>>) {
        let now = Instant::now();
        let forced = self.draining.is_some() || self.retiring;
        while self.has_work() && self.asking.is_none() {
            let busy = self.flights >= self.ctx.common.settings.max_inflight_flushes.max(1);
            let due = self.ledger.has_ready() || self.lanes.due(&self.ctx.settings, now).is_some();
            if !forced && (busy || !due) {
                break;
            }
            let next = self.next_batch(now);
            match self.routes.pick(&self.ctx, next.shard(), &[], now) {
                Pick::Replica(replica) => self.ask(myself, next, replica, Vec::new(), now),
                Pick::Wait(delay) => self.hand_back_next(&next, delay),
            }
        }
        self.arm_age(myself);
        self.answer_drain();
    }

    /// The batch that flies next: a recorded batch gathered and ready first, then the
    /// lane whose batch is due (or, flushing everything, the one holding the oldest).
    fn next_batch(&self, now: Instant) -> Next {
        match self.ledger.peek_ready() {
            Some(m) => Next::Recorded {
                id: m.id.clone(),
                shard: self.ctx.servers.layout.recorded_shard(m.shard),
            },
            None => {
                let lane = self
                    .lanes
                    .due(&self.ctx.settings, now)
                    .or_else(|| self.lanes.oldest_lane())
                    .unwrap_or(0);
                Next::Fresh {
                    lane,
                    shard: self.lanes.shard_of(lane),
                }
            }
        }
    }

    /// Ask `replica`'s pool for a flight of `next`, once the table's own backoff there
    /// lets it; `turned`: the replicas that turned it away already.
    fn ask(
        &mut self,
        myself: &ActorRef<TableMsg<D>>,
        next: Next,
        replica: usize,
        turned: Vec<usize>,
        now: Instant,
    ) {
        let ticket = match self.routes.backoff(replica).admit(now) {
            Admission::Go(ticket) | Admission::Probe(ticket) => ticket,
            Admission::Wait(delay) => {
                // Routing read the gate a moment ago; it moved.
                self.hand_back_next(&next, delay);
                return;
            }
        };
        let asked = self.routes.pool(replica).map(|pool| {
            pool.send_message(FlightRequest::WantsFlight {
                key: self.ctx.key.clone(),
                id: myself.get_id(),
                reply: myself.get_derived(),
            })
        });
        if !matches!(asked, Some(Ok(()))) {
            // The pool is restarting (its target tells when it is back): not now.
            self.routes.backoff(replica).release(ticket, now);
            self.routes.set_pool(replica, None);
            let delay = self.ctx.common.settings.handback_while_restarting;
            self.turned_away(myself, next, replica, turned, delay, now);
            return;
        }
        self.asking = Some(Asking {
            next,
            replica,
            ticket,
            turned,
        });
    }

    /// `replica` turned `next` away for `delay`: another replica of its shard (any
    /// shard, fresh) is asked, or the batch goes back once none is left.
    fn turned_away(
        &mut self,
        myself: &ActorRef<TableMsg<D>>,
        next: Next,
        replica: usize,
        mut turned: Vec<usize>,
        delay: Duration,
        now: Instant,
    ) {
        turned.push(replica);
        match self.routes.pick(&self.ctx, next.shard(), &turned, now) {
            Pick::Replica(other) => self.ask(myself, next, other, turned, now),
            // Every replica was asked (a wait of zero): this one's delay.
            Pick::Wait(other) if other.is_zero() => self.hand_back_next(&next, delay),
            Pick::Wait(other) => self.hand_back_next(&next, other.min(delay)),
        }
    }

    /// Something to fly: buffered messages, or a recorded batch gathered and ready.
    fn has_work(&self) -> bool {
        !self.lanes.is_empty() || self.ledger.has_ready()
    }

    /// Turned away: with the remaining delay, or at once while shutting down (another
    /// instance may take the rows).
    fn handback_delay(&self, delay: Duration) -> Duration {
        if self.draining.is_some() {
            Duration::ZERO
        } else {
            delay
        }
    }

    /// The messages of `next`, taken out to fly, with since when they are held (`None`:
    /// gone meanwhile: settled by its record, handed back).
    fn take(&mut self, next: &Next) -> Option<(Cargo<D>, Instant)> {
        let threshold = self.ctx.common.settings.poison_strikes;
        match next {
            Next::Recorded { id, .. } => {
                let g = self.ledger.take_ready(id)?;
                let suspicion = self
                    .strikes
                    .suspicion(g.manifest.messages.iter().copied(), threshold);
                let cargo = Cargo::Reformed {
                    manifest: g.manifest,
                    held: g.held,
                    suspicion,
                };
                Some((cargo, g.since))
            }
            Next::Fresh { lane, .. } if self.lanes.lane_is_empty(*lane) => None,
            Next::Fresh { lane, .. } => {
                let s = &self.ctx.settings;
                let (deliveries, _bytes, held_since) =
                    self.lanes.take(*lane, s.batch_rows, s.batch_bytes);
                let (deliveries, aside) = self.ledger.launch_fresh(deliveries);
                if !aside.is_empty() {
                    tracing::debug!(tenant = %self.ctx.key.tenant, table = %self.ctx.key.table, messages = aside.len(),
                        "messages delivered twice or already in a recorded batch go back");
                    let delay = self.ctx.common.settings.store_retry;
                    self.hand_back(aside, delay);
                }
                if deliveries.is_empty() {
                    // Every message went back: nothing to fly.
                    return None;
                }
                let sequences = || deliveries.iter().map(|d| d.position().stream_sequence);
                let done = self.ledger.take_settled_lines(sequences());
                let suspicion = self.strikes.suspicion(sequences(), threshold);
                let cargo = Cargo::Fresh {
                    deliveries,
                    done,
                    suspicion,
                };
                Some((cargo, held_since))
            }
        }
    }

    /// `next` cannot go now: its messages go back with `delay`.
    fn hand_back_next(&mut self, next: &Next, delay: Duration) {
        let messages = match next {
            Next::Recorded { id, .. } => self
                .ledger
                .take_ready(id)
                .map(|g| g.held)
                .unwrap_or_default(),
            Next::Fresh { lane, .. } => {
                let s = &self.ctx.settings;
                self.lanes.take(*lane, s.batch_rows, s.batch_bytes).0
            }
        };
        let delay = self.handback_delay(delay);
        self.hand_back(messages, delay);
    }

    fn on_permit(&mut self, myself: &ActorRef<TableMsg<D>>, permit: Permit) {
        let now = Instant::now();
        let Permit { replica, answer } = permit;
        let asking = match self.asking.take() {
            Some(asking) if asking.replica == replica => asking,
            other => {
                // Nobody asked this pool (cannot happen): a granted ticket goes straight back.
                self.asking = other;
                if let Ok(pool) = answer {
                    self.tell_pool(replica, PoolVerdict::Unfinished(pool), None);
                }
                return;
            }
        };
        match answer {
            Ok(pool) => match self.take(&asking.next) {
                Some((cargo, held_since)) => self.fly(
                    myself,
                    cargo,
                    held_since,
                    Tickets {
                        pool,
                        table: asking.ticket,
                        replica,
                    },
                ),
                None => {
                    // Handed back or settled meanwhile: nothing to fly.
                    self.routes.backoff(replica).release(asking.ticket, now);
                    self.tell_pool(replica, PoolVerdict::Unfinished(pool), None);
                }
            },
            Err(delay) => {
                self.routes.backoff(replica).release(asking.ticket, now);
                self.turned_away(myself, asking.next, replica, asking.turned, delay, now);
            }
        }
        self.pump(myself);
    }

    fn on_pool_link(
        &mut self,
        myself: &ActorRef<TableMsg<D>>,
        replica: usize,
        link: Option<PoolLink>,
    ) {
        self.routes.set_pool(replica, link);
        self.abandon_ask_of_a_gone_pool(myself, replica);
        self.pump(myself);
    }

    /// `replica`'s pool was replaced (it died, or died and came back): a request it
    /// held died with its mailbox and will never be answered. The target's word comes
    /// after anything that pool sent (its permit, if it answered, came first), so an
    /// ask still out is one it never answered. It is asked again, of the pool that runs
    /// now or of another replica; left waiting, the table would never ask again.
    fn abandon_ask_of_a_gone_pool(&mut self, myself: &ActorRef<TableMsg<D>>, replica: usize) {
        let Some(asking) = self.asking.take_if(|a| a.replica == replica) else {
            return;
        };
        let now = Instant::now();
        self.routes.backoff(replica).release(asking.ticket, now);
        tracing::debug!(tenant = %self.ctx.key.tenant, table = %self.ctx.key.table, replica,
            "the pool asked for a flight was replaced before it answered: asked again");
        if self.routes.pool(replica).is_some() {
            self.ask(myself, asking.next, replica, asking.turned, now);
        } else {
            let delay = self.ctx.common.settings.handback_while_restarting;
            self.turned_away(myself, asking.next, replica, asking.turned, delay, now);
        }
    }

    fn fly(
        &mut self,
        myself: &ActorRef<TableMsg<D>>,
        cargo: Cargo<D>,
        held_since: Instant,
        tickets: Tickets,
    ) {
        let replica = self.ctx.servers.replica(tickets.replica);
        let messages = cargo.messages();
        self.routes
            .flew(replica.shard, replica.name.to_string(), messages.len());
        self.ledger.flew(&messages);
        self.flights += 1;
        let watch = FlightWatch::start();
        self.flights_out.push(watch.clone());
        let links = FlightLinks {
            table: myself.get_derived(),
            pool: self.routes.pool(tickets.replica).cloned(),
            target: self.target.clone(),
            root: self.orphans.clone(),
        };
        spawn_flight(
            self.ctx.clone(),
            cargo,
            messages,
            held_since,
            tickets,
            links,
            watch,
        );
    }

    /// A flight's verdict: the table's own backoff on the flight's replica learns its
    /// part here, the replica's pool its own through a report.
    fn on_verdict(&mut self, v: FlightVerdict) {
        let now = Instant::now();
        let generation = self.routes.generation();
        let was_missing = self.missing_since;
        let pool_verdict = v.for_pool();
        let key = self.ctx.key.clone();
        let (replica, ticket) = (v.tickets.replica, v.tickets.table);
        let mut reply = v.reply;
        match &v.verdict {
            Verdict::Answered => {
                self.routes
                    .backoff(replica)
                    .on_answered(ticket, now, Some(&key));
                self.table_found();
            }
            Verdict::TableOutage(err) => {
                let failure = self
                    .routes
                    .backoff(replica)
                    .on_outage(ticket, err, now, Some(&key));
                if let Some(reply) = reply.take() {
                    let _ = reply.send(PendingRows::HandBack(failure.delay));
                }
            }
            Verdict::MissingTable(err) => {
                let pending = self.table_missing(replica, ticket, err, now);
                if let Some(reply) = reply.take() {
                    let _ = reply.send(pending);
                }
            }
            Verdict::PoolOutage(_) | Verdict::Unfinished | Verdict::Unsent(_) => {
                self.routes.backoff(replica).release(ticket, now);
            }
        }
        self.tell_pool(replica, pool_verdict, reply);
        if self.routes.generation() != generation || self.missing_since != was_missing {
            self.routes.show_summary(&self.ctx.metrics.backoff, now);
            let _ = self.target.send_message(TableReport::CarryOver {
                key,
                carry: Box::new(TableCarryOver {
                    backoffs: self.routes.backoffs().to_vec(),
                    missing_since: self.missing_since,
                }),
            });
        }
    }

    /// ClickHouse says the table does not exist (on `replica`): wait for it (the table's
    /// backoff there) while the grace lasts, then park what comes.
    fn table_missing(
        &mut self,
        replica: usize,
        ticket: Ticket,
        err: &ClickHouseError,
        now: Instant,
    ) -> PendingRows {
        let key = self.ctx.key.clone();
        let grace = self.ctx.settings.missing_table_grace;
        let since = *self.missing_since.get_or_insert_with(|| {
            tracing::warn!(tenant = %key.tenant, table = %key.table, error = %err.message,
                grace = %humantime::format_duration(grace),
                "ClickHouse says the table does not exist: its rows wait for it (a deploy race?), then they are parked");
            now
        });
        let backoff = self.routes.backoff(replica);
        if now.saturating_duration_since(since) < grace {
            // Rows wait for the table: what the gauge (and its alert) says.
            self.ctx.metrics.missing.set(1.0);
            let failure = backoff.on_outage(ticket, err, now, Some(&key));
            return PendingRows::HandBack(failure.delay);
        }
        // The grace is over: ClickHouse answered, and the answer is final for these rows.
        // They are parked, so nothing waits for the table any more.
        self.ctx.metrics.missing.set(0.0);
        backoff.on_answered(ticket, now, Some(&key));
        let mut reason = err.clone();
        reason.message = format!(
            "{} (the table did not appear within missing_table_grace = {})",
            err.message,
            humantime::format_duration(grace)
        );
        PendingRows::Park(reason)
    }

    /// An insert went through: the table exists (again).
    fn table_found(&mut self) {
        if let Some(since) = self.missing_since.take() {
            self.ctx.metrics.missing.set(0.0);
            tracing::info!(tenant = %self.ctx.key.tenant, table = %self.ctx.key.table,
                waited = %humantime::format_duration(Duration::from_millis(since.elapsed().as_millis() as u64)),
                "the table exists now: its rows are inserted");
        }
    }

    /// The pool's part of a verdict, to the replica's pool (restarting: through the
    /// target, to its successor).
    fn tell_pool(
        &self,
        replica: usize,
        verdict: PoolVerdict,
        reply: Option<RpcReplyPort<PendingRows>>,
    ) {
        let report = VerdictReport {
            key: self.ctx.key.clone(),
            replica,
            verdict,
            reply,
        };
        let report = match self.routes.pool(replica) {
            Some(pool) => match pool.send_message(FlightRequest::Verdict(Box::new(report))) {
                Ok(()) => return,
                Err(ractor::MessagingErr::SendErr(FlightRequest::Verdict(report))) => *report,
                Err(_) => return,
            },
            None => report,
        };
        let _ = self.target.send_message(TableReport::Verdict(report));
    }

    fn on_flight_done(&mut self, myself: &ActorRef<TableMsg<D>>, out: FlightOutcome) {
        self.flights = self.flights.saturating_sub(1);
        self.flights_out.retain(|w| Arc::strong_count(w) > 1);
        self.totals.inserted += out.inserted as u64;
        self.totals.parked += out.parked as u64;
        self.totals.handed_back += out.handed_back as u64;
        self.totals.dlq_failures += out.dlq_failures as u64;
        self.totals.past_dedup_window += u64::from(out.past_dedup_window);
        if out.last_error.is_some() {
            self.totals.last_error = out.last_error;
        }
        self.ledger.landed(&out.messages);
        self.ledger.remember_settled_lines(out.partly);
        self.strikes.strike(&out.struck);
        if let Some(dedup) = out.dedup {
            self.ctx
                .metrics
                .exactly_once
                .set(if dedup.exactly_once { 1.0 } else { 0.0 });
            self.dedup = Some(dedup);
        }
        self.last_activity = Instant::now();
        self.pump(myself);
        self.throttle.transition();
        self.maybe_stop(myself);
    }

    fn on_age_due(&mut self, myself: &ActorRef<TableMsg<D>>, generation: u64) {
        if generation == self.age.generation {
            self.age.armed = None;
            self.pump(myself);
        }
    }

    fn arm_age(&mut self, myself: &ActorRef<TableMsg<D>>) {
        let Some(deadline) = self.lanes.age_deadline(&self.ctx.settings) else {
            self.age.armed = None;
            return;
        };
        if self.age.armed.is_some_and(|a| a <= deadline) {
            return;
        }
        self.age.generation += 1;
        let generation = self.age.generation;
        self.age.armed = Some(deadline);
        let wait = deadline.saturating_duration_since(Instant::now());
        myself.send_after(wait, move || TableMsg::AgeDue(generation));
    }

    fn on_tick(&mut self, myself: &ActorRef<TableMsg<D>>) {
        let now = Instant::now();
        self.pump(myself);
        self.keep_buffered_rows_alive(now);
        self.keep_gathered_alive(now);
        self.ctx.common.registry.beat(&self.node_id);
        self.report_idle(myself, now);
        self.warn_of_stuck_flights(now);
    }

    /// A flight in one stage for twice `ack_wait` (a minute at least) is logged once,
    /// with the stage: every step of a flight has a bound, so one that does not end
    /// names the step whose bound is missing.
    fn warn_of_stuck_flights(&mut self, now: Instant) {
        let after = (self.ctx.common.settings.ack_wait * 2).max(Duration::from_secs(60));
        self.flights_out.retain(|w| Arc::strong_count(w) > 1);
        for watch in &self.flights_out {
            if let Some(s) = watch.stuck(now, after) {
                tracing::warn!(tenant = %self.ctx.key.tenant, table = %self.ctx.key.table,
                    stage = s.stage.as_str(), in_stage_s = s.stage_ms / 1000, age_s = s.age_ms / 1000,
                    "a flight has been in one stage for long: it holds its rows until it ends");
            }
        }
    }

    /// Rows buffered past half of `ack_wait` get `progress()`, from a task: the
    /// mailbox never waits on NATS for them.
    fn keep_buffered_rows_alive(&mut self, now: Instant) {
        let half = self.ctx.common.settings.ack_wait / 2;
        let Some(oldest) = self.lanes.oldest() else {
            return;
        };
        let since = self.last_progress.map_or(oldest, |p| p.max(oldest));
        if now.saturating_duration_since(since) < half {
            return;
        }
        let ack_wait = self.ctx.common.settings.ack_wait;
        let touches: Vec<_> = self
            .lanes
            .iter()
            .filter(|d| !lease_ran_out(*d, ack_wait, now))
            .map(Delivery::progress)
            .collect();
        self.ctx.common.tracker.spawn(async move {
            for touch in touches {
                let _ = touch.await;
            }
        });
        self.last_progress = Some(now);
    }

    /// Messages gathered for a recorded batch (waiting for the rest of it, or for a
    /// flight) get `progress()` like buffered ones, from a task: each once half of
    /// `ack_wait` passed since JetStream last heard of it.
    fn keep_gathered_alive(&mut self, now: Instant) {
        let ack_wait = self.ctx.common.settings.ack_wait;
        let half = ack_wait / 2;
        let touches: Vec<_> = self
            .ledger
            .gathered_messages()
            .filter(|d| {
                now.saturating_duration_since(d.alive_since()) >= half
                    && !lease_ran_out(*d, ack_wait, now)
            })
            .map(Delivery::progress)
            .collect();
        if touches.is_empty() {
            return;
        }
        self.ctx.common.tracker.spawn(async move {
            for touch in touches {
                let _ = touch.await;
            }
        });
    }

    fn report_idle(&mut self, myself: &ActorRef<TableMsg<D>>, now: Instant) {
        let idle_after = self.ctx.common.settings.idle_table_after;
        if !self.idle_reported
            && !self.retiring
            && self.draining.is_none()
            && self.lanes.is_empty()
            && self.ledger.is_idle()
            && self.flights == 0
            && self.asking.is_none()
            && self.routes.no_window_running(now)
            && now.saturating_duration_since(self.last_activity) >= idle_after
        {
            self.idle_reported = true;
            let _ = self.target.send_message(TableReport::Idle {
                key: self.ctx.key.clone(),
                id: myself.get_id(),
            });
        }
    }

    fn on_flush_all(&mut self, myself: &ActorRef<TableMsg<D>>, reply: RpcReplyPort<()>) {
        self.draining.get_or_insert_with(Vec::new).push(reply);
        self.pump(myself);
    }

    /// Shutdown's flush is answered once every batch has gone (or was handed back).
    fn answer_drain(&mut self) {
        if !self.has_work() && self.asking.is_none() {
            if let Some(waiting) = self.draining.as_mut() {
                for reply in waiting.drain(..) {
                    let _ = reply.send(());
                }
            }
        }
    }

    fn on_hand_back_all(&mut self, reply: RpcReplyPort<usize>) {
        let mut rows = self.lanes.take_all();
        rows.extend(self.ledger.take_gathered());
        let n = rows.len();
        self.hand_back(rows, Duration::ZERO);
        self.answer_drain();
        let _ = reply.send(n);
    }

    fn on_retire(&mut self, myself: &ActorRef<TableMsg<D>>) {
        self.retiring = true;
        self.pump(myself);
        self.maybe_stop(myself);
    }

    fn on_publish(&mut self) {
        self.publish_armed = false;
    }

    fn on_debug(&self, debug: TableDebug) {
        match debug {
            TableDebug::Panic => panic!("injected panic in table actor {}", self.ctx.key),
        }
    }

    fn maybe_stop(&self, myself: &ActorRef<TableMsg<D>>) {
        if self.retiring
            && self.flights == 0
            && self.lanes.is_empty()
            && self.ledger.gathered() == 0
            && self.asking.is_none()
        {
            myself.stop(Some("idle".into()));
        }
    }
}

impl<I: Inserter, D: Delivery> Actor for TableActor<I, D> {
    type Msg = TableMsg<D>;
    type State = TableState<I, D>;
    type Arguments = TableArgs<I>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut state = TableState::new(args);
        state.load_ledger();
        Ok(state)
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        myself.send_interval(state.ctx.common.settings.tick_every, || TableMsg::Tick);
        state.publish(true);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            TableMsg::Messages(rows) => state.on_messages(&myself, rows),
            TableMsg::Ledger(changes) => state.on_ledger(changes),
            TableMsg::LedgerResync => state.load_ledger(),
            TableMsg::AgeDue(generation) => state.on_age_due(&myself, generation),
            TableMsg::ReformDue(id) => state.on_reform_due(&myself, id),
            TableMsg::Permit(permit) => state.on_permit(&myself, permit),
            TableMsg::PoolLink { replica, link } => state.on_pool_link(&myself, replica, link),
            TableMsg::Flight(FlightReport::Verdict(verdict)) => state.on_verdict(verdict),
            TableMsg::Flight(FlightReport::Done(outcome)) => state.on_flight_done(&myself, outcome),
            TableMsg::Tick => state.on_tick(&myself),
            TableMsg::Publish => state.on_publish(),
            TableMsg::FlushAll(reply) => state.on_flush_all(&myself, reply),
            TableMsg::HandBackAll(reply) => state.on_hand_back_all(reply),
            TableMsg::Retire => state.on_retire(&myself),
            TableMsg::Debug(debug) => state.on_debug(debug),
        }
        state.throttle.dirty = true;
        state.publish_or_arm(&myself);
        Ok(())
    }
}
