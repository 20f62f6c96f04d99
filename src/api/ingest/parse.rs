//! Splitting a request body into rows: a JSON object, a JSON array of objects, or
//! NDJSON. Each row is kept as the bytes it came as (ClickHouse reads them with
//! JSONEachRow), checked to be one JSON object, and reported by index when it is not,
//! so the good rows of a request still go through.

use bytes::Bytes;
use serde::de::IgnoredAny;
use serde::Serialize;
use serde_json::value::RawValue;

/// How the body is framed, from its `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// `application/json`: one object, or an array of objects.
    Json,
    /// `application/x-ndjson`, `application/jsonl` and friends: one object per line.
    Ndjson,
}

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
            | "application/jsonlines"
            | "application/json-seq" => Some(Framing::Ndjson),
            _ => None,
        }
    }
}

/// A row refused, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RowError {
    /// The row's position in the request, from 0.
    pub index: usize,
    /// For NDJSON, the line it was on, from 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    pub reason: String,
}

/// The rows of a body and the ones refused.
#[derive(Debug, Default)]
pub struct Parsed {
    /// (index, row bytes on one line)
    pub rows: Vec<(usize, Bytes)>,
    pub errors: Vec<RowError>,
}

impl Parsed {
    pub fn total(&self) -> usize {
        self.rows.len() + self.errors.len()
    }
}

/// The whole body is unusable (not JSON at all, or nothing in it).
#[derive(Debug, PartialEq, Eq)]
pub struct BodyError(pub String);

pub fn parse(body: &Bytes, framing: Framing, max_row_bytes: usize) -> Result<Parsed, BodyError> {
    let parsed = match framing {
        Framing::Json => parse_json(body, max_row_bytes)?,
        Framing::Ndjson => parse_ndjson(body, max_row_bytes),
    };
    if parsed.total() == 0 {
        return Err(BodyError("the body holds no rows".into()));
    }
    Ok(parsed)
}

fn parse_json(body: &Bytes, max_row_bytes: usize) -> Result<Parsed, BodyError> {
    let text =
        std::str::from_utf8(body).map_err(|e| BodyError(format!("the body is not UTF-8: {e}")))?;
    let trimmed = text.trim_start();
    let mut parsed = Parsed::default();
    if trimmed.starts_with('[') {
        let items: Vec<&RawValue> = serde_json::from_str(text)
            .map_err(|e| BodyError(format!("the body is not a JSON array: {e}")))?;
        for (index, item) in items.into_iter().enumerate() {
            check_row(
                &mut parsed,
                index,
                None,
                item.get().as_bytes(),
                max_row_bytes,
                true,
            );
        }
    } else {
        serde_json::from_str::<IgnoredAny>(text)
            .map_err(|e| BodyError(format!("the body is not JSON: {e}")))?;
        check_row(
            &mut parsed,
            0,
            None,
            text.trim().as_bytes(),
            max_row_bytes,
            true,
        );
    }
    Ok(parsed)
}

fn parse_ndjson(body: &Bytes, max_row_bytes: usize) -> Parsed {
    let mut parsed = Parsed::default();
    let mut index = 0;
    for (n, line) in body.split(|b| *b == b'\n').enumerate() {
        let line = trim(line);
        if line.is_empty() {
            continue;
        }
        check_row(&mut parsed, index, Some(n + 1), line, max_row_bytes, false);
        index += 1;
    }
    parsed
}

fn check_row(
    parsed: &mut Parsed,
    index: usize,
    line: Option<usize>,
    row: &[u8],
    max_row_bytes: usize,
    validated: bool,
) {
    let refuse = |reason: String| RowError {
        index,
        line,
        reason,
    };
    if row.len() > max_row_bytes {
        parsed.errors.push(refuse(format!(
            "the row is {} bytes, over the limit of {max_row_bytes}",
            row.len()
        )));
        return;
    }
    if row.first() != Some(&b'{') {
        parsed
            .errors
            .push(refuse("the row is not a JSON object".into()));
        return;
    }
    if !validated {
        if let Err(e) = serde_json::from_slice::<IgnoredAny>(row) {
            parsed
                .errors
                .push(refuse(format!("the row is not valid JSON: {e}")));
            return;
        }
    }
    parsed.rows.push((index, one_line(row)));
}

/// A valid JSON text can hold a raw CR or LF only as whitespace (inside strings they
/// are escaped), so folding them into spaces keeps the row and puts it on one line:
/// JSONEachRow batches are joined with newlines.
fn one_line(row: &[u8]) -> Bytes {
    if row.iter().any(|b| *b == b'\n' || *b == b'\r') {
        Bytes::from(
            row.iter()
                .map(|b| if *b == b'\n' || *b == b'\r' { b' ' } else { *b })
                .collect::<Vec<u8>>(),
        )
    } else {
        Bytes::copy_from_slice(row)
    }
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if first.is_ascii_whitespace() {
            s = rest;
        } else {
            break;
        }
    }
    while let [rest @ .., last] = s {
        if last.is_ascii_whitespace() {
            s = rest;
        } else {
            break;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(p: &Parsed) -> Vec<(usize, String)> {
        p.rows
            .iter()
            .map(|(i, r)| (*i, String::from_utf8_lossy(r).into_owned()))
            .collect()
    }

    #[test]
    fn one_object() {
        let p = parse(
            &Bytes::from("{\"a\": 1,\n \"b\": \"x\\ny\"}\n"),
            Framing::Json,
            1024,
        )
        .expect("ok");
        assert_eq!(
            rows(&p),
            vec![(0, "{\"a\": 1,  \"b\": \"x\\ny\"}".to_string())]
        );
        assert!(p.errors.is_empty());
    }

    #[test]
    fn array_with_a_non_object() {
        let p = parse(
            &Bytes::from("[{\"a\":1}, 5, {\"a\":\n2}, \"x\"]"),
            Framing::Json,
            1024,
        )
        .expect("ok");
        assert_eq!(
            rows(&p),
            vec![(0, "{\"a\":1}".into()), (2, "{\"a\": 2}".into())]
        );
        assert_eq!(
            p.errors.iter().map(|e| e.index).collect::<Vec<_>>(),
            vec![1, 3]
        );
        assert!(p.errors[0].reason.contains("not a JSON object"));
    }

    #[test]
    fn broken_json_is_a_body_error() {
        let e = parse(&Bytes::from("[{\"a\":1},"), Framing::Json, 1024).expect_err("bad");
        assert!(e.0.contains("not a JSON array"), "{}", e.0);
        assert!(parse(&Bytes::from("{\"a\":"), Framing::Json, 1024).is_err());
        assert!(parse(&Bytes::from("   "), Framing::Json, 1024).is_err());
        assert!(parse(&Bytes::from("[]"), Framing::Json, 1024).is_err());
    }

    #[test]
    fn ndjson_reports_bad_lines_and_keeps_good_ones() {
        let body = "{\"a\":1}\n\n{\"a\":\n{\"a\":3}\r\n[1]\n";
        let p = parse(&Bytes::from(body), Framing::Ndjson, 1024).expect("ok");
        assert_eq!(
            rows(&p),
            vec![(0, "{\"a\":1}".into()), (2, "{\"a\":3}".into())]
        );
        let errors: Vec<_> = p.errors.iter().map(|e| (e.index, e.line)).collect();
        assert_eq!(errors, vec![(1, Some(3)), (3, Some(5))]);
    }

    #[test]
    fn oversized_rows_are_refused_alone() {
        let big = format!("{{\"a\":\"{}\"}}", "x".repeat(100));
        let body = format!("{{\"a\":1}}\n{big}\n");
        let p = parse(&Bytes::from(body), Framing::Ndjson, 50).expect("ok");
        assert_eq!(p.rows.len(), 1);
        assert!(p.errors[0].reason.contains("over the limit of 50"));
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
        assert_eq!(Framing::from_content_type(Some("text/plain")), None);
        assert_eq!(Framing::from_content_type(None), None);
    }
}
