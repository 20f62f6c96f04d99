//! A table's flights: spawned with their permits, their verdicts taken into the table's
//! backoffs (and passed on to the pools), their outcomes counted.

use super::messages::TableMsg;
use super::state::TableState;
use crate::breaker::Ticket;
use crate::flight::{spawn_flight, FlightLinks};
use crate::observe::flight_watch::FlightWatch;
use crate::ports::{ClickHouseError, Delivery, Inserter};
use crate::protocol::Cargo;
use crate::protocol::{FlightOutcome, FlightVerdict, PendingRows, PoolVerdict, Tickets, Verdict};
use crate::protocol::{FlightRequest, TableCarryOver, TableReport, VerdictReport};
use ractor::{ActorRef, RpcReplyPort};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

impl<I: Inserter, D: Delivery> TableState<I, D> {
    pub(super) fn fly(
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
        self.flights.count += 1;
        let watch = FlightWatch::start();
        self.flights.out.push(watch.clone());
        let links = FlightLinks {
            table: myself.get_derived(),
            pool: self.routes.pool(tickets.replica).cloned(),
            target: self.links.target.clone(),
            root: self.links.orphans.clone(),
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
    pub(super) fn on_verdict(&mut self, v: FlightVerdict) {
        let now = Instant::now();
        let generation = self.routes.generation();
        let was_missing = self.learnt.missing_since;
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
        if self.routes.generation() != generation || self.learnt.missing_since != was_missing {
            self.routes.show_summary(&self.ctx.metrics.backoff, now);
            let _ = self.links.target.send_message(TableReport::CarryOver {
                key,
                carry: Box::new(TableCarryOver {
                    backoffs: self.routes.backoffs().to_vec(),
                    missing_since: self.learnt.missing_since,
                }),
            });
        }
    }

    /// ClickHouse says the table does not exist (on `replica`): wait for it (the table's
    /// backoff there) while the grace lasts, then park what comes.
    pub(super) fn table_missing(
        &mut self,
        replica: usize,
        ticket: Ticket,
        err: &ClickHouseError,
        now: Instant,
    ) -> PendingRows {
        let key = self.ctx.key.clone();
        let grace = self.ctx.settings.missing_table_grace;
        let since = *self.learnt.missing_since.get_or_insert_with(|| {
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
    pub(super) fn table_found(&mut self) {
        if let Some(since) = self.learnt.missing_since.take() {
            self.ctx.metrics.missing.set(0.0);
            tracing::info!(tenant = %self.ctx.key.tenant, table = %self.ctx.key.table,
                waited = %humantime::format_duration(Duration::from_millis(since.elapsed().as_millis() as u64)),
                "the table exists now: its rows are inserted");
        }
    }

    /// The pool's part of a verdict, to the replica's pool (restarting: through the
    /// target, to its successor).
    pub(super) fn tell_pool(
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
        let _ = self.links.target.send_message(TableReport::Verdict(report));
    }

    pub(super) fn on_flight_done(&mut self, myself: &ActorRef<TableMsg<D>>, out: FlightOutcome) {
        self.flights.count = self.flights.count.saturating_sub(1);
        self.flights.out.retain(|w| Arc::strong_count(w) > 1);
        self.learnt.totals.inserted += out.inserted as u64;
        self.learnt.totals.parked += out.parked as u64;
        self.learnt.totals.handed_back += out.handed_back as u64;
        self.learnt.totals.dlq_failures += out.dlq_failures as u64;
        self.learnt.totals.past_dedup_window += u64::from(out.past_dedup_window);
        if out.last_error.is_some() {
            self.learnt.totals.last_error = out.last_error;
        }
        self.ledger.landed(&out.messages);
        self.ledger.remember_settled_lines(out.partly);
        self.strikes.strike(&out.struck);
        if let Some(dedup) = out.dedup {
            self.ctx
                .metrics
                .exactly_once
                .set(if dedup.exactly_once { 1.0 } else { 0.0 });
            self.learnt.dedup = Some(dedup);
        }
        self.timers.last_activity = Instant::now();
        self.pump(myself);
        self.frame.transition();
        self.maybe_stop(myself);
    }
}
