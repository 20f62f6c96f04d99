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
//! (see [`crate::protocol::Suspicion`] and `bisect::lost_on_rows`).
//!
//! The turns are the server's pool's to grant ([`crate::pool::turns`]), by message, like
//! its permits: one place orders every flight of every table to the server. A flight
//! holds its turn only while it talks to the server (not while it reports or acks), so
//! the wait for a suspect's turn is bounded by the inserts out at the time. Another
//! Sluice instance's inserts are not seen here: docs/operations.md says what that
//! leaves; nor are a pool's turns that its predecessor granted before it restarted.

use crate::protocol::TurnId;
use crate::protocol::{FlightRequest, PoolLink};

/// A flight's turn at its server, held while it talks to it; given back to the pool
/// when dropped (the flight done with the server, cancelled, or panicking).
#[derive(Debug)]
pub struct Turn {
    alone: bool,
    /// The pool that granted it, and its number there (`None`: no pool to ask).
    granted: Option<(PoolLink, TurnId)>,
}

impl Turn {
    /// Whether no other insert to the server is out while it is held.
    pub fn is_alone(&self) -> bool {
        self.alone
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some((pool, id)) = self.granted.take() {
            let _ = pool.send_message(FlightRequest::TurnOver(id));
        }
    }
}

/// Ask the server's pool for a turn (alone: a suspect's). `None`: no turn now — a
/// suspect's whose pool is restarting, or died before it answered (its rows go back).
/// A flight that is no suspect goes beside whatever is out when there is no pool to
/// ask: ordering matters only for a suspect.
pub async fn take(pool: Option<&PoolLink>, alone: bool) -> Option<Turn> {
    let ungated = (!alone).then_some(Turn {
        alone: false,
        granted: None,
    });
    let Some(pool) = pool else {
        return ungated;
    };
    let (tx, rx) = ractor::concurrency::oneshot();
    let asked = FlightRequest::Turn {
        alone,
        reply: tx.into(),
    };
    if pool.send_message(asked).is_err() {
        return ungated;
    }
    match rx.await {
        Ok(id) => Some(Turn {
            alone,
            granted: Some((pool.clone(), id)),
        }),
        Err(_) => ungated,
    }
}
