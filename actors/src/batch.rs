//! One flight's rows: the deliveries it holds, the JSONEachRow body built once from
//! them (every request of an isolation is a zero-copy slice of it), each row's verdict
//! as the flight learns it, and the settlement that turns verdicts into acks, parks and
//! naks once the flight knows everything it will learn.
//!
//! Verdicts are taken first and settled after, never mid-isolation: the rows of a batch
//! leave the queue together, when the flight has its last answer. That keeps every
//! decision in one place (what each row's fate is) apart from the I/O that carries it
//! out, and lets settlement change (a manifest recorded before the acks, rows that
//! share a message) without touching the isolation.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::time::Instant;

use crate::ports::{Delivery, InsertError, Parking, TableKey};

/// What the flight knows of one row.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum RowVerdict {
    /// Not settled: it goes back to the queue with the outage's delay.
    #[default]
    Pending,
    /// In ClickHouse: ack it.
    Inserted,
    /// Rejected alone by ClickHouse: park it with this reason.
    Rejected(Arc<InsertError>),
}

/// The rows of one flight.
pub struct Batch<D> {
    deliveries: Vec<D>,
    body: Bytes,
    /// Row `i` is `body[offsets[i]..offsets[i + 1]]` (with its `\n`).
    offsets: Vec<usize>,
    /// When the oldest row arrived: `progress()` is due from `ack_wait / 2` after it.
    held_since: Instant,
}

/// How a batch's rows are settled.
pub struct SettlePlan<'a> {
    pub table: &'a TableKey,
    /// Park rejected rows; when off they are naked with `cap_delay` and come back.
    pub dlq: bool,
    /// The delay for rows left unacked on purpose (DLQ off, DLQ publish failed).
    pub cap_delay: Duration,
    /// The delay for rows still pending (the outage's window).
    pub pending_delay: Duration,
}

/// What a settlement did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    pub inserted: usize,
    pub parked: usize,
    /// Naked: pending rows, and rejected rows left unacked.
    pub handed_back: usize,
    /// Rejected rows whose DLQ publish failed (counted in `handed_back` too).
    pub dlq_failures: usize,
    /// Of `handed_back`, the rows that were pending (an outage sent them back).
    pub pending: usize,
}

// === impl Batch ===

impl<D: Delivery> Batch<D> {
    pub fn new(deliveries: Vec<D>, held_since: Instant) -> Self {
        let len: usize = deliveries.iter().map(|d| d.payload().len() + 1).sum();
        let mut body = BytesMut::with_capacity(len);
        let mut offsets = Vec::with_capacity(deliveries.len() + 1);
        for d in &deliveries {
            offsets.push(body.len());
            body.extend_from_slice(d.payload());
            body.extend_from_slice(b"\n");
        }
        offsets.push(body.len());
        Self {
            deliveries,
            body: body.freeze(),
            offsets,
            held_since,
        }
    }

    pub fn rows(&self) -> usize {
        self.offsets.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.rows() == 0
    }

    /// Rows `lo..hi` as one request body.
    pub fn slice(&self, lo: usize, hi: usize) -> Bytes {
        self.body.slice(self.offsets[lo]..self.offsets[hi])
    }

    pub fn deliveries(&self) -> &[D] {
        &self.deliveries
    }

    pub fn held_since(&self) -> Instant {
        self.held_since
    }

    /// Carry out the verdicts (one per row): ack the inserted rows, park the rejected
    /// ones (or nak them with the cap delay), nak the pending ones with the outage's
    /// delay. Every delivery is settled when this returns.
    pub async fn settle(self, verdicts: Vec<RowVerdict>, plan: &SettlePlan<'_>) -> Settled {
        let mut out = Settled::default();
        for (d, verdict) in self.deliveries.into_iter().zip(verdicts) {
            match verdict {
                RowVerdict::Inserted => {
                    out.inserted += 1;
                    if let Err(e) = d.ack().await {
                        tracing::debug!(tenant = %plan.table.tenant, table = %plan.table.table, error = %e,
                            "ack after insert failed; the row may be delivered again");
                    }
                }
                RowVerdict::Rejected(err) => park(d, &err, plan, &mut out).await,
                RowVerdict::Pending => {
                    out.handed_back += 1;
                    out.pending += 1;
                    let _ = d.nak(plan.pending_delay).await;
                }
            }
        }
        out
    }

    /// Hand every row back at once with `delay` (the flight could not run).
    pub async fn hand_back(self, delay: Duration) -> usize {
        let n = self.deliveries.len();
        for d in self.deliveries {
            let _ = d.nak(delay).await;
        }
        n
    }
}

async fn park<D: Delivery>(d: D, err: &InsertError, plan: &SettlePlan<'_>, out: &mut Settled) {
    if !plan.dlq {
        out.handed_back += 1;
        let _ = d.nak(plan.cap_delay).await;
        return;
    }
    match d.park(&Parking::from_error(plan.table, err)).await {
        Ok(()) => out.parked += 1,
        Err((d, e)) => {
            tracing::warn!(
                tenant = %plan.table.tenant, table = %plan.table.table, error = %e,
                "DLQ publish failed: the rejected row stays unacked"
            );
            out.dlq_failures += 1;
            out.handed_back += 1;
            let _ = d.nak(plan.cap_delay).await;
        }
    }
}
