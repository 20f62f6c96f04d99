//! What the table, its pools and its flights say to each other about a batch: the
//! cargo a table hands a flight, the permits a pool grants, the verdict a flight
//! reports (and the pool's part of it), what becomes of its pending rows, and what it
//! did. One file, so the way of a batch reads in one place:
//!
//! `Cargo` (table → flight) → the ledger's `Formed` → `FlightVerdict` (flight → table,
//! and → pool as a `VerdictReport`) → `PendingRows` (back to the flight) →
//! `FlightOutcome` (flight → table).
//!
//! The actors know each other only through these (derived references: a table's
//! `PoolLink` takes `FlightRequest`s, a flight's `FlightLink` takes `FlightReport`s);
//! none knows another's mailbox.

use std::sync::Arc;
use std::time::Duration;

use ractor::{ActorId, DerivedActorRef, RpcReplyPort};
use tokio::time::Instant;

use crate::batch::RowVerdict;
use crate::breaker::scoped::ScopedBreaker;
use crate::breaker::Ticket;
use crate::ledger::{LedgerRefusal, Manifest};
use crate::ports::{Class, ClickHouseError, Dedup, Delivery, TableKey};

/// What a table hands a flight.
pub enum Cargo<D> {
    /// Messages from the buffer, some coming back with lines an earlier flight settled
    /// (a table that does not record its batches).
    Fresh {
        deliveries: Vec<D>,
        done: Vec<(u64, Vec<u32>)>,
        /// Whether a message of it is suspected of crashing ClickHouse.
        suspicion: Suspicion,
    },
    /// A recorded batch, formed again: the messages of it this table holds.
    Reformed {
        manifest: Arc<Manifest>,
        held: Vec<D>,
        suspicion: Suspicion,
    },
}

impl<D: Delivery> Cargo<D> {
    /// The stream sequences of the messages it holds.
    pub fn messages(&self) -> Vec<u64> {
        let held = match self {
            Cargo::Fresh { deliveries, .. } => deliveries,
            Cargo::Reformed { held, .. } => held,
        };
        held.iter().map(|d| d.position().stream_sequence).collect()
    }
}

impl<D> Cargo<D> {
    pub fn suspicion(&self) -> Suspicion {
        match self {
            Cargo::Fresh { suspicion, .. } | Cargo::Reformed { suspicion, .. } => *suspicion,
        }
    }
}

/// How far a batch is suspected of crashing ClickHouse, from its messages' strikes.
///
/// Why a loss alone is not enough: an insert ClickHouse committed just before it died
/// (killed, or crashing for reasons of its own) ends as a lost connection too. Its
/// batch, sent again, is deduplicated, unless it is split: the halves are other blocks
/// (other tokens), and the rows the first attempt committed go in twice. In a crash loop
/// that strikes whatever insert is out, a batch in flight at every crash collects its
/// strikes without being at fault; the loss alone after them must be seen twice before
/// its rows are judged (a row ClickHouse does crash on costs one crash more).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suspicion {
    /// Flies beside the other flights.
    Clear,
    /// `poison_strikes` strikes: flies alone; a lost connection is one more strike.
    FliesAlone,
    /// Lost the connection alone as well: flies alone, and a lost connection after which
    /// ClickHouse answers again is taken as a rejection of its rows (isolated).
    IsolatedIfLostAlone,
}

impl Suspicion {
    /// Whether the batch flies alone (see `solo`).
    pub fn flies_alone(self) -> bool {
        self != Suspicion::Clear
    }
}

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

/// What outlives a TableActor (a panic, a reap while it waits): kept by its target and
/// handed to the table's next actor, so a restart neither closes a backoff early nor
/// starts a missing table's grace (and its WARN) over.
#[derive(Clone, Debug)]
pub struct TableCarryOver {
    /// The table's own backoff for each replica of its target (by replica index).
    pub backoffs: Vec<ScopedBreaker>,
    /// Since when ClickHouse says the table does not exist (see `missing_table_grace`).
    pub missing_since: Option<Instant>,
}

impl TableCarryOver {
    /// Whether a reaped table must leave it behind for its next arrival.
    pub fn still_running(&self) -> bool {
        self.backoffs.iter().any(|b| !b.is_closed()) || self.missing_since.is_some()
    }
}

/// Where a table asks a replica's pool for flights: a derived reference, so the table
/// knows nothing of the pool's messages.
pub type PoolLink = DerivedActorRef<FlightRequest>;

/// A flight's turn at its server, as the server's pool numbered it (to give it back).
pub type TurnId = u64;

/// What a table (or its flight) asks of, or tells, the pool of one replica.
pub enum FlightRequest {
    /// A batch is due: may a flight go to this replica? Answered through `reply`.
    WantsFlight {
        key: TableKey,
        id: ActorId,
        reply: DerivedActorRef<Permit>,
    },
    /// A flight's verdict for the replica's breaker (boxed: once per flight, and it
    /// carries a whole ClickHouse error, while every flight's `WantsFlight` is small).
    Verdict(Box<VerdictReport>),
    /// A flight's turn to talk to the server: beside the other flights, or alone (a
    /// suspect's; see `crate::flight::turn`). Answered with the turn's number once it
    /// may go.
    Turn {
        alone: bool,
        reply: RpcReplyPort<TurnId>,
    },
    /// A turn given back.
    TurnOver(TurnId),
}

/// A replica's pool's answer to [`FlightRequest::WantsFlight`]: go with its ticket, or
/// not now (this long).
pub struct Permit {
    pub replica: usize,
    pub answer: Result<Ticket, Duration>,
}

/// A flight's verdict for the breaker of the replica it went to. A pool outage's
/// `reply` gets what becomes of the flight's pending rows.
pub struct VerdictReport {
    pub key: TableKey,
    pub replica: usize,
    pub verdict: PoolVerdict,
    pub reply: Option<RpcReplyPort<PendingRows>>,
}

/// What a table tells its target (through a derived reference: the table knows nothing
/// of the target's messages).
pub enum TableReport {
    /// What the table's successor must start from changed (its backoffs, the missing
    /// table's wait): the target keeps a copy.
    CarryOver {
        key: TableKey,
        carry: Box<TableCarryOver>,
    },
    /// The table has been idle long enough to be reaped.
    Idle { key: TableKey, id: ActorId },
    /// A verdict whose replica's pool could not be told (restarting): the target hands
    /// it to the pool's successor.
    Verdict(VerdictReport),
}

/// What a flight tells its table (through a derived reference: the flight knows
/// nothing of the table's mailbox).
pub enum FlightReport {
    /// Its verdict, as soon as it is known (before its rows are settled), so the
    /// breakers learn it at once.
    Verdict(FlightVerdict),
    /// Every row settled.
    Done(FlightOutcome),
}

/// Where a flight reports: its table (see [`FlightReport`]).
pub type FlightLink = DerivedActorRef<FlightReport>;
