//! The wall clock a batch's record reads its time from (`Manifest::claimed_at_ms`: other
//! instances read it, so it is the system's time, not the runtime's monotonic one).
//! Injectable so that a simulation (`actors/tests/simulation/`) runs on its own clock:
//! nothing on its paths may read the system's.

use std::fmt;
use std::sync::Arc;

/// See the module's doc. The default is the system clock.
#[derive(Clone, Default)]
pub struct WallClock {
    /// A clock of the caller's own (ms since the epoch); `None`: the system's.
    simulated: Option<Arc<dyn Fn() -> u64 + Send + Sync>>,
}

impl WallClock {
    /// A clock that reads `now_ms` (ms since the epoch) instead of the system's.
    pub fn simulated(now_ms: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        Self {
            simulated: Some(Arc::new(now_ms)),
        }
    }

    /// Now, in ms since the epoch.
    pub fn now_ms(&self) -> u64 {
        match &self.simulated {
            Some(now) => now(),
            None => system_ms(),
        }
    }
}

impl fmt::Debug for WallClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.simulated.is_some() {
            "WallClock(simulated)"
        } else {
            "WallClock(system)"
        })
    }
}

/// Now by the system's clock, in ms since the epoch.
fn system_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
