//! An HTTP fault injector to put between Sluice and ClickHouse.
//!
//! It listens on a loopback port and, per request, does what its script says: pass
//! through to the upstream, answer something canned, reset, stall, or (for the whole
//! port) refuse connections. The script is a list of rules (text in the query or body
//! → mode), then a queue of modes for the next requests, then a fallback mode; it can
//! be changed at any time while clients are connected. Every request is counted and
//! logged so a test can check what Sluice actually sent.
//!
//! Built on a small hand-written HTTP/1.1 layer (`httparse` for heads, explicit body
//! framing) instead of a server library, because the faults need the raw socket: reset
//! halfway through a request, keep a socket open without ever answering, or close the
//! port itself. Keep-alive works: several requests on one client connection each get
//! their own mode, and passed-through ones go upstream on fresh connections.

mod conn;
mod control;
mod http;
mod listener;
mod mode;
mod record;
mod rule;
mod socket;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use control::Shared;
use listener::PortState;

pub use mode::{Mode, Respond};
pub use record::{RequestRecord, BODY_PREFIX_BYTES};
pub use rule::{Match, Rule};

/// How long a mode change may take to open or close the port.
const PORT_CHANGE_DEADLINE: Duration = Duration::from_secs(5);

/// A running fault proxy. Dropping it resets every connection and ends the listener
/// task, which closes the port once the runtime has dropped that task: right after the
/// drop, not during it (a `Drop` cannot wait for the runtime), so a test that needs the
/// port closed polls for it.
#[derive(Debug)]
pub struct FaultProxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    upstream: SocketAddr,
    port_state: watch::Receiver<PortState>,
    task: JoinHandle<()>,
}

// === impl FaultProxy ===

impl FaultProxy {
    /// Starts a proxy to `upstream` on a free loopback port, in pass-through mode.
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        let first = listener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
        let addr = first.local_addr().context("reading the proxy's address")?;
        crate::ports::reserve(addr.port());
        let shared = Arc::new(Shared::new());
        let (state, port_state) = watch::channel(PortState::Open);
        let task = tokio::spawn(listener::run(
            Arc::clone(&shared),
            first,
            addr,
            upstream,
            state,
        ));
        Ok(Self {
            shared,
            addr,
            upstream,
            port_state,
            task,
        })
    }

    /// Where clients connect: `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `http://127.0.0.1:PORT`, to give Sluice as its ClickHouse URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Sets the mode for every request from now on (clearing any queued modes). For
    /// [`Mode::Refuse`] the port is closed when this returns; for any other mode, open.
    pub async fn set_mode(&self, mode: impl Into<Mode>) -> Result<()> {
        let mode = mode.into();
        self.shared.edit(|script| {
            script.queue.clear();
            script.fallback = mode;
        });
        self.settle().await
    }

    /// Replaces the queue: the next requests get `modes` one each, in order, and every
    /// request after them gets `then`. E.g. three 503s, then pass through.
    pub async fn script<I>(&self, modes: I, then: impl Into<Mode>) -> Result<()>
    where
        I: IntoIterator,
        I::Item: Into<Mode>,
    {
        let then = then.into();
        let modes: Vec<Mode> = modes.into_iter().map(Into::into).collect();
        self.shared.edit(|script| {
            script.queue = modes.into();
            script.fallback = then;
        });
        self.settle().await
    }

    /// Appends modes to the queue (after those still waiting).
    pub async fn enqueue<I>(&self, modes: I) -> Result<()>
    where
        I: IntoIterator,
        I::Item: Into<Mode>,
    {
        self.shared
            .edit(|script| script.queue.extend(modes.into_iter().map(Into::into)));
        self.settle().await
    }

    /// Adds a rule; rules are tried in the order added, before the queue and fallback.
    pub fn add_rule(&self, rule: Rule) {
        self.shared.edit(|script| script.rules.push(rule));
    }

    pub fn clear_rules(&self) {
        self.shared.edit(|script| script.rules.clear());
    }

    /// The fallback mode (what requests get once the queue is empty).
    pub fn mode(&self) -> Mode {
        self.shared.read(|script| script.fallback.clone())
    }

    /// How many queued modes are still waiting for a request.
    pub fn queued(&self) -> usize {
        self.shared.read(|script| script.queue.len())
    }

    /// Requests received (whatever was done with them), counted once the proxy has
    /// acted on them: a request whose client vanished halfway through is not counted.
    pub fn requests_seen(&self) -> u64 {
        Shared::count(&self.shared.seen)
    }

    /// Requests sent on to the upstream.
    pub fn requests_forwarded(&self) -> u64 {
        Shared::count(&self.shared.forwarded)
    }

    /// Client connections accepted: with keep-alive, fewer than requests.
    pub fn connections_accepted(&self) -> u64 {
        Shared::count(&self.shared.accepted)
    }

    /// Every request seen so far (since the last [`FaultProxy::clear_requests`]).
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.records()
    }

    /// The requests numbered `first` and after (see [`RequestRecord::seq`]), in order:
    /// those seen after a moment at which [`FaultProxy::requests_seen`] was `first`.
    pub fn requests_since(&self, first: u64) -> Vec<RequestRecord> {
        self.shared.records_since(first)
    }

    /// Empties the request log (the counters keep counting).
    pub fn clear_requests(&self) {
        self.shared.clear_records();
    }

    /// Waits until at least `n` requests have been seen in total.
    pub async fn wait_for_requests(&self, n: u64, deadline: Duration) -> Result<()> {
        crate::wait_until(
            &format!("the proxy to see {n} requests"),
            deadline,
            Duration::from_millis(10),
            || async move { self.requests_seen() >= n },
        )
        .await
    }

    /// Waits until the log holds a request numbered `first` or after (`0`: any) that
    /// `which` picks, and returns the first such; `what` names it in the timeout error.
    pub async fn wait_for_request(
        &self,
        first: u64,
        what: &str,
        deadline: Duration,
        which: impl Fn(&RequestRecord) -> bool,
    ) -> Result<RequestRecord> {
        let which = &which;
        crate::wait_for(what, deadline, Duration::from_millis(10), || async move {
            self.requests_since(first)
                .into_iter()
                .find(|record| which(record))
                .context("none in the proxy's log yet")
        })
        .await
    }

    /// Waits until the port is as the script wants it (open, or closed when refusing).
    async fn settle(&self) -> Result<()> {
        let want_open = *self.shared.want_open.borrow();
        let mut state = self.port_state.clone();
        let reached = tokio::time::timeout(
            PORT_CHANGE_DEADLINE,
            state.wait_for(|state| match state {
                PortState::Open => want_open,
                PortState::Closed => !want_open,
                PortState::Failed(_) => true,
            }),
        )
        .await;
        match reached {
            Err(_) => bail!(
                "the proxy's port did not {} within {PORT_CHANGE_DEADLINE:?}",
                if want_open { "open" } else { "close" }
            ),
            Ok(Err(_)) => bail!("the proxy's listener task has ended"),
            Ok(Ok(state)) => match &*state {
                PortState::Failed(error) => bail!("the proxy cannot reopen {}: {error}", self.addr),
                _ => Ok(()),
            },
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.shared
            .reset_all
            .send_modify(|generation| *generation += 1);
    }
}
