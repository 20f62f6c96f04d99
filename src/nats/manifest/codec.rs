//! A manifest's wire form: the value of its key in the bucket.
//!
//! Written before a batch's first insert, again for each split of its isolation, once
//! more with its verdicts (and once with the rows parked, when it has rejected ones), so
//! it must be small: a 10,000-message batch as JSON would cost ~70 KB per write. Here
//! the messages are LEB128 varints, the first sequence and then the gaps between
//! ascending sequences (a batch's messages are mostly consecutive: one byte each).
//!
//! ```text
//! version (4)   u8
//! state         u8: 0 open, 1 settled, 2 split
//! tenant, table varint length + UTF-8 each
//! messages      varint count, varint first sequence, varint gap to each next one
//! claimed at    varint ms since the epoch (0: unknown)
//! shard         varint: the shard of its target the batch goes to (0-based)
//! claimed as    varint: the bucket's revision of the batch's claim (0: not known yet)
//! settled:      varint count, then per rejected row: varint stream sequence, varint
//!               line, u8 class, varint code + 1 (0: none), varint length + UTF-8 error
//!               (at most 1 KiB, as on the DLQ), u8 parked (0, 1)
//! split:        varint count + (varint lo, varint hi) per untried range, in the order
//!               the isolation keeps them; the same for the inserted ranges; varint
//!               count, then per rejected row: varint row, u8 class, varint code + 1,
//!               varint length + UTF-8 error
//! ```
//!
//! Version 1 (open and settled only, no parked flag) is still read: a record written
//! before tokens named the stream's incarnation comes back with incarnation 0, so its
//! batch keeps the token its first attempts carried. Version 2 (no shard) is read as
//! shard 0: it was written when every target was one server (its shard 0). Version 3
//! (no claim revision) is read with 0: its claim is ordered by the revision it is read
//! at, as that Sluice did.
//!
//! The id is not stored: it is a function of the messages, and the reader checks it
//! against the key (a value that does not match its key is refused). Nor is the
//! incarnation: it is part of the key.

use bytes::{BufMut, Bytes, BytesMut};
use sluice_actors::ledger::{RowRange, Split, SplitRejection};
use sluice_actors::{Class, Manifest, ManifestState, RejectedRow, TableKey};

use crate::nats::error_text::{truncate, MAX_ERROR_HEADER};

const VERSION: u8 = 4;
/// Open and settled only, no parked flag, and no incarnation in the token.
const VERSION_1: u8 = 1;
/// No shard.
const VERSION_2: u8 = 2;
/// No claim revision.
const VERSION_3: u8 = 3;
const OPEN: u8 = 0;
const SETTLED: u8 = 1;
const SPLIT: u8 = 2;

/// Why a value cannot be read as a manifest.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("manifest format version {0} is unknown to this Sluice (written by a newer one?)")]
    Version(u8),
    #[error("the manifest ends early")]
    Truncated,
    #[error("the manifest is malformed: {0}")]
    Malformed(&'static str),
}

/// The value to store for `m`.
pub fn encode(m: &Manifest) -> Bytes {
    let mut out = BytesMut::with_capacity(16 + m.messages.len() + m.table.table.len());
    out.put_u8(VERSION);
    out.put_u8(match m.state {
        ManifestState::Open => OPEN,
        ManifestState::Settled { .. } => SETTLED,
        ManifestState::Split(_) => SPLIT,
    });
    put_str(&mut out, &m.table.tenant);
    put_str(&mut out, &m.table.table);
    put_varint(&mut out, m.messages.len() as u64);
    let mut previous = 0u64;
    for (i, &seq) in m.messages.iter().enumerate() {
        // Ascending by construction (`Manifest::new` sorts); a gap is never negative.
        put_varint(&mut out, if i == 0 { seq } else { seq - previous });
        previous = seq;
    }
    put_varint(&mut out, m.claimed_at_ms);
    put_varint(&mut out, u64::from(m.shard));
    put_varint(&mut out, m.claim_revision);
    match &m.state {
        ManifestState::Open => {}
        ManifestState::Settled { rejected } => {
            put_varint(&mut out, rejected.len() as u64);
            for r in rejected {
                put_varint(&mut out, r.stream_sequence);
                put_varint(&mut out, u64::from(r.line));
                put_reason(&mut out, r.class, r.code, &r.error);
                out.put_u8(u8::from(r.parked));
            }
        }
        ManifestState::Split(split) => {
            for ranges in [&split.untried, &split.inserted] {
                put_varint(&mut out, ranges.len() as u64);
                for r in ranges {
                    put_varint(&mut out, u64::from(r.lo));
                    put_varint(&mut out, u64::from(r.hi));
                }
            }
            put_varint(&mut out, split.rejected.len() as u64);
            for r in &split.rejected {
                put_varint(&mut out, u64::from(r.row));
                put_reason(&mut out, r.class, r.code, &r.error);
            }
        }
    }
    out.freeze()
}

/// The manifest a value of a key of the ingest stream's `incarnation` holds.
pub fn decode(value: &[u8], incarnation: u64) -> Result<Manifest, DecodeError> {
    let mut r = Reader(value);
    let version = r.u8()?;
    if ![VERSION, VERSION_3, VERSION_2, VERSION_1].contains(&version) {
        return Err(DecodeError::Version(version));
    }
    let state = r.u8()?;
    let tenant = r.str()?;
    let table = r.str()?;
    let count = r.len()?;
    let mut messages = Vec::with_capacity(count);
    let mut seq = 0u64;
    for i in 0..count {
        let step = r.varint()?;
        if i > 0 && step == 0 {
            return Err(DecodeError::Malformed("a message listed twice"));
        }
        seq = seq
            .checked_add(step)
            .ok_or(DecodeError::Malformed("a sequence past 2^64"))?;
        messages.push(seq);
    }
    let incarnation = if version == VERSION_1 { 0 } else { incarnation };
    let claimed_at = if version == VERSION_1 { 0 } else { r.varint()? };
    let shard = if version >= VERSION_3 { r.u32()? } else { 0 };
    let claim_revision = if version == VERSION { r.varint()? } else { 0 };
    let mut manifest = Manifest::new(TableKey::new(tenant, table), incarnation, messages)
        .claimed_at(claimed_at)
        .on_shard(shard)
        .claimed_as(claim_revision);
    manifest.state = match state {
        OPEN => ManifestState::Open,
        SETTLED => {
            let count = r.len()?;
            let mut rejected = Vec::with_capacity(count);
            for _ in 0..count {
                let stream_sequence = r.varint()?;
                let line = r.u32()?;
                let (class, code, error) = r.reason()?;
                let parked = version != VERSION_1 && r.flag()?;
                rejected.push(RejectedRow {
                    stream_sequence,
                    line,
                    class,
                    code,
                    error,
                    parked,
                });
            }
            ManifestState::Settled { rejected }
        }
        SPLIT if version != VERSION_1 => {
            let untried = r.ranges()?;
            let inserted = r.ranges()?;
            let count = r.len()?;
            let mut rejected = Vec::with_capacity(count);
            for _ in 0..count {
                let row = r.u32()?;
                let (class, code, error) = r.reason()?;
                rejected.push(SplitRejection {
                    row,
                    class,
                    code,
                    error,
                });
            }
            ManifestState::Split(Split {
                untried,
                inserted,
                rejected,
            })
        }
        _ => return Err(DecodeError::Malformed("an unknown state")),
    };
    if !r.0.is_empty() {
        return Err(DecodeError::Malformed("bytes after the end"));
    }
    Ok(manifest)
}

fn put_reason(out: &mut BytesMut, class: Class, code: Option<u32>, error: &str) {
    out.put_u8(class_byte(class));
    put_varint(out, code.map_or(0, |c| u64::from(c) + 1));
    put_str(out, truncate(error, MAX_ERROR_HEADER));
}

fn class_byte(class: Class) -> u8 {
    match class {
        Class::Rejected => 0,
        Class::Unavailable => 1,
        Class::Denied => 2,
        Class::Unknown => 3,
    }
}

fn class_of(byte: u8) -> Result<Class, DecodeError> {
    Ok(match byte {
        0 => Class::Rejected,
        1 => Class::Unavailable,
        2 => Class::Denied,
        3 => Class::Unknown,
        _ => return Err(DecodeError::Malformed("an unknown error class")),
    })
}

fn put_varint(out: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        out.put_u8((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.put_u8(v as u8);
}

fn put_str(out: &mut BytesMut, s: &str) {
    put_varint(out, s.len() as u64);
    out.put_slice(s.as_bytes());
}

/// Reads a value front to back.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn u8(&mut self) -> Result<u8, DecodeError> {
        let (&b, rest) = self.0.split_first().ok_or(DecodeError::Truncated)?;
        self.0 = rest;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError::Malformed("a varint longer than 10 bytes"))
    }

    /// A count or length: never more than the bytes left (each item takes one at least),
    /// so a corrupt value cannot make the reader reserve gigabytes.
    fn len(&mut self) -> Result<usize, DecodeError> {
        let n = self.varint()?;
        if n > self.0.len() as u64 {
            return Err(DecodeError::Truncated);
        }
        Ok(n as usize)
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        u32::try_from(self.varint()?).map_err(|_| DecodeError::Malformed("a number past 2^32"))
    }

    fn flag(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::Malformed("a flag that is neither 0 nor 1")),
        }
    }

    /// A class, a code and an error, as `put_reason` writes them.
    fn reason(&mut self) -> Result<(Class, Option<u32>, String), DecodeError> {
        let class = class_of(self.u8()?)?;
        let code = match self.varint()? {
            0 => None,
            c => {
                Some(u32::try_from(c - 1).map_err(|_| DecodeError::Malformed("a code past 2^32"))?)
            }
        };
        Ok((class, code, self.str()?.to_string()))
    }

    fn ranges(&mut self) -> Result<Vec<RowRange>, DecodeError> {
        let count = self.len()?;
        let mut ranges = Vec::with_capacity(count);
        for _ in 0..count {
            let (lo, hi) = (self.u32()?, self.u32()?);
            if lo >= hi {
                return Err(DecodeError::Malformed("an empty range of rows"));
            }
            ranges.push(RowRange { lo, hi });
        }
        Ok(ranges)
    }

    fn str(&mut self) -> Result<&'a str, DecodeError> {
        let n = self.len()?;
        let (s, rest) = self.0.split_at(n);
        self.0 = rest;
        std::str::from_utf8(s).map_err(|_| DecodeError::Malformed("text that is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INCARNATION: u64 = 1_750_000_000_123_456_789;

    fn key() -> TableKey {
        TableKey::new("acme", "events")
    }

    fn manifest(messages: Vec<u64>) -> Manifest {
        Manifest::new(key(), INCARNATION, messages).claimed_at(1_764_660_000_000)
    }

    fn rejected(
        stream_sequence: u64,
        line: u32,
        class: Class,
        code: Option<u32>,
        error: &str,
    ) -> RejectedRow {
        RejectedRow {
            stream_sequence,
            line,
            class,
            code,
            error: error.into(),
            parked: false,
        }
    }

    fn round_trip(m: &Manifest) -> Manifest {
        decode(&encode(m), INCARNATION).expect("decodes")
    }

    #[test]
    fn an_open_manifest_round_trips() {
        let m = manifest(vec![5, 3, 1_000_000, 4, u64::MAX]);
        let back = round_trip(&m);
        assert_eq!(back, m);
        assert_eq!(back.id, m.id);
        assert_eq!(back.token(), m.token());
    }

    #[test]
    fn a_settled_manifest_round_trips_with_its_rejected_rows_and_what_is_parked() {
        let mut m = manifest(vec![10, 11, 40]);
        m.state = ManifestState::Settled {
            rejected: vec![
                rejected(
                    11,
                    3,
                    Class::Rejected,
                    Some(27),
                    "Cannot parse input: expected \" before: x",
                ),
                RejectedRow {
                    parked: true,
                    ..rejected(40, 0, Class::Unknown, None, "")
                },
                rejected(40, 1, Class::Rejected, Some(0), "zero is a code too"),
            ],
        };
        assert_eq!(round_trip(&m), m);
        let empty = m.with_state(ManifestState::Settled { rejected: vec![] });
        assert_eq!(round_trip(&empty), empty);
    }

    #[test]
    fn a_split_round_trips_in_the_order_the_isolation_keeps_it() {
        let m = manifest(vec![1, 2, 3]).with_state(ManifestState::Split(Split {
            untried: vec![
                RowRange { lo: 700, hi: 1000 },
                RowRange { lo: 500, hi: 700 },
            ],
            inserted: vec![RowRange { lo: 0, hi: 499 }],
            rejected: vec![SplitRejection {
                row: 499,
                class: Class::Rejected,
                code: Some(27),
                error: "Cannot parse input".into(),
            }],
        }));
        assert_eq!(round_trip(&m), m);
    }

    #[test]
    fn the_shard_a_batch_goes_to_is_in_its_record() {
        let m = manifest(vec![7, 8]).on_shard(3);
        let back = round_trip(&m);
        assert_eq!(back.shard, 3);
        assert_eq!(back, m);
        let settled = m.with_state(ManifestState::Settled { rejected: vec![] });
        assert_eq!(round_trip(&settled).shard, 3);
    }

    #[test]
    fn the_claim_revision_stays_with_every_state_of_the_batch() {
        let m = manifest(vec![7, 8]).claimed_as(4242);
        assert_eq!(round_trip(&m).claim_revision, 4242);
        let settled = m.with_state(ManifestState::Settled { rejected: vec![] });
        assert_eq!(round_trip(&settled).claim_revision, 4242);
        assert_eq!(
            settled.claim_order(9000),
            4242,
            "the claim's, not the state's"
        );
        assert_eq!(
            manifest(vec![7, 8]).claim_order(9000),
            9000,
            "unknown: as read"
        );
    }

    #[test]
    fn a_version_3_record_is_ordered_by_the_revision_it_is_read_at() {
        // Written by the Sluice before claim revisions: version 3, open, acme.events,
        // [4, 5], claimed at 1000 ms, shard 1.
        let v3 = [
            3, OPEN, 4, b'a', b'c', b'm', b'e', 6, b'e', b'v', b'e', b'n', b't', b's', 2, 4, 1,
            0xe8, 0x07, 1,
        ];
        let m = decode(&v3, INCARNATION).expect("decodes");
        assert_eq!(
            (
                m.messages.clone(),
                m.shard,
                m.claimed_at_ms,
                m.claim_revision
            ),
            (vec![4, 5], 1, 1000, 0)
        );
        assert_eq!(m.token(), manifest(vec![4, 5]).token());
    }

    #[test]
    fn a_version_2_record_goes_to_shard_0_with_its_token() {
        // Written by the Sluice before shards: version 2, open, acme.events, [4, 5],
        // claimed at 1000 ms.
        let v2 = [
            2, OPEN, 4, b'a', b'c', b'm', b'e', 6, b'e', b'v', b'e', b'n', b't', b's', 2, 4, 1,
            0xe8, 0x07,
        ];
        let m = decode(&v2, INCARNATION).expect("decodes");
        assert_eq!(
            (m.messages.clone(), m.shard, m.claimed_at_ms),
            (vec![4, 5], 0, 1000)
        );
        assert_eq!(
            m.token(),
            manifest(vec![4, 5]).token(),
            "the same token as before"
        );
    }

    #[test]
    fn a_version_1_record_keeps_the_token_its_first_attempts_carried() {
        // Written by the Sluice before this one: version 1, open, acme.events, [4, 5].
        let v1 = [
            1, OPEN, 4, b'a', b'c', b'm', b'e', 6, b'e', b'v', b'e', b'n', b't', b's', 2, 4, 1,
        ];
        let m = decode(&v1, INCARNATION).expect("decodes");
        assert_eq!(m.messages, vec![4, 5]);
        assert_eq!(m.token(), format!("sluice-{}", m.id));
        let now = manifest(vec![4, 5]);
        assert_ne!(now.token(), m.token(), "a new record names the incarnation");
    }

    #[test]
    fn an_error_is_kept_to_1_kib_at_a_character_boundary() {
        let mut m = manifest(vec![1]);
        m.state = ManifestState::Settled {
            rejected: vec![rejected(
                1,
                0,
                Class::Rejected,
                Some(117),
                &"é".repeat(2000),
            )],
        };
        let back = round_trip(&m);
        let ManifestState::Settled { rejected } = back.state else {
            panic!("settled")
        };
        assert_eq!(rejected[0].error.len(), 1024);
        assert!(rejected[0].error.chars().all(|c| c == 'é'));
    }

    #[test]
    fn ten_thousand_messages_cost_about_a_byte_each() {
        // A full default batch: consecutive sequences but for a few gaps (acked rows of
        // other tables in between), high in a long-lived stream.
        let first = 3_000_000_000u64;
        let messages: Vec<u64> = (0..10_000u64)
            .map(|i| first + i + (i / 1000) * 17)
            .collect();
        let mut m = manifest(messages);
        let open = encode(&m);
        assert!(
            open.len() < 10_100,
            "{} bytes for 10,000 messages",
            open.len()
        );
        m.state = ManifestState::Settled {
            rejected: vec![rejected(
                first + 5,
                0,
                Class::Rejected,
                Some(27),
                "Cannot parse input",
            )],
        };
        let settled = encode(&m);
        assert!(settled.len() < 10_150, "{} bytes", settled.len());
        assert_eq!(round_trip(&m), m);
        // Against the JSON it replaces: the messages alone.
        let json = serde_json::to_vec(&m.messages).expect("json");
        assert!(
            json.len() > 7 * open.len(),
            "{} vs {}",
            json.len(),
            open.len()
        );
    }

    #[test]
    fn bad_values_are_refused_with_the_reason() {
        let m = manifest(vec![1, 2, 3]);
        let good = encode(&m);
        assert_eq!(decode(&[], INCARNATION), Err(DecodeError::Truncated));
        assert_eq!(decode(&[5, 0], INCARNATION), Err(DecodeError::Version(5)));
        for cut in 1..good.len() {
            assert!(decode(&good[..cut], INCARNATION).is_err(), "cut at {cut}");
        }
        let mut longer = good.to_vec();
        longer.push(0);
        assert!(matches!(
            decode(&longer, INCARNATION),
            Err(DecodeError::Malformed(_))
        ));
        let mut state = good.to_vec();
        state[1] = 7;
        assert!(matches!(
            decode(&state, INCARNATION),
            Err(DecodeError::Malformed(_))
        ));
        let mut v1_split = good.to_vec();
        v1_split[0] = VERSION_1;
        v1_split[1] = SPLIT;
        assert!(matches!(
            decode(&v1_split, INCARNATION),
            Err(DecodeError::Malformed(_))
        ));
        // A count far past the value's length reserves nothing.
        let mut huge = vec![VERSION, OPEN, 1, b'a', 1, b'b'];
        huge.extend([0xff, 0xff, 0xff, 0xff, 0x0f]);
        huge.push(0);
        assert_eq!(decode(&huge, INCARNATION), Err(DecodeError::Truncated));
    }
}
