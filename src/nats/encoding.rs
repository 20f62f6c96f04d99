//! How a message's payload is encoded in the ingest stream, and the one function every
//! reader decodes it with.
//!
//! A message stores its rows as NDJSON, plain or compressed. The header
//! [`ENCODING_HEADER`] names the encoding: absent, the payload is plain; `zstd`, it is
//! one or more zstd frames of the NDJSON. The ingest API compresses what it publishes
//! (`[api] compression`); any other publisher may do the same with the same header
//! (docs/operations.md, "Compressed messages").
//!
//! Readers: the source, as it takes a message (`super::pulling::source`: the actors see the rows
//! only, plain, and a row parked on the DLQ is parked decoded, as it came); the DLQ's
//! peek and replay (`super::dlq`: a message parked because it could not be decoded is
//! parked as it came, header and all). A payload that cannot be decoded (an encoding
//! this build does not know, a corrupt frame, more than [`MAX_DECODED_BYTES`]) is an
//! [`Undecodable`], parked whole with its reason: never a crash, never dropped.

use std::io::Read as _;

use async_nats::HeaderMap;
use bytes::Bytes;

pub use crate::config::Compression;

/// The header naming a payload's encoding; absent: plain NDJSON.
pub const ENCODING_HEADER: &str = "Sluice-Encoding";

/// The most bytes one payload may decode to: what the largest NATS message
/// (`max_payload` is at most 64 MiB) carries. A frame that says or makes more is
/// refused rather than let a few bytes claim the process's memory.
pub const MAX_DECODED_BYTES: usize = 64 << 20;

/// An encoding Sluice reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// Zstandard frames (RFC 8878).
    Zstd,
}

impl Encoding {
    /// The header's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Zstd => "zstd",
        }
    }

    /// The encoding a header value names (case does not matter); `None`: unknown.
    fn named(value: &str) -> Option<Self> {
        value
            .trim()
            .eq_ignore_ascii_case("zstd")
            .then_some(Self::Zstd)
    }
}

/// Why a payload could not be decoded: the DLQ's `Sluice-Error` of the message, parked
/// whole.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Undecodable {
    #[error("the payload's encoding {0:?} (header {ENCODING_HEADER}) is not one Sluice reads: zstd, or no header for plain NDJSON")]
    Unknown(String),
    #[error("the payload is not valid {}: {reason}", .encoding.as_str())]
    Corrupt { encoding: Encoding, reason: String },
    #[error("the payload decodes to more than {} MiB, more than any NATS message carries", MAX_DECODED_BYTES >> 20)]
    TooLarge,
}

/// The encoding a message's headers name: `Ok(None)` for plain.
pub fn encoding_of(headers: Option<&HeaderMap>) -> Result<Option<Encoding>, Undecodable> {
    let Some(value) = headers.and_then(|h| h.get(ENCODING_HEADER)) else {
        return Ok(None);
    };
    let value = value.as_str();
    Encoding::named(value)
        .map(Some)
        .ok_or_else(|| Undecodable::Unknown(value.to_owned()))
}

/// The payload as plain NDJSON, whatever its headers say it is encoded with. A plain
/// payload is returned as it is (no copy).
pub fn decode(headers: Option<&HeaderMap>, payload: &Bytes) -> Result<Bytes, Undecodable> {
    match encoding_of(headers)? {
        None => Ok(payload.clone()),
        Some(Encoding::Zstd) => unzstd(payload).map(Bytes::from),
    }
}

thread_local! {
    /// A decompression context per thread: making one costs more than decoding a
    /// message of a hundred rows.
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

fn unzstd(payload: &[u8]) -> Result<Vec<u8>, Undecodable> {
    let corrupt = |e: std::io::Error| Undecodable::Corrupt {
        encoding: Encoding::Zstd,
        reason: e.to_string(),
    };
    // Frames that state their size (what a one-shot compressor writes: the API's, and
    // Python's `zstandard.compress`) are decoded in one go into a buffer of that size.
    let Some(size) = zstd::bulk::Decompressor::upper_bound(payload) else {
        return unzstd_streamed(payload);
    };
    if size > MAX_DECODED_BYTES {
        return Err(Undecodable::TooLarge);
    }
    DECOMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        let decompressor = match cell.as_mut() {
            Some(d) => d,
            None => cell.insert(zstd::bulk::Decompressor::new().map_err(corrupt)?),
        };
        decompressor.decompress(payload, size).map_err(corrupt)
    })
}

/// Frames that do not state their size (a streaming compressor's): read up to the limit.
fn unzstd_streamed(payload: &[u8]) -> Result<Vec<u8>, Undecodable> {
    let corrupt = |e: std::io::Error| Undecodable::Corrupt {
        encoding: Encoding::Zstd,
        reason: e.to_string(),
    };
    let mut out = Vec::new();
    zstd::stream::read::Decoder::with_buffer(payload)
        .map_err(corrupt)?
        .take(MAX_DECODED_BYTES as u64 + 1)
        .read_to_end(&mut out)
        .map_err(corrupt)?;
    if out.len() > MAX_DECODED_BYTES {
        return Err(Undecodable::TooLarge);
    }
    Ok(out)
}

/// The DLQ's `Sluice-Error-Class` of a message parked because it could not be decoded.
pub const UNDECODABLE_CLASS: &str = "Undecodable";

/// What a delivered message keeps of a payload it could not decode: why, to park it
/// whole with that reason and the encoding it named.
#[derive(Debug)]
pub struct Unreadable {
    why: Undecodable,
    /// `why` as the DLQ's `Sluice-Error` says it (the actors borrow it).
    reason: Box<str>,
}

impl Unreadable {
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The DLQ headers of the message parked whole: its class, and the encoding it
    /// named, so a reader of the DLQ sees the payload for what it is (still encoded).
    pub fn mark_parked(&self, headers: &mut HeaderMap) {
        headers.insert("Sluice-Error-Class", UNDECODABLE_CLASS);
        let named = match &self.why {
            Undecodable::Unknown(value) => value.as_str(),
            Undecodable::Corrupt { encoding, .. } => encoding.as_str(),
            Undecodable::TooLarge => Encoding::Zstd.as_str(),
        };
        headers.insert(ENCODING_HEADER, named);
    }
}

/// A delivered message's payload as its rows, or as it came with why it cannot be read.
pub fn read_payload(
    headers: Option<&HeaderMap>,
    payload: Bytes,
) -> (Bytes, Option<Box<Unreadable>>) {
    match decode(headers, &payload) {
        Ok(rows) => (rows, None),
        Err(why) => {
            let reason = why.to_string().into_boxed_str();
            (payload, Some(Box::new(Unreadable { why, reason })))
        }
    }
}

thread_local! {
    /// A compression context per thread, with the level it was made for.
    static COMPRESSOR: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { std::cell::RefCell::new(None) };
}

impl Compression {
    /// The payload as it is to be stored, and its encoding (`None`: plain). Kept plain
    /// when shorter than `from_bytes`, when compressing it saves nothing, or (never
    /// seen) when zstd fails: a row is stored either way.
    pub fn encode(&self, payload: Bytes) -> (Bytes, Option<Encoding>) {
        if payload.len() < self.from_bytes {
            return (payload, None);
        }
        match self.zstd(&payload) {
            Some(packed) if packed.len() < payload.len() => {
                (Bytes::from(packed), Some(Encoding::Zstd))
            }
            _ => (payload, None),
        }
    }

    fn zstd(&self, payload: &[u8]) -> Option<Vec<u8>> {
        COMPRESSOR.with(|cell| {
            let mut cell = cell.borrow_mut();
            if cell.as_ref().is_none_or(|(level, _)| *level != self.level) {
                *cell = Some((self.level, zstd::bulk::Compressor::new(self.level).ok()?));
            }
            let (_, compressor) = cell.as_mut()?;
            compressor.compress(payload).ok()
        })
    }
}

/// The header map a message of `encoding` is published with (`None`: plain, no header).
pub fn headers_for(encoding: Option<Encoding>) -> Option<HeaderMap> {
    encoding.map(|e| {
        let mut h = HeaderMap::new();
        h.insert(ENCODING_HEADER, e.as_str());
        h
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::units::Share;

    fn rows(n: usize) -> Bytes {
        let lines: Vec<String> = (0..n)
            .map(|i| format!(r#"{{"ts":"2024-05-01T10:00:{:02}Z","path":"/api/v1/items/{i}","status":200,"ua":"Mozilla/5.0"}}"#, i % 60))
            .collect();
        Bytes::from(lines.join("\n"))
    }

    fn zstd_header() -> HeaderMap {
        headers_for(Some(Encoding::Zstd)).expect("a header")
    }

    const ON: Compression = Compression {
        level: 1,
        from_bytes: 512,
        while_above: Share::percent(0),
    };

    #[test]
    fn a_compressed_chunk_decodes_to_its_rows() {
        let plain = rows(100);
        let (stored, encoding) = ON.encode(plain.clone());
        assert_eq!(encoding, Some(Encoding::Zstd));
        assert!(
            stored.len() * 4 < plain.len(),
            "{} -> {}",
            plain.len(),
            stored.len()
        );
        let headers = headers_for(encoding);
        assert_eq!(decode(headers.as_ref(), &stored), Ok(plain));
    }

    #[test]
    fn below_the_threshold_or_when_nothing_is_saved_a_payload_stays_plain() {
        let short = Bytes::from_static(br#"{"a":1}"#);
        assert_eq!(ON.encode(short.clone()), (short.clone(), None));
        let everything = Compression {
            level: 1,
            from_bytes: 0,
            while_above: Share::percent(0),
        };
        // Seven bytes do not shrink: a frame's header alone is longer.
        assert_eq!(everything.encode(short.clone()), (short, None));
    }

    #[test]
    fn a_plain_payload_is_returned_without_a_copy() {
        let plain = rows(3);
        let out = decode(None, &plain).expect("plain");
        assert_eq!(out.as_ptr(), plain.as_ptr());
        let mut other = HeaderMap::new();
        other.insert("Nats-Msg-Id", "x");
        assert_eq!(decode(Some(&other), &plain), Ok(plain));
    }

    #[test]
    fn the_header_value_is_read_without_regard_to_case() {
        let plain = rows(10);
        let packed = Bytes::from(zstd::bulk::compress(&plain, 3).expect("compress"));
        let mut h = HeaderMap::new();
        h.insert(ENCODING_HEADER, "ZSTD");
        assert_eq!(decode(Some(&h), &packed), Ok(plain));
    }

    #[test]
    fn an_unknown_encoding_is_undecodable_and_names_itself() {
        let mut h = HeaderMap::new();
        h.insert(ENCODING_HEADER, "br");
        let e = decode(Some(&h), &rows(2)).expect_err("br is not read");
        assert_eq!(e, Undecodable::Unknown("br".into()));
        assert!(e.to_string().contains("\"br\""), "{e}");
    }

    #[test]
    fn a_corrupt_frame_is_undecodable_not_a_panic() {
        let packed = zstd::bulk::compress(&rows(50), 1).expect("compress");
        // Not zstd at all.
        let e = decode(Some(&zstd_header()), &rows(2)).expect_err("plain text");
        assert!(matches!(e, Undecodable::Corrupt { .. }), "{e:?}");
        // A frame cut short, and one with its body bytes flipped.
        let cut = Bytes::copy_from_slice(&packed[..packed.len() / 2]);
        let e = decode(Some(&zstd_header()), &cut).expect_err("cut");
        assert!(matches!(e, Undecodable::Corrupt { .. }), "{e:?}");
        let mut flipped = packed.clone();
        for b in flipped.iter_mut().skip(12) {
            *b ^= 0x5a;
        }
        let e = decode(Some(&zstd_header()), &Bytes::from(flipped)).expect_err("flipped");
        assert!(
            e.to_string().starts_with("the payload is not valid zstd"),
            "{e}"
        );
    }

    #[test]
    fn a_streamed_frame_without_its_size_decodes_too() {
        let plain = rows(200);
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 3).expect("encoder");
        std::io::Write::write_all(&mut encoder, &plain).expect("write");
        let packed = Bytes::from(encoder.finish().expect("finish"));
        assert!(zstd::bulk::Decompressor::upper_bound(&packed).is_none());
        assert_eq!(decode(Some(&zstd_header()), &packed), Ok(plain));
    }

    #[test]
    fn two_frames_one_after_the_other_are_one_payload() {
        let (a, b) = (rows(20), rows(30));
        let mut packed = zstd::bulk::compress(&a, 1).expect("a");
        packed.extend(zstd::bulk::compress(&b, 1).expect("b"));
        let mut both = a.to_vec();
        both.extend_from_slice(&b);
        assert_eq!(
            decode(Some(&zstd_header()), &Bytes::from(packed)),
            Ok(Bytes::from(both))
        );
    }

    #[test]
    fn an_unreadable_payload_is_kept_as_it_came_and_parked_under_its_encoding() {
        let garbage = Bytes::from_static(b"\x28\xb5\x2f\xfd garbage");
        let (kept, unreadable) = read_payload(Some(&zstd_header()), garbage.clone());
        assert_eq!(kept, garbage);
        let unreadable = unreadable.expect("unreadable");
        assert!(
            unreadable
                .reason()
                .starts_with("the payload is not valid zstd"),
            "{}",
            unreadable.reason()
        );
        let mut dlq = HeaderMap::new();
        dlq.insert("Sluice-Error-Class", "Rejected");
        unreadable.mark_parked(&mut dlq);
        assert_eq!(
            dlq.get("Sluice-Error-Class").map(|v| v.as_str()),
            Some(UNDECODABLE_CLASS)
        );
        assert_eq!(dlq.get(ENCODING_HEADER).map(|v| v.as_str()), Some("zstd"));
        let mut lz4 = HeaderMap::new();
        lz4.insert(ENCODING_HEADER, "lz4");
        let (_, unreadable) = read_payload(Some(&lz4), garbage);
        let mut dlq = HeaderMap::new();
        unreadable.expect("unknown").mark_parked(&mut dlq);
        assert_eq!(dlq.get(ENCODING_HEADER).map(|v| v.as_str()), Some("lz4"));
        let (rows, none) = read_payload(None, Bytes::from_static(b"{}"));
        assert!(none.is_none());
        assert_eq!(rows, Bytes::from_static(b"{}"));
    }

    #[test]
    fn a_frame_that_decodes_past_the_limit_is_refused() {
        let zeros = vec![0u8; MAX_DECODED_BYTES + 1];
        let packed = Bytes::from(zstd::bulk::compress(&zeros, 1).expect("compress"));
        assert_eq!(
            decode(Some(&zstd_header()), &packed),
            Err(Undecodable::TooLarge)
        );
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 1).expect("encoder");
        std::io::Write::write_all(&mut encoder, &zeros).expect("write");
        let streamed = Bytes::from(encoder.finish().expect("finish"));
        let e = decode(Some(&zstd_header()), &streamed).expect_err("too large");
        assert_eq!(e, Undecodable::TooLarge);
        assert!(e.to_string().contains("more than 64 MiB"), "{e}");
    }
}
