//! A manifest's wire form: the value of its key in the bucket.
//!
//! Written once before a batch's first insert and once more with its verdicts, so it
//! must be small: a 10,000-message batch as JSON would cost ~70 KB per write. Here the
//! messages are LEB128 varints, the first sequence and then the gaps between ascending
//! sequences (a batch's messages are mostly consecutive: one byte each).
//!
//! ```text
//! version (1)   u8
//! state         u8: 0 open, 1 settled
//! tenant, table varint length + UTF-8 each
//! messages      varint count, varint first sequence, varint gap to each next one
//! rejected      (settled only) varint count, then per row: varint stream sequence,
//!               varint line, u8 class, varint code + 1 (0: none), varint length +
//!               UTF-8 error (at most 1 KiB, as on the DLQ)
//! ```
//!
//! The id is not stored: it is a function of the messages, and the reader checks it
//! against the key (a value that does not match its key is refused).

use bytes::{BufMut, Bytes, BytesMut};
use sluice_actors::{Class, Manifest, ManifestState, RejectedRow, TableKey};

use crate::nats::delivery::{truncate, MAX_ERROR_HEADER};

const VERSION: u8 = 1;
const OPEN: u8 = 0;
const SETTLED: u8 = 1;

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
    if let ManifestState::Settled { rejected } = &m.state {
        put_varint(&mut out, rejected.len() as u64);
        for r in rejected {
            put_varint(&mut out, r.stream_sequence);
            put_varint(&mut out, u64::from(r.line));
            out.put_u8(class_byte(r.class));
            put_varint(&mut out, r.code.map_or(0, |c| u64::from(c) + 1));
            put_str(&mut out, truncate(&r.error, MAX_ERROR_HEADER));
        }
    }
    out.freeze()
}

/// The manifest a value holds.
pub fn decode(value: &[u8]) -> Result<Manifest, DecodeError> {
    let mut r = Reader(value);
    let version = r.u8()?;
    if version != VERSION {
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
    let mut manifest = Manifest::new(TableKey::new(tenant, table), messages);
    manifest.state = match state {
        OPEN => ManifestState::Open,
        SETTLED => {
            let count = r.len()?;
            let mut rejected = Vec::with_capacity(count);
            for _ in 0..count {
                rejected.push(RejectedRow {
                    stream_sequence: r.varint()?,
                    line: u32::try_from(r.varint()?)
                        .map_err(|_| DecodeError::Malformed("a line past 2^32"))?,
                    class: class_of(r.u8()?)?,
                    code: match r.varint()? {
                        0 => None,
                        c => Some(
                            u32::try_from(c - 1)
                                .map_err(|_| DecodeError::Malformed("a code past 2^32"))?,
                        ),
                    },
                    error: r.str()?.to_string(),
                });
            }
            ManifestState::Settled { rejected }
        }
        _ => return Err(DecodeError::Malformed("an unknown state")),
    };
    if !r.0.is_empty() {
        return Err(DecodeError::Malformed("bytes after the end"));
    }
    Ok(manifest)
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

    fn key() -> TableKey {
        TableKey::new("acme", "events")
    }

    #[test]
    fn an_open_manifest_round_trips() {
        let m = Manifest::new(key(), vec![5, 3, 1_000_000, 4, u64::MAX]);
        let back = decode(&encode(&m)).expect("decodes");
        assert_eq!(back, m);
        assert_eq!(back.id, m.id);
    }

    #[test]
    fn a_settled_manifest_round_trips_with_its_rejected_rows() {
        let mut m = Manifest::new(key(), vec![10, 11, 40]);
        m.state = ManifestState::Settled {
            rejected: vec![
                RejectedRow {
                    stream_sequence: 11,
                    line: 3,
                    class: Class::Rejected,
                    code: Some(27),
                    error: "Cannot parse input: expected \" before: x".into(),
                },
                RejectedRow {
                    stream_sequence: 40,
                    line: 0,
                    class: Class::Unknown,
                    code: None,
                    error: String::new(),
                },
                RejectedRow {
                    stream_sequence: 40,
                    line: 1,
                    class: Class::Rejected,
                    code: Some(0),
                    error: "zero is a code too".into(),
                },
            ],
        };
        assert_eq!(decode(&encode(&m)).expect("decodes"), m);
        let mut empty = m.clone();
        empty.state = ManifestState::Settled { rejected: vec![] };
        assert_eq!(decode(&encode(&empty)).expect("decodes"), empty);
    }

    #[test]
    fn an_error_is_kept_to_1_kib_at_a_character_boundary() {
        let mut m = Manifest::new(key(), vec![1]);
        m.state = ManifestState::Settled {
            rejected: vec![RejectedRow {
                stream_sequence: 1,
                line: 0,
                class: Class::Rejected,
                code: Some(117),
                error: "é".repeat(2000),
            }],
        };
        let back = decode(&encode(&m)).expect("decodes");
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
        let mut m = Manifest::new(key(), messages);
        let open = encode(&m);
        assert!(
            open.len() < 10_100,
            "{} bytes for 10,000 messages",
            open.len()
        );
        m.state = ManifestState::Settled {
            rejected: vec![RejectedRow {
                stream_sequence: first + 5,
                line: 0,
                class: Class::Rejected,
                code: Some(27),
                error: "Cannot parse input".into(),
            }],
        };
        let settled = encode(&m);
        assert!(settled.len() < 10_150, "{} bytes", settled.len());
        assert_eq!(decode(&settled).expect("decodes"), m);
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
        let m = Manifest::new(key(), vec![1, 2, 3]);
        let good = encode(&m);
        assert_eq!(decode(&[]), Err(DecodeError::Truncated));
        assert_eq!(decode(&[2, 0]), Err(DecodeError::Version(2)));
        for cut in 1..good.len() {
            assert!(decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = good.to_vec();
        longer.push(0);
        assert!(matches!(decode(&longer), Err(DecodeError::Malformed(_))));
        let mut state = good.to_vec();
        state[1] = 7;
        assert!(matches!(decode(&state), Err(DecodeError::Malformed(_))));
        // A count far past the value's length reserves nothing.
        let mut huge = vec![VERSION, OPEN, 1, b'a', 1, b'b'];
        huge.extend([0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert_eq!(decode(&huge), Err(DecodeError::Truncated));
    }
}
