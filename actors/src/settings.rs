//! Every knob of the actor tree, with their defaults, and the resolver of
//! per-table overrides (`[tables."tenant.table"]` in `config.toml`).

use std::collections::HashMap;
use std::time::Duration;

pub use crate::backoff::{BackoffPolicy, RestartPolicy};
use crate::clock::WallClock;
use crate::placement::ShardKey;
use crate::ports::TableKey;

/// How one table is batched and what happens to its rejected rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableSettings {
    /// Flush when this many rows are buffered.
    pub batch_rows: usize,
    /// Flush when the buffered rows (each with its `\n`) reach this many bytes.
    pub batch_bytes: usize,
    /// Flush when the oldest buffered row is this old.
    pub batch_age: Duration,
    /// Park rows ClickHouse rejects alone on the DLQ; when off they stay unacked
    /// (naked with the cap delay) and come back.
    pub dlq: bool,
    /// Ask ClickHouse to skip fields the table does not have.
    pub skip_unknown_fields: bool,
    /// How long rows wait for a table (or database) ClickHouse says does not exist (a
    /// deploy race: rows before the migration) before they are parked.
    pub missing_table_grace: Duration,
    /// On a target of several shards: the column whose value places each row on a
    /// shard (`None`: whole batches go to the shards in turn).
    pub shard_key: Option<ShardKey>,
}

impl Default for TableSettings {
    fn default() -> Self {
        Self {
            batch_rows: 10_000,
            batch_bytes: 8 * 1024 * 1024,
            batch_age: Duration::from_secs(1),
            dlq: true,
            skip_unknown_fields: false,
            missing_table_grace: Duration::from_secs(600),
            shard_key: None,
        }
    }
}

/// One table's overrides; `None` keeps the default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableOverrides {
    pub batch_rows: Option<usize>,
    pub batch_bytes: Option<usize>,
    pub batch_age: Option<Duration>,
    pub dlq: Option<bool>,
    pub skip_unknown_fields: Option<bool>,
    pub missing_table_grace: Option<Duration>,
    /// The column that places rows on shards (a table's own: there is no default).
    pub shard_key: Option<String>,
}

impl TableOverrides {
    fn apply(&self, base: &TableSettings) -> TableSettings {
        TableSettings {
            batch_rows: self.batch_rows.unwrap_or(base.batch_rows).max(1),
            batch_bytes: self.batch_bytes.unwrap_or(base.batch_bytes).max(1),
            batch_age: self.batch_age.unwrap_or(base.batch_age),
            dlq: self.dlq.unwrap_or(base.dlq),
            skip_unknown_fields: self.skip_unknown_fields.unwrap_or(base.skip_unknown_fields),
            missing_table_grace: self.missing_table_grace.unwrap_or(base.missing_table_grace),
            shard_key: self
                .shard_key
                .as_deref()
                .map(ShardKey::new)
                .or_else(|| base.shard_key.clone()),
        }
    }
}

/// Resolves a table's settings: its override (keyed `tenant.table`) over the defaults.
#[derive(Clone, Debug, Default)]
pub struct TableSettingsResolver {
    pub defaults: TableSettings,
    /// Keyed by `tenant.table`, exactly as `[tables."acme.events"]` names it.
    pub overrides: HashMap<String, TableOverrides>,
}

impl TableSettingsResolver {
    pub fn new(defaults: TableSettings) -> Self {
        Self {
            defaults,
            overrides: HashMap::new(),
        }
    }

    pub fn with_override(mut self, tenant_table: &str, o: TableOverrides) -> Self {
        self.overrides.insert(tenant_table.to_owned(), o);
        self
    }

    pub fn resolve(&self, key: &TableKey) -> TableSettings {
        if self.overrides.is_empty() {
            return self.defaults.clone();
        }
        match self.overrides.get(&format!("{}.{}", key.tenant, key.table)) {
            Some(o) => o.apply(&self.defaults),
            None => self.defaults.clone(),
        }
    }
}

/// The pipeline's settings (everything but the per-table ones).
#[derive(Clone, Debug)]
pub struct PipelineSettings {
    /// Subjects are `<subject_prefix>.<tenant>.<table>`.
    pub subject_prefix: String,
    /// The stream's name, for the `stream` label of `sluice_consumer_pending`.
    pub stream: String,
    /// Deliveries asked for per pull.
    pub pull_batch: usize,
    /// Flush tasks in flight per table.
    pub max_inflight_flushes: usize,
    /// A table actor with an empty buffer, no flight and no backoff for this long is
    /// stopped (and spawned again on its next row).
    pub idle_table_after: Duration,
    /// Graceful shutdown: how long flights may run before what is left is naked.
    pub shutdown_deadline: Duration,
    /// JetStream's ack wait: rows held longer than half of it get `progress()`.
    pub ack_wait: Duration,
    /// While an outage lasts, a WARN at most this often.
    pub log_every: Duration,
    /// Actors publish their snapshot at most this often (and on every state change
    /// that matters: a flush, a breaker transition).
    pub snapshot_every: Duration,
    /// A snapshot older than this is reported stale (with its age).
    pub stale_after: Duration,
    /// How often the consumer asks the source for its pending count.
    pub pending_every: Duration,
    /// A table refuses to buffer beyond `buffer_cap_batches × batch_rows` rows (or the
    /// same multiple of `batch_bytes`); rows beyond are handed back (memory bound).
    pub buffer_cap_batches: usize,
    /// The pool's breaker.
    pub pool_backoff: BackoffPolicy,
    /// A table's own backoff (table-scoped failures).
    pub table_backoff: BackoffPolicy,
    /// The consumer's reconnect backoff and the pool's readiness probe retry.
    pub reconnect: BackoffPolicy,
    /// How supervisors respawn failed children.
    pub restart: RestartPolicy,
    /// When a window has ended and no flush came to probe, the pool probes the target
    /// itself after this long (so an idle pool's breaker closes too).
    pub idle_probe_after: Duration,
    /// While closed, when the target said nothing for this long (no traffic), the pool
    /// probes it, so a target that went down while idle shows as down.
    pub idle_probe_every: Duration,
    /// Every actor's heartbeat: snapshots, age checks, idle probes.
    pub tick_every: Duration,
    /// How long one actor waits for another's answer (shutdown steps, a flight asking
    /// for its delay) before it goes on without it.
    pub call_timeout: Duration,
    /// Rows for a pool or table that is restarting come back after this long.
    pub handback_while_restarting: Duration,
    /// A batch that could not be recorded in the manifest store (exactly-once) comes
    /// back after this long: nothing is inserted unrecorded.
    pub store_retry: Duration,
    /// How long messages of a recorded batch delivered again are gathered before the
    /// batch flies with what came (the rest read from the stream).
    pub reform_wait: Duration,
    /// A message that was in this many flights that lost ClickHouse's connection while
    /// ClickHouse was taking inserts (it answered in between) is suspected of crashing
    /// it: its next batch flies alone, is isolated once it has lost the connection alone
    /// twice (see `solo::Suspicion`), and a row that takes the server down on its own,
    /// twice, is parked.
    pub poison_strikes: u32,
    /// In such an isolation, how long ClickHouse may take to answer again after a lost
    /// connection before it counts as a real outage (which stops the isolation).
    pub poison_revive_within: Duration,
    /// Seed for the jitter (tests); `None` seeds from the OS.
    pub jitter_seed: Option<u64>,
    /// A crash on purpose at one point of a flight (tests of what a crash leaves).
    pub failpoint: Option<Failpoint>,
    /// Where a batch's record reads the time it was claimed (the system's clock; a
    /// simulation's own).
    pub wall_clock: WallClock,
}

/// Where Sluice crashes the process on purpose, for the tests that show what a crash
/// at that point leaves behind (`SLUICE_TEST_FAILPOINT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failpoint {
    /// A flight, after the insert went through, before its verdicts are recorded or any
    /// message is acked: the batch is recorded open, its rows in ClickHouse.
    CrashAfterInsert,
    /// A flight, after the verdicts are recorded, before any message is acked.
    CrashAfterVerdicts,
    /// After the parts of a message split by shard (`Delivery::split`) are stored in
    /// the stream, before anything else of the split is written or the message acked.
    CrashAfterSplitParts,
    /// A DLQ replay (the binary's, not a flight's), after a row was published back to
    /// the ingest stream, before its replay mark says so.
    CrashAfterReplayPublish,
}

impl std::str::FromStr for Failpoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "crash-after-insert" => Ok(Failpoint::CrashAfterInsert),
            "crash-after-verdicts" => Ok(Failpoint::CrashAfterVerdicts),
            "crash-after-split-parts" => Ok(Failpoint::CrashAfterSplitParts),
            "crash-after-replay-publish" => Ok(Failpoint::CrashAfterReplayPublish),
            other => Err(format!(
                "unknown failpoint {other:?}: expected crash-after-insert, crash-after-verdicts, crash-after-split-parts or crash-after-replay-publish"
            )),
        }
    }
}

impl Default for PipelineSettings {
    fn default() -> Self {
        Self {
            subject_prefix: "ingest".into(),
            stream: "INGEST".into(),
            pull_batch: 1000,
            max_inflight_flushes: 2,
            idle_table_after: Duration::from_secs(300),
            shutdown_deadline: Duration::from_secs(20),
            ack_wait: Duration::from_secs(60),
            log_every: Duration::from_secs(30),
            snapshot_every: Duration::from_millis(200),
            stale_after: Duration::from_secs(5),
            pending_every: Duration::from_secs(5),
            buffer_cap_batches: 4,
            pool_backoff: BackoffPolicy::default(),
            table_backoff: BackoffPolicy::default(),
            reconnect: BackoffPolicy {
                initial: Duration::from_millis(500),
                max: Duration::from_secs(10),
                probe_handback_min: Duration::from_millis(500),
            },
            restart: RestartPolicy::default(),
            idle_probe_after: Duration::from_secs(1),
            idle_probe_every: Duration::from_secs(10),
            tick_every: Duration::from_secs(1),
            call_timeout: Duration::from_secs(5),
            handback_while_restarting: Duration::from_secs(1),
            store_retry: Duration::from_secs(1),
            reform_wait: Duration::from_secs(1),
            poison_strikes: 3,
            poison_revive_within: Duration::from_secs(30),
            jitter_seed: None,
            failpoint: None,
            wall_clock: WallClock::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_wins_per_field() {
        let r = TableSettingsResolver::default().with_override(
            "acme.events",
            TableOverrides {
                batch_rows: Some(500),
                dlq: Some(false),
                ..Default::default()
            },
        );
        let s = r.resolve(&TableKey::new("acme", "events"));
        assert_eq!(s.batch_rows, 500);
        assert!(!s.dlq);
        assert_eq!(s.batch_bytes, TableSettings::default().batch_bytes);
        assert_eq!(
            r.resolve(&TableKey::new("acme", "clicks")),
            TableSettings::default()
        );
    }
}
