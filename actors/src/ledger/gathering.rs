//! Messages of recorded batches delivered again (after a crash, a frozen instance, an
//! ambiguous failure), gathered per batch: a batch flies again once every message of it
//! is here, or once `reform_wait` passed since the first came (the rest are read from
//! the stream: another instance holds them, or they wait out a delay).

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;

use tokio::time::Instant;

use super::manifest::Manifest;
use crate::ports::Delivery;

/// One recorded batch being gathered.
pub struct Gathering<D> {
    pub manifest: Arc<Manifest>,
    pub held: Vec<D>,
    /// The sequences of `held`.
    distinct: HashSet<u64>,
    /// When its first message came.
    pub since: Instant,
}

pub struct Gatherings<D> {
    gathering: BTreeMap<String, Gathering<D>>,
    /// Batches ready to fly, first come first served.
    ready: VecDeque<Gathering<D>>,
}

impl<D> Default for Gatherings<D> {
    fn default() -> Self {
        Self {
            gathering: BTreeMap::new(),
            ready: VecDeque::new(),
        }
    }
}

impl<D: Delivery> Gatherings<D> {
    /// A message of `manifest` came. Returns `true` when it opened a gathering (the
    /// caller arms its wait).
    pub fn add(&mut self, manifest: Arc<Manifest>, d: D, now: Instant) -> bool {
        let id = manifest.id.clone();
        let mut opened = false;
        let g = self.gathering.entry(id.clone()).or_insert_with(|| {
            opened = true;
            Gathering {
                manifest,
                held: Vec::new(),
                distinct: HashSet::new(),
                since: now,
            }
        });
        g.distinct.insert(d.position().stream_sequence);
        g.held.push(d);
        // Copies of a message (delivered again while gathered) do not make it whole.
        if g.distinct.len() >= g.manifest.messages.len() {
            if let Some(g) = self.gathering.remove(&id) {
                self.ready.push_back(g);
            }
        }
        opened
    }

    /// The wait for `id` is over: it flies with what came.
    pub fn wait_over(&mut self, id: &str) {
        if let Some(g) = self.gathering.remove(id) {
            self.ready.push_back(g);
        }
    }

    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    pub fn next_ready(&mut self) -> Option<Gathering<D>> {
        self.ready.pop_front()
    }

    /// The record of the batch [`Gatherings::next_ready`] would give, left in place.
    pub fn peek_ready(&self) -> Option<&Arc<Manifest>> {
        self.ready.front().map(|g| &g.manifest)
    }

    /// The ready batch `id`, taken out (`None`: it is not ready, or gone).
    pub fn take_ready(&mut self, id: &str) -> Option<Gathering<D>> {
        let at = self.ready.iter().position(|g| g.manifest.id == id)?;
        self.ready.remove(at)
    }

    pub fn is_empty(&self) -> bool {
        self.gathering.is_empty() && self.ready.is_empty()
    }

    /// Messages held here.
    pub fn len(&self) -> usize {
        self.gathering.values().map(|g| g.held.len()).sum::<usize>()
            + self.ready.iter().map(|g| g.held.len()).sum::<usize>()
    }

    /// Every message held, gathering or ready (`progress()` while they wait).
    pub fn held(&self) -> impl Iterator<Item = &D> {
        self.gathering
            .values()
            .flat_map(|g| g.held.iter())
            .chain(self.ready.iter().flat_map(|g| g.held.iter()))
    }

    /// The messages gathered for batch `id` (waiting or ready), taken out.
    pub fn take(&mut self, id: &str) -> Option<Vec<D>> {
        if let Some(g) = self.gathering.remove(id) {
            return Some(g.held);
        }
        let at = self.ready.iter().position(|g| g.manifest.id == id)?;
        self.ready.remove(at).map(|g| g.held)
    }

    /// Everything held (shutdown past its deadline, the table's window open).
    pub fn take_all(&mut self) -> Vec<D> {
        let mut all = Vec::new();
        for g in std::mem::take(&mut self.gathering).into_values() {
            all.extend(g.held);
        }
        for g in self.ready.drain(..) {
            all.extend(g.held);
        }
        all
    }
}
