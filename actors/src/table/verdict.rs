//! What a flight learnt, as the owners of the breakers see it: the verdict it reports
//! with the tickets it went with, the pool's part of it, and what becomes of the rows it
//! could not settle.

use std::time::Duration;

use ractor::RpcReplyPort;

use std::sync::Arc;

use crate::batch::RowVerdict;
use crate::breaker::Ticket;
use crate::ledger::LedgerRefusal;
use crate::ports::{Class, ClickHouseError, Dedup};

/// The permissions a flight went with: the pool's of the replica it goes to (its
/// outage breaker) and the table's own for that replica (its backoff there). Either
/// may be its owner's probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tickets {
    pub pool: Ticket,
    pub table: Ticket,
    /// The replica (by index in its target): where the flight sends its rows.
    pub replica: usize,
}

/// How a flight ended, as the breakers see it.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// ClickHouse answered: a success, or rows judged (rejected). Closes a probe's window.
    Answered,
    /// The replica could not take it: its pool's breaker opens or escalates.
    PoolOutage(ClickHouseError),
    /// This table could not take it there (read-only, too many parts, a missing
    /// grant): its own backoff for the replica opens; the replica answered.
    TableOutage(ClickHouseError),
    /// The table (or its database) does not exist: the same for every row. The table
    /// waits for it (its own backoff) for `missing_table_grace`, then parks.
    MissingTable(ClickHouseError),
    /// Nothing to judge by (cancelled at the shutdown deadline): tokens go back.
    Unfinished,
    /// The ledger did not let the batch go (its record could not be written or read, an
    /// earlier batch holds one of its messages, a lease ran out): nothing was sent (or
    /// nothing more, once a split could not be recorded); tokens go back.
    Unsent(LedgerRefusal),
}

/// The verdict of an answer that stopped a flight short of judging every row.
pub fn outage(e: ClickHouseError) -> Verdict {
    if e.missing_table {
        Verdict::MissingTable(e)
    } else if e.table_scoped {
        Verdict::TableOutage(e)
    } else {
        Verdict::PoolOutage(e)
    }
}

/// What one flight did, for the table's totals and snapshot.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FlightOutcome {
    pub rows: usize,
    pub inserted: usize,
    pub parked: usize,
    pub handed_back: usize,
    pub dlq_failures: usize,
    pub last_error: Option<String>,
    /// Messages naked with some lines settled (a batch not recorded): those lines need
    /// nothing more.
    pub partly: Vec<(u64, Vec<u32>)>,
    /// Whether ClickHouse deduplicates this table's inserts, as the flight found out.
    pub dedup: Option<Dedup>,
    /// The flight lost ClickHouse's connection while ClickHouse was taking inserts:
    /// a strike against each of these messages.
    pub struck: Vec<u64>,
    /// A recorded batch was sent again past the table's deduplication window.
    pub past_dedup_window: bool,
    /// The stream sequences of the messages the flight held: no longer out.
    pub messages: Vec<u64>,
}

/// What becomes of a flight's pending rows, as the owner of the breaker that sent them
/// back decides.
#[derive(Clone, Debug, PartialEq)]
pub enum PendingRows {
    /// Back to the queue, delivered again after this delay.
    HandBack(Duration),
    /// Parked, with this reason (a table still missing after its grace).
    Park(ClickHouseError),
}

impl PendingRows {
    /// Apply to a flight's verdicts: the delay its pending rows go back with, and
    /// whether they were parked instead (their verdicts then say why).
    pub fn apply(self, verdicts: &mut [RowVerdict]) -> (Duration, bool) {
        match self {
            PendingRows::HandBack(delay) => (delay, false),
            PendingRows::Park(reason) => {
                let reason = Arc::new(reason);
                for v in verdicts.iter_mut().filter(|v| **v == RowVerdict::Pending) {
                    *v = RowVerdict::Rejected(reason.clone());
                }
                (Duration::ZERO, true)
            }
        }
    }
}

/// The pool's part of a verdict, with the pool's ticket.
#[derive(Clone, Debug, PartialEq)]
pub enum PoolVerdict {
    Answered(Ticket),
    Outage(Ticket, ClickHouseError),
    Unfinished(Ticket),
}

impl Verdict {
    /// The class of the failure its pending rows are retried for (counted by reason).
    pub fn retry_class(&self) -> Option<Class> {
        match self {
            Verdict::PoolOutage(e) | Verdict::TableOutage(e) | Verdict::MissingTable(e) => {
                Some(e.class)
            }
            _ => None,
        }
    }
}

/// A flight's verdict for its table. When rows are pending, `reply` gets what becomes
/// of them.
pub struct FlightVerdict {
    pub tickets: Tickets,
    pub verdict: Verdict,
    pub reply: Option<RpcReplyPort<PendingRows>>,
}

// === impl FlightVerdict ===

impl FlightVerdict {
    /// The pool's part: what the table forwards, or the flight sends itself when its
    /// table is gone.
    pub fn for_pool(&self) -> PoolVerdict {
        let t = self.tickets.pool;
        match &self.verdict {
            Verdict::Answered | Verdict::TableOutage(_) | Verdict::MissingTable(_) => {
                PoolVerdict::Answered(t)
            }
            Verdict::PoolOutage(e) => PoolVerdict::Outage(t, e.clone()),
            Verdict::Unfinished | Verdict::Unsent(_) => PoolVerdict::Unfinished(t),
        }
    }
}
