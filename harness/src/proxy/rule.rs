//! Rules: a mode for the requests that contain some text, ahead of the script.
//!
//! Sluice asks a server what it supports (`SELECT ... FROM system.settings`) through the
//! same connection it inserts through; a rule answers that question as a server of
//! another version would while inserts go on as the mode says.

use super::mode::Mode;

/// Where a rule looks for its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Match {
    /// The URI's query string, raw or percent-decoded (`+` read as a space).
    Query(String),
    /// The request body (de-chunked).
    Body(String),
    /// Either of them.
    Any(String),
}

/// A mode for the requests that match, optionally only a number of times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub(crate) matcher: Match,
    pub(crate) mode: Mode,
    pub(crate) remaining: Option<u64>,
}

// === impl Rule ===

impl Rule {
    pub fn new(matcher: Match, mode: impl Into<Mode>) -> Self {
        Self {
            matcher,
            mode: mode.into(),
            remaining: None,
        }
    }

    /// Requests whose query string contains `text` (raw or decoded).
    pub fn query_contains(text: impl Into<String>, mode: impl Into<Mode>) -> Self {
        Self::new(Match::Query(text.into()), mode)
    }

    /// Requests whose body contains `text`.
    pub fn body_contains(text: impl Into<String>, mode: impl Into<Mode>) -> Self {
        Self::new(Match::Body(text.into()), mode)
    }

    /// Requests whose query string or body contains `text`: where a client puts its
    /// SQL (URL or body) does not matter.
    pub fn contains(text: impl Into<String>, mode: impl Into<Mode>) -> Self {
        Self::new(Match::Any(text.into()), mode)
    }

    /// Applies to the next `n` matching requests only, then is removed.
    pub fn times(mut self, n: u64) -> Self {
        self.remaining = Some(n);
        self
    }

    /// Whether matching needs the request body.
    pub(crate) fn needs_body(&self) -> bool {
        !matches!(self.matcher, Match::Query(_))
    }

    pub(crate) fn matches(&self, query: Option<&str>, body: Option<&[u8]>) -> bool {
        let in_query = |text: &str| {
            query.is_some_and(|query| query.contains(text) || percent_decode(query).contains(text))
        };
        let in_body = |text: &str| body.is_some_and(|body| contains_bytes(body, text.as_bytes()));
        match &self.matcher {
            Match::Query(text) => in_query(text),
            Match::Body(text) => in_body(text),
            Match::Any(text) => in_query(text) || in_body(text),
        }
    }
}

fn contains_bytes(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty()
        || haystack
            .windows(needle.len())
            .any(|window| window == needle)
}

/// Decodes `%XX` escapes and `+` (form encoding's space); invalid escapes stay as they
/// are, invalid UTF-8 is replaced.
pub(crate) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(high), Some(low)) => {
                    out.push(high << 4 | low);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            other => out.push(other),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_query_strings() {
        assert_eq!(percent_decode("a%20b+c%3D"), "a b c=");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }

    #[test]
    fn matches_query_and_body() {
        let rule = Rule::contains("system.settings", Mode::Stall);
        assert!(rule.matches(Some("query=SELECT+1+FROM+system.settings"), None));
        assert!(rule.matches(None, Some(b"SELECT name FROM system.settings")));
        assert!(!rule.matches(Some("query=SELECT+1"), Some(b"")));
        let query_only = Rule::query_contains("async_insert=0", Mode::Stall);
        assert!(!query_only.needs_body());
        assert!(!query_only.matches(None, Some(b"async_insert=0")));
    }
}
