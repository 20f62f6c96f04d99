//! What the bucket keeps under a key: which request holds it, which body it was used
//! for, and how that request ended. JSON, so an operator can read one with
//! `nats kv get SLUICE_IDEMPOTENCY <key>`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::key::Fingerprint;

/// A key's record.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Record {
    /// A request holds the key: it is reading its body (`body` not known yet) or
    /// publishing its rows. Taken over by another request once older than `lease_ms`
    /// plus [`super::CLOCK_MARGIN`] (its holder crashed, or is past every limit).
    InProgress {
        /// The request holding it (see [`Holder`]).
        #[serde(default)]
        holder: String,
        lease_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body: Option<BodyUse>,
        /// Chunks an earlier request under the key stored (a resumed 503): a request
        /// taking this claim over does not send them either.
        #[serde(default, skip_serializing_if = "ChunkSet::is_empty")]
        stored: ChunkSet,
    },
    /// The request ended with rows not stored (503): the same body sent again stores
    /// the chunks not in `stored`.
    Unfinished { body: BodyUse, stored: ChunkSet },
    /// The request's final answer: the same body sent again gets it again (`reply` is
    /// the answer's JSON body, byte for byte).
    Answered {
        body: BodyUse,
        status: u16,
        reply: String,
    },
}

impl Record {
    /// The body the key was used for, once known.
    pub fn body(&self) -> Option<&BodyUse> {
        match self {
            Record::InProgress { body, .. } => body.as_ref(),
            Record::Unfinished { body, .. } | Record::Answered { body, .. } => Some(body),
        }
    }

    /// `holder`'s claim, of `body` once known, resuming after the `stored` chunks.
    pub fn claim(holder: &Holder, body: Option<BodyUse>, stored: ChunkSet) -> Self {
        Record::InProgress {
            holder: holder.id.clone(),
            lease_ms: u64::try_from(holder.lease.as_millis()).unwrap_or(u64::MAX),
            body,
            stored,
        }
    }

    /// Whether this is a claim of the request named `holder`.
    pub fn claimed_by(&self, holder: &str) -> bool {
        matches!(self, Record::InProgress { holder: h, .. } if h == holder)
    }

    pub fn encode(&self) -> bytes::Bytes {
        // A record is plain data: serializing it cannot fail.
        serde_json::to_vec(self).unwrap_or_default().into()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("an unreadable record: {e}"))
    }
}

/// The request holding a claim, named at random: a claim whose write timed out (NATS
/// frozen, the network cut) may still land later, and its request, which answered
/// 503 meanwhile, must still be able to tell it for its own and remove it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub id: String,
    /// How long its claim holds the key.
    pub lease: Duration,
}

impl Holder {
    pub fn new(lease: Duration) -> Self {
        use rand::RngExt as _;
        Self {
            id: format!("{:016x}", rand::rng().random::<u64>()),
            lease,
        }
    }
}

/// A body sent under a key, and how it was split: a request resuming it splits it
/// the same way whatever the configuration says now, so its chunks are the same
/// chunks (the same rows under the same message ids).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BodyUse {
    pub fingerprint: Fingerprint,
    pub split: Split,
}

/// The limits that decide which rows a body holds and how they are chunked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    /// Rows per message at most (`[api] chunk_rows`).
    pub chunk_rows: usize,
    /// Bytes per message at most (`[api] chunk_bytes`, within the server's payload).
    pub chunk_bytes: usize,
    /// A longer row is refused (`[api] max_row_bytes`, within the payload).
    pub row_bytes: usize,
    /// A deeper row is refused (`[api] max_json_depth`).
    pub depth: usize,
}

/// Chunk indexes, as sorted, disjoint, non-adjacent half-open ranges: a request stores
/// its chunks in order, so this is one range, or a few after a failure (at most the
/// acks in flight then).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ChunkSet(Vec<[usize; 2]>);

impl ChunkSet {
    pub fn contains(&self, index: usize) -> bool {
        let at = self.0.partition_point(|[_, end]| *end <= index);
        self.0.get(at).is_some_and(|[start, _]| *start <= index)
    }

    pub fn insert(&mut self, index: usize) {
        if self.contains(index) {
            return;
        }
        // The first range ending at or after `index`.
        let at = self.0.partition_point(|[_, end]| *end < index);
        let joins_before = self.0.get(at).is_some_and(|[_, end]| *end == index);
        let next = if joins_before { at + 1 } else { at };
        let joins_after = self
            .0
            .get(next)
            .is_some_and(|[start, _]| *start == index + 1);
        match (joins_before, joins_after) {
            (true, true) => {
                self.0[at][1] = self.0[next][1];
                self.0.remove(next);
            }
            (true, false) => self.0[at][1] = index + 1,
            (false, true) => self.0[next][0] = index,
            (false, false) => self.0.insert(at, [index, index + 1]),
        }
    }

    /// Adds every index of `other`.
    pub fn extend(&mut self, other: &ChunkSet) {
        let mut all: Vec<[usize; 2]> = self.0.iter().chain(&other.0).copied().collect();
        all.sort_unstable();
        let mut merged: Vec<[usize; 2]> = Vec::with_capacity(all.len());
        for [start, end] in all {
            match merged.last_mut() {
                Some(last) if start <= last[1] => last[1] = last[1].max(end),
                _ => merged.push([start, end]),
            }
        }
        self.0 = merged;
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_sets_merge_neighbours_and_answer_membership() {
        let mut set = ChunkSet::default();
        assert!(set.is_empty() && !set.contains(0));
        for i in [0, 1, 2, 5, 7, 6, 3] {
            set.insert(i);
        }
        assert_eq!(set.0, vec![[0, 4], [5, 8]]);
        set.insert(4);
        assert_eq!(set.0, vec![[0, 8]]);
        set.insert(10);
        set.insert(8);
        assert_eq!(set.0, vec![[0, 9], [10, 11]]);
        assert!(set.contains(0) && set.contains(8) && set.contains(10));
        assert!(!set.contains(9) && !set.contains(11));
        let mut other = ChunkSet::default();
        other.insert(9);
        other.insert(20);
        set.extend(&other);
        assert_eq!(set.0, vec![[0, 11], [20, 21]]);
        assert_eq!(serde_json::to_string(&set).unwrap(), "[[0,11],[20,21]]");
    }

    #[test]
    fn records_read_back_as_written() {
        let body = BodyUse {
            fingerprint: super::super::key::Fingerprint::of(
                super::super::super::parse::Framing::Json,
                b"{}",
            ),
            split: Split {
                chunk_rows: 100,
                chunk_bytes: 1 << 20,
                row_bytes: 1 << 20,
                depth: 64,
            },
        };
        let holder = Holder {
            id: "00000000000000aa".into(),
            lease: Duration::from_secs(60),
        };
        let claim = Record::claim(&holder, None, ChunkSet::default());
        let text = String::from_utf8(claim.encode().to_vec()).unwrap();
        assert_eq!(
            text,
            r#"{"state":"in_progress","holder":"00000000000000aa","lease_ms":60000}"#
        );
        assert!(Record::decode(text.as_bytes())
            .unwrap()
            .claimed_by(&holder.id));
        assert!(!claim.claimed_by("00000000000000ab"));
        assert_ne!(Holder::new(holder.lease).id, Holder::new(holder.lease).id);
        let mut stored = ChunkSet::default();
        stored.insert(0);
        let unfinished = Record::Unfinished {
            body: body.clone(),
            stored,
        };
        match Record::decode(&unfinished.encode()).unwrap() {
            Record::Unfinished { body: b, stored } => {
                assert_eq!(b, body);
                assert!(stored.contains(0));
            }
            other => panic!("{other:?}"),
        }
        let answered = Record::Answered {
            body: body.clone(),
            status: 202,
            reply: r#"{"accepted":1}"#.into(),
        };
        match Record::decode(&answered.encode()).unwrap() {
            Record::Answered { status, reply, .. } => {
                assert_eq!((status, reply.as_str()), (202, r#"{"accepted":1}"#));
            }
            other => panic!("{other:?}"),
        }
        assert!(Record::decode(b"nonsense").is_err());
    }
}
