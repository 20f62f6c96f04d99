//! A table's view of its target's servers: its own backoff on each replica (owned by the
//! table: read-only there, too many parts, a missing grant, a missing table), where it
//! reaches each replica's pool, whose turn it is, and where its last batches went.
//!
//! The replica a batch goes to is picked here from the pools' board and these
//! backoffs ([`crate::placement::pick`]); the replica's pool then admits it or not.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::breaker::scoped::{BreakerScope, BreakerSnapshot, ScopedBreaker};
use crate::breaker::Gate;
use crate::flight::FlightCtx;
use crate::observe::{BatchRoute, ReplicaBackoff};
use crate::placement::{pick, Pick};
use crate::protocol::PoolLink;

/// Where a table's last batches went, kept for its snapshot.
const LAST_BATCHES: usize = 8;

pub struct TableRoutes {
    /// By replica index.
    backoffs: Vec<ScopedBreaker>,
    /// By replica index; `None` while that pool restarts.
    pools: Vec<Option<PoolLink>>,
    /// Counts batches: the rotation among shards and replicas.
    turn: usize,
    last: VecDeque<BatchRoute>,
}

impl TableRoutes {
    /// The backoffs the table's predecessor left (`carried`), or new ones.
    pub fn new<I>(
        ctx: &FlightCtx<I>,
        node_id: &str,
        pools: Vec<Option<PoolLink>>,
        carried: Option<Vec<ScopedBreaker>>,
        now: Instant,
    ) -> Self {
        let replicas = &ctx.servers.replicas;
        // One server: its backoff is the table's, gauge and all. Several: the gauge
        // shows their summary (`show_summary`), not whichever moved last.
        let gauge = if replicas.len() == 1 {
            ctx.metrics.backoff.clone()
        } else {
            metrics::Gauge::noop()
        };
        let backoffs = match carried {
            Some(mut backoffs) if backoffs.len() == replicas.len() => {
                for b in &mut backoffs {
                    b.take_over(now);
                }
                backoffs
            }
            _ => replicas
                .iter()
                .map(|r| {
                    ScopedBreaker::new(
                        BreakerScope::Table {
                            target: ctx.servers.target.clone(),
                            replica: r.name.clone(),
                            key: ctx.key.clone(),
                        },
                        ctx.common.settings.table_backoff,
                        ctx.common.settings.log_every,
                        ctx.common.jitter(&if replicas.len() == 1 {
                            node_id.to_owned()
                        } else {
                            format!("{node_id}@{}", r.name)
                        }),
                        gauge.clone(),
                    )
                })
                .collect(),
        };
        Self {
            backoffs,
            pools,
            turn: 0,
            last: VecDeque::new(),
        }
    }

    /// Each replica's gate for this table: its pool's (the board), its own backoff there,
    /// and whether its pool runs at all.
    pub fn gates<I>(&self, ctx: &FlightCtx<I>, now: Instant) -> Vec<Gate> {
        let restarting = Gate::Wait(ctx.common.settings.handback_while_restarting);
        self.backoffs
            .iter()
            .enumerate()
            .map(|(r, backoff)| {
                let pool = if self.pools.get(r).is_some_and(Option::is_some) {
                    ctx.servers.board.gate(r, now)
                } else {
                    restarting
                };
                pool.and(backoff.gate(now))
            })
            .collect()
    }

    /// The replica for the next batch: of `shard` (a recorded batch), or of any shard
    /// (a fresh one); `turned`: replicas that turned it away already.
    pub fn pick<I>(
        &self,
        ctx: &FlightCtx<I>,
        shard: Option<usize>,
        turned: &[usize],
        now: Instant,
    ) -> Pick {
        pick(
            &ctx.servers.layout,
            shard,
            &self.gates(ctx, now),
            self.turn,
            turned,
        )
    }

    /// `Some(delay)`: hand an arriving row back rather than buffer it (the table's own
    /// backoff is open on every replica).
    pub fn arrival_delay(&self, now: Instant) -> Option<Duration> {
        self.backoffs
            .iter()
            .map(|b| b.arrival_delay(now))
            .try_fold(Duration::MAX, |min, d| d.map(|d| min.min(d)))
    }

    pub fn backoff(&mut self, replica: usize) -> &mut ScopedBreaker {
        let last = self.backoffs.len().saturating_sub(1);
        &mut self.backoffs[replica.min(last)]
    }

    pub fn backoffs(&self) -> &[ScopedBreaker] {
        &self.backoffs
    }

    /// Bumped whenever one of the backoffs moves.
    pub fn generation(&self) -> u64 {
        self.backoffs.iter().map(ScopedBreaker::generation).sum()
    }

    /// No window of the table's runs (closed, or ended: a replica passed over for its
    /// twin may never be probed again by this table, and must not keep it from being
    /// reaped).
    pub fn no_window_running(&self, now: Instant) -> bool {
        self.backoffs
            .iter()
            .all(|b| !matches!(b.gate(now), Gate::Wait(_)))
    }

    pub fn pool(&self, replica: usize) -> Option<&PoolLink> {
        self.pools.get(replica).and_then(Option::as_ref)
    }

    pub fn set_pool(&mut self, replica: usize, link: Option<PoolLink>) {
        if let Some(slot) = self.pools.get_mut(replica) {
            *slot = link;
        }
    }

    /// A batch flew to `replica` of `shard`: the next one starts the rotation further.
    pub fn flew(&mut self, shard: usize, replica: String, messages: usize) {
        self.turn = self.turn.wrapping_add(1);
        if self.last.len() >= LAST_BATCHES {
            self.last.pop_front();
        }
        self.last.push_back(BatchRoute {
            shard: shard + 1,
            replica,
            messages,
            at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        });
    }

    pub fn last_batches(&self) -> Vec<BatchRoute> {
        self.last.iter().cloned().collect()
    }

    /// The table's backoff as one: a closed replica's when there is one (the table
    /// sends somewhere), else the one that opens first.
    pub fn summary(&self, now: Instant) -> BreakerSnapshot {
        let shown = self.backoffs.iter().find(|b| b.is_closed()).or_else(|| {
            self.backoffs.iter().min_by_key(|b| match b.gate(now) {
                Gate::Wait(d) => d,
                _ => Duration::ZERO,
            })
        });
        shown.map_or_else(BreakerSnapshot::closed, |b| b.snapshot(now))
    }

    /// Sets the table's backoff gauge to the summary (a target of several servers).
    pub fn show_summary(&self, gauge: &metrics::Gauge, now: Instant) {
        if self.backoffs.len() > 1 {
            gauge.set(self.summary(now).state.gauge());
        }
    }

    /// Per replica, for a target of more than one server.
    pub fn per_replica<I>(&self, ctx: &FlightCtx<I>, now: Instant) -> Vec<ReplicaBackoff> {
        if self.backoffs.len() < 2 {
            return Vec::new();
        }
        self.backoffs
            .iter()
            .zip(&ctx.servers.replicas)
            .map(|(b, r)| ReplicaBackoff {
                replica: r.name.to_string(),
                backoff: b.snapshot(now),
            })
            .collect()
    }
}
