//! Chunks of keyed ingest requests that Sluice settled, marked before their ack.
//!
//! Why they exist: a chunk of a keyed request whose publish ack was lost (nats-server
//! restarted under it) is sent again under its message id, and JetStream drops the copy
//! only while its duplicate check knows the id. A restarted nats-server rebuilds that
//! check from the messages it still holds; a chunk consumed and acked before the
//! restart has left the work queue, its id with it, and the copy would be stored and
//! inserted a second time. So the consumer marks a keyed chunk as landed before it acks
//! it (inserted or parked, every row settled), and a request that sends a chunk again
//! asks first: a first copy still in the stream is dropped by the rebuilt check, and
//! one that left the stream was marked before it left.
//!
//! A mark is a record under `landed.<message id>` in the idempotency bucket (about 150
//! bytes), kept as long as its records (`[nats] duplicate_window` at least). A mark
//! that cannot be written is logged; the chunk is then not acked if its batch is
//! recorded (its record settles it when it comes again), and acked all the same
//! otherwise (see `JsDelivery::mark_landed`). Only chunks of the ingest
//! API are marked (their ids have the API's shape, see [`chunk_message_id`]): a
//! producer's own message ids cost no write.

use std::sync::Arc;

use async_nats::HeaderMap;
use bytes::Bytes;

use super::key_store::{KeyStore, KeyStoreError, Slot};

/// Hex digits of a keyed request's message stem (see [`chunk_message_id`]).
pub const STEM_HEX: usize = 32;

/// The message id of chunk `index` of a keyed request whose ids start with `stem`
/// (`STEM_HEX` hex digits): `<stem>-<index>`, so two (stem, index) pairs never give one
/// id. The shape [`chunk_id`] recognizes.
pub fn chunk_message_id(stem: &str, index: usize) -> String {
    format!("{stem}-{index}")
}

/// A delivered message's id when it is a chunk of a keyed ingest request (marked when
/// settled); `None` for any other message.
pub fn chunk_id(headers: Option<&HeaderMap>) -> Option<Box<str>> {
    let id = headers?.get(async_nats::header::NATS_MESSAGE_ID)?.as_str();
    let (stem, index) = id.split_once('-')?;
    let shaped = stem.len() == STEM_HEX
        && stem.bytes().all(|b| b.is_ascii_hexdigit())
        && !index.is_empty()
        && index.len() <= 20
        && index.bytes().all(|b| b.is_ascii_digit());
    shaped.then(|| id.into())
}

/// The marks, in the idempotency bucket.
pub struct LandedChunks {
    keys: Arc<KeyStore>,
}

impl LandedChunks {
    pub fn new(keys: Arc<KeyStore>) -> Self {
        Self { keys }
    }

    /// Marks chunk `id` as landed. Marked already (a copy settled twice) is fine.
    pub async fn mark(&self, id: &str) -> Result<(), KeyStoreError> {
        match self.keys.write(&mark_key(id), Bytes::new(), 0).await {
            Ok(_) | Err(KeyStoreError::Conflict) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Whether chunk `id` was marked landed (and the mark is still kept).
    pub async fn landed(&self, id: &str) -> Result<bool, KeyStoreError> {
        Ok(matches!(self.keys.get(&mark_key(id)).await?, Slot::Held(_)))
    }
}

/// A mark's key: two tokens, where a key's record has three (`<tenant>.<table>.<hash>`).
fn mark_key(id: &str) -> String {
    format!("landed.{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(id: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(async_nats::header::NATS_MESSAGE_ID, id);
        h
    }

    #[test]
    fn only_a_keyed_chunk_s_id_is_one() {
        let stem = "0123456789abcdef0123456789abcdef";
        let id = chunk_message_id(stem, 7);
        assert_eq!(chunk_id(Some(&headers(&id))).as_deref(), Some(id.as_str()));
        let last = chunk_message_id(stem, usize::MAX);
        assert_eq!(
            chunk_id(Some(&headers(&last))).as_deref(),
            Some(last.as_str())
        );
        for other in [
            "order-1",
            "0123456789abcdef0123456789abcde-1",
            "0123456789abcdef0123456789abcdeg-1",
            "0123456789abcdef0123456789abcdef-",
            "0123456789abcdef0123456789abcdef-x",
            "park-INGEST-4-17",
        ] {
            assert_eq!(chunk_id(Some(&headers(other))), None, "{other}");
        }
        assert_eq!(chunk_id(None), None);
        assert_eq!(chunk_id(Some(&HeaderMap::new())), None);
    }

    #[test]
    fn a_mark_never_meets_a_key_s_record() {
        assert_eq!(mark_key("ab-1"), "landed.ab-1");
        assert_eq!(mark_key("ab-1").split('.').count(), 2);
    }
}
