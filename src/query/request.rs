//! The request body of `POST /v1/query` and its validation.
//!
//! Parsed by hand from bytes rather than with axum's `Json` extractor so that every
//! refusal is a 400 with the gateway's JSON error body (axum answers some with 415/422
//! and plain text), and strictly: an unknown field is an error naming it, because a
//! misspelt `timeout_ms` silently falling back to the default is worse than a 400.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::sql;

/// The most parameters one query may carry.
pub const MAX_PARAMS: usize = 256;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequest {
    sql: String,
    #[serde(default)]
    params: BTreeMap<String, serde_json::Value>,
    timeout_ms: Option<u64>,
    format: Option<String>,
}

/// The output format: both carry `meta` (names and types) beside the rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Rows as objects: `{"meta": [...], "data": [{"x": 1}], "rows": 1, ...}`.
    Json,
    /// Rows as arrays: `{"meta": [...], "data": [[1]], "rows": 1, ...}`.
    JsonCompact,
}

impl Format {
    pub fn clickhouse_name(self) -> &'static str {
        match self {
            Format::Json => "JSON",
            Format::JsonCompact => "JSONCompact",
        }
    }
}

/// A request that passed every check the gateway can make without ClickHouse.
#[derive(Clone, Debug)]
pub struct ValidQuery {
    pub sql: String,
    /// `(name, value)` pairs, sent as `param_<name>=<value>`.
    pub params: Vec<(String, String)>,
    pub timeout: Duration,
    pub format: Format,
}

/// Why a request is refused before it reaches ClickHouse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// 400: the body is not the JSON the gateway takes.
    Invalid(String),
    /// The SQL check refused the statement (403 for a write, 400 otherwise).
    Sql(sql::SqlError),
    /// 408: the body did not arrive within the listener's `body_timeout` (answered by
    /// the listener; counted here as what the client sees).
    BodyTimedOut(String),
}

impl RequestError {
    pub fn message(&self) -> String {
        match self {
            RequestError::Invalid(m) | RequestError::BodyTimedOut(m) => m.clone(),
            RequestError::Sql(e) => e.to_string(),
        }
    }
}

/// Limits the request is checked against.
#[derive(Clone, Copy, Debug)]
pub struct RequestLimits {
    pub default_timeout: Duration,
    pub max_timeout: Duration,
}

pub fn parse(body: &[u8], limits: RequestLimits) -> Result<ValidQuery, RequestError> {
    let raw: RawRequest = serde_json::from_slice(body).map_err(|e| {
        RequestError::Invalid(format!(
            "the body must be a JSON object {{\"sql\": \"...\", \"params\"?: {{...}}, \"timeout_ms\"?: N, \"format\"?: \"JSON\" | \"JSONCompact\"}}: {e}"
        ))
    })?;

    if raw.sql.trim().is_empty() {
        return Err(RequestError::Invalid("sql is empty".into()));
    }
    sql::check_read_only(&raw.sql).map_err(RequestError::Sql)?;

    let max_ms = limits.max_timeout.as_millis();
    let timeout = match raw.timeout_ms {
        None => limits.default_timeout,
        Some(0) => {
            return Err(RequestError::Invalid(
                "timeout_ms must be at least 1".into(),
            ))
        }
        Some(ms) if u128::from(ms) > max_ms => {
            return Err(RequestError::Invalid(format!(
                "timeout_ms = {ms} exceeds the maximum of {max_ms} ms"
            )))
        }
        Some(ms) => Duration::from_millis(ms),
    };

    let format = match raw.format.as_deref() {
        None => Format::Json,
        Some(f) if f.eq_ignore_ascii_case("json") => Format::Json,
        Some(f) if f.eq_ignore_ascii_case("jsoncompact") => Format::JsonCompact,
        Some(f) => {
            return Err(RequestError::Invalid(format!(
                "format {f:?} is not offered: use \"JSON\" or \"JSONCompact\""
            )))
        }
    };

    if raw.params.len() > MAX_PARAMS {
        return Err(RequestError::Invalid(format!(
            "{} params: at most {MAX_PARAMS} per query",
            raw.params.len()
        )));
    }
    let mut params = Vec::with_capacity(raw.params.len());
    for (name, value) in raw.params {
        if !is_param_name(&name) {
            return Err(RequestError::Invalid(format!(
                "param name {name:?} is not an identifier ([A-Za-z_][A-Za-z0-9_]*, at most 128 characters)"
            )));
        }
        let text = param_text(&name, value)?;
        params.push((name, text));
    }

    Ok(ValidQuery {
        sql: raw.sql,
        params,
        timeout,
        format,
    })
}

/// Parameter names become part of an HTTP parameter name (`param_<name>`): identifiers only.
pub fn is_param_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && s.len() <= 128
}

/// A JSON value as the text ClickHouse parses a parameter from. Arrays and objects
/// have no single ClickHouse text form, so the caller writes it: `"[1,2]"`.
fn param_text(name: &str, value: serde_json::Value) -> Result<String, RequestError> {
    use serde_json::Value;
    match value {
        Value::String(s) => Ok(s),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(if b { "true" } else { "false" }.into()),
        Value::Null => Ok("\\N".into()),
        Value::Array(_) | Value::Object(_) => Err(RequestError::Invalid(format!(
            "param {name:?}: arrays and objects are passed as their ClickHouse text, e.g. \"[1,2]\" or \"{{'a':1}}\""
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: RequestLimits = RequestLimits {
        default_timeout: Duration::from_secs(10),
        max_timeout: Duration::from_secs(60),
    };

    fn invalid(body: &str) -> String {
        match parse(body.as_bytes(), LIMITS) {
            Err(RequestError::Invalid(m)) => m,
            other => panic!("{body}: expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn minimal_request_takes_the_defaults() {
        let q = parse(br#"{"sql": "SELECT 1"}"#, LIMITS).expect("valid");
        assert_eq!(q.sql, "SELECT 1");
        assert_eq!(q.timeout, Duration::from_secs(10));
        assert_eq!(q.format, Format::Json);
        assert!(q.params.is_empty());
    }

    #[test]
    fn every_field() {
        let q = parse(
            br#"{"sql": "SELECT {a:UInt8}, {b:String}", "params": {"a": 1, "b": "x y", "c": true, "d": null}, "timeout_ms": 1500, "format": "jsoncompact"}"#,
            LIMITS,
        )
        .expect("valid");
        assert_eq!(q.timeout, Duration::from_millis(1500));
        assert_eq!(q.format, Format::JsonCompact);
        assert_eq!(
            q.params,
            vec![
                ("a".into(), "1".into()),
                ("b".into(), "x y".into()),
                ("c".into(), "true".into()),
                ("d".into(), "\\N".into())
            ]
        );
    }

    #[test]
    fn bad_json_and_unknown_fields() {
        assert!(invalid("not json").contains("JSON object"));
        assert!(invalid("{}").contains("sql"));
        assert!(
            invalid(r#"{"sql": 1}"#).contains("sql") || invalid(r#"{"sql": 1}"#).contains("string")
        );
        assert!(invalid(r#"{"sql": "SELECT 1", "timeout": 5}"#).contains("timeout"));
    }

    #[test]
    fn empty_sql() {
        assert_eq!(invalid(r#"{"sql": "   "}"#), "sql is empty");
        assert!(matches!(
            parse(br#"{"sql": "-- nothing"}"#, LIMITS),
            Err(RequestError::Sql(sql::SqlError::Empty))
        ));
    }

    #[test]
    fn timeout_bounds_name_the_max() {
        assert!(
            invalid(r#"{"sql": "SELECT 1", "timeout_ms": 60001}"#).contains("maximum of 60000 ms")
        );
        assert!(parse(br#"{"sql": "SELECT 1", "timeout_ms": 60000}"#, LIMITS).is_ok());
        assert!(invalid(r#"{"sql": "SELECT 1", "timeout_ms": 0}"#).contains("at least 1"));
        assert!(invalid(r#"{"sql": "SELECT 1", "timeout_ms": -5}"#).contains("JSON object"));
    }

    #[test]
    fn formats() {
        assert!(invalid(r#"{"sql": "SELECT 1", "format": "TSV"}"#).contains("JSONCompact"));
        let q = parse(br#"{"sql": "SELECT 1", "format": "JSON"}"#, LIMITS).expect("valid");
        assert_eq!(q.format.clickhouse_name(), "JSON");
    }

    #[test]
    fn param_names_are_identifiers() {
        assert!(
            invalid(r#"{"sql": "SELECT 1", "params": {"a&readonly=0": 1}}"#)
                .contains("not an identifier")
        );
        assert!(
            invalid(r#"{"sql": "SELECT 1", "params": {"1a": 1}}"#).contains("not an identifier")
        );
        assert!(invalid(r#"{"sql": "SELECT 1", "params": {"a": [1]}}"#).contains("[1,2]"));
    }

    #[test]
    fn writes_come_back_as_sql_errors() {
        match parse(br#"{"sql": "DROP TABLE t"}"#, LIMITS) {
            Err(RequestError::Sql(e)) => assert!(e.is_write()),
            other => panic!("{other:?}"),
        }
    }
}
