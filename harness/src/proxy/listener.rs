//! The listening port: accepts connections, and closes and reopens itself (on the same
//! port number) as the script asks for refusal or not.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;

use super::conn;
use super::control::Shared;

/// How often, and how long apart, reopening a port is tried before giving up.
const REBIND_ATTEMPTS: u32 = 40;
const REBIND_PAUSE: Duration = Duration::from_millis(50);

/// What the listening port is doing now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PortState {
    Open,
    Closed,
    /// Reopening failed (another process took the port meanwhile).
    Failed(String),
}

/// Binds `addr` with `SO_REUSEADDR`, so the port can be reopened right after closing.
pub(crate) fn bind(addr: SocketAddr) -> Result<TcpListener> {
    let socket = TcpSocket::new_v4().context("creating a listening socket")?;
    socket.set_reuseaddr(true).context("setting SO_REUSEADDR")?;
    socket
        .bind(addr)
        .with_context(|| format!("binding {addr}"))?;
    socket
        .listen(1024)
        .with_context(|| format!("listening on {addr}"))
}

async fn rebind(addr: SocketAddr) -> Result<TcpListener> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match bind(addr) {
            Ok(listener) => return Ok(listener),
            Err(error) if attempt >= REBIND_ATTEMPTS => return Err(error),
            Err(_) => tokio::time::sleep(REBIND_PAUSE).await,
        }
    }
}

/// Runs until aborted: accepts while the script wants the port open, holds it closed
/// otherwise, and reports every change through `state`.
pub(crate) async fn run(
    shared: Arc<Shared>,
    first: TcpListener,
    addr: SocketAddr,
    upstream: SocketAddr,
    state: watch::Sender<PortState>,
) {
    let mut want_open = shared.want_open.subscribe();
    let mut listener = Some(first);
    loop {
        let open = *want_open.borrow_and_update();
        if open && listener.is_none() {
            match rebind(addr).await {
                Ok(bound) => listener = Some(bound),
                Err(error) => {
                    tracing::warn!(%addr, error = %format!("{error:#}"), "proxy cannot reopen its port");
                    state.send_replace(PortState::Failed(format!("{error:#}")));
                }
            }
        } else if !open {
            // Dropping the listener makes the port refuse; connections still queued in
            // its backlog are reset by the kernel.
            listener = None;
        }
        if listener.is_some() == open {
            state.send_replace(if open {
                PortState::Open
            } else {
                PortState::Closed
            });
        }
        match &listener {
            Some(bound) => tokio::select! {
                accepted = bound.accept() => match accepted {
                    Ok((stream, _peer)) => {
                        let id = Shared::bump(&shared.accepted);
                        tokio::spawn(conn::serve(stream, Arc::clone(&shared), upstream, id));
                    }
                    Err(error) => {
                        tracing::warn!(%error, "proxy accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                },
                changed = want_open.changed() => if changed.is_err() { return },
            },
            None => {
                if want_open.changed().await.is_err() {
                    return;
                }
            }
        }
    }
}
