//! The HTTP client every ClickHouse request goes through.

use std::sync::Once;

/// A client builder with TLS ready: `https://` targets (ClickHouse Cloud, a TLS proxy)
/// use rustls with the `ring` provider, which is already in the build for NATS.
/// reqwest is built without a default provider and would panic without this.
pub fn client_builder() -> reqwest::ClientBuilder {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // Err means another provider was installed first: that one is used, fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    reqwest::Client::builder().no_proxy().tcp_nodelay(true)
}
