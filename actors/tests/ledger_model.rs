//! The batch ledger's protocol as a model, checked exhaustively on small bounds: every
//! interleaving of two instances, two one-row messages, a stream that redelivers, a
//! bucket of records written by compare-and-set, and a ClickHouse table that
//! deduplicates by block id within a window. docs/architecture.md ("The ledger's
//! protocol, as the model states it") says the same in words.
//!
//! The invariant: no row goes into ClickHouse twice while the window still holds the
//! block id of every attempt (a retry within the window is deduplicated). A window that
//! forgets lets a redelivered batch in again: the counterexample test shows it, which is
//! the precondition of exactly-once. Each rule of the protocol, switched off, gives a
//! counterexample too: the model is not vacuous.
//!
//! A hand-written breadth-first search (no dependency; `stateright` would add a build
//! for what fits in one file). The simulation (tests/simulation/) runs the real actors
//! over the same rules with faults at random; this searches the protocol's order of
//! steps exhaustively.

use std::collections::{BTreeMap, HashSet, VecDeque};

/// Messages (one row each) and instances.
const N: usize = 2;
const I: usize = 2;
/// Deliveries per message, crashes, forgotten block ids: the bounds of the search.
const MAX_DELIVERIES: u8 = 2;
const MAX_CRASHES: u8 = 1;

/// Which rules the protocol keeps (all of them: Sluice's).
#[derive(Clone, Copy)]
struct Rules {
    /// An availability answer splits only a batch nobody can have sent before.
    split_only_never_sent: bool,
    /// A claim judged after its lease ran out is withdrawn at its revision (not removed
    /// whatever it has become).
    withdraw_at_revision: bool,
    /// Of two records holding a message, the one claimed first wins.
    earlier_claim_wins: bool,
    /// Writes after the claim are compare-and-set.
    compare_and_set: bool,
    /// How many block ids the window may forget (0: it covers every redelivery).
    window_forgets: u8,
}

const SLUICE: Rules = Rules {
    split_only_never_sent: true,
    withdraw_at_revision: true,
    earlier_claim_wins: true,
    compare_and_set: true,
    window_forgets: 0,
};

type Mask = u8;

fn bits(m: Mask) -> impl Iterator<Item = usize> {
    (0..N).filter(move |i| m & (1 << i) != 0)
}

/// A message in the stream.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
struct Msg {
    in_stream: bool,
    deliveries: u8,
    /// The instance whose lease runs, and the delivery it holds.
    lease: Option<(u8, u8)>,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum State {
    Open,
    /// The parts (one message each) not yet in.
    Split(Mask),
    Settled,
}

/// A batch's record, keyed by its messages (the id is their set).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Rec {
    state: State,
    revision: u16,
    claim: u16,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Step {
    /// Claimed; to be judged (an earlier claim, the lease).
    Claimed,
    /// To be sent (whole, or its recorded split resumed).
    Send,
    /// Sending these parts of a recorded split.
    Parts(Mask),
    /// Every row in: the verdicts to record.
    Answered,
    /// Recorded settled: the acks to send.
    Ack,
    /// Acks confirmed: the record to forget.
    Forget,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Flight {
    batch: Mask,
    /// Nobody can have sent it before (claimed here, on first deliveries).
    never_sent: bool,
    /// The record's revision as this flight last wrote or read it.
    revision: u16,
    /// The delivery of each message this flight holds (0: read from the stream).
    held: [u8; N],
    step: Step,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
struct Inst {
    /// The delivery of each message held, not in a flight (0: none).
    copies: [u8; N],
    flight: Option<Flight>,
}

/// A block id: a batch whole (`part` 0) or one part of its split (`part` i+1).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
struct Block {
    batch: Mask,
    part: u8,
}

#[derive(Clone, PartialEq, Eq, Hash, Debug, Default)]
struct World {
    stream: [Msg; N],
    inst: [Inst; I],
    records: BTreeMap<Mask, Rec>,
    next_revision: u16,
    /// The window's block ids, and those it forgot.
    window: Vec<Block>,
    forgotten: Vec<Block>,
    /// Times each row went in (capped at 2), and rows taken again under a forgotten id.
    rows: [u8; N],
    excused: Mask,
    crashes: u8,
    forgets: u8,
}

impl World {
    fn start() -> Self {
        let mut w = World::default();
        for m in &mut w.stream {
            m.in_stream = true;
        }
        w
    }

    fn write(&mut self) -> u16 {
        self.next_revision += 1;
        self.next_revision
    }

    /// A write of record `id` over `expected` (compare-and-set, unless the rule is off).
    fn cas(&mut self, rules: &Rules, id: Mask, expected: u16, state: Option<State>) -> Option<u16> {
        let now = self.records.get(&id)?;
        if rules.compare_and_set && now.revision != expected {
            return None;
        }
        let claim = now.claim;
        match state {
            Some(state) => {
                let revision = self.write();
                self.records.insert(
                    id,
                    Rec {
                        state,
                        revision,
                        claim,
                    },
                );
                Some(revision)
            }
            None => {
                self.records.remove(&id);
                Some(0)
            }
        }
    }

    fn insert(&mut self, block: Block) {
        if self.window.contains(&block) {
            return;
        }
        let again = self.forgotten.contains(&block);
        let rows = match block.part {
            0 => block.batch,
            p => 1 << (p - 1),
        };
        for m in bits(rows) {
            self.rows[m] = (self.rows[m] + 1).min(2);
            if again {
                self.excused |= 1 << m;
            }
        }
        self.forgotten.retain(|b| *b != block);
        self.window.push(block);
    }

    /// The flight's held messages go back (a nak of each delivery whose lease runs).
    fn nak(&mut self, i: usize, held: [u8; N]) {
        for (m, &d) in held.iter().enumerate() {
            if d > 0 && self.stream[m].lease == Some((i as u8, d)) {
                self.stream[m].lease = None;
            }
        }
    }

    /// Instance `i`'s flight ends (its held messages naked, or not).
    fn end(&mut self, i: usize, nak: bool) {
        if let Some(f) = self.inst[i].flight.take() {
            if nak {
                self.nak(i, f.held);
            }
        }
    }

    /// Instance `i`'s flight goes on to `step`, the record at `revision`.
    fn step(&mut self, i: usize, step: Step, revision: u16) {
        if let Some(f) = &mut self.inst[i].flight {
            f.step = step;
            f.revision = revision;
        }
    }

    fn ack(&mut self, m: usize) {
        self.stream[m].in_stream = false;
        self.stream[m].lease = None;
    }

    /// The record holding message `m` (the earliest claim wins, unless the rule is off).
    fn holding(&self, rules: &Rules, m: usize) -> Option<(Mask, Rec)> {
        let holding = self.records.iter().filter(|(id, _)| **id & (1 << m) != 0);
        let pick = |(id, r): (&Mask, &Rec)| (*id, *r);
        match rules.earlier_claim_wins {
            true => holding.min_by_key(|(_, r)| r.claim).map(pick),
            false => holding.max_by_key(|(_, r)| r.claim).map(pick),
        }
    }

    /// A record claimed before `id` that shares a message with it.
    fn earlier(&self, rules: &Rules, id: Mask, claim: u16) -> bool {
        self.records.iter().any(|(other, r)| {
            *other != id
                && other & id != 0
                && match rules.earlier_claim_wins {
                    true => r.claim < claim,
                    false => r.claim > claim,
                }
        })
    }

    fn violation(&self, rules: &Rules) -> Option<String> {
        let excused = if rules.window_forgets > 0 {
            0
        } else {
            self.excused
        };
        (0..N)
            .find(|m| self.rows[*m] > 1 && excused & (1 << m) == 0)
            .map(|m| format!("row of message {m} in twice"))
    }
}

/// Every world one step from `w`.
fn next(w: &World, rules: &Rules) -> Vec<World> {
    let mut out = Vec::new();
    for m in 0..N {
        let msg = w.stream[m];
        // The stream delivers a message whose lease is free, to either instance.
        if msg.in_stream && msg.lease.is_none() && msg.deliveries < MAX_DELIVERIES {
            for i in 0..I {
                let mut n = w.clone();
                let d = msg.deliveries + 1;
                n.stream[m].deliveries = d;
                n.stream[m].lease = Some((i as u8, d));
                n.inst[i].copies[m] = d;
                out.push(n);
            }
        }
        // A lease runs out (its holder stood still, or its progress was lost).
        if msg.lease.is_some() {
            let mut n = w.clone();
            n.stream[m].lease = None;
            out.push(n);
        }
    }
    // ClickHouse's window lets go of its oldest block id.
    if w.forgets < rules.window_forgets && !w.window.is_empty() {
        let mut n = w.clone();
        let gone = n.window.remove(0);
        n.forgotten.push(gone);
        n.forgets += 1;
        out.push(n);
    }
    // The collector removes a record all of whose messages left the stream.
    for id in w.records.keys() {
        if bits(*id).all(|m| !w.stream[m].in_stream) {
            let mut n = w.clone();
            n.records.remove(id);
            out.push(n);
        }
    }
    for i in 0..I {
        if w.crashes < MAX_CRASHES && w.inst[i] != Inst::default() {
            let mut n = w.clone();
            n.inst[i] = Inst::default();
            n.crashes += 1;
            out.push(n);
        }
        match w.inst[i].flight {
            None => form(w, rules, i, &mut out),
            Some(f) => fly(w, rules, i, f, &mut out),
        }
    }
    out
}

/// An instance without a flight forms a batch of the copies it holds.
fn form(w: &World, rules: &Rules, i: usize, out: &mut Vec<World>) {
    let copies = w.inst[i].copies;
    let held: Mask = (0..N).filter(|m| copies[*m] > 0).fold(0, |a, m| a | 1 << m);
    for m in bits(held) {
        let Some((id, rec)) = w.holding(rules, m) else {
            continue;
        };
        // A copy of a recorded batch: settled by its record, or the batch formed again.
        let mut n = w.clone();
        if rec.state == State::Settled {
            for m in bits(id & held) {
                n.ack(m);
                n.inst[i].copies[m] = 0;
            }
        } else if w.earlier(rules, id, rec.claim) || bits(id).any(|m| !w.stream[m].in_stream) {
            // Lost to an earlier claim, or never whole again: withdrawn.
            if n.cas(rules, id, rec.revision, None).is_none() {
                continue;
            }
        } else {
            // Formed again: an attempt marked before anything is sent.
            let Some(revision) = n.cas(rules, id, rec.revision, Some(rec.state)) else {
                continue;
            };
            let mut taken = [0; N];
            for m in bits(id & held) {
                taken[m] = copies[m];
                n.inst[i].copies[m] = 0;
            }
            n.inst[i].flight = Some(Flight {
                batch: id,
                never_sent: false,
                revision,
                held: taken,
                // Sent as the record it read says: whole, or its split's untried parts.
                step: match rec.state {
                    State::Split(untried) => Step::Parts(untried),
                    _ => Step::Send,
                },
            });
        }
        out.push(n);
    }
    // A fresh batch: any set of copies no record holds, each on a live lease.
    for batch in 1..(1 << N) as Mask {
        let fits = batch & held == batch
            && bits(batch).all(|m| {
                w.holding(rules, m).is_none() && w.stream[m].lease == Some((i as u8, copies[m]))
            });
        if !fits {
            continue;
        }
        let mut n = w.clone();
        let revision = n.write();
        n.records.insert(
            batch,
            Rec {
                state: State::Open,
                revision,
                claim: revision,
            },
        );
        let mut taken = [0; N];
        for m in bits(batch) {
            taken[m] = copies[m];
            n.inst[i].copies[m] = 0;
        }
        n.inst[i].flight = Some(Flight {
            batch,
            never_sent: bits(batch).all(|m| copies[m] == 1),
            revision,
            held: taken,
            step: Step::Claimed,
        });
        out.push(n);
    }
    // A copy whose lease ran out, of no record, goes back.
    for m in bits(held) {
        if w.stream[m].lease != Some((i as u8, copies[m])) && w.holding(rules, m).is_none() {
            let mut n = w.clone();
            n.inst[i].copies[m] = 0;
            out.push(n);
        }
    }
}

/// The next step of instance `i`'s flight.
fn fly(w: &World, rules: &Rules, i: usize, f: Flight, out: &mut Vec<World>) {
    let end = |n: &mut World, nak: bool| n.end(i, nak);
    let with = |n: &mut World, step: Step, revision: u16| n.step(i, step, revision);
    match f.step {
        Step::Claimed => {
            let mut n = w.clone();
            let claim = w.records.get(&f.batch).map_or(0, |r| r.claim);
            let lost = w.earlier(rules, f.batch, claim);
            let lease = bits(f.batch).all(|m| w.stream[m].lease == Some((i as u8, f.held[m])));
            if lost || !lease {
                match rules.withdraw_at_revision {
                    true => {
                        n.cas(rules, f.batch, f.revision, None);
                    }
                    false => {
                        n.records.remove(&f.batch);
                    }
                }
                end(&mut n, true);
            } else {
                with(&mut n, Step::Send, f.revision);
            }
            out.push(n);
        }
        Step::Send => {
            let whole = Block {
                batch: f.batch,
                part: 0,
            };
            // In, answered.
            let mut n = w.clone();
            n.insert(whole);
            with(&mut n, Step::Answered, f.revision);
            out.push(n);
            // In, the answer lost: the rows go back.
            let mut n = w.clone();
            n.insert(whole);
            end(&mut n, true);
            out.push(n);
            // Too many parts (252), answered before the block id is looked at.
            let mut n = w.clone();
            let may_split = !rules.split_only_never_sent || f.never_sent;
            if may_split && f.batch.count_ones() > 1 {
                match n.cas(rules, f.batch, f.revision, Some(State::Split(f.batch))) {
                    Some(r) => with(&mut n, Step::Parts(f.batch), r),
                    None => end(&mut n, true),
                }
            } else {
                end(&mut n, true);
            }
            out.push(n);
        }
        Step::Parts(0) => {
            let mut n = w.clone();
            with(&mut n, Step::Answered, f.revision);
            out.push(n);
        }
        Step::Parts(left) => {
            let Some(m) = bits(left).next() else { return };
            let part = Block {
                batch: f.batch,
                part: m as u8 + 1,
            };
            let rest = left & !(1 << m);
            let mut n = w.clone();
            n.insert(part);
            match n.cas(rules, f.batch, f.revision, Some(State::Split(rest))) {
                Some(r) => with(&mut n, Step::Parts(rest), r),
                None => end(&mut n, true),
            }
            out.push(n);
            let mut n = w.clone();
            n.insert(part);
            end(&mut n, true);
            out.push(n);
            let mut n = w.clone();
            end(&mut n, true);
            out.push(n);
        }
        Step::Answered => {
            let mut n = w.clone();
            match n.cas(rules, f.batch, f.revision, Some(State::Settled)) {
                Some(r) => with(&mut n, Step::Ack, r),
                None => end(&mut n, true),
            }
            out.push(n);
        }
        Step::Ack => {
            // Acked and confirmed; or the confirmation lost (the record stays).
            let mut n = w.clone();
            for m in bits(f.batch) {
                if f.held[m] > 0 {
                    n.ack(m);
                }
            }
            with(&mut n, Step::Forget, f.revision);
            out.push(n);
            let mut n = w.clone();
            end(&mut n, false);
            out.push(n);
        }
        Step::Forget => {
            let mut n = w.clone();
            if bits(f.batch).all(|m| f.held[m] > 0) {
                n.records.remove(&f.batch);
            }
            end(&mut n, false);
            out.push(n);
        }
    }
}

/// Search every world reachable under `rules`: the states seen, and the shortest path
/// to a violation, if any.
fn search(rules: Rules) -> (usize, Option<(String, Vec<World>)>) {
    let start = World::start();
    let mut seen: HashSet<World> = HashSet::new();
    let mut parent: Vec<(World, usize)> = Vec::new();
    let mut queue = VecDeque::new();
    seen.insert(start.clone());
    parent.push((start, usize::MAX));
    queue.push_back(0);
    while let Some(at) = queue.pop_front() {
        let w = parent[at].0.clone();
        if let Some(why) = w.violation(&rules) {
            let mut path = Vec::new();
            let mut k = at;
            while k != usize::MAX {
                path.push(parent[k].0.clone());
                k = parent[k].1;
            }
            path.reverse();
            return (seen.len(), Some((why, path)));
        }
        for n in next(&w, &rules) {
            if seen.insert(n.clone()) {
                parent.push((n, at));
                queue.push_back(parent.len() - 1);
            }
        }
    }
    (seen.len(), None)
}

fn counterexample(rules: Rules) -> (String, usize) {
    let (states, found) = search(rules);
    let Some((why, path)) = found else {
        panic!("no counterexample in {states} states");
    };
    (why, path.len())
}

#[test]
fn no_row_twice_while_the_window_covers_every_redelivery() {
    let (states, found) = search(SLUICE);
    println!("ledger model: {states} states, no row twice");
    if let Some((why, path)) = found {
        let steps: Vec<String> = path.iter().map(|w| format!("{w:?}")).collect();
        panic!("{why}, after:\n{}", steps.join("\n"));
    }
    assert!(states > 1_000, "the search reached only {states} states");
}

/// The precondition: a window that forgets a block id before a redelivery of its batch
/// comes back lets the batch in again.
#[test]
fn a_window_that_forgets_lets_a_redelivered_batch_in_twice() {
    let (why, steps) = counterexample(Rules {
        window_forgets: 1,
        ..SLUICE
    });
    println!("window forgets: {why} after {steps} steps");
}

/// Each rule of the protocol, switched off, lets a row in twice within the window.
/// ("The later claim wins" needs a third delivery: beyond these bounds, its search
/// takes minutes; the simulation finds it, see the mutation table of issue 39.)
#[test]
fn each_rule_switched_off_lets_a_row_in_twice() {
    for (rule, rules) in [
        (
            "a 252 splits a batch sent before",
            Rules {
                split_only_never_sent: false,
                ..SLUICE
            },
        ),
        (
            "a claim given up is removed whatever it became",
            Rules {
                withdraw_at_revision: false,
                ..SLUICE
            },
        ),
        (
            "writes are blind",
            Rules {
                compare_and_set: false,
                ..SLUICE
            },
        ),
    ] {
        let (why, steps) = counterexample(rules);
        println!("{rule}: {why} after {steps} steps");
    }
}
