//! The PoolActor itself: the owner of one ClickHouse server's outage breaker and single
//! probe token.
//!
//! Everything that decides about the server happens here, in mailbox order: a table's
//! request for a flight is answered with a ticket or a delay, a flight's verdict opens,
//! escalates or closes the window (late ones change nothing), and the pool probes the
//! server itself when a window ended with no traffic, or when nothing was heard for a
//! while. Every transition is published on the target's board at once, so the tables
//! pass an open replica over for its twin.

use std::sync::Arc;

use ractor::{ActorId, ActorProcessingErr, ActorRef, DerivedActorRef, RpcReplyPort};
use tokio::time::Instant;

use super::memory::{PoolMemory, Readiness};
use super::messages::{PoolDebug, PoolMsg, PoolReport};
use super::turns::Turns;
use crate::backoff::Backoff;
use crate::breaker::scoped::ScopedBreaker;
use crate::breaker::{Admission, Ticket};
use crate::context::Common;
use crate::lifecycle::{Behaviour, Lifecycle};
use crate::observe::{self, Frame, NodeState, Observed, PoolSnapshot};
use crate::placement::TargetServers;
use crate::ports::{ClickHouseError, Inserter, ServerInfo, TableKey};
use crate::protocol::{FlightRequest, PendingRows, Permit, PoolVerdict, TurnId, VerdictReport};

/// The PoolActor: its state, run by the tree's one lifecycle.
pub type PoolActor<I> = Lifecycle<PoolState<I>>;

pub struct PoolArgs<I> {
    pub servers: Arc<TargetServers<I>>,
    /// This pool's server: its index in `servers`.
    pub replica: usize,
    pub common: Arc<Common>,
    /// Where the predecessor left off (or a first memory).
    pub memory: PoolMemory,
    /// The target, as far as a pool speaks to it.
    pub target: DerivedActorRef<PoolReport>,
    /// Fault injection: fail in `pre_start` (the root's debug message asks for it).
    pub fail_spawn: bool,
}

pub struct PoolState<I> {
    servers: Arc<TargetServers<I>>,
    replica: usize,
    common: Arc<Common>,
    target: DerivedActorRef<PoolReport>,
    breaker: ScopedBreaker,
    readiness: Readiness,
    readiness_failures: u32,
    /// The table whose flight holds the probe token: should the table die before its
    /// flight started, the token comes back.
    probe_holder: Option<(ActorId, Ticket)>,
    /// The pool's own probe is out (one at a time).
    own_probe_out: bool,
    /// When the server last answered anything (a flight's verdict or a probe).
    last_answer: Instant,
    /// The memory the target holds is out of date.
    memory_dirty: bool,
    /// Fault injection: panic on the next table's request for a flight.
    panic_on_next_flight_request: bool,
    /// Its place in the live tree.
    frame: Frame,
    /// Whose turn it is to talk to the server (a suspect's alone).
    turns: Turns<RpcReplyPort<TurnId>>,
}

// === impl PoolState ===

impl<I: Inserter> PoolState<I> {
    fn new(args: PoolArgs<I>) -> Self {
        let now = Instant::now();
        let PoolMemory {
            mut breaker,
            readiness,
        } = args.memory;
        breaker.take_over(now);
        let replica = args.servers.replica(args.replica);
        let node_id = observe::pool_id(&args.servers.target, &replica.name);
        Self {
            replica: args.replica,
            servers: args.servers,
            frame: args.common.frame(node_id),
            turns: Turns::default(),
            common: args.common,
            target: args.target,
            breaker,
            readiness,
            readiness_failures: 0,
            probe_holder: None,
            own_probe_out: false,
            last_answer: now,
            memory_dirty: true,
            panic_on_next_flight_request: false,
        }
    }

    fn inserter(&self) -> Arc<I> {
        self.servers.replica(self.replica).inserter.clone()
    }

    fn name(&self) -> &str {
        &self.servers.replica(self.replica).name
    }

    /// Send the target a fresh copy of what must outlive this pool, if it changed.
    fn remember(&mut self) {
        if std::mem::take(&mut self.memory_dirty) {
            let _ = self.target.send_message(PoolReport::Remember {
                replica: self.replica,
                memory: Box::new(PoolMemory {
                    breaker: self.breaker.clone(),
                    readiness: self.readiness.clone(),
                }),
            });
        }
    }

    fn pool_snapshot(&self) -> PoolSnapshot {
        let replica = self.servers.replica(self.replica);
        PoolSnapshot {
            target: self.servers.target.to_string(),
            replica: replica.name.to_string(),
            shard: replica.shard + 1,
            breaker: self.breaker.snapshot(Instant::now()),
            probed_ok: self.readiness.probed_ok,
            server_version: self.readiness.server_version.clone(),
            last_probe_error: self.readiness.last_probe_error.clone(),
        }
    }

    /// The board at once (routing reads it), the admin tree when due.
    fn publish(&mut self, transition: bool) {
        if transition {
            self.servers
                .board
                .publish(self.replica, self.breaker.state());
        }
        Observed::publish(self, transition);
    }

    // --- flights ---

    fn on_table_request(&mut self, request: FlightRequest) {
        match request {
            FlightRequest::WantsFlight { key, id, reply } => self.on_wants_flight(key, id, reply),
            FlightRequest::Verdict(report) => self.on_verdict(*report),
            FlightRequest::Turn { alone, reply } => {
                let granted = self.turns.ask(alone, reply);
                self.answer_turns(granted);
            }
            FlightRequest::TurnOver(id) => {
                let granted = self.turns.over(id);
                self.answer_turns(granted);
            }
        }
    }

    /// A table has a batch for this server: the breaker says go (maybe as the probe) or
    /// wait.
    fn on_wants_flight(&mut self, key: TableKey, id: ActorId, reply: DerivedActorRef<Permit>) {
        if self.panic_on_next_flight_request {
            panic!(
                "injected panic in pool actor {} of {} on a flight request of {key}",
                self.name(),
                self.servers.target
            );
        }
        let now = Instant::now();
        let generation = self.breaker.generation();
        let answer = match self.breaker.admit(now) {
            Admission::Go(ticket) => Ok(ticket),
            Admission::Probe(ticket) => {
                self.probe_holder = Some((id, ticket));
                Ok(ticket)
            }
            Admission::Wait(delay) => Err(delay),
        };
        self.memory_dirty |= self.breaker.generation() != generation;
        let permit = Permit {
            replica: self.replica,
            answer,
        };
        if reply.send_message(permit).is_err() {
            if let Ok(ticket) = answer {
                // The table is gone: nobody will fly with this ticket.
                tracing::debug!(pool = %self.servers.target, replica = %self.name(), tenant = %key.tenant,
                    table = %key.table, "a permit found its table gone: its ticket comes back");
                self.forget_ticket(ticket, now);
            }
        }
    }

    /// Tell each flight granted a turn that it may go; one that is gone meanwhile (its
    /// flight cancelled while it waited) gives its turn back at once.
    fn answer_turns(&mut self, mut granted: Vec<(TurnId, RpcReplyPort<TurnId>)>) {
        while let Some((id, reply)) = granted.pop() {
            if reply.send(id).is_err() {
                granted.extend(self.turns.over(id));
            }
        }
    }

    fn on_verdict(&mut self, report: VerdictReport) {
        let VerdictReport {
            key,
            verdict,
            reply,
            ..
        } = report;
        let now = Instant::now();
        let generation = self.breaker.generation();
        match verdict {
            PoolVerdict::Answered(ticket) => {
                self.last_answer = now;
                self.settle_probe(ticket);
                self.breaker.on_answered(ticket, now, Some(&key));
            }
            PoolVerdict::Outage(ticket, err) => {
                self.settle_probe(ticket);
                let failure = self.breaker.on_outage(ticket, &err, now, Some(&key));
                if let Some(reply) = reply {
                    let _ = reply.send(PendingRows::HandBack(failure.delay));
                }
            }
            PoolVerdict::Unfinished(ticket) => self.forget_ticket(ticket, now),
        }
        self.memory_dirty |= self.breaker.generation() != generation;
    }

    fn settle_probe(&mut self, ticket: Ticket) {
        if self
            .probe_holder
            .as_ref()
            .is_some_and(|(_, t)| *t == ticket)
        {
            self.probe_holder = None;
        }
    }

    /// A ticket that will never bring an answer: a probe's token goes back.
    fn forget_ticket(&mut self, ticket: Ticket, now: Instant) {
        self.settle_probe(ticket);
        self.breaker.release(ticket, now);
        self.memory_dirty = true;
    }

    /// A table's actor stopped: if it held the probe token, nobody will report on it.
    fn on_table_gone(&mut self, id: ActorId) {
        if self
            .probe_holder
            .as_ref()
            .is_some_and(|(holder, _)| *holder == id)
        {
            if let Some((_, ticket)) = self.probe_holder.take() {
                self.forget_ticket(ticket, Instant::now());
            }
        }
    }

    // --- probes ---

    fn on_readiness_probe(&mut self, myself: &ActorRef<PoolMsg>) {
        if self.readiness.probed_ok {
            return;
        }
        let inserter = self.inserter();
        let me = myself.clone();
        tokio::spawn(async move {
            let result = inserter.probe().await;
            let _ = me.cast(PoolMsg::ReadinessResult(result));
        });
    }

    fn on_readiness_result(
        &mut self,
        myself: &ActorRef<PoolMsg>,
        result: Result<ServerInfo, ClickHouseError>,
    ) {
        match result {
            Ok(info) => {
                tracing::info!(pool = %self.servers.target, replica = %self.name(), version = %info.version,
                    "ClickHouse server answered its first probe");
                self.readiness = Readiness {
                    probed_ok: true,
                    server_version: Some(info.version),
                    last_probe_error: None,
                };
                self.readiness_failures = 0;
                self.last_answer = Instant::now();
            }
            Err(e) => {
                self.readiness_failures += 1;
                let delay =
                    Backoff::base(&self.common.settings.reconnect, self.readiness_failures - 1);
                tracing::warn!(pool = %self.servers.target, replica = %self.name(), error = %e,
                    retry_in_ms = delay.as_millis() as u64, "ClickHouse server does not answer its probe yet");
                self.readiness.last_probe_error = Some(e.to_string());
                myself.send_after(delay, || PoolMsg::ReadinessProbe);
            }
        }
        self.memory_dirty = true;
        self.frame.transition();
    }

    /// The pool's own probe: when a window ended and no flight came to probe for
    /// `idle_probe_after` (so an idle pool's breaker closes too, and a replica passed
    /// over for its twin comes back), and while closed, when the server said nothing
    /// for `idle_probe_every` (so a server that went down while no traffic flowed shows
    /// as down).
    fn own_probe(&mut self, myself: &ActorRef<PoolMsg>) {
        let now = Instant::now();
        let settings = &self.common.settings;
        if self.own_probe_out || !self.readiness.probed_ok {
            return;
        }
        let window_ended = self
            .breaker
            .probe_due_for(now)
            .is_some_and(|d| d >= settings.idle_probe_after);
        let quiet = self.breaker.is_closed()
            && now.saturating_duration_since(self.last_answer) >= settings.idle_probe_every;
        if !window_ended && !quiet {
            return;
        }
        let generation = self.breaker.generation();
        let ticket = match self.breaker.admit(now) {
            Admission::Go(t) | Admission::Probe(t) => t,
            Admission::Wait(_) => return,
        };
        self.memory_dirty |= self.breaker.generation() != generation;
        self.own_probe_out = true;
        self.last_answer = now;
        let inserter = self.inserter();
        let me = myself.clone();
        tokio::spawn(async move {
            let result = inserter.probe().await;
            let _ = me.cast(PoolMsg::OwnProbeDone { ticket, result });
        });
    }

    fn on_own_probe_done(&mut self, ticket: Ticket, result: Result<ServerInfo, ClickHouseError>) {
        let now = Instant::now();
        self.own_probe_out = false;
        let generation = self.breaker.generation();
        match result {
            Err(e) if e.class.is_outage() && !e.table_scoped => {
                self.breaker.on_outage(ticket, &e, now, None);
            }
            _ => {
                self.last_answer = now;
                self.breaker.on_answered(ticket, now, None);
            }
        }
        self.memory_dirty |= self.breaker.generation() != generation;
    }

    fn on_tick(&mut self, myself: &ActorRef<PoolMsg>) {
        self.own_probe(myself);
        self.beat();
    }

    fn on_debug(&mut self, debug: PoolDebug) {
        match debug {
            PoolDebug::Panic => panic!(
                "injected panic in pool actor {} of {}",
                self.name(),
                self.servers.target
            ),
            PoolDebug::PanicOnNextFlightRequest => self.panic_on_next_flight_request = true,
        }
    }
}

impl<I: Inserter> Observed for PoolState<I> {
    fn frame(&mut self) -> &mut Frame {
        &mut self.frame
    }

    fn snapshot(&self) -> NodeState {
        NodeState::Pool(self.pool_snapshot())
    }
}

impl<I: Inserter> Behaviour for PoolState<I> {
    type Msg = PoolMsg;
    type Args = PoolArgs<I>;

    fn build(args: PoolArgs<I>) -> Result<Self, ActorProcessingErr> {
        if args.fail_spawn {
            let name = args.servers.replica(args.replica).name.clone();
            return Err(format!("injected spawn failure of pool {name}").into());
        }
        Ok(PoolState::new(args))
    }

    async fn started(&mut self, myself: &ActorRef<PoolMsg>) {
        myself.send_interval(self.common.settings.tick_every, || PoolMsg::Tick);
        if !self.readiness.probed_ok {
            let _ = myself.cast(PoolMsg::ReadinessProbe);
        }
        self.remember();
        self.publish(true);
    }

    async fn receive(&mut self, myself: &ActorRef<PoolMsg>, msg: PoolMsg) {
        let generation = self.breaker.generation();
        match msg {
            PoolMsg::FromTable(request) => self.on_table_request(request),
            PoolMsg::TableGone(id) => self.on_table_gone(id),
            PoolMsg::ReadinessProbe => self.on_readiness_probe(myself),
            PoolMsg::ReadinessResult(result) => self.on_readiness_result(myself, result),
            PoolMsg::OwnProbeDone { ticket, result } => self.on_own_probe_done(ticket, result),
            PoolMsg::Tick => self.on_tick(myself),
            PoolMsg::Debug(debug) => self.on_debug(debug),
        }
        // A breaker transition is shown at once; anything else when due.
        let transition = self.breaker.generation() != generation;
        self.remember();
        self.publish(transition);
    }
}
