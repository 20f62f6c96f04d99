//! Acked messages a crashed nats-server left in the work queue, and how they go.
//!
//! nats-server 2.9 killed with -9 can come back with messages still in the INGEST work
//! queue that the consumer had already acked: the removals had not reached its disk.
//! They are never delivered again, but they hold on to the stream's byte budget, so a
//! full queue would refuse producers for rows long inserted. Sluice removes them when
//! its consumer connects and with every lag poll.
//!
//! In a NATS cluster the stream can keep acked messages above the consumer's floor
//! too (see `super::acked_here`): those this process acked itself, at least
//! [`ACKED_GRACE`] ago, go the same way.
//!
//! They are deleted one by one, never purged: on nats-server 2.9.10 a stream purge
//! (even one that removes nothing) empties every consumer's list of deliveries awaiting
//! an ack. A delivery dropped from that list is never redelivered: one a Sluice then
//! hands back (a nak with a delay, ClickHouse down) stays in the stream undelivered for
//! good, and its rows never reach ClickHouse.

use async_nats::jetstream::consumer;
use async_nats::jetstream::stream::{
    DeleteMessageError, DeleteMessageErrorKind, RawMessageErrorKind, Stream,
};
use async_nats::jetstream::ErrorCode;
use tokio::time::{Duration, Instant};

use super::acked_here::AckedHere;

/// The most messages one pass removes (two requests each); the rest wait for the next
/// lag poll, so a crash that left many behind cannot hold the poll up for long.
const MAX_REMOVED_PER_PASS: u64 = 10_000;

/// How long after its ack a message acked here may still be in the stream: the work
/// queue's own removal reaches every replica a moment after the ack.
pub const ACKED_GRACE: Duration = Duration::from_secs(10);

/// The most spans of acked-here sequences one pass looks up (a request each, and one
/// per message found); the rest wait for the next pass.
const MAX_SPANS_PER_PASS: usize = 500;

/// The last stream sequence the consumer is done with: everything up to it is acked.
///
/// Its ack floor, or, when no delivery awaits an ack, everything delivered: a 2.9 server
/// that restored a stale consumer state from disk can empty its pending list without
/// moving the floor past the acked messages it kept, and nothing at or below the
/// delivered sequence is delivered again once nothing is pending. The consumer is the
/// stream's only one and unfiltered.
///
/// A replicated consumer (a NATS cluster) counts on its floor alone: right after its
/// leader moved, the new leader can show nothing pending while deliveries of the old
/// one still await their acks, and deleting those would take rows Sluice holds.
fn done_through(info: &consumer::Info) -> u64 {
    let floor = info.ack_floor.stream_sequence;
    let replicated = info
        .cluster
        .as_ref()
        .is_some_and(|c| !c.replicas.is_empty());
    if info.num_ack_pending == 0 && !replicated {
        floor.max(info.delivered.stream_sequence)
    } else {
        floor
    }
}

fn is_no_message_found(e: &DeleteMessageError) -> bool {
    matches!(e.kind(), DeleteMessageErrorKind::JetStream(js)
        if js.error_code() == ErrorCode::NO_MESSAGE_FOUND)
}

/// Deletes the messages the consumer (`consumer`, its info just read) is done with
/// that `stream` still keeps, and those `acked` says this process acked at least
/// [`ACKED_GRACE`] ago, one by one, and returns how many went. Best effort: a failure
/// is logged and the next pass tries again.
pub async fn remove_stranded(
    stream: &Stream,
    consumer: &consumer::Info,
    acked: Option<(&AckedHere, usize)>,
) -> u64 {
    let done = done_through(consumer);
    let first = stream.cached_info().state.first_sequence;
    let mut removed = 0;
    if done > 0 && first > 0 && first <= done {
        let pass = remove_range(stream, first, done, MAX_REMOVED_PER_PASS).await;
        removed += pass.removed;
        warn_removed(stream, &pass, consumer, "the consumer had already acked but the stream still kept (a nats-server crash leaves them behind)");
    }
    if let Some((acked, partition)) = acked {
        // The stream keeps no more than the consumer accounts for: nothing acked is
        // left, and the spans are let go without a look (a look is a request each).
        let accounted = consumer
            .num_pending
            .saturating_add(consumer.num_ack_pending as u64);
        let kept = stream.cached_info().state.messages.saturating_sub(removed);
        let floor = done.max(first.saturating_sub(1));
        if kept > accounted {
            removed += remove_acked_here(stream, (acked, partition), consumer, floor).await;
        } else if let Some(cutoff) = Instant::now().checked_sub(ACKED_GRACE) {
            acked.take_acked_before_in(partition, cutoff);
        }
    }
    removed
}

/// The messages this process acked at least [`ACKED_GRACE`] ago that the stream keeps
/// above `done` (everything at or below it is the floor's pass).
async fn remove_acked_here(
    stream: &Stream,
    (acked, partition): (&AckedHere, usize),
    consumer: &consumer::Info,
    done: u64,
) -> u64 {
    let cutoff = Instant::now().checked_sub(ACKED_GRACE);
    let Some(cutoff) = cutoff else {
        return 0;
    };
    let spans: Vec<(u64, u64)> = acked
        .take_acked_before_in(partition, cutoff)
        .into_iter()
        .filter(|&(_, last)| last > done)
        .map(|(first, last)| (first.max(done + 1), last))
        .collect();
    let (now, later) = spans.split_at(spans.len().min(MAX_SPANS_PER_PASS));
    acked.put_back_in(partition, later, cutoff);
    let mut all = Removal::default();
    for (i, &(first, last)) in now.iter().enumerate() {
        let pass = remove_range(stream, first, last, MAX_REMOVED_PER_PASS - all.removed).await;
        all.add(&pass);
        if pass.failed {
            acked.put_back_in(partition, &now[i..], cutoff);
            break;
        }
        if all.removed >= MAX_REMOVED_PER_PASS {
            acked.put_back_in(partition, &now[i + 1..], cutoff);
            break;
        }
    }
    warn_removed(stream, &all, consumer, "this instance had acked that the stream still kept above the consumer's ack floor (a replicated stream after a leader change)");
    all.removed
}

/// Rows removed from `stream` that `what` (logged when there were any), with the
/// sequences and the consumer's counts they were judged by: each a row JetStream would
/// otherwise deliver again, and, were the judgement wrong, rows that never reached
/// ClickHouse (the log is how that would be traced).
fn warn_removed(stream: &Stream, removal: &Removal, consumer: &consumer::Info, what: &str) {
    if removal.removed > 0 {
        tracing::warn!(stream = %stream.cached_info().config.name, removed = removal.removed,
            sequences = %format!("{}..={}", removal.lowest, removal.highest),
            ack_floor = consumer.ack_floor.stream_sequence,
            delivered = consumer.delivered.stream_sequence,
            ack_pending = consumer.num_ack_pending,
            "removed rows {what}");
    }
}

/// What one range's removal did.
#[derive(Default)]
struct Removal {
    removed: u64,
    /// The lowest and highest sequence removed (0 when none was).
    lowest: u64,
    highest: u64,
    /// The stream could not be read or a delete failed (logged): the pass ends.
    failed: bool,
}

impl Removal {
    fn removed_one(&mut self, seq: u64) {
        self.removed += 1;
        self.widen(seq, seq);
    }

    fn add(&mut self, other: &Removal) {
        if other.removed > 0 {
            self.removed += other.removed;
            self.widen(other.lowest, other.highest);
        }
        self.failed |= other.failed;
    }

    /// The span removed now reaches `lowest..=highest` too.
    fn widen(&mut self, lowest: u64, highest: u64) {
        self.lowest = if self.lowest == 0 {
            lowest
        } else {
            self.lowest.min(lowest)
        };
        self.highest = self.highest.max(highest);
    }
}

/// Deletes what `stream` keeps from `first` through `last`, at most `most`.
async fn remove_range(stream: &Stream, first: u64, last: u64, most: u64) -> Removal {
    let mut removal = Removal::default();
    let mut next = first;
    // Bounded by `most` deletions (each step moves past one message).
    while next <= last && removal.removed < most {
        let seq = match stream.get_first_raw_message_by_subject(">", next).await {
            Ok(message) => message.sequence,
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => break,
            Err(e) => {
                tracing::warn!(error = %e, "could not look for already-acked rows left in the stream");
                removal.failed = true;
                return removal;
            }
        };
        if seq > last {
            break;
        }
        match stream.delete_message(seq).await {
            Ok(_) => removal.removed_one(seq),
            // Gone between the look and the delete: on a cluster the work queue's own
            // removal of an acked message reaches the stream a moment after the ack
            // floor shows it. What this pass wanted; nothing to say.
            Err(e) if is_no_message_found(&e) => {}
            Err(e) => {
                tracing::warn!(error = %e, seq, "could not delete an already-acked row left in the stream");
                removal.failed = true;
                return removal;
            }
        }
        next = seq + 1;
    }
    removal
}
