//! The rule for headers that say who a request is or what it is: sent once.
//!
//! `Authorization`, `X-Tenant` and `Idempotency-Key` each decide something a second
//! copy could contradict, and which copy counts would be a guess: a proxy may append
//! its own after the client's, or a client library may add a key beside one the
//! caller set. So a request carrying one of them twice is refused (400), never read by
//! its first or its last value.

use axum::http::{HeaderMap, HeaderValue};

/// A header that must come once came more than once. Carries the header's name as
/// clients write it, for the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the {0} header is sent more than once: send it once (which one counts would be a guess)")]
pub struct RepeatedHeader(pub &'static str);

/// The one value of header `name` (lower case), if sent; `shown` names it in the error
/// when it was sent twice or more.
pub fn single<'h>(
    headers: &'h HeaderMap,
    name: &str,
    shown: &'static str,
) -> Result<Option<&'h HeaderValue>, RepeatedHeader> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    match values.next() {
        Some(_) => Err(RepeatedHeader(shown)),
        None => Ok(first),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_sent_twice_is_refused_even_with_one_value_twice() {
        let mut headers = HeaderMap::new();
        assert_eq!(single(&headers, "x-a", "X-A"), Ok(None));
        headers.append("x-a", HeaderValue::from_static("1"));
        assert_eq!(
            single(&headers, "x-a", "X-A").map(|v| v.cloned()),
            Ok(Some(HeaderValue::from_static("1")))
        );
        headers.append("x-a", HeaderValue::from_static("1"));
        let e = single(&headers, "x-a", "X-A").expect_err("twice");
        assert_eq!(e, RepeatedHeader("X-A"));
        assert!(
            e.to_string().contains("X-A header is sent more than once"),
            "{e}"
        );
    }
}
