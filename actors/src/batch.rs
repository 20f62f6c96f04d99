//! One flight's rows: the messages it holds (each one row or many, NDJSON), the
//! JSONEachRow body built once from them (every request of an isolation is a zero-copy
//! slice of it), and the settlement that turns the rows' verdicts into acks, parks and
//! naks — per message: a message is acked only when every row in it is settled.
//!
//! Verdicts are taken first and settled after, never mid-isolation: the rows of a batch
//! leave the queue together, when the flight has its last answer. That keeps every
//! decision in one place (what each row's fate is) apart from the I/O that carries it
//! out, and lets a manifest be recorded between the two.
//!
//! A batch formed again from a manifest may include messages this flight does not hold
//! (another instance has them, or they wait out a delay): their rows are sent, read from
//! the stream, and settled by whoever holds them.

pub mod keepalive;

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::time::Instant;

use futures::StreamExt as _;

use crate::ports::{ClickHouseError, Delivery, Parking, Position, TableKey};
use crate::rows::line_ranges;

/// Acks of one batch sent at once at most (see [`Parked::ack`]).
const ACKS_AT_ONCE: usize = 64;

/// What the flight knows of one row.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum RowVerdict {
    /// Not settled: its message goes back to the queue.
    #[default]
    Pending,
    /// In ClickHouse.
    Inserted,
    /// Rejected alone by ClickHouse: parked with this reason.
    Rejected(Arc<ClickHouseError>),
    /// Rejected, and on the DLQ already (its batch's record says so): acked, not parked
    /// again.
    AlreadyParked,
}

/// One message of a batch.
struct Part<D> {
    /// `None`: a message of the batch this flight does not hold.
    delivery: Option<D>,
    stream_sequence: u64,
    /// Its rows in the body, as indexes into the batch (and into its `lines`).
    rows: Range<usize>,
    /// Lines settled by an earlier flight (the message came back with them done):
    /// not sent again, counted as settled.
    done: Vec<u32>,
}

/// A message as a batch is built from it: its sequence, its delivery when held, its
/// payload when read from the stream instead, the lines an earlier flight settled.
type Source<D> = (u64, Option<D>, Option<Bytes>, Vec<u32>);

/// The rows of one flight.
pub struct Batch<D> {
    parts: Vec<Part<D>>,
    body: Bytes,
    /// Row `i` is `body[offsets[i]..offsets[i + 1]]` (with its `\n`).
    offsets: Vec<usize>,
    /// Row `i` is line `lines[i]` of its message. One vector for the batch, not one
    /// per message: most messages are one row, and an allocation each showed.
    lines: Vec<u32>,
    /// When the oldest message arrived: `progress()` is due from `ack_wait / 2` after it.
    held_since: Instant,
}

/// How a batch's rows are settled.
pub struct SettlePlan<'a> {
    pub table: &'a TableKey,
    /// Park rejected rows; when off their messages are naked with `cap_delay`.
    pub dlq: bool,
    /// The delay for messages left unacked on purpose (DLQ off, DLQ publish failed).
    pub cap_delay: Duration,
    /// The delay for messages with a row still pending (the outage's window).
    pub pending_delay: Duration,
    /// Wait for JetStream to confirm the batch's acks (exactly-once: the manifest may be
    /// forgotten only then).
    pub confirm: bool,
}

/// What a settlement did, in rows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    pub inserted: usize,
    pub parked: usize,
    /// Rows whose message was naked: pending rows, rows rejected but left unacked, and
    /// settled rows sharing a message with those.
    pub handed_back: usize,
    /// Rejected rows whose DLQ publish failed (their message naked with the cap delay).
    pub dlq_failures: usize,
    /// Of `handed_back`, the rows that were pending (an outage sent them back).
    pub pending: usize,
    /// Messages naked with some of their rows already in ClickHouse or on the DLQ: the
    /// lines that need nothing more when the message comes back.
    pub partly: Vec<(u64, Vec<u32>)>,
    /// Every ack (parks' included) was sent, and (when asked) the last one confirmed:
    /// JetStream handles a connection's acks in order, so the confirmation covers them
    /// all. Meaningful only when nothing went back (`pending` and `handed_back` zero).
    pub confirmed: bool,
}

// === impl Batch ===

impl<D: Delivery> Batch<D> {
    /// A batch of the messages a flight holds, in the order given.
    pub fn new(deliveries: Vec<D>, held_since: Instant) -> Self {
        Self::resuming(deliveries, Vec::new(), held_since)
    }

    /// As [`Batch::new`], some messages coming back with lines an earlier flight
    /// settled (`done`, by stream sequence): those lines are not sent again.
    pub fn resuming(deliveries: Vec<D>, done: Vec<(u64, Vec<u32>)>, held_since: Instant) -> Self {
        let mut done: HashMap<u64, Vec<u32>> = done.into_iter().collect();
        let parts = deliveries
            .into_iter()
            .map(|d| {
                let seq = d.position().stream_sequence;
                // Nearly always none came back: no sequence is hashed then.
                let done = if done.is_empty() {
                    Vec::new()
                } else {
                    done.remove(&seq).unwrap_or_default()
                };
                (seq, Some(d), None, done)
            })
            .collect();
        Self::build(parts, held_since)
    }

    /// A batch formed again from a manifest's messages (ascending sequences): the ones
    /// held, and the payloads read for the others. A message held twice (a copy
    /// delivered again meanwhile) goes in once: the other copies, and anything held
    /// that is not of the manifest, come back beside the batch for the caller to hand
    /// back. A sequence neither held nor read is left out: the caller checks
    /// [`Batch::sequences`] against the manifest before sending.
    pub fn reformed(
        sequences: &[u64],
        held: Vec<D>,
        fetched: Vec<(u64, Bytes)>,
        held_since: Instant,
    ) -> (Self, Vec<D>) {
        let mut copies = Vec::new();
        let mut by_seq: HashMap<u64, D> = HashMap::with_capacity(held.len());
        for d in held {
            match by_seq.entry(d.position().stream_sequence) {
                Entry::Vacant(slot) => {
                    slot.insert(d);
                }
                Entry::Occupied(_) => copies.push(d),
            }
        }
        let mut fetched: HashMap<u64, Bytes> = fetched.into_iter().collect();
        let mut parts = Vec::with_capacity(sequences.len());
        for &seq in sequences {
            if let Some(d) = by_seq.remove(&seq) {
                parts.push((seq, Some(d), None, Vec::new()));
            } else if let Some(p) = fetched.remove(&seq) {
                parts.push((seq, None, Some(p), Vec::new()));
            }
        }
        copies.extend(by_seq.into_values());
        (Self::build(parts, held_since), copies)
    }

    fn build(parts: Vec<Source<D>>, held_since: Instant) -> Self {
        let len: usize = parts
            .iter()
            .map(|(_, d, p, _)| {
                d.as_ref().map(|d| d.payload().len()).unwrap_or(0)
                    + p.as_ref().map(Bytes::len).unwrap_or(0)
                    + 1
            })
            .sum();
        let mut body = BytesMut::with_capacity(len);
        let mut offsets = Vec::with_capacity(parts.len() + 1);
        let mut built = Vec::with_capacity(parts.len());
        let mut row_lines = Vec::with_capacity(parts.len());
        for (stream_sequence, delivery, fetched, done) in parts {
            let payload = match (&delivery, fetched) {
                (Some(d), _) => d.payload().clone(),
                (None, Some(p)) => p,
                (None, None) => continue,
            };
            let first = offsets.len();
            for (i, range) in line_ranges(&payload).enumerate() {
                let i = i as u32;
                if done.contains(&i) {
                    continue;
                }
                offsets.push(body.len());
                body.extend_from_slice(&payload[range]);
                body.extend_from_slice(b"\n");
                row_lines.push(i);
            }
            built.push(Part {
                delivery,
                stream_sequence,
                rows: first..offsets.len(),
                done,
            });
        }
        offsets.push(body.len());
        Self {
            parts: built,
            body: body.freeze(),
            offsets,
            lines: row_lines,
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

    /// The messages this flight holds, taken out (the batch is not sent).
    pub fn into_deliveries(self) -> Vec<D> {
        self.parts.into_iter().filter_map(|p| p.delivery).collect()
    }

    /// The messages this flight holds (for `progress()`).
    pub fn deliveries(&self) -> impl Iterator<Item = &D> {
        self.parts.iter().filter_map(|p| p.delivery.as_ref())
    }

    /// Every message of the batch by stream sequence, held or not, in body order.
    pub fn sequences(&self) -> Vec<u64> {
        self.parts.iter().map(|p| p.stream_sequence).collect()
    }

    /// Every row of the batch as (stream sequence, line), in body order.
    pub fn row_ids(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.parts.iter().flat_map(|p| {
            self.lines[p.rows.clone()]
                .iter()
                .map(move |line| (p.stream_sequence, *line))
        })
    }

    pub fn held_since(&self) -> Instant {
        self.held_since
    }

    /// Carry out the verdicts (one per row), message by message: a message whose rows
    /// are all inserted or rejected is acked (its rejected rows parked first: a one-row
    /// message is parked whole); a message with a row pending is naked with the
    /// outage's delay; one whose rejected row cannot be parked is naked with the cap
    /// delay. Every held message is settled when this returns.
    pub async fn settle(self, verdicts: Vec<RowVerdict>, plan: &SettlePlan<'_>) -> Settled {
        self.park(verdicts, plan).await.ack(plan).await
    }

    /// The first half of [`Batch::settle`]: every rejected row parked, every message
    /// that goes back naked; the messages to ack are held in the answer, so that what
    /// was parked can be recorded before any of them is acked.
    pub async fn park(self, verdicts: Vec<RowVerdict>, plan: &SettlePlan<'_>) -> Parked<D> {
        let mut out = Settled {
            confirmed: true,
            ..Default::default()
        };
        let mut acks = Vec::with_capacity(self.parts.len());
        let mut parked_rows = Vec::new();
        for part in self.parts {
            let Some(d) = part.delivery else { continue };
            let message = Message {
                verdicts: &verdicts[part.rows.clone()],
                offsets: &self.offsets[part.rows.start..=part.rows.end],
                lines: &self.lines[part.rows.clone()],
                done: &part.done,
                body: &self.body,
            };
            // Nearly every message: all its rows in. Settled here, without building
            // `settle_message`'s future (it holds the park and nak paths, kilobytes that
            // were copied for every message; see docs/benchmark.md).
            if message.verdicts.iter().all(|v| *v == RowVerdict::Inserted) {
                out.inserted += message.verdicts.len();
                acks.push(d);
                continue;
            }
            let seq = part.stream_sequence;
            if let Some(d) = settle_message(d, &message, plan, &mut out).await {
                parked_rows.extend(
                    message
                        .verdicts
                        .iter()
                        .zip(message.lines)
                        .filter(|(v, _)| matches!(v, RowVerdict::Rejected(_)))
                        .map(|(_, line)| (seq, *line)),
                );
                acks.push(d);
            }
        }
        Parked {
            acks,
            out,
            parked_rows,
        }
    }

    /// Hand every held message back at once with `delay` (the flight could not run).
    pub async fn hand_back(self, delay: Duration) -> usize {
        let mut n = 0;
        for part in self.parts {
            if let Some(d) = part.delivery {
                n += part.rows.len();
                let _ = d.nak(delay).await;
            }
        }
        n
    }
}

/// A batch whose rejected rows are parked and whose messages that go back are naked:
/// the messages to ack, held until [`Parked::ack`].
pub struct Parked<D> {
    acks: Vec<D>,
    out: Settled,
    /// Rows parked (stream sequence, line) of the messages to ack.
    parked_rows: Vec<(u64, u32)>,
}

impl<D: Delivery> Parked<D> {
    /// The rows parked, by (stream sequence, line), of messages about to be acked.
    pub fn parked_rows(&self) -> &[(u64, u32)] {
        &self.parked_rows
    }

    /// Ack every message left (the last one confirmed when the plan asks).
    pub async fn ack(self, plan: &SettlePlan<'_>) -> Settled {
        let Parked {
            mut acks, mut out, ..
        } = self;
        // Confirmed: the last of each partition (its consumer's acks are confirmed in
        // order; another partition's consumer may be on another server).
        let lasts = if plan.confirm {
            last_of_each_partition(&mut acks)
        } else {
            Vec::new()
        };
        // An ack that waits for a write of its own first (the delivery marks a keyed
        // ingest chunk landed) goes a few at a time: one after the other they would
        // cost a round trip per message. The others (nearly all) one after the other:
        // each is a send into the connection's queue, and a set of concurrent futures
        // cost a fifth of Sluice's instructions per row (docs/benchmark.md). The
        // confirmed one goes after all of them.
        // Nearly always none writes first: then the acks are not moved into two lists.
        let (writing, plain): (Vec<D>, Vec<D>) = if acks.iter().any(D::ack_writes_first) {
            acks.into_iter().partition(Delivery::ack_writes_first)
        } else {
            (Vec::new(), acks)
        };
        // Each ack says whether it went: one that failed leaves the batch unconfirmed.
        let ack_one = |d: D| async move {
            let acked = if plan.confirm {
                d.ack_recorded().await
            } else {
                d.ack().await
            };
            if let Err(e) = &acked {
                tracing::debug!(tenant = %plan.table.tenant, table = %plan.table.table, error = %e,
                    "ack after insert failed; the message may be delivered again");
            }
            acked.is_ok()
        };
        let mut all_went = true;
        for d in plain {
            all_went &= ack_one(d).await;
        }
        if !writing.is_empty() {
            all_went &= futures::stream::iter(writing)
                .map(ack_one)
                .buffer_unordered(ACKS_AT_ONCE)
                .fold(true, |all, went| async move { all && went })
                .await;
        }
        if !all_went {
            out.confirmed = false;
        }
        for d in lasts {
            if let Err(e) = d.ack_confirmed().await {
                out.confirmed = false;
                tracing::debug!(tenant = %plan.table.tenant, table = %plan.table.table, error = %e,
                    "the batch's acks were not confirmed; its manifest is kept until they are");
            }
        }
        out
    }
}

/// Takes out of `acks` the last delivery of each partition (the one confirmed), in the
/// order of their partitions; one partition (nearly always): the last delivery.
fn last_of_each_partition<D: Delivery>(acks: &mut Vec<D>) -> Vec<D> {
    let partition = |d: &D| Position::partition_of(d.position().stream_sequence);
    let first = acks.first().map(partition);
    if acks.iter().all(|d| Some(partition(d)) == first) {
        return acks.pop().into_iter().collect();
    }
    let mut last: std::collections::BTreeMap<usize, usize> = Default::default();
    for (i, d) in acks.iter().enumerate() {
        last.insert(partition(d), i);
    }
    let mut at: Vec<usize> = last.into_values().collect();
    at.sort_unstable();
    // Removed from the back, so the indices before stay put.
    let mut taken: Vec<D> = at.iter().rev().map(|&i| acks.remove(i)).collect();
    taken.reverse();
    taken
}

/// One held message's share of a batch, for its settlement.
struct Message<'a> {
    /// The verdicts of its rows in the body.
    verdicts: &'a [RowVerdict],
    /// Where those rows are in the body (`verdicts.len() + 1` offsets).
    offsets: &'a [usize],
    /// The message's line of each of those rows.
    lines: &'a [u32],
    /// Lines settled by an earlier flight.
    done: &'a [u32],
    body: &'a Bytes,
}

impl Message<'_> {
    fn rows(&self) -> usize {
        self.verdicts.len() + self.done.len()
    }

    fn row(&self, i: usize) -> Bytes {
        self.body.slice(self.offsets[i]..self.offsets[i + 1] - 1)
    }

    /// The lines needing nothing more should the message come back: the earlier ones
    /// and, of this flight's, the inserted ones and the rejected ones parked before
    /// `parked_before` (a row index).
    fn settled_lines(&self, parked_before: usize) -> Vec<u32> {
        let mut lines = self.done.to_vec();
        for (i, v) in self.verdicts.iter().enumerate() {
            let parked = i < parked_before && matches!(v, RowVerdict::Rejected(_));
            if matches!(v, RowVerdict::Inserted | RowVerdict::AlreadyParked) || parked {
                lines.push(self.lines[i]);
            }
        }
        lines.sort_unstable();
        lines
    }
}

/// Settle one message; returns it when it is to be acked (its rows all settled).
async fn settle_message<D: Delivery>(
    d: D,
    m: &Message<'_>,
    plan: &SettlePlan<'_>,
    out: &mut Settled,
) -> Option<D> {
    let rows = m.rows();
    let pending = m
        .verdicts
        .iter()
        .filter(|v| **v == RowVerdict::Pending)
        .count();
    if pending > 0 {
        out.handed_back += rows;
        out.pending += pending;
        nak_partly(d, m, 0, plan.pending_delay, out).await;
        return None;
    }
    let rejected = m
        .verdicts
        .iter()
        .filter(|v| matches!(v, RowVerdict::Rejected(_)))
        .count();
    let inserted = m
        .verdicts
        .iter()
        .filter(|v| **v == RowVerdict::Inserted)
        .count();
    if rejected == 0 {
        out.inserted += inserted;
        return Some(d);
    }
    if !plan.dlq {
        out.handed_back += rows;
        nak_partly(d, m, 0, plan.cap_delay, out).await;
        return None;
    }
    if rows == 1 {
        // A one-row message is parked whole: the DLQ message is the message itself.
        let RowVerdict::Rejected(err) = &m.verdicts[0] else {
            return Some(d);
        };
        return match d.park_message(&Parking::from_error(plan.table, err)).await {
            Ok(()) => {
                out.parked += 1;
                Some(d)
            }
            Err(e) => {
                park_failed(plan, &e.0, out);
                out.handed_back += 1;
                let _ = d.nak(plan.cap_delay).await;
                None
            }
        };
    }
    let mut parked = 0;
    for (i, verdict) in m.verdicts.iter().enumerate() {
        let RowVerdict::Rejected(err) = verdict else {
            continue;
        };
        let parking = Parking::from_error(plan.table, err);
        if let Err(e) = d.park_row(m.lines[i], m.row(i), &parking).await {
            park_failed(plan, &e.0, out);
            out.parked += parked;
            out.handed_back += rows - parked;
            nak_partly(d, m, i, plan.cap_delay, out).await;
            return None;
        }
        parked += 1;
    }
    out.parked += parked;
    out.inserted += inserted;
    Some(d)
}

/// Nak a message; remember the lines of it that need nothing more, so that they are not
/// inserted (or parked) again when it comes back.
async fn nak_partly<D: Delivery>(
    d: D,
    m: &Message<'_>,
    parked_before: usize,
    delay: Duration,
    out: &mut Settled,
) {
    let lines = m.settled_lines(parked_before);
    if !lines.is_empty() {
        out.partly.push((d.position().stream_sequence, lines));
    }
    let _ = d.nak(delay).await;
}

fn park_failed(plan: &SettlePlan<'_>, error: &str, out: &mut Settled) {
    tracing::warn!(
        tenant = %plan.table.tenant, table = %plan.table.table, error = %error,
        "DLQ publish failed: the rejected row stays unacked"
    );
    out.dlq_failures += 1;
}
