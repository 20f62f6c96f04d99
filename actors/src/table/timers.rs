//! A table's clocks: the age trigger, the heartbeat, progress for rows held long,
//! idleness, stuck flights.

use super::messages::TableMsg;
use super::state::TableState;
use crate::batch::keepalive::lease_ran_out;
use crate::observe::Observed;
use crate::ports::{Delivery, Inserter};
use crate::protocol::TableReport;
use ractor::ActorRef;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

impl<I: Inserter, D: Delivery> TableState<I, D> {
    pub(super) fn on_age_due(&mut self, myself: &ActorRef<TableMsg<D>>, generation: u64) {
        if generation == self.timers.age.generation {
            self.timers.age.armed = None;
            self.pump(myself);
        }
    }

    pub(super) fn arm_age(&mut self, myself: &ActorRef<TableMsg<D>>) {
        let Some(deadline) = self.lanes.age_deadline(&self.ctx.settings) else {
            self.timers.age.armed = None;
            return;
        };
        if self.timers.age.armed.is_some_and(|a| a <= deadline) {
            return;
        }
        if deadline <= Instant::now() {
            // Due already, and `pump` could not send it (its flights are out, or a
            // permit is asked): the flight's end, the permit or the tick pumps again.
            // Armed now, the table would wake itself at once, again and again, until then.
            self.timers.age.armed = None;
            return;
        }
        self.timers.age.generation += 1;
        let generation = self.timers.age.generation;
        self.timers.age.armed = Some(deadline);
        let wait = deadline.saturating_duration_since(Instant::now());
        myself.send_after(wait, move || TableMsg::AgeDue(generation));
    }

    pub(super) fn on_tick(&mut self, myself: &ActorRef<TableMsg<D>>) {
        let now = Instant::now();
        self.pump(myself);
        self.keep_buffered_rows_alive(now);
        self.keep_gathered_alive(now);
        self.beat();
        self.report_idle(myself, now);
        self.warn_of_stuck_flights(now);
    }

    /// A flight in one stage for twice `ack_wait` (a minute at least) is logged once,
    /// with the stage: every step of a flight has a bound, so one that does not end
    /// names the step whose bound is missing.
    pub(super) fn warn_of_stuck_flights(&mut self, now: Instant) {
        let after = (self.ctx.common.settings.ack_wait * 2).max(Duration::from_secs(60));
        self.flights.out.retain(|w| Arc::strong_count(w) > 1);
        for watch in &self.flights.out {
            if let Some(s) = watch.stuck(now, after) {
                tracing::warn!(tenant = %self.ctx.key.tenant, table = %self.ctx.key.table,
                    stage = s.stage.as_str(), in_stage_s = s.stage_ms / 1000, age_s = s.age_ms / 1000,
                    "a flight has been in one stage for long: it holds its rows until it ends");
            }
        }
    }

    /// Rows buffered past half of `ack_wait` get `progress()`, from a task: the
    /// mailbox never waits on NATS for them.
    pub(super) fn keep_buffered_rows_alive(&mut self, now: Instant) {
        let half = self.ctx.common.settings.ack_wait / 2;
        let Some(oldest) = self.lanes.oldest() else {
            return;
        };
        let since = self.timers.last_progress.map_or(oldest, |p| p.max(oldest));
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
        self.timers.last_progress = Some(now);
    }

    /// Messages gathered for a recorded batch (waiting for the rest of it, or for a
    /// flight) get `progress()` like buffered ones, from a task: each once half of
    /// `ack_wait` passed since JetStream last heard of it.
    pub(super) fn keep_gathered_alive(&mut self, now: Instant) {
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

    pub(super) fn report_idle(&mut self, myself: &ActorRef<TableMsg<D>>, now: Instant) {
        let idle_after = self.ctx.common.settings.idle_table_after;
        if !self.timers.idle_reported
            && !self.ending.retiring
            && self.ending.draining.is_none()
            && self.lanes.is_empty()
            && self.ledger.is_idle()
            && self.flights.count == 0
            && self.asking.is_none()
            && self.routes.no_window_running(now)
            && now.saturating_duration_since(self.timers.last_activity) >= idle_after
        {
            self.timers.idle_reported = true;
            let _ = self.links.target.send_message(TableReport::Idle {
                key: self.ctx.key.clone(),
                id: myself.get_id(),
            });
        }
    }
}
