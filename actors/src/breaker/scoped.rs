//! A [`Breaker`] together with what its owner shows and says about it: the outage log
//! lines (WARN when it starts, at most every 30 s, INFO with the duration), the breaker
//! gauge and the last error.
//!
//! Owned, never shared: the PoolActor owns its target's (the outage breaker), each
//! TableActor its own table's (table-scoped backoff). Flights report to the owner by
//! message and the owner applies the report here, so every decision about a window is
//! taken in one place, in the owner's mailbox order. Time is passed in; only the log
//! lines and the gauge reach outside.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use metrics::Gauge;
use serde::Serialize;
use tokio::time::Instant;

use crate::backoff::BackoffPolicy;
use crate::backoff::Jitter;
use crate::breaker::outage_log::{OutageEvent, OutageLog};
use crate::breaker::{Admission, Breaker, BreakerPhase, BreakerState, Failure, Ticket};
use crate::ports::{ClickHouseError, TableKey};

/// What a breaker guards.
#[derive(Clone, Debug)]
pub enum BreakerScope {
    /// One ClickHouse server of a target (a replica of one of its shards).
    Pool { target: Arc<str>, replica: Arc<str> },
    /// One table on one server of a target (table-scoped failures: read-only there,
    /// too many parts...).
    Table {
        target: Arc<str>,
        replica: Arc<str>,
        key: TableKey,
    },
}

/// A breaker's state for the admin tree.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct BreakerSnapshot {
    pub state: BreakerPhase,
    /// Time left in the open window, in ms (0: ended, the next flush probes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_remaining_ms: Option<u64>,
    /// The window's end as wall-clock time (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_until: Option<String>,
    pub probe_out: bool,
    /// How long the current outage has lasted, in ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outage_for_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

impl BreakerSnapshot {
    /// A breaker that never opened.
    pub fn closed() -> Self {
        Self {
            state: BreakerPhase::Closed,
            window_remaining_ms: None,
            window_until: None,
            probe_out: false,
            outage_for_ms: None,
            last_error: None,
        }
    }
}

/// `Clone`: the owner's memory is handed back to its successor through the supervisor.
#[derive(Clone, Debug)]
pub struct ScopedBreaker {
    scope: BreakerScope,
    breaker: Breaker,
    log: OutageLog,
    last_error: Option<String>,
    gauge: Gauge,
}

// === impl ScopedBreaker ===

impl ScopedBreaker {
    pub fn new(
        scope: BreakerScope,
        policy: BackoffPolicy,
        log_every: Duration,
        jitter: Jitter,
        gauge: Gauge,
    ) -> Self {
        gauge.set(BreakerPhase::Closed.gauge());
        Self {
            scope,
            breaker: Breaker::new(policy, jitter),
            log: OutageLog::new(log_every),
            last_error: None,
            gauge,
        }
    }

    pub fn phase(&self) -> BreakerPhase {
        self.breaker.phase()
    }

    pub fn is_closed(&self) -> bool {
        self.phase() == BreakerPhase::Closed
    }

    /// Bumped at every transition (see [`Breaker::generation`]).
    pub fn generation(&self) -> u64 {
        self.breaker.generation()
    }

    /// The delay for rows left unacked on purpose (the cap).
    pub fn cap(&self) -> Duration {
        self.breaker.cap()
    }

    /// May a request go now? Taking the probe token is a transition.
    pub fn admit(&mut self, now: Instant) -> Admission {
        let admission = self.breaker.admit(now);
        self.show();
        admission
    }

    /// `Some(delay)`: hand an arriving row back rather than buffer it.
    pub fn arrival_delay(&self, now: Instant) -> Option<Duration> {
        self.breaker.arrival_delay(now)
    }

    /// The breaker as routing sees it (see [`crate::breaker::Gate`]).
    pub fn gate(&self, now: Instant) -> crate::breaker::Gate {
        crate::breaker::Gate::of(
            self.breaker.state(),
            now,
            self.breaker.policy().probe_handback_min,
        )
    }

    /// The breaker's state, as its owner publishes it on the board.
    pub fn state(&self) -> crate::breaker::BreakerState {
        self.breaker.state()
    }

    /// How long ago a window ended with nobody taking the probe token yet.
    pub fn probe_due_for(&self, now: Instant) -> Option<Duration> {
        match self.breaker.state() {
            BreakerState::Open { until } if now >= until => Some(now - until),
            _ => None,
        }
    }

    /// A non-outage answer (a success, or a row judged Rejected): closes the window if
    /// `ticket` is the current probe's. Returns whether it closed.
    pub fn on_answered(&mut self, ticket: Ticket, now: Instant, ctx: Option<&TableKey>) -> bool {
        let Some(_) = self.breaker.on_success(ticket, now) else {
            return false;
        };
        self.show();
        if let Some(OutageEvent::Ended { lasted }) = self.log.on_recovered(now) {
            self.log_ended(lasted, ctx);
        }
        true
    }

    /// An outage answer: opens or escalates the window (unless late). The rows of the
    /// request go back with `Failure::delay`.
    pub fn on_outage(
        &mut self,
        ticket: Ticket,
        err: &ClickHouseError,
        now: Instant,
        ctx: Option<&TableKey>,
    ) -> Failure {
        let failure = self.breaker.on_failure(ticket, now);
        self.last_error = Some(err.to_string());
        self.show();
        if let Some(event) = self.log.on_failure(now) {
            let window = self.breaker.remaining(now).unwrap_or(failure.delay);
            self.log_failure(event, err, window, ctx);
        }
        failure
    }

    /// A request ended without an answer (cancelled, its task gone): a probe's token
    /// goes back with no escalation.
    pub fn release(&mut self, ticket: Ticket, now: Instant) {
        self.breaker.release(ticket, now);
        self.show();
    }

    /// A successor takes this breaker over (see [`Breaker::take_over`]).
    pub fn take_over(&mut self, now: Instant) {
        self.breaker.take_over(now);
        self.show();
    }

    pub fn snapshot(&self, now: Instant) -> BreakerSnapshot {
        let remaining = self.breaker.remaining(now);
        BreakerSnapshot {
            state: self.phase(),
            window_remaining_ms: remaining.map(|d| d.as_millis() as u64),
            window_until: remaining
                .map(|d| humantime::format_rfc3339_millis(SystemTime::now() + d).to_string()),
            probe_out: self.phase() == BreakerPhase::Probing,
            outage_for_ms: self
                .breaker
                .outage_since()
                .map(|s| now.saturating_duration_since(s).as_millis() as u64),
            last_error: self.last_error.clone(),
        }
    }

    fn show(&self) {
        self.gauge.set(self.phase().gauge());
    }

    fn log_failure(
        &self,
        event: OutageEvent,
        err: &ClickHouseError,
        window: Duration,
        ctx: Option<&TableKey>,
    ) {
        let code = err.code.map(i64::from).unwrap_or(-1);
        let window_ms = window.as_millis() as u64;
        // Absent (not empty) when no table was involved, e.g. an idle probe.
        let (tenant, table) = (ctx.map(|k| &*k.tenant), ctx.map(|k| &*k.table));
        match (&self.scope, event) {
            (BreakerScope::Pool { target, replica }, OutageEvent::Started) => tracing::warn!(
                pool = %target, %replica, tenant, table, class = %err.class, code, window_ms, error = %err.message,
                "ClickHouse server unavailable: no batch goes to it (its shard's other replicas take them)"
            ),
            (
                BreakerScope::Pool { target, replica },
                OutageEvent::Continuing { lasted, suppressed },
            ) => {
                tracing::warn!(
                    pool = %target, %replica, tenant, table, class = %err.class, code, window_ms,
                    lasted = %humantime::format_duration(round_ms(lasted)), suppressed, error = %err.message,
                    "ClickHouse server still unavailable"
                )
            }
            (
                BreakerScope::Table {
                    target,
                    replica,
                    key,
                },
                OutageEvent::Started,
            ) => tracing::warn!(
                pool = %target, %replica, tenant = %key.tenant, table = %key.table, class = %err.class, code, window_ms,
                error = %err.message, "table unavailable on this server: it backs off alone there"
            ),
            (
                BreakerScope::Table {
                    target,
                    replica,
                    key,
                },
                OutageEvent::Continuing { lasted, suppressed },
            ) => {
                tracing::warn!(
                    pool = %target, %replica, tenant = %key.tenant, table = %key.table, class = %err.class, code, window_ms,
                    lasted = %humantime::format_duration(round_ms(lasted)), suppressed, error = %err.message,
                    "table still unavailable on this server"
                )
            }
            (_, OutageEvent::Ended { .. }) => {}
        }
    }

    fn log_ended(&self, lasted: Duration, ctx: Option<&TableKey>) {
        let (tenant, table) = (ctx.map(|k| &*k.tenant), ctx.map(|k| &*k.table));
        match &self.scope {
            BreakerScope::Pool { target, replica } => tracing::info!(
                pool = %target, %replica, tenant, table, lasted = %humantime::format_duration(round_ms(lasted)),
                "ClickHouse server takes inserts again"
            ),
            BreakerScope::Table {
                target,
                replica,
                key,
            } => tracing::info!(
                pool = %target, %replica, tenant = %key.tenant, table = %key.table,
                lasted = %humantime::format_duration(round_ms(lasted)), "table takes inserts again"
            ),
        }
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}
