//! The ledger as the actors reach it: the one holder of the manifest store outside the
//! ledger's own files. The consumer takes the store's changes through it, a table its
//! snapshot and the settling of copies by a record, a flight its claim, its forming
//! again and its session; nothing else in the actor tree sees the store.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::forming::{claim_fresh, reform, Formed, LedgerIo};
use super::manifest::Manifest;
use super::store::{Changes, LedgerSnapshot, ManifestStore};
use crate::batch::{SettlePlan, Settled};
use crate::clock::WallClock;
use crate::ports::{Delivery, TableKey};

/// See the module's doc. `None` inside: no table records its batches (every table is
/// inserted at least once).
#[derive(Clone, Default)]
pub struct Ledger {
    store: Option<Arc<dyn ManifestStore>>,
    /// The time a claim is recorded at (see [`WallClock`]).
    clock: WallClock,
}

impl Ledger {
    pub fn new(store: Option<Arc<dyn ManifestStore>>, clock: WallClock) -> Self {
        Self { store, clock }
    }

    /// Now by the ledger's wall clock, in ms since the epoch (a record's age).
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Whether batches are recorded at all (a manifest store is there).
    pub fn records(&self) -> bool {
        self.store.is_some()
    }

    /// The store's changes since the last call, for the tables' indexes.
    pub fn changes(&self) -> Changes {
        self.store.as_ref().map_or(Changes::None, |s| s.changes())
    }

    /// A table's recorded batches as the store knows them now (none without a store).
    pub fn snapshot_of(&self, table: &TableKey) -> Option<LedgerSnapshot> {
        self.store.as_ref().map(|s| s.of_table(table))
    }

    /// Copies of messages of a settled batch: settled by its record (see
    /// [`super::settle_by_record`]).
    pub async fn settle_by_record<D: Delivery>(
        &self,
        manifest: &Manifest,
        deliveries: Vec<D>,
        plan: &SettlePlan<'_>,
    ) -> Settled {
        super::settle_by_record(self.store.as_ref(), manifest, deliveries, plan).await
    }

    /// A fresh batch for shard `shard`, claimed first (see `claim_fresh`); `None`
    /// without a store.
    pub async fn claim<D: Delivery>(
        &self,
        key: &TableKey,
        ack_wait: Duration,
        deliveries: Vec<D>,
        held_since: Instant,
        shard: usize,
    ) -> Result<(Formed<D>, Vec<D>), Vec<D>> {
        let Some(io) = self.io(key, ack_wait) else {
            return Err(deliveries);
        };
        Ok(claim_fresh(&io, deliveries, held_since, shard).await)
    }

    /// Recorded batch `id` formed again (see `reform`); `None` without a store.
    pub async fn reform<D: Delivery>(
        &self,
        key: &TableKey,
        ack_wait: Duration,
        id: &str,
        held: Vec<D>,
        held_since: Instant,
    ) -> Result<Formed<D>, Vec<D>> {
        let Some(io) = self.io(key, ack_wait) else {
            return Err(held);
        };
        Ok(reform(&io, id, held, held_since).await)
    }

    /// What forming a batch of `key` talks to; `None` without a store.
    fn io<'a>(&'a self, key: &'a TableKey, ack_wait: Duration) -> Option<LedgerIo<'a>> {
        let store = self.store.as_ref()?;
        Some(LedgerIo {
            store,
            key,
            ack_wait,
            clock: &self.clock,
        })
    }
}
