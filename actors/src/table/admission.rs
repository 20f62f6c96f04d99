//! A due batch on its way out: which one, to which replica, asked of the table's own
//! backoff there and then of the replica's pool; what a permit or a refusal makes of it.

use super::messages::TableMsg;
use super::state::{Asking, Next, TableState};
use crate::breaker::Admission;
use crate::placement::Pick;
use crate::ports::{Delivery, Inserter};
use crate::protocol::Cargo;
use crate::protocol::{FlightRequest, Permit, PoolLink};
use crate::protocol::{PoolVerdict, Tickets};
use ractor::ActorRef;
use std::time::Duration;
use tokio::time::Instant;

impl<I: Inserter, D: Delivery> TableState<I, D> {
    /// Ask for the next flight if a batch is due and allowed: a replica is picked (of the
    /// batch's recorded shard, or of any shard in turn), the table's own backoff there
    /// admits it (it owns it), then the replica's pool (by message; the answer is a
    /// `Permit`).
    pub(super) fn pump(&mut self, myself: &ActorRef<TableMsg<D>>) {
        let now = Instant::now();
        let forced = self.ending.draining.is_some() || self.ending.retiring;
        while self.has_work() && self.asking.is_none() {
            let busy = self.flights.count >= self.ctx.common.settings.max_inflight_flushes.max(1);
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
    pub(super) fn next_batch(&self, now: Instant) -> Next {
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
    pub(super) fn ask(
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
    pub(super) fn turned_away(
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
    pub(super) fn has_work(&self) -> bool {
        !self.lanes.is_empty() || self.ledger.has_ready()
    }

    /// Turned away: with the remaining delay, or at once while shutting down (another
    /// instance may take the rows).
    pub(super) fn handback_delay(&self, delay: Duration) -> Duration {
        if self.ending.draining.is_some() {
            Duration::ZERO
        } else {
            delay
        }
    }

    /// The messages of `next`, taken out to fly, with since when they are held (`None`:
    /// gone meanwhile: settled by its record, handed back).
    pub(super) fn take(&mut self, next: &Next) -> Option<(Cargo<D>, Instant)> {
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
    pub(super) fn hand_back_next(&mut self, next: &Next, delay: Duration) {
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

    pub(super) fn on_permit(&mut self, myself: &ActorRef<TableMsg<D>>, permit: Permit) {
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

    pub(super) fn on_pool_link(
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
    pub(super) fn abandon_ask_of_a_gone_pool(
        &mut self,
        myself: &ActorRef<TableMsg<D>>,
        replica: usize,
    ) {
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
}
