//! The ClickHouse HTTP endpoint queries go to: one HTTP client, the query user's
//! credentials, and the two helpers every request needs (classify a failed answer
//! from at most 4 KiB of its body; describe a transport failure without its URL).

use std::time::Duration;

use axum::http::HeaderMap;
use sluice_actors::InsertError;

use crate::clickhouse::classify;
use crate::config::Secret;

/// The header current ClickHouse servers put the exception code in (18.16 does not).
pub const EXCEPTION_CODE_HEADER: &str = "x-clickhouse-exception-code";

#[derive(Clone, Debug)]
pub struct Endpoint {
    client: reqwest::Client,
    url: reqwest::Url,
    user: String,
    /// Never logged: `Secret` prints `***`; it only reaches the basic-auth header.
    password: Option<Secret>,
}

impl Endpoint {
    /// `timeout`: a whole-request timeout for this client (`None`: the caller bounds
    /// each request itself, as the gateway does with the query's deadline).
    pub fn new(
        url: &str,
        user: &str,
        password: Option<Secret>,
        connect_timeout: Duration,
        timeout: Option<Duration>,
    ) -> anyhow::Result<Self> {
        ensure_crypto_provider();
        let mut builder = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            // Below ClickHouse's own `keep_alive_timeout` (3 s by default, 18.16 too):
            // a pooled connection the server is about to close would fail a request
            // with a transport error that looks like an outage.
            .pool_idle_timeout(Duration::from_secs(2))
            // An HTTP proxy from the environment must not sit between Sluice and
            // ClickHouse unannounced: KILL QUERY has to reach the same server.
            .no_proxy();
        if let Some(t) = timeout {
            builder = builder.timeout(t);
        }
        let client = builder.build()?;
        let url = reqwest::Url::parse(url)
            .map_err(|e| anyhow::anyhow!("[query] target url {url:?}: {e}"))?;
        Ok(Endpoint {
            client,
            url,
            user: user.to_string(),
            password,
        })
    }

    /// A POST of `sql` with these URL parameters (settings, `query_id`, `param_*`).
    pub fn post(&self, params: &[(String, String)], sql: String) -> reqwest::RequestBuilder {
        let mut url = self.url.clone();
        url.query_pairs_mut().extend_pairs(params);
        self.client
            .post(url)
            .basic_auth(&self.user, self.password.as_ref().map(Secret::expose))
            .header(reqwest::header::CONTENT_TYPE, "text/plain; charset=UTF-8")
            .body(sql)
    }
}

/// Classify a non-success answer, reading at most [`classify::MAX_ERROR_BODY`] bytes.
pub async fn read_error(mut response: reqwest::Response) -> InsertError {
    let status = response.status().as_u16();
    let header = exception_code_header(response.headers());
    let mut body = Vec::new();
    while body.len() < classify::MAX_ERROR_BODY {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            // The status and header are already known; a body cut short still says
            // what it says so far.
            Ok(None) | Err(_) => break,
        }
    }
    body.truncate(classify::MAX_ERROR_BODY);
    classify::from_response(status, header.as_deref(), &String::from_utf8_lossy(&body))
}

pub fn exception_code_header(headers: &HeaderMap) -> Option<String> {
    headers
        .get(EXCEPTION_CODE_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// A transport failure, described without its URL: the URL carries the query's
/// parameters, which are the tenant's data, not something for logs.
pub fn transport_error(error: reqwest::Error) -> InsertError {
    let connect = error.is_connect();
    let error = error.without_url();
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    if connect {
        text = format!("cannot connect to ClickHouse: {text}");
    }
    classify::transport(text)
}

/// reqwest is built with `rustls-no-provider`: building any client (even for plain
/// http) needs a process-wide crypto provider. Installing one twice is harmless (the
/// second attempt is refused and ignored), so every client builder calls this.
fn ensure_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
