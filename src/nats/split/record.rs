//! A split's record, what a part carries to find it, and the decisions taken on it:
//! pure, so every one is tested here without a server.
//!
//! The record of a message split by shard says, for each part recorded so far, the
//! stream sequence of the one copy of it whose rows count. A part is recorded once and
//! never changed: by the split that published it, or by the consumer of a copy that
//! came before the split could record it (first writer wins, by compare-and-set).

use std::collections::BTreeMap;

use async_nats::HeaderMap;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The header of a part that names its split's record (its key in the bucket). Parts
/// published before records existed lack it, and are inserted as any message.
pub const RECORD_HEADER: &str = "Sluice-Split-Record";
/// The header of a part that names its shard (0-based).
pub const SHARD_HEADER: &str = "Sluice-Split-Shard";

/// The key of the record of the message at `sequence` in its stream, stored at
/// `published` (ns since the epoch): the time tells a stream made again, numbering its
/// messages from 1 again, from the one before.
pub fn record_key(sequence: u64, published: i128) -> String {
    format!("{sequence}.{published}")
}

/// `(sequence, published)` of a record's key.
pub fn parse_key(key: &str) -> Option<(u64, i128)> {
    let (sequence, published) = key.split_once('.')?;
    Some((sequence.parse().ok()?, published.parse().ok()?))
}

/// What a part says of itself: which split, which shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartOf {
    /// Its split's record ([`record_key`]).
    pub key: Box<str>,
    pub shard: usize,
}

impl PartOf {
    /// The part a message is, from its headers; `None` for any other message (and for
    /// a header that does not read as one).
    pub fn from_headers(headers: Option<&HeaderMap>) -> Option<Self> {
        let headers = headers?;
        let key = headers.get(RECORD_HEADER)?.as_str();
        let shard = headers.get(SHARD_HEADER)?.as_str().parse().ok()?;
        parse_key(key)?;
        Some(Self {
            key: key.into(),
            shard,
        })
    }

    /// The headers that make a message this part.
    pub fn insert_into(&self, headers: &mut HeaderMap) {
        headers.insert(RECORD_HEADER, &*self.key);
        headers.insert(SHARD_HEADER, self.shard.to_string().as_str());
    }
}

/// The value under a split's key: each recorded part's shard and the stream sequence
/// of its copy that counts. JSON (`nats kv get <bucket> <key>`: `{"parts":{"0":17}}`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitRecord {
    parts: BTreeMap<usize, u64>,
}

/// What a split's publishes make of its record.
#[derive(Debug, PartialEq, Eq)]
pub struct Recorded {
    /// The record to write (`None`: nothing new to record).
    pub record: Option<SplitRecord>,
    /// Copies published now that another copy of their part was recorded before:
    /// extra, to be deleted from the stream.
    pub surplus: Vec<u64>,
}

/// What a copy of a part is, by its split's record.
#[derive(Debug, PartialEq, Eq)]
pub enum CopyJudgment {
    /// The copy the record counts.
    Counted,
    /// Another copy of the part is counted.
    Surplus,
    /// The part is not recorded yet: this copy is, if this record can be written over
    /// the one read (first writer wins).
    Claim(SplitRecord),
}

impl SplitRecord {
    pub fn decode(value: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(value)
            .map_err(|e| format!("a split record that cannot be read: {e}"))
    }

    pub fn encode(&self) -> Bytes {
        // A map of integers: serializing it cannot fail.
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }

    /// The shards of `shards` whose parts are not recorded: what a split publishes.
    pub fn unrecorded(&self, shards: &[usize]) -> Vec<usize> {
        shards
            .iter()
            .copied()
            .filter(|s| !self.parts.contains_key(s))
            .collect()
    }

    /// Every part of `shards` recorded: the message may be acked.
    pub fn covers(&self, shards: &[usize]) -> bool {
        self.unrecorded(shards).is_empty()
    }

    /// A split stored the copies `published` (shard, sequence): each part not recorded
    /// yet is recorded with it; a copy of a part recorded with another is surplus (a
    /// duplicate publish answered with the recorded copy's sequence is that copy).
    pub fn with_published(&self, published: &[(usize, u64)]) -> Recorded {
        let mut record = self.clone();
        let mut surplus = Vec::new();
        for &(shard, sequence) in published {
            match record.parts.get(&shard) {
                None => {
                    record.parts.insert(shard, sequence);
                }
                Some(&counted) if counted == sequence => {}
                Some(_) => surplus.push(sequence),
            }
        }
        Recorded {
            record: (record != *self).then_some(record),
            surplus,
        }
    }

    /// What the copy at `sequence` of `shard`'s part is.
    pub fn judge(&self, shard: usize, sequence: u64) -> CopyJudgment {
        match self.parts.get(&shard) {
            Some(&counted) if counted == sequence => CopyJudgment::Counted,
            Some(_) => CopyJudgment::Surplus,
            None => {
                let mut claimed = self.clone();
                claimed.parts.insert(shard, sequence);
                CopyJudgment::Claim(claimed)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(parts: &[(usize, u64)]) -> SplitRecord {
        SplitRecord {
            parts: parts.iter().copied().collect(),
        }
    }

    #[test]
    fn a_split_publishes_only_the_parts_not_recorded_and_is_done_when_all_are() {
        let shards = [0, 1, 2];
        assert_eq!(record(&[]).unrecorded(&shards), vec![0, 1, 2]);
        let half = record(&[(1, 40)]);
        assert_eq!(half.unrecorded(&shards), vec![0, 2]);
        assert!(!half.covers(&shards));
        assert!(record(&[(0, 41), (1, 40), (2, 42)]).covers(&shards));
    }

    #[test]
    fn published_copies_are_recorded_unless_another_copy_of_their_part_was_first() {
        // Part 1 was recorded by the consumer of an earlier copy (40) meanwhile; this
        // split stored 50 and 51: 51 is recorded, 50 is surplus.
        let recorded = record(&[(1, 40)]).with_published(&[(0, 51), (1, 50)]);
        assert_eq!(recorded.record, Some(record(&[(0, 51), (1, 40)])));
        assert_eq!(recorded.surplus, vec![50]);
    }

    #[test]
    fn a_duplicate_publish_answered_with_the_recorded_copy_is_no_surplus_and_writes_nothing() {
        let recorded = record(&[(0, 41), (1, 40)]).with_published(&[(1, 40)]);
        assert_eq!(
            recorded,
            Recorded {
                record: None,
                surplus: Vec::new()
            }
        );
    }

    #[test]
    fn a_copy_is_counted_surplus_or_claims_its_part_first() {
        let r = record(&[(0, 41)]);
        assert_eq!(r.judge(0, 41), CopyJudgment::Counted);
        assert_eq!(r.judge(0, 55), CopyJudgment::Surplus);
        assert_eq!(
            r.judge(1, 56),
            CopyJudgment::Claim(record(&[(0, 41), (1, 56)]))
        );
        // Once claimed, a later copy of the same part is surplus, the claimer counted.
        let claimed = record(&[(0, 41), (1, 56)]);
        assert_eq!(claimed.judge(1, 60), CopyJudgment::Surplus);
        assert_eq!(claimed.judge(1, 56), CopyJudgment::Counted);
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let r = record(&[(0, 41), (3, 7)]);
        assert_eq!(SplitRecord::decode(&r.encode()), Ok(r.clone()));
        assert_eq!(
            r.encode(),
            Bytes::from_static(br#"{"parts":{"0":41,"3":7}}"#)
        );
        assert!(SplitRecord::decode(b"nonsense").is_err());
    }

    #[test]
    fn a_part_reads_its_split_from_its_headers() {
        let part = PartOf {
            key: record_key(17, 1_700_000_000_123_456_789).into(),
            shard: 1,
        };
        let mut headers = HeaderMap::new();
        part.insert_into(&mut headers);
        assert_eq!(PartOf::from_headers(Some(&headers)), Some(part));
        assert_eq!(
            parse_key("17.1700000000123456789"),
            Some((17, 1_700_000_000_123_456_789))
        );
        // A part published before records existed (only `Sluice-Split-From`), any
        // other message, a header that is not a key: no part.
        let mut old = HeaderMap::new();
        old.insert("Sluice-Split-From", "17");
        assert_eq!(PartOf::from_headers(Some(&old)), None);
        assert_eq!(PartOf::from_headers(None), None);
        let mut bad = HeaderMap::new();
        bad.insert(RECORD_HEADER, "x.y");
        bad.insert(SHARD_HEADER, "1");
        assert_eq!(PartOf::from_headers(Some(&bad)), None);
    }
}
