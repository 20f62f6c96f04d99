//! Skipping a test whose server is not installed, except where every server must be.
//!
//! A developer without nats-server gets a printed notice instead of a failure; the test
//! command installs every server and sets `SLUICE_TEST_REQUIRE_SERVERS=1`, so in CI a
//! missing binary fails loudly instead of silently skipping half the suite.

use std::path::PathBuf;

use anyhow::{bail, Result};

/// When set (to anything but empty or `0`), a missing server fails the test.
pub const REQUIRE_SERVERS_ENV: &str = "SLUICE_TEST_REQUIRE_SERVERS";

/// Whether this run must have every server.
pub fn servers_required() -> bool {
    std::env::var(REQUIRE_SERVERS_ENV).is_ok_and(|value| !value.is_empty() && value != "0")
}

/// `Ok(Some(binary))` when found; when not, `Ok(None)` after printing a skip notice for
/// `test`, or an error if [`servers_required`].
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
    match found {
        Ok(binary) => Ok(Some(binary)),
        Err(error) if servers_required() => {
            bail!("{test}: {error:#} ({REQUIRE_SERVERS_ENV} is set, so this cannot be skipped)")
        }
        Err(error) => {
            eprintln!("SKIPPED {test}: {error:#}");
            Ok(None)
        }
    }
}
