//! One ClickHouse HTTP endpoint: the client, the URL, the credentials, and the three
//! things every request needs — a failed answer classified from its status, its
//! exception header and at most 4 KiB of its body; a transport failure described
//! without its URL (the URL carries the request's parameters: the tenant's SQL, an
//! insert's table and settings); and a TLS provider installed once. The insert client
//! and the query gateway both speak to ClickHouse through it.

use std::sync::Once;
use std::time::Duration;

use bytes::Bytes;
use sluice_actors::{ClickHouseError, NoAnswer};

use super::classify::{self, MAX_ERROR_BODY};
use crate::config::{Secret, TargetConfig};

/// What a query's body is (SQL in the body, settings in the URL).
pub const SQL_CONTENT_TYPE: &str = "text/plain; charset=UTF-8";

/// The header current ClickHouse servers put the exception code in (18.16 does not).
pub const EXCEPTION_CODE_HEADER: &str = "x-clickhouse-exception-code";

/// How an endpoint's connections are kept.
#[derive(Clone, Copy, Debug)]
pub struct Connections {
    pub connect_timeout: Duration,
    /// Below ClickHouse's own `keep_alive_timeout` (3 s by default, 18.16 too): a
    /// pooled connection the server is about to close would fail a request with a
    /// transport error that looks like an outage.
    pub idle_timeout: Duration,
    pub max_idle: usize,
    /// A whole-request timeout (`None`: the caller bounds each request itself, as the
    /// query gateway does with the query's deadline).
    pub request_timeout: Option<Duration>,
}

/// A ClickHouse HTTP endpoint with one user's credentials.
#[derive(Clone, Debug)]
pub struct Endpoint {
    client: reqwest::Client,
    url: reqwest::Url,
    user: String,
    /// Never logged: `Secret` prints `***`; it only reaches the basic-auth header.
    password: Option<Secret>,
}

// === impl Endpoint ===

impl Endpoint {
    pub fn new(
        url: &str,
        user: &str,
        password: Option<Secret>,
        connections: Connections,
    ) -> anyhow::Result<Self> {
        let mut builder = client_builder()
            .connect_timeout(connections.connect_timeout)
            .pool_idle_timeout(connections.idle_timeout)
            .pool_max_idle_per_host(connections.max_idle);
        if let Some(timeout) = connections.request_timeout {
            builder = builder.timeout(timeout);
        }
        let url = reqwest::Url::parse(&format!("{}/", url.trim_end_matches('/')))
            .map_err(|e| anyhow::anyhow!("ClickHouse url {url:?}: {e}"))?;
        Ok(Self {
            client: builder.build()?,
            url,
            user: user.to_string(),
            password,
        })
    }

    /// An endpoint of server `url` of `target`, as its insert user, keeping up to
    /// `max_idle` connections.
    pub fn of_target(target: &TargetConfig, url: &str, max_idle: usize) -> anyhow::Result<Self> {
        Self::new(
            url,
            &target.user,
            target.password.clone(),
            Connections {
                connect_timeout: target.connect_timeout,
                idle_timeout: target.pool_idle_timeout,
                max_idle,
                request_timeout: None,
            },
        )
    }

    /// A POST of `body` with these URL parameters (the query, settings, `query_id`).
    pub fn post<K: AsRef<str>, V: AsRef<str>>(
        &self,
        params: &[(K, V)],
        body: impl Into<reqwest::Body>,
    ) -> reqwest::RequestBuilder {
        let mut url = self.url.clone();
        if !params.is_empty() {
            url.query_pairs_mut().extend_pairs(params);
        }
        self.client
            .post(url)
            .basic_auth(&self.user, self.password.as_ref().map(Secret::expose))
            .body(body)
    }
}

/// A client builder with TLS ready (`https://` targets use rustls with the `ring`
/// provider, already in the build for NATS; reqwest is built without a default one and
/// would panic without it), no proxy from the environment (KILL QUERY has to reach the
/// same server), and no Nagle delay.
pub fn client_builder() -> reqwest::ClientBuilder {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // Err means another provider was installed first: that one is used, fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    reqwest::Client::builder().no_proxy().tcp_nodelay(true)
}

/// Classify a non-success answer from its status, exception header and at most
/// [`MAX_ERROR_BODY`] bytes of its body (the rest is never collected).
pub async fn read_error(mut response: reqwest::Response) -> ClickHouseError {
    let status = response.status().as_u16();
    let header = exception_code_header(response.headers());
    let body = read_capped(&mut response, MAX_ERROR_BODY).await;
    classify::from_response(status, header.as_deref(), &String::from_utf8_lossy(&body))
}

pub fn exception_code_header(headers: &reqwest::header::HeaderMap) -> Option<String> {
    headers
        .get(EXCEPTION_CODE_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Read at most `max` bytes of a body; a body cut short still says what it says so far.
pub async fn read_capped(response: &mut reqwest::Response, max: usize) -> Bytes {
    let mut out = Vec::new();
    while out.len() < max {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let take = chunk.len().min(max - out.len());
                out.extend_from_slice(&chunk[..take]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    Bytes::from(out)
}

/// A request that got no answer (refused, reset, closed, timed out, DNS), described
/// without its URL, with every cause, and saying so when it timed out.
pub fn transport_error(error: reqwest::Error) -> ClickHouseError {
    let connect = error.is_connect();
    let timeout = error.is_timeout();
    let error = error.without_url();
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    if timeout && !text.contains("timed out") {
        text.push_str(" (timed out)");
    }
    if connect {
        text = format!("cannot connect to ClickHouse: {text}");
    }
    let why = if connect {
        NoAnswer::Refused
    } else if timeout {
        NoAnswer::TimedOut
    } else {
        NoAnswer::Lost
    };
    classify::transport(why, text)
}
