//! Splitting a request body into rows: a JSON object, a JSON array of objects, NDJSON,
//! or an RFC 7464 JSON text sequence. Each row is kept as the bytes it came as
//! (ClickHouse reads them with JSONEachRow), checked to be one JSON object of valid
//! UTF-8 nested no deeper than the limit, and reported by index when it is not, so the
//! good rows of a request still go through.
//!
//! Rows come one at a time ([`Rows`] is an iterator) and are slices of the body, so a
//! request holds its body and the rows in flight, never a list of every row or every
//! refusal: a 10 MB body of five million bad lines costs no more than a good one.

use bytes::Bytes;
use serde::de::IgnoredAny;
use serde::Serialize;

use super::scan::{self, Elements};

/// How the body is framed, from its `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// `application/json`: one object, or an array of objects.
    Json,
    /// `application/x-ndjson`, `application/jsonl` and friends: one object per line.
    Ndjson,
    /// `application/json-seq` (RFC 7464): each record starts with 0x1E; one object each.
    JsonSeq,
}

/// RFC 7464's record separator.
const RS: u8 = 0x1E;

impl Framing {
    /// `None` for a media type Sluice does not take (the API answers 415).
    pub fn from_content_type(value: Option<&str>) -> Option<Framing> {
        let media = value?.split(';').next()?.trim().to_ascii_lowercase();
        match media.as_str() {
            "application/json" => Some(Framing::Json),
            "application/x-ndjson"
            | "application/ndjson"
            | "application/jsonl"
            | "application/x-jsonlines"
            | "application/jsonlines" => Some(Framing::Ndjson),
            "application/json-seq" => Some(Framing::JsonSeq),
            _ => None,
        }
    }
}

/// What a row may be.
#[derive(Clone, Copy, Debug)]
pub struct RowLimits {
    pub max_bytes: usize,
    /// Levels of arrays and objects, the row's own object being level 1.
    pub max_depth: usize,
}

/// A row refused, and why (the form an answer lists).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RowError {
    /// The row's position in the request, from 0.
    pub index: usize,
    /// For NDJSON, the line it was on, from 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    pub reason: String,
}

/// A row refused, its reason not yet written out: most refusals of a large request
/// are only counted, and formatting each would cost as much as the rest of the work.
#[derive(Debug)]
pub struct Refused {
    pub index: usize,
    pub line: Option<usize>,
    why: Why,
}

#[derive(Debug)]
enum Why {
    TooLarge { bytes: usize, limit: usize },
    NotAnObject,
    NotUtf8 { at: usize },
    NotJson(serde_json::Error),
    TooDeep { limit: usize },
    BeforeFirstRecord,
}

impl Refused {
    pub fn into_error(self) -> RowError {
        let reason = match self.why {
            Why::TooLarge { bytes, limit } => {
                format!("the row is {bytes} bytes, over the limit of {limit}")
            }
            Why::NotAnObject => "the row is not a JSON object".into(),
            Why::NotUtf8 { at } => format!("the row is not valid UTF-8 (at byte {at} of the row)"),
            Why::NotJson(e) => format!("the row is not valid JSON: {e}"),
            Why::TooDeep { limit } => format!(
                "the row nests arrays and objects more than {limit} levels deep ([api] max_json_depth)"
            ),
            Why::BeforeFirstRecord => {
                "text before the first record separator (0x1E) of a JSON text sequence".into()
            }
        };
        RowError {
            index: self.index,
            line: self.line,
            reason,
        }
    }
}

/// The whole body is unusable (not JSON at all).
#[derive(Debug, PartialEq, Eq)]
pub struct BodyError(pub String);

/// Each row of a body in order: its index and its bytes on one line, or why it is
/// refused.
pub struct Rows<'b> {
    body: &'b Bytes,
    limits: RowLimits,
    source: Source<'b>,
    next_index: usize,
}

enum Source<'b> {
    /// An `application/json` object, checked already (taken once).
    One(Option<&'b [u8]>),
    /// The elements of an `application/json` array, checked already.
    Array(Elements<'b>),
    /// NDJSON lines, numbered from 1.
    Lines(Pieces<'b>),
    /// JSON text sequence records; the first piece is what precedes the first 0x1E.
    Records(Pieces<'b>),
}

/// The body cut at each separator byte, numbered.
type Pieces<'b> = std::iter::Enumerate<std::slice::Split<'b, u8, fn(&u8) -> bool>>;

/// The rows of `body`. Fails only when an `application/json` body as a whole is not
/// UTF-8 or not JSON (then nothing of it is taken).
pub fn rows(body: &Bytes, framing: Framing, limits: RowLimits) -> Result<Rows<'_>, BodyError> {
    let source = match framing {
        Framing::Json => {
            let text = std::str::from_utf8(body)
                .map_err(|e| BodyError(format!("the body is not UTF-8: {e}")))?;
            // Validates without recursing, however deep the body nests.
            serde_json::from_str::<IgnoredAny>(text)
                .map_err(|e| BodyError(format!("the body is not JSON: {e}")))?;
            let trimmed = text.trim_ascii();
            if trimmed.starts_with('[') {
                Source::Array(Elements::new(trimmed.as_bytes()))
            } else {
                Source::One(Some(trimmed.as_bytes()))
            }
        }
        Framing::Ndjson => Source::Lines(body.split(is_newline as fn(&u8) -> bool).enumerate()),
        Framing::JsonSeq => Source::Records(body.split(is_rs as fn(&u8) -> bool).enumerate()),
    };
    Ok(Rows {
        body,
        limits,
        source,
        next_index: 0,
    })
}

fn is_newline(b: &u8) -> bool {
    *b == b'\n'
}

fn is_rs(b: &u8) -> bool {
    *b == RS
}

impl Rows<'_> {
    fn check(
        &mut self,
        row: &[u8],
        line: Option<usize>,
        validated: bool,
    ) -> Result<(usize, Bytes), Refused> {
        let index = self.next_index;
        self.next_index += 1;
        let refuse = |why| Refused { index, line, why };
        let limits = self.limits;
        if row.len() > limits.max_bytes {
            return Err(refuse(Why::TooLarge {
                bytes: row.len(),
                limit: limits.max_bytes,
            }));
        }
        if row.first() != Some(&b'{') {
            return Err(refuse(Why::NotAnObject));
        }
        if !validated {
            let text = std::str::from_utf8(row).map_err(|e| {
                refuse(Why::NotUtf8 {
                    at: e.valid_up_to(),
                })
            })?;
            serde_json::from_str::<IgnoredAny>(text).map_err(|e| refuse(Why::NotJson(e)))?;
        }
        if scan::deeper_than(row, limits.max_depth) {
            return Err(refuse(Why::TooDeep {
                limit: limits.max_depth,
            }));
        }
        Ok((index, one_line(self.body, row)))
    }
}

impl Iterator for Rows<'_> {
    type Item = Result<(usize, Bytes), Refused>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let (row, line, validated) = match &mut self.source {
                Source::One(one) => (one.take()?, None, true),
                Source::Array(elements) => (elements.next()?, None, true),
                Source::Lines(lines) => {
                    let (n, line) = lines.next()?;
                    (line.trim_ascii(), Some(n + 1), false)
                }
                Source::Records(records) => {
                    let (n, record) = records.next()?;
                    let record = record.trim_ascii();
                    if n == 0 && !record.is_empty() {
                        let index = self.next_index;
                        self.next_index += 1;
                        return Some(Err(Refused {
                            index,
                            line: None,
                            why: Why::BeforeFirstRecord,
                        }));
                    }
                    (record, None, false)
                }
            };
            if row.is_empty() {
                continue;
            }
            return Some(self.check(row, line, validated));
        }
    }
}

/// The row as a slice of the body when it is on one line already. A valid JSON text
/// can hold a raw CR or LF only as whitespace (inside strings they are escaped), so
/// otherwise folding them into spaces keeps the row and puts it on one line:
/// JSONEachRow batches are joined with newlines.
fn one_line(body: &Bytes, row: &[u8]) -> Bytes {
    if row.iter().any(|b| *b == b'\n' || *b == b'\r') {
        Bytes::from(
            row.iter()
                .map(|b| if *b == b'\n' || *b == b'\r' { b' ' } else { *b })
                .collect::<Vec<u8>>(),
        )
    } else {
        body.slice_ref(row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: RowLimits = RowLimits {
        max_bytes: 1024,
        max_depth: 8,
    };

    /// (index, row) of the rows taken, (index, line, reason) of those refused.
    #[allow(clippy::type_complexity)]
    fn split(
        body: &str,
        framing: Framing,
        limits: RowLimits,
    ) -> (Vec<(usize, String)>, Vec<(usize, Option<usize>, String)>) {
        let body = Bytes::from(body.to_string());
        let (mut ok, mut refused) = (Vec::new(), Vec::new());
        for item in rows(&body, framing, limits).expect("a body") {
            match item {
                Ok((i, row)) => ok.push((i, String::from_utf8_lossy(&row).into_owned())),
                Err(r) => {
                    let e = r.into_error();
                    refused.push((e.index, e.line, e.reason));
                }
            }
        }
        (ok, refused)
    }

    #[test]
    fn one_object() {
        let (ok, refused) = split("{\"a\": 1,\n \"b\": \"x\\ny\"}\n", Framing::Json, LIMITS);
        assert_eq!(ok, vec![(0, "{\"a\": 1,  \"b\": \"x\\ny\"}".to_string())]);
        assert!(refused.is_empty());
    }

    #[test]
    fn array_with_a_non_object() {
        let (ok, refused) = split("[{\"a\":1}, 5, {\"a\":\n2}, \"x\"]", Framing::Json, LIMITS);
        assert_eq!(ok, vec![(0, "{\"a\":1}".into()), (2, "{\"a\": 2}".into())]);
        assert_eq!(refused.iter().map(|e| e.0).collect::<Vec<_>>(), vec![1, 3]);
        assert!(refused[0].2.contains("not a JSON object"));
    }

    #[test]
    fn broken_json_is_a_body_error() {
        let e = rows(&Bytes::from("[{\"a\":1},"), Framing::Json, LIMITS)
            .err()
            .expect("bad");
        assert!(e.0.contains("not JSON"), "{}", e.0);
        for bad in ["{\"a\":", "   ", "{\"a\":1} x", "\u{1}"] {
            assert!(
                rows(&Bytes::from(bad), Framing::Json, LIMITS).is_err(),
                "{bad:?}"
            );
        }
        let e = rows(
            &Bytes::from(&b"{\"a\":\"\xff\"}"[..]),
            Framing::Json,
            LIMITS,
        )
        .err()
        .expect("bad");
        assert!(e.0.contains("not UTF-8"), "{}", e.0);
        // An empty array is JSON: no rows (the handler answers that).
        assert_eq!(split("[]", Framing::Json, LIMITS), (vec![], vec![]));
    }

    #[test]
    fn ndjson_reports_bad_lines_and_keeps_good_ones() {
        let body = "{\"a\":1}\n\n{\"a\":\n{\"a\":3}\r\n[1]\n";
        let (ok, refused) = split(body, Framing::Ndjson, LIMITS);
        assert_eq!(ok, vec![(0, "{\"a\":1}".into()), (2, "{\"a\":3}".into())]);
        let errors: Vec<_> = refused.iter().map(|e| (e.0, e.1)).collect();
        assert_eq!(errors, vec![(1, Some(3)), (3, Some(5))]);
    }

    #[test]
    fn ndjson_invalid_utf8_is_refused_by_row() {
        let body = b"{\"a\":\"ok\"}\n{\"a\":\"\xc3\x28\"}\n{\"a\":\"\xe2\x82\xac\"}\n";
        let body = Bytes::from(&body[..]);
        let items: Vec<_> = rows(&body, Framing::Ndjson, LIMITS)
            .expect("rows")
            .collect();
        assert_eq!(items.len(), 3);
        assert!(items[0].is_ok() && items[2].is_ok());
        let e = match &items[1] {
            Err(r) => (r.index, r.line, format!("{:?}", r.why)),
            Ok(_) => panic!("invalid UTF-8 taken"),
        };
        assert_eq!((e.0, e.1), (1, Some(2)));
        assert!(e.2.contains("NotUtf8 { at: 6 }"), "{}", e.2);
    }

    #[test]
    fn rows_nested_too_deep_are_refused_alone_in_every_framing() {
        let deep = format!("{{\"x\":{}1{}}}", "[".repeat(8), "]".repeat(8));
        let fits = format!("{{\"x\":{}1{}}}", "[".repeat(7), "]".repeat(7));
        let bomb = format!("{{\"x\":{}1{}}}", "[".repeat(100_000), "]".repeat(100_000));
        let body = format!("{fits}\n{deep}\n{bomb}\n{{\"a\":1}}\n");
        let limits = RowLimits {
            max_bytes: 1 << 20,
            max_depth: 8,
        };
        let (ok, refused) = split(&body, Framing::Ndjson, limits);
        assert_eq!(ok.iter().map(|r| r.0).collect::<Vec<_>>(), vec![0, 3]);
        assert_eq!(refused.iter().map(|e| e.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!(
            refused[0].2.contains("more than 8 levels"),
            "{}",
            refused[0].2
        );

        let array = format!("[{fits}, {bomb}, {{\"a\":1}}]");
        let (ok, refused) = split(&array, Framing::Json, limits);
        assert_eq!(ok.iter().map(|r| r.0).collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(refused.iter().map(|e| e.0).collect::<Vec<_>>(), vec![1]);
        let (ok, refused) = split(&bomb, Framing::Json, limits);
        assert!(ok.is_empty());
        assert_eq!(refused.len(), 1);
    }

    #[test]
    fn json_text_sequences_take_one_row_per_record() {
        let body = "\u{1e}{\"a\":1}\n\u{1e}{\n \"a\": 2\n}\n\u{1e}\n\u{1e}[3]\n\u{1e}{\"a\":4}";
        let (ok, refused) = split(body, Framing::JsonSeq, LIMITS);
        assert_eq!(
            ok,
            vec![
                (0, "{\"a\":1}".into()),
                (1, "{  \"a\": 2 }".into()),
                (3, "{\"a\":4}".into())
            ]
        );
        assert_eq!(
            refused.iter().map(|e| (e.0, e.1)).collect::<Vec<_>>(),
            vec![(2, None)]
        );
        let (ok, refused) = split("{\"a\":0}\n\u{1e}{\"a\":1}\n", Framing::JsonSeq, LIMITS);
        assert_eq!(ok, vec![(1, "{\"a\":1}".into())]);
        assert!(refused[0].2.contains("record separator"), "{:?}", refused);
    }

    #[test]
    fn oversized_rows_are_refused_alone() {
        let big = format!("{{\"a\":\"{}\"}}", "x".repeat(100));
        let body = format!("{{\"a\":1}}\n{big}\n");
        let limits = RowLimits {
            max_bytes: 50,
            max_depth: 8,
        };
        let (ok, refused) = split(&body, Framing::Ndjson, limits);
        assert_eq!(ok.len(), 1);
        assert!(refused[0].2.contains("over the limit of 50"));
    }

    #[test]
    fn content_types() {
        assert_eq!(
            Framing::from_content_type(Some("application/json; charset=utf-8")),
            Some(Framing::Json)
        );
        assert_eq!(
            Framing::from_content_type(Some("application/x-ndjson")),
            Some(Framing::Ndjson)
        );
        assert_eq!(
            Framing::from_content_type(Some("Application/JSON-seq")),
            Some(Framing::JsonSeq)
        );
        assert_eq!(Framing::from_content_type(Some("text/plain")), None);
        assert_eq!(Framing::from_content_type(None), None);
    }
}
