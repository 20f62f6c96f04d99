//! One table's index of its recorded batches: stream sequence → the batch holding it.
//! Owned by the table's actor and changed only by the changes the store reports
//! (routed to the table like its messages), so which batch a message belongs to is
//! decided from the table's own state, in its mailbox.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use super::manifest::Manifest;
use super::store::{LedgerChange, LedgerSnapshot};

/// One recorded batch as the index holds it.
#[derive(Clone, Debug)]
struct Entry {
    /// The store's revision of this state.
    revision: u64,
    manifest: Arc<Manifest>,
}

impl Entry {
    /// Where its claim stands among others' (see [`Manifest::claim_revision`]).
    fn claim_order(&self) -> u64 {
        self.manifest.claim_order(self.revision)
    }
}

/// Where an indexed batch's [`Entry`] is kept in [`BatchIndex::entries`].
type Slot = u32;

#[derive(Debug, Default)]
pub struct BatchIndex {
    /// Changes at or below this revision are in already (the snapshot it started from).
    as_of: u64,
    by_id: HashMap<String, Slot>,
    /// The batches indexed, by slot (`None`: free, its number in `free`). A message
    /// points at its batch's slot, not at the manifest itself: a later state of the
    /// batch (its split, its verdicts) is swapped in the slot alone, without a step per
    /// message, and no message holds a reference count to change.
    entries: Vec<Option<Entry>>,
    free: Vec<Slot>,
    /// The batch holding each message. Two batches may claim one message for a moment
    /// (the store removes the later one): the one recorded first answers.
    by_seq: HashMap<u64, Slot, BuildHasherDefault<SequenceHasher>>,
    /// Two batches claimed one message at some point: a removal must look for the other.
    overlapped: bool,
}

/// The hash of a stream sequence for `by_seq`: one multiplication (the constant of
/// rustc's FxHash), where the default SipHash took most of an exactly-once batch's
/// bookkeeping (every message is indexed, re-indexed when its batch is settled, and
/// removed). Sequences are not chosen by anyone who could aim at collisions.
#[derive(Default)]
pub(crate) struct SequenceHasher(u64);

/// A set of stream sequences, hashed as `by_seq` is (see [`SequenceHasher`]).
pub(crate) type SequenceSet = std::collections::HashSet<u64, BuildHasherDefault<SequenceHasher>>;

impl Hasher for SequenceHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

// === impl BatchIndex ===

impl BatchIndex {
    /// Start again from the store's snapshot of the table.
    pub fn load(&mut self, snapshot: LedgerSnapshot) {
        *self = Self {
            as_of: snapshot.as_of,
            ..Self::default()
        };
        for (revision, manifest) in snapshot.manifests {
            self.put(revision, manifest);
        }
    }

    pub fn apply(&mut self, change: LedgerChange) {
        match change {
            LedgerChange::Put { revision, manifest } => {
                if revision > self.as_of {
                    self.put(revision, manifest);
                }
            }
            LedgerChange::Removed { id, revision, .. } => {
                if revision.is_none_or(|r| r > self.as_of) {
                    self.remove(&id, revision);
                }
            }
        }
    }

    /// The batch holding the message at this stream sequence, if any.
    pub fn holding(&self, stream_sequence: u64) -> Option<&Arc<Manifest>> {
        if self.by_seq.is_empty() {
            return None;
        }
        let slot = *self.by_seq.get(&stream_sequence)?;
        self.entry(slot).map(|e| &e.manifest)
    }

    /// The recorded batch by id, as the index knows it now.
    pub fn get(&self, id: &str) -> Option<&Arc<Manifest>> {
        let slot = *self.by_id.get(id)?;
        self.entry(slot).map(|e| &e.manifest)
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// A batch claimed before `m` that holds one of its messages (the first claim on a
    /// message wins: see [`BatchIndex::holding`]). `m` need not be in the index: its
    /// order is then its own [`Manifest::claim_revision`] (a batch that does not know it
    /// comes after every batch indexed).
    pub fn earlier_claim(&self, m: &Manifest) -> Option<&Arc<Manifest>> {
        let order = match self.by_id.get(&m.id).and_then(|slot| self.entry(*slot)) {
            // Indexed: `by_seq` answers with the first claim, and only overlaps matter.
            Some(_) if !self.overlapped => return None,
            Some(entry) => entry.claim_order(),
            None if m.claim_revision > 0 => m.claim_revision,
            None => u64::MAX,
        };
        m.messages
            .iter()
            .filter_map(|seq| self.by_seq.get(seq).and_then(|slot| self.entry(*slot)))
            .find(|held| held.manifest.id != m.id && held.claim_order() < order)
            .map(|held| &held.manifest)
    }

    /// Batches held.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    fn entry(&self, slot: Slot) -> Option<&Entry> {
        self.entries.get(slot as usize).and_then(Option::as_ref)
    }

    fn put(&mut self, revision: u64, manifest: Arc<Manifest>) {
        if let Some(&slot) = self.by_id.get(&manifest.id) {
            if let Some(known) = self.entries.get_mut(slot as usize).and_then(Option::as_mut) {
                if known.revision < revision {
                    // A later state of the same batch: the same messages, which point
                    // at this slot already.
                    *known = Entry { revision, manifest };
                }
                return;
            }
        }
        let order = manifest.claim_order(revision);
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.entries.push(None);
                (self.entries.len() - 1) as Slot
            }
        };
        self.by_seq.reserve(manifest.messages.len());
        for &seq in &manifest.messages {
            match self.by_seq.get(&seq) {
                Some(&other) if self.entry(other).is_some_and(|e| e.claim_order() < order) => {
                    // Recorded first: it keeps the message.
                    self.overlapped = true;
                }
                Some(_) => {
                    self.overlapped = true;
                    self.by_seq.insert(seq, slot);
                }
                None => {
                    self.by_seq.insert(seq, slot);
                }
            }
        }
        self.by_id.insert(manifest.id.clone(), slot);
        self.entries[slot as usize] = Some(Entry { revision, manifest });
    }

    fn remove(&mut self, id: &str, revision: Option<u64>) {
        let Some(&slot) = self.by_id.get(id) else {
            return;
        };
        if revision.is_some_and(|r| self.entry(slot).is_some_and(|known| known.revision > r)) {
            // Recorded again after this removal: it stays.
            return;
        }
        self.by_id.remove(id);
        let Some(gone) = self.entries.get_mut(slot as usize).and_then(Option::take) else {
            return;
        };
        self.free.push(slot);
        for seq in &gone.manifest.messages {
            if self.by_seq.get(seq) == Some(&slot) {
                self.by_seq.remove(seq);
                if self.overlapped {
                    if let Some(other) = self.earliest_holding(*seq) {
                        self.by_seq.insert(*seq, other);
                    }
                }
            }
        }
        if self.by_id.is_empty() {
            self.overlapped = false;
            // Nothing indexed: the slots start again from the first.
            self.entries.clear();
            self.free.clear();
        }
    }

    fn earliest_holding(&self, seq: u64) -> Option<Slot> {
        self.by_id
            .values()
            .filter_map(|&slot| Some((slot, self.entry(slot)?)))
            .filter(|(_, e)| e.manifest.holds(seq))
            .min_by_key(|(_, e)| e.claim_order())
            .map(|(slot, _)| slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::manifest::ManifestState;
    use crate::ports::TableKey;

    fn manifest(messages: Vec<u64>) -> Arc<Manifest> {
        Arc::new(Manifest::new(TableKey::new("acme", "events"), 1, messages))
    }

    fn put(revision: u64, m: &Arc<Manifest>) -> LedgerChange {
        LedgerChange::Put {
            revision,
            manifest: m.clone(),
        }
    }

    fn removed(m: &Manifest, revision: Option<u64>) -> LedgerChange {
        LedgerChange::Removed {
            table: m.table.clone(),
            id: m.id.clone(),
            revision,
        }
    }

    fn held(index: &BatchIndex, seq: u64) -> Option<String> {
        index.holding(seq).map(|m| m.id.clone())
    }

    #[test]
    fn a_later_state_replaces_an_earlier_one_never_the_other_way_round() {
        let mut index = BatchIndex::default();
        let open = manifest(vec![1, 2]);
        let settled = Arc::new(open.with_state(ManifestState::Settled { rejected: vec![] }));
        index.apply(put(5, &open));
        index.apply(put(6, &settled));
        index.apply(put(5, &open));
        assert!(index.holding(1).is_some_and(|m| m.is_settled()));
        assert!(index.holding(2).is_some_and(|m| m.is_settled()));
        index.apply(removed(&open, Some(4)));
        assert!(
            index.holding(1).is_some(),
            "a removal older than the record"
        );
        index.apply(removed(&open, Some(7)));
        assert_eq!(held(&index, 1), None);
        assert!(index.is_empty());
    }

    #[test]
    fn the_batch_recorded_first_keeps_a_shared_message_and_gets_it_back_on_removal() {
        let mut index = BatchIndex::default();
        let first = manifest(vec![1, 2]);
        let second = manifest(vec![2, 3]);
        index.apply(put(10, &first));
        index.apply(put(11, &second));
        assert_eq!(held(&index, 2), Some(first.id.clone()));
        assert_eq!(held(&index, 3), Some(second.id.clone()));
        index.apply(removed(&first, None));
        assert_eq!(held(&index, 2), Some(second.id.clone()), "the other claim");
        assert_eq!(held(&index, 1), None);
        // Reported the other way round (a later record seen first): the same answer.
        let mut index = BatchIndex::default();
        index.apply(put(11, &second));
        assert!(index.earlier_claim(&second).is_none());
        index.apply(put(10, &first));
        assert_eq!(held(&index, 2), Some(first.id.clone()));
        assert_eq!(
            index.earlier_claim(&second).map(|m| m.id.clone()),
            Some(first.id.clone())
        );
        assert!(
            index.earlier_claim(&first).is_none(),
            "the first claim stands"
        );
    }

    #[test]
    fn a_claim_keeps_its_place_through_the_batch_s_later_states() {
        // The winner claimed at 10, a batch that lost to it recorded at 11 (its removal
        // failed), the winner settled at 12: a table starting from the store's snapshot
        // sees the winner at 12, after the loser, and must still give it the message.
        let winner = Arc::new((*manifest(vec![1, 2])).clone().claimed_as(10));
        let later_state = Arc::new(winner.with_state(ManifestState::Settled { rejected: vec![] }));
        let loser = manifest(vec![2, 3]);
        for order in [
            [(12, later_state.clone()), (11, loser.clone())],
            [(11, loser.clone()), (12, later_state.clone())],
        ] {
            let mut index = BatchIndex::default();
            index.load(LedgerSnapshot {
                as_of: 12,
                manifests: order.to_vec(),
            });
            assert_eq!(held(&index, 2), Some(winner.id.clone()));
            assert_eq!(
                index.earlier_claim(&loser).map(|m| m.id.clone()),
                Some(winner.id.clone())
            );
            assert!(index.earlier_claim(&later_state).is_none());
        }
    }

    #[test]
    fn a_batch_not_indexed_is_judged_by_its_own_claim() {
        let mut index = BatchIndex::default();
        let first = manifest(vec![1, 2]);
        index.apply(put(10, &first));
        let later = (*manifest(vec![2, 3])).clone().claimed_as(11);
        let earlier = (*manifest(vec![2, 3])).clone().claimed_as(9);
        assert_eq!(
            index.earlier_claim(&later).map(|m| m.id.clone()),
            Some(first.id.clone())
        );
        assert!(index.earlier_claim(&earlier).is_none());
        assert!(
            index.earlier_claim(&manifest(vec![3, 4])).is_none(),
            "nothing shared"
        );
    }

    #[test]
    fn changes_the_snapshot_already_holds_change_nothing() {
        let mut index = BatchIndex::default();
        let stale = manifest(vec![1]);
        let kept = manifest(vec![2]);
        index.load(LedgerSnapshot {
            as_of: 20,
            manifests: vec![(15, kept.clone())],
        });
        // Removed at 18 (before the snapshot), its put reported late: not a ghost.
        index.apply(put(12, &stale));
        assert_eq!(held(&index, 1), None);
        index.apply(removed(&kept, Some(19)));
        assert_eq!(
            held(&index, 2),
            Some(kept.id.clone()),
            "in the snapshot after it"
        );
        index.apply(put(21, &stale));
        assert_eq!(held(&index, 1), Some(stale.id.clone()));
    }
}
