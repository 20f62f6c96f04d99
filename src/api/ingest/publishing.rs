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
//! a stored one; a client sees 503 only when the outage outlasts the bound. The first
//! wait for a chunk's ack is no longer than the bound either (not the client's request
//! timeout), so a 503 comes within about twice `publish_retry_for`. Sent again
//! are chunks nothing took, and chunks with a message id (an `Idempotency-Key`), which
//! JetStream stores once whatever the first attempt did (`PublishError::may_send_again`).
//!
//! After a failure that is not sent again nothing more is sent: the rest of the
//! request is only counted (as not stored), so the answer still accounts for every row.
//!
//! A keyed request's chunks carry message ids (`<stem>-<index>`, see `idempotency`);
//! chunks an earlier request under the key stored are counted, not sent again, and
//! nothing is sent once the key's lease has ended.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::chunk::{Chunk, ChunkLimits, Chunker};
use super::idempotency::ChunkSet;
use crate::nats::{
    chunk_message_id, headers_for, Compression, IngestStreams, KeyStoreError, LandedChunks,
    PendingPublish, PublishError, Publisher,
};

/// Publishes in flight per request. JetStream's client lends a fixed number of ack
/// permits and takes one back only when its ack is awaited, so requests that each hold
/// some while waiting for more could starve one another: each request keeps at most
/// this many, and at most `MAX_PUBLISHING` requests publish at once, within the permits
/// of the ingest publisher's context (see `server::listeners`).
pub const PIPELINE_WINDOW: usize = 512;
pub const MAX_PUBLISHING: usize = 64;

/// The first pause before a chunk is sent again; it doubles up to [`RESEND_MAX`].
const RESEND_MIN: Duration = Duration::from_millis(100);
const RESEND_MAX: Duration = Duration::from_secs(1);

/// Why a request's rows stopped being sent.
#[derive(Debug, thiserror::Error)]
pub enum Stop {
    /// JetStream did not store a chunk (full, unreachable, refused).
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// The request's `Idempotency-Key` could not be recorded: nothing was sent.
    #[error(transparent)]
    Keys(#[from] KeyStoreError),
    /// The key's lease ended before every chunk was sent.
    #[error("the request's rows were not all published within its Idempotency-Key's lease of {} (twice [api] body_timeout)", humantime::format_duration(*.0))]
    LeaseEnded(Duration),
}

/// What became of a request's chunks.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Rows given to be published.
    pub rows: usize,
    /// Rows stored: of chunks JetStream acknowledged, and of chunks an earlier request
    /// under the key stored.
    pub accepted: usize,
    /// Of those, rows stored by an earlier request under the key: the chunks it
    /// recorded, and those JetStream had already (the same message id).
    pub duplicates: usize,
    /// Messages JetStream acknowledged as new.
    pub messages: usize,
    /// Chunks sent (a keyed request that sent none leaves its key free).
    pub sent: usize,
    /// Chunks known stored (acknowledged, or recorded by an earlier request).
    pub stored: ChunkSet,
    /// Why the rest was not stored, if something failed.
    pub stop: Option<Stop>,
}

/// What a keyed request's chunks are sent with.
pub struct KeyedChunks<'a> {
    /// Each chunk's message id is `<stem>-<index>`.
    pub stem: &'a str,
    /// Chunks stored by an earlier request under the key: counted, not sent.
    pub stored_before: &'a ChunkSet,
    /// Nothing is sent after it (the key's lease ends).
    pub deadline: Instant,
    pub lease: Duration,
    /// Where the consumer marks chunks it settled: a chunk that may have been stored
    /// before (a resumed request's, or one sent again after a lost ack) is sent only if
    /// not marked, since a restarted nats-server forgets the ids of chunks consumed.
    pub landed: &'a LandedChunks,
    /// The key's earlier request stored some chunks, or may have: its record was
    /// resumed or taken over.
    pub resumed: bool,
}

impl KeyedChunks<'_> {
    /// Whether the consumer marked chunk `index` landed.
    async fn landed(&self, index: usize) -> Result<bool, KeyStoreError> {
        self.landed
            .landed(&chunk_message_id(self.stem, index))
            .await
    }
}

/// The rows of one request, sent to one table (each chunk to its partition).
pub struct Publishing<'a> {
    streams: &'a IngestStreams,
    chunker: Chunker,
    /// The tenant and the table.
    table: (&'a str, &'a str),
    keyed: Option<KeyedChunks<'a>>,
    /// How a chunk is stored (`[api] compression`); `None`: plain.
    compression: Option<Compression>,
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
        streams: &'a IngestStreams,
        table: (&'a str, &'a str),
        keyed: Option<KeyedChunks<'a>>,
        chunks: ChunkLimits,
        resend_for: Duration,
        stop: Option<Stop>,
    ) -> Self {
        Self {
            streams,
            chunker: Chunker::new(chunks),
            table,
            keyed,
            compression: None,
            pending: VecDeque::with_capacity(PIPELINE_WINDOW),
            resend_for,
            resend_until: None,
            outcome: Outcome {
                stop,
                ..Outcome::default()
            },
        }
    }

    /// Stores each chunk compressed with `compression` where it pays (`nats::encoding`).
    pub fn compressed(mut self, compression: Option<Compression>) -> Self {
        self.compression = compression;
        self
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

    /// Sends a chunk, once the window has room; after a failure, does nothing. A chunk
    /// an earlier request under the key stored is only counted.
    async fn send(&mut self, chunk: Chunk) {
        if let Some(keyed) = &self.keyed {
            if keyed.stored_before.contains(chunk.index) {
                return self.accepted(&chunk, true);
            }
            if keyed.resumed && self.outcome.stop.is_none() {
                match keyed.landed(chunk.index).await {
                    Ok(true) => return self.accepted(&chunk, true),
                    Ok(false) => {}
                    Err(e) => {
                        self.outcome.stop.get_or_insert(Stop::Keys(e));
                    }
                }
            }
        }
        if self.pending.len() >= PIPELINE_WINDOW {
            if let Some(oldest) = self.pending.pop_front() {
                self.confirm(oldest).await;
            }
        }
        if let Some(keyed) = self.keyed.as_ref().filter(|k| Instant::now() >= k.deadline) {
            self.outcome
                .stop
                .get_or_insert(Stop::LeaseEnded(keyed.lease));
        }
        if self.outcome.stop.is_some() {
            return;
        }
        // Compressed only while the stream holds a backlog (`Compression::while_above`).
        let (publisher, _) = self.route(&chunk);
        let compression = self
            .compression
            .filter(|c| publisher.holds_more_than(c.while_above));
        let chunk = chunk.encoded(compression);
        match self.publish(&chunk).await {
            Ok(ack) => {
                self.outcome.sent += 1;
                self.pending.push_back((ack, chunk));
            }
            Err(e) => self.resend(chunk, e, false).await,
        }
    }

    async fn publish(&self, chunk: &Chunk) -> Result<PendingPublish, PublishError> {
        let id = self.message_id(chunk);
        let (publisher, subject) = self.route(chunk);
        publisher
            .send(
                subject,
                chunk.payload.clone(),
                headers_for(chunk.encoding),
                id.as_deref(),
            )
            .await
    }

    /// A keyed request's chunk carries a message id; others none.
    fn message_id(&self, chunk: &Chunk) -> Option<String> {
        self.keyed
            .as_ref()
            .map(|k| chunk_message_id(k.stem, chunk.index))
    }

    /// The chunk's partition (by its message id: a chunk sent again goes where it went
    /// first) and the subject it is published on there.
    fn route(&self, chunk: &Chunk) -> (&'a Publisher, String) {
        let (tenant, table) = self.table;
        self.streams
            .route(tenant, table, self.message_id(chunk).as_deref())
    }

    async fn confirm(&mut self, (ack, chunk): (PendingPublish, Chunk)) {
        // The first wait for an ack ends with the window's length too: a node gone with
        // its socket open would otherwise keep it for the client's whole timeout before
        // the window even starts, and the client's 503 would come that much later.
        let acked = tokio::time::timeout(self.resend_for, Publisher::confirm(ack))
            .await
            .unwrap_or_else(|_| Err(self.no_ack_within_the_window()));
        match acked {
            Ok(published) => self.accepted(&chunk, published.duplicate),
            Err(e) => self.resend(chunk, e, true).await,
        }
    }

    /// A chunk that failed with `error`: sent again (and waited for, one at a time)
    /// while the error allows it, the request's resend window lasts and a keyed
    /// request's lease holds; else the request stops there. `counted`: the chunk is in
    /// `Outcome::sent` already (a publish of it reached NATS); else it is counted once an
    /// attempt may have reached it (a keyed request that sent nothing frees its key).
    async fn resend(&mut self, chunk: Chunk, mut error: PublishError, mut counted: bool) {
        let mut until = *self
            .resend_until
            .get_or_insert_with(|| Instant::now() + self.resend_for);
        if let Some(keyed) = &self.keyed {
            until = until.min(keyed.deadline);
        }
        let mut pause = RESEND_MIN;
        while self.outcome.stop.is_none()
            && error.may_send_again(self.keyed.is_some())
            && Instant::now() < until
        {
            tracing::debug!(error = %error, tenant = self.table.0, table = self.table.1, chunk = chunk.index,
                "a publish JetStream did not take: sending it again");
            tokio::time::sleep(pause.min(until.saturating_duration_since(Instant::now()))).await;
            pause = (pause * 2).min(RESEND_MAX);
            // An attempt ends with the window too (the last one, at its end, gets a
            // moment): a node gone with its socket open would otherwise keep the ack
            // waiting for the client's whole timeout.
            let left = until
                .saturating_duration_since(Instant::now())
                .max(RESEND_MIN);
            // Consumed and acked meanwhile, a first copy is no longer in the stream for
            // JetStream's duplicate check to know after a restart: its mark tells.
            if let Some(keyed) = &self.keyed {
                match keyed.landed(chunk.index).await {
                    Ok(true) => return self.accepted(&chunk, true),
                    Ok(false) => {}
                    // Not known: not sent this round.
                    Err(_) => continue,
                }
            }
            let attempt = async {
                match self.publish(&chunk).await {
                    Ok(ack) => (true, Publisher::confirm(ack).await),
                    Err(e) => (false, Err(e)),
                }
            };
            // Cut off, the attempt may have reached NATS: counted as sent.
            let (went, acked) = tokio::time::timeout(left, attempt)
                .await
                .unwrap_or_else(|_| (true, Err(self.no_ack_within_the_window())));
            if went && !counted {
                counted = true;
                self.outcome.sent += 1;
            }
            match acked {
                Ok(published) => return self.accepted(&chunk, published.duplicate),
                Err(e) => error = e,
            }
        }
        self.outcome.stop.get_or_insert(error.into());
    }

    fn no_ack_within_the_window(&self) -> PublishError {
        PublishError::Unavailable(format!(
            "no ack within [api] publish_retry_for ({})",
            humantime::format_duration(self.resend_for)
        ))
    }

    fn accepted(&mut self, chunk: &Chunk, duplicate: bool) {
        self.outcome.accepted += chunk.rows;
        self.outcome.stored.insert(chunk.index);
        if duplicate {
            self.outcome.duplicates += chunk.rows;
        } else {
            self.outcome.messages += 1;
        }
    }
}
