//! The turns of one server's inserts, granted by its pool: flights go together, a
//! suspect's alone (see `crate::flight::turn` for why). A pure state machine: the pool
//! asks it in its mailbox, so who talks to the server is decided in one place, by
//! message, like the pool's permits.
//!
//! Fair: a turn asked while others wait is queued behind them, so a suspect waiting for
//! the flights out is not starved by flights that ask after it, and those wait behind
//! the suspect.

use std::collections::VecDeque;

use crate::protocol::TurnId;

/// The turns of one server. `R`: how a queued asker is answered (the pool's reply
/// port; anything in the tests).
#[derive(Debug)]
pub struct Turns<R> {
    /// Turns out beside each other.
    together: Vec<TurnId>,
    /// The turn out alone, if any.
    alone: Option<TurnId>,
    waiting: VecDeque<Waiting<R>>,
    next: TurnId,
}

#[derive(Debug)]
struct Waiting<R> {
    id: TurnId,
    alone: bool,
    reply: R,
}

impl<R> Default for Turns<R> {
    fn default() -> Self {
        Self {
            together: Vec::new(),
            alone: None,
            waiting: VecDeque::new(),
            next: 1,
        }
    }
}

impl<R> Turns<R> {
    /// A flight asks for a turn (alone: a suspect's). Returns the turns granted now, each
    /// with the reply to answer it by: this one if it may go at once, none if it waits.
    pub fn ask(&mut self, alone: bool, reply: R) -> Vec<(TurnId, R)> {
        let id = self.next;
        self.next += 1;
        self.waiting.push_back(Waiting { id, alone, reply });
        self.grant()
    }

    /// A turn is given back (its flight is done talking to the server, or gone).
    /// Returns the turns that may go now.
    pub fn over(&mut self, id: TurnId) -> Vec<(TurnId, R)> {
        if self.alone == Some(id) {
            self.alone = None;
        }
        self.together.retain(|t| *t != id);
        self.grant()
    }

    /// Turns out now (beside each other, and alone).
    pub fn out(&self) -> usize {
        self.together.len() + usize::from(self.alone.is_some())
    }

    /// Grant from the head of the queue while the head may go: a turn alone once
    /// nothing is out, a turn together once nothing is out alone.
    fn grant(&mut self) -> Vec<(TurnId, R)> {
        let mut granted = Vec::new();
        while let Some(head) = self.waiting.front() {
            let may_go = if head.alone {
                self.out() == 0
            } else {
                self.alone.is_none()
            };
            if !may_go {
                break;
            }
            let Some(w) = self.waiting.pop_front() else {
                break;
            };
            if w.alone {
                self.alone = Some(w.id);
            } else {
                self.together.push(w.id);
            }
            granted.push((w.id, w.reply));
        }
        granted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(granted: Vec<(TurnId, &'static str)>) -> Vec<&'static str> {
        granted.into_iter().map(|(_, who)| who).collect()
    }

    #[test]
    fn flights_go_together() {
        let mut turns = Turns::default();
        assert_eq!(ids(turns.ask(false, "a")), ["a"]);
        assert_eq!(ids(turns.ask(false, "b")), ["b"]);
        assert_eq!(turns.out(), 2);
    }

    #[test]
    fn a_suspect_waits_for_the_flights_out_and_holds_back_the_next() {
        let mut turns = Turns::default();
        let out = turns.ask(false, "out")[0].0;
        assert!(
            turns.ask(true, "suspect").is_empty(),
            "a suspect beside a flight out"
        );
        assert!(
            turns.ask(false, "later").is_empty(),
            "asked after the suspect: waits behind it"
        );
        assert_eq!(ids(turns.over(out)), ["suspect"]);
        assert_eq!(turns.out(), 1);
        let suspect = 2;
        assert_eq!(ids(turns.over(suspect)), ["later"]);
        assert_eq!(turns.out(), 1);
    }

    #[test]
    fn giving_back_a_turn_twice_or_one_never_granted_changes_nothing() {
        let mut turns: Turns<&str> = Turns::default();
        let a = turns.ask(false, "a")[0].0;
        assert!(turns.over(a).is_empty());
        assert!(turns.over(a).is_empty());
        assert!(turns.over(99).is_empty());
        assert_eq!(turns.out(), 0);
        assert_eq!(ids(turns.ask(true, "alone")), ["alone"]);
    }
}
