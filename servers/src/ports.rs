//! Free loopback ports.
//!
//! Why not `bind(127.0.0.1:0)`: the kernel answers that from its ephemeral range, the
//! same range every outgoing connection takes its local port from. A test stops a
//! server, and before it starts again on the same port one of the many client
//! connections on the machine (other tests, other servers) may be sitting on it:
//! "Address already in use" at restart. Ports picked outside the ephemeral range are
//! never taken that way; only another test picking the same random port could take
//! one (the servers' `start` functions still retry with fresh ports when a child
//! reports "address already in use").
//!
//! Inside this process the ports handed out are remembered, so two servers started
//! side by side never get the same one. Across processes (nextest runs every test in
//! a process of its own) a port handed out is claimed by a file named after it in
//! `$TMPDIR/sluice-ports/` holding the claiming process's pid, created only if absent:
//! a test whose server is stopped keeps its port while another test picks ports. Once
//! random picks among thousands were taken to be enough; whole run 41 (2026-12-03)
//! showed otherwise: a test stopped its ClickHouse, another test's new ClickHouse got
//! that port, and the first test's Sluice inserted its 3,000 rows there (the second
//! test then counted them as its duplicates). A claim whose process is gone is taken
//! over.

use std::collections::HashSet;
use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::ops::Range;
use std::path::{Path, PathBuf};
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
        if !seen.insert(port) {
            continue;
        }
        if claim(&claims_dir(), port) {
            return Ok(port);
        }
    }
    bail!("no unused loopback port found after {MAX_ATTEMPTS} attempts")
}

/// Where the ports handed out by every process on the machine are claimed.
fn claims_dir() -> PathBuf {
    std::env::temp_dir().join("sluice-ports")
}

/// Claims `port` for this process in `dir`: true when no other live process holds it
/// (a claim of a process that is gone is taken over). A directory that cannot be
/// written claims nothing and stops nothing: the port is this process's alone then.
fn claim(dir: &Path, port: u16) -> bool {
    if std::fs::create_dir_all(dir).is_err() {
        return true;
    }
    let path = dir.join(port.to_string());
    // Twice at most: once, and once more after taking over a dead process's claim.
    for _ in 0..2 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut file) => {
                let _ = write!(file, "{}", std::process::id());
                return true;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let holder = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|text| text.trim().parse::<u32>().ok());
                match holder {
                    Some(pid) if pid == std::process::id() || alive(pid) => return false,
                    // Gone, or a claim being written this instant (no pid yet): a
                    // claim without a pid is left alone.
                    None => return false,
                    Some(_) => {
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
            Err(_) => return true,
        }
    }
    false
}

/// Whether a process with this pid exists.
fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // Signal 0 checks existence only; EPERM means it exists under another user.
    // SAFETY: kill with signal 0 sends nothing.
    let answer = unsafe { libc::kill(pid, 0) };
    answer == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// A free loopback address (`127.0.0.1:PORT`).
pub fn free_addr() -> Result<SocketAddr> {
    Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?)))
}

/// Marks `port` as taken by this process (a port bound directly, like the test
/// harness's fault proxy's, which it closes and reopens), so [`free_port`] never hands
/// it out.
pub fn reserve(port: u16) {
    let first = handed_out()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert(port);
    if first {
        // Bound already: claimed so other processes pass it over while it is closed.
        claim(&claims_dir(), port);
    }
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
    fn a_port_claimed_by_a_live_process_is_refused_and_a_dead_ones_claim_taken_over() {
        let dir = std::env::temp_dir().join(format!("sluice-ports-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(claim(&dir, 20_001), "a fresh port is claimed");
        assert!(!claim(&dir, 20_001), "claimed already, by this process");
        // pid 1 is always alive.
        std::fs::write(dir.join("20002"), "1").expect("writing a claim");
        assert!(!claim(&dir, 20_002), "held by a live process");
        // A pid above the kernel's maximum belongs to no process.
        std::fs::write(dir.join("20003"), "4194305").expect("writing a claim");
        assert!(
            claim(&dir, 20_003),
            "the claim of a process that is gone is taken over"
        );
        let holder = std::fs::read_to_string(dir.join("20003")).expect("reading the claim");
        assert_eq!(holder, std::process::id().to_string());
        let _ = std::fs::remove_dir_all(&dir);
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
