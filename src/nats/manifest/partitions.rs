//! The queue's streams as the store reads them: the one ingest stream, or each
//! partition's (`[nats] partitions`). A record names its messages as the queue does
//! (`Position::in_partition`: the partition above the stream sequence), so one record
//! may list messages of several partitions; each is read back from its own stream, and
//! each partition's consumer tells which of its messages are done with.
//!
//! The incarnation a record's key and token carry is the queue's: one stream's
//! creation time, or, partitioned, a hash of every partition's, so a partition deleted
//! and made again (its messages numbered from 1 again) makes every record before it
//! one of an old incarnation, never a record of the new messages.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use sluice_actors::{Position, StoreError};

use super::trusted_floor::Floor;
use super::{ManifestSettings, Shared};

/// What the collector reads of one partition's stream and consumer.
#[derive(Clone, Copy, Debug)]
pub(super) struct PartitionRead {
    pub incarnation: u64,
    pub floor: Floor,
}

/// The stream of each partition, by number (one: `[nats] stream`).
pub(super) fn partition_streams(s: &ManifestSettings) -> Vec<&str> {
    if s.partitions.is_empty() {
        vec![s.stream.as_str()]
    } else {
        s.partitions.iter().map(String::as_str).collect()
    }
}

/// The queue's incarnation as its streams are now, each read within `wait`; `None`
/// when one cannot be (not made yet, NATS away), with the reason.
pub(super) async fn read_incarnation(
    js: &jetstream::Context,
    s: &ManifestSettings,
    wait: Duration,
) -> Result<u64, String> {
    let mut each = Vec::new();
    for name in partition_streams(s) {
        let ingest = tokio::time::timeout(wait, js.get_stream(name))
            .await
            .map_err(|_| format!("reading stream {name} took over {wait:?}"))?
            .map_err(|e| format!("reading stream {name}: {e}"))?;
        each.push(incarnation_of(ingest.cached_info()));
    }
    Ok(queue_incarnation(&each))
}

impl Shared {
    /// The stream of each partition, by number.
    pub(super) fn partition_streams(&self) -> Vec<&str> {
        partition_streams(&self.settings)
    }

    /// The stream a message named `name` (as the queue names it) is in, and its
    /// sequence there; `None` for a partition the queue does not have.
    pub(super) fn stream_of(&self, name: u64) -> Option<(&str, u64)> {
        let streams = self.partition_streams();
        let stream = *streams.get(Position::partition_of(name))?;
        Some((stream, Position::sequence_of(name)))
    }

    /// Each partition's stream: its incarnation, first sequence and its consumer's ack
    /// floor (0 while it has no consumer). Fails when a stream cannot be read.
    pub(super) async fn read_partitions(&self) -> Result<Vec<PartitionRead>, StoreError> {
        let mut out = Vec::new();
        for name in self.partition_streams() {
            let mut ingest = self
                .js
                .get_stream(name)
                .await
                .map_err(|e| StoreError(format!("reading stream {name}: {e}")))?;
            let info = ingest
                .info()
                .await
                .map_err(|e| StoreError(format!("reading stream {name}: {e}")))?;
            let incarnation = incarnation_of(info);
            let first_sequence = info.state.first_sequence;
            let ack_floor = match ingest
                .get_consumer::<consumer::pull::Config>(&self.settings.consumer)
                .await
            {
                Ok(mut c) => c
                    .info()
                    .await
                    .map(|i| i.ack_floor.stream_sequence)
                    .unwrap_or(0),
                Err(_) => 0,
            };
            out.push(PartitionRead {
                incarnation,
                floor: Floor {
                    ack_floor,
                    first_sequence,
                },
            });
        }
        Ok(out)
    }
}

/// A stream's incarnation: its creation time, in ns since the epoch (kept by the server
/// across restarts).
fn incarnation_of(info: &stream::Info) -> u64 {
    u64::try_from(info.created.unix_timestamp_nanos()).unwrap_or(0)
}

/// The queue's incarnation from its streams', by partition: one stream's own, or a
/// hash (FNV-1a, never 0) of every partition's.
pub(super) fn queue_incarnation(each: &[u64]) -> u64 {
    match each {
        [one] => *one,
        several => several
            .iter()
            .flat_map(|i| i.to_le_bytes())
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            })
            .max(1),
    }
}

/// The last message of each partition among `messages` (sorted names), as
/// `(partition, sequence in its stream)`, partitions in order.
pub(super) fn last_of_each(messages: &[u64]) -> Vec<(usize, u64)> {
    let mut out: Vec<(usize, u64)> = Vec::new();
    for &name in messages {
        let (p, seq) = (Position::partition_of(name), Position::sequence_of(name));
        match out.last_mut() {
            Some((last_p, last_seq)) if *last_p == p => *last_seq = (*last_seq).max(seq),
            _ => out.push((p, seq)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_stream_keeps_its_own_incarnation_and_several_change_with_any() {
        assert_eq!(queue_incarnation(&[42]), 42);
        let three = queue_incarnation(&[1, 2, 3]);
        assert_ne!(three, queue_incarnation(&[1, 2, 4]));
        assert_ne!(three, queue_incarnation(&[1, 2]));
        assert_eq!(three, queue_incarnation(&[1, 2, 3]));
    }

    #[test]
    fn a_records_messages_are_read_by_partition() {
        let names = [
            3,
            9,
            Position::in_partition(1, 2),
            Position::in_partition(1, 5),
            Position::in_partition(4, 1),
        ];
        assert_eq!(last_of_each(&names), vec![(0, 9), (1, 5), (4, 1)]);
        assert_eq!(last_of_each(&[]), vec![]);
    }
}
