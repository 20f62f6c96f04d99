//! Chromium driven over WebDriver, to click through a page as an operator does:
//! Debian's `chromedriver` (package `chromium-driver`) run as a [`ManagedProcess`] on a
//! free loopback port, with chromium under it on a fresh profile and the harness's
//! flags ([`CHROMIUM_FLAGS`]).
//!
//! The W3C WebDriver protocol is JSON over HTTP; the dozen commands a test needs are
//! spoken here with reqwest (already a dependency) rather than through a WebDriver
//! crate: fantoccini would add 23 crates to the lock (its `webdriver` crate pulls ICU's
//! segmenter and data, a second `http`, two `cookie`s, `thiserror` 1), measured at
//! 19 s of CPU (38 s on the shared 2-core machine) per clean build, and the two
//! chromedriver extensions used here (the browser log, a DevTools command for a
//! whole-page screenshot) would still be spoken by hand.
//!
//! Besides its commands, chromedriver keeps the browser's log: every console message,
//! uncaught exception and failed resource load (a 404 favicon included) at `SEVERE`,
//! which [`Browser::severe_logs`] reads so that a test can fail on any of them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine as _;
use serde_json::{json, Value};
use tempfile::TempDir;

use super::{chromium_binary, installed, is_loopback_url, CHROMIUM_FLAGS};
use crate::ports::free_port;
use crate::process::{ManagedProcess, ProcessSpec};
use crate::wait_for;

/// Where Debian's `chromium-driver` package puts the driver.
pub const CHROMEDRIVER_DEBIAN_BIN: &str = "/usr/bin/chromedriver";
/// Overrides the driver binary.
pub const CHROMEDRIVER_BIN_ENV: &str = "SLUICE_CHROMEDRIVER_BIN";

/// The key of an element reference in WebDriver's JSON.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How long one WebDriver command may take (a page load included).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// The driver binary, or an error naming the package that provides it.
pub fn chromedriver_binary() -> Result<PathBuf> {
    installed(
        CHROMEDRIVER_BIN_ENV,
        CHROMEDRIVER_DEBIAN_BIN,
        "chromium-driver",
    )
}

/// One chromium window under chromedriver, ended on [`Browser::quit`] or drop.
pub struct Browser {
    http: reqwest::Client,
    /// `http://127.0.0.1:<port>/session/<id>`.
    session: String,
    // Field order: the driver (and the browser under it) ends before its profile goes.
    driver: ManagedProcess,
    _profile: TempDir,
}

/// A message of the browser's log.
#[derive(Clone, Debug)]
pub struct LogEntry {
    pub level: String,
    /// `console-api`, `javascript`, `network`...
    pub source: String,
    pub message: String,
}

impl Browser {
    /// Starts chromedriver and a headless chromium window of `width` x `height`.
    pub async fn start(width: u32, height: u32) -> Result<Browser> {
        let driver_bin = chromedriver_binary()?;
        let chromium = chromium_binary()?;
        let profile = tempfile::Builder::new()
            .prefix("sluice-webdriver-")
            .tempdir()
            .context("creating a chromium profile dir")?;
        let port = free_port()?;
        let spec = ProcessSpec::new(&driver_bin)
            .name("chromedriver")
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            // Headless chromium wants a writable home for its caches; keep it in the profile.
            .env("HOME", profile.path())
            .env("XDG_CONFIG_HOME", profile.path())
            .env("XDG_CACHE_HOME", profile.path());
        let driver = ManagedProcess::start(spec, profile.path().join("logs"))?;
        let http = crate::http::loopback_client(COMMAND_TIMEOUT)?;
        let base = format!("http://127.0.0.1:{port}");
        wait_for(
            "chromedriver answers /status",
            Duration::from_secs(30),
            Duration::from_millis(100),
            || {
                let (http, base) = (&http, &base);
                async move {
                    let status =
                        send(http, reqwest::Method::GET, &format!("{base}/status"), None).await?;
                    if status["ready"] == true {
                        Ok(())
                    } else {
                        bail!("not ready: {status}")
                    }
                }
            },
        )
        .await
        .map_err(|e| e.context(driver.log_tail(20)))?;

        let mut args: Vec<String> = CHROMIUM_FLAGS.iter().map(|f| f.to_string()).collect();
        args.push(format!(
            "--user-data-dir={}",
            profile.path().join("chromium").display()
        ));
        args.push(format!("--window-size={width},{height}"));
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args},
            "goog:loggingPrefs": {"browser": "ALL"},
            // A page's own alert would otherwise block every command after it: a test
            // wants to see it as an error instead.
            "unhandledPromptBehavior": "ignore",
        }}});
        let created = send(
            &http,
            reqwest::Method::POST,
            &format!("{base}/session"),
            Some(&capabilities),
        )
        .await
        .map_err(|e| e.context(format!("starting chromium\n{}", driver.log_tail(20))))?;
        let id = created["sessionId"]
            .as_str()
            .ok_or_else(|| anyhow!("no sessionId in {created}"))?;
        Ok(Browser {
            http,
            session: format!("{base}/session/{id}"),
            driver,
            _profile: profile,
        })
    }

    async fn command(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value> {
        send(&self.http, method, &format!("{}{path}", self.session), body).await
    }

    /// Loads `url` (a loopback URL only) and waits for its load event.
    pub async fn goto(&self, url: &str) -> Result<()> {
        if !is_loopback_url(url) {
            bail!("the harness's browser only loads loopback URLs, not {url}");
        }
        self.command(reqwest::Method::POST, "/url", Some(&json!({ "url": url })))
            .await
            .with_context(|| format!("loading {url}"))?;
        Ok(())
    }

    /// The element `css` selects, if the page has one.
    pub async fn find(&self, css: &str) -> Result<Option<String>> {
        let found = self
            .command(
                reqwest::Method::POST,
                "/elements",
                Some(&json!({"using": "css selector", "value": css})),
            )
            .await?;
        Ok(found
            .as_array()
            .and_then(|all| all.first())
            .and_then(|e| e[ELEMENT_KEY].as_str())
            .map(str::to_string))
    }

    async fn element(&self, css: &str) -> Result<String> {
        self.find(css)
            .await?
            .ok_or_else(|| anyhow!("the page has no element {css:?}"))
    }

    /// Clicks the element `css` selects, as a user does (it must be visible and enabled).
    /// A page that redraws the element between finding and clicking it (a refresh)
    /// gets the click on the new one, as a user's would.
    pub async fn click(&self, css: &str) -> Result<()> {
        const ATTEMPTS: usize = 3;
        for attempt in 1..=ATTEMPTS {
            let id = self.element(css).await?;
            let clicked = self
                .command(
                    reqwest::Method::POST,
                    &format!("/element/{id}/click"),
                    Some(&json!({})),
                )
                .await;
            match clicked {
                Ok(_) => return Ok(()),
                Err(e) if attempt < ATTEMPTS && e.to_string().contains("stale element") => {}
                Err(e) => return Err(e.context(format!("clicking {css:?}"))),
            }
        }
        bail!("clicking {css:?}: the element was redrawn {ATTEMPTS} times in a row")
    }

    /// Types `text` into the element `css` selects.
    pub async fn type_into(&self, css: &str, text: &str) -> Result<()> {
        let id = self.element(css).await?;
        self.command(
            reqwest::Method::POST,
            &format!("/element/{id}/value"),
            Some(&json!({ "text": text })),
        )
        .await
        .with_context(|| format!("typing into {css:?}"))?;
        Ok(())
    }

    /// The rendered text of the element `css` selects, or `None` without one.
    pub async fn text(&self, css: &str) -> Result<Option<String>> {
        let Some(id) = self.find(css).await? else {
            return Ok(None);
        };
        let text = self
            .command(reqwest::Method::GET, &format!("/element/{id}/text"), None)
            .await?;
        Ok(text.as_str().map(str::to_string))
    }

    /// Whether the element `css` selects is enabled.
    pub async fn is_enabled(&self, css: &str) -> Result<bool> {
        let id = self.element(css).await?;
        let enabled = self
            .command(
                reqwest::Method::GET,
                &format!("/element/{id}/enabled"),
                None,
            )
            .await?;
        Ok(enabled == true)
    }

    /// Polls until the element `css` selects shows text `accept` takes; returns it.
    pub async fn wait_text(
        &self,
        css: &str,
        what: &str,
        deadline: Duration,
        accept: impl Fn(&str) -> bool,
    ) -> Result<String> {
        let accept = &accept;
        // What the page showed last, for the error: an attempt cut off by the deadline
        // would leave only "still running".
        let seen = std::sync::Mutex::new(None::<String>);
        let seen = &seen;
        let waited = wait_for(what, deadline, Duration::from_millis(200), || async move {
            let text = self.text(css).await?;
            *seen.lock().unwrap_or_else(|e| e.into_inner()) = text.clone();
            match text {
                Some(text) if accept(&text) => Ok(text),
                Some(text) => bail!("{css:?} shows {text:?}"),
                None => bail!("no element {css:?} yet"),
            }
        })
        .await;
        match waited {
            Ok(text) => Ok(text),
            Err(e) => {
                // The page's own errors are often why it never showed it.
                let errors = self.severe_logs().await.unwrap_or_default();
                let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
                Err(e.context(format!(
                    "{css:?} showed {seen:?} last; the browser's errors: {errors:#?}"
                )))
            }
        }
    }

    /// Runs `script` (a function body; `arguments` holds `args`) in the page and returns
    /// what it returns.
    pub async fn execute(&self, script: &str, args: Value) -> Result<Value> {
        self.command(
            reqwest::Method::POST,
            "/execute/sync",
            Some(&json!({"script": script, "args": args})),
        )
        .await
    }

    /// Saves a PNG of the whole page (beyond the window, down to its end) to `path`.
    pub async fn screenshot(&self, path: &Path) -> Result<()> {
        // WebDriver's own screenshot is of the window only; chromedriver passes a
        // DevTools command through for the whole page.
        let layout = self.devtools("Page.getLayoutMetrics", json!({})).await?;
        let size = &layout["cssContentSize"];
        let shot = self
            .devtools(
                "Page.captureScreenshot",
                json!({
                    "format": "png",
                    "captureBeyondViewport": true,
                    "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
                }),
            )
            .await?;
        let encoded = shot["data"]
            .as_str()
            .ok_or_else(|| anyhow!("the screenshot is not a string: {shot}"))?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .context("decoding the screenshot")?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(path, png).with_context(|| format!("writing {}", path.display()))
    }

    /// A Chrome DevTools protocol command, through chromedriver.
    async fn devtools(&self, cmd: &str, params: Value) -> Result<Value> {
        self.command(
            reqwest::Method::POST,
            "/goog/cdp/execute",
            Some(&json!({"cmd": cmd, "params": params})),
        )
        .await
        .with_context(|| format!("DevTools {cmd}"))
    }

    /// The browser's log since the last call (chromedriver hands each entry out once).
    pub async fn logs(&self) -> Result<Vec<LogEntry>> {
        let entries = self
            .command(
                reqwest::Method::POST,
                "/se/log",
                Some(&json!({"type": "browser"})),
            )
            .await?;
        Ok(entries
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| LogEntry {
                level: e["level"].as_str().unwrap_or_default().to_string(),
                source: e["source"].as_str().unwrap_or_default().to_string(),
                message: e["message"].as_str().unwrap_or_default().to_string(),
            })
            .collect())
    }

    /// The log's errors since the last read: console errors, uncaught exceptions and
    /// failed loads.
    pub async fn severe_logs(&self) -> Result<Vec<LogEntry>> {
        Ok(self
            .logs()
            .await?
            .into_iter()
            .filter(|e| e.level == "SEVERE")
            .collect())
    }

    /// Closes the window and ends the driver.
    pub async fn quit(mut self) -> Result<()> {
        let closed = self.command(reqwest::Method::DELETE, "", None).await;
        let _ = self.driver.stop(Duration::from_secs(5)).await;
        closed.map(|_| ())
    }
}

/// One WebDriver request; the answer's `value`, or its error as an error.
async fn send(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<&Value>,
) -> Result<Value> {
    let mut request = http.request(method.clone(), url);
    if let Some(body) = body {
        request = request
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string());
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("WebDriver {method} {url}"))?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    let answer: Value = serde_json::from_str(&text)
        .with_context(|| format!("WebDriver {method} {url} answered {status}: {text}"))?;
    let value = answer.get("value").cloned().unwrap_or(Value::Null);
    if !status.is_success() {
        bail!(
            "WebDriver {method} {url}: {status} {}: {}",
            value["error"].as_str().unwrap_or("error"),
            value["message"].as_str().unwrap_or(&text)
        );
    }
    Ok(value)
}
