//! A batch's messages read back from the ingest stream (a batch formed again after a
//! restart), and which of them the stream still holds.

use async_nats::jetstream::stream;
use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _};
use sluice_actors::{FetchError, StoreError};

use super::{Shared, FETCH_CONCURRENCY};

impl Shared {
    pub(super) async fn fetch(&self, sequences: &[u64]) -> Result<Vec<Bytes>, FetchError> {
        let name = &self.settings.stream;
        let stream = self
            .js
            .get_stream_no_info(name)
            .await
            .map_err(|e| FetchError::Unavailable(StoreError(format!("stream {name}: {e}"))))?;
        let stream = &stream;
        futures::stream::iter(sequences.iter().copied())
            .map(|seq| async move {
                match stream.get_raw_message(seq).await {
                    // Its rows, decoded as the source decodes them (`nats::encoding`).
                    Ok(message) => crate::nats::decode(Some(&message.headers), &message.payload)
                        .map_err(|e| {
                            FetchError::Unavailable(StoreError(format!(
                                "message {seq} of stream {name}: {e}"
                            )))
                        }),
                    Err(e) if e.kind() == stream::RawMessageErrorKind::NoMessageFound => {
                        Err(FetchError::Gone {
                            stream_sequence: seq,
                        })
                    }
                    Err(e) => Err(FetchError::Unavailable(StoreError(format!(
                        "reading message {seq} of stream {name}: {e}"
                    )))),
                }
            })
            .buffered(FETCH_CONCURRENCY)
            .try_collect()
            .await
    }

    /// Whether each message is still in the ingest stream (a work queue: an acked
    /// message leaves it).
    pub(super) async fn in_stream(&self, sequences: &[u64]) -> Result<Vec<bool>, StoreError> {
        let name = &self.settings.stream;
        let stream = self
            .js
            .get_stream_no_info(name)
            .await
            .map_err(|e| StoreError(format!("stream {name}: {e}")))?;
        let stream = &stream;
        futures::stream::iter(sequences.iter().copied())
            .map(|seq| async move {
                match stream.get_raw_message(seq).await {
                    Ok(_) => Ok(true),
                    Err(e) if e.kind() == stream::RawMessageErrorKind::NoMessageFound => Ok(false),
                    Err(e) => Err(StoreError(format!(
                        "reading message {seq} of stream {name}: {e}"
                    ))),
                }
            })
            .buffered(FETCH_CONCURRENCY)
            .try_collect()
            .await
    }
}
