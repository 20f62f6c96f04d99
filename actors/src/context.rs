//! What every actor of one pipeline is given: settings, the observation registry and
//! the totals (read by observers, never by a decision), the tracker of tasks that hold
//! rows outside any actor, the shutdown tokens and the fatal flag.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backoff::Jitter;
use crate::ledger::{Ledger, ManifestStore};
use crate::observe::{Frame, Registry, Stats};
use crate::settings::{PipelineSettings, TableSettingsResolver};

pub struct Common {
    pub settings: PipelineSettings,
    pub tables: TableSettingsResolver,
    pub registry: Arc<Registry>,
    pub stats: Stats,
    /// Every task that holds rows outside an actor (flights, hand-backs, parks): a
    /// graceful shutdown waits for them (up to its deadline) before it stops the tree.
    pub tracker: TaskTracker,
    /// A graceful shutdown started (nothing is respawned, a second call only waits).
    pub shutdown: CancellationToken,
    /// Stop pulling: the first step of a graceful shutdown (a child of `shutdown`).
    pub stop_pulling: CancellationToken,
    /// The shutdown deadline passed: flights hand back what they still hold.
    pub cancel_flights: CancellationToken,
    /// Set once the pipeline cannot go on; the process must exit non-zero.
    pub fatal: watch::Sender<Option<String>>,
    /// The batch ledger (exactly-once on deduplicating tables): the only way to the
    /// manifest store; without a store every table is at-least-once.
    pub ledger: Ledger,
}

// === impl Common ===

impl Common {
    /// The observation frame of the actor `node_id`: it publishes into this pipeline's
    /// registry, at most once a `snapshot_every`.
    pub fn frame(&self, node_id: impl Into<String>) -> Frame {
        Frame::new(node_id, self.registry.clone(), self.settings.snapshot_every)
    }

    pub fn new(
        settings: PipelineSettings,
        tables: TableSettingsResolver,
        registry: Arc<Registry>,
        manifests: Option<Arc<dyn ManifestStore>>,
    ) -> Arc<Self> {
        let shutdown = CancellationToken::new();
        let ledger = Ledger::new(manifests, settings.wall_clock.clone());
        let (fatal, _) = watch::channel(None);
        Arc::new(Self {
            settings,
            tables,
            registry,
            stats: Stats::default(),
            tracker: TaskTracker::new(),
            stop_pulling: shutdown.child_token(),
            // Not a child: flights keep running after the shutdown starts, until its
            // deadline.
            cancel_flights: CancellationToken::new(),
            shutdown,
            fatal,
            ledger,
        })
    }

    /// The jitter of one breaker, named by `salt` (its node id): seeded from the
    /// settings' seed and the name when the settings carry a seed (tests see fixed,
    /// yet different, delays per breaker), from the OS otherwise.
    pub fn jitter(&self, salt: &str) -> Jitter {
        match self.settings.jitter_seed {
            Some(seed) => {
                let mut h = DefaultHasher::new();
                seed.hash(&mut h);
                salt.hash(&mut h);
                Jitter::seeded(h.finish())
            }
            None => Jitter::from_entropy(),
        }
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
