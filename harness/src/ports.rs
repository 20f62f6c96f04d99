//! Free loopback ports.
//!
//! A port is found by binding `127.0.0.1:0`, reading what the kernel chose and closing
//! the socket again, so the server we start next can bind it. That leaves a small
//! window in which another process may take the port; the servers' `start` functions
//! retry with fresh ports when a child reports "address already in use". Inside this
//! process the ports handed out are remembered, so two servers started side by side
//! never get the same one.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::{Mutex, OnceLock};

use anyhow::{bail, Context, Result};

/// How many times the kernel is asked before giving up on finding an unused port.
const MAX_ATTEMPTS: usize = 64;

/// Ports this process has handed out already.
fn handed_out() -> &'static Mutex<HashSet<u16>> {
    static PORTS: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    PORTS.get_or_init(|| Mutex::new(HashSet::new()))
}

/// A loopback TCP port that was free a moment ago and that this process has not handed
/// out before.
pub fn free_port() -> Result<u16> {
    for _ in 0..MAX_ATTEMPTS {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .context("binding 127.0.0.1:0 to find a free port")?;
        let port = listener
            .local_addr()
            .context("reading the port the kernel chose")?
            .port();
        drop(listener);
        let mut seen = handed_out()
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if seen.insert(port) {
            return Ok(port);
        }
    }
    bail!("no unused loopback port found after {MAX_ATTEMPTS} attempts")
}

/// A free loopback address (`127.0.0.1:PORT`).
pub fn free_addr() -> Result<SocketAddr> {
    Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?)))
}

/// Marks `port` as taken by this process (a port bound directly, like the fault
/// proxy's, which it closes and reopens), so [`free_port`] never hands it out.
pub(crate) fn reserve(port: u16) {
    handed_out()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert(port);
}
