//! The pipeline's running totals since start (rows received, inserted, parked, handed
//! back, DLQ failures): `PipelineHandle::stats()` and the shutdown summary, which is the
//! difference of two readings. Counted where the rows are settled; read by observers.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

#[derive(Debug, Default)]
pub struct Stats {
    received: AtomicU64,
    inserted: AtomicU64,
    parked: AtomicU64,
    handed_back: AtomicU64,
    dlq_failures: AtomicU64,
}

/// Totals since the pipeline started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StatsSnapshot {
    pub received: u64,
    pub inserted: u64,
    pub parked: u64,
    pub handed_back: u64,
    pub dlq_failures: u64,
}

// === impl Stats ===

impl Stats {
    pub fn received(&self, n: usize) {
        add(&self.received, n);
    }

    pub fn inserted(&self, n: usize) {
        add(&self.inserted, n);
    }

    pub fn parked(&self, n: usize) {
        add(&self.parked, n);
    }

    pub fn handed_back(&self, n: usize) {
        add(&self.handed_back, n);
    }

    pub fn dlq_failures(&self, n: usize) {
        add(&self.dlq_failures, n);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            received: get(&self.received),
            inserted: get(&self.inserted),
            parked: get(&self.parked),
            handed_back: get(&self.handed_back),
            dlq_failures: get(&self.dlq_failures),
        }
    }
}

fn add(c: &AtomicU64, n: usize) {
    if n > 0 {
        c.fetch_add(n as u64, Ordering::Relaxed);
    }
}
