//! File descriptors: the process's limit raised as far as it may go, and the HTTP
//! listeners' connection caps derived from it so that a reserve always stays free for
//! NATS, ClickHouse and files.
//!
//! Why: every accepted connection holds a descriptor. With no cap, 20,000 idle clients
//! took the process to its limit and inserts to ClickHouse failed with "Too many open
//! files" until they left. Beyond its cap a listener stops accepting; further
//! connections wait in the kernel's backlog and cost this process nothing.

use std::io;

/// The descriptor limit, before and after raising it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    pub was: u64,
    pub now: u64,
}

/// Raise the soft `RLIMIT_NOFILE` to the hard limit (the most an unprivileged process
/// may take). A hard limit of "unlimited" is taken as 1,048,576 (Linux's usual
/// `fs.nr_open`); a soft limit that cannot be raised is kept as it is.
pub fn raise_limit() -> io::Result<Limit> {
    const UNLIMITED_AS: u64 = 1 << 20;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given, nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let was = limit.rlim_cur;
    let hard = if limit.rlim_max == libc::RLIM_INFINITY {
        UNLIMITED_AS
    } else {
        limit.rlim_max
    };
    if hard <= was {
        return Ok(Limit { was, now: was });
    }
    let raised = libc::rlimit {
        rlim_cur: hard,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: setrlimit reads the struct it is given, nothing else.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        let error = io::Error::last_os_error();
        tracing::warn!(%error, soft = was, hard, "cannot raise the descriptor limit; keeping the soft limit");
        return Ok(Limit { was, now: was });
    }
    Ok(Limit { was, now: hard })
}

/// How many connections each listener may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    pub api: usize,
    pub admin: usize,
}

/// The caps within `limit - reserve`: the admin listener's as configured (its cap is
/// small), the API's as configured or else all the rest. A configured cap that does
/// not fit is lowered, with a warning saying so; no room at all is an error.
pub fn caps(
    limit: u64,
    reserve: usize,
    api: Option<usize>,
    admin: usize,
) -> Result<(Caps, Option<String>), String> {
    let room = usize::try_from(limit)
        .unwrap_or(usize::MAX)
        .saturating_sub(reserve);
    if room < 2 {
        return Err(format!(
            "the descriptor limit ({limit}) leaves no room for HTTP connections beyond [api] fd_reserve = {reserve}: raise the limit (ulimit -n, LimitNOFILE=) or lower the reserve"
        ));
    }
    let admin_cap = admin.min(room / 2).max(1);
    let api_room = room - admin_cap;
    let api_cap = api.unwrap_or(api_room).min(api_room);
    let lowered = (admin_cap < admin || api.is_some_and(|a| a > api_cap)).then(|| {
        format!(
            "the descriptor limit ({limit}) minus [api] fd_reserve = {reserve} leaves room for {room} connections: the caps are lowered to {api_cap} (api) and {admin_cap} (admin)"
        )
    });
    Ok((
        Caps {
            api: api_cap,
            admin: admin_cap,
        },
        lowered,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_takes_what_the_reserve_and_the_admin_cap_leave() {
        let (c, warning) = caps(65_536, 256, None, 64).expect("room");
        assert_eq!(
            c,
            Caps {
                api: 65_216,
                admin: 64
            }
        );
        assert_eq!(warning, None);
        let (c, warning) = caps(65_536, 256, Some(1000), 64).expect("room");
        assert_eq!(
            c,
            Caps {
                api: 1000,
                admin: 64
            }
        );
        assert_eq!(warning, None);
    }

    #[test]
    fn caps_that_do_not_fit_are_lowered_with_a_warning() {
        let (c, warning) = caps(1024, 256, Some(5000), 64).expect("room");
        assert_eq!(
            c,
            Caps {
                api: 704,
                admin: 64
            }
        );
        assert!(warning
            .expect("warned")
            .contains("lowered to 704 (api) and 64 (admin)"));
        let (c, warning) = caps(300, 256, None, 64).expect("room");
        assert_eq!(c, Caps { api: 22, admin: 22 });
        assert!(warning.is_some());
        let e = caps(256, 256, None, 64).expect_err("no room");
        assert!(e.contains("fd_reserve = 256"), "{e}");
    }

    #[test]
    fn raising_never_lowers_the_limit() {
        let limit = raise_limit().expect("getrlimit");
        assert!(limit.now >= limit.was, "{limit:?}");
    }
}
