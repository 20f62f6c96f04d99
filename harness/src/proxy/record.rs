//! What the proxy saw: one record per request, for tests to inspect.

use super::rule::percent_decode;

/// How much of each body is kept in the log.
pub const BODY_PREFIX_BYTES: usize = 1024;

/// One request the proxy received, and what it did with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    /// 0 for the first request the proxy saw, counting up.
    pub seq: u64,
    /// Which client connection carried it (0 for the first accepted, counting up):
    /// requests on one keep-alive connection share the number.
    pub connection: u64,
    pub method: String,
    /// The request target as sent: path and query (`/?query=INSERT...&async_insert=0`).
    pub uri: String,
    pub headers: Vec<(String, String)>,
    /// The first [`BODY_PREFIX_BYTES`] of the (de-chunked) body, lossy UTF-8.
    pub body_prefix: String,
    /// How many body bytes the proxy read (all of them, except for a reset).
    pub body_len: usize,
    /// What the proxy did: `pass`, `reset`, `stall`, `respond 503`, `delay 1s`,
    /// `refuse`; prefixed with `rule N: ` when a rule decided it.
    pub action: String,
    /// Whether the upstream's answer (its status line) came back to the proxy: false
    /// while a passed request is out, and for every request not passed. A freeze that
    /// catches an insert still out at the moment it froze tells it by this.
    pub answered: bool,
}

// === impl RequestRecord ===

impl RequestRecord {
    /// `POST /?query=...`
    pub fn request_line(&self) -> String {
        format!("{} {}", self.method, self.uri)
    }

    /// The path without the query.
    pub fn path(&self) -> &str {
        self.uri.split_once('?').map_or(&self.uri, |(path, _)| path)
    }

    /// The raw query string, if any.
    pub fn query(&self) -> Option<&str> {
        self.uri.split_once('?').map(|(_, query)| query)
    }

    /// The decoded value of the first query parameter called `name`; `Some("")` for a
    /// parameter without a value.
    pub fn query_param(&self, name: &str) -> Option<String> {
        self.query()?.split('&').find_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(key) == name).then(|| percent_decode(value))
        })
    }

    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The decoded query string plus the body prefix: where a statement is, whichever
    /// way the client sent it.
    pub fn sql_text(&self) -> String {
        let query = self.query().map(percent_decode).unwrap_or_default();
        format!("{query}\n{}", self.body_prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(uri: &str) -> RequestRecord {
        RequestRecord {
            seq: 0,
            connection: 0,
            method: "POST".into(),
            uri: uri.into(),
            headers: vec![("X-ClickHouse-User".into(), "ingest".into())],
            body_prefix: "{\"a\":1}".into(),
            body_len: 7,
            action: "pass".into(),
            answered: false,
        }
    }

    #[test]
    fn reads_query_parameters() {
        let r = record("/?query=INSERT%20INTO%20t+FORMAT+JSONEachRow&async_insert=0&flag");
        assert_eq!(r.path(), "/");
        assert_eq!(
            r.query_param("query").as_deref(),
            Some("INSERT INTO t FORMAT JSONEachRow")
        );
        assert_eq!(r.query_param("async_insert").as_deref(), Some("0"));
        assert_eq!(r.query_param("flag").as_deref(), Some(""));
        assert_eq!(r.query_param("insert_deduplication_token"), None);
        assert_eq!(r.header("x-clickhouse-user"), Some("ingest"));
        assert!(r.sql_text().contains("INSERT INTO t"));
        assert_eq!(record("/ping").query(), None);
    }
}
