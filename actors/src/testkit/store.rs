//! A [`FakeManifestStore`]: the manifest store in memory, with the real one's rules.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::*;
use crate::ports::*;

/// An in-memory manifest store over a [`Journal`] (which plays the stream: `fetch` reads
/// its payloads; a message acked or parked has left it). Keeps the real store's rule (of
/// two batches claiming a message, the one recorded first wins) and reports its changes
/// as the real one does. Counts what it is asked; can be made to fail.
#[derive(Debug)]
pub struct FakeManifestStore {
    journal: Arc<Journal>,
    state: Mutex<FakeStoreState>,
    /// Every write (claim or update), in order.
    pub records: Mutex<Vec<crate::ledger::Manifest>>,
    pub forgotten: Mutex<Vec<String>>,
    /// Manifests withdrawn (their batch could not be formed whole again).
    pub withdrawn: Mutex<Vec<String>>,
    /// `forget` leaves the removal to a collector, as the NATS store does on a cluster
    /// or after a reconnect (the manifest stays).
    pub defer_forget: AtomicBool,
    /// Writes fail while set (NATS down, the bucket full).
    pub fail_writes: AtomicBool,
    pub fetches: AtomicUsize,
    /// Once, as the next fetch starts: this manifest written and these messages gone
    /// from the stream (another instance gathering the same batch sent and settled it,
    /// then acked the messages it held, while the batch was gathered here).
    pub settled_elsewhere_before_fetch: Mutex<Option<(crate::ledger::Manifest, Vec<u64>)>>,
}

#[derive(Debug, Default)]
struct FakeStoreState {
    revision: u64,
    manifests: std::collections::HashMap<String, (u64, Arc<crate::ledger::Manifest>)>,
    changes: Vec<crate::ledger::LedgerChange>,
}

/// The incarnation of the fake ingest stream.
pub const FAKE_INCARNATION: u64 = 1_700_000_000_000_000_000;

impl FakeManifestStore {
    pub fn new(journal: &Arc<Journal>) -> Arc<Self> {
        Arc::new(Self {
            journal: journal.clone(),
            state: Mutex::default(),
            records: Mutex::default(),
            forgotten: Mutex::default(),
            withdrawn: Mutex::default(),
            defer_forget: AtomicBool::new(false),
            fail_writes: AtomicBool::new(false),
            fetches: AtomicUsize::new(0),
            settled_elsewhere_before_fetch: Mutex::default(),
        })
    }

    pub fn get(&self, id: &str) -> Option<Arc<crate::ledger::Manifest>> {
        self.state
            .lock()
            .unwrap()
            .manifests
            .get(id)
            .map(|(_, m)| m.clone())
    }

    /// The manifests recorded and not forgotten.
    pub fn open_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .state
            .lock()
            .unwrap()
            .manifests
            .keys()
            .cloned()
            .collect();
        ids.sort();
        ids
    }

    /// The recorded batch holding a message, if any (the one recorded first).
    pub fn holding(&self, stream_sequence: u64) -> Option<Arc<crate::ledger::Manifest>> {
        self.state
            .lock()
            .unwrap()
            .manifests
            .values()
            .filter(|(_, m)| m.holds(stream_sequence))
            .min_by_key(|(r, _)| *r)
            .map(|(_, m)| m.clone())
    }

    fn write_fails(&self) -> Result<(), crate::ledger::StoreError> {
        if self.fail_writes.load(Ordering::Relaxed) {
            Err(crate::ledger::StoreError(
                "the manifest bucket is unavailable (scripted)".into(),
            ))
        } else {
            Ok(())
        }
    }

    /// Records `manifest` as another instance would have (whatever the store held
    /// before); returns the store's revision of it.
    pub fn plant(&self, manifest: &crate::ledger::Manifest) -> u64 {
        self.put(manifest)
    }

    /// Records `manifest`; returns the store's revision of it.
    fn put(&self, manifest: &crate::ledger::Manifest) -> u64 {
        self.journal
            .push(0, Event::ManifestRecorded(manifest.is_settled()));
        self.records.lock().unwrap().push(manifest.clone());
        let mut state = self.state.lock().unwrap();
        state.revision += 1;
        let revision = state.revision;
        let manifest = Arc::new(manifest.clone());
        state
            .manifests
            .insert(manifest.id.clone(), (revision, manifest.clone()));
        state
            .changes
            .push(crate::ledger::LedgerChange::Put { revision, manifest });
        revision
    }

    /// The compare-and-set of every write after a claim: the record must still be at
    /// `expected`.
    fn expect(&self, id: &str, expected: u64) -> Result<(), crate::ledger::UpdateError> {
        let state = self.state.lock().unwrap();
        match state.manifests.get(id) {
            Some((revision, _)) if *revision == expected => Ok(()),
            _ => Err(crate::ledger::UpdateError::Superseded { id: id.to_owned() }),
        }
    }

    fn remove(&self, id: &str) {
        let mut state = self.state.lock().unwrap();
        if let Some((_, m)) = state.manifests.remove(id) {
            state.revision += 1;
            let revision = Some(state.revision);
            state.changes.push(crate::ledger::LedgerChange::Removed {
                table: m.table.clone(),
                id: id.to_string(),
                revision,
            });
        }
    }

    /// Whether the message is still in the stream: made, and neither acked nor parked.
    fn in_stream_now(&self, seq: u64) -> bool {
        self.journal.payload(seq).is_some()
            && !self
                .journal
                .terminal(seq)
                .iter()
                .any(|e| matches!(e, Event::Acked | Event::AckedConfirmed | Event::Parked(_)))
    }
}

impl crate::ledger::ManifestStore for FakeManifestStore {
    fn incarnation(&self) -> Option<u64> {
        Some(FAKE_INCARNATION)
    }

    fn claim<'a>(
        &'a self,
        manifest: &'a crate::ledger::Manifest,
    ) -> futures::future::BoxFuture<'a, Result<u64, crate::ledger::ClaimError>> {
        Box::pin(async move {
            self.write_fails()
                .map_err(crate::ledger::ClaimError::Unavailable)?;
            let earlier = self
                .state
                .lock()
                .unwrap()
                .manifests
                .values()
                .find(|(_, m)| manifest.messages.iter().any(|s| m.holds(*s)))
                .map(|(_, m)| m.id.clone());
            if let Some(earlier) = earlier {
                return Err(crate::ledger::ClaimError::Conflict {
                    id: manifest.id.clone(),
                    earlier,
                });
            }
            Ok(self.put(manifest))
        })
    }

    fn earlier_claim<'a>(
        &'a self,
        manifest: &'a crate::ledger::Manifest,
    ) -> futures::future::BoxFuture<'a, Result<Option<String>, crate::ledger::StoreError>> {
        // Every record is read at once here: nothing to wait for.
        let state = self.state.lock().unwrap();
        let order = state
            .manifests
            .get(&manifest.id)
            .map_or(manifest.claim_order(u64::MAX), |(r, m)| m.claim_order(*r));
        let earlier = state
            .manifests
            .values()
            .filter(|(_, m)| m.id != manifest.id)
            .filter(|(r, m)| m.claim_order(*r) < order)
            .find(|(_, m)| manifest.messages.iter().any(|s| m.holds(*s)))
            .map(|(_, m)| m.id.clone());
        Box::pin(std::future::ready(Ok(earlier)))
    }

    fn update<'a>(
        &'a self,
        manifest: &'a crate::ledger::Manifest,
        expected: u64,
    ) -> futures::future::BoxFuture<'a, Result<u64, crate::ledger::UpdateError>> {
        Box::pin(async move {
            self.write_fails()
                .map_err(crate::ledger::UpdateError::Unavailable)?;
            self.expect(&manifest.id, expected)?;
            Ok(self.put(manifest))
        })
    }

    fn current<'a>(
        &'a self,
        id: &'a str,
    ) -> futures::future::BoxFuture<
        'a,
        Result<Option<crate::ledger::Recorded>, crate::ledger::StoreError>,
    > {
        Box::pin(async move {
            let state = self.state.lock().unwrap();
            Ok(state.manifests.get(id).map(|(revision, m)| {
                let order = m.claim_order(*revision);
                crate::ledger::Recorded {
                    manifest: (**m).clone().claimed_as(order),
                    revision: *revision,
                }
            }))
        })
    }

    fn forget<'a>(
        &'a self,
        id: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<(), crate::ledger::StoreError>> {
        Box::pin(async move {
            self.write_fails()?;
            if !self.defer_forget.load(Ordering::Relaxed) {
                self.remove(id);
            }
            self.forgotten.lock().unwrap().push(id.to_owned());
            Ok(())
        })
    }

    fn withdraw<'a>(
        &'a self,
        id: &'a str,
        expected: u64,
    ) -> futures::future::BoxFuture<'a, Result<(), crate::ledger::UpdateError>> {
        Box::pin(async move {
            self.write_fails()
                .map_err(crate::ledger::UpdateError::Unavailable)?;
            self.expect(id, expected)?;
            self.remove(id);
            self.withdrawn.lock().unwrap().push(id.to_owned());
            Ok(())
        })
    }

    fn fetch<'a>(
        &'a self,
        stream_sequences: &'a [u64],
    ) -> futures::future::BoxFuture<'a, Result<Vec<Bytes>, crate::ledger::FetchError>> {
        Box::pin(async move {
            let elsewhere = self.settled_elsewhere_before_fetch.lock().unwrap().take();
            if let Some((manifest, acked)) = elsewhere {
                self.put(&manifest);
                for seq in acked {
                    self.journal.remove_from_stream(seq);
                }
            }
            self.fetches
                .fetch_add(stream_sequences.len(), Ordering::Relaxed);
            stream_sequences
                .iter()
                .map(|s| {
                    self.journal.payload(*s).map(|(_, p)| p).ok_or(
                        crate::ledger::FetchError::Gone {
                            stream_sequence: *s,
                        },
                    )
                })
                .collect()
        })
    }

    fn in_stream<'a>(
        &'a self,
        stream_sequences: &'a [u64],
    ) -> futures::future::BoxFuture<'a, Result<Vec<bool>, crate::ledger::StoreError>> {
        Box::pin(async move {
            Ok(stream_sequences
                .iter()
                .map(|s| self.in_stream_now(*s))
                .collect())
        })
    }

    fn changes(&self) -> crate::ledger::Changes {
        let changes = std::mem::take(&mut self.state.lock().unwrap().changes);
        if changes.is_empty() {
            crate::ledger::Changes::None
        } else {
            crate::ledger::Changes::Some(changes)
        }
    }

    fn of_table(&self, table: &TableKey) -> crate::ledger::LedgerSnapshot {
        let state = self.state.lock().unwrap();
        crate::ledger::LedgerSnapshot {
            as_of: state.revision,
            manifests: state
                .manifests
                .values()
                .filter(|(_, m)| m.table == *table)
                .map(|(r, m)| (*r, m.clone()))
                .collect(),
        }
    }
}
