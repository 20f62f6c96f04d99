//! What a test does when its server is not installed: it fails, naming the missing
//! binary and how to install it, unless the person running it said skipping is fine.
//!
//! A test that passes without having run is a lie a reviewer cannot see, so failing is
//! the default. `SLUICE_TEST_ALLOW_SKIP=1` (a developer without ClickHouse, say) turns
//! a missing server into a skip: the test returns early and prints a
//! [`SKIP_MARKER`] line, and appends one line to the file named by
//! `SLUICE_TEST_SKIP_LOG` when that is set, so a runner can count the skips (nextest
//! counts such a test as passed). The test command installs every server and sets
//! `SLUICE_TEST_REQUIRE_SERVERS=1`, which wins over the permission to skip.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Result};

/// When set (to anything but empty or `0`), a missing server fails the test even where
/// skipping is allowed.
pub const REQUIRE_SERVERS_ENV: &str = "SLUICE_TEST_REQUIRE_SERVERS";

/// When set (to anything but empty or `0`), a missing server skips the test instead of
/// failing it.
pub const ALLOW_SKIP_ENV: &str = "SLUICE_TEST_ALLOW_SKIP";

/// A file each skip appends one line to (`<SKIP_MARKER> <test>: <why>`).
pub const SKIP_LOG_ENV: &str = "SLUICE_TEST_SKIP_LOG";

/// The start of the line a skipped test prints.
pub const SKIP_MARKER: &str = "SLUICE-TEST-SKIPPED";

/// What a test does about a missing server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SkipPolicy {
    /// Fail, and say how to install the server or allow skipping (the default).
    Fail,
    /// Fail: the run must have every server (`SLUICE_TEST_REQUIRE_SERVERS`).
    Require,
    /// Skip with a marker line (`SLUICE_TEST_ALLOW_SKIP`).
    Skip,
}

/// The verdict on one test.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    Run(PathBuf),
    /// Skip it; the marker line to print.
    Skip(String),
}

// === impl SkipPolicy ===

impl SkipPolicy {
    /// The policy the environment asks for.
    fn from_env() -> Self {
        Self::from_flags(flag(REQUIRE_SERVERS_ENV), flag(ALLOW_SKIP_ENV))
    }

    fn from_flags(required: bool, allow_skip: bool) -> Self {
        match (required, allow_skip) {
            (true, _) => Self::Require,
            (false, true) => Self::Skip,
            (false, false) => Self::Fail,
        }
    }

    /// Run when found; skip when allowed; otherwise an error naming the missing binary
    /// (what `found` says) and the way out.
    fn decide(self, test: &str, found: Result<PathBuf>) -> Result<Decision> {
        let error = match found {
            Ok(binary) => return Ok(Decision::Run(binary)),
            Err(error) => error,
        };
        match self {
            Self::Require => {
                bail!("{test}: {error:#} ({REQUIRE_SERVERS_ENV} is set, so this cannot be skipped)")
            }
            Self::Fail => bail!(
                "{test} cannot run without its server: {error:#}\n(scripts/test installs \
                 every server the tests start; {ALLOW_SKIP_ENV}=1 skips the tests whose \
                 server is missing instead of failing them)"
            ),
            Self::Skip => Ok(Decision::Skip(format!("{SKIP_MARKER} {test}: {error:#}"))),
        }
    }
}

/// Whether this run must have every server.
pub fn servers_required() -> bool {
    SkipPolicy::from_env() == SkipPolicy::Require
}

/// `Ok(Some(binary))` when found; when not, an error that names the binary and how to
/// install it, or (with `SLUICE_TEST_ALLOW_SKIP=1`) `Ok(None)` after printing a skip
/// marker for `test`. See [`SkipPolicy`].
///
/// ```no_run
/// # async fn t() -> anyhow::Result<()> {
/// use sluice_harness::{available, NatsFlavor};
/// let Some(_binary) = available("jetstream_keeps_its_store", NatsFlavor::Current.binary())? else {
///     return Ok(());
/// };
/// # Ok(()) }
/// ```
pub fn available(test: &str, found: Result<PathBuf>) -> Result<Option<PathBuf>> {
    match SkipPolicy::from_env().decide(test, found)? {
        Decision::Run(binary) => Ok(Some(binary)),
        Decision::Skip(line) => {
            record_skip(&line);
            Ok(None)
        }
    }
}

fn flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|value| !value.is_empty() && value != "0")
}

/// Prints the skip line, and appends it to the skip log when one is named. A log that
/// cannot be written is said on stderr: the skip itself stands.
fn record_skip(line: &str) {
    eprintln!("{line}");
    let Some(path) = std::env::var_os(SKIP_LOG_ENV).filter(|p| !p.is_empty()) else {
        return;
    };
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| writeln!(file, "{line}"));
    if let Err(e) = written {
        eprintln!(
            "cannot append to {SKIP_LOG_ENV}={}: {e}",
            PathBuf::from(path).display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn missing() -> Result<PathBuf> {
        bail!("clickhouse-server is not installed: run `apt-get install clickhouse-server`")
    }

    #[test]
    fn a_missing_server_fails_unless_skipping_is_allowed() {
        assert_eq!(SkipPolicy::from_flags(false, false), SkipPolicy::Fail);
        let error = SkipPolicy::Fail
            .decide("some_test", missing())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            error.contains("some_test cannot run without its server"),
            "{error}"
        );
        assert!(
            error.contains("apt-get install clickhouse-server"),
            "names the binary and its package: {error}"
        );
        assert!(error.contains("SLUICE_TEST_ALLOW_SKIP=1"), "{error}");
    }

    #[test]
    fn requiring_servers_wins_over_allowing_skips() {
        assert_eq!(SkipPolicy::from_flags(true, true), SkipPolicy::Require);
        let error = SkipPolicy::Require
            .decide("some_test", missing())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            error.contains("SLUICE_TEST_REQUIRE_SERVERS is set"),
            "{error}"
        );
    }

    #[test]
    fn an_allowed_skip_skips_and_a_found_server_runs() -> Result<()> {
        assert_eq!(SkipPolicy::from_flags(false, true), SkipPolicy::Skip);
        let Decision::Skip(line) = SkipPolicy::Skip.decide("some_test", missing())? else {
            bail!("not skipped");
        };
        assert!(
            line.starts_with("SLUICE-TEST-SKIPPED some_test: clickhouse-server"),
            "{line}"
        );
        for policy in [SkipPolicy::Fail, SkipPolicy::Require, SkipPolicy::Skip] {
            let found = policy.decide("some_test", Ok(PathBuf::from("/usr/sbin/x")))?;
            assert_eq!(found, Decision::Run(PathBuf::from("/usr/sbin/x")));
        }
        Ok(())
    }
}
