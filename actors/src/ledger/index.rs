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

/// A block holds the stream sequences that agree but for their lowest `BLOCK_BITS`
/// bits. The index keeps the batches holding a message of each block, not the batch
/// of each message: a batch's messages are mostly one run of consecutive sequences, so
/// a batch of 1,000 messages is in ~16 blocks, and indexing, looking up and removing
/// it touch a few hundred small entries instead of one scattered hash entry per
/// message (which cost a cache miss each, with ~20,000 messages in flight:
/// docs/benchmark.md, "Where the wall-clock extra goes").
const BLOCK_BITS: u32 = 6;

fn block_of(stream_sequence: u64) -> u64 {
    stream_sequence >> BLOCK_BITS
}

/// The distinct blocks of ascending sequences, in order.
fn blocks_of(sequences: &[u64]) -> impl Iterator<Item = u64> + '_ {
    let mut previous = None;
    sequences.iter().filter_map(move |&seq| {
        let block = block_of(seq);
        (previous.replace(block) != Some(block)).then_some(block)
    })
}

#[derive(Debug, Default)]
pub struct BatchIndex {
    /// Changes at or below this revision are in already (the snapshot it started from).
    as_of: u64,
    by_id: HashMap<String, Slot>,
    /// The batches indexed, by slot (`None`: free, its number in `free`). A block points
    /// at its batches' slots, not at the manifests themselves: a later state of a batch
    /// (its split, its verdicts) is swapped in the slot alone, and no block holds a
    /// reference count to change.
    entries: Vec<Option<Entry>>,
    free: Vec<Slot>,
    /// The batches holding a message of each block (see [`BLOCK_BITS`]): mostly one,
    /// two where one batch ends and the next begins. Two batches may claim one message
    /// for a moment (the store removes the later one): the one recorded first answers.
    by_block: HashMap<u64, Vec<Slot>, BuildHasherDefault<SequenceHasher>>,
}

/// The hash of a stream sequence (or a block of them): one multiplication (the
/// constant of rustc's FxHash), where the default SipHash took most of an
/// exactly-once batch's bookkeeping. Sequences are not chosen by anyone who could aim
/// at collisions.
#[derive(Default)]
pub(crate) struct SequenceHasher(u64);

/// A set of stream sequences, hashed as the index's blocks are (see [`SequenceHasher`]).
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

    /// The batch holding the message at this stream sequence, if any: of two that
    /// claim it, the one whose claim came first.
    pub fn holding(&self, stream_sequence: u64) -> Option<&Arc<Manifest>> {
        if self.by_block.is_empty() {
            return None;
        }
        self.by_block
            .get(&block_of(stream_sequence))?
            .iter()
            .filter_map(|&slot| self.entry(slot))
            .filter(|e| e.manifest.holds(stream_sequence))
            .min_by_key(|e| e.claim_order())
            .map(|e| &e.manifest)
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
            Some(entry) => entry.claim_order(),
            None if m.claim_revision > 0 => m.claim_revision,
            None => u64::MAX,
        };
        // Only a block where an earlier batch holds something can hold a shared message:
        // mostly none, or the one where the earlier batch ends.
        let mut rest = m.messages.as_slice();
        while let Some(&first) = rest.first() {
            let block = block_of(first);
            let in_block = rest.partition_point(|&seq| block_of(seq) == block);
            let (these, after) = rest.split_at(in_block);
            rest = after;
            let earlier: Vec<&Entry> = self
                .by_block
                .get(&block)
                .into_iter()
                .flatten()
                .filter_map(|&slot| self.entry(slot))
                .filter(|e| e.manifest.id != m.id && e.claim_order() < order)
                .collect();
            if earlier.is_empty() {
                continue;
            }
            let shared = these.iter().find_map(|&seq| {
                earlier
                    .iter()
                    .filter(|e| e.manifest.holds(seq))
                    .min_by_key(|e| e.claim_order())
            });
            if let Some(held) = shared {
                return Some(&held.manifest);
            }
        }
        None
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
                    // A later state of the same batch: the same messages, whose blocks
                    // point at this slot already.
                    *known = Entry { revision, manifest };
                }
                return;
            }
        }
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.entries.push(None);
                (self.entries.len() - 1) as Slot
            }
        };
        for block in blocks_of(&manifest.messages) {
            self.by_block.entry(block).or_default().push(slot);
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
        for block in blocks_of(&gone.manifest.messages) {
            if let Some(slots) = self.by_block.get_mut(&block) {
                slots.retain(|s| *s != slot);
                if slots.is_empty() {
                    self.by_block.remove(&block);
                }
            }
        }
        if self.by_id.is_empty() {
            // Nothing indexed: the slots start again from the first.
            self.entries.clear();
            self.free.clear();
            self.by_block.clear();
        }
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
    fn batches_that_meet_in_a_block_each_keep_their_own_messages() {
        // 1..=100 and 101..=200 meet in the block of 64..=127; 300 and 1000 are one batch
        // far apart (a message delivered again, formed with fresh ones).
        let mut index = BatchIndex::default();
        let first = manifest((1..=100).collect());
        let second = manifest((101..=200).collect());
        let apart = manifest(vec![300, 1000]);
        index.apply(put(10, &first));
        index.apply(put(11, &second));
        index.apply(put(12, &apart));
        assert_eq!(held(&index, 100), Some(first.id.clone()));
        assert_eq!(held(&index, 101), Some(second.id.clone()));
        assert_eq!(held(&index, 1000), Some(apart.id.clone()));
        assert_eq!(held(&index, 0), None);
        assert_eq!(held(&index, 201), None);
        assert_eq!(held(&index, 500), None, "between two messages of one batch");
        assert!(index.earlier_claim(&second).is_none(), "nothing shared");
        let overlapping = manifest((150..=310).collect());
        assert_eq!(
            index.earlier_claim(&overlapping).map(|m| m.id.clone()),
            Some(second.id.clone()),
            "its first shared message is 150"
        );
        index.apply(removed(&first, None));
        assert_eq!(held(&index, 100), None);
        assert_eq!(held(&index, 101), Some(second.id.clone()));
        index.apply(removed(&second, None));
        index.apply(removed(&apart, None));
        assert!(index.is_empty());
        assert!(index.by_block.is_empty());
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
