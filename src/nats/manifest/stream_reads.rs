//! A batch's messages read back from the ingest stream (a batch formed again after a
//! restart), and which of them the stream still holds. A message is named as the queue
//! names it (`super::partitions`): each is read from its partition's stream.

use std::collections::HashMap;

use async_nats::jetstream::stream::{self, Stream};
use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _};
use sluice_actors::{FetchError, StoreError};

use super::{Shared, FETCH_CONCURRENCY};

impl Shared {
    pub(super) async fn fetch(&self, sequences: &[u64]) -> Result<Vec<Bytes>, FetchError> {
        let streams = self
            .streams_of(sequences)
            .await
            .map_err(FetchError::Unavailable)?;
        let streams = &streams;
        futures::stream::iter(sequences.iter().copied())
            .map(|name| async move {
                let (stream_name, seq, stream) = self.located(streams, name)?;
                match stream.get_raw_message(seq).await {
                    // Its rows, decoded as the source decodes them (`nats::encoding`).
                    Ok(message) => crate::nats::decode(Some(&message.headers), &message.payload)
                        .map_err(|e| {
                            FetchError::Unavailable(StoreError(format!(
                                "message {seq} of stream {stream_name}: {e}"
                            )))
                        }),
                    Err(e) if e.kind() == stream::RawMessageErrorKind::NoMessageFound => {
                        Err(FetchError::Gone {
                            stream_sequence: name,
                        })
                    }
                    Err(e) => Err(FetchError::Unavailable(StoreError(format!(
                        "reading message {seq} of stream {stream_name}: {e}"
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
        let streams = self.streams_of(sequences).await?;
        let streams = &streams;
        futures::stream::iter(sequences.iter().copied())
            .map(|name| async move {
                let (stream_name, seq, stream) =
                    self.located(streams, name).map_err(|e| match e {
                        FetchError::Unavailable(e) => e,
                        other => StoreError(other.to_string()),
                    })?;
                match stream.get_raw_message(seq).await {
                    Ok(_) => Ok(true),
                    Err(e) if e.kind() == stream::RawMessageErrorKind::NoMessageFound => Ok(false),
                    Err(e) => Err(StoreError(format!(
                        "reading message {seq} of stream {stream_name}: {e}"
                    ))),
                }
            })
            .buffered(FETCH_CONCURRENCY)
            .try_collect()
            .await
    }

    /// The streams the messages named are in, looked up once each.
    async fn streams_of(&self, names: &[u64]) -> Result<HashMap<String, Stream<()>>, StoreError> {
        let mut streams = HashMap::new();
        for &name in names {
            let Some((stream, _)) = self.stream_of(name) else {
                continue;
            };
            if !streams.contains_key(stream) {
                let found = self
                    .js
                    .get_stream_no_info(stream)
                    .await
                    .map_err(|e| StoreError(format!("stream {stream}: {e}")))?;
                streams.insert(stream.to_owned(), found);
            }
        }
        Ok(streams)
    }

    /// The stream (its name and handle) and the sequence there of the message named
    /// `name`. A partition the queue no longer has: gone.
    fn located<'s>(
        &self,
        streams: &'s HashMap<String, Stream<()>>,
        name: u64,
    ) -> Result<(&'s str, u64, &'s Stream<()>), FetchError> {
        self.stream_of(name)
            .and_then(|(stream, seq)| {
                streams
                    .get_key_value(stream)
                    .map(|(k, s)| (k.as_str(), seq, s))
            })
            .ok_or(FetchError::Gone {
                stream_sequence: name,
            })
    }
}
