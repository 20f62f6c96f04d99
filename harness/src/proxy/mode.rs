//! What the proxy does with a request: the fault modes and canned answers.

use std::time::Duration;

use bytes::Bytes;

/// What the proxy does with the next request (or, for [`Mode::Refuse`], with the port).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward to the upstream and copy its answer back.
    PassThrough,
    /// Close the listening port, so connecting fails with "connection refused", and
    /// reset every open connection. The port is opened again (same number) when the
    /// mode changes. As an entry of a script (which applies to one request on an
    /// already-accepted connection) it acts as [`Mode::Reset`], the nearest a single
    /// request can get to a refusal.
    Refuse,
    /// Read part of the request (the head and at most half of the body), then reset the
    /// connection (`SO_LINGER` 0: the client sees `ECONNRESET`, not a clean close).
    Reset,
    /// Read the whole request and never answer; the socket stays open until the client
    /// gives up, the proxy is switched to [`Mode::Refuse`] or dropped.
    Stall,
    /// Wait this long, then pass through: a slow server.
    Delay(Duration),
    /// Read the whole request, then answer exactly this (the upstream never sees it).
    Respond(Respond),
    /// Forward the request and wait for the upstream's whole answer, then reset the
    /// client instead of copying it back: the request was carried out (an INSERT is
    /// committed) and the client never hears so. The ambiguous failure an exactly-once
    /// path must survive.
    AnswerLost,
}

/// A canned HTTP answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Respond {
    pub status: u16,
    /// Sent in order, as given. `Content-Length` is added unless present (or unless a
    /// `Transfer-Encoding` is given, in which case the body must already be encoded).
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

/// The version current-server answers claim to be.
const MODERN_VERSION: &str = "24.8.1.1";

// === impl Respond ===

impl Respond {
    /// `status` with no headers and an empty body.
    pub fn new(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    /// Adds a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// A bare status with an empty body: what a load balancer in front of ClickHouse
    /// answers (`status_only(503)`), no exception code anywhere.
    pub fn status_only(status: u16) -> Self {
        Self::new(status)
    }

    /// `200 OK` with a tab-separated body, as ClickHouse answers a query (use it to
    /// emulate e.g. a `system.settings` lookup on a server of another version).
    pub fn ok(body: impl Into<Bytes>) -> Self {
        Self::new(200)
            .header("Content-Type", "text/tab-separated-values; charset=UTF-8")
            .body(body)
    }

    /// A current ClickHouse's error: status 500, header `X-ClickHouse-Exception-Code`,
    /// body `Code: 252. DB::Exception: <msg>. (TOO_MANY_PARTS) (version 24.8.1.1)` and
    /// a newline, as servers end it.
    pub fn clickhouse_modern(code: u32, name: &str, message: &str) -> Self {
        Self::new(500)
            .header("Content-Type", "text/plain; charset=UTF-8")
            .header("X-ClickHouse-Exception-Code", code.to_string())
            .body(format!(
                "Code: {code}. DB::Exception: {message}. ({name}) (version {MODERN_VERSION})\n"
            ))
    }

    /// An old (18.x) ClickHouse's error: status 500, no code header, body
    /// `Code: 252, e.displayText() = DB::Exception: <msg>, e.what() = DB::Exception` and
    /// a newline. (A real 18.16 also answers some errors with other statuses: 404 for
    /// an unknown identifier or setting, 401 for a wrong password; build those with
    /// [`Respond::new`].)
    pub fn clickhouse_old(code: u32, message: &str) -> Self {
        Self::new(500)
            .header("Content-Type", "text/plain; charset=UTF-8")
            .body(format!(
                "Code: {code}, e.displayText() = DB::Exception: {message}, e.what() = DB::Exception\n"
            ))
    }

    /// A short description for the request log.
    pub(crate) fn describe(&self) -> String {
        format!("respond {}", self.status)
    }
}

impl From<Respond> for Mode {
    fn from(respond: Respond) -> Self {
        Self::Respond(respond)
    }
}

// === impl Mode ===

impl Mode {
    /// A short description for the request log ("pass", "respond 503", ...).
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::PassThrough => "pass".into(),
            Self::Refuse => "refuse".into(),
            Self::Reset => "reset".into(),
            Self::Stall => "stall".into(),
            Self::Delay(by) => format!("delay {by:?}"),
            Self::Respond(respond) => respond.describe(),
            Self::AnswerLost => "forward, then lose the answer".into(),
        }
    }
}

/// The reason phrase for a status line.
pub(crate) fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}
