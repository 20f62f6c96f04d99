//! The one source of chance of a run: every fake and the fault schedule draw from it,
//! in the order the (single-threaded, paused) runtime runs them, so a seed replays.

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

#[derive(Clone)]
pub struct Dice(Arc<Mutex<SmallRng>>);

impl Dice {
    pub fn new(seed: u64) -> Self {
        Self(Arc::new(Mutex::new(SmallRng::seed_from_u64(seed))))
    }

    #[track_caller]
    fn rng(&self) -> std::sync::MutexGuard<'_, SmallRng> {
        if std::env::var_os("SIM_TRACE").is_some() {
            eprintln!("TRACE dice {}", std::panic::Location::caller());
        }
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True with probability `p` (0 never draws).
    #[track_caller]
    pub fn chance(&self, p: f64) -> bool {
        p > 0.0 && self.rng().random_bool(p.min(1.0))
    }

    #[track_caller]
    pub fn below(&self, n: u64) -> u64 {
        if n <= 1 {
            return 0;
        }
        self.rng().random_range(0..n)
    }

    #[track_caller]
    pub fn range(&self, r: Range<u64>) -> u64 {
        if r.end <= r.start + 1 {
            return r.start;
        }
        self.rng().random_range(r)
    }

    /// A duration of `lo..hi` ms.
    #[track_caller]
    pub fn ms(&self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo..hi))
    }

    #[track_caller]
    pub fn pick<'a, T>(&self, of: &'a [T]) -> &'a T {
        &of[self.below(of.len() as u64) as usize]
    }
}
