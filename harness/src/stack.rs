//! A whole Sluice deployment on loopback: nats-server (one, or a three-node cluster),
//! clickhouse-server, optionally the fault proxy between Sluice and ClickHouse, and the
//! sluice binary with a generated configuration. Integration tests, the chaos suite and the benchmark build on it.
//!
//! ```ignore
//! let mut stack = Stack::start(StackOptions::default().with_proxy()).await?;
//! stack.clickhouse.exec("CREATE TABLE events (id UInt64) ENGINE = MergeTree ORDER BY id").await?;
//! stack.set("ingest.batch_age", "200ms");
//! stack.start_sluice(env!("CARGO_BIN_EXE_sluice")).await?;
//! stack.ingest("events", &[json!({"id": 1})]).await?;
//! stack.wait_for_count("events", 1, Duration::from_secs(20)).await?;
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use tempfile::TempDir;

use crate::clickhouse::{
    create_cluster_table, shard_urls, sync_replicas, ClickHouseCluster, ClickHouseFlavor,
    ClickHouseOptions, ClickHouseServer, Replication,
};
use crate::nats::{NatsCluster, NatsFlavor};
use crate::ports::free_port;
use crate::process::ProcessSpec;
use crate::proxy::FaultProxy;
use crate::sluice::SluiceProcess;
use crate::wait_for;
use crate::zookeeper::ZooKeeper;

/// The tenant every stack defines, with auth off (`X-Tenant`).
pub const TENANT: &str = "acme";
/// The admin token of a stack.
pub const ADMIN_TOKEN: &str = "admin-secret";

/// How to build a stack.
#[derive(Clone, Debug, Default)]
pub struct StackOptions {
    /// Put a [`FaultProxy`] between Sluice and ClickHouse.
    pub proxy: bool,
    /// Which nats-server; `None` reads `SLUICE_TEST_NATS`.
    pub nats: Option<NatsFlavor>,
    /// Extra nats-server arguments (e.g. `--auth <token>`; set the matching `[nats]`
    /// keys with [`Stack::set`]).
    pub nats_args: Vec<String>,
    /// Start a ZooKeeper and give ClickHouse a root in it, so that Replicated tables
    /// can be created ([`Stack::create_replicated_table`]).
    pub zookeeper: bool,
    /// nats-servers joined in a JetStream cluster (0 or 1: one standalone server).
    /// Sluice gets every node as a seed and `[nats] replicas` set to their number.
    pub nats_nodes: usize,
    /// Added to every nats-server's configuration file.
    pub nats_config: String,
    /// A cluster of (shards, replicas) ClickHouse servers on one ZooKeeper instead of
    /// one server, the target `main` listing them all (`shards`).
    pub cluster: Option<(usize, usize)>,
}

impl StackOptions {
    pub fn with_proxy(mut self) -> Self {
        self.proxy = true;
        self
    }

    pub fn with_zookeeper(mut self) -> Self {
        self.zookeeper = true;
        self
    }

    /// NATS as a three-node JetStream cluster, the streams and the bucket R3.
    pub fn with_nats_cluster(mut self) -> Self {
        self.nats_nodes = 3;
        self
    }

    /// `shards` × `replicas` ClickHouse servers ([`ClickHouseCluster`]) instead of one.
    pub fn with_cluster(mut self, shards: usize, replicas: usize) -> Self {
        self.cluster = Some((shards, replicas));
        self.zookeeper = true;
        self
    }

    /// Text added to every nats-server's configuration file (a `mappings` block).
    pub fn with_nats_config(mut self, text: impl Into<String>) -> Self {
        self.nats_config.push_str(&text.into());
        self
    }

    pub fn with_nats_args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.nats_args.extend(args.into_iter().map(Into::into));
        self
    }
}

/// The servers, the proxy, the configuration and the sluice processes of a test.
pub struct Stack {
    // Field order: sluice processes die before the servers they talk to.
    pub sluice: Vec<SluiceProcess>,
    /// The (api, admin) ports of each process in `sluice`.
    pub sluice_ports: Vec<(u16, u16)>,
    pub proxy: Option<FaultProxy>,
    /// One nats-server, or every node of a cluster ([`StackOptions::with_nats_cluster`]).
    pub nats: NatsCluster,
    /// The ClickHouse server; of a cluster ([`StackOptions::with_cluster`]), replica 1
    /// of shard 1.
    pub clickhouse: ClickHouseServer,
    /// A cluster's other servers, shard by shard (see [`Stack::node`]).
    pub cluster_nodes: Vec<ClickHouseServer>,
    /// A cluster's (shards, replicas).
    pub cluster: Option<(usize, usize)>,
    /// ClickHouse's ZooKeeper, with [`StackOptions::with_zookeeper`] (dropped after it).
    pub zookeeper: Option<ZooKeeper>,
    /// The configuration written for the next `start_sluice`; edit with [`Stack::set`].
    pub config: toml::Table,
    pub api_port: u16,
    pub admin_port: u16,
    /// Environment for the sluice processes (the admin token, secrets named by `*_env`).
    pub env: Vec<(String, String)>,
    dir: TempDir,
    http: reqwest::Client,
}

// === impl Stack ===

impl Stack {
    pub async fn start(options: StackOptions) -> Result<Stack> {
        let flavor = match options.nats {
            Some(f) => f,
            None => NatsFlavor::from_env()?,
        };
        let (nats, (mut clickhouse, zookeeper)) = tokio::try_join!(
            NatsCluster::start_configured(
                flavor,
                options.nats_nodes,
                options.nats_args.clone(),
                &options.nats_config
            ),
            start_clickhouse(options.zookeeper, options.cluster)
        )?;
        let cluster_nodes = if clickhouse.len() > 1 {
            clickhouse.split_off(1)
        } else {
            Vec::new()
        };
        let Some(clickhouse) = clickhouse.pop() else {
            bail!("no ClickHouse server started");
        };
        if options.cluster.is_some() && options.proxy {
            bail!("a cluster stack has no fault proxy: fault its servers themselves");
        }
        let proxy = if options.proxy {
            Some(FaultProxy::start(clickhouse.http_addr()).await?)
        } else {
            None
        };
        let dir = tempfile::Builder::new()
            .prefix("sluice-stack-")
            .tempdir()
            .context("creating the stack's temp dir")?;
        let api_port = free_port()?;
        let admin_port = free_port()?;
        let clickhouse_url = match &proxy {
            Some(p) => p.url(),
            None => clickhouse.http_url(),
        };
        let mut config = base_config(&nats.url(), &clickhouse_url, api_port, admin_port)?;
        if nats.len() > 1 {
            if let Some(toml::Value::Table(section)) = config.get_mut("nats") {
                section.insert("replicas".into(), toml::Value::Integer(nats.len() as i64));
            }
        }
        let http = crate::http::loopback_client(Duration::from_secs(30))?;
        let mut stack = Stack {
            sluice: Vec::new(),
            sluice_ports: Vec::new(),
            proxy,
            nats,
            clickhouse,
            cluster_nodes,
            cluster: options.cluster,
            zookeeper,
            config,
            api_port,
            admin_port,
            env: vec![("SLUICE_ADMIN_TOKEN".into(), ADMIN_TOKEN.into())],
            dir,
            http,
        };
        if let Some((_, replicas)) = stack.cluster {
            let shards = shard_urls(&stack.nodes(), replicas);
            stack.unset("clickhouse.targets.main.url");
            stack.set("clickhouse.targets.main.shards", shards);
        }
        Ok(stack)
    }

    /// Replica `replica` of shard `shard` (0-based) of a cluster stack; (0, 0) is
    /// [`Stack::clickhouse`].
    pub fn node(&self, shard: usize, replica: usize) -> &ClickHouseServer {
        match self.node_index(shard, replica) {
            0 => &self.clickhouse,
            i => &self.cluster_nodes[i - 1],
        }
    }

    pub fn node_mut(&mut self, shard: usize, replica: usize) -> &mut ClickHouseServer {
        match self.node_index(shard, replica) {
            0 => &mut self.clickhouse,
            i => &mut self.cluster_nodes[i - 1],
        }
    }

    fn node_index(&self, shard: usize, replica: usize) -> usize {
        let replicas = self.cluster.map_or(1, |(_, r)| r);
        shard * replicas + replica
    }

    /// Every ClickHouse server of the stack, shard by shard.
    pub fn nodes(&self) -> Vec<&ClickHouseServer> {
        std::iter::once(&self.clickhouse)
            .chain(&self.cluster_nodes)
            .collect()
    }

    /// On a cluster stack: `table` as each shard's `ReplicatedMergeTree` local table on
    /// every server, and `{table}_all` over them (see [`create_cluster_table`]).
    pub async fn create_cluster_table(
        &self,
        table: &str,
        columns: &str,
        order_by: &str,
    ) -> Result<()> {
        create_cluster_table(&self.nodes(), table, columns, order_by).await
    }

    /// On a cluster stack: waits until every replica fetched its twins' parts of
    /// `table` (see [`sync_replicas`]).
    pub async fn sync_replicas(&self, table: &str) -> Result<()> {
        sync_replicas(&self.nodes(), table).await
    }

    /// Set a configuration key by its dotted path, e.g. `set("ingest.batch_age", "200ms")`
    /// or `set("tables.\"acme.events\".dlq", false)` (a quoted part may hold dots).
    pub fn set(&mut self, path: &str, value: impl Into<toml::Value>) {
        let parts = split_path(path);
        let Some((last, parents)) = parts.split_last() else {
            return;
        };
        let mut table = &mut self.config;
        for part in parents {
            let entry = table
                .entry(part.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if !entry.is_table() {
                *entry = toml::Value::Table(toml::Table::new());
            }
            table = match entry {
                toml::Value::Table(t) => t,
                _ => return,
            };
        }
        table.insert(last.clone(), value.into());
    }

    /// Remove a configuration key.
    pub fn unset(&mut self, path: &str) {
        let parts = split_path(path);
        let Some((last, parents)) = parts.split_last() else {
            return;
        };
        let mut table = &mut self.config;
        for part in parents {
            table = match table.get_mut(part) {
                Some(toml::Value::Table(t)) => t,
                _ => return,
            };
        }
        table.remove(last);
    }

    /// The configuration as it would be written.
    pub fn config_text(&self) -> String {
        toml::to_string(&self.config).unwrap_or_default()
    }

    /// Write the configuration to a new file in the stack's dir and return its path.
    pub fn write_config(&self) -> Result<PathBuf> {
        let n = self.sluice.len();
        let path = self.dir.path().join(format!("sluice-{n}.toml"));
        std::fs::write(&path, self.config_text())
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// Start a sluice process with the current configuration and wait until `/readyz`
    /// answers 200. Returns its index in `self.sluice`.
    ///
    /// The ports were free when picked but are only bound when sluice starts: another
    /// test's server may take one in between. Then sluice exits at once saying so, and
    /// it is started again on fresh ports (a few times at most).
    pub async fn start_sluice(&mut self, binary: impl AsRef<Path>) -> Result<usize> {
        self.start_sluice_within(binary, Duration::from_secs(30))
            .await
    }

    /// [`Stack::start_sluice`], ready within `deadline` (a test whose fault makes
    /// Sluice's start slower by design says why it waits longer).
    pub async fn start_sluice_within(
        &mut self,
        binary: impl AsRef<Path>,
        deadline: Duration,
    ) -> Result<usize> {
        const ATTEMPTS: usize = 3;
        let binary = binary.as_ref();
        for attempt in 1..=ATTEMPTS {
            let index = self.spawn_sluice(binary)?;
            match self.wait_ready(index, deadline).await {
                Ok(()) => return Ok(index),
                Err(e)
                    if attempt < ATTEMPTS
                        && self.sluice[index].logs_contain("Address already in use") =>
                {
                    tracing::warn!(
                        attempt,
                        "a port picked for sluice was taken meanwhile; new ports: {e:#}"
                    );
                    self.sluice.remove(index);
                    self.sluice_ports.remove(index);
                    self.fresh_ports()?;
                }
                Err(e) => return Err(e),
            }
        }
        bail!("sluice could not bind its ports in {ATTEMPTS} attempts")
    }

    /// Start a sluice process without waiting for readiness.
    pub fn spawn_sluice(&mut self, binary: impl AsRef<Path>) -> Result<usize> {
        let config = self.write_config()?;
        let mut spec = ProcessSpec::new(binary.as_ref())
            .args(["run", "--config"])
            .arg(config.as_os_str());
        for (k, v) in &self.env {
            spec = spec.env(k, v);
        }
        let process = SluiceProcess::start_spec(spec)?;
        self.sluice.push(process);
        self.sluice_ports.push((self.api_port, self.admin_port));
        Ok(self.sluice.len() - 1)
    }

    /// Wait until the sluice process `index` answers `/readyz` with 200; fail at once
    /// if it exits meanwhile.
    pub async fn wait_ready(&mut self, index: usize, deadline: Duration) -> Result<()> {
        let port = self.admin_port_of(index)?;
        let url = format!("http://127.0.0.1:{port}/readyz");
        let end = tokio::time::Instant::now() + deadline;
        // What /readyz last said it waits for: the first thing to read when it never
        // said 200.
        loop {
            let last_answer = match tokio::time::timeout(
                Duration::from_secs(2),
                self.http.get(&url).send(),
            )
            .await
            {
                Ok(Ok(r)) if r.status().is_success() => return Ok(()),
                Ok(Ok(r)) => {
                    let status = r.status();
                    let body = r.text().await.unwrap_or_default();
                    format!("{status} {}", body.chars().take(2000).collect::<String>())
                }
                Ok(Err(e)) => format!("no answer: {e}"),
                Err(_) => "no answer within 2 s".into(),
            };
            let process = self
                .sluice
                .get_mut(index)
                .ok_or_else(|| anyhow!("no sluice process {index}"))?;
            if !process.is_running() {
                bail!(
                    "sluice exited before it was ready\nsluice log:\n{}",
                    process.log_tail(40)
                );
            }
            if tokio::time::Instant::now() >= end {
                bail!(
                    "sluice /readyz did not answer 200 within {deadline:?} (last: {last_answer})\nsluice log:\n{}",
                    process.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Wait until sluice process `index` has exited (a test's failpoint aborted it);
    /// fails with the tail of its log if it still runs after `deadline`.
    pub async fn wait_exited(&mut self, index: usize, deadline: Duration) -> Result<()> {
        let process = self
            .sluice
            .get_mut(index)
            .ok_or_else(|| anyhow!("no sluice process {index}"))?;
        let exited = wait_for(
            &format!("sluice process {index} to exit"),
            deadline,
            Duration::from_millis(100),
            || {
                let running = process.is_running();
                async move {
                    if running {
                        bail!("still running")
                    }
                    Ok(())
                }
            },
        )
        .await;
        exited.with_context(|| process.log_tail(40))
    }

    /// The admin port of a sluice process (a second instance beside the first gets
    /// ports of its own, see [`Stack::fresh_ports`]).
    pub fn admin_port_of(&self, index: usize) -> Result<u16> {
        self.sluice_ports
            .get(index)
            .map(|(_, admin)| *admin)
            .ok_or_else(|| anyhow!("no sluice process {index}"))
    }

    /// Restart sluice process `index` with the arguments it had (the same config file)
    /// and wait for readiness.
    pub async fn restart_sluice(&mut self, index: usize) -> Result<()> {
        let process = self
            .sluice
            .get_mut(index)
            .ok_or_else(|| anyhow!("no sluice process {index}"))?;
        process.start_again()?;
        self.wait_ready(index, Duration::from_secs(30)).await
    }

    /// Give the next `start_sluice` fresh API and admin ports (a second instance
    /// beside the first). Returns (api, admin).
    pub fn fresh_ports(&mut self) -> Result<(u16, u16)> {
        self.api_port = free_port()?;
        self.admin_port = free_port()?;
        self.set("api.listen", format!("127.0.0.1:{}", self.api_port));
        self.set("admin.listen", format!("127.0.0.1:{}", self.admin_port));
        Ok((self.api_port, self.admin_port))
    }

    /// The admin URL of sluice process `index` (`http://127.0.0.1:PORT`).
    pub fn admin_url_of(&self, index: usize) -> Result<String> {
        Ok(format!("http://127.0.0.1:{}", self.admin_port_of(index)?))
    }

    /// The API URL of sluice process `index`.
    pub fn api_url_of(&self, index: usize) -> Result<String> {
        self.sluice_ports
            .get(index)
            .map(|(api, _)| format!("http://127.0.0.1:{api}"))
            .ok_or_else(|| anyhow!("no sluice process {index}"))
    }

    pub fn api_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.api_port)
    }

    pub fn admin_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.admin_port)
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// POST rows to the ingest API as NDJSON for the stack's tenant; returns the status
    /// and the JSON answer.
    pub async fn ingest(&self, table: &str, rows: &[Value]) -> Result<(u16, Value)> {
        let mut body = String::new();
        for row in rows {
            body.push_str(&row.to_string());
            body.push('\n');
        }
        self.ingest_raw(table, "application/x-ndjson", body.into_bytes(), &[])
            .await
    }

    /// POST any body to the ingest API with extra headers.
    pub async fn ingest_raw(
        &self,
        table: &str,
        content_type: &str,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> Result<(u16, Value)> {
        let mut request = self
            .http
            .post(format!("{}/v1/ingest/{table}", self.api_url()))
            .header("X-Tenant", TENANT)
            .header("Content-Type", content_type)
            .body(body);
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let response = request.send().await.context("POST /v1/ingest")?;
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, json))
    }

    /// GET an admin path with the admin token; returns the status and the body as JSON
    /// (or as a JSON string when it is not JSON).
    pub async fn admin_get(&self, path: &str) -> Result<(u16, Value)> {
        let response = self
            .http
            .get(format!("{}{path}", self.admin_url()))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .with_context(|| format!("GET {path}"))?;
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, json))
    }

    /// GET an admin path of sluice process `index` (see [`Stack::admin_get`]).
    pub async fn admin_get_of(&self, index: usize, path: &str) -> Result<(u16, Value)> {
        let url = format!("{}{path}", self.admin_url_of(index)?);
        admin_answer(self.http.get(url).bearer_auth(ADMIN_TOKEN), "GET", path).await
    }

    /// POST an admin path (no body) with the admin token, e.g. fault injection's
    /// `/admin/debug/panic/acme/events`; returns the status and the body as JSON.
    pub async fn admin_post(&self, path: &str) -> Result<(u16, Value)> {
        let url = format!("{}{path}", self.admin_url());
        admin_answer(self.http.post(url).bearer_auth(ADMIN_TOKEN), "POST", path).await
    }

    /// Any admin request: `token` is sent as `Authorization: Bearer` when given, `body`
    /// as JSON. Returns the status, the response headers and the body as JSON (or as a
    /// JSON string when it is not JSON).
    pub async fn admin_request(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> Result<(u16, reqwest::header::HeaderMap, Value)> {
        let mut request = self
            .http
            .request(method.clone(), format!("{}{path}", self.admin_url()));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_string());
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("{method} {path}"))?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap_or_default();
        let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, headers, json))
    }

    /// The parsed `/metrics` page.
    pub async fn metrics_parsed(&self) -> Result<crate::prom::Metrics> {
        crate::prom::Metrics::parse(&self.metrics().await?)
    }

    /// Everything sluice process `index` wrote to stdout and stderr so far (the
    /// harness's `=== start #N ===` markers included).
    pub fn sluice_output(&self, index: usize) -> Result<String> {
        let process = self
            .sluice
            .get(index)
            .ok_or_else(|| anyhow!("no sluice process {index}"))?;
        let mut out = String::new();
        for path in [process.stdout_path(), process.stderr_path()] {
            match std::fs::read_to_string(path) {
                Ok(text) => out.push_str(&text),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
            }
        }
        Ok(out)
    }

    /// The Prometheus text of `/metrics`.
    pub async fn metrics(&self) -> Result<String> {
        let response = self
            .http
            .get(format!("{}/metrics", self.admin_url()))
            .send()
            .await
            .context("GET /metrics")?;
        Ok(response.text().await?)
    }

    /// The Prometheus text of `/metrics` of sluice process `index`.
    pub async fn metrics_of(&self, index: usize) -> Result<String> {
        let response = self
            .http
            .get(format!("{}/metrics", self.admin_url_of(index)?))
            .send()
            .await
            .context("GET /metrics")?;
        Ok(response.text().await?)
    }

    /// Rows in a ClickHouse table (or the value of a `SELECT count()` query).
    pub async fn count(&self, table_or_sql: &str) -> Result<u64> {
        self.clickhouse.count(table_or_sql).await
    }

    /// Creates `table` as a `ReplicatedMergeTree` copy of the existing table `like`
    /// (columns, partition and sorting key), for a stack started
    /// [`StackOptions::with_zookeeper`]: the same rows sent to both show what
    /// ClickHouse's insert deduplication dropped.
    pub async fn create_replicated_table(&self, table: &str, like: &str) -> Result<()> {
        crate::tables::create_replicated_like(&self.clickhouse, table, like).await
    }

    /// As [`Stack::create_replicated_table`], left at the server's default
    /// deduplication window (100 blocks on 18.16).
    pub async fn create_replicated_table_at_default_window(
        &self,
        table: &str,
        like: &str,
    ) -> Result<()> {
        crate::tables::create_replicated_like_at_default_window(&self.clickhouse, table, like).await
    }

    /// Wait until a table holds at least `n` rows; returns the count seen.
    pub async fn wait_for_count(&self, table: &str, n: u64, deadline: Duration) -> Result<u64> {
        let ch = &self.clickhouse;
        wait_for(
            &format!("{table} has {n} rows"),
            deadline,
            Duration::from_millis(200),
            || async move {
                let c = ch.count(table).await?;
                if c >= n {
                    Ok(c)
                } else {
                    Err(anyhow!("{c} rows so far"))
                }
            },
        )
        .await
    }

    /// Wait until the consumer has settled every message (nothing pending or awaiting
    /// an ack) and `table` holds at least `n` rows; returns its `count()` and
    /// `uniqExact(id)` then.
    pub async fn wait_settled(
        &self,
        table: &str,
        n: u64,
        deadline: Duration,
    ) -> Result<(u64, u64)> {
        let jet = crate::chaos::JetStreamView::connect(&self.nats.url()).await?;
        let (jet, ch) = (&jet, &self.clickhouse);
        wait_for(
            &format!("every message settled and {n} rows in {table}"),
            deadline,
            Duration::from_millis(250),
            || async move {
                let backlog = jet.backlog().await?;
                let (total, distinct) = crate::chaos::counts(ch, table).await?;
                if backlog.consumer_done() && total >= n {
                    Ok((total, distinct))
                } else {
                    bail!("{backlog:?}, {total} rows")
                }
            },
        )
        .await
    }

    /// The rows parked for a table, as the admin endpoint shows them (up to 10,000).
    pub async fn dlq_rows(&self, table: &str) -> Result<Vec<Value>> {
        let (status, body) = self
            .admin_get(&format!("/admin/dlq/{TENANT}/{table}?limit=10000"))
            .await?;
        if status != 200 {
            bail!("GET /admin/dlq/{TENANT}/{table}: {status} {body}");
        }
        Ok(body
            .get("rows")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default())
    }
}

/// The row of a parked row as the admin endpoint shows it (`row` holds its text, as
/// parked), parsed: `Null` when it is not JSON.
pub fn parked_json(parked: &Value) -> Value {
    parked["row"]
        .as_str()
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or(Value::Null)
}

/// ClickHouse (one server, or a cluster's, shard by shard), after its ZooKeeper (and a
/// root of its own there) when asked for one.
///
/// The current engine holds no Replicated tables: a stack asking for a ZooKeeper gets
/// none there (its twins are `MergeTree`s with a window, see `tables`), and a cluster
/// is refused.
async fn start_clickhouse(
    zookeeper: bool,
    cluster: Option<(usize, usize)>,
) -> Result<(Vec<ClickHouseServer>, Option<ZooKeeper>)> {
    let flavor = ClickHouseFlavor::from_env()?;
    if cluster.is_some() && !flavor.replicates() {
        bail!("the current ClickHouse engine holds no Replicated tables: no cluster stack on it");
    }
    if !zookeeper || !flavor.replicates() {
        return Ok((vec![ClickHouseServer::start().await?], None));
    }
    let zookeeper = ZooKeeper::start().await?;
    let root = zookeeper.new_root().await?;
    if let Some((shards, replicas)) = cluster {
        let cluster = ClickHouseCluster::start(&root, shards, replicas).await?;
        return Ok((cluster.nodes, Some(zookeeper)));
    }
    let options = ClickHouseOptions::default().replicated(Replication::new(root));
    Ok((
        vec![ClickHouseServer::start_with(options).await?],
        Some(zookeeper),
    ))
}

async fn admin_answer(
    request: reqwest::RequestBuilder,
    method: &str,
    path: &str,
) -> Result<(u16, Value)> {
    let response = request
        .send()
        .await
        .with_context(|| format!("{method} {path}"))?;
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok((status, json))
}

fn base_config(
    nats_url: &str,
    clickhouse_url: &str,
    api_port: u16,
    admin_port: u16,
) -> Result<toml::Table> {
    let text = format!(
        r#"
[nats]
url = "{nats_url}"
max_bytes = "256MiB"
dlq_max_bytes = "64MiB"
ack_wait = "30s"
max_ack_pending = 20000

[clickhouse.targets.main]
url = "{clickhouse_url}"
user = "default"
database = "default"
insert_timeout = "5s"
connect_timeout = "1s"

[tenants.{TENANT}]
target = "main"

[ingest]
batch_rows = 10000
batch_age = "200ms"

[pipeline]
shutdown_deadline = "10s"

[api]
listen = "127.0.0.1:{api_port}"
auth = "none"

[admin]
listen = "127.0.0.1:{admin_port}"
token_env = "SLUICE_ADMIN_TOKEN"
fault_injection = true

[log]
level = "info"
"#
    );
    toml::from_str(&text).map_err(|e| anyhow!("the stack's base config: {e}"))
}

/// `a.b."c.d".e` → `[a, b, c.d, e]`.
fn split_path(path: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in path.chars() {
        match c {
            '"' => quoted = !quoted,
            '.' if !quoted => parts.push(std::mem::take(&mut current)),
            c => current.push(c),
        }
    }
    parts.push(current);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(split_path("ingest.batch_age"), vec!["ingest", "batch_age"]);
        assert_eq!(
            split_path("tables.\"acme.events\".dlq"),
            vec!["tables", "acme.events", "dlq"]
        );
    }
}
