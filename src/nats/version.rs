//! What Sluice makes of a nats-server's version: the features it relies on that came
//! with a release, and the releases it warns against (docs/operations.md, "ClickHouse
//! and NATS versions").

use std::fmt::Write as _;

/// `2.10.23`: releases before it could delete a whole stream when the process crashed
/// (fixed in 2.10.23; Jepsen's analysis of NATS 2.12.1, 2025-12).
pub const STREAM_LOSS_FIXED_IN: (u64, u64, u64) = (2, 10, 23);

/// `2.10`: stream-level compression (`compression: s2`) and subject transforms.
pub const STREAM_COMPRESSION: (u64, u64, u64) = (2, 10, 0);

/// `2.10.5`: a discard-new `max_bytes` enforced without pruning old messages.
pub const DISCARD_NEW_EXACT: (u64, u64, u64) = (2, 10, 5);

/// Whether this nats-server enforces a discard-new `max_bytes` without pruning old
/// messages (the stream's budget can then be given to the server as it is).
pub fn discard_new_is_exact(version: &str) -> bool {
    parse(version) >= DISCARD_NEW_EXACT
}

/// `(major, minor, patch)` of `2.10.23` or `v2.9.10`; missing parts are 0.
pub fn parse(version: &str) -> (u64, u64, u64) {
    let mut parts = version
        .trim()
        .trim_start_matches('v')
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    let patch = parts.next().unwrap_or(0);
    (major, minor, patch)
}

/// The warning for a server too old to trust with the queue, if it is one.
pub fn warning(version: &str) -> Option<String> {
    if version.trim().is_empty() || parse(version) >= STREAM_LOSS_FIXED_IN {
        return None;
    }
    let (major, minor, patch) = STREAM_LOSS_FIXED_IN;
    Some(format!(
        "nats-server {version} is older than {major}.{minor}.{patch}: a crash of the process \
         could delete a whole stream there (Jepsen, NATS 2.12.1, 2025-12), the accepted rows \
         queued in it with it; upgrade to {major}.{minor}.{patch} or later"
    ))
}

/// One line naming the server and the features Sluice detected in it.
pub fn describe(version: &str) -> String {
    let mut out = format!("nats-server {version}");
    let exact = discard_new_is_exact(version);
    let _ = write!(
        out,
        ": discard-new byte budget {}",
        if exact {
            "enforced by the server"
        } else {
            "enforced by Sluice before each publish (the server prunes old messages past it, before 2.10.5)"
        }
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_before_2_10_23_are_warned_against() {
        for old in ["2.9.10", "v2.10.22", "2.10.0-beta", "1.4.1"] {
            let warning = warning(old).unwrap_or_default();
            assert!(
                warning.contains(&format!("nats-server {old} is older than 2.10.23")),
                "{old}: {warning}"
            );
        }
        for fine in ["2.10.23", "2.12.3", "2.15.1", "v3.0.0", ""] {
            assert_eq!(warning(fine), None, "{fine}");
        }
    }

    #[test]
    fn the_line_names_the_version_and_what_it_enforces() {
        assert!(describe("2.9.10").contains("enforced by Sluice"));
        assert_eq!(
            describe("2.15.1"),
            "nats-server 2.15.1: discard-new byte budget enforced by the server"
        );
    }
}
