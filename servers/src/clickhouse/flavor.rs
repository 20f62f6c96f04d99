//! Which ClickHouse engine a server runs: Debian's clickhouse-server 18.16, or the
//! current engine (PyPI `chdb-core`) behind the harness's HTTP front
//! (`servers/src/clickhouse/current/front.py`).
//!
//! `SLUICE_TEST_CLICKHOUSE` picks one for a whole test run, as `SLUICE_TEST_NATS` does
//! for nats-server, so the test command can run the tests that touch ClickHouse once
//! per engine.

use std::env;
use std::fmt;

use anyhow::{bail, Result};

/// Picks the engine for a test run: `debian` (default) or `current`.
pub const CLICKHOUSE_FLAVOR_ENV: &str = "SLUICE_TEST_CLICKHOUSE";

/// The Python that has `chdb` (scripts/test exports the one it installed it into);
/// `python3` when unset.
pub const CHDB_PYTHON_ENV: &str = "SLUICE_CHDB_PYTHON";

/// The `chdb-core` release the current engine is pinned to (scripts/lib.sh installs
/// it): engine 26.9.2.1.
pub const CHDB_CORE_VERSION: &str = "26.9.0";

/// A ClickHouse engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClickHouseFlavor {
    /// Debian's `clickhouse-server` (18.16 on bookworm), or the binary
    /// `SLUICE_CLICKHOUSE_SERVER_BIN` names.
    #[default]
    Debian,
    /// The current engine, chdb 26.9, behind the harness's HTTP front: no Replicated
    /// tables, one statement at a time (see the front's own list).
    Current,
}

// === impl ClickHouseFlavor ===

impl ClickHouseFlavor {
    /// The engine this test run asked for (`SLUICE_TEST_CLICKHOUSE`, default `debian`).
    pub fn from_env() -> Result<Self> {
        match env::var(CLICKHOUSE_FLAVOR_ENV) {
            Err(env::VarError::NotPresent) => Ok(Self::Debian),
            Ok(value) => Self::parse(&value),
            Err(env::VarError::NotUnicode(value)) => {
                bail!("{CLICKHOUSE_FLAVOR_ENV}={value:?} is not valid UTF-8")
            }
        }
    }

    /// `debian` or `current` (case-insensitive; empty means `debian`).
    pub fn parse(value: &str) -> Result<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "debian" => Ok(Self::Debian),
            "current" => Ok(Self::Current),
            other => bail!("{CLICKHOUSE_FLAVOR_ENV}={other:?}: expected `debian` or `current`"),
        }
    }

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Debian => "debian",
            Self::Current => "current",
        }
    }

    /// The codes a refused login answers (wrong password, unknown user): 193 and 192 on
    /// 18.16; current servers say AUTHENTICATION_FAILED (516) for both, not telling
    /// which.
    pub fn refused_login_codes(self) -> (u32, u32) {
        match self {
            Self::Debian => (193, 192),
            Self::Current => (516, 516),
        }
    }

    /// Whether this engine knows the settings 18.16 does not (`async_insert`,
    /// `insert_deduplication_token`, `deduplicate_insert`,
    /// `deduplicate_blocks_in_dependent_materialized_views`): Sluice sends them there.
    pub fn knows_current_settings(self) -> bool {
        self == Self::Current
    }

    /// Whether this engine can hold Replicated tables (shards, replicas, ZooKeeper).
    pub fn replicates(self) -> bool {
        self == Self::Debian
    }
}

impl fmt::Display for ClickHouseFlavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pin_is_the_one_scripts_install() {
        let lib = include_str!("../../../scripts/lib.sh");
        assert!(
            lib.contains(&format!("\nCHDB_CORE_VERSION={CHDB_CORE_VERSION}\n")),
            "scripts/lib.sh installs another chdb-core than {CHDB_CORE_VERSION}"
        );
    }

    #[test]
    fn parses_engine_names() -> Result<()> {
        assert_eq!(ClickHouseFlavor::parse("debian")?, ClickHouseFlavor::Debian);
        assert_eq!(
            ClickHouseFlavor::parse(" Current ")?,
            ClickHouseFlavor::Current
        );
        assert_eq!(ClickHouseFlavor::parse("")?, ClickHouseFlavor::Debian);
        let error = ClickHouseFlavor::parse("26.9")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("expected `debian` or `current`"), "{error}");
        Ok(())
    }
}
