//! The body timeout of a listener: a request body that has not arrived within
//! `body_timeout` ends in error ([`BodyTimedOut`]); the request is answered 408 and the
//! connection closes (the rest of the body may still be on its way). A handler that
//! counts its answers by status sees the error ([`body_timed_out`]) and counts 408.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, Response, StatusCode};
use hyper::body::{Frame, Incoming, SizeHint};
use tokio::time::Sleep;

/// Why a request body failed: it did not arrive within the body timeout of its
/// listener (`section`: `[api]` or `[admin]`, where the key is).
#[derive(Clone, Copy, Debug, thiserror::Error)]
#[error("the request body did not arrive within {} ({section} body_timeout)", humantime::format_duration(*.timeout))]
pub struct BodyTimedOut {
    timeout: Duration,
    section: &'static str,
}

impl BodyTimedOut {
    pub fn new(timeout: Duration, section: &'static str) -> Self {
        Self { timeout, section }
    }

    /// The listener's answer: 408 with the reason, and the connection closed.
    pub fn answer(&self) -> Response<Body> {
        let body = serde_json::json!({ "error": self.to_string() });
        let mut response = Response::new(Body::from(body.to_string()));
        *response.status_mut() = StatusCode::REQUEST_TIMEOUT;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        response
    }
}

/// The body timeout, when it is what failed a body read (`error` or any error under
/// it: axum wraps a body's error, and an extractor's rejection wraps that).
pub fn body_timed_out<'e>(
    error: &'e (dyn std::error::Error + 'static),
) -> Option<&'e BodyTimedOut> {
    let mut current = Some(error);
    // Bounded by the chain: each error is visited once.
    while let Some(e) = current {
        if let Some(timed_out) = e.downcast_ref::<BodyTimedOut>() {
            return Some(timed_out);
        }
        current = e.source();
    }
    None
}

/// A request body that ends in error once its deadline passes.
pub struct Deadline {
    body: Incoming,
    sleep: Pin<Box<Sleep>>,
    why: BodyTimedOut,
    /// Set when the deadline passed: the listener answers 408, whatever the handler did.
    timed_out: Arc<AtomicBool>,
}

impl Deadline {
    pub fn new(body: Incoming, why: BodyTimedOut, timed_out: Arc<AtomicBool>) -> Self {
        Self {
            body,
            sleep: Box::pin(tokio::time::sleep(why.timeout)),
            why,
            timed_out,
        }
    }
}

impl hyper::body::Body for Deadline {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if this.sleep.as_mut().poll(cx).is_ready() {
            this.timed_out.store(true, Ordering::SeqCst);
            return Poll::Ready(Some(Err(this.why.into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
