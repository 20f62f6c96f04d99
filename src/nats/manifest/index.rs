//! The store's own index of the bucket, kept by a watch of every key: what it reports
//! to the tables (as [`LedgerChange`]s, taken by the consumer after each pull), what a
//! new claim is checked against (the first claim on a message wins), what a starting
//! table reads (`of_table`) and what the collector looks through.
//!
//! The watch delivers the last value of every key, then each change as it is written.
//! Until it has delivered everything the bucket held when it started, the index is not
//! "caught up", and the source does not pull (a redelivered message checked against an
//! index still filling could be taken for a fresh one and sent in a new batch). When
//! the watch breaks, or the client reconnects (a change made meanwhile may have been
//! missed), a new watch is opened and the index rebuilt: keys the new watch did not
//! deliver are dropped once it has caught up. Until then the old entries keep
//! answering: a manifest that has gone can only make a message wait for a batch that
//! forms again, never send it twice.
//!
//! A nats-server that crashes can lose writes it had acknowledged (it flushes its file
//! store in the background: nats-server#7564): the bucket then comes back behind what
//! the index saw, its last sequence below revisions the index holds. A manifest lost
//! that way is not a manifest removed (its batch's acks may be lost too, and the
//! rows come back): the watch writes every one the bucket has neither a value nor a
//! removal marker for again, from the index, before it reports itself caught up.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use sluice_actors::ledger::BatchIndex;
use sluice_actors::{Changes, LedgerChange, LedgerSnapshot, Manifest, TableKey};
use tokio::time::Instant;

/// Changes kept for the tables until the consumer takes them: past this many (nothing
/// pulls for a long while), they are dropped and every table starts again from a
/// snapshot instead.
const MAX_OUTBOX: usize = 100_000;

/// One manifest as the index holds it.
#[derive(Clone)]
pub struct Indexed {
    /// The key's incarnation of the ingest stream (see `super::key`).
    pub incarnation: u64,
    pub manifest: Arc<Manifest>,
    /// The bucket's sequence of the value: a later one replaces an earlier one, never
    /// the other way round (a record and the watch's echo of it can cross).
    pub revision: u64,
    /// When this instance took the value (at or after its write): the bucket drops a
    /// value its `max_age` after its write, so one taken longer ago than that may have
    /// expired (the collector looks).
    pub taken_at: Instant,
}

/// Whether the index holds everything the bucket held when its watch opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Readiness {
    /// The client's connection count when the watch opened: a later reconnect may have
    /// missed changes, so the index is caught up only for this connection.
    connects: u64,
    caught_up: bool,
}

/// The index, shared by the store, its watch and its collector.
pub struct Index {
    /// `<stream>.`: keys of other ingest streams sharing the bucket are not ours.
    prefix: String,
    state: RwLock<State>,
    readiness: tokio::sync::watch::Sender<Readiness>,
    /// The highest bucket revision the watch has applied: once it passes a record's
    /// revision, every value written before that record is in the index.
    watched: tokio::sync::watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    /// The ingest stream's current incarnation, once known.
    incarnation: Option<u64>,
    by_key: HashMap<String, Indexed>,
    /// The current incarnation's batches by message, under the ledger's own rule (the
    /// one the tables keep): the first claim on a message wins.
    claims: BatchIndex,
    /// Keys removed, by the revision of their removal marker and when it was seen: the
    /// collector drops the markers once every watch has had time to see them.
    tombstones: HashMap<String, (u64, Instant)>,
    /// Changes of the current incarnation not yet taken for the tables.
    outbox: Vec<LedgerChange>,
    /// The changes cannot be told one by one any more (a new incarnation, the outbox
    /// overflowed): the tables start again from snapshots.
    resync: bool,
}

// === impl Index ===

impl Index {
    pub fn new(stream: &str) -> Self {
        Self {
            prefix: format!("{stream}."),
            state: RwLock::default(),
            readiness: tokio::sync::watch::Sender::new(Readiness::default()),
            watched: tokio::sync::watch::Sender::new(0),
        }
    }

    /// `<stream>.<incarnation>.<id>` → (incarnation, id), for keys of our stream.
    pub fn parse_key<'k>(&self, key: &'k str) -> Option<(u64, &'k str)> {
        let (incarnation, id) = key.strip_prefix(&self.prefix)?.split_once('.')?;
        Some((incarnation.parse().ok()?, id))
    }

    pub fn key(&self, incarnation: u64, id: &str) -> String {
        format!("{}{incarnation}.{id}", self.prefix)
    }

    /// The batch holding a message (the first claim on it), for tests and tools.
    pub fn holding(&self, stream_sequence: u64) -> Option<Arc<Manifest>> {
        self.read().claims.holding(stream_sequence).cloned()
    }

    pub fn incarnation(&self) -> Option<u64> {
        self.read().incarnation
    }

    /// The ingest stream as it is now; a new incarnation starts the claims and the
    /// tables' indexes again.
    pub fn set_incarnation(&self, incarnation: u64) {
        let mut state = self.write();
        if state.incarnation != Some(incarnation) {
            state.incarnation = Some(incarnation);
            state.rebuild_claims();
        }
    }

    /// A value of `key` at `revision` (from the watch, or from a record that JetStream
    /// acknowledged).
    pub fn put(&self, key: &str, revision: u64, manifest: Manifest) {
        let Some((incarnation, _)) = self.parse_key(key) else {
            return;
        };
        let mut state = self.write();
        if state
            .by_key
            .get(key)
            .is_some_and(|known| known.revision >= revision)
        {
            return;
        }
        if let Some(&(removed_at, _)) = state.tombstones.get(key) {
            if removed_at > revision {
                return;
            }
            state.tombstones.remove(key);
        }
        let manifest = Arc::new(manifest);
        state.by_key.insert(
            key.to_string(),
            Indexed {
                incarnation,
                manifest: manifest.clone(),
                revision,
                taken_at: Instant::now(),
            },
        );
        if Some(incarnation) == state.incarnation {
            state.report(LedgerChange::Put { revision, manifest });
        }
    }

    /// The watch applied the bucket's value at `revision`.
    pub(super) fn saw(&self, revision: u64) {
        self.watched.send_if_modified(|w| {
            let newer = revision > *w;
            if newer {
                *w = revision;
            }
            newer
        });
    }

    /// The bucket's last sequence is `upto` as a new watch opens: below a revision
    /// the index holds, the bucket lost writes (a nats-server crash, or the bucket
    /// deleted under a running instance). The revisions above it mean nothing any more:
    /// they are reset so the bucket's values replace them, removal markers above it are
    /// dropped, and the watched revision goes back to `upto`. True when it fell behind.
    pub(super) fn fell_behind(&self, upto: u64) -> bool {
        let mut state = self.write();
        let highest = state
            .by_key
            .values()
            .map(|v| v.revision)
            .chain(state.tombstones.values().map(|(r, _)| *r))
            .chain([*self.watched.borrow()])
            .max()
            .unwrap_or(0);
        if highest <= upto {
            return false;
        }
        for v in state.by_key.values_mut() {
            if v.revision > upto {
                v.revision = 0;
            }
        }
        state.tombstones.retain(|_, (r, _)| *r <= upto);
        drop(state);
        self.watched.send_replace(upto);
        true
    }

    /// The manifests a watch that opened behind (see [`Index::fell_behind`]) has not
    /// delivered: lost by the bucket, or removed (the bucket says which).
    /// The manifests not in `seen`, in the order of their claims.
    pub(super) fn unseen(&self, seen: &HashSet<String>) -> Vec<(String, Arc<Manifest>)> {
        let mut unseen: Vec<(u64, String, Arc<Manifest>)> = self
            .read()
            .by_key
            .iter()
            .filter(|(k, _)| !seen.contains(*k))
            .map(|(k, v)| {
                (
                    v.manifest.claim_order(v.revision),
                    k.clone(),
                    v.manifest.clone(),
                )
            })
            .collect();
        unseen.sort_unstable_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        unseen.into_iter().map(|(_, k, m)| (k, m)).collect()
    }

    /// Wait (at most `deadline`) until the watch has applied `revision`.
    pub async fn wait_watched(&self, revision: u64, deadline: Duration) -> bool {
        let mut watched = self.watched.subscribe();
        tokio::time::timeout(deadline, watched.wait_for(|w| *w >= revision))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// A batch recorded before `m` that claims one of its messages (two batches formed
    /// of the same message: a copy delivered again, a record that failed ambiguously and
    /// landed later). The first claim wins; `None` when there is none in the index.
    pub fn earlier_claim(&self, m: &Manifest) -> Option<String> {
        self.read().claims.earlier_claim(m).map(|e| e.id.clone())
    }

    /// `key` is gone; `marker`: the revision of its removal marker, when the watch saw
    /// one (a value written after it stays).
    pub fn remove(&self, key: &str, marker: Option<u64>) {
        let mut state = self.write();
        if let Some(marker) = marker {
            if state
                .by_key
                .get(key)
                .is_some_and(|known| known.revision > marker)
            {
                return;
            }
            state
                .tombstones
                .insert(key.to_string(), (marker, Instant::now()));
        }
        state.remove_key(key, marker);
    }

    /// Whether the index holds `key` at `revision` or later.
    pub fn holds_revision(&self, key: &str, revision: u64) -> bool {
        self.read()
            .by_key
            .get(key)
            .is_some_and(|known| known.revision >= revision)
    }

    /// The manifest `key` holds, as the index knows it.
    pub fn get(&self, key: &str) -> Option<Arc<Manifest>> {
        self.read().by_key.get(key).map(|v| v.manifest.clone())
    }

    /// Every manifest of our stream, for the collector.
    pub fn snapshot(&self) -> Vec<(String, Indexed)> {
        self.read()
            .by_key
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// One table's manifests of the current incarnation, as of the watch's progress.
    pub fn of_table(&self, table: &TableKey) -> LedgerSnapshot {
        let as_of = *self.watched.borrow();
        let state = self.read();
        LedgerSnapshot {
            as_of,
            manifests: state
                .by_key
                .values()
                .filter(|v| Some(v.incarnation) == state.incarnation && v.manifest.table == *table)
                .map(|v| (v.revision, v.manifest.clone()))
                .collect(),
        }
    }

    /// The changes for the tables since the last call.
    pub fn take_changes(&self) -> Changes {
        let mut state = self.write();
        if std::mem::take(&mut state.resync) {
            state.outbox.clear();
            return Changes::Resync;
        }
        if state.outbox.is_empty() {
            return Changes::None;
        }
        Changes::Some(std::mem::take(&mut state.outbox))
    }

    /// Removal markers seen at least `age` ago, forgotten here: the collector drops
    /// them from the bucket.
    pub fn take_tombstones(&self, age: Duration) -> Vec<(String, u64)> {
        let mut state = self.write();
        let old: Vec<(String, u64)> = state
            .tombstones
            .iter()
            .filter(|(_, (_, seen))| seen.elapsed() >= age)
            .map(|(k, (revision, _))| (k.clone(), *revision))
            .collect();
        for (key, _) in &old {
            state.tombstones.remove(key);
        }
        old
    }

    /// A watch opened on connection number `connects` has delivered everything the
    /// bucket held at `upto`: drop what it did not deliver and was indexed before.
    /// After manifests were written again (`restored`), the claims are rebuilt from
    /// their new revisions and the tables start again from snapshots.
    pub(super) fn caught_up(
        &self,
        seen: &HashSet<String>,
        upto: u64,
        connects: u64,
        restored: bool,
    ) {
        {
            let mut state = self.write();
            let gone: Vec<String> = state
                .by_key
                .iter()
                .filter(|(k, v)| v.revision <= upto && !seen.contains(*k))
                .map(|(k, _)| k.clone())
                .collect();
            for key in gone {
                state.remove_key(&key, None);
            }
            if restored {
                state.rebuild_claims();
            }
        }
        self.readiness.send_replace(Readiness {
            connects,
            caught_up: true,
        });
    }

    pub(super) fn not_caught_up(&self) {
        self.readiness.send_modify(|r| r.caught_up = false);
    }

    /// Whether a watch on the client's current connection has caught up.
    pub fn caught_up_on(&self, client: &async_nats::Client) -> bool {
        let r = *self.readiness.borrow();
        r.caught_up && r.connects == client.statistics().connects.load(Ordering::Relaxed)
    }

    /// Wait until a watch on the client's current connection has caught up.
    pub async fn wait_caught_up(
        &self,
        client: &async_nats::Client,
        deadline: Duration,
    ) -> Result<(), String> {
        let stats = client.statistics();
        let mut readiness = self.readiness.subscribe();
        let wait = async {
            readiness
                .wait_for(|r| r.caught_up && r.connects == stats.connects.load(Ordering::Relaxed))
                .await
                .map(|_| ())
        };
        let outcome = tokio::time::timeout(deadline, wait).await;
        match outcome {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err("the manifest index is gone".into()),
            Err(_) => Err(format!(
                "the manifest index did not catch up with the bucket within {deadline:?}"
            )),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        // A panic while the lock was held left the maps consistent (every change is a
        // few map operations): keep answering.
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }
}

// === impl State ===

impl State {
    /// A change of the current incarnation: into the claims, and out to the tables.
    fn report(&mut self, change: LedgerChange) {
        self.claims.apply(change.clone());
        if self.resync {
            return;
        }
        if self.outbox.len() >= MAX_OUTBOX {
            self.outbox.clear();
            self.resync = true;
            return;
        }
        self.outbox.push(change);
    }

    fn remove_key(&mut self, key: &str, marker: Option<u64>) {
        let Some(old) = self.by_key.remove(key) else {
            return;
        };
        if Some(old.incarnation) == self.incarnation {
            self.report(LedgerChange::Removed {
                table: old.manifest.table.clone(),
                id: old.manifest.id.clone(),
                revision: marker,
            });
        }
    }

    /// The claims of the current incarnation, from `by_key`; the tables start again.
    fn rebuild_claims(&mut self) {
        let mut claims = BatchIndex::default();
        for v in self
            .by_key
            .values()
            .filter(|v| Some(v.incarnation) == self.incarnation)
        {
            claims.apply(LedgerChange::Put {
                revision: v.revision,
                manifest: v.manifest.clone(),
            });
        }
        self.claims = claims;
        self.outbox.clear();
        self.resync = true;
    }
}

#[cfg(test)]
mod tests {
    use sluice_actors::ManifestState;

    use super::*;

    fn manifest(messages: Vec<u64>) -> Manifest {
        Manifest::new(TableKey::new("acme", "events"), 7, messages)
    }

    fn index() -> (Index, String, String) {
        let index = Index::new("INGEST");
        index.set_incarnation(7);
        let a = manifest(vec![1, 2, 3]);
        let b = manifest(vec![3, 4]);
        let (ka, kb) = (index.key(7, &a.id), index.key(7, &b.id));
        index.put(&ka, 10, a);
        index.put(&kb, 11, b);
        (index, ka, kb)
    }

    fn held(index: &Index, seq: u64) -> Option<String> {
        index.holding(seq).map(|m| m.id.clone())
    }

    #[test]
    fn keys_of_other_streams_are_not_ours() {
        let index = Index::new("INGEST");
        assert_eq!(index.parse_key("INGEST.42.1-2-ab"), Some((42, "1-2-ab")));
        assert_eq!(index.parse_key("INGEST2.42.1-2-ab"), None);
        assert_eq!(index.parse_key("INGEST.x.1-2-ab"), None);
        index.set_incarnation(42);
        index.put("OTHER.42.1-1-aa", 1, manifest(vec![1]));
        assert_eq!(held(&index, 1), None);
        assert!(index.snapshot().is_empty());
    }

    #[test]
    fn the_first_claim_holds_a_shared_message_and_removal_restores_the_other() {
        let (index, ka, kb) = index();
        let a = held(&index, 1).expect("a");
        let b = held(&index, 4).expect("b");
        assert_eq!(held(&index, 3), Some(a.clone()), "a was recorded first");
        index.remove(&ka, Some(12));
        assert_eq!(held(&index, 3), Some(b.clone()), "b holds 3 now");
        assert_eq!(held(&index, 1), None);
        index.remove(&kb, None);
        assert_eq!(held(&index, 3), None);
        assert_eq!(held(&index, 4), None);
    }

    #[test]
    fn the_first_claim_on_a_message_wins() {
        let (index, _, _) = index();
        let (a, b) = (manifest(vec![1, 2, 3]), manifest(vec![3, 4]));
        assert_eq!(index.earlier_claim(&b), Some(a.id.clone()), "b came second");
        assert_eq!(index.earlier_claim(&a), None, "a came first");
        let c = manifest(vec![5, 6]);
        index.put(&index.key(7, &c.id), 12, c.clone());
        assert_eq!(index.earlier_claim(&c), None, "c shares nothing");
    }

    #[tokio::test]
    async fn a_record_waits_for_the_watch_to_pass_its_revision() {
        let (index, _, _) = index();
        assert!(!index.wait_watched(3, Duration::from_millis(10)).await);
        index.saw(2);
        index.saw(4);
        index.saw(1);
        assert!(index.wait_watched(3, Duration::from_millis(10)).await);
    }

    #[test]
    fn an_older_value_never_replaces_a_newer_one() {
        let (index, ka, _) = index();
        let mut settled = manifest(vec![1, 2, 3]);
        settled.state = ManifestState::Settled { rejected: vec![] };
        index.put(&ka, 20, settled);
        // The watch's echo of the first record arrives late.
        index.put(&ka, 10, manifest(vec![1, 2, 3]));
        assert!(index.holding(1).expect("held").is_settled());
        // A removal marker older than the value does not remove it; a newer one does,
        // and a value older than the marker does not bring it back.
        index.remove(&ka, Some(15));
        assert!(index.holding(1).is_some());
        index.remove(&ka, Some(21));
        assert!(index.holding(1).is_none());
        index.put(&ka, 20, manifest(vec![1, 2, 3]));
        assert!(index.holding(1).is_none());
        assert_eq!(index.take_tombstones(Duration::ZERO).len(), 1);
        assert!(index.take_tombstones(Duration::ZERO).is_empty());
    }

    #[test]
    fn only_the_current_incarnation_answers() {
        let (index, _, _) = index();
        let old = manifest(vec![100]);
        index.put(&index.key(6, &old.id), 30, old);
        assert_eq!(held(&index, 100), None, "an older stream's manifest");
        assert!(held(&index, 1).is_some());
        index.set_incarnation(6);
        assert!(held(&index, 100).is_some());
        assert_eq!(held(&index, 1), None);
        assert_eq!(index.snapshot().len(), 3, "all kept for the collector");
    }

    #[test]
    fn the_tables_hear_every_change_of_the_current_incarnation_in_order() {
        let (index, ka, _) = index();
        // Setting the first incarnation made the tables start from snapshots, which hold
        // the two records made since.
        assert_eq!(index.take_changes(), Changes::Resync);
        assert_eq!(index.take_changes(), Changes::None);
        let c = manifest(vec![20]);
        index.put(&index.key(7, &c.id), 12, c);
        let Changes::Some(changes) = index.take_changes() else {
            panic!("the new record");
        };
        assert!(
            matches!(&changes[..], [LedgerChange::Put { revision: 12, .. }]),
            "{changes:?}"
        );
        index.remove(&ka, Some(13));
        let old = manifest(vec![100]);
        index.put(&index.key(6, &old.id), 14, old);
        let Changes::Some(changes) = index.take_changes() else {
            panic!("the removal");
        };
        assert!(
            matches!(
                &changes[..],
                [LedgerChange::Removed {
                    revision: Some(13),
                    ..
                }]
            ),
            "not the other incarnation's record: {changes:?}"
        );
        assert_eq!(index.take_changes(), Changes::None);
        index.set_incarnation(6);
        assert_eq!(index.take_changes(), Changes::Resync);
    }

    #[test]
    fn a_table_starts_from_its_manifests_as_of_the_watch() {
        let (index, _, _) = index();
        index.saw(11);
        let other = Manifest::new(TableKey::new("acme", "clicks"), 7, vec![50]);
        index.put(&index.key(7, &other.id), 12, other);
        let snapshot = index.of_table(&TableKey::new("acme", "events"));
        assert_eq!(snapshot.as_of, 11);
        let mut revisions: Vec<u64> = snapshot.manifests.iter().map(|(r, _)| *r).collect();
        revisions.sort_unstable();
        assert_eq!(revisions, vec![10, 11]);
    }

    #[test]
    fn a_rebuild_drops_what_the_new_watch_did_not_deliver_up_to_its_start() {
        let (index, ka, kb) = index();
        let fresh = manifest(vec![9]);
        let kf = index.key(7, &fresh.id);
        index.put(&kf, 50, fresh);
        // A watch opened when the bucket's last sequence was 40 delivered only `a`.
        index.caught_up(&HashSet::from([ka.clone()]), 40, 3, false);
        assert!(held(&index, 1).is_some());
        assert_eq!(
            held(&index, 4),
            None,
            "b was removed while the watch was away"
        );
        assert!(held(&index, 9).is_some(), "recorded after the watch opened");
        let _ = kb;
        assert_eq!(
            *index.readiness.borrow(),
            Readiness {
                connects: 3,
                caught_up: true
            }
        );
    }

    #[test]
    fn a_bucket_behind_the_index_lost_writes_and_its_revisions_mean_nothing_any_more() {
        let (index, ka, kb) = index();
        assert!(
            !index.fell_behind(11),
            "the bucket holds what the index saw"
        );
        // nats-server came back with the bucket at sequence 10: `b`'s revision 11 was
        // lost, and the revisions after 10 are written again by new values.
        assert!(index.fell_behind(10));
        assert_eq!(*index.watched.borrow(), 10);
        let unseen = index.unseen(&HashSet::from([ka.clone()]));
        assert_eq!(unseen.len(), 1, "b, to be read from the bucket");
        assert_eq!(unseen[0].0, kb);
        index.put(&kb, 4, manifest(vec![3, 4]));
        let revision_of = |key: &str| {
            index
                .snapshot()
                .into_iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.revision)
        };
        assert_eq!(
            revision_of(&kb),
            Some(4),
            "a value the bucket has now replaces it"
        );
        // A removal marker above the bucket's last sequence was lost as well.
        index.remove(&ka, Some(12));
        assert!(index.fell_behind(10));
        index.put(&ka, 5, manifest(vec![1, 2, 3]));
        assert_eq!(revision_of(&ka), Some(5));
        assert!(
            !index.fell_behind(10),
            "nothing above the bucket's last sequence now"
        );
    }
}
