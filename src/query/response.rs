//! Relaying a result from ClickHouse to the client under a byte cap.
//!
//! ClickHouse runs every query with `wait_end_of_query=1`, so an error (including its
//! own `max_result_rows` / `max_result_bytes` overflow) arrives as a proper status
//! before any row, never half-way through a 200. ClickHouse counts those limits in
//! in-memory bytes, though, and JSON text is larger, so the gateway also caps the bytes
//! it relays (`[query] max_result_bytes`).
//!
//! To keep that cap a clear error and memory bounded at once, the relay works in two
//! phases:
//! 1. up to [`PREFIX_WINDOW`] bytes (or the cap, if smaller) are read before the status
//!    is chosen. A result that ends inside the window is answered whole; one that
//!    crosses the cap inside it gets a 400 saying so. Most results end here.
//! 2. a longer result is streamed: the window is sent, then each chunk as it arrives.
//!    Crossing the cap now, after the 200 went out, aborts the response: the chunked
//!    body is never terminated, so every HTTP client reports an incomplete body
//!    (never a silently truncated result), and the gateway logs it with the query id.
//!    The 200 carries `X-Sluice-Result-Cap` so a client can tell why.
//!
//! Memory per query is bounded by the window plus one chunk, whatever the result size.

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures::stream;
use tokio::time::Instant;

use super::id::QueryId;
use super::limits::Admission;
use crate::clickhouse::endpoint;
use sluice_actors::ClickHouseError;

/// Bytes read before committing to a 200.
pub const PREFIX_WINDOW: usize = 1 << 20;

/// The header a 200 carries with the byte cap applied to it.
pub const RESULT_CAP_HEADER: &str = "x-sluice-result-cap";

/// A successful answer, ready to relay.
#[derive(Debug)]
pub enum Relay {
    /// The whole result, read within the window.
    Complete { content_type: String, body: Bytes },
    /// The window read so far and the rest still to come.
    Streaming {
        content_type: String,
        prefix: Bytes,
        rest: reqwest::Response,
        cap: u64,
    },
}

#[derive(Debug)]
pub enum RelayError {
    /// The result crossed the cap before the status was sent.
    TooLarge { cap: u64 },
    /// The connection failed while the result was being read.
    Transport(ClickHouseError),
}

impl Relay {
    pub fn content_type(&self) -> &str {
        match self {
            Relay::Complete { content_type, .. } | Relay::Streaming { content_type, .. } => {
                content_type
            }
        }
    }
}

/// Phase 1: read the window of a successful answer.
pub async fn read_window(mut response: reqwest::Response, cap: u64) -> Result<Relay, RelayError> {
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let window = usize::try_from(cap)
        .unwrap_or(usize::MAX)
        .min(PREFIX_WINDOW);
    let mut buf = BytesMut::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                buf.extend_from_slice(&chunk);
                if buf.len() as u64 > cap {
                    return Err(RelayError::TooLarge { cap });
                }
                if buf.len() > window {
                    return Ok(Relay::Streaming {
                        content_type,
                        prefix: buf.freeze(),
                        rest: response,
                        cap,
                    });
                }
            }
            Ok(None) => {
                return Ok(Relay::Complete {
                    content_type,
                    body: buf.freeze(),
                })
            }
            Err(e) => return Err(RelayError::Transport(endpoint::transport_error(e))),
        }
    }
}

/// Phase 2: the body of the 200. It holds the query's admission until the last byte
/// (or the abort), so a slow reader still counts against the concurrency limits.
pub fn body(relay: Relay, admission: Admission, id: QueryId, deadline: Instant) -> Body {
    match relay {
        Relay::Complete { body, .. } => {
            drop(admission);
            Body::from(body)
        }
        Relay::Streaming {
            prefix, rest, cap, ..
        } => {
            let state = StreamState {
                prefix: Some(prefix.clone()),
                relayed: prefix.len() as u64,
                rest,
                cap,
                id,
                deadline,
                done: false,
                _admission: admission,
            };
            Body::from_stream(stream::unfold(state, next_chunk))
        }
    }
}

struct StreamState {
    prefix: Option<Bytes>,
    relayed: u64,
    rest: reqwest::Response,
    cap: u64,
    id: QueryId,
    deadline: Instant,
    done: bool,
    _admission: Admission,
}

async fn next_chunk(mut s: StreamState) -> Option<(Result<Bytes, std::io::Error>, StreamState)> {
    if s.done {
        return None;
    }
    if let Some(prefix) = s.prefix.take() {
        return Some((Ok(prefix), s));
    }
    let abort = |s: &mut StreamState, why: String| {
        tracing::warn!(query_id = %s.id, relayed = s.relayed, "result relay aborted: {why}");
        s.done = true;
        std::io::Error::other(why)
    };
    match tokio::time::timeout_at(s.deadline, s.rest.chunk()).await {
        Ok(Ok(Some(chunk))) => {
            s.relayed += chunk.len() as u64;
            if s.relayed > s.cap {
                let why = format!("the result crossed the {} byte cap", s.cap);
                let e = abort(&mut s, why);
                return Some((Err(e), s));
            }
            Some((Ok(chunk), s))
        }
        Ok(Ok(None)) => None,
        Ok(Err(e)) => {
            let msg = endpoint::transport_error(e).message;
            let e = abort(&mut s, format!("reading from ClickHouse failed: {msg}"));
            Some((Err(e), s))
        }
        Err(_) => {
            let e = abort(&mut s, "the query's deadline passed while relaying".into());
            Some((Err(e), s))
        }
    }
}
