//! One split of a message, from its record read to its last part recorded.
//!
//! 1. Read the record; none: create it (empty, create-only), unless the message is gone
//!    from the stream already (a delivery of it held past its ack: it was split and
//!    acked, and its record removed since), and then nothing is published.
//! 2. Publish the parts the record does not name yet, under the same ids as ever (a
//!    copy JetStream still remembers is answered with its sequence, not stored again).
//! 3. Record each stored copy for its part, compare-and-set on the revision read; a
//!    part someone recorded meanwhile (the consumer of an earlier copy) keeps its copy,
//!    and the one stored here is surplus: deleted from the stream.
//! 4. Every part recorded: the caller acks the message. A publish that failed (the
//!    stream full for a big part) fails the split after what was stored is recorded:
//!    the next split publishes only what is left.

use bytes::Bytes;
use futures::future::join_all;

use super::record::{record_key, PartOf, SplitRecord};
use super::{Read, SplitRecords, WRITES_TRIED};
use crate::nats::publish::Publisher;

/// The header of a part of a message split by shard: the stream sequence of the
/// message it came from (see `Delivery::split`; its record and shard are in the
/// headers of [`super`]).
pub const SPLIT_FROM_HEADER: &str = "Sluice-Split-From";

/// A message to split.
pub struct SplitJob<'a> {
    /// The subject its parts are published on (its own).
    pub subject: &'a str,
    /// Where it is in its stream, and when it was stored.
    pub sequence: u64,
    pub published: i128,
    /// `<stream>-<sequence>-<publish time>`, the stem of its parts' message ids.
    pub place: &'a str,
    /// Its rows by shard.
    pub parts: Vec<(usize, Bytes)>,
    /// The tests' failpoint: abort once the parts are stored, before they are recorded.
    pub crash_after_parts: bool,
}

/// What became of a split that went through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitOutcome {
    /// Every part is recorded: ack the message.
    Recorded,
    /// No record, and the message is gone from the stream: it was split and acked
    /// before; nothing was published. Ack this delivery of it (a no-op).
    SplitBefore,
}

/// Split `job`'s message (see the module's doc). `Err`: the message must come again.
pub async fn split(
    records: &SplitRecords,
    ingest: &Publisher,
    job: SplitJob<'_>,
) -> Result<SplitOutcome, String> {
    let key = record_key(job.sequence, job.published);
    let Some((mut record, mut revision)) = open(records, &key, &job).await? else {
        return Ok(SplitOutcome::SplitBefore);
    };
    let shards: Vec<usize> = job.parts.iter().map(|(shard, _)| *shard).collect();
    let unrecorded = record.unrecorded(&shards);
    let (stored, failed) = publish(&key, ingest, &job, &unrecorded).await;
    if job.crash_after_parts && !stored.is_empty() {
        tracing::error!("failpoint: crashing on purpose after a split message's parts are stored");
        std::process::abort();
    }
    let mut written = stored.is_empty();
    for _ in 0..WRITES_TRIED {
        let recorded = record.with_published(&stored);
        let Some(next) = recorded.record else {
            join_all(recorded.surplus.into_iter().map(|s| records.delete_copy(s))).await;
            written = true;
            break;
        };
        if records.write(&key, &next, revision).await?.is_some() {
            record = next;
            join_all(recorded.surplus.into_iter().map(|s| records.delete_copy(s))).await;
            written = true;
            break;
        }
        match records.read(&key).await? {
            Read::Held(now, at) => (record, revision) = (now, at),
            Read::Vacant(_) => {
                return Err(format!(
                    "the split record {key} went while its message was being split"
                ))
            }
        }
    }
    if !written {
        return Err(format!(
            "the split record {key} changed under each of {WRITES_TRIED} writes"
        ));
    }
    if let Some(e) = failed {
        return Err(e);
    }
    if !record.covers(&shards) {
        return Err(format!("the split record {key} does not name every part"));
    }
    Ok(SplitOutcome::Recorded)
}

/// The record of `job`'s split and its revision, created when there is none; `None`:
/// none, and the message is gone from the stream (split and acked before).
async fn open(
    records: &SplitRecords,
    key: &str,
    job: &SplitJob<'_>,
) -> Result<Option<(SplitRecord, u64)>, String> {
    for _ in 0..WRITES_TRIED {
        match records.read(key).await? {
            Read::Held(record, revision) => return Ok(Some((record, revision))),
            Read::Vacant(expected) => {
                if !records.original_in_stream(job.sequence).await? {
                    return Ok(None);
                }
                let empty = SplitRecord::default();
                if let Some(revision) = records.write(key, &empty, expected).await? {
                    return Ok(Some((empty, revision)));
                }
            }
        }
    }
    Err(format!(
        "the split record {key} changed under each of {WRITES_TRIED} reads"
    ))
}

/// Publish the parts of `shards`, each sent before any is confirmed: the copies stored
/// (shard, sequence: a duplicate's is its first copy's), and the first failure.
async fn publish(
    key: &str,
    ingest: &Publisher,
    job: &SplitJob<'_>,
    shards: &[usize],
) -> (Vec<(usize, u64)>, Option<String>) {
    let failed = |e| format!("publishing a part of a message split by shard: {e}");
    let mut sent = Vec::with_capacity(shards.len());
    let mut failure = None;
    for (shard, rows) in job.parts.iter().filter(|(s, _)| shards.contains(s)) {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(SPLIT_FROM_HEADER, job.sequence.to_string().as_str());
        PartOf {
            key: key.into(),
            shard: *shard,
        }
        .insert_into(&mut headers);
        let id = format!("part-{}-{shard}", job.place);
        match ingest
            .send(
                job.subject.to_owned(),
                rows.clone(),
                Some(headers),
                Some(&id),
            )
            .await
        {
            Ok(pending) => sent.push((*shard, pending)),
            Err(e) => {
                failure.get_or_insert_with(|| failed(e));
            }
        }
    }
    let mut stored = Vec::with_capacity(sent.len());
    for (shard, pending) in sent {
        match Publisher::confirm(pending).await {
            Ok(published) => stored.push((shard, published.sequence)),
            Err(e) => {
                failure.get_or_insert_with(|| failed(e));
            }
        }
    }
    (stored, failure)
}
