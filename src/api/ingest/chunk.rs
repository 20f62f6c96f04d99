//! A request's accepted rows gathered into NDJSON messages of at most so many rows and
//! bytes: nats-server's work is per message, so one message of a thousand rows costs
//! it about what one row alone did.
//!
//! The split depends on nothing but the accepted rows in order and the limits, never
//! on timing or on what was stored: a client that resends the same body under the same
//! `Idempotency-Key` gets the same chunks, so each chunk's message id
//! (`<stem>-<chunk index>`, see `idempotency`) finds what JetStream already stored.

use bytes::{Bytes, BytesMut};

use crate::nats::{Compression, Encoding};

/// How big one message may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkLimits {
    pub rows: usize,
    /// The rows' bytes with the `\n` between them. A row is never larger (rows over
    /// the message limit are refused by index before they get here), so one always fits.
    pub bytes: usize,
}

/// One message's worth of rows.
#[derive(Debug)]
pub struct Chunk {
    /// Its place among the request's chunks, from 0: the suffix of its message id.
    pub index: usize,
    pub rows: usize,
    /// The rows, one per line; a lone row as it came (no copy, no newline). Encoded
    /// with `encoding` once it is stored so (`Publishing`).
    pub payload: Bytes,
    /// `None`: plain NDJSON.
    pub encoding: Option<Encoding>,
}

impl Chunk {
    /// The chunk as it is stored: compressed when `compression` is on and it pays.
    pub fn encoded(self, compression: Option<Compression>) -> Self {
        match compression {
            Some(c) => {
                let (payload, encoding) = c.encode(self.payload);
                Self {
                    payload,
                    encoding,
                    ..self
                }
            }
            None => self,
        }
    }
}

/// Gathers rows into chunks as they come: a chunk closes when the next row would not
/// fit it, and at the end of the request.
#[derive(Debug)]
pub struct Chunker {
    limits: ChunkLimits,
    open: Vec<Bytes>,
    /// The open chunk's payload size (its rows and the newlines between them).
    bytes: usize,
    next_index: usize,
}

// === impl Chunker ===

impl Chunker {
    pub fn new(limits: ChunkLimits) -> Self {
        Self {
            limits: ChunkLimits {
                rows: limits.rows.max(1),
                bytes: limits.bytes,
            },
            open: Vec::new(),
            bytes: 0,
            next_index: 0,
        }
    }

    /// Adds a row; returns the chunk it closed when the row did not fit that one.
    pub fn push(&mut self, row: Bytes) -> Option<Chunk> {
        let full =
            self.open.len() >= self.limits.rows || self.bytes + 1 + row.len() > self.limits.bytes;
        let closed = if full && !self.open.is_empty() {
            self.close()
        } else {
            None
        };
        self.bytes += usize::from(!self.open.is_empty()) + row.len();
        self.open.push(row);
        closed
    }

    /// The last chunk, if rows are left.
    pub fn finish(&mut self) -> Option<Chunk> {
        (!self.open.is_empty()).then(|| self.close()).flatten()
    }

    fn close(&mut self) -> Option<Chunk> {
        let rows = std::mem::take(&mut self.open);
        let bytes = std::mem::take(&mut self.bytes);
        let payload = match &rows[..] {
            [] => return None,
            [one] => one.clone(),
            many => {
                let mut out = BytesMut::with_capacity(bytes);
                for (i, row) in many.iter().enumerate() {
                    if i > 0 {
                        out.extend_from_slice(b"\n");
                    }
                    out.extend_from_slice(row);
                }
                out.freeze()
            }
        };
        let index = self.next_index;
        self.next_index += 1;
        Some(Chunk {
            index,
            rows: rows.len(),
            payload,
            encoding: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(rows: &[&str], limits: ChunkLimits) -> Vec<(usize, usize, String)> {
        let mut chunker = Chunker::new(limits);
        let mut out = Vec::new();
        let mut take = |c: Chunk| {
            out.push((
                c.index,
                c.rows,
                String::from_utf8_lossy(&c.payload).into_owned(),
            ))
        };
        for row in rows {
            if let Some(c) = chunker.push(Bytes::from(row.to_string())) {
                take(c);
            }
        }
        if let Some(c) = chunker.finish() {
            take(c);
        }
        out
    }

    #[test]
    fn rows_fill_chunks_up_to_the_row_limit() {
        let rows = [
            "{\"a\":1}",
            "{\"a\":2}",
            "{\"a\":3}",
            "{\"a\":4}",
            "{\"a\":5}",
        ];
        let limits = ChunkLimits {
            rows: 2,
            bytes: 1 << 20,
        };
        assert_eq!(
            split(&rows, limits),
            vec![
                (0, 2, "{\"a\":1}\n{\"a\":2}".into()),
                (1, 2, "{\"a\":3}\n{\"a\":4}".into()),
                (2, 1, "{\"a\":5}".into()),
            ]
        );
    }

    #[test]
    fn the_byte_limit_counts_the_newlines_and_closes_before_a_row_that_would_not_fit() {
        // 7 bytes each: two with their newline are 15.
        let rows = ["{\"a\":1}", "{\"a\":2}", "{\"a\":3}"];
        let fits_two = ChunkLimits {
            rows: 100,
            bytes: 15,
        };
        let one_short = ChunkLimits {
            bytes: 14,
            ..fits_two
        };
        let rows_per_chunk =
            |limits| -> Vec<usize> { split(&rows, limits).iter().map(|c| c.1).collect() };
        assert_eq!(rows_per_chunk(fits_two), vec![2, 1]);
        assert_eq!(rows_per_chunk(one_short), vec![1, 1, 1]);
        // Every chunk stays within the limit.
        for (_, _, payload) in split(&rows, fits_two) {
            assert!(payload.len() <= 15, "{payload:?}");
        }
    }

    #[test]
    fn a_lone_row_travels_as_it_came_and_one_row_per_chunk_is_the_unbatched_api() {
        let rows = ["{\"a\":1}", "{\"b\":2}"];
        let one = ChunkLimits {
            rows: 1,
            bytes: 1 << 20,
        };
        assert_eq!(
            split(&rows, one),
            vec![(0, 1, "{\"a\":1}".into()), (1, 1, "{\"b\":2}".into())]
        );
        let body = Bytes::from_static(b"{\"a\":1}");
        let mut chunker = Chunker::new(one);
        assert!(chunker.push(body.clone()).is_none());
        let chunk = chunker.finish().expect("a chunk");
        assert_eq!(chunk.payload.as_ptr(), body.as_ptr(), "copied");
        assert!(chunker.finish().is_none());
    }

    #[test]
    fn the_same_rows_split_the_same_way() {
        let rows: Vec<String> = (0..1000)
            .map(|i| format!("{{\"id\":{i},\"s\":\"{}\"}}", "x".repeat(i % 37)))
            .collect();
        let rows: Vec<&str> = rows.iter().map(String::as_str).collect();
        let limits = ChunkLimits {
            rows: 64,
            bytes: 2000,
        };
        let first = split(&rows, limits);
        assert_eq!(first, split(&rows, limits));
        assert_eq!(first.iter().map(|c| c.1).sum::<usize>(), 1000);
        assert!(first.iter().all(|c| c.1 <= 64 && c.2.len() <= 2000));
        let lines: Vec<String> = first
            .iter()
            .flat_map(|c| c.2.lines().map(str::to_string).collect::<Vec<_>>())
            .collect();
        assert_eq!(lines, rows);
    }
}
