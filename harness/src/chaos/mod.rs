//! The chaos toolkit: known rows in, a fault while they flow, a heal, then an exact
//! reckoning of where every row went.
//!
//! The suite itself is `tests/chaos.rs`; run one scenario by name with
//! `cargo nextest run --test chaos clickhouse_kill9` (a substring of the test name
//! selects it; add `--no-capture` to see its line as it prints, and
//! `SLUICE_TEST_NATS=current` for the current nats-server).
//!
//! A scenario, with the pieces here:
//!
//! 1. [`Scenario::start`]: nats-server, clickhouse-server (and optionally the fault
//!    proxy) on loopback, with a configuration tuned for quick recovery
//!    ([`Scenario::CHAOS_CONFIG`]: short `ack_wait`, `backoff_max`, `batch_age`,
//!    `insert_timeout`), and a JetStream client of the test's own ([`JetStreamView`]).
//! 2. [`RowSet`]: rows with unique ids, some of them bad (rejected by ClickHouse), so
//!    the DLQ's content can be judged by id alone.
//! 3. [`Feed`]: publishes the rows at a steady [`Pace`] in the background, through the
//!    ingest API (retrying 503s with their `Retry-After`, idempotently) or straight to
//!    JetStream, while the scenario injects its fault (stop / kill -9 / SIGSTOP a
//!    server, a proxy answering errors, a panic, a killed Sluice...) and heals it. A
//!    scenario first makes sure its fault is in effect (an insert caught by a frozen
//!    ClickHouse: [`Scenario::freeze_clickhouse_mid_insert`]; a request that met the
//!    proxy's fault; rows held by Sluice) and only then takes the next step; rows that
//!    must arrive during a fault come from a feed started once it is in effect.
//! 4. [`Scenario::finish`]: waits for quiescence (the durable consumer with nothing
//!    pending or unacked, nothing buffered or in flight in any live Sluice,
//!    ClickHouse's counts stable), then counts ([`Tally`]): ClickHouse's
//!    `count()` and `uniqExact(id)` and the ids it holds, the DLQ read straight from
//!    JetStream. It prints one line
//!
//!    `chaos: clickhouse_kill9 published=20000 inserted_distinct=20000 duplicates=312 parked=0 lost=0`
//!
//!    and fails if a row is lost, a good row parked, a row parked twice, or the
//!    pipeline never went quiet. Duplicates are counted, not failed: after an ambiguous
//!    failure (a killed server, a timed-out insert) delivery is at-least-once. Extra
//!    fields appear only when they say something: `settled_in=` (how long the healed
//!    pipeline took to go quiet), `stranded_in_stream=` (acked messages a crashed
//!    nats-server 2.9 kept in the work queue, see [`Backlog::stranded`]).
//!
//! Every wait polls with a deadline; a fault may last a fixed time by a timer, but
//! readiness and quiescence are always observed.

mod fault;
mod feed;
mod flow;
mod observe;
mod rows;
mod tally;

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use tokio::time::Instant;

pub use feed::{Feed, Pace, Progress, Published, Route};
pub use flow::{Flow, FlowWatch, RESUME_LIMIT};
pub use observe::{
    flights_out_in_tree, held_in_tree, metric_value, table_state, Backlog, Held, JetStreamView,
    ParkedRow, CONSUMER, DLQ_STREAM, INGEST_STREAM,
};
pub use rows::{create_table_sql, id_of, RowSet};
pub use tally::{counts, ids_in, Tally, REPORT_ENV};

use crate::nats::NatsFlavor;
use crate::skip::available;
use crate::stack::{Stack, StackOptions};

/// A lock of the scenario's own bookkeeping (never held across an await).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long a feed may take to get all its rows accepted.
pub const FEED_DEADLINE: Duration = Duration::from_secs(90);
/// How long a healed pipeline may take to go quiet.
pub const QUIESCE_DEADLINE: Duration = Duration::from_secs(90);
/// Between two looks at the pipeline while waiting for quiescence.
const QUIESCE_POLL: Duration = Duration::from_millis(400);
/// When set, [`Scenario::finish`] prints each change seen while waiting for
/// quiescence, and the sluice logs of passing scenarios too.
pub const VERBOSE_ENV: &str = "SLUICE_TEST_CHAOS_VERBOSE";
fn verbose() -> bool {
    std::env::var_os(VERBOSE_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Log lines of each sluice process in a failure message.
const LOG_LINES: usize = 200;
/// Lines of each nats-server's log in a failure.
const NATS_LOG_LINES: usize = 60;
/// Consecutive quiet looks needed.
const QUIET_LOOKS: u32 = 3;
/// Half-second looks for acked messages a crashed nats-server left in the stream to be
/// removed by Sluice (which does it with its lag poll, every 5 s).
const STRANDED_POLLS: u32 = 30;

/// A scenario's stack, the test's JetStream client, and the sluice binary.
///
/// Every table a scenario creates has a `ReplicatedMergeTree` twin (`<table>_r`), and
/// every feed to a table is sent to its twin as well, by the same route: ClickHouse
/// deduplicates inserts into the twin, so its duplicates count is what exactly-once
/// promises (zero, whatever the fault), beside the plain table's (at-least-once).
pub struct Scenario {
    pub name: String,
    pub stack: Stack,
    pub jet: JetStreamView,
    binary: PathBuf,
    /// Tables created with a Replicated twin.
    twinned: Mutex<HashSet<String>>,
    /// The twin feeds running, and what the finished ones published.
    twin_feeds: Mutex<Vec<Feed>>,
    twin_published: Mutex<Vec<Published>>,
    /// How rows flowed into one table around the fault ([`Scenario::watch_flow`]).
    flow: Option<FlowWatch>,
    /// What the scenario's line says beside the counts ([`Scenario::note`]).
    notes: Mutex<Vec<String>>,
}

/// The Replicated twin of a scenario table.
pub fn twin_of(table: &str) -> String {
    format!("{table}_r")
}

/// What the pipeline looked like at one moment of [`Scenario::quiesce`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Look {
    pub backlog: Option<Backlog>,
    /// Per live sluice process: what it holds (None: its admin endpoint did not answer).
    pub held: Vec<Option<Held>>,
    /// `count()` per table.
    pub counts: Vec<Option<u64>>,
}

impl Look {
    fn idle(&self) -> bool {
        // The consumer done, and the stream empty too: messages it keeps then are
        // acked ones a crashed or re-elected server left (`Backlog::stranded`), which
        // Sluice removes, or ones the consumer's leader no longer sees, which Sluice
        // has delivered by a new leader; until then the pipeline is not quiet.
        let backlog_empty = self
            .backlog
            .is_some_and(|b| b.consumer_done() && b.messages == 0);
        let nothing_held = self
            .held
            .iter()
            .all(|h| h.is_some_and(|h| h.buffered_rows == 0 && h.flights == 0));
        backlog_empty && nothing_held && self.counts.iter().all(Option::is_some)
    }
}

// === impl Scenario ===

impl Scenario {
    /// The configuration every chaos stack starts from (over [`Stack`]'s base): quick
    /// redelivery and recovery, so a scenario's fault heals within seconds.
    pub const CHAOS_CONFIG: &'static [(&'static str, &'static str)] = &[
        ("nats.ack_wait", "5s"),
        ("ingest.batch_age", "100ms"),
        ("pipeline.backoff_initial", "200ms"),
        ("pipeline.backoff_max", "2s"),
        ("pipeline.shutdown_deadline", "5s"),
        ("clickhouse.targets.main.insert_timeout", "3s"),
        ("api.retry_after", "1s"),
    ];

    /// Starts the servers for scenario `name` (`None`, with a skip notice, when a server
    /// is not installed and `SLUICE_TEST_ALLOW_SKIP` allows that; an error naming it
    /// otherwise). `binary` is the sluice binary (`env!("CARGO_BIN_EXE_sluice")`).
    pub async fn start(
        name: &str,
        binary: impl Into<PathBuf>,
        options: StackOptions,
    ) -> Result<Option<Self>> {
        if available(name, crate::clickhouse::binary())?.is_none() {
            return Ok(None);
        }
        let flavor = match &options.nats {
            Some(f) => f.clone(),
            None => NatsFlavor::from_env()?,
        };
        if available(name, flavor.binary())?.is_none() {
            return Ok(None);
        }
        let mut stack = Stack::start(options.with_zookeeper()).await?;
        stack.set("ingest.batch_rows", 1000);
        for (key, value) in Self::CHAOS_CONFIG {
            stack.set(key, *value);
        }
        // An injected panic prints one line, not a backtrace that fills the log tails.
        stack.env.push(("RUST_BACKTRACE".into(), "0".into()));
        let jet = JetStreamView::connect(&stack.nats.url()).await?;
        Ok(Some(Self {
            name: name.to_owned(),
            stack,
            jet,
            binary: binary.into(),
            twinned: Mutex::default(),
            twin_feeds: Mutex::default(),
            twin_published: Mutex::default(),
            flow: None,
            notes: Mutex::default(),
        }))
    }

    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// Adds `key=value` to the scenario's line (what it saw during its fault).
    pub fn note(&self, key: &str, value: impl std::fmt::Display) {
        lock(&self.notes).push(format!("{key}={value}"));
    }

    /// Creates the scenario tables ([`create_table_sql`]), each with its Replicated
    /// twin ([`twin_of`]).
    pub async fn create_tables(&self, tables: &[&str]) -> Result<()> {
        for table in tables {
            self.stack.clickhouse.exec(&create_table_sql(table)).await?;
            self.stack
                .create_replicated_table(&twin_of(table), table)
                .await?;
            lock(&self.twinned).insert((*table).to_owned());
        }
        Ok(())
    }

    /// Tables the scenario will create later (a migration that runs after the first
    /// rows): their feeds go to the twins from the start, as they would to any table.
    pub fn tables_created_later(&self, tables: &[&str]) {
        lock(&self.twinned).extend(tables.iter().map(|t| (*t).to_owned()));
    }

    /// Starts the same feed to `table`'s twin, when it has one.
    fn twin_feed(&self, route: Route, table: &str, rows: &RowSet, pace: &Pace) {
        if lock(&self.twinned).contains(table) {
            let twin = Feed::start(route, &twin_of(table), rows.clone(), *pace, FEED_DEADLINE);
            lock(&self.twin_feeds).push(twin);
        }
    }

    /// Watches rows land in `table` from now on: the scenario's line then says how
    /// long rows stopped flowing (`gap=`) and how soon they came again after
    /// [`Scenario::fault_over`] (`resumed_in=`, failing past [`RESUME_LIMIT`]).
    pub fn watch_flow(&mut self, table: &str) -> Result<()> {
        self.flow = Some(FlowWatch::start(&self.stack.clickhouse, table)?);
        Ok(())
    }

    /// The fault is over (the node started again, thawed...).
    pub fn fault_over(&mut self) {
        if let Some(flow) = &mut self.flow {
            flow.fault_over();
        }
    }

    /// Every NATS stream and consumer has a leader again (after [`Scenario::fault_over`]):
    /// the resume bound runs from now if this came later.
    pub fn leaders_back(&mut self) {
        if let Some(flow) = &mut self.flow {
            flow.leaders_back();
        }
    }

    /// Starts a sluice process and waits until it is ready; returns its index.
    pub async fn start_sluice(&mut self) -> Result<usize> {
        let binary = self.binary.clone();
        self.stack.start_sluice(binary).await
    }

    /// Starts a sluice process without waiting for readiness.
    pub fn spawn_sluice(&mut self) -> Result<usize> {
        let binary = self.binary.clone();
        self.stack.spawn_sluice(binary)
    }

    /// Feeds `rows` to `table` (and its twin) through the ingest API of the newest
    /// sluice process.
    pub fn feed_api(&self, table: &str, rows: RowSet, pace: Pace) -> Result<Feed> {
        self.twin_feed(Route::api(self.stack.api_url())?, table, &rows, &pace);
        let route = Route::api(self.stack.api_url())?;
        Ok(Feed::start(route, table, rows, pace, FEED_DEADLINE))
    }

    /// Feeds `rows` to `table` (and its twin) through the ingest API of sluice process
    /// `index`.
    pub fn feed_api_of(&self, index: usize, table: &str, rows: RowSet, pace: Pace) -> Result<Feed> {
        let base = self.stack.api_url_of(index)?;
        self.twin_feed(Route::api(base.clone())?, table, &rows, &pace);
        Ok(Feed::start(
            Route::api(base)?,
            table,
            rows,
            pace,
            FEED_DEADLINE,
        ))
    }

    /// Feeds `rows` to `table` (and its twin) through the ingest API of the newest
    /// sluice process as `tenant` (configured with [`Stack::set`]), the `k`-th request
    /// under the `Idempotency-Key` `<key_prefix>-<k>`: feeds given one prefix share
    /// their keys, whatever their tenant or table (the twin's feed too).
    pub fn feed_api_as(
        &self,
        tenant: &str,
        key_prefix: &str,
        table: &str,
        rows: RowSet,
        pace: Pace,
    ) -> Result<Feed> {
        let route = || Route::api_as(self.stack.api_url(), tenant, key_prefix);
        self.twin_feed(route()?, table, &rows, &pace);
        Ok(Feed::start(route()?, table, rows, pace, FEED_DEADLINE))
    }

    /// Feeds `rows` to `table` (and its twin) straight to JetStream (the streams must
    /// exist: start a sluice first).
    pub fn feed_jetstream(&self, table: &str, rows: RowSet, pace: Pace) -> Feed {
        let route = || Route::jetstream(self.jet.context().clone());
        self.twin_feed(route(), table, &rows, &pace);
        Feed::start(route(), table, rows, pace, FEED_DEADLINE)
    }

    /// Waits for a feed (and its twin's) to end (within [`FEED_DEADLINE`]); a failure
    /// carries the sluice logs.
    pub async fn published(&self, feed: Feed) -> Result<Published> {
        let twin = {
            let mut feeds = lock(&self.twin_feeds);
            let twin = twin_of(feed.table());
            feeds
                .iter()
                .position(|f| f.table() == twin)
                .map(|i| feeds.remove(i))
        };
        let published = feed
            .finish(FEED_DEADLINE)
            .await
            .with_context(|| self.logs())?;
        if let Some(twin) = twin {
            let twin = twin
                .finish(FEED_DEADLINE)
                .await
                .with_context(|| self.logs())?;
            lock(&self.twin_published).push(twin);
        }
        Ok(published)
    }

    /// Asserts that nothing is parked for `tables` during the whole `window`, looking
    /// at the DLQ every half second.
    pub async fn expect_nothing_parked_for(&self, tables: &[&str], window: Duration) -> Result<()> {
        let end = Instant::now() + window;
        loop {
            for table in tables {
                let parked = self.jet.parked(table).await?;
                if !parked.is_empty() {
                    bail!(
                        "{} rows of {table} parked during the fault (first: {:?} {:?})\n{}",
                        parked.len(),
                        parked[0].payload,
                        parked[0].headers,
                        self.logs()
                    );
                }
            }
            if Instant::now() >= end {
                return Ok(());
            }
            tokio::time::sleep_until((Instant::now() + Duration::from_millis(500)).min(end)).await;
        }
    }

    /// The indexes of the sluice processes running now.
    fn live_sluices(&mut self) -> Vec<usize> {
        self.stack
            .sluice
            .iter_mut()
            .enumerate()
            .filter_map(|(i, p)| p.is_running().then_some(i))
            .collect()
    }

    /// What every flight out in each live sluice is doing (see `flights_out_in_tree`).
    pub async fn flights_out(&mut self) -> String {
        let live = self.live_sluices();
        let mut text = Vec::new();
        for i in live {
            let flights = match self.stack.admin_get_of(i, "/admin/actors").await {
                Ok((200, tree)) => flights_out_in_tree(&tree).join("; "),
                Ok((status, _)) => format!("/admin/actors answered {status}"),
                Err(e) => format!("/admin/actors: {e:#}"),
            };
            text.push(format!("sluice #{i}: [{flights}]"));
        }
        text.join(", ")
    }

    /// One look at the pipeline.
    pub async fn look(&mut self, tables: &[&str]) -> Look {
        let backlog = self.jet.backlog().await.ok();
        let mut held = Vec::new();
        let live = self.live_sluices();
        for i in live {
            let tree = self.stack.admin_get_of(i, "/admin/actors").await;
            held.push(match tree {
                Ok((200, tree)) => Some(held_in_tree(&tree)),
                _ => None,
            });
        }
        let mut counts = Vec::new();
        for table in tables {
            counts.push(self.stack.clickhouse.count(table).await.ok());
        }
        Look {
            backlog,
            held,
            counts,
        }
    }

    /// Waits until the pipeline is idle: the ingest stream empty with nothing pending or
    /// unacked, no live sluice holding rows or flushing, and the tables' counts the same
    /// over [`QUIET_LOOKS`] consecutive looks.
    pub async fn quiesce(&mut self, tables: &[&str], deadline: Duration) -> Result<()> {
        let end = Instant::now() + deadline;
        let mut previous: Option<Look> = None;
        let mut quiet = 0;
        loop {
            let look = self.look(tables).await;
            if verbose() && previous.as_ref() != Some(&look) {
                let at = deadline.saturating_sub(end.saturating_duration_since(Instant::now()));
                eprintln!("quiesce +{at:.1?}: {look:?}");
            }
            let same_counts = previous.as_ref().is_some_and(|p| p.counts == look.counts);
            if look.idle() && same_counts {
                quiet += 1;
                if quiet >= QUIET_LOOKS {
                    return Ok(());
                }
            } else {
                quiet = 0;
            }
            if Instant::now() >= end {
                let flights = self.flights_out().await;
                bail!("not quiet after {deadline:?}; last look: {look:?}; flights out: {flights}");
            }
            previous = Some(look);
            tokio::time::sleep_until((Instant::now() + QUIESCE_POLL).min(end)).await;
        }
    }

    /// Waits for quiescence, counts everything, prints the scenario's line, and fails
    /// (with the sluice logs) if a row was lost or a good row parked. Returns the
    /// tally for scenario-specific checks.
    pub async fn finish(&mut self, published: &[Published]) -> Result<Tally> {
        let twins: Vec<Published> = {
            let main: HashSet<String> = published.iter().map(|p| twin_of(&p.table)).collect();
            lock(&self.twin_published)
                .iter()
                .filter(|t| main.contains(&t.table))
                .cloned()
                .collect()
        };
        let tables: Vec<String> = published
            .iter()
            .chain(&twins)
            .map(|p| p.table.clone())
            .collect();
        // A cluster's rows are read through the Distributed table over its shards,
        // once every replica fetched its twins' parts.
        let cluster = self.stack.cluster.is_some();
        let read = move |t: &str| {
            if cluster {
                crate::clickhouse::distributed(t)
            } else {
                t.to_owned()
            }
        };
        let read_tables: Vec<String> = tables.iter().map(|t| read(t)).collect();
        let read_tables: Vec<&str> = read_tables.iter().map(String::as_str).collect();
        let healing = Instant::now();
        let quiet = self.quiesce(&read_tables, QUIESCE_DEADLINE).await;
        if cluster {
            let mut in_doubt = 0;
            for table in &tables {
                self.stack.sync_replicas(table).await?;
                for node in self.stack.nodes() {
                    in_doubt += crate::clickhouse::set_aside_parts_in_doubt(node, table)
                        .await
                        .with_context(|| format!("parts in doubt of {table}"))?;
                }
            }
            // 18.16's own part check would have set them aside within 5 minutes: named,
            // never silent (see `set_aside_parts_in_doubt`).
            if in_doubt > 0 {
                self.note("parts_in_doubt_set_aside", in_doubt);
            }
        }
        let mut tally = Tally::count_through(
            &self.name,
            &self.stack.clickhouse,
            &self.jet,
            published,
            &read,
        )
        .await
        .context("counting rows")?;
        tally.exactly_once = cluster;
        tally.notes = std::mem::take(&mut *lock(&self.notes));
        // Lost ids do not say their table: looked up where there is one.
        if let ([table], true) = (tables.as_slice(), cluster && tally.lost > 0) {
            self.count_rows_one_replica_kept(&mut tally, table).await;
        }
        if !twins.is_empty() {
            let twin = Tally::count(&self.name, &self.stack.clickhouse, &self.jet, &twins)
                .await
                .context("counting rows in the Replicated twins")?;
            tally.replicated = Some(Box::new(twin));
        }
        tally.settled_in = Some(healing.elapsed());
        tally.flow = self.flow.as_ref().map(FlowWatch::flow);
        match self.stranded_removed().await {
            Ok(stranded) => tally.stranded = stranded,
            Err(e) => tally.stranded_left = Some(format!("{e:#}")),
        }
        tally.not_quiet = quiet.err().map(|e| format!("{e:#}"));
        tally.print();
        if verbose() {
            eprintln!("{}", self.logs());
        }
        if let Err(e) = tally.check() {
            let replicas = if cluster && tally.lost > 0 {
                self.where_the_lost_rows_are(&tables, &tally.lost_ids).await
            } else {
                String::new()
            };
            bail!("{e:#}\n{replicas}{}", self.logs());
        }
        Ok(tally)
    }

    /// Rows the `Distributed` read missed that a replica of their shard holds: in the
    /// cluster, not lost, but not on every replica. ClickHouse 18.16 can leave a replica
    /// without a part its twin took when both are killed with -9 right after the insert
    /// (`cluster_shard_down`: the part on one replica only, the other's replication queue
    /// empty and its log pointer past the part, for good). Sluice inserted the rows once
    /// and had them acknowledged; which replica a `Distributed` read asks decides
    /// whether they show. Counted as inserted, and named in the scenario's line
    /// (`on_one_replica_only=`), so the gap is never silent.
    async fn count_rows_one_replica_kept(&self, tally: &mut Tally, table: &str) {
        let mut kept = HashSet::new();
        for chunk in tally.lost_ids.chunks(1000) {
            let ids: Vec<String> = chunk.iter().map(u64::to_string).collect();
            for node in self.stack.nodes() {
                let sql = format!(
                    "SELECT DISTINCT id FROM {table} WHERE id IN ({})",
                    ids.join(",")
                );
                if let Ok(found) = node.exec(&sql).await {
                    kept.extend(found.lines().filter_map(|l| l.trim().parse::<u64>().ok()));
                }
            }
        }
        if kept.is_empty() {
            return;
        }
        tally.lost_ids.retain(|id| !kept.contains(id));
        tally.lost = tally.lost.saturating_sub(kept.len() as u64);
        tally.inserted_distinct += kept.len() as u64;
        tally
            .notes
            .push(format!("on_one_replica_only={}", kept.len()));
    }

    /// On a ClickHouse cluster, what each replica holds of `tables` and of the first
    /// `lost` ids, its replication queue and the parts it set aside: what tells a part
    /// ClickHouse lost (or a replica never fetched) from rows Sluice never inserted.
    async fn where_the_lost_rows_are(&self, tables: &[String], lost: &[u64]) -> String {
        let ids: Vec<String> = lost.iter().take(5).map(u64::to_string).collect();
        let mut out = String::from("--- each replica ---\n");
        // The parts holding the lost ids on any replica: what the others' logs are
        // searched for.
        let mut parts: Vec<String> = Vec::new();
        for node in self.stack.nodes() {
            let _ = writeln!(out, "[{}]", node.http_url());
            for table in tables {
                let holding = format!(
                    "SELECT DISTINCT _part FROM {table} WHERE id IN ({})",
                    ids.join(",")
                );
                if let Ok(found) = node.exec(&holding).await {
                    parts.extend(found.lines().map(str::to_owned));
                }
                let queries = [
                    format!("SELECT count() FROM {table}"),
                    format!(
                        "SELECT _part, count() FROM {table} WHERE id IN ({}) GROUP BY _part",
                        ids.join(",")
                    ),
                    format!(
                        "SELECT name, rows, modification_time FROM system.parts \
                         WHERE table = '{table}' AND active ORDER BY modification_time"
                    ),
                    format!(
                        "SELECT type, new_part_name, num_tries, last_exception \
                         FROM system.replication_queue WHERE table = '{table}'"
                    ),
                    format!(
                        "SELECT is_readonly, queue_size, log_pointer, total_replicas, active_replicas \
                         FROM system.replicas WHERE table = '{table}'"
                    ),
                ];
                for sql in queries {
                    let answer = match node.exec(&sql).await {
                        Ok(text) => text,
                        Err(e) => format!("{e:#}\n"),
                    };
                    let _ = write!(out, "  {sql}\n{}", indent(&answer));
                }
                let detached = node
                    .dir()
                    .join(format!("data/data/default/{table}/detached"));
                let set_aside: Vec<String> = std::fs::read_dir(&detached)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                let _ = writeln!(out, "  detached parts of {table}: {set_aside:?}");
            }
        }
        parts.sort_unstable();
        parts.dedup();
        // What each server said (at warning and above) of those parts, and of parts it
        // found missing, unexpected, broken or lost.
        for node in self.stack.nodes() {
            let log =
                std::fs::read_to_string(node.dir().join("log/server.log")).unwrap_or_default();
            let said: Vec<&str> = log
                .lines()
                .filter(|l| {
                    parts.iter().any(|p| l.contains(p.as_str()))
                        || [
                            "lost forever",
                            "etach",
                            "roken",
                            "nexpected",
                            "issing",
                            "No active replica",
                        ]
                        .iter()
                        .any(|w| l.contains(w))
                })
                .take(30)
                .collect();
            let _ = write!(
                out,
                "[{}] its log on {parts:?} and on parts it found wanting:\n{}",
                node.http_url(),
                indent(&said.join("\n"))
            );
        }
        out
    }

    /// Acked messages a crashed nats-server 2.9 left in the work queue: Sluice deletes
    /// them with its next lag poll (every 5 s), so they must be gone within a few.
    /// Returns 0, or fails with how many are left and the backlog as JetStream shows it;
    /// a backlog that cannot be read is a failure too, never taken for an empty one.
    async fn stranded_removed(&self) -> Result<u64> {
        let mut last = Err(anyhow!("the backlog was never read"));
        for _ in 0..STRANDED_POLLS {
            last = self.jet.backlog().await;
            if last.as_ref().is_ok_and(|b| b.stranded() == 0) {
                return Ok(0);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        match last {
            Ok(backlog) => bail!(
                "{} messages are still in {INGEST_STREAM} {}s after quiescence although the consumer has nothing pending or awaiting an ack: sluice did not remove them ({backlog:?})",
                backlog.stranded(),
                STRANDED_POLLS / 2,
            ),
            Err(e) => bail!("cannot tell whether acked messages are left in {INGEST_STREAM}: {e:#}"),
        }
    }

    /// A metric's value on sluice process `index` (summed over matching series).
    pub async fn metric(&self, index: usize, name: &str, labels: &[(&str, &str)]) -> Result<f64> {
        let text = self.stack.metrics_of(index).await?;
        Ok(metric_value(&text, name, labels))
    }

    /// Waits until a metric of sluice process `index` reaches `at_least`.
    pub async fn wait_metric(
        &self,
        index: usize,
        name: &str,
        labels: &[(&str, &str)],
        at_least: f64,
        deadline: Duration,
    ) -> Result<f64> {
        crate::wait_for(
            &format!("{name}{labels:?} >= {at_least}"),
            deadline,
            Duration::from_millis(100),
            || async move {
                let v = self.metric(index, name, labels).await?;
                if v >= at_least {
                    Ok(v)
                } else {
                    Err(anyhow!("{v} so far"))
                }
            },
        )
        .await
        .with_context(|| self.logs())
    }

    /// The last lines of every sluice process's logs, for failure messages.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        for (i, p) in self.stack.sluice.iter().enumerate() {
            text.push_str(&format!(
                "--- sluice #{i} log tail ---\n{}\n",
                p.log_tail(LOG_LINES)
            ));
        }
        // nats-server's own account of a crash and its recovery (a stream or consumer
        // state it restored) is what explains a row lost across it.
        text.push_str(&format!(
            "--- nats-server log tail ---\n{}\n",
            self.stack.nats.log_tail(NATS_LOG_LINES)
        ));
        text
    }
}

/// Each line of `text` indented by four spaces (a replica's answers in a failure).
fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}
