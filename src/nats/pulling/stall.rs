//! Whether this process stood still (SIGSTOP, a paused VM or container, a machine
//! swapping), so that rows read just after are not taken for rows just delivered.
//!
//! JetStream's `ack_wait` runs from when the server sends a row. A row the server sent
//! while this process stood still waited in the socket; read after the wake-up, it
//! looks fresh, although its `ack_wait` may have run out and JetStream may have handed
//! it to another instance meanwhile. Stamped with the moment the process stopped, it is
//! known for what it is ([`sluice_actors::batch::keepalive::lease_ran_out`]) and does not start
//! a batch of its own (see docs/operations.md, "Delivery guarantees").
//!
//! A thread of its own (not a task: a task dies with its runtime, and tests run many)
//! wakes every [`TICK`]; a wake-up late by more than [`STALL`] is a stall.

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How often the watch wakes.
const TICK: Duration = Duration::from_millis(100);
/// A wake-up this much late is a stall. Shorter ones are covered by the tenth of
/// `ack_wait` that `lease_ran_out` keeps in reserve.
const STALL: Duration = Duration::from_millis(500);
/// Rows read this soon after a stall may have waited in the socket through it.
const DRAIN: Duration = Duration::from_secs(2);

#[derive(Clone, Copy)]
struct State {
    /// When the watch last woke.
    last_tick: Instant,
    /// The last stall seen: from, to.
    last_stall: Option<(Instant, Instant)>,
}

fn state() -> &'static Mutex<State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    STATE.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("sluice-stall-watch".into())
            .spawn(watch);
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the stall watch: rows read after a freeze of this process are taken as fresh");
        }
        Mutex::new(State {
            last_tick: Instant::now(),
            last_stall: None,
        })
    })
}

fn watch() {
    loop {
        let before = Instant::now();
        std::thread::sleep(TICK);
        let after = Instant::now();
        let mut s = lock();
        if after.duration_since(before) > TICK + STALL {
            s.last_stall = Some((before, after));
        }
        s.last_tick = after;
    }
}

fn lock() -> std::sync::MutexGuard<'static, State> {
    // Two `Copy` fields, each written whole: a poisoned lock still holds them.
    state().lock().unwrap_or_else(|e| e.into_inner())
}

/// When rows read now were sent at the latest, as far as this process can tell: now,
/// unless it just stood still, then when it stopped.
pub fn sent_no_later_than(now: Instant) -> Instant {
    let s = *lock();
    since(&s, now)
}

fn since(s: &State, now: Instant) -> Instant {
    // Standing still right now, or just woken before the watch could say so.
    if now.saturating_duration_since(s.last_tick) > TICK + STALL {
        return s.last_tick;
    }
    match s.last_stall {
        Some((from, to)) if now.saturating_duration_since(to) < DRAIN => from,
        _ => now,
    }
}

/// Start the watch (it starts on first use anyway; starting it early means a stall
/// before the first row is seen too).
pub fn start() {
    let _ = state();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_read_just_after_a_stall_date_from_its_start() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let quiet = State {
            last_tick: at(1000),
            last_stall: None,
        };
        assert_eq!(since(&quiet, at(1050)), at(1050), "no stall: now");
        // Stopped at 1000, woken at 9000, the watch not awake yet.
        assert_eq!(since(&quiet, at(9000)), at(1000));
        // The watch saw it: for DRAIN after the wake-up, still its start.
        let seen = State {
            last_tick: at(9000),
            last_stall: Some((at(1000), at(9000))),
        };
        assert_eq!(since(&seen, at(9500)), at(1000));
        let later = State {
            last_tick: at(11_050),
            last_stall: Some((at(1000), at(9000))),
        };
        assert_eq!(since(&later, at(11_100)), at(11_100), "drained: now");
    }
}
