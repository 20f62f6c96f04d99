//! The admin endpoint as the CLI calls it: its URL and token (from flags or
//! `SLUICE_ADMIN_URL` / `SLUICE_ADMIN_TOKEN`), one JSON request at a time, and a refusal
//! turned into a message that says what to do.

use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The admin endpoint `sluice dlq` talks to.
pub struct AdminClient {
    /// `http://host:port`, without a trailing slash.
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl AdminClient {
    pub fn new(url: &str, token: Option<String>, timeout: Duration) -> anyhow::Result<Self> {
        let base = url.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            bail!("the admin URL {url:?} must start with http:// or https://");
        }
        let http = crate::clickhouse::endpoint::client_builder()
            .timeout(timeout)
            .build()
            .context("building an HTTP client")?;
        Ok(Self {
            base,
            token: token.filter(|t| !t.is_empty()),
            http,
        })
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.send(Method::GET, path, None::<&()>).await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<T> {
        self.send(Method::POST, path, Some(body)).await
    }

    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.send(Method::DELETE, path, None::<&()>).await
    }

    async fn send<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> anyhow::Result<T> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.request(method.clone(), &url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(serde_json::to_vec(body).context("writing the request")?);
        }
        let response = request
            .send()
            .await
            .map_err(|e| anyhow!("cannot reach the admin endpoint at {}: {e}", self.base))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .with_context(|| format!("reading the answer to {method} {path}"))?;
        if !status.is_success() {
            let said = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or(text);
            bail!("{}", refusal(status, &said, self.token.is_some()));
        }
        serde_json::from_str(&text)
            .with_context(|| format!("the answer to {method} {path} is not what was expected"))
    }
}

/// What a refusal means for the operator.
fn refusal(status: StatusCode, said: &str, had_token: bool) -> String {
    match status {
        StatusCode::UNAUTHORIZED if !had_token => format!(
            "the admin endpoint wants its token: set SLUICE_ADMIN_TOKEN (or --token) ({said})"
        ),
        StatusCode::FORBIDDEN => {
            format!("the admin endpoint refused the token: check SLUICE_ADMIN_TOKEN ({said})")
        }
        _ => format!("the admin endpoint answered {status}: {said}"),
    }
}
