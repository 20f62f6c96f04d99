//! Sluice in a container of the image under test, on the host's network with its two
//! listeners on loopback ports of their own, so it reaches the harness's servers on
//! 127.0.0.1 and every byte stays on loopback.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use sluice_harness::{
    free_port, loopback_client, wait_for, Metrics, Stack, INGEST_PASSWORD, INGEST_USER, TENANT,
};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

use crate::engine::Engine;
use crate::{DEADLINE, POLL};

/// The variable that holds the ClickHouse password (named by `password_env`).
pub const PASSWORD_VAR: &str = "SLUICE_CH_MAIN_PASSWORD";

/// Starts with fresh ports when a port picked for Sluice was taken meanwhile.
const START_ATTEMPTS: usize = 3;

/// What a container gets besides its listen addresses.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Every variable the container gets: `SLUICE_*` keys and the secrets they name.
    pub env: BTreeMap<String, String>,
    /// A read-only root filesystem and no capabilities, as a hardened pod runs it.
    pub hardened: bool,
}

// === impl Settings ===

impl Settings {
    /// Sluice against the stack's servers: its tenant on target `main` (the ingest
    /// user), no bearer tokens, short batches. Nothing else: the image's own variables
    /// and defaults do the rest.
    pub fn for_stack(stack: &Stack) -> Settings {
        let env = [
            ("SLUICE_NATS_URL".to_owned(), stack.nats.url()),
            (
                "SLUICE_CLICKHOUSE_TARGETS_MAIN_URL".to_owned(),
                stack.clickhouse.http_url(),
            ),
            (
                "SLUICE_CLICKHOUSE_TARGETS_MAIN_USER".to_owned(),
                INGEST_USER.to_owned(),
            ),
            (
                "SLUICE_CLICKHOUSE_TARGETS_MAIN_PASSWORD_ENV".to_owned(),
                PASSWORD_VAR.to_owned(),
            ),
            (PASSWORD_VAR.to_owned(), INGEST_PASSWORD.to_owned()),
            (
                format!("SLUICE_TENANTS_{}_TARGET", TENANT.to_uppercase()),
                "main".to_owned(),
            ),
            ("SLUICE_API_AUTH".to_owned(), "none".to_owned()),
            ("SLUICE_INGEST_BATCH_AGE".to_owned(), "200ms".to_owned()),
        ];
        Settings {
            env: env.into_iter().collect(),
            hardened: false,
        }
    }

    pub fn set(mut self, key: &str, value: impl Into<String>) -> Self {
        self.env.insert(key.to_owned(), value.into());
        self
    }

    pub fn hardened(mut self) -> Self {
        self.hardened = true;
        self
    }
}

/// One running container (removed when dropped, by testcontainers) and its addresses.
pub struct SluiceContainer {
    container: ContainerAsync<GenericImage>,
    engine: Engine,
    api: String,
    admin: String,
    http: reqwest::Client,
}

// === impl SluiceContainer ===

impl SluiceContainer {
    /// Starts a container and waits until its listeners answer (`/healthz`), not for
    /// readiness: a test of an unready Sluice starts it too.
    pub async fn start(engine: &Engine, settings: &Settings) -> Result<SluiceContainer> {
        let mut last = anyhow!("not started");
        for _ in 0..START_ATTEMPTS {
            let container = Self::create(engine, settings).await?;
            match container.wait_listening().await {
                Ok(()) => return Ok(container),
                Err(e) => {
                    let logs = container.log_text().await.unwrap_or_default();
                    if !logs.contains("Address already in use") {
                        return Err(e);
                    }
                    last = e;
                }
            }
        }
        Err(last.context(format!("its ports were taken {START_ATTEMPTS} times over")))
    }

    async fn create(engine: &Engine, settings: &Settings) -> Result<SluiceContainer> {
        let api = format!("127.0.0.1:{}", free_port()?);
        let admin = format!("127.0.0.1:{}", free_port()?);
        // The host's network, set on the HostConfig: testcontainers' `with_network`
        // would create a network named "host", which podman's API refuses.
        let mut request = engine
            .image()
            .with_host_config_modifier(|config| config.network_mode = Some("host".to_owned()))
            .with_env_var("SLUICE_API_LISTEN", &api)
            .with_env_var("SLUICE_ADMIN_LISTEN", &admin);
        for (k, v) in &settings.env {
            request = request.with_env_var(k, v);
        }
        if settings.hardened {
            request = request.with_readonly_rootfs(true).with_cap_drop("ALL");
        }
        let container = request
            .start()
            .await
            .with_context(|| format!("starting a container of {}", engine.reference()))?;
        Ok(SluiceContainer {
            container,
            engine: engine.clone(),
            api: format!("http://{api}"),
            admin: format!("http://{admin}"),
            http: loopback_client(Duration::from_secs(10))?,
        })
    }

    pub fn id(&self) -> &str {
        self.container.id()
    }

    /// Polls `/healthz` until it answers 200; fails at once (with the log) when the
    /// container exits.
    async fn wait_listening(&self) -> Result<()> {
        self.wait_admin("/healthz").await
    }

    /// Polls `/readyz` until it answers 200; fails at once when the container exits.
    pub async fn wait_ready(&self) -> Result<()> {
        self.wait_admin("/readyz").await
    }

    async fn wait_admin(&self, path: &str) -> Result<()> {
        let waited = wait_for(&format!("{path} 200"), DEADLINE, POLL, || async move {
            if !self.container.is_running().await? {
                return Ok(Err(anyhow!("the container exited")));
            }
            match self.admin_get(path).await {
                Ok((200, _)) => Ok(Ok(())),
                Ok((status, body)) => Err(anyhow!("{status} {body}")),
                Err(e) => Err(e),
            }
        })
        .await;
        match waited {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) | Err(e) => bail!(
                "{e:#}\ncontainer log:\n{}",
                self.log_text().await.unwrap_or_default()
            ),
        }
    }

    /// GET an admin path (no token: `/healthz`, `/readyz` and `/metrics` need none).
    pub async fn admin_get(&self, path: &str) -> Result<(u16, Value)> {
        let response = self
            .http
            .get(format!("{}{path}", self.admin))
            .send()
            .await
            .with_context(|| format!("GET {path}"))?;
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        ))
    }

    /// A metric's value on `/metrics` (absent: 0).
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Result<f64> {
        let (status, page) = self.admin_get("/metrics").await?;
        let page = page
            .as_str()
            .with_context(|| format!("/metrics answered {status} {page}"))?;
        Ok(Metrics::parse(page)?.value(name, labels).unwrap_or(0.0))
    }

    /// Waits until the container holds `n` rows of the stack's `table` in its buffers.
    pub async fn wait_buffered(&self, table: &str, n: u64) -> Result<()> {
        let labels = [("tenant", TENANT), ("table", table)];
        wait_for(
            &format!("{n} rows buffered"),
            DEADLINE,
            POLL,
            || async move {
                let held = self.metric("sluice_buffered_rows", &labels).await?;
                if held as u64 == n {
                    Ok(())
                } else {
                    Err(anyhow!("{held} buffered"))
                }
            },
        )
        .await
    }

    /// POST rows as NDJSON for the stack's tenant; returns the status and the answer.
    pub async fn ingest(&self, table: &str, rows: &[Value]) -> Result<(u16, Value)> {
        let body: String = rows.iter().map(|r| format!("{r}\n")).collect();
        let response = self
            .http
            .post(format!("{}/v1/ingest/{table}", self.api))
            .header("X-Tenant", TENANT)
            .header("Content-Type", "application/x-ndjson")
            .body(body)
            .send()
            .await
            .context("POST /v1/ingest")?;
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        ))
    }

    /// Everything the container wrote, stdout then stderr.
    pub async fn log_text(&self) -> Result<String> {
        let stdout = self.container.stdout_to_vec().await?;
        let stderr = self.container.stderr_to_vec().await?;
        Ok(format!(
            "{}{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        ))
    }

    /// The container's log as JSON lines; a line that is not JSON is an error.
    pub async fn log_lines(&self) -> Result<Vec<Value>> {
        self.log_text()
            .await?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).with_context(|| format!("not a JSON log line: {l}")))
            .collect()
    }

    /// Waits until a JSON log line satisfies `matches`, and returns the lines that do.
    pub async fn wait_log(
        &self,
        what: &str,
        at_least: usize,
        matches: impl Fn(&Value) -> bool,
    ) -> Result<Vec<Value>> {
        let matches = &matches;
        wait_for(what, DEADLINE, POLL, || async move {
            let lines = self.log_lines().await?;
            let found: Vec<Value> = lines.into_iter().filter(|l| matches(l)).collect();
            if found.len() >= at_least {
                Ok(found)
            } else {
                Err(anyhow!("{} such lines so far", found.len()))
            }
        })
        .await
    }

    /// Runs the image's HEALTHCHECK now and returns the status podman recorded
    /// (`healthy`). podman runs health checks on a schedule only through systemd
    /// timers, which a machine without systemd lacks, so the test asks for a run.
    pub async fn run_healthcheck(&self) -> Result<String> {
        let out = self
            .engine
            .podman_output(&["healthcheck", "run", self.id()])
            .await?;
        let status = self
            .engine
            .podman(&["inspect", "--format", "{{.State.Health.Status}}", self.id()])
            .await?;
        if !out.status.success() {
            bail!(
                "podman healthcheck run: {} {}{} (status {status})",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(status.trim().to_owned())
    }

    /// The container's main process as the host numbers it.
    pub async fn pid(&self) -> Result<u32> {
        self.engine.pid(self.id()).await
    }

    /// `docker stop` with a grace period: the image's stop signal, then SIGKILL when
    /// the grace is over. Returns the exit code and how long the stop took.
    pub async fn stop(&self, grace: Duration) -> Result<(Option<i64>, Duration)> {
        let started = Instant::now();
        let grace_secs = i32::try_from(grace.as_secs()).context("grace period")?;
        self.container.stop_with_timeout(Some(grace_secs)).await?;
        let took = started.elapsed();
        Ok((self.container.exit_code().await?, took))
    }

    /// SIGKILL, as a node that dies would. (testcontainers has no call for a signal.)
    pub async fn kill9(&self) -> Result<Option<i64>> {
        self.engine
            .podman(&["kill", "--signal", "KILL", self.id()])
            .await?;
        let container = &self.container;
        wait_for("the container to exit", DEADLINE, POLL, || async move {
            match container.exit_code().await? {
                Some(code) => Ok(Some(code)),
                None => Err(anyhow!("still running")),
            }
        })
        .await
    }

    pub async fn is_running(&self) -> Result<bool> {
        Ok(self.container.is_running().await?)
    }
}
