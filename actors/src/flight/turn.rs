//! Inserts to one ClickHouse server fly together, except a suspect's: a batch suspected
//! of crashing the server (see `table::strikes`) flies alone.
//!
//! Why: a crash drops every connection the server had. A batch whose insert was lost
//! beside another may have been committed before the server died, so its loss says
//! nothing about its rows; isolating it would send its rows again in parts, and a
//! deduplicating table knows the whole batch's block, not its parts' (rows twice). A
//! suspect that loses the server while nothing else was in flight most likely crashed
//! it, and that attempt's rows did not go in (a row the server crashes on is parsed
//! before the block is written); an earlier attempt, lost beside others, may have gone
//! in all the same. So only a second such loss is taken as a rejection of its rows
//! (see [`Suspicion`] and `bisect::lost_on_rows`).
//!
//! One gate per server, shared by every flight of every table to it. A flight holds its
//! turn only while it talks to the server (not while it reports or acks), so the wait
//! for a suspect's turn is bounded by the inserts out at the time. Another Sluice
//! instance's inserts are not seen here: docs/operations.md says what that leaves.

use std::sync::Arc;

use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

/// The turns of one server's inserts. A suspect waiting for its turn goes before
/// flights that ask after it (the lock is fair), so traffic cannot starve it.
#[derive(Clone, Debug, Default)]
pub struct SoloGate(Arc<RwLock<()>>);

/// A flight's turn at the server, held while it talks to it.
#[derive(Debug)]
pub enum Turn {
    /// Beside other flights.
    Together(OwnedRwLockReadGuard<()>),
    /// Alone: no other insert to this server is out while it is held.
    Alone(OwnedRwLockWriteGuard<()>),
}

impl Turn {
    pub fn is_alone(&self) -> bool {
        matches!(self, Turn::Alone(_))
    }
}

impl SoloGate {
    /// A turn beside the other flights, once no suspect is out or waiting before it.
    pub async fn together(&self) -> Turn {
        Turn::Together(self.0.clone().read_owned().await)
    }

    /// A turn alone, once every flight out now is done.
    pub async fn alone(&self) -> Turn {
        Turn::Alone(self.0.clone().write_owned().await)
    }

    /// The turn a flight takes: alone when it is a suspect's.
    pub async fn turn(&self, suspect: bool) -> Turn {
        if suspect {
            self.alone().await
        } else {
            self.together().await
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    #[tokio::test]
    async fn flights_go_together() {
        let gate = SoloGate::default();
        let _a = gate.together().await;
        assert!(gate.together().now_or_never().is_some());
    }

    #[tokio::test]
    async fn a_suspect_waits_for_the_flights_out_and_holds_back_the_next() {
        let gate = SoloGate::default();
        let out = gate.together().await;
        let suspect = tokio::spawn({
            let gate = gate.clone();
            async move { gate.alone().await }
        });
        // Bounded: the spawned task gets the runtime's turn within a few yields.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!suspect.is_finished(), "a suspect flew beside a flight out");
        // Asked after the suspect: waits behind it (it is not starved by new flights).
        assert!(gate.together().now_or_never().is_none());
        drop(out);
        let alone = suspect.await.expect("the suspect's task");
        assert!(alone.is_alone());
        assert!(gate.together().now_or_never().is_none());
        drop(alone);
        assert!(gate.together().now_or_never().is_some());
    }
}
