//! A real headless browser for the pages Sluice serves: Debian's `chromium` with a
//! fresh profile, no background traffic and no proxy, so it only ever talks to the
//! loopback URL it is given, driven over WebDriver ([`webdriver::Browser`]) to click
//! through a page as an operator does.

pub mod webdriver;

use std::path::PathBuf;

use anyhow::{bail, Result};

/// How chromium runs in the tests: headless, as root (no sandbox), and quiet on the
/// network (the machine's is closed; without these it floods refused connections).
pub const CHROMIUM_FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--no-proxy-server",
    "--mute-audio",
];

/// Where Debian's `chromium` package puts the browser.
pub const CHROMIUM_DEBIAN_BIN: &str = "/usr/bin/chromium";
/// Overrides the browser binary.
pub const CHROMIUM_BIN_ENV: &str = "SLUICE_CHROMIUM_BIN";

/// The browser binary, or an error naming the package that provides it.
pub fn chromium_binary() -> Result<PathBuf> {
    installed(CHROMIUM_BIN_ENV, CHROMIUM_DEBIAN_BIN, "chromium")
}

/// The binary `env` names when set, else where Debian's `package` puts it; an error
/// naming the package when it is not there.
fn installed(env: &str, debian_path: &str, package: &str) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        bail!("{env}={} is not a file", path.display());
    }
    let path = PathBuf::from(debian_path);
    if path.is_file() {
        Ok(path)
    } else {
        bail!("{package} is not installed ({debian_path} is missing): run `apt-get install {package}`")
    }
}

/// Whether `url` is on this machine's loopback: the only pages the harness's browser
/// loads.
pub fn is_loopback_url(url: &str) -> bool {
    ["http://127.0.0.1:", "http://localhost:", "http://[::1]:"]
        .iter()
        .any(|prefix| url.starts_with(prefix))
}
