//! One HTTP/1 connection, with a watchdog that closes it when its client is too slow
//! or gone quiet: hyper alone would keep a connection open for as long as its client
//! trickles bytes, or sends none at all.
//!
//! What is timed (`ListenerLimits`):
//! - `idle_timeout`: no request in progress (a new connection, or one between two
//!   requests), or an answer the client does not read: no byte written for that long.
//! - `header_timeout`: from a request's first byte to the end of its headers.
//! - `body_timeout`: from the end of the headers to the end of the body; a body still
//!   arriving then ends in error, and the answer is 408 with the connection closed.
//!
//! A handler that takes its time (a query waiting on ClickHouse) is not timed here: the
//! surfaces have their own deadlines.
//!
//! hyper's own `header_read_timeout` runs from the moment a connection goes idle, so it
//! cannot tell a quiet keep-alive connection from slow headers; the watchdog tracks the
//! phases itself, from the bytes the socket reads and the requests the service sees.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{Request, Response};
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{Notify, OwnedSemaphorePermit};
use tokio::time::Instant;
use tower::ServiceExt as _;

use crate::config::ListenerLimits;
use crate::http::body_deadline::{BodyTimedOut, Deadline};
use tokio_util::sync::CancellationToken;

/// What a connection is bound by, and how its listener is named in messages.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// `[api]` or `[admin]`: where the operator finds the keys.
    pub section: &'static str,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Bounds {
    pub fn new(section: &'static str, limits: &ListenerLimits) -> Self {
        Bounds {
            section,
            header_timeout: limits.header_timeout,
            body_timeout: limits.body_timeout,
            idle_timeout: limits.idle_timeout,
        }
    }
}

/// Serve one accepted connection until it ends, is timed out, or the listener stops
/// (then the request in progress is answered first). `_permit` is its place under the
/// listener's connection cap, given back when this returns.
pub async fn serve(
    stream: TcpStream,
    router: Router,
    bounds: Bounds,
    shutdown: CancellationToken,
    _permit: OwnedSemaphorePermit,
) {
    let activity = Arc::new(Activity::new(Instant::now()));
    let io = TokioIo::new(Watched {
        stream,
        activity: activity.clone(),
    });
    let service = Guarded {
        router,
        activity: activity.clone(),
        bounds,
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The watchdog times headers; hyper's timer would also cut idle keep-alives short.
    builder.header_read_timeout(None);
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let mut stopping = false;
    loop {
        let now = Instant::now();
        // While a handler runs there is no deadline: look again after a while.
        let wake = activity
            .deadline(&bounds)
            .unwrap_or(now + bounds.idle_timeout.min(bounds.header_timeout));
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            _ = shutdown.cancelled(), if !stopping => {
                // A request whose headers are not all in has not been taken yet: its
                // client will send it again elsewhere. One being handled is answered.
                if matches!(activity.phase(), Phase::Idle | Phase::Headers) {
                    return;
                }
                stopping = true;
                connection.as_mut().graceful_shutdown();
            }
            // The first byte of a request: the header clock, shorter than idle's, starts.
            _ = activity.head_began.notified() => {}
            _ = tokio::time::sleep_until(wake) => {
                if activity.deadline(&bounds).is_some_and(|d| d <= Instant::now()) {
                    tracing::debug!(listener = bounds.section, phase = ?activity.phase(), "closing a connection past its timeout");
                    // Dropping the connection closes the socket.
                    return;
                }
            }
        }
    }
}

// === Activity ===

/// What a connection is doing, as its watchdog sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// No request in progress.
    Idle,
    /// A request's headers are arriving.
    Headers,
    /// A handler runs.
    Handling,
    /// An answer is being written.
    Answering,
}

/// Where a connection is: what its watchdog times.
struct Activity {
    state: Mutex<Phases>,
    /// Wakes the watchdog when a request begins to arrive on an idle connection.
    head_began: Notify,
}

struct Phases {
    /// Handlers running (their request is in, their answer not yet).
    handling: usize,
    /// Answers being written.
    answering: usize,
    /// When the connection last had no request in progress.
    idle_since: Instant,
    /// When the first byte of the next request arrived, while idle.
    head_since: Option<Instant>,
    last_write: Instant,
}

impl Activity {
    fn new(now: Instant) -> Self {
        Activity {
            state: Mutex::new(Phases {
                handling: 0,
                answering: 0,
                idle_since: now,
                head_since: None,
                last_write: now,
            }),
            head_began: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, Phases> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When the connection is to be closed if nothing changes; `None` while a handler
    /// runs.
    fn deadline(&self, bounds: &Bounds) -> Option<Instant> {
        let s = self.state();
        if s.handling > 0 {
            None
        } else if s.answering > 0 {
            Some(s.last_write + bounds.idle_timeout)
        } else if let Some(since) = s.head_since {
            Some(since + bounds.header_timeout)
        } else {
            Some(s.idle_since + bounds.idle_timeout)
        }
    }

    fn phase(&self) -> Phase {
        let s = self.state();
        match (s.handling, s.answering, s.head_since) {
            (h, _, _) if h > 0 => Phase::Handling,
            (_, a, _) if a > 0 => Phase::Answering,
            (_, _, Some(_)) => Phase::Headers,
            _ => Phase::Idle,
        }
    }

    /// Bytes came in: while idle, the next request has begun.
    fn read(&self) {
        let mut s = self.state();
        if s.handling == 0 && s.answering == 0 && s.head_since.is_none() {
            s.head_since = Some(Instant::now());
            self.head_began.notify_one();
        }
    }

    fn wrote(&self) {
        self.state().last_write = Instant::now();
    }

    /// A request's headers are in and its handler starts.
    fn begin(self: &Arc<Self>) -> Busy {
        let mut s = self.state();
        s.handling += 1;
        s.head_since = None;
        Busy {
            activity: self.clone(),
            answering: false,
        }
    }
}

/// A request in progress: its handler runs, then its answer is written. Dropped with
/// the answer (or with the handler, if the connection goes first).
struct Busy {
    activity: Arc<Activity>,
    answering: bool,
}

impl Busy {
    fn answer(&mut self) {
        let mut s = self.activity.state();
        s.handling -= 1;
        s.answering += 1;
        s.last_write = Instant::now();
        self.answering = true;
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut s = self.activity.state();
        if self.answering {
            s.answering -= 1;
        } else {
            s.handling -= 1;
        }
        if s.handling == 0 && s.answering == 0 {
            s.idle_since = Instant::now();
        }
    }
}

// === Watched: the socket, telling the watchdog about its bytes ===

struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.read();
        }
        polled
    }
}

impl Watched {
    /// A write's outcome, counted as activity when it wrote anything.
    fn wrote(&self, polled: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.wrote(polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.wrote(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

// === Guarded: the router, each request timed ===

struct Guarded {
    router: Router,
    activity: Arc<Activity>,
    bounds: Bounds,
}

impl hyper::service::Service<Request<Incoming>> for Guarded {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future =
        Pin<Box<dyn Future<Output = Result<Response<Body>, std::convert::Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let mut busy = self.activity.begin();
        let bounds = self.bounds;
        let timed_out = Arc::new(AtomicBool::new(false));
        let request = request.map(|body| {
            Body::new(Deadline::new(
                body,
                BodyTimedOut::new(bounds.body_timeout, bounds.section),
                timed_out.clone(),
            ))
        });
        let router = self.router.clone();
        Box::pin(async move {
            let Ok(response) = router.oneshot(request).await;
            busy.answer();
            // Whatever the handler made of the failed read (it counts it as 408 where
            // it knows the error, `body_timed_out`), the answer is the listener's.
            let response = if timed_out.load(Ordering::SeqCst) {
                BodyTimedOut::new(bounds.body_timeout, bounds.section).answer()
            } else {
                response
            };
            Ok(response.map(|body| Body::new(Answer { body, _busy: busy })))
        })
    }
}

/// An answer's body, keeping its request counted as in progress until it is written.
struct Answer {
    body: Body,
    _busy: Busy,
}

impl hyper::body::Body for Answer {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds {
        section: "[api]",
        header_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(60),
    };

    #[tokio::test(start_paused = true)]
    async fn each_phase_has_its_deadline() {
        let t0 = Instant::now();
        let activity = Arc::new(Activity::new(t0));
        // A new connection is idle.
        assert_eq!(activity.deadline(&BOUNDS), Some(t0 + BOUNDS.idle_timeout));
        // Its first byte starts the header clock, which more bytes do not reset.
        tokio::time::advance(Duration::from_secs(5)).await;
        activity.read();
        assert_eq!(activity.phase(), Phase::Headers);
        let head = t0 + Duration::from_secs(5) + BOUNDS.header_timeout;
        assert_eq!(activity.deadline(&BOUNDS), Some(head));
        tokio::time::advance(Duration::from_secs(1)).await;
        activity.read();
        assert_eq!(activity.deadline(&BOUNDS), Some(head));
        // Headers in: no deadline while the handler runs, whatever it reads.
        let mut busy = activity.begin();
        activity.read();
        assert_eq!(activity.deadline(&BOUNDS), None);
        // The answer is being written: a client that stops reading it is timed.
        tokio::time::advance(Duration::from_secs(100)).await;
        busy.answer();
        let t1 = Instant::now();
        assert_eq!(activity.deadline(&BOUNDS), Some(t1 + BOUNDS.idle_timeout));
        tokio::time::advance(Duration::from_secs(7)).await;
        activity.wrote();
        assert_eq!(
            activity.deadline(&BOUNDS),
            Some(t1 + Duration::from_secs(7) + BOUNDS.idle_timeout)
        );
        // Written: idle again, from now.
        drop(busy);
        let t2 = Instant::now();
        assert_eq!(activity.phase(), Phase::Idle);
        assert_eq!(activity.deadline(&BOUNDS), Some(t2 + BOUNDS.idle_timeout));
    }

    #[tokio::test(start_paused = true)]
    async fn a_handler_dropped_before_its_answer_leaves_the_connection_idle() {
        let activity = Arc::new(Activity::new(Instant::now()));
        let busy = activity.begin();
        assert_eq!(activity.phase(), Phase::Handling);
        drop(busy);
        assert_eq!(activity.phase(), Phase::Idle);
        assert!(activity.deadline(&BOUNDS).is_some());
    }
}
