//! One instance's manifest store over the shared bucket, as `src/nats/manifest/`
//! keeps it: its own index, fed by a watch that lags (its own writes go in at once);
//! a claim is create-only and judged once the watch has shown every earlier write
//! (`CLAIM_WAIT`, else it stays unjudged); every later write is a compare-and-set; a
//! current state is read from the bucket itself; `forget` defers to the collector
//! after a reconnect; the collector removes settled records the ack floor passed and
//! records whose messages all left the stream, once it has held them in that state
//! for `keep_settled_for(ack_wait)`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use sluice_actors::ledger::BatchIndex;
use sluice_actors::{
    Changes, ClaimError, FetchError, LedgerChange, LedgerSnapshot, Manifest, ManifestState,
    ManifestStore, Position, Recorded, StoreError, TableKey, UpdateError,
};
use tokio::time::Instant;

use crate::coverage::{Coverage, Reached};
use crate::kv::{Expect, Kv};
use crate::mark::Mark;
use crate::net::{Link, Port};
use crate::stream::Stream;

/// The ingest stream's incarnation.
pub const INCARNATION: u64 = 1_800_000_000_000_000_000;
/// How long a claim waits for the watch to show every write before it (the real one's).
const CLAIM_WAIT: Duration = Duration::from_secs(5);
/// How often the collector runs (the real one's).
const COLLECT_EVERY: Duration = Duration::from_secs(10);

pub struct SimStore {
    kv: Arc<Kv>,
    stream: Arc<Stream>,
    port: Port,
    cov: Arc<Coverage>,
    /// How likely a write, applied, loses its answer.
    answer_lost: f64,
    index: Mutex<Index>,
    /// The last revision the watch applied.
    watched: Mark,
    /// Record id → the connection it was last written on.
    recorded: Mutex<BTreeMap<String, u64>>,
}

#[derive(Default)]
struct Index {
    by_id: BTreeMap<String, (u64, Arc<Manifest>)>,
    /// When the index took each record's value (the collector keeps a record
    /// `keep_settled_for(ack_wait)` past it).
    taken_at: BTreeMap<String, Instant>,
    claims: BatchIndex,
    /// Removal markers seen: a value older than its marker is not taken.
    tombstones: BTreeMap<String, u64>,
    outbox: Vec<LedgerChange>,
    resync: bool,
    /// The connection the index was last rebuilt for.
    caught_up_on: Option<u64>,
}

impl Index {
    fn put(&mut self, revision: u64, manifest: Arc<Manifest>) {
        if self
            .by_id
            .get(&manifest.id)
            .is_some_and(|(r, _)| *r >= revision)
            || self
                .tombstones
                .get(&manifest.id)
                .is_some_and(|r| *r > revision)
        {
            return;
        }
        self.tombstones.remove(&manifest.id);
        self.taken_at.insert(manifest.id.clone(), Instant::now());
        self.by_id
            .insert(manifest.id.clone(), (revision, manifest.clone()));
        let change = LedgerChange::Put { revision, manifest };
        self.claims.apply(change.clone());
        self.outbox.push(change);
    }

    fn remove(&mut self, id: &str, marker: Option<u64>) {
        if let Some(marker) = marker {
            if self.by_id.get(id).is_some_and(|(r, _)| *r > marker) {
                return;
            }
            self.tombstones.insert(id.to_owned(), marker);
        }
        let Some((_, m)) = self.by_id.remove(id) else {
            return;
        };
        self.taken_at.remove(id);
        let change = LedgerChange::Removed {
            table: m.table.clone(),
            id: id.to_owned(),
            revision: marker,
        };
        self.claims.apply(change.clone());
        self.outbox.push(change);
    }
}

fn down(e: String) -> StoreError {
    StoreError(e)
}

impl SimStore {
    /// The store of one instance's life, its watch and collector running.
    pub fn start(
        kv: Arc<Kv>,
        stream: Arc<Stream>,
        port: Port,
        cov: Arc<Coverage>,
        answer_lost: f64,
    ) -> Arc<Self> {
        let store = Arc::new(Self {
            kv,
            stream,
            port,
            cov,
            answer_lost,
            index: Mutex::default(),
            watched: Mark::default(),
            recorded: Mutex::default(),
        });
        tokio::spawn(keep_watching(store.clone()));
        tokio::spawn(keep_collecting(store.clone()));
        store
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn recorded(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, u64>> {
        self.recorded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the index holds every record for the client's current connection.
    pub fn caught_up(&self) -> bool {
        self.index().caught_up_on == Some(self.port.connects())
    }

    /// A write applied whose answer is lost.
    fn lost_answer(&self) -> bool {
        let lost = self.port.dice.chance(self.answer_lost);
        if lost {
            self.cov.hit(Reached::KvAnswerLost);
        }
        lost
    }

    async fn wait_watched(&self, revision: u64) -> bool {
        self.watched.reached_within(revision, CLAIM_WAIT).await
    }

    async fn claim_now(&self, m: &Manifest) -> Result<u64, ClaimError> {
        let unavailable = |e: String| ClaimError::Unavailable(down(e));
        self.port.over(Link::Kv).await.map_err(unavailable)?;
        let conflict = |earlier: String| {
            self.cov.hit(Reached::ClaimConflict);
            ClaimError::Conflict {
                id: m.id.clone(),
                earlier,
            }
        };
        let Ok(revision) = self
            .kv
            .write(&m.id, Some(Arc::new(m.clone())), Expect::Create)
        else {
            return Err(conflict(m.id.clone()));
        };
        let first = m.messages.first().map(|&n| Position::partition_of(n));
        if m.messages
            .iter()
            .any(|&n| Some(Position::partition_of(n)) != first)
        {
            self.cov.hit(Reached::BatchAcrossStreams);
        }
        if self.lost_answer() {
            self.cov.hit(Reached::ClaimUnjudged);
            self.port.dead_end().await;
            return Err(unavailable("the claim's answer was lost".into()));
        }
        self.port.dead_end().await;
        self.index().put(revision, Arc::new(m.clone()));
        self.recorded().insert(m.id.clone(), self.port.connects());
        if !self.wait_watched(revision).await {
            self.cov.hit(Reached::ClaimUnjudged);
            return Err(unavailable(format!(
                "the index did not see batch {} within {CLAIM_WAIT:?}",
                m.id
            )));
        }
        let earlier = self.index().claims.earlier_claim(m).map(|e| e.id.clone());
        let Some(earlier) = earlier else {
            return Ok(revision);
        };
        if self.port.over(Link::Kv).await.is_ok()
            && self
                .kv
                .write(&m.id, None, Expect::Revision(revision))
                .is_ok()
        {
            self.index().remove(&m.id, None);
            self.recorded().remove(&m.id);
        }
        Err(conflict(earlier))
    }

    async fn update_now(&self, m: &Manifest, expected: u64) -> Result<u64, UpdateError> {
        self.port
            .over(Link::Kv)
            .await
            .map_err(|e| UpdateError::Unavailable(down(e)))?;
        let before = self.kv.get(&m.id).and_then(|e| e.value);
        let Ok(revision) =
            self.kv
                .write(&m.id, Some(Arc::new(m.clone())), Expect::Revision(expected))
        else {
            self.cov.hit(Reached::CasSuperseded);
            return Err(UpdateError::Superseded { id: m.id.clone() });
        };
        if let ManifestState::Split(split) = &m.state {
            match before.as_deref().map(|b| &b.state) {
                Some(ManifestState::Split(was)) if was == split => {
                    self.cov.hit(Reached::SplitResumed)
                }
                Some(ManifestState::Open) => self.cov.hit(Reached::SplitRecorded),
                _ => {}
            }
        }
        if self.lost_answer() {
            self.port.dead_end().await;
            return Err(UpdateError::Unavailable(down(
                "the write's answer was lost".into(),
            )));
        }
        self.port.dead_end().await;
        self.index().put(revision, Arc::new(m.clone()));
        self.recorded().insert(m.id.clone(), self.port.connects());
        Ok(revision)
    }

    async fn forget_now(&self, id: &str) -> Result<(), StoreError> {
        let recorded_on = self.recorded().remove(id);
        if recorded_on != Some(self.port.connects()) || self.port.is_cut(Link::Stream) {
            // Acks sent before a reconnect may be lost: the collector removes it once
            // the ack floor says so.
            self.cov.hit(Reached::ForgetDeferred);
            return Ok(());
        }
        self.port.over(Link::Kv).await.map_err(down)?;
        crate::coverage::log(format_args!("host {} forgets {id}", self.port.host.index));
        let _ = self.kv.write(id, None, Expect::Anything);
        if self.lost_answer() {
            // The removal may have gone out: written again behind it (the real
            // store's rule), left to the collector.
            let indexed = self.index().by_id.get(id).map(|(_, m)| m.clone());
            if let (Some(m), Ok(())) = (indexed, self.port.over(Link::Kv).await) {
                let _ = self.kv.write(id, Some(m), Expect::Anything);
            }
            return Err(down("the removal's answer was lost".into()));
        }
        self.port.dead_end().await;
        self.index().remove(id, None);
        Ok(())
    }

    async fn withdraw_now(&self, id: &str, expected: u64) -> Result<(), UpdateError> {
        self.port
            .over(Link::Kv)
            .await
            .map_err(|e| UpdateError::Unavailable(down(e)))?;
        // Withdrawn by the life that claimed it: the claim given up (its lease ran out
        // while it was judged), or lost to an earlier one.
        if self.recorded().contains_key(id) {
            self.cov.hit(Reached::LeaseLost);
        }
        if self.kv.write(id, None, Expect::Revision(expected)).is_err() {
            self.cov.hit(Reached::CasSuperseded);
            return Err(UpdateError::Superseded { id: id.to_owned() });
        }
        self.cov.hit(Reached::RecordWithdrawn);
        if self.lost_answer() {
            self.port.dead_end().await;
            return Err(UpdateError::Unavailable(down(
                "the removal's answer was lost".into(),
            )));
        }
        self.port.dead_end().await;
        self.recorded().remove(id);
        self.index().remove(id, None);
        Ok(())
    }

    async fn current_now(&self, id: &str) -> Result<Option<Recorded>, StoreError> {
        self.port.over(Link::Kv).await.map_err(down)?;
        let entry = self.kv.get(id);
        self.port.dead_end().await;
        Ok(entry.and_then(|e| {
            let m = e.value?;
            if m.is_settled() {
                self.cov.hit(Reached::SettledByRecord);
            }
            let order = m.claim_order(e.revision);
            Some(Recorded {
                manifest: (*m).clone().claimed_as(order),
                revision: e.revision,
            })
        }))
    }

    /// The watch: the bucket's writes into the index, each once the host's lag has
    /// passed since it was written; stalled while the bucket is out of reach; the
    /// index made again from the bucket after every reconnect.
    async fn watch_once(&self) {
        if self.port.is_cut(Link::Kv)
            || self
                .port
                .host
                .frozen
                .load(std::sync::atomic::Ordering::Relaxed)
        {
            tokio::time::sleep(Duration::from_millis(500)).await;
            return;
        }
        let connects = self.port.connects();
        if self.index().caught_up_on != Some(connects) {
            let (revision, values) = self.kv.snapshot();
            let mut index = self.index();
            *index = Index {
                resync: true,
                caught_up_on: Some(connects),
                ..Index::default()
            };
            for (_, entry) in values {
                if let Some(m) = entry.value {
                    index.put(entry.revision, m);
                }
            }
            index.outbox.clear();
            drop(index);
            self.watched.set(revision);
            return;
        }
        let lag = Duration::from_millis(
            self.port
                .host
                .watch_lag_ms
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        let now = Instant::now();
        let mut next_due = None;
        let head = self.kv.head().get();
        let watched = self.watched.get();
        for logged in self.kv.since(watched) {
            if logged.at + lag > now {
                next_due = Some(logged.at + lag);
                break;
            }
            let mut index = self.index();
            match logged.value {
                Some(m) => index.put(logged.revision, m),
                None => index.remove(&logged.key, Some(logged.revision)),
            }
            drop(index);
            self.watched.set(logged.revision);
        }
        let wait = next_due.unwrap_or(now + Duration::from_secs(1));
        tokio::select! {
            biased;
            _ = self.kv.head().moved_from(head), if next_due.is_none() => {}
            _ = tokio::time::sleep_until(wait) => {}
        }
    }

    /// One collection pass (`src/nats/manifest/collect.rs`'s rules).
    async fn collect(&self) {
        if self.port.is_cut(Link::Kv) {
            return;
        }
        let floors: Vec<(u64, u64)> = (0..self.stream.partitions)
            .map(|p| self.stream.floor(p))
            .collect();
        let keep = sluice_actors::keep_settled_for(self.stream.ack_wait);
        let now = Instant::now();
        let records: Vec<Arc<Manifest>> = {
            let index = self.index();
            index
                .by_id
                .values()
                .filter(|(_, m)| {
                    index
                        .taken_at
                        .get(&m.id)
                        .is_some_and(|&at| now.saturating_duration_since(at) >= keep)
                })
                .map(|(_, m)| m.clone())
                .collect()
        };
        for m in records {
            // Each partition's last message against its own floor.
            let mut lasts: BTreeMap<usize, u64> = BTreeMap::new();
            for &name in &m.messages {
                let last = lasts.entry(Position::partition_of(name)).or_default();
                *last = (*last).max(Position::sequence_of(name));
            }
            let floor_of = |p: usize| floors.get(p).copied().unwrap_or((0, 0));
            let acked = lasts.iter().all(|(&p, &last)| last <= floor_of(p).0);
            let gone = lasts.iter().all(|(&p, &last)| last < floor_of(p).1);
            if !((m.is_settled() && acked) || gone) {
                continue;
            }
            if self.port.over(Link::Kv).await.is_err() {
                return;
            }
            crate::coverage::log(format_args!(
                "host {} collects {}",
                self.port.host.index, m.id
            ));
            let _ = self.kv.write(&m.id, None, Expect::Anything);
            self.cov.hit(Reached::RecordCollected);
            self.index().remove(&m.id, None);
            self.recorded().remove(&m.id);
        }
    }
}

async fn keep_watching(store: Arc<SimStore>) {
    while store.port.alive() {
        store.watch_once().await;
    }
}

async fn keep_collecting(store: Arc<SimStore>) {
    loop {
        tokio::time::sleep(COLLECT_EVERY).await;
        if !store.port.alive() {
            return;
        }
        store.collect().await;
    }
}

impl ManifestStore for SimStore {
    fn incarnation(&self) -> Option<u64> {
        self.index().caught_up_on.map(|_| INCARNATION)
    }

    fn claim<'a>(&'a self, manifest: &'a Manifest) -> BoxFuture<'a, Result<u64, ClaimError>> {
        Box::pin(self.claim_now(manifest))
    }

    fn earlier_claim<'a>(
        &'a self,
        manifest: &'a Manifest,
    ) -> BoxFuture<'a, Result<Option<String>, StoreError>> {
        Box::pin(async move {
            if !self.wait_watched(manifest.claim_revision).await {
                return Err(down(format!(
                    "the index did not see batch {}'s claim within {CLAIM_WAIT:?}",
                    manifest.id
                )));
            }
            Ok(self
                .index()
                .claims
                .earlier_claim(manifest)
                .map(|e| e.id.clone()))
        })
    }

    fn update<'a>(
        &'a self,
        manifest: &'a Manifest,
        expected: u64,
    ) -> BoxFuture<'a, Result<u64, UpdateError>> {
        Box::pin(self.update_now(manifest, expected))
    }

    fn current<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Recorded>, StoreError>> {
        Box::pin(self.current_now(id))
    }

    fn forget<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.forget_now(id))
    }

    fn withdraw<'a>(
        &'a self,
        id: &'a str,
        expected: u64,
    ) -> BoxFuture<'a, Result<(), UpdateError>> {
        Box::pin(self.withdraw_now(id, expected))
    }

    fn fetch<'a>(&'a self, seqs: &'a [u64]) -> BoxFuture<'a, Result<Vec<Bytes>, FetchError>> {
        Box::pin(async move {
            self.port
                .over(Link::Stream)
                .await
                .map_err(|e| FetchError::Unavailable(down(e)))?;
            seqs.iter()
                .map(|s| {
                    self.stream.payload(*s).ok_or(FetchError::Gone {
                        stream_sequence: *s,
                    })
                })
                .collect()
        })
    }

    fn in_stream<'a>(&'a self, seqs: &'a [u64]) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        Box::pin(async move {
            self.port.over(Link::Stream).await.map_err(down)?;
            Ok(seqs
                .iter()
                .map(|s| self.stream.payload(*s).is_some())
                .collect())
        })
    }

    fn changes(&self) -> Changes {
        let mut index = self.index();
        if std::mem::take(&mut index.resync) {
            index.outbox.clear();
            return Changes::Resync;
        }
        let out = std::mem::take(&mut index.outbox);
        if out.is_empty() {
            Changes::None
        } else {
            Changes::Some(out)
        }
    }

    fn of_table(&self, table: &TableKey) -> LedgerSnapshot {
        let as_of = self.watched.get();
        let index = self.index();
        LedgerSnapshot {
            as_of,
            manifests: index
                .by_id
                .values()
                .filter(|(_, m)| m.table == *table)
                .map(|(r, m)| (*r, m.clone()))
                .collect(),
        }
    }
}
