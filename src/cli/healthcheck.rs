//! `sluice healthcheck`: the container's HEALTHCHECK without curl in the image.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use crate::config::Config;

/// GET `/healthz` on the admin listener (from the configuration, or `--url`); exit 0
/// when it answers 200 within the timeout, else 1.
pub fn run(config: Option<&Path>, url: Option<&str>, timeout: Duration) -> ExitCode {
    let url = match url {
        Some(u) => u.to_string(),
        None => match Config::load(config) {
            Ok(c) => {
                let mut addr = c.admin.listen;
                if addr.ip().is_unspecified() {
                    addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
                }
                format!("http://{addr}/healthz")
            }
            Err(e) => {
                eprint!("{e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let runtime = match super::small_runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        let client = match crate::clickhouse::endpoint::client_builder()
            .timeout(timeout)
            .build()
        {
            Ok(c) => c,
            Err(e) => {
                eprintln!("cannot build an HTTP client: {e}");
                return ExitCode::FAILURE;
            }
        };
        match client.get(&url).send().await {
            Ok(r) if r.status().is_success() => {
                println!("healthy: {url}");
                ExitCode::SUCCESS
            }
            Ok(r) => {
                eprintln!("unhealthy: {url} answered {}", r.status());
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("unhealthy: {url}: {e}");
                ExitCode::FAILURE
            }
        }
    })
}
