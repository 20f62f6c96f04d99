//! Publishing rows to the ingest stream with a message id, and telling a full stream
//! from an unreachable one: both answer 503 at the API, but they mean different things
//! to an operator (`QueueFull` is backpressure working; `Unavailable` and
//! `NoResponders` an outage). And telling a publish nothing took (`NoResponders`: safe
//! to send again) from one whose fate is unknown (`Unavailable`: sent again only with
//! its message id, which makes JetStream store it once).

use std::error::Error as _;

use async_nats::jetstream::{self, context::PublishAckFuture, context::PublishErrorKind};
use std::sync::Arc;

use async_nats::HeaderMap;
use bytes::Bytes;

use super::stream_fill::StreamFill;
use super::workarounds::budget::{stored_size, BudgetGuard, BudgetPermit};
use crate::config::units::Share;

/// JetStream's code for a publish refused by a stream's limits with discard-new:
/// `maximum bytes exceeded` (and `maximum messages exceeded`) arrive with it.
const STREAM_STORE_FAILED: u64 = 10077;

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The stream is at its `max_bytes`: nothing was stored, retry later.
    #[error("the ingest stream is full (maximum bytes exceeded)")]
    QueueFull,
    /// NATS or JetStream could not be reached or did not answer in time: the message
    /// may or may not be stored.
    #[error("NATS is unreachable: {0}")]
    Unavailable(String),
    /// Nothing in JetStream took the message (no responders): the stream has no leader
    /// right now (a NATS cluster's election, JetStream restarting) or is not set up
    /// yet. Nothing was stored.
    #[error("NATS is unreachable: {0}")]
    NoResponders(String),
    /// Anything else JetStream refused (a message too large, no stream for the subject).
    #[error("JetStream refused the message: {0}")]
    Refused(String),
    /// A publish that expected its subject's last sequence (a key-value compare-and-set)
    /// found another: someone wrote the subject first. Nothing was stored.
    #[error("the subject was written by someone else first (wrong last sequence)")]
    WrongLastSequence,
}

impl PublishError {
    /// Whether the message is known not to be stored: every failure but an answer that
    /// never came.
    pub fn stored_nothing(&self) -> bool {
        !matches!(self, Self::Unavailable(_))
    }

    /// Whether the same message may be published again: when nothing took it, or when
    /// it carries a message id (JetStream then stores it once, whatever the first
    /// attempt did). A full stream or a refusal is answered as it is.
    pub fn may_send_again(&self, with_message_id: bool) -> bool {
        match self {
            Self::NoResponders(_) => true,
            Self::Unavailable(_) => with_message_id,
            Self::QueueFull | Self::Refused(_) | Self::WrongLastSequence => false,
        }
    }
}

/// A sent row waiting for the stream's ack (see [`Publisher::confirm`]); it holds its
/// bytes against the stream's budget until then.
pub struct PendingPublish {
    ack: PublishAckFuture,
    permit: Option<BudgetPermit>,
    /// The stream's fill, and the bytes this publish adds to it once stored.
    fill: (Arc<StreamFill>, u64),
}

/// What a publish ack said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    pub sequence: u64,
    /// The message id was seen inside the duplicate window: stored once already.
    pub duplicate: bool,
}

/// Publishes to one JetStream stream, within its byte budget. Cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    js: jetstream::Context,
    budget: Arc<BudgetGuard>,
    /// How full the stream is (whether it holds a backlog), as this process sees it.
    fill: Arc<StreamFill>,
    /// The stream's configured budget.
    max_bytes: u64,
}

// === impl Publisher ===

impl Publisher {
    /// A publisher into `stream`, whose configured budget is `max_bytes`.
    pub fn new(js: jetstream::Context, stream: &str, max_bytes: u64) -> Self {
        let fill = Arc::new(StreamFill::new(js.clone(), stream));
        let budget = Arc::new(BudgetGuard::new(
            js.clone(),
            stream,
            max_bytes,
            fill.clone(),
        ));
        Self {
            js,
            budget,
            fill,
            max_bytes,
        }
    }

    /// Whether the stream holds more than `share` of its budget, as last seen (never
    /// waits: see `super::stream_fill`); always true for a zero share.
    pub fn holds_more_than(&self, share: Share) -> bool {
        share.is_zero() || self.fill.bytes() > share.of(self.max_bytes)
    }

    pub fn context(&self) -> &jetstream::Context {
        &self.js
    }

    /// Send one row; [`Publisher::confirm`] then waits for the stream's ack. Sending many
    /// and then confirming them pipelines a request instead of one round trip per row.
    pub async fn send(
        &self,
        subject: String,
        payload: Bytes,
        headers: Option<HeaderMap>,
        message_id: Option<&str>,
    ) -> Result<PendingPublish, PublishError> {
        let mut headers = headers.unwrap_or_default();
        if let Some(id) = message_id {
            headers.insert(async_nats::header::NATS_MESSAGE_ID, id);
        }
        let header_bytes: usize = headers
            .iter()
            .map(|(k, v)| {
                AsRef::<str>::as_ref(k).len()
                    + v.iter().map(|v| v.as_str().len() + 4).sum::<usize>()
            })
            .sum();
        let size = stored_size(&subject, payload.len(), header_bytes);
        let permit = self
            .budget
            .admit(size)
            .await
            .map_err(|_| PublishError::QueueFull)?;
        let ack = self
            .js
            .publish_with_headers(subject, headers, payload)
            .await
            .map_err(classify)?;
        Ok(PendingPublish {
            ack,
            permit,
            fill: (self.fill.clone(), size),
        })
    }

    /// Wait for the stream's ack of a sent row. A duplicate (or a failure) gives its
    /// bytes back to the budget; a stored row keeps them.
    pub async fn confirm(pending: PendingPublish) -> Result<Published, PublishError> {
        let PendingPublish { ack, permit, fill } = pending;
        match ack.await {
            Ok(ack) => {
                if !ack.duplicate {
                    fill.0.stored(fill.1);
                }
                if let (false, Some(permit)) = (ack.duplicate, permit) {
                    permit.stored();
                }
                Ok(Published {
                    sequence: ack.sequence,
                    duplicate: ack.duplicate,
                })
            }
            Err(e) => Err(classify(e)),
        }
    }

    /// Send and confirm one row.
    pub async fn publish(
        &self,
        subject: String,
        payload: Bytes,
        headers: Option<HeaderMap>,
        message_id: Option<&str>,
    ) -> Result<Published, PublishError> {
        let ack = self.send(subject, payload, headers, message_id).await?;
        Self::confirm(ack).await
    }
}

fn classify(e: async_nats::jetstream::context::PublishError) -> PublishError {
    let text = e.to_string();
    let code = e
        .source()
        .and_then(|s| s.downcast_ref::<async_nats::jetstream::Error>())
        .map(|j| j.error_code().0);
    let full = code == Some(STREAM_STORE_FAILED)
        || text.contains("maximum bytes exceeded")
        || text.contains("maximum messages exceeded");
    if full {
        return PublishError::QueueFull;
    }
    match e.kind() {
        PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe => {
            PublishError::Unavailable(text)
        }
        // "No responders" (async-nats reports it as StreamNotFound): nothing listens on
        // the subject right now. Sluice creates the stream itself (at start, and again
        // whenever its consumer connects), so this is a stream without a leader (a NATS
        // cluster electing one), JetStream not ready yet (Sluice started before NATS,
        // nats-server restarting) or the stream being recreated: transient. A 400 here
        // would tell the client to drop its rows; a 503 tells it to come back, and the
        // ingest API sends it again itself for a while (nothing was stored).
        PublishErrorKind::StreamNotFound => PublishError::NoResponders(format!(
            "{text} (no responders: the stream has no leader right now, or is not set up yet, or JetStream is restarting)"
        )),
        PublishErrorKind::MaxPayloadExceeded => PublishError::Refused(text),
        PublishErrorKind::WrongLastSequence => PublishError::WrongLastSequence,
        _ => match code {
            Some(_) => PublishError::Refused(text),
            None => PublishError::Unavailable(text),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_nats::jetstream::context::PublishError as JsPublishError;

    #[test]
    fn no_responders_is_retryable_not_a_refusal() {
        // What the client reports when nothing listens on the subject (the stream not
        // created yet, JetStream restarting): the API must answer 503, not 400.
        let e = classify(JsPublishError::new(PublishErrorKind::StreamNotFound));
        assert!(matches!(e, PublishError::NoResponders(_)), "{e:?}");
        let e = classify(JsPublishError::new(PublishErrorKind::TimedOut));
        assert!(matches!(e, PublishError::Unavailable(_)), "{e:?}");
        let e = classify(JsPublishError::new(PublishErrorKind::MaxPayloadExceeded));
        assert!(matches!(e, PublishError::Refused(_)), "{e:?}");
        let e = classify(JsPublishError::new(PublishErrorKind::WrongLastSequence));
        assert!(matches!(e, PublishError::WrongLastSequence), "{e:?}");
    }
}
