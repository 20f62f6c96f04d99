//! Free loopback ports.
//!
//! Why not `bind(127.0.0.1:0)`: the kernel answers that from its ephemeral range, the
//! same range every outgoing connection takes its local port from. A test stops a
//! server, and before it starts again on the same port one of the many client
//! connections on the machine (other tests, other servers) may be sitting on it:
//! "Address already in use" at restart. Ports picked outside the ephemeral range are
//! never taken that way; only another test picking the same random port could take
//! one, and with thousands to choose from that is rare (the servers' `start` functions
//! still retry with fresh ports when a child reports "address already in use").
//!
//! Inside this process the ports handed out are remembered, so two servers started
//! side by side never get the same one.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::ops::Range;
use std::sync::{Mutex, OnceLock};

use anyhow::{bail, Context, Result};
use rand::RngExt;

/// How many candidates are tried before giving up on finding an unused port.
const MAX_ATTEMPTS: usize = 256;

/// Below this, ports are left to well-known and registered services.
const LOWEST: u16 = 10_000;

/// Fewer candidates than this outside the ephemeral range, and the kernel picks.
const MIN_RANGE: u16 = 2_000;

/// Ports this process has handed out already.
fn handed_out() -> &'static Mutex<HashSet<u16>> {
    static PORTS: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    PORTS.get_or_init(|| Mutex::new(HashSet::new()))
}

/// A loopback TCP port that was free a moment ago, lies outside the kernel's ephemeral
/// range where it can, and that this process has not handed out before.
pub fn free_port() -> Result<u16> {
    let range = outside_ephemeral(ephemeral_range());
    for _ in 0..MAX_ATTEMPTS {
        let candidate = match &range {
            Some(r) => rand::rng().random_range(r.clone()),
            None => 0,
        };
        let Ok(listener) = TcpListener::bind((Ipv4Addr::LOCALHOST, candidate)) else {
            continue; // taken
        };
        let port = listener
            .local_addr()
            .context("reading the port of a bound socket")?
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

/// Marks `port` as taken by this process (a port bound directly, like the test
/// harness's fault proxy's, which it closes and reopens), so [`free_port`] never hands
/// it out.
pub fn reserve(port: u16) {
    handed_out()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert(port);
}

/// The kernel's ephemeral port range (Linux), or the common default where it cannot
/// be read.
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| parse_range(&text))
        .unwrap_or((32_768, 60_999))
}

fn parse_range(text: &str) -> Option<(u16, u16)> {
    let mut parts = text.split_whitespace().map(str::parse::<u16>);
    let low = parts.next()?.ok()?;
    let high = parts.next()?.ok()?;
    (low <= high).then_some((low, high))
}

/// The larger stretch of ports above [`LOWEST`] that the ephemeral range leaves, if it
/// is wide enough to pick from at random.
fn outside_ephemeral((low, high): (u16, u16)) -> Option<Range<u16>> {
    let below = LOWEST..low.max(LOWEST);
    let above = high.saturating_add(1).max(LOWEST)..u16::MAX;
    let wider = if below.len() >= above.len() {
        below
    } else {
        above
    };
    (wider.len() >= usize::from(MIN_RANGE)).then_some(wider)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_linux_range_leaves_the_ports_below_it() {
        assert_eq!(parse_range("32768\t60999\n"), Some((32_768, 60_999)));
        assert_eq!(outside_ephemeral((32_768, 60_999)), Some(10_000..32_768));
    }

    #[test]
    fn a_range_starting_low_leaves_the_ports_above_it() {
        assert_eq!(outside_ephemeral((1_024, 40_000)), Some(40_001..65_535));
    }

    #[test]
    fn a_range_covering_almost_everything_leaves_the_choice_to_the_kernel() {
        assert_eq!(outside_ephemeral((1_024, 65_000)), None);
        assert_eq!(parse_range("garbage"), None);
        assert_eq!(parse_range("60999 32768"), None);
    }

    #[test]
    fn ports_handed_out_are_outside_the_ephemeral_range_and_never_twice() {
        let (low, high) = ephemeral_range();
        let mut seen = HashSet::new();
        for _ in 0..50 {
            let port = free_port().expect("a free port");
            assert!(seen.insert(port), "port {port} handed out twice");
            if outside_ephemeral((low, high)).is_some() {
                assert!(!(low..=high).contains(&port), "port {port} is ephemeral");
            }
        }
    }
}
