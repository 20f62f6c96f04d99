//! Which server of a target a batch goes to: the target's layout (shards, each a list
//! of replicas) and the choice of a replica, a pure function of what the replicas'
//! pools published of their breakers and of the table's own backoff for each replica.
//!
//! The choice decides nothing about a window: the replica's pool still admits or turns
//! the request away (a state published a moment ago may have changed since), and the
//! table then asks the next replica of the shard.
//!
//! - A batch recorded for a shard goes to a replica of that shard, never another: the
//!   replicas of a shard share the Replicated table's block ids in ZooKeeper, so the
//!   same rows sent again to the twin are deduplicated; sent to another shard they
//!   would not be.
//! - A fresh batch may go to any shard: the shards are taken in turn (round-robin per
//!   table), skipping a shard none of whose replicas takes requests now.
//! - Within a shard the replicas are taken in turn too; a replica whose window is open
//!   (its pool's, or the table's for it: read-only, too many parts) is passed over; one
//!   whose window ended is asked only when no replica of the shard is closed (it gets
//!   the probe).

use std::time::Duration;

use crate::breaker::Gate;

/// A target's servers: its shards, each a list of replicas, numbered in the order the
/// configuration lists them (replica `r` of the flat list is in shard `shard_of(r)`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    shard_of: Vec<usize>,
    shards: Vec<Vec<usize>>,
}

impl Layout {
    /// `replicas[s]` replicas in shard `s` (each at least one).
    pub fn new(replicas: &[usize]) -> Self {
        let mut shard_of = Vec::new();
        let mut shards = Vec::new();
        for (shard, &n) in replicas.iter().enumerate() {
            let first = shard_of.len();
            shard_of.extend(std::iter::repeat_n(shard, n.max(1)));
            shards.push((first..shard_of.len()).collect());
        }
        if shards.is_empty() {
            return Self::single();
        }
        Self { shard_of, shards }
    }

    /// One server: one shard of one replica.
    pub fn single() -> Self {
        Self {
            shard_of: vec![0],
            shards: vec![vec![0]],
        }
    }

    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    pub fn replicas(&self) -> usize {
        self.shard_of.len()
    }

    pub fn shard_of(&self, replica: usize) -> usize {
        self.shard_of.get(replica).copied().unwrap_or(0)
    }

    pub fn replicas_of(&self, shard: usize) -> &[usize] {
        self.shards.get(shard).map_or(&[], Vec::as_slice)
    }

    /// The shard a batch recorded for shard `recorded` goes to: the same, or, when the
    /// target has fewer shards now than when it was recorded, `recorded mod shards`
    /// (there it is not deduplicated against its first attempt; docs/operations.md
    /// says to keep the shards while batches are recorded for them).
    pub fn recorded_shard(&self, recorded: u32) -> usize {
        usize::try_from(recorded).unwrap_or(usize::MAX) % self.shards().max(1)
    }
}

/// What routing picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    Replica(usize),
    /// No replica takes requests now: hand the batch back with this delay (the shortest
    /// wait among them).
    Wait(Duration),
}

/// A replica for a batch of `shard` (a fresh batch: `None`, any shard), given each
/// replica's gate (by replica index); `turn` rotates among the shards and among a
/// shard's replicas (the table's count of batches); `skip`: replicas that turned this
/// batch away already.
pub fn pick(
    layout: &Layout,
    shard: Option<usize>,
    gates: &[Gate],
    turn: usize,
    skip: &[usize],
) -> Pick {
    let n = layout.shards();
    let shards: Vec<usize> = match shard {
        Some(s) => vec![s],
        None => (0..n).map(|i| (turn + i) % n.max(1)).collect(),
    };
    let mut best: Option<(u8, usize)> = None;
    let mut wait: Option<Duration> = None;
    for s in shards {
        let replicas = layout.replicas_of(s);
        let len = replicas.len().max(1);
        // Within a shard the rotation moves once per round of shards.
        let start = (turn / n.max(1)) % len;
        for i in 0..replicas.len() {
            let r = replicas[(start + i) % len];
            if skip.contains(&r) {
                continue;
            }
            let gate = gates.get(r).copied().unwrap_or(Gate::Closed);
            match gate.rank() {
                Some(rank) if best.is_none_or(|(b, _)| rank < b) => best = Some((rank, r)),
                Some(_) => {}
                None => {
                    if let Gate::Wait(d) = gate {
                        wait = Some(wait.map_or(d, |w| w.min(d)));
                    }
                }
            }
        }
    }
    match (best, wait) {
        (Some((_, r)), _) => Pick::Replica(r),
        (None, Some(d)) => Pick::Wait(d),
        // Every replica was skipped: ask again after a short while.
        (None, None) => Pick::Wait(Duration::ZERO),
    }
}

/// The shortest wait before any replica (of any shard) takes requests again, or `None`
/// when one takes them now (arrivals are handed back only while none does).
pub fn all_waiting(gates: &[Gate]) -> Option<Duration> {
    let mut wait: Option<Duration> = None;
    for gate in gates {
        match gate {
            Gate::Wait(d) => wait = Some(wait.map_or(*d, |w| w.min(*d))),
            _ => return None,
        }
    }
    wait
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn two_by_two() -> Layout {
        Layout::new(&[2, 2])
    }

    #[test]
    fn the_layout_numbers_replicas_shard_by_shard() {
        let l = Layout::new(&[2, 3]);
        assert_eq!((l.shards(), l.replicas()), (2, 5));
        assert_eq!(l.replicas_of(0), &[0, 1]);
        assert_eq!(l.replicas_of(1), &[2, 3, 4]);
        assert_eq!(l.shard_of(3), 1);
        assert_eq!(Layout::new(&[]), Layout::single());
    }

    #[test]
    fn fresh_batches_take_the_shards_in_turn() {
        let l = two_by_two();
        let gates = [Gate::Closed; 4];
        let shards: Vec<usize> = (0..4)
            .map(|turn| match pick(&l, None, &gates, turn, &[]) {
                Pick::Replica(r) => l.shard_of(r),
                Pick::Wait(_) => panic!("waits"),
            })
            .collect();
        assert_eq!(shards, vec![0, 1, 0, 1]);
        // Both replicas of a shard are used, one round of shards after the other.
        let replicas: Vec<Pick> = (0..4).map(|t| pick(&l, Some(0), &gates, t, &[])).collect();
        assert_eq!(
            replicas,
            vec![
                Pick::Replica(0),
                Pick::Replica(0),
                Pick::Replica(1),
                Pick::Replica(1)
            ]
        );
    }

    #[test]
    fn a_shard_with_every_replica_down_is_skipped_by_fresh_batches_only() {
        let l = two_by_two();
        let gates = [Gate::Wait(S), Gate::Wait(2 * S), Gate::Closed, Gate::Closed];
        for turn in 0..4 {
            let Pick::Replica(r) = pick(&l, None, &gates, turn, &[]) else {
                panic!("a fresh batch waits while shard 1 is up");
            };
            assert_eq!(l.shard_of(r), 1);
        }
        // A batch recorded for shard 0 waits for it: the shortest window.
        assert_eq!(pick(&l, Some(0), &gates, 0, &[]), Pick::Wait(S));
    }

    #[test]
    fn a_replica_down_is_passed_over_for_its_twin_and_a_probe_only_when_none_is_closed() {
        let l = two_by_two();
        let gates = [Gate::Wait(S), Gate::Closed, Gate::ProbeDue, Gate::Closed];
        for turn in 0..4 {
            assert_eq!(pick(&l, Some(0), &gates, turn, &[]), Pick::Replica(1));
            assert_eq!(pick(&l, Some(1), &gates, turn, &[]), Pick::Replica(3));
        }
        let gates = [Gate::Wait(S), Gate::ProbeDue, Gate::Closed, Gate::Closed];
        assert_eq!(pick(&l, Some(0), &gates, 0, &[]), Pick::Replica(1));
        // A fresh batch prefers a closed replica of another shard to a probe.
        assert_eq!(pick(&l, None, &gates, 0, &[]), Pick::Replica(2));
    }

    #[test]
    fn a_replica_that_turned_the_batch_away_is_not_asked_again() {
        let l = two_by_two();
        let gates = [Gate::Closed; 4];
        assert_eq!(pick(&l, Some(0), &gates, 0, &[0]), Pick::Replica(1));
        assert_eq!(
            pick(&l, Some(0), &gates, 0, &[0, 1]),
            Pick::Wait(Duration::ZERO)
        );
    }

    #[test]
    fn gates_combine_to_the_stricter() {
        assert_eq!(Gate::Closed.and(Gate::Closed), Gate::Closed);
        assert_eq!(Gate::Closed.and(Gate::ProbeDue), Gate::ProbeDue);
        assert_eq!(Gate::ProbeDue.and(Gate::Wait(S)), Gate::Wait(S));
        assert_eq!(Gate::Wait(2 * S).and(Gate::Wait(S)), Gate::Wait(2 * S));
        assert_eq!(all_waiting(&[Gate::Wait(2 * S), Gate::Wait(S)]), Some(S));
        assert_eq!(all_waiting(&[Gate::Wait(S), Gate::ProbeDue]), None);
    }
}
