//! The outage breaker: Closed → Open{until} → Probing → Closed.
//!
//! Pure and synchronous, time injected: every method takes `now`. One instance per
//! ClickHouse pool (owned by the PoolActor, inside its
//! [`scoped::ScopedBreaker`]), and one per table for
//! table-scoped failures (a read-only table backs off alone), owned by its TableActor.
//!
//! - Closed: every flush goes. An outage answer opens a window of `initial` (jittered).
//! - Open{until}: no request; arrivals are handed back with the remaining delay.
//! - When the window has ended, the first flush to ask takes the single probe token
//!   (→ Probing). While the probe is out, everyone else waits ≥ `probe_handback_min`.
//! - The probe's answer: anything that is not an outage closes the breaker; an outage
//!   escalates the window (doubling to the cap).
//! - Every request carries a [`Ticket`] stamped with the breaker's epoch (bumped at every
//!   transition). A failure whose ticket predates the current state — a flush that
//!   started before the window opened — is *late*: it never escalates or reopens.

pub mod gate;
pub mod outage_log;
pub mod scoped;

pub use gate::Gate;
pub use scoped::{BreakerSnapshot, ScopedBreaker};

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::backoff::BackoffPolicy;
use crate::backoff::{Backoff, Jitter};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open { until: Instant },
    Probing { since: Instant },
}

/// The state's name, as metrics and snapshots show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerPhase {
    Closed,
    Open,
    Probing,
}

impl BreakerPhase {
    /// The value of `sluice_breaker_state` / `sluice_table_backoff`.
    pub fn gauge(self) -> f64 {
        match self {
            BreakerPhase::Closed => 0.0,
            BreakerPhase::Open => 1.0,
            BreakerPhase::Probing => 2.0,
        }
    }
}

/// Permission to send one request, stamped with the breaker's epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    epoch: u64,
    probe: bool,
}

impl Ticket {
    pub fn is_probe(&self) -> bool {
        self.probe
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Closed: send.
    Go(Ticket),
    /// The window ended: this request is the probe (the token is taken).
    Probe(Ticket),
    /// Turned away: hand the rows back with this delay.
    Wait(Duration),
}

/// What a reported outage did to the breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Nak the rows with this delay (the window's remaining time).
    pub delay: Duration,
    /// The breaker was closed and this failure opened it: an outage starts.
    pub opened: bool,
    /// The probe failed: the window escalated.
    pub escalated: bool,
    /// The request started before the current state: nothing changed.
    pub late: bool,
}

/// `Clone`: an owner's memory survives its restart as a copy handed back through its
/// supervisor.
#[derive(Clone, Debug)]
pub struct Breaker {
    state: BreakerState,
    backoff: Backoff,
    epoch: u64,
    outage_since: Option<Instant>,
}

impl Breaker {
    pub fn new(policy: BackoffPolicy, jitter: Jitter) -> Self {
        Self {
            state: BreakerState::Closed,
            backoff: Backoff::new(policy, jitter),
            epoch: 0,
            outage_since: None,
        }
    }

    pub fn state(&self) -> BreakerState {
        self.state
    }

    pub fn phase(&self) -> BreakerPhase {
        match self.state {
            BreakerState::Closed => BreakerPhase::Closed,
            BreakerState::Open { .. } => BreakerPhase::Open,
            BreakerState::Probing { .. } => BreakerPhase::Probing,
        }
    }

    pub fn policy(&self) -> &BackoffPolicy {
        self.backoff.policy()
    }

    /// Bumped at every transition: an owner compares it before and after a report to
    /// know whether the state changed.
    pub fn generation(&self) -> u64 {
        self.epoch
    }

    /// When the current outage started (first failure), while it lasts.
    pub fn outage_since(&self) -> Option<Instant> {
        self.outage_since
    }

    /// Time left in an open window (zero once it ended and nobody probed yet).
    pub fn remaining(&self, now: Instant) -> Option<Duration> {
        match self.state {
            BreakerState::Open { until } => Some(until.saturating_duration_since(now)),
            _ => None,
        }
    }

    /// Whether a window ended and nobody took the probe token yet.
    pub fn probe_due(&self, now: Instant) -> bool {
        matches!(self.state, BreakerState::Open { until } if now >= until)
    }

    /// May a request go now? Taking the probe token is a transition.
    pub fn admit(&mut self, now: Instant) -> Admission {
        match self.state {
            BreakerState::Closed => Admission::Go(Ticket {
                epoch: self.epoch,
                probe: false,
            }),
            BreakerState::Open { until } if now < until => Admission::Wait(until - now),
            BreakerState::Open { .. } => {
                self.epoch += 1;
                self.state = BreakerState::Probing { since: now };
                Admission::Probe(Ticket {
                    epoch: self.epoch,
                    probe: true,
                })
            }
            BreakerState::Probing { .. } => Admission::Wait(self.policy().probe_handback_min),
        }
    }

    /// Should an arriving row be handed back rather than buffered, and with what delay?
    /// Open: the remaining window. Probing: at least `probe_handback_min`. A window
    /// that has ended with no probe yet takes rows (the next flush probes).
    pub fn arrival_delay(&self, now: Instant) -> Option<Duration> {
        match self.state {
            BreakerState::Closed => None,
            BreakerState::Open { until } if now < until => Some(until - now),
            BreakerState::Open { .. } => None,
            BreakerState::Probing { .. } => Some(self.policy().probe_handback_min),
        }
    }

    /// A non-outage answer (success, or a row judged Rejected). Closes the breaker
    /// when it is the current probe's. Returns the outage's duration when it closed.
    pub fn on_success(&mut self, ticket: Ticket, now: Instant) -> Option<Duration> {
        if ticket.probe
            && ticket.epoch == self.epoch
            && matches!(self.state, BreakerState::Probing { .. })
        {
            self.epoch += 1;
            self.state = BreakerState::Closed;
            self.backoff.reset();
            let lasted = self
                .outage_since
                .take()
                .map(|s| now.saturating_duration_since(s))
                .unwrap_or_default();
            return Some(lasted);
        }
        None
    }

    /// An outage answer. Opens (from Closed) or escalates (the probe's), unless late.
    pub fn on_failure(&mut self, ticket: Ticket, now: Instant) -> Failure {
        if ticket.epoch != self.epoch {
            let delay = match self.state {
                BreakerState::Open { until } => until.saturating_duration_since(now),
                BreakerState::Probing { .. } => self.policy().probe_handback_min,
                BreakerState::Closed => self.backoff.initial_jittered(),
            };
            return Failure {
                delay,
                opened: false,
                escalated: false,
                late: true,
            };
        }
        let (opened, escalated) = match self.state {
            BreakerState::Closed => {
                self.backoff.reset();
                self.outage_since = Some(now);
                (true, false)
            }
            BreakerState::Probing { .. } => (false, true),
            // A current ticket while open cannot exist (opening bumps the epoch).
            BreakerState::Open { until } => {
                return Failure {
                    delay: until.saturating_duration_since(now),
                    opened: false,
                    escalated: false,
                    late: true,
                };
            }
        };
        let delay = self.backoff.next_delay();
        self.epoch += 1;
        self.state = BreakerState::Open { until: now + delay };
        Failure {
            delay,
            opened,
            escalated,
            late: false,
        }
    }

    /// The probe ended without an answer (its task died, shutdown cancelled it): give
    /// the token back so the next flush probes, with no escalation.
    pub fn release(&mut self, ticket: Ticket, now: Instant) {
        if ticket.probe
            && ticket.epoch == self.epoch
            && matches!(self.state, BreakerState::Probing { .. })
        {
            self.epoch += 1;
            self.state = BreakerState::Open { until: now };
        }
    }

    /// A new owner takes this breaker over after the old one died (a respawned pool or
    /// table): a probe the old owner had out can no longer report to anyone who knows
    /// it, so its token is given back at once (its answer, should it still come, is
    /// late). The window, the escalation step and the outage's start are kept.
    pub fn take_over(&mut self, now: Instant) {
        if let BreakerState::Probing { .. } = self.state {
            self.epoch += 1;
            self.state = BreakerState::Open { until: now };
        }
    }

    /// The delay for rows left unacked on purpose (DLQ off or failing): the cap.
    pub fn cap(&self) -> Duration {
        self.backoff.cap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker::new(BackoffPolicy::default(), Jitter::seeded(42))
    }

    /// A breaker opened by one failure at `t0`, and the moment its window ends.
    fn opened() -> (Breaker, Instant, Instant) {
        let mut b = breaker();
        let t0 = Instant::now();
        let t = go(b.admit(t0));
        let f = b.on_failure(t, t0);
        (b, t0, t0 + f.delay)
    }

    fn go(a: Admission) -> Ticket {
        match a {
            Admission::Go(t) | Admission::Probe(t) => t,
            Admission::Wait(d) => panic!("turned away for {d:?}"),
        }
    }

    #[test]
    fn closed_lets_everything_through() {
        let mut b = breaker();
        let now = Instant::now();
        assert!(matches!(b.admit(now), Admission::Go(_)));
        assert!(matches!(b.admit(now), Admission::Go(_)));
        assert_eq!(b.arrival_delay(now), None);
        assert_eq!(b.phase(), BreakerPhase::Closed);
    }

    #[test]
    fn escalation_follows_the_policy_with_jitter_bounds() {
        let mut b = breaker();
        let mut now = Instant::now();
        let t = go(b.admit(now));
        let f = b.on_failure(t, now);
        assert!(f.opened && !f.escalated && !f.late);
        let mut windows = vec![f.delay];
        for _ in 0..7 {
            now += windows.last().copied().unwrap();
            let probe = match b.admit(now) {
                Admission::Probe(t) => t,
                other => panic!("expected the probe, got {other:?}"),
            };
            let f = b.on_failure(probe, now);
            assert!(f.escalated && !f.opened && !f.late);
            windows.push(f.delay);
        }
        let bases = [1, 2, 4, 8, 16, 30, 30, 30];
        for (w, base) in windows.iter().zip(bases) {
            let base = Duration::from_secs(base);
            assert!(
                *w >= base / 2 && *w <= base,
                "{w:?} outside [{:?}, {base:?}]",
                base / 2
            );
        }
    }

    #[test]
    fn open_turns_everyone_away_with_the_remaining_delay() {
        let mut b = breaker();
        let t0 = Instant::now();
        let t = go(b.admit(t0));
        let f = b.on_failure(t, t0);
        let later = t0 + f.delay / 4;
        assert_eq!(b.admit(later), Admission::Wait(f.delay - f.delay / 4));
        assert_eq!(b.arrival_delay(later), Some(f.delay - f.delay / 4));
        assert_eq!(b.remaining(later), Some(f.delay - f.delay / 4));
        assert_eq!(b.phase(), BreakerPhase::Open);
    }

    #[test]
    fn exactly_one_probe_and_the_rest_wait_half_a_second() {
        let (mut b, t0, end) = opened();
        // The window ended: arrivals are taken (the next flush probes).
        assert_eq!(b.arrival_delay(end), None);
        assert!(b.probe_due(end));
        let probe = match b.admit(end) {
            Admission::Probe(t) => t,
            other => panic!("{other:?}"),
        };
        assert!(probe.is_probe());
        for _ in 0..5 {
            assert_eq!(b.admit(end), Admission::Wait(Duration::from_millis(500)));
        }
        assert_eq!(b.arrival_delay(end), Some(Duration::from_millis(500)));
        assert_eq!(b.phase(), BreakerPhase::Probing);
        // The probe answers: closed, and the outage's length is reported.
        let lasted = b.on_success(probe, end + Duration::from_millis(10));
        assert_eq!(lasted, Some(end - t0 + Duration::from_millis(10)));
        assert_eq!(b.phase(), BreakerPhase::Closed);
        // Next outage starts from the initial window again.
        let t = go(b.admit(end));
        let f2 = b.on_failure(t, end);
        assert!(f2.opened && f2.delay <= Duration::from_secs(1));
    }

    #[test]
    fn late_failures_do_not_escalate_or_reopen() {
        let mut b = breaker();
        let t0 = Instant::now();
        // Two flushes start while closed.
        let a = go(b.admit(t0));
        let c = go(b.admit(t0));
        let f = b.on_failure(a, t0);
        assert!(f.opened);
        let until = t0 + f.delay;
        // The second one fails later, while the window runs: late, no escalation.
        let later = t0 + Duration::from_millis(100);
        let f2 = b.on_failure(c, later);
        assert!(f2.late && !f2.escalated && !f2.opened);
        assert_eq!(f2.delay, until - later);
        assert_eq!(b.state(), BreakerState::Open { until });
        // A late success does not close the window either.
        assert_eq!(b.on_success(c, later), None);
        assert_eq!(b.phase(), BreakerPhase::Open);
        // After a probe closed it, an old flight's failure does not reopen it.
        let probe = go(b.admit(until));
        b.on_success(probe, until);
        let f3 = b.on_failure(c, until);
        assert!(f3.late);
        assert_eq!(b.phase(), BreakerPhase::Closed);
        assert!(f3.delay <= Duration::from_secs(1));
    }

    #[test]
    fn a_new_owner_takes_over_the_window_and_gives_a_lost_probe_back() {
        let (mut b, t0, end) = opened();
        let probe = go(b.admit(end));
        // The owner dies with the probe out; its successor gets a copy.
        let mut successor = b.clone();
        successor.take_over(end);
        assert!(successor.probe_due(end), "the token is free again");
        let second = match successor.admit(end) {
            Admission::Probe(t) => t,
            other => panic!("{other:?}"),
        };
        // The lost probe's answer is late: it neither closes nor escalates.
        assert_eq!(successor.on_success(probe, end), None);
        assert!(successor.on_failure(probe, end).late);
        assert_eq!(successor.phase(), BreakerPhase::Probing);
        assert!(successor.on_success(second, end).is_some());
        // An open window is kept as it was.
        let mut open = breaker();
        let t = go(open.admit(t0));
        let f = open.on_failure(t, t0);
        let mut copy = open.clone();
        copy.take_over(t0);
        assert_eq!(copy.remaining(t0), Some(f.delay));
    }

    #[test]
    fn a_probe_that_never_answers_gives_the_token_back() {
        let (mut b, _, end) = opened();
        let probe = go(b.admit(end));
        b.release(probe, end);
        assert!(b.probe_due(end));
        assert!(matches!(b.admit(end), Admission::Probe(_)));
        // No escalation happened: the window of the next failure is still step 1 (≤ 2 s).
        let p2 = match b.state() {
            BreakerState::Probing { .. } => Ticket {
                epoch: b.epoch,
                probe: true,
            },
            s => panic!("{s:?}"),
        };
        let f2 = b.on_failure(p2, end);
        assert!(f2.delay <= Duration::from_secs(2));
    }
}
