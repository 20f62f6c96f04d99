//! What each flight of a table is doing, for whoever looks: the flight sets its stage
//! as it goes, the table reads it for its snapshot (`/admin/actors`) without waiting on
//! the flight. A flight every step of which is bounded still can hang on a step that
//! is not; seen from outside, the stage it hangs in names that step.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::observe::{FlightSnapshot, FlightStage};

/// One flight's progress, shared by the flight (which writes it) and its table (which
/// reads it). The table keeps it while the flight holds it too.
#[derive(Debug)]
pub struct FlightWatch {
    started: Instant,
    stage: AtomicU8,
    /// When the stage began, in ms after `started`.
    stage_at_ms: AtomicU64,
    /// Logged once as stuck.
    warned: AtomicBool,
}

impl FlightWatch {
    pub fn start() -> Arc<Self> {
        Arc::new(Self {
            started: Instant::now(),
            stage: AtomicU8::new(FlightStage::Forming as u8),
            stage_at_ms: AtomicU64::new(0),
            warned: AtomicBool::new(false),
        })
    }

    pub fn enter(&self, stage: FlightStage) {
        let at = self.started.elapsed().as_millis() as u64;
        self.stage_at_ms.store(at, Ordering::Relaxed);
        self.stage.store(stage as u8, Ordering::Relaxed);
    }

    /// The stage it is in now.
    pub fn stage(&self) -> FlightStage {
        FlightStage::from_index(self.stage.load(Ordering::Relaxed))
    }

    pub fn snapshot(&self, now: Instant) -> FlightSnapshot {
        let age = now.saturating_duration_since(self.started);
        let stage = self.stage();
        let at = Duration::from_millis(self.stage_at_ms.load(Ordering::Relaxed));
        FlightSnapshot {
            stage,
            stage_ms: age.saturating_sub(at).as_millis() as u64,
            age_ms: age.as_millis() as u64,
        }
    }

    /// The flight's snapshot the first time it is seen in one stage for `after` or
    /// longer: to be logged once.
    pub fn stuck(&self, now: Instant, after: Duration) -> Option<FlightSnapshot> {
        let s = self.snapshot(now);
        let stuck = Duration::from_millis(s.stage_ms) >= after;
        (stuck && !self.warned.swap(true, Ordering::Relaxed)).then_some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_flight_shows_its_stage_and_is_called_stuck_once() {
        let watch = FlightWatch::start();
        tokio::time::sleep(Duration::from_secs(2)).await;
        watch.enter(FlightStage::Acking);
        tokio::time::sleep(Duration::from_secs(3)).await;
        let s = watch.snapshot(Instant::now());
        assert_eq!(
            s,
            FlightSnapshot {
                stage: FlightStage::Acking,
                stage_ms: 3000,
                age_ms: 5000
            }
        );
        let after = Duration::from_secs(3);
        assert!(watch
            .stuck(Instant::now(), Duration::from_secs(4))
            .is_none());
        assert_eq!(watch.stuck(Instant::now(), after), Some(s));
        assert!(watch.stuck(Instant::now(), after).is_none(), "said once");
    }
}
