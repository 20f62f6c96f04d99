//! A listener's accept loop: at most `cap` connections at once, each served by
//! `connection::serve`, and a graceful stop that answers the requests in progress.
//!
//! The cap is taken before `accept`, so beyond it new connections wait in the kernel's
//! backlog and hold no descriptor of this process.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::connection::{self, Bounds};
use tokio_util::sync::CancellationToken;

/// How often "at its cap" is logged at most while the cap stays reached.
const CAP_WARNING_EVERY: Duration = Duration::from_secs(30);

/// Serve `router` on `listener` until `shutdown`, then wait for every connection to
/// finish its request in progress.
pub async fn serve(
    name: &'static str,
    listener: TcpListener,
    router: Router,
    bounds: Bounds,
    cap: usize,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let permits = Arc::new(Semaphore::new(cap));
    let mut connections = JoinSet::new();
    let mut warned_at: Option<Instant> = None;
    loop {
        while connections.try_join_next().is_some() {}
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                if warned_at.is_none_or(|at| at.elapsed() >= CAP_WARNING_EVERY) {
                    warned_at = Some(Instant::now());
                    tracing::warn!(listener = name, cap, section = bounds.section, "the listener holds as many connections as max_connections allows; new ones wait until one closes");
                }
                tokio::select! {
                    permit = permits.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => break,
                    },
                    _ = shutdown.cancelled() => break,
                }
            }
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.cancelled() => break,
        };
        match accepted {
            Ok((stream, _peer)) => {
                connections.spawn(connection::serve(
                    stream,
                    router.clone(),
                    bounds,
                    shutdown.clone(),
                    permit,
                ));
            }
            // The client left before it was accepted: nothing to do.
            Err(e) if is_connection_error(&e) => {}
            Err(e) => {
                // Out of descriptors (the reserve is used up by something else) or
                // memory: wait a moment rather than spin, as hyper's own loop does.
                tracing::warn!(listener = name, error = %e, "accepting a connection failed; trying again in 1 s");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = shutdown.cancelled() => break,
                }
            }
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}
