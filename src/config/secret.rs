//! A secret read from the environment: it never prints.

use std::fmt;
use std::sync::Arc;

use subtle::ConstantTimeEq as _;

/// A password or token. `Debug` and `Display` print `***`, so a secret cannot reach a
/// log line or the admin endpoint by accident; `expose` is the one way to read it.
/// There is no `==`: a presented token is compared with `matches` alone.
#[derive(Clone)]
pub struct Secret(Arc<str>);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(Arc::from(value.into()))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Compare with a presented token in time independent of where they differ (only
    /// a different length answers sooner, and a length is no secret worth keeping).
    pub fn matches(&self, presented: &str) -> bool {
        self.0.as_bytes().ct_eq(presented.as_bytes()).into()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s} {s:?}"), "*** ***");
        assert!(s.matches("hunter2"));
        assert!(!s.matches("hunter3"));
        assert!(!s.matches("hunter"));
    }
}
