//! A request's rows on their way into the stream: gathered into chunks (`chunk`), each
//! chunk sent as it closes, its ack
//! awaited later (a window of `PIPELINE_WINDOW` in flight, oldest first), so a request
//! costs one round trip, not one per chunk. Counts stay in rows: a chunk's rows are
//! accepted together when JetStream acks it, and not stored together when it does not.
//!
//! A chunk JetStream did not take is sent again, the same message under the same id,
//! for up to `[api] publish_retry_for` from the request's first such failure: a NATS
//! cluster electing a stream leader answers "no responders" for a few seconds, and a
//! node that dies with an ack on its way leaves it unanswered. An accepted row is still
//! a stored one; a client sees 503 only when the outage outlasts the bound. Sent again
//! are chunks nothing took, and chunks with a message id (an `Idempotency-Key`), which
//! JetStream stores once whatever the first attempt did (`PublishError::may_send_again`).
//!
//! After a failure that is not sent again nothing more is sent: the rest of the
//! request is only counted (as not stored), so the answer still accounts for every row.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::chunk::{Chunk, ChunkLimits, Chunker};
use crate::nats::{PendingPublish, PublishError, Publisher};

/// The first pause before a chunk is sent again; it doubles up to [`RESEND_MAX`].
const RESEND_MIN: Duration = Duration::from_millis(100);
const RESEND_MAX: Duration = Duration::from_secs(1);

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
    /// Sent chunks waiting for their ack.
    pending: VecDeque<(PendingPublish, Chunk)>,
    /// How long chunks JetStream did not take are sent again, and until when (set at
    /// the request's first such failure).
    resend_for: Duration,
    resend_until: Option<Instant>,
    outcome: Outcome,
}

// === impl Publishing ===

impl<'a> Publishing<'a> {
    /// `stop`: a reason not to send anything at all (NATS is not connected);
    /// `resend_for`: `[api] publish_retry_for`.
    pub fn new(
        publisher: &'a Publisher,
        subject: String,
        key: Option<&'a str>,
        chunks: ChunkLimits,
        resend_for: Duration,
        stop: Option<PublishError>,
    ) -> Self {
        Self {
            publisher,
            chunker: Chunker::new(chunks),
            subject,
            key,
            pending: VecDeque::with_capacity(PIPELINE_WINDOW),
            resend_for,
            resend_until: None,
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
        match self.publish(&chunk).await {
            Ok(ack) => self.pending.push_back((ack, chunk)),
            Err(e) => self.resend(chunk, e).await,
        }
    }

    async fn publish(&self, chunk: &Chunk) -> Result<PendingPublish, PublishError> {
        let id = self.key.map(|k| message_id(k, chunk.index));
        self.publisher
            .send(
                self.subject.clone(),
                chunk.payload.clone(),
                None,
                id.as_deref(),
            )
            .await
    }

    async fn confirm(&mut self, (ack, chunk): (PendingPublish, Chunk)) {
        match Publisher::confirm(ack).await {
            Ok(published) => self.accepted(&chunk, published.duplicate),
            Err(e) => self.resend(chunk, e).await,
        }
    }

    /// A chunk that failed with `error`: sent again (and waited for, one at a time)
    /// while the error allows it and the request's resend window lasts; else the
    /// request stops there.
    async fn resend(&mut self, chunk: Chunk, mut error: PublishError) {
        let until = *self
            .resend_until
            .get_or_insert_with(|| Instant::now() + self.resend_for);
        let mut pause = RESEND_MIN;
        while self.outcome.stop.is_none()
            && error.may_send_again(self.key.is_some())
            && Instant::now() < until
        {
            tracing::debug!(error = %error, subject = %self.subject, chunk = chunk.index,
                "a publish JetStream did not take: sending it again");
            tokio::time::sleep(pause.min(until.saturating_duration_since(Instant::now()))).await;
            pause = (pause * 2).min(RESEND_MAX);
            // An attempt ends with the window too (the last one, at its end, gets a
            // moment): a node gone with its socket open would otherwise keep the ack
            // waiting for the client's whole timeout.
            let left = until
                .saturating_duration_since(Instant::now())
                .max(RESEND_MIN);
            let attempt = async {
                let ack = self.publish(&chunk).await?;
                Publisher::confirm(ack).await
            };
            let acked = tokio::time::timeout(left, attempt)
                .await
                .unwrap_or_else(|_| {
                    Err(PublishError::Unavailable(format!(
                        "no ack within [api] publish_retry_for ({})",
                        humantime::format_duration(self.resend_for)
                    )))
                });
            match acked {
                Ok(published) => return self.accepted(&chunk, published.duplicate),
                Err(e) => error = e,
            }
        }
        if self.outcome.stop.is_none() {
            self.outcome.stop = Some(error);
        }
    }

    fn accepted(&mut self, chunk: &Chunk, duplicate: bool) {
        self.outcome.accepted += chunk.rows;
        self.outcome.messages += 1;
        if duplicate {
            self.outcome.duplicates += chunk.rows;
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
