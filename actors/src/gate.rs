//! A [`Breaker`] shared between its owner and the flush tasks: the pool's outage breaker
//! (owned by the PoolActor's lifecycle, kept by the supervisor across pool restarts) or
//! one table's backoff (kept by the pool across table restarts).
//!
//! Decisions are synchronous under a short `std` mutex (never held across an await), so
//! a flush task reports its outcome straight into the breaker the moment it has it, even
//! when the actor that spawned it has died since. The gate also writes the outage log
//! lines and keeps the breaker gauge.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use metrics::Gauge;
use serde::Serialize;
use tokio::time::Instant;

use crate::backoff::Jitter;
use crate::breaker::{Admission, Breaker, BreakerPhase, BreakerState, Ticket};
use crate::outage_log::{OutageEvent, OutageLog};
use crate::ports::{InsertError, TableKey};
use crate::settings::BackoffPolicy;

/// What the gate guards.
#[derive(Clone, Debug)]
pub enum GateScope {
    /// The whole ClickHouse target (URL + user + database).
    Pool { target: Arc<str> },
    /// One table of a target (table-scoped failures).
    Table { target: Arc<str>, key: TableKey },
}

#[derive(Debug)]
struct Inner {
    breaker: Breaker,
    log: OutageLog,
    last_error: Option<String>,
}

#[derive(Debug)]
pub struct Gate {
    scope: GateScope,
    inner: Mutex<Inner>,
    gauge: Option<Gauge>,
}

/// A breaker's state for the admin tree.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct GateSnapshot {
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

impl Gate {
    pub fn new(
        scope: GateScope,
        policy: BackoffPolicy,
        log_every: Duration,
        jitter: Jitter,
        gauge: Option<Gauge>,
    ) -> Self {
        if let Some(g) = &gauge {
            g.set(0.0);
        }
        Self {
            scope,
            inner: Mutex::new(Inner {
                breaker: Breaker::new(policy, jitter),
                log: OutageLog::new(log_every),
                last_error: None,
            }),
            gauge,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave the breaker half-updated in a
        // way worse than its last state: keep going with it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_gauge(&self, inner: &Inner) {
        if let Some(g) = &self.gauge {
            g.set(inner.breaker.phase().gauge());
        }
    }

    pub fn scope(&self) -> &GateScope {
        &self.scope
    }

    pub fn phase(&self) -> BreakerPhase {
        self.lock().breaker.phase()
    }

    pub fn is_closed(&self) -> bool {
        self.phase() == BreakerPhase::Closed
    }

    /// The delay for rows left unacked on purpose (the cap).
    pub fn cap(&self) -> Duration {
        self.lock().breaker.cap()
    }

    pub fn admit(self: &Arc<Self>) -> Result<GatePass, Duration> {
        let mut inner = self.lock();
        let adm = inner.breaker.admit(Instant::now());
        if matches!(adm, Admission::Probe(_)) {
            self.set_gauge(&inner);
        }
        match adm {
            Admission::Go(ticket) | Admission::Probe(ticket) => Ok(GatePass {
                gate: Some(self.clone()),
                ticket,
            }),
            Admission::Wait(d) => Err(d),
        }
    }

    /// `Some(delay)`: hand an arriving row back rather than buffer it.
    pub fn arrival_delay(&self) -> Option<Duration> {
        self.lock().breaker.arrival_delay(Instant::now())
    }

    /// A window ended and nobody took the probe token yet.
    pub fn probe_due_for(&self) -> Option<Duration> {
        let inner = self.lock();
        match inner.breaker.state() {
            BreakerState::Open { until } => {
                let now = Instant::now();
                (now >= until).then(|| now - until)
            }
            _ => None,
        }
    }

    fn report_ok(&self, ticket: Ticket, ctx: Option<&TableKey>) {
        let mut inner = self.lock();
        let now = Instant::now();
        if let Some(lasted) = inner.breaker.on_success(ticket, now) {
            self.set_gauge(&inner);
            if let Some(OutageEvent::Ended { lasted: l }) = inner.log.on_recovered(now) {
                let _ = lasted;
                self.log_ended(l, ctx);
            }
        }
    }

    fn report_outage(&self, ticket: Ticket, err: &InsertError, ctx: Option<&TableKey>) -> Duration {
        let mut inner = self.lock();
        let now = Instant::now();
        let f = inner.breaker.on_failure(ticket, now);
        inner.last_error = Some(err.to_string());
        self.set_gauge(&inner);
        if let Some(ev) = inner.log.on_failure(now) {
            let remaining = inner.breaker.remaining(now).unwrap_or(f.delay);
            self.log_failure(ev, err, remaining, ctx);
        }
        f.delay
    }

    fn release(&self, ticket: Ticket) {
        let mut inner = self.lock();
        inner.breaker.release(ticket, Instant::now());
        self.set_gauge(&inner);
    }

    fn log_failure(
        &self,
        ev: OutageEvent,
        err: &InsertError,
        window: Duration,
        ctx: Option<&TableKey>,
    ) {
        let code = err.code.map(|c| c as i64).unwrap_or(-1);
        let window_ms = window.as_millis() as u64;
        // Absent (not empty) when no table was involved, e.g. an idle probe.
        let (tenant, table) = (ctx.map(|k| &*k.tenant), ctx.map(|k| &*k.table));
        match (&self.scope, ev) {
            (GateScope::Pool { target }, OutageEvent::Started) => tracing::warn!(
                pool = %target, tenant, table, class = %err.class, code, window_ms, error = %err.message,
                "ClickHouse target unavailable: every table on it backs off"
            ),
            (GateScope::Pool { target }, OutageEvent::Continuing { lasted, suppressed }) => {
                tracing::warn!(
                    pool = %target, tenant, table, class = %err.class, code, window_ms,
                    lasted = %humantime::format_duration(round_ms(lasted)), suppressed, error = %err.message,
                    "ClickHouse target still unavailable"
                )
            }
            (GateScope::Table { target, key }, OutageEvent::Started) => tracing::warn!(
                pool = %target, tenant = %key.tenant, table = %key.table, class = %err.class, code, window_ms,
                error = %err.message, "table unavailable: it backs off alone"
            ),
            (GateScope::Table { target, key }, OutageEvent::Continuing { lasted, suppressed }) => {
                tracing::warn!(
                    pool = %target, tenant = %key.tenant, table = %key.table, class = %err.class, code, window_ms,
                    lasted = %humantime::format_duration(round_ms(lasted)), suppressed, error = %err.message,
                    "table still unavailable"
                )
            }
            (_, OutageEvent::Ended { .. }) => {}
        }
    }

    fn log_ended(&self, lasted: Duration, ctx: Option<&TableKey>) {
        // Absent (not empty) when no table was involved, e.g. an idle probe.
        let (tenant, table) = (ctx.map(|k| &*k.tenant), ctx.map(|k| &*k.table));
        match &self.scope {
            GateScope::Pool { target } => tracing::info!(
                pool = %target, tenant, table, lasted = %humantime::format_duration(round_ms(lasted)),
                "ClickHouse target takes inserts again"
            ),
            GateScope::Table { target, key } => tracing::info!(
                pool = %target, tenant = %key.tenant, table = %key.table,
                lasted = %humantime::format_duration(round_ms(lasted)), "table takes inserts again"
            ),
        }
    }

    pub fn snapshot(&self) -> GateSnapshot {
        let inner = self.lock();
        let now = Instant::now();
        let remaining = inner.breaker.remaining(now);
        GateSnapshot {
            state: inner.breaker.phase(),
            window_remaining_ms: remaining.map(|d| d.as_millis() as u64),
            window_until: remaining
                .map(|d| humantime::format_rfc3339_millis(SystemTime::now() + d).to_string()),
            probe_out: inner.breaker.phase() == BreakerPhase::Probing,
            outage_for_ms: inner
                .breaker
                .outage_since()
                .map(|s| now.saturating_duration_since(s).as_millis() as u64),
            last_error: inner.last_error.clone(),
        }
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

/// Permission to send one request through a gate. Report its outcome with `ok` or
/// `outage`; dropped unreported (the flush task died, shutdown cancelled it), a probe's
/// token is given back so the next flush probes.
#[derive(Debug)]
pub struct GatePass {
    gate: Option<Arc<Gate>>,
    ticket: Ticket,
}

impl GatePass {
    pub fn is_probe(&self) -> bool {
        self.ticket.is_probe()
    }

    /// A non-outage answer (success or a judged row): closes the window if this was the probe.
    pub fn ok(mut self, ctx: Option<&TableKey>) {
        if let Some(g) = self.gate.take() {
            g.report_ok(self.ticket, ctx);
        }
    }

    /// An outage answer: opens or escalates the window (unless late); returns the delay
    /// to nak the rows with.
    pub fn outage(mut self, err: &InsertError, ctx: Option<&TableKey>) -> Duration {
        match self.gate.take() {
            Some(g) => g.report_outage(self.ticket, err, ctx),
            None => Duration::ZERO,
        }
    }
}

impl Drop for GatePass {
    fn drop(&mut self) {
        if let Some(g) = self.gate.take() {
            g.release(self.ticket);
        }
    }
}
