//! Resetting a TCP connection instead of closing it.

use std::os::fd::AsRawFd;

use tokio::net::TcpStream;

/// Closes `stream` with an RST: with `SO_LINGER` set to zero seconds the kernel drops
/// unsent data and resets, so the client sees `ECONNRESET` rather than a clean EOF.
pub(crate) fn reset(stream: TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let size = libc::socklen_t::try_from(std::mem::size_of::<libc::linger>())
        .unwrap_or(libc::socklen_t::MAX);
    // SAFETY: the fd is valid while `stream` is alive; the option value points to a
    // properly sized `linger` that outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::addr_of!(linger).cast(),
            size,
        )
    };
    if rc != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "SO_LINGER failed; closing normally");
    }
    drop(stream);
}
