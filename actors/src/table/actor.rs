//! The TableActor itself.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::time::Instant;

use super::buffer::{row_bytes, Buffer};
use super::flush::{hand_back, spawn_flight, FlightCtx};
use super::messages::TableMsg;
use crate::gate::GatePass;
use crate::observe::{NodeState, Publisher, TableSnapshot};
use crate::pool::PoolMsg;
use crate::ports::{Delivery, Inserter};

pub struct TableActor<I, D>(PhantomData<fn() -> (I, D)>);

impl<I, D> Default for TableActor<I, D> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

pub struct TableArgs<I, D> {
    pub ctx: Arc<FlightCtx<I>>,
    pub pool: ActorRef<PoolMsg<D>>,
    pub node_id: String,
}

pub struct TableState<I, D> {
    ctx: Arc<FlightCtx<I>>,
    pool: ActorRef<PoolMsg<D>>,
    node_id: String,
    buffer: Buffer<D>,
    flights: usize,
    age_gen: u64,
    age_armed: Option<Instant>,
    /// Shutdown: flush everything at once.
    draining: bool,
    /// Reaped: flush what is left, then stop.
    retiring: bool,
    inserted: u64,
    parked: u64,
    handed_back: u64,
    dlq_failures: u64,
    last_error: Option<String>,
    last_activity: Instant,
    idle_reported: bool,
    publisher: Publisher,
    publish_armed: bool,
    last_heartbeat: Instant,
    /// When the buffered rows last got `progress()` (rows buffered past `ack_wait / 2`,
    /// e.g. with a long `batch_age` or while the flights are full).
    last_progress: Option<Instant>,
}

impl<I: Inserter, D: Delivery> TableState<I, D> {
    fn snapshot(&self) -> TableSnapshot {
        TableSnapshot {
            tenant: self.ctx.key.tenant.to_string(),
            table: self.ctx.key.table.to_string(),
            buffered_rows: self.buffer.len(),
            buffered_bytes: self.buffer.bytes(),
            flights: self.flights,
            backoff: self.ctx.table_gate.snapshot(),
            rows_inserted: self.inserted,
            rows_parked: self.parked,
            rows_handed_back: self.handed_back,
            dlq_failures: self.dlq_failures,
            last_error: self.last_error.clone(),
        }
    }

    /// Publish now if due; if something changed but it is too soon, arm one publication
    /// for when it is due (so a burst followed by silence is still shown).
    fn publish_or_arm(&mut self, myself: &ActorRef<TableMsg<D>>) {
        self.publish(false);
        if self.publisher.dirty && !self.publish_armed {
            self.publish_armed = true;
            myself.send_after(self.ctx.common.settings.snapshot_every, || {
                TableMsg::Publish
            });
        }
    }

    fn publish(&mut self, force: bool) {
        if self.publisher.due(force) {
            self.ctx.metrics.buffered.set(self.buffer.len() as f64);
            self.ctx
                .common
                .registry
                .publish(&self.node_id, NodeState::Table(self.snapshot()));
        }
    }

    fn hand_back(&mut self, rows: Vec<D>, delay: Duration) {
        self.handed_back += rows.len() as u64;
        hand_back(&self.ctx.common, Some(&self.ctx.metrics), rows, delay);
    }

    /// The table's backoff, then the pool's breaker. Taking one probe token and being
    /// turned away by the other gives the token back (the pass is dropped).
    fn admit(&self) -> Result<(GatePass, GatePass), Duration> {
        let table = self.ctx.table_gate.admit()?;
        let pool = self.ctx.pool_gate.admit()?;
        Ok((pool, table))
    }

    fn on_rows(&mut self, myself: &ActorRef<TableMsg<D>>, rows: Vec<D>) {
        self.last_activity = Instant::now();
        self.idle_reported = false;
        let delay = match (
            self.ctx.pool_gate.arrival_delay(),
            self.ctx.table_gate.arrival_delay(),
        ) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        if let Some(d) = delay {
            // A window is open or a probe is out: nothing is buffered.
            self.hand_back(rows, d);
            self.publisher.dirty = true;
            self.publish_or_arm(myself);
            return;
        }
        let bytes = row_bytes(&rows);
        let s = &self.ctx.settings;
        let cap = self.ctx.common.settings.buffer_cap_batches.max(1);
        if !self.draining
            && (self.buffer.len() + rows.len() > s.batch_rows.saturating_mul(cap)
                || self.buffer.bytes() + bytes > s.batch_bytes.saturating_mul(cap))
            && !self.buffer.is_empty()
        {
            // Memory bound: the table is behind (flights full); let the queue keep them.
            let d = self.ctx.common.settings.table_backoff.initial;
            self.hand_back(rows, d);
        } else {
            self.buffer.push(rows, bytes, Instant::now());
        }
        self.pump(myself);
        self.publisher.dirty = true;
        self.publish_or_arm(myself);
    }

    /// Start every flush that is due and allowed.
    fn pump(&mut self, myself: &ActorRef<TableMsg<D>>) {
        let now = Instant::now();
        let forced = self.draining || self.retiring;
        loop {
            if self.buffer.is_empty() {
                break;
            }
            if !forced
                && (self.flights >= self.ctx.common.settings.max_inflight_flushes.max(1)
                    || self.buffer.due(&self.ctx.settings, now).is_none())
            {
                break;
            }
            let (batch, _bytes, held_since) = self
                .buffer
                .take(self.ctx.settings.batch_rows, self.ctx.settings.batch_bytes);
            match self.admit() {
                Ok((pool, table)) => {
                    self.flights += 1;
                    let me = myself.clone();
                    spawn_flight(
                        self.ctx.clone(),
                        batch,
                        held_since,
                        pool,
                        table,
                        move |out| {
                            let _ = me.cast(TableMsg::FlightDone(out));
                        },
                    );
                }
                Err(delay) => {
                    // Turned away with no request: the rows go back with the remaining
                    // delay (at once when shutting down: another instance may take them).
                    let delay = if self.draining { Duration::ZERO } else { delay };
                    self.hand_back(batch, delay);
                }
            }
            self.publisher.dirty = true;
        }
        self.arm_age(myself);
    }

    fn arm_age(&mut self, myself: &ActorRef<TableMsg<D>>) {
        let Some(deadline) = self.buffer.age_deadline(&self.ctx.settings) else {
            self.age_armed = None;
            return;
        };
        if self.age_armed.is_some_and(|a| a <= deadline) {
            return;
        }
        self.age_gen += 1;
        let gen = self.age_gen;
        self.age_armed = Some(deadline);
        let wait = deadline.saturating_duration_since(Instant::now());
        myself.send_after(wait, move || TableMsg::AgeDue(gen));
    }

    fn maybe_stop(&self, myself: &ActorRef<TableMsg<D>>) {
        if self.retiring && self.flights == 0 && self.buffer.is_empty() {
            myself.stop(Some("idle".into()));
        }
    }
}

impl<I: Inserter, D: Delivery> Actor for TableActor<I, D> {
    type Msg = TableMsg<D>;
    type State = TableState<I, D>;
    type Arguments = TableArgs<I, D>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let now = Instant::now();
        let every = args.ctx.common.settings.snapshot_every;
        Ok(TableState {
            ctx: args.ctx,
            pool: args.pool,
            node_id: args.node_id,
            buffer: Buffer::default(),
            flights: 0,
            age_gen: 0,
            age_armed: None,
            draining: false,
            retiring: false,
            inserted: 0,
            parked: 0,
            handed_back: 0,
            dlq_failures: 0,
            last_error: None,
            last_activity: now,
            idle_reported: false,
            publisher: Publisher::new(every),
            publish_armed: false,
            last_heartbeat: now,
            last_progress: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        myself.send_interval(Duration::from_secs(1), || TableMsg::Tick);
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
            TableMsg::Rows(rows) => state.on_rows(&myself, rows),
            TableMsg::Publish => {
                state.publish_armed = false;
                state.publish_or_arm(&myself);
            }
            TableMsg::AgeDue(gen) => {
                if gen == state.age_gen {
                    state.age_armed = None;
                    state.pump(&myself);
                    state.publish_or_arm(&myself);
                }
            }
            TableMsg::FlightDone(out) => {
                state.flights = state.flights.saturating_sub(1);
                state.inserted += out.inserted as u64;
                state.parked += out.parked as u64;
                state.handed_back += out.handed_back as u64;
                state.dlq_failures += out.dlq_failures as u64;
                if out.last_error.is_some() {
                    state.last_error = out.last_error;
                }
                state.last_activity = Instant::now();
                state.pump(&myself);
                state.publish(true);
                state.maybe_stop(&myself);
            }
            TableMsg::Tick => {
                let now = Instant::now();
                state.pump(&myself);
                let half = state.ctx.common.settings.ack_wait / 2;
                if let Some(oldest) = state.buffer.oldest() {
                    let since = state.last_progress.map_or(oldest, |p| p.max(oldest));
                    if now.saturating_duration_since(since) >= half {
                        for d in state.buffer.iter() {
                            let _ = d.progress().await;
                        }
                        state.last_progress = Some(now);
                    }
                }
                let heartbeat =
                    now.saturating_duration_since(state.last_heartbeat) >= Duration::from_secs(1);
                state.publish(heartbeat);
                if heartbeat {
                    state.last_heartbeat = now;
                }
                let idle_after = state.ctx.common.settings.idle_table_after;
                if !state.idle_reported
                    && !state.retiring
                    && !state.draining
                    && state.buffer.is_empty()
                    && state.flights == 0
                    && state.ctx.table_gate.is_closed()
                    && now.saturating_duration_since(state.last_activity) >= idle_after
                {
                    state.idle_reported = true;
                    let _ = state.pool.cast(PoolMsg::TableIdle {
                        key: state.ctx.key.clone(),
                        id: myself.get_id(),
                    });
                }
            }
            TableMsg::FlushAll(reply) => {
                state.draining = true;
                state.pump(&myself);
                state.publish(true);
                let _ = reply.send(());
            }
            TableMsg::HandBackAll(reply) => {
                let rows = state.buffer.take_all();
                let n = rows.len();
                state.hand_back(rows, Duration::ZERO);
                state.publish(true);
                let _ = reply.send(n);
            }
            TableMsg::Retire => {
                state.retiring = true;
                state.pump(&myself);
                state.maybe_stop(&myself);
            }
            TableMsg::Panic => {
                panic!("injected panic in table actor {}", state.ctx.key);
            }
        }
        Ok(())
    }
}
