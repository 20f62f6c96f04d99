//! A TableActor's state, by concern: where it reports, its place in the live tree, its
//! buffer and ledger, its routes and the flight it asks for, its flights out, its timers,
//! how it ends, and what ClickHouse told it.

use super::lanes::Lanes;
use super::routes::TableRoutes;
use super::strikes::Strikes;
use crate::breaker::Ticket;
use crate::flight::FlightCtx;
use crate::ledger::TableLedger;
use crate::observe::flight_watch::FlightWatch;
use crate::observe::Frame;
use crate::ports::{Dedup, Delivery, Inserter};
use crate::protocol::{PoolLink, TableCarryOver, TableReport};
use crate::settle::hand_back;
use ractor::{DerivedActorRef, RpcReplyPort};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

pub struct TableArgs<I> {
    pub ctx: Arc<FlightCtx<I>>,
    /// The target, as far as a table speaks to it.
    pub target: DerivedActorRef<TableReport>,
    /// Each replica's pool (by replica index; `None` while it restarts).
    pub pools: Vec<Option<PoolLink>>,
    /// The root, for the reports of flights that outlive this table and its target.
    pub orphans: DerivedActorRef<TableReport>,
    pub node_id: String,
    /// What the table's predecessor left (a new backoff, no wait, when `None`).
    pub carry_over: Option<TableCarryOver>,
}

/// The table's totals, for its snapshot.
#[derive(Debug, Default)]
pub(super) struct Totals {
    pub(super) inserted: u64,
    pub(super) parked: u64,
    pub(super) handed_back: u64,
    pub(super) dlq_failures: u64,
    pub(super) past_dedup_window: u64,
    pub(super) last_error: Option<String>,
}

/// The age trigger: armed for the oldest buffered row, generation-stamped so a timer
/// set for rows already flushed does nothing.
#[derive(Debug, Default)]
pub(super) struct AgeTimer {
    pub(super) generation: u64,
    pub(super) armed: Option<Instant>,
}

/// Which batch a permit is asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// The next batch of a lane of the buffer: of the lane's shard (a table placed by a
    /// shard key), or of any shard.
    Fresh { lane: usize, shard: Option<usize> },
    /// A recorded batch (by id), gathered and ready: its own shard.
    Recorded { id: String, shard: usize },
}

impl Next {
    pub(super) fn shard(&self) -> Option<usize> {
        match self {
            Next::Fresh { shard, .. } => *shard,
            Next::Recorded { shard, .. } => Some(*shard),
        }
    }
}

/// A flight asked of a replica's pool, its answer not come yet (one at a time).
#[derive(Debug)]
pub(super) struct Asking {
    pub(super) next: Next,
    pub(super) replica: usize,
    /// The table's own ticket for that replica.
    pub(super) ticket: Ticket,
    /// Replicas that turned this batch away already.
    pub(super) turned: Vec<usize>,
}

// === impl TableState ===

pub struct TableState<I, D> {
    pub(super) ctx: Arc<FlightCtx<I>>,
    /// Where it reports.
    pub(super) links: TableLinks,
    /// Its place in the live tree.
    pub(super) frame: Frame,
    /// The buffered messages: one lane, or one per shard (a table with a shard key).
    pub(super) lanes: Lanes<D>,
    /// The table's part of the batch ledger: which recorded batch each message belongs
    /// to, the batches gathered to fly again, the lines settled of messages that went
    /// back.
    pub(super) ledger: TableLedger<D>,
    /// The table's backoff on each replica, the pools, whose turn it is.
    pub(super) routes: TableRoutes,
    /// A flight asked of a replica's pool, its answer not come yet.
    pub(super) asking: Option<Asking>,
    pub(super) flights: Flights,
    pub(super) timers: Timers,
    pub(super) ending: Ending,
    /// What ClickHouse told it about the table.
    pub(super) learnt: Learnt,
    /// Messages suspected of crashing ClickHouse.
    pub(super) strikes: Strikes,
}

/// Where a table reports: its target, and the root for the reports of flights that
/// outlive this table and its target.
pub struct TableLinks {
    pub(super) target: DerivedActorRef<TableReport>,
    pub(super) orphans: DerivedActorRef<TableReport>,
}

/// The table's flights out.
#[derive(Default)]
pub struct Flights {
    pub(super) count: usize,
    /// What each flight out is doing (read for the snapshot, logged when one stays in
    /// a stage far too long).
    pub(super) out: Vec<Arc<FlightWatch>>,
}

/// What the table waits for and keeps alive.
pub struct Timers {
    pub(super) age: AgeTimer,
    /// When the buffered rows last got `progress()` (rows buffered past `ack_wait / 2`,
    /// e.g. with a long `batch_age` or while the flights are full).
    pub(super) last_progress: Option<Instant>,
    pub(super) last_activity: Instant,
    pub(super) idle_reported: bool,
}

/// How the table ends.
#[derive(Default)]
pub struct Ending {
    /// Shutdown: flush everything at once; answered once the buffer is empty.
    pub(super) draining: Option<Vec<RpcReplyPort<()>>>,
    /// Reaped: flush what is left, then stop.
    pub(super) retiring: bool,
}

/// What ClickHouse told the table about itself.
#[derive(Default)]
pub struct Learnt {
    pub(super) totals: Totals,
    /// Since when ClickHouse says this table (or its database) does not exist: its rows
    /// wait, table-scoped, for `missing_table_grace` (a deploy race is the usual cause),
    /// then are parked (a producer's typo must not fill the stream).
    pub(super) missing_since: Option<Instant>,
    /// Whether ClickHouse deduplicates this table's inserts, as the last flight found.
    pub(super) dedup: Option<Dedup>,
}

// === impl TableState ===

impl<I: Inserter, D: Delivery> TableState<I, D> {
    pub(super) fn new(args: TableArgs<I>) -> Self {
        let now = Instant::now();
        let ctx = args.ctx;
        let (carried, missing_since) = match args.carry_over {
            Some(TableCarryOver {
                backoffs,
                missing_since,
            }) => (Some(backoffs), missing_since),
            None => (None, None),
        };
        let routes = TableRoutes::new(&ctx, &args.node_id, args.pools, carried, now);
        let lanes = Lanes::new(ctx.settings.shard_key.clone(), ctx.servers.layout.shards());
        Self {
            frame: ctx.common.frame(args.node_id),
            ctx,
            links: TableLinks {
                target: args.target,
                orphans: args.orphans,
            },
            lanes,
            ledger: TableLedger::default(),
            routes,
            asking: None,
            flights: Flights::default(),
            timers: Timers {
                age: AgeTimer::default(),
                last_progress: None,
                last_activity: now,
                idle_reported: false,
            },
            ending: Ending::default(),
            learnt: Learnt {
                missing_since,
                ..Learnt::default()
            },
            strikes: Strikes::default(),
        }
    }

    pub(super) fn hand_back(&mut self, rows: Vec<D>, delay: Duration) {
        self.learnt.totals.handed_back += rows.len() as u64;
        hand_back(&self.ctx.common, Some(&self.ctx.metrics), rows, delay);
    }
}
