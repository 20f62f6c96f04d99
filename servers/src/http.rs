//! The HTTP clients that talk to loopback servers (here, in the harness and its tests).
//!
//! reqwest is built with `rustls-no-provider`, and building a client without a rustls
//! crypto provider panics even when it will only ever speak plain HTTP. Rather than
//! installing a process-wide default provider from a library (which would make a later
//! `install_default` elsewhere fail), each client gets its own TLS configuration with
//! the `ring` provider and no trusted roots: it can build, and it could not verify a
//! TLS server if it were ever pointed at one. No proxy from the environment either:
//! an `HTTP_PROXY` must never see loopback test traffic.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

/// A reqwest builder for plain HTTP to loopback servers: no environment proxy, a TLS
/// configuration that needs no global crypto provider. Add timeouts and pool settings.
pub fn http_client_builder() -> Result<reqwest::ClientBuilder> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("configuring TLS versions for the harness's HTTP client")?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    Ok(reqwest::Client::builder()
        .no_proxy()
        .tls_backend_preconfigured(tls))
}

/// The harness's own client: `timeout` per request and no connection pool, because
/// servers are killed and restarted under it and a pooled connection to a dead server
/// would turn a readiness check into a false error.
pub fn loopback_client(timeout: Duration) -> Result<reqwest::Client> {
    http_client_builder()?
        .pool_max_idle_per_host(0)
        .timeout(timeout)
        .connect_timeout(timeout)
        .build()
        .context("building the harness's HTTP client")
}
