//! What the connected nats-server can do, read off its version (`INFO`'s `version`).

/// Whether `version` ("2.9.10", "v2.10.5-beta") is `min` or later; an unreadable part
/// counts as 0.
pub fn at_least(version: &str, min: (u64, u64, u64)) -> bool {
    let mut parts = version
        .trim_start_matches('v')
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    let patch = parts.next().unwrap_or(0);
    (major, minor, patch) >= min
}

/// Stream-level compression (`compression: s2`), subject transforms: 2.10.
pub const STREAM_COMPRESSION: (u64, u64, u64) = (2, 10, 0);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_by_their_numbers() {
        assert!(!at_least("2.9.10", STREAM_COMPRESSION));
        assert!(at_least("2.10.0", STREAM_COMPRESSION));
        assert!(at_least("v2.15.1", STREAM_COMPRESSION));
        assert!(at_least("2.10.5-beta.1", (2, 10, 5)));
        assert!(!at_least("", (2, 10, 0)));
    }
}
