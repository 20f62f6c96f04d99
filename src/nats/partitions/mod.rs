//! The ingest queue in partitions (`[nats] partitions`): past one stream leader.
//!
//! With one partition (the default) the queue is the one stream `[nats] stream` on
//! `<subject_prefix>.>`. With N, it is N streams `<stream>_0` … `<stream>_<N-1>`, stream
//! n on `<subject_prefix>_part.<n>.>`, each with the durable consumer `[nats] consumer`
//! and, in a NATS cluster, a leader of its own: the leaders spread over the nodes, and
//! so does the work of storing and replicating the rows. Every Sluice instance consumes
//! every partition (one ConsumerActor each); the tables take rows from all of them.
//!
//! Where a row goes: the ingest API picks the partition itself, by a hash of the
//! chunk's message id when it has one (a keyed request: a chunk sent again lands in the
//! same stream, whose duplicate window knows it), at random otherwise, so even one
//! table's rows spread over every partition. Other publishers keep publishing on
//! `<subject_prefix>.<tenant>.<table>` (or `….<table>.<key>`, to spread one table by
//! the key): the nats-server's own subject mapping sends each subject to a partition
//! deterministically (`sluice_actors::server_mapping`, printed by `sluice
//! check-config`). A partition's own subjects may also be published on directly.
//!
//! Whether other publishers' subjects reach the queue (the mapping present, made for
//! this N): `route_check.rs` asks the server every minute.
//!
//! Changing N: `retire.rs` drains the streams of the layout before (`INGEST` when
//! partitioned now, `INGEST_<n>` for n past the new count) into the current streams,
//! then removes them.

mod retire;
mod route_check;

use std::sync::Arc;

use async_nats::jetstream;
use sluice_actors::{parse_subject, partition_prefix};

use super::publish::Publisher;
use crate::config::StreamSettings;

pub use retire::keep_retiring;
pub use route_check::{
    check as check_routes, keep_checking as keep_checking_routes, PublisherRoutes,
};

// === impl StreamSettings: the partitions ===

impl StreamSettings {
    /// Whether the queue is partitioned (more than one stream).
    pub fn partitioned(&self) -> bool {
        self.partitions > 1
    }

    /// The settings of partition `n` as a stream of its own: its name, its subjects'
    /// prefix, its share of `max_bytes`. With one partition, these settings.
    pub fn partition(&self, n: usize) -> StreamSettings {
        if !self.partitioned() {
            return self.clone();
        }
        StreamSettings {
            stream: partition_stream(&self.stream, n),
            subject_prefix: partition_prefix(&self.subject_prefix, n),
            max_bytes: (self.max_bytes / self.partitions as u64).max(1),
            partitions: 1,
            ..self.clone()
        }
    }

    /// Every partition's settings, in order.
    pub fn each_partition(&self) -> Vec<StreamSettings> {
        (0..self.partitions.max(1))
            .map(|n| self.partition(n))
            .collect()
    }
}

/// Partition `n`'s stream: `<stream>_<n>`.
pub fn partition_stream(stream: &str, n: usize) -> String {
    format!("{stream}_{n}")
}

/// The partition a chunk goes to: by its message id when it has one (a chunk sent again
/// goes where its first copy went), at random otherwise.
fn partition_for(message_id: Option<&str>, partitions: usize) -> usize {
    if partitions <= 1 {
        return 0;
    }
    let hash = match message_id {
        // FNV-1a: stable across processes and versions, unlike std's hasher.
        Some(id) => id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        }),
        None => rand::random::<u64>(),
    };
    (hash % partitions as u64) as usize
}

/// Where the ingest API publishes: one publisher (with its stream's budget) per
/// partition. Cheap to clone.
#[derive(Clone)]
pub struct IngestStreams {
    /// `[nats] subject_prefix`.
    prefix: Arc<str>,
    /// By partition; one when the queue is not partitioned.
    publishers: Arc<[(Publisher, String)]>,
}

impl IngestStreams {
    /// A publisher for each partition of `settings`, on `js`.
    pub fn new(js: &jetstream::Context, settings: &StreamSettings) -> Self {
        let publishers = settings
            .each_partition()
            .into_iter()
            .map(|p| {
                let publisher = Publisher::new(js.clone(), &p.stream, p.max_bytes);
                (publisher, p.subject_prefix)
            })
            .collect();
        Self {
            prefix: Arc::from(settings.subject_prefix.as_str()),
            publishers,
        }
    }

    /// The publisher of the first partition (its context serves every partition).
    pub fn first(&self) -> &Publisher {
        &self.publishers[0].0
    }

    /// Where a message of `tenant`'s `table` with `message_id` goes: its partition's
    /// publisher and the subject to publish it on.
    pub fn route(
        &self,
        tenant: &str,
        table: &str,
        message_id: Option<&str>,
    ) -> (&Publisher, String) {
        let (publisher, prefix) = self.pick(message_id);
        (publisher, format!("{prefix}.{tenant}.{table}"))
    }

    /// The publisher and subject prefix of the partition a message id goes to.
    fn pick(&self, message_id: Option<&str>) -> (&Publisher, &str) {
        let (publisher, prefix) =
            &self.publishers[partition_for(message_id, self.publishers.len())];
        (publisher, prefix.as_str())
    }

    /// Where a message published on `subject` (of this layout or another: a stream
    /// being retired) goes now, keeping what follows the prefix (tenant, table, key).
    /// `None` for a subject of no ingest stream.
    pub fn reroute(&self, subject: &str, message_id: Option<&str>) -> Option<(&Publisher, String)> {
        parse_subject(&self.prefix, subject)?;
        let after = subject.strip_prefix(&*self.prefix)?;
        let rest = match after.strip_prefix('.') {
            Some(rest) => rest,
            // `_part.<n>.<rest>`
            None => after.split_once('.')?.1.split_once('.')?.1,
        };
        let (publisher, prefix) = self.pick(message_id);
        Some((publisher, format!("{prefix}.{rest}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_id_always_goes_to_the_same_partition_and_ids_spread() {
        let mut seen = [0usize; 3];
        for i in 0..300 {
            let id = format!("k-{i}");
            let n = partition_for(Some(&id), 3);
            assert_eq!(n, partition_for(Some(&id), 3), "{id}");
            seen[n] += 1;
        }
        assert!(seen.iter().all(|&n| n > 60), "{seen:?}");
        assert_eq!(partition_for(Some("x"), 1), 0);
        assert_eq!(partition_for(None, 1), 0);
    }
}
