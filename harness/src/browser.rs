//! A real headless browser for the pages Sluice serves: Debian's `chromium`, run as a
//! [`ManagedProcess`] (killed with its process group, reaped on drop) with a fresh
//! profile, no background traffic and no proxy, so it only ever talks to the loopback
//! URL it is given.
//!
//! `--dump-dom` prints the DOM after the page's scripts ran (within a virtual time
//! budget): no WebDriver needed. A page that fetches its data may not be done at the
//! first dump, so [`dump_dom_until`] polls with a deadline.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use tokio::time::Instant;

use crate::process::{ManagedProcess, ProcessSpec};

/// Where Debian's `chromium` package puts the browser.
pub const CHROMIUM_DEBIAN_BIN: &str = "/usr/bin/chromium";
/// Overrides the browser binary.
pub const CHROMIUM_BIN_ENV: &str = "SLUICE_CHROMIUM_BIN";

/// The browser binary, or an error naming the package that provides it.
pub fn chromium_binary() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(CHROMIUM_BIN_ENV).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        bail!("{CHROMIUM_BIN_ENV}={} is not a file", path.display());
    }
    let path = PathBuf::from(CHROMIUM_DEBIAN_BIN);
    if path.is_file() {
        Ok(path)
    } else {
        bail!("chromium is not installed ({CHROMIUM_DEBIAN_BIN} is missing): run `apt-get install chromium`")
    }
}

/// Loads `url` in headless chromium and returns the DOM (as HTML) once the page's
/// scripts had `virtual_time` to run. The browser is ended if it takes longer than
/// `deadline`.
pub async fn dump_dom(
    binary: &std::path::Path,
    url: &str,
    virtual_time: Duration,
    deadline: Duration,
) -> Result<String> {
    if !is_loopback_url(url) {
        bail!("the harness's browser only loads loopback URLs, not {url}");
    }
    let profile = tempfile::Builder::new()
        .prefix("sluice-chromium-")
        .tempdir()
        .context("creating a chromium profile dir")?;
    let spec = ProcessSpec::new(binary)
        .name("chromium")
        .args([
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
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--dump-dom")
        .arg(format!(
            "--virtual-time-budget={}",
            virtual_time.as_millis()
        ))
        .arg(url)
        // Headless chromium wants a writable home for its caches; keep it in the profile.
        .env("HOME", profile.path())
        .env("XDG_CONFIG_HOME", profile.path())
        .env("XDG_CACHE_HOME", profile.path());
    let mut browser = ManagedProcess::start(spec, profile.path().join("logs"))?;
    let status = match browser.wait_exit(deadline).await {
        Ok(status) => status,
        Err(e) => {
            let _ = browser.kill9().await;
            return Err(e.context(format!("chromium did not finish loading {url}")));
        }
    };
    let dom = std::fs::read_to_string(browser.stdout_path())
        .with_context(|| format!("reading {}", browser.stdout_path().display()))?;
    // The harness writes a start marker at the top of each log.
    let dom = dom
        .split_once('\n')
        .map(|(first, rest)| {
            if first.starts_with("=== start #") {
                rest
            } else {
                dom.as_str()
            }
        })
        .unwrap_or(&dom)
        .to_string();
    if !status.success() && dom.trim().is_empty() {
        bail!(
            "chromium exited with {status} and printed no DOM\n{}",
            browser.log_tail(40)
        );
    }
    Ok(dom)
}

/// Dumps the DOM of `url` again and again until `accept` returns `Ok`, and returns its
/// value; fails after `deadline` with the last refusal and the end of the last DOM.
pub async fn dump_dom_until<T>(
    url: &str,
    deadline: Duration,
    mut accept: impl FnMut(&str) -> Result<T>,
) -> Result<T> {
    let binary = chromium_binary()?;
    let end = Instant::now() + deadline;
    let mut attempts = 0u32;
    let mut last = anyhow!("no attempt finished");
    let mut last_dom = String::new();
    loop {
        attempts += 1;
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let tail: String = last_dom
                .chars()
                .rev()
                .take(2000)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            bail!("the page at {url} never showed what was expected after {attempts} loads: {last:#}\nlast DOM (end):\n{tail}");
        }
        match dump_dom(&binary, url, Duration::from_secs(5), left).await {
            Ok(dom) => match accept(&dom) {
                Ok(value) => return Ok(value),
                Err(e) => {
                    last = e;
                    last_dom = dom;
                }
            },
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(200).min(left)).await;
    }
}

fn is_loopback_url(url: &str) -> bool {
    ["http://127.0.0.1:", "http://localhost:", "http://[::1]:"]
        .iter()
        .any(|prefix| url.starts_with(prefix))
}
