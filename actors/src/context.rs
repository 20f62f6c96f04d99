//! What every actor of one pipeline shares: settings, the observation registry, the
//! count of tasks still holding rows (flights, hand-backs), the pipeline's totals, the
//! shutdown signals and the fatal flag.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};

use crate::backoff::Jitter;
use crate::observe::Registry;
use crate::settings::{PipelineSettings, TableSettingsResolver};
use crate::shutdown::{self, Shutdown, ShutdownTrigger};

/// Totals since start (the shutdown summary is the difference).
#[derive(Debug, Default)]
pub struct Stats {
    pub received: AtomicU64,
    pub inserted: AtomicU64,
    pub parked: AtomicU64,
    pub handed_back: AtomicU64,
    pub dlq_failures: AtomicU64,
}

impl Stats {
    pub fn add(c: &AtomicU64, n: usize) {
        if n > 0 {
            c.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// Counts the tasks that hold rows outside any actor (flush tasks, hand-backs), so a
/// shutdown can wait for them.
#[derive(Debug, Default)]
pub struct Tracker {
    n: AtomicUsize,
    idle: Notify,
}

/// Held by a task while it holds rows.
#[derive(Debug)]
pub struct TrackGuard(Arc<Tracker>);

impl Tracker {
    pub fn enter(self: &Arc<Self>) -> TrackGuard {
        self.n.fetch_add(1, Ordering::SeqCst);
        TrackGuard(self.clone())
    }

    pub fn active(&self) -> usize {
        self.n.load(Ordering::SeqCst)
    }

    /// Wait until no task holds rows.
    pub async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.active() == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for TrackGuard {
    fn drop(&mut self) {
        if self.0.n.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Test hooks: make the next N spawns of a kind fail in `pre_start`.
#[derive(Debug, Default)]
pub struct Faults {
    pub consumer_spawn: AtomicU32,
    pub pool_spawn: AtomicU32,
}

impl Faults {
    pub fn take(c: &AtomicU32) -> bool {
        c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }
}

pub struct Common {
    pub settings: PipelineSettings,
    pub tables: TableSettingsResolver,
    pub registry: Arc<Registry>,
    pub tracker: Arc<Tracker>,
    pub stats: Stats,
    /// Stop pulling (first step of a graceful shutdown).
    pub stop_pulling: ShutdownTrigger,
    /// The shutdown deadline passed: flights hand back what they still hold.
    pub cancel_flights: ShutdownTrigger,
    /// Set once the pipeline cannot go on; the process must exit non-zero.
    pub fatal: watch::Sender<Option<String>>,
    pub faults: Faults,
    seeds: AtomicU64,
}

impl Common {
    pub fn new(
        settings: PipelineSettings,
        tables: TableSettingsResolver,
        registry: Arc<Registry>,
    ) -> Arc<Self> {
        let (stop_pulling, _) = shutdown::channel();
        let (cancel_flights, _) = shutdown::channel();
        let (fatal, _) = watch::channel(None);
        Arc::new(Self {
            seeds: AtomicU64::new(settings.jitter_seed.unwrap_or(0)),
            settings,
            tables,
            registry,
            tracker: Arc::new(Tracker::default()),
            stats: Stats::default(),
            stop_pulling,
            cancel_flights,
            fatal,
            faults: Faults::default(),
        })
    }

    /// A jitter source: seeded deterministically when the settings carry a seed.
    pub fn jitter(&self) -> Jitter {
        match self.settings.jitter_seed {
            Some(_) => Jitter::seeded(self.seeds.fetch_add(1, Ordering::Relaxed)),
            None => Jitter::from_entropy(),
        }
    }

    pub fn cancelled(&self) -> Shutdown {
        self.cancel_flights.subscribe()
    }

    pub fn set_fatal(&self, why: String) {
        tracing::error!(error = %why, "the pipeline cannot go on: exiting");
        self.fatal.send_if_modified(|f| {
            if f.is_none() {
                *f = Some(why);
                true
            } else {
                false
            }
        });
    }

    pub fn restart_delay(&self, failures: u32) -> Duration {
        crate::backoff::restart_delay(&self.settings.restart, failures)
    }
}
