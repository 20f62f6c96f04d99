//! A request's rows on their way into the stream: gathered into chunks (`chunk`), each
//! chunk sent as it closes, its ack
//! awaited later (a window of `PIPELINE_WINDOW` in flight, oldest first), so a request
//! costs one round trip, not one per chunk. Counts stay in rows: a chunk's rows are
//! accepted together when JetStream acks it, and not stored together when it does not.
//!
//! After the first failure nothing more is sent: the rest of the request is only
//! counted (as not stored), so the answer still accounts for every row.

use std::collections::VecDeque;

use bytes::Bytes;

use super::chunk::{Chunk, ChunkLimits, Chunker};
use crate::nats::{PendingPublish, PublishError, Publisher};

/// Publishes in flight per request. JetStream's client lends a fixed number of ack
/// permits and takes one back only when its ack is awaited, so requests that each hold
/// some while waiting for more could starve one another: each request keeps at most
/// this many, and at most `MAX_PUBLISHING` requests publish at once, within the permits
/// of the ingest publisher's context (see `server::listeners`).
pub const PIPELINE_WINDOW: usize = 512;
pub const MAX_PUBLISHING: usize = 64;

/// What became of a request's chunks.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Rows given to be published.
    pub rows: usize,
    /// Rows of chunks JetStream acknowledged.
    pub accepted: usize,
    /// Of those, rows of chunks it had already (the same message id, a client retry).
    pub duplicates: usize,
    /// Messages JetStream acknowledged.
    pub messages: usize,
    /// Why the rest was not stored, if something failed.
    pub stop: Option<PublishError>,
}

/// The rows of one request, sent to one subject.
pub struct Publishing<'a> {
    publisher: &'a Publisher,
    chunker: Chunker,
    subject: String,
    /// The request's `Idempotency-Key`: each chunk's message id is `<key>-<index>`.
    key: Option<&'a str>,
    /// Sent chunks waiting for their ack, with their row counts.
    pending: VecDeque<(PendingPublish, usize)>,
    outcome: Outcome,
}

// === impl Publishing ===

impl<'a> Publishing<'a> {
    /// `stop`: a reason not to send anything at all (NATS is not connected).
    pub fn new(
        publisher: &'a Publisher,
        subject: String,
        key: Option<&'a str>,
        chunks: ChunkLimits,
        stop: Option<PublishError>,
    ) -> Self {
        Self {
            publisher,
            chunker: Chunker::new(chunks),
            subject,
            key,
            pending: VecDeque::with_capacity(PIPELINE_WINDOW),
            outcome: Outcome {
                stop,
                ..Outcome::default()
            },
        }
    }

    /// Adds a row to the open chunk, sending the chunk it closes.
    pub async fn add(&mut self, row: Bytes) {
        self.outcome.rows += 1;
        if let Some(chunk) = self.chunker.push(row) {
            self.send(chunk).await;
        }
    }

    /// Sends the last chunk and waits for every ack still outstanding.
    pub async fn finish(mut self) -> Outcome {
        if let Some(chunk) = self.chunker.finish() {
            self.send(chunk).await;
        }
        while let Some(oldest) = self.pending.pop_front() {
            self.confirm(oldest).await;
        }
        self.outcome
    }

    /// Sends a chunk, once the window has room; after a failure, does nothing.
    async fn send(&mut self, chunk: Chunk) {
        if self.pending.len() >= PIPELINE_WINDOW {
            if let Some(oldest) = self.pending.pop_front() {
                self.confirm(oldest).await;
            }
        }
        if self.outcome.stop.is_some() {
            return;
        }
        let id = self.key.map(|k| message_id(k, chunk.index));
        match self
            .publisher
            .send(self.subject.clone(), chunk.payload, None, id.as_deref())
            .await
        {
            Ok(ack) => self.pending.push_back((ack, chunk.rows)),
            Err(e) => self.outcome.stop = Some(e),
        }
    }

    async fn confirm(&mut self, (ack, rows): (PendingPublish, usize)) {
        match Publisher::confirm(ack).await {
            Ok(published) => {
                self.outcome.accepted += rows;
                self.outcome.messages += 1;
                if published.duplicate {
                    self.outcome.duplicates += rows;
                }
            }
            Err(e) => {
                if self.outcome.stop.is_none() {
                    self.outcome.stop = Some(e);
                }
            }
        }
    }
}

/// The message id of a request's chunk. The index is the last `-`-separated part and
/// all digits, so two (key, index) pairs never give one id.
pub fn message_id(key: &str, index: usize) -> String {
    format!("{key}-{index}")
}

/// The longest [`message_id`] for a key of `key_len` bytes.
pub fn max_message_id_len(key_len: usize) -> usize {
    key_len + 1 + 20
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_are_the_key_and_the_chunk_index() {
        assert_eq!(message_id("order-7", 0), "order-7-0");
        assert_eq!(message_id("order-7", 12), "order-7-12");
        assert!(message_id("k", usize::MAX).len() <= max_message_id_len(1));
    }
}
