//! Acked messages a crashed nats-server left in the work queue, and how they go.
//!
//! nats-server 2.9 killed with -9 can come back with messages still in the INGEST work
//! queue that the consumer had already acked: the removals had not reached its disk.
//! They are never delivered again, but they hold on to the stream's byte budget, so a
//! full queue would refuse producers for rows long inserted. Sluice removes them when
//! its consumer connects and with every lag poll.
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

/// The most messages one pass removes (two requests each); the rest wait for the next
/// lag poll, so a crash that left many behind cannot hold the poll up for long.
const MAX_REMOVED_PER_PASS: u64 = 10_000;

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
/// that `stream` still keeps, one by one, and returns how many went. Best effort: a
/// failure is logged and the next pass tries again.
pub async fn remove_stranded(stream: &Stream, consumer: &consumer::Info) -> u64 {
    let done = done_through(consumer);
    let first = stream.cached_info().state.first_sequence;
    if done == 0 || first == 0 || first > done {
        return 0;
    }
    let mut removed = 0;
    let mut next = first;
    // Bounded by MAX_REMOVED_PER_PASS deletions (each step moves past one message).
    while next <= done && removed < MAX_REMOVED_PER_PASS {
        let seq = match stream.get_first_raw_message_by_subject(">", next).await {
            Ok(message) => message.sequence,
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => break,
            Err(e) => {
                tracing::warn!(error = %e, "could not look for already-acked rows left in the stream");
                break;
            }
        };
        if seq > done {
            break;
        }
        match stream.delete_message(seq).await {
            Ok(_) => removed += 1,
            // Gone between the look and the delete: on a cluster the work queue's own
            // removal of an acked message reaches the stream a moment after the ack
            // floor shows it. What this pass wanted; nothing to say.
            Err(e) if is_no_message_found(&e) => {}
            Err(e) => {
                tracing::warn!(error = %e, seq, "could not delete an already-acked row left in the stream");
                break;
            }
        }
        next = seq + 1;
    }
    if removed > 0 {
        tracing::warn!(
            stream = %stream.cached_info().config.name,
            removed,
            done_through = done,
            "removed rows the consumer had already acked but the stream still kept (a nats-server crash leaves them behind)"
        );
    }
    removed
}
