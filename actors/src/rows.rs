//! A message's rows: the lines of its NDJSON payload (one row per non-blank line; a
//! message with none is one empty row, so that every message has a row to settle it
//! by). Read by the consumer (counting), a table's lanes (a row's shard) and a batch
//! (its body), so it sits below all of them.

use std::ops::Range;

use bytes::Bytes;

/// The lines of an NDJSON message: one row per non-blank line; a message with none is
/// one (empty) row, so that every message has a row to settle it by.
pub fn lines(payload: &Bytes) -> Vec<Bytes> {
    line_ranges(payload).map(|r| payload.slice(r)).collect()
}

/// Where the [`lines`] of a message are in it, found without allocating: a batch is
/// built from every message it holds, most of them one row.
pub fn line_ranges(payload: &[u8]) -> LineRanges<'_> {
    LineRanges {
        payload,
        start: 0,
        any: false,
        ended: false,
    }
}

/// The iterator of [`line_ranges`].
pub struct LineRanges<'a> {
    payload: &'a [u8],
    /// Where the next line starts.
    start: usize,
    /// Whether a row was found (a message with none is one empty row).
    any: bool,
    ended: bool,
}

impl Iterator for LineRanges<'_> {
    type Item = Range<usize>;

    fn next(&mut self) -> Option<Range<usize>> {
        while !self.ended {
            let start = self.start;
            // memchr finds the newlines many bytes at a time: a 100-row message is
            // scanned several times on its way (counted, weighed, split), so its bytes
            // are not looked at one by one.
            let end = match memchr::memchr(b'\n', &self.payload[start..]) {
                Some(i) => start + i,
                None => {
                    self.ended = true;
                    self.payload.len()
                }
            };
            self.start = end + 1;
            let line = &self.payload[start..end];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if has_text(line) {
                self.any = true;
                return Some(start..start + line.len());
            }
        }
        if self.any {
            return None;
        }
        self.any = true;
        Some(0..self.payload.len())
    }
}

/// How many rows a message carries (what the buffer limits and the row counters
/// count), without copying.
pub fn row_count(payload: &[u8]) -> usize {
    let mut n = 0;
    let mut start = 0;
    for end in memchr::memchr_iter(b'\n', payload) {
        n += usize::from(has_text(&payload[start..end]));
        start = end + 1;
    }
    (n + usize::from(has_text(&payload[start..]))).max(1)
}

/// Whether a line holds a row (anything but whitespace): a row starts with `{`, so
/// this looks at one byte of it.
fn has_text(line: &[u8]) -> bool {
    line.iter().any(|b| !b.is_ascii_whitespace())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_one_row_per_non_blank_line() {
        let b = |s: &'static str| Bytes::from_static(s.as_bytes());
        let texts = |v: Vec<Bytes>| {
            v.iter()
                .map(|l| String::from_utf8_lossy(l).into_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(texts(lines(&b(r#"{"a":1}"#))), vec![r#"{"a":1}"#]);
        assert_eq!(texts(lines(&b("{\"a\":1}\n"))), vec![r#"{"a":1}"#]);
        assert_eq!(
            texts(lines(&b("{\"a\":1}\r\n\n  \n{\"a\":2}"))),
            vec![r#"{"a":1}"#, r#"{"a":2}"#]
        );
        assert_eq!(
            texts(lines(&b(""))),
            vec![""],
            "an empty message is one row"
        );
        for text in [
            "{}",
            "{}\n",
            "{}\n{}",
            "{}\n\n{}\n",
            " \n",
            "",
            "{}\r\n{}\r\n",
        ] {
            assert_eq!(
                row_count(text.as_bytes()),
                lines(&b(text)).len(),
                "{text:?}"
            );
        }
    }
}
