//! Every metric name of the actors (docs/architecture.md, "Contracts"), in one place, described (`ACTOR_METRICS`, `describe`), and
//! the per-table / per-target handle caches the actors use (labels are built once per
//! table or target, never per row).
//!
//! Label conventions (consistent everywhere):
//! - `tenant` is the tenant, `table` is the bare table name (never `tenant.table`).
//! - Where a metric is `{tenant,table}` both are set; where it is `{table}` only the
//!   table is set — except on the two per-table *gauges* (`sluice_buffered_rows`,
//!   `sluice_table_backoff`), which also carry `tenant`: two tenants may each have a
//!   table `events`, and a gauge without the tenant would be overwritten by the other's
//!   value (sum by `table` gives the per-table view).
//! - `target` is the ClickHouse target's name from `[clickhouse.targets.<name>]`;
//!   `replica` one server of it (`host:port`; a target of one server: its name again),
//!   on the series of one server: its insert requests, their duration and its breaker.
//! - `reason` on `sluice_retries_total`: `unavailable`, `denied`, `unknown` (the class of
//!   the outage that sent rows back) or `backoff` (rows handed back because a window was
//!   open, a probe was out, or a table was busy/restarting).
//! - `reason` on `sluice_rows_parked_total`: `rejected` (ClickHouse judged the row),
//!   `missing_table` (the table still did not exist after `missing_table_grace`),
//!   `no_target` (tenant without a ClickHouse target), `invalid_subject`.
//! - `outcome` on `sluice_insert_requests_total`: `ok`, `rejected`, `unavailable`,
//!   `denied`, `unknown`.
//! - `kind` on `sluice_actor_restarts_total`: `consumer`, `target`, `pool`, `table`.
//! - `reason` on `sluice_consumer_stalls_total`: `heartbeats_missed`,
//!   `leadership_change`, `pending_undelivered`, `stream_ahead_of_consumer`,
//!   `acks_held_by_nobody` (see `ports::StallReason`).

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter,
    Gauge, Histogram, Unit,
};

use crate::ports::{Class, StallReason, TableKey};

pub const ROWS_RECEIVED: &str = "sluice_rows_received_total";
/// The messages those rows came in (a message carries one row or
/// many), so rows per message can be read beside `max_ack_pending`, which counts these.
pub const MESSAGES_RECEIVED: &str = "sluice_messages_received_total";
pub const ROWS_INSERTED: &str = "sluice_rows_inserted_total";
pub const ROWS_PARKED: &str = "sluice_rows_parked_total";
pub const RETRIES: &str = "sluice_retries_total";
pub const INSERT_REQUESTS: &str = "sluice_insert_requests_total";
pub const INSERT_DURATION: &str = "sluice_insert_duration_seconds";
pub const BATCH_ROWS: &str = "sluice_batch_rows";
pub const BREAKER_STATE: &str = "sluice_breaker_state";
pub const TABLE_BACKOFF: &str = "sluice_table_backoff";
pub const BUFFERED_ROWS: &str = "sluice_buffered_rows";
/// 1 for a table ClickHouse deduplicates (exactly-once), 0 for one
/// it does not (at-least-once), once Sluice has asked.
pub const TABLE_EXACTLY_ONCE: &str = "sluice_table_exactly_once";
/// Batches that could not be recorded in the manifest store (they
/// wait; nothing is inserted unrecorded).
pub const MANIFEST_FAILURES: &str = "sluice_manifest_failures_total";
/// Recorded batches sent again later than the table's deduplication window
/// (`replicated_deduplication_window_seconds`) since they were claimed: ClickHouse may
/// have forgotten their first attempt and take their rows twice.
pub const PAST_DEDUP_WINDOW: &str = "sluice_batches_past_dedup_window_total";
/// Messages whose rows belong to several shards (a table's `shard_key`), published
/// again as one message per shard and acked.
pub const MESSAGES_SPLIT: &str = "sluice_messages_split_total";
/// Messages delivered again (a nak, `ack_wait`) into an exactly-once table that no
/// record covers, formed into a fresh batch: where a duplicate is traced to its cause
/// (a record expired or removed while a copy of its message was still out).
pub const MESSAGES_UNCOVERED: &str = "sluice_messages_uncovered_total";
/// Copies of a split message's part that its split's record does not count (another
/// copy of the part is the one inserted): acked without their rows going in.
pub const SPLIT_COPIES_DROPPED: &str = "sluice_split_copies_dropped_total";
/// Parts of split messages that found no record of their split (it expired, or was
/// removed once its parts were acked and one came again): inserted, at least once.
pub const SPLIT_PARTS_UNRECORDED: &str = "sluice_split_parts_unrecorded_total";
/// A table that does not exist is waited for:
/// 1 while ClickHouse says a table does not exist and its rows wait for it.
pub const TABLE_MISSING: &str = "sluice_table_missing";
pub const CONSUMER_PENDING: &str = "sluice_consumer_pending";
/// Not in DESIGN's list: pulls found lost and replaced (a silent stall noticed), by
/// stream and reason (`ports::StallReason::as_str`).
pub const CONSUMER_STALLS: &str = "sluice_consumer_stalls_total";
pub const ACTOR_RESTARTS: &str = "sluice_actor_restarts_total";
/// A full DLQ makes parking fail, and an alert needs to see it ("an alert
/// metric rises": rows whose DLQ publish failed (they stay unacked).
pub const DLQ_PUBLISH_FAILURES: &str = "sluice_dlq_publish_failures_total";

/// How a metric is exported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// A metric's name with what the exporter says of it (`# HELP`, `# TYPE`, its unit).
#[derive(Clone, Copy, Debug)]
pub struct Described {
    pub name: &'static str,
    pub kind: Kind,
    pub unit: Option<Unit>,
    pub help: &'static str,
}

/// A counter of events (unit: a count).
pub const fn counter(name: &'static str, help: &'static str) -> Described {
    counter_in(name, Unit::Count, help)
}

pub const fn counter_in(name: &'static str, unit: Unit, help: &'static str) -> Described {
    Described {
        name,
        kind: Kind::Counter,
        unit: Some(unit),
        help,
    }
}

/// A gauge without a unit (a state, a flag).
pub const fn gauge(name: &'static str, help: &'static str) -> Described {
    Described {
        name,
        kind: Kind::Gauge,
        unit: None,
        help,
    }
}

pub const fn gauge_in(name: &'static str, unit: Unit, help: &'static str) -> Described {
    Described {
        name,
        kind: Kind::Gauge,
        unit: Some(unit),
        help,
    }
}

pub const fn histogram_in(name: &'static str, unit: Unit, help: &'static str) -> Described {
    Described {
        name,
        kind: Kind::Histogram,
        unit: Some(unit),
        help,
    }
}

/// Every metric of the actors, described (the `/metrics` acceptance test and
/// docs/operations.md's table read this list).
pub const ACTOR_METRICS: &[Described] = &[
    counter(ROWS_RECEIVED, "Rows pulled from the ingest stream, by tenant and table."),
    counter(MESSAGES_RECEIVED, "Messages pulled from the ingest stream (each carries one row or many), by tenant and table."),
    counter(ROWS_INSERTED, "Rows inserted into ClickHouse (and acked), by tenant and table."),
    counter(ROWS_PARKED, "Rows parked on the dead-letter stream, by tenant, table and reason."),
    counter(RETRIES, "Rows handed back for redelivery with a delay, by table and reason (unavailable, denied, unknown, backoff)."),
    counter(INSERT_REQUESTS, "Insert requests sent to ClickHouse, by target, replica and outcome."),
    histogram_in(INSERT_DURATION, Unit::Seconds, "Duration of one insert request, by target and replica."),
    histogram_in(BATCH_ROWS, Unit::Count, "Rows per flushed batch, by table."),
    gauge(BREAKER_STATE, "A ClickHouse server's outage breaker (its pool's), by target and replica: 0 closed, 1 open, 2 probing."),
    gauge(TABLE_BACKOFF, "A table's own backoff (table-scoped failures): 0 closed, 1 open, 2 probing."),
    gauge_in(BUFFERED_ROWS, Unit::Count, "Rows buffered in a table actor, not yet flushed."),
    gauge(TABLE_MISSING, "1 while ClickHouse says the table does not exist and its rows wait for it (missing_table_grace)."),
    gauge(TABLE_EXACTLY_ONCE, "1 when ClickHouse deduplicates the table's inserts (exactly-once), 0 when it does not (at-least-once)."),
    counter(MANIFEST_FAILURES, "Batches that could not be recorded in the manifest store; they wait, nothing is inserted unrecorded."),
    counter(PAST_DEDUP_WINDOW, "Recorded batches sent again later than the table's deduplication window since they were claimed: ClickHouse may take their rows twice."),
    counter(MESSAGES_SPLIT, "Messages whose rows belong to several shards of the table's shard_key, published again as one message per shard."),
    counter(MESSAGES_UNCOVERED, "Messages delivered again into an exactly-once table that no batch record covers, formed into a fresh batch."),
    counter(SPLIT_COPIES_DROPPED, "Copies of a split message's part that the split's record does not count (another copy of the part is inserted): acked without their rows going in."),
    counter(SPLIT_PARTS_UNRECORDED, "Parts of split messages that found no record of their split (expired, or removed once its parts were acked): inserted, at least once."),
    gauge_in(CONSUMER_PENDING, Unit::Count, "Messages in the stream not yet delivered to the consumer (the lag)."),
    counter(CONSUMER_STALLS, "Pulls the consumer found lost and replaced without a restart (no row and no heartbeat, a leader change, rows pending and none delivered), by stream and reason."),
    counter(ACTOR_RESTARTS, "Actors respawned after a failure, by kind."),
    counter(DLQ_PUBLISH_FAILURES, "Rows whose DLQ publish failed; they stay unacked (alert on this)."),
];

/// Register the descriptions (and units) of `list` with the installed recorder. Call
/// once at start.
pub fn describe(list: &[Described]) {
    for d in list {
        match (d.kind, d.unit) {
            (Kind::Counter, Some(unit)) => describe_counter!(d.name, unit, d.help),
            (Kind::Counter, None) => describe_counter!(d.name, d.help),
            (Kind::Gauge, Some(unit)) => describe_gauge!(d.name, unit, d.help),
            (Kind::Gauge, None) => describe_gauge!(d.name, d.help),
            (Kind::Histogram, Some(unit)) => describe_histogram!(d.name, unit, d.help),
            (Kind::Histogram, None) => describe_histogram!(d.name, d.help),
        }
    }
}

/// The reason label for rows sent back after an outage answer of this class.
pub fn retry_reason(class: Class) -> &'static str {
    match class {
        Class::Unavailable => "unavailable",
        Class::Denied => "denied",
        Class::Unknown => "unknown",
        // A rejected row is never retried by class; it is left unacked (DLQ off or
        // failing), which is closest to a backoff.
        Class::Rejected => "backoff",
    }
}

/// One table's handles.
#[derive(Clone)]
pub struct TableMetrics {
    /// Rows pulled; see [`TableMetrics::received`].
    pub rows_received: Counter,
    pub messages_received: Counter,
    pub inserted: Counter,
    pub parked_rejected: Counter,
    pub parked_missing_table: Counter,
    pub parked_no_target: Counter,
    pub parked_invalid: Counter,
    pub parked_undecodable: Counter,
    pub retries_unavailable: Counter,
    pub retries_denied: Counter,
    pub retries_unknown: Counter,
    pub retries_backoff: Counter,
    pub dlq_failures: Counter,
    pub batch_rows: Histogram,
    pub buffered: Gauge,
    pub backoff: Gauge,
    pub missing: Gauge,
    pub exactly_once: Gauge,
    pub manifest_failures: Counter,
    pub past_dedup_window: Counter,
    pub messages_split: Counter,
    pub messages_uncovered: Counter,
    pub split_copies_dropped: Counter,
    pub split_parts_unrecorded: Counter,
}

impl TableMetrics {
    pub fn new(key: &TableKey) -> Self {
        let tenant = key.tenant.to_string();
        let table = key.table.to_string();
        let tt = |name: &'static str| counter!(name, "tenant" => tenant.clone(), "table" => table.clone());
        let parked = |reason: &'static str| counter!(ROWS_PARKED, "tenant" => tenant.clone(), "table" => table.clone(), "reason" => reason);
        let retries =
            |reason: &'static str| counter!(RETRIES, "table" => table.clone(), "reason" => reason);
        Self {
            rows_received: tt(ROWS_RECEIVED),
            messages_received: tt(MESSAGES_RECEIVED),
            inserted: tt(ROWS_INSERTED),
            parked_rejected: parked("rejected"),
            parked_missing_table: parked("missing_table"),
            parked_no_target: parked("no_target"),
            parked_invalid: parked("invalid_subject"),
            parked_undecodable: parked("undecodable"),
            retries_unavailable: retries("unavailable"),
            retries_denied: retries("denied"),
            retries_unknown: retries("unknown"),
            retries_backoff: retries("backoff"),
            dlq_failures: tt(DLQ_PUBLISH_FAILURES),
            batch_rows: histogram!(BATCH_ROWS, "table" => table.clone()),
            buffered: gauge!(BUFFERED_ROWS, "tenant" => tenant.clone(), "table" => table.clone()),
            backoff: gauge!(TABLE_BACKOFF, "tenant" => tenant.clone(), "table" => table.clone()),
            missing: gauge!(TABLE_MISSING, "tenant" => tenant.clone(), "table" => table.clone()),
            exactly_once: gauge!(TABLE_EXACTLY_ONCE, "tenant" => tenant.clone(), "table" => table.clone()),
            manifest_failures: tt(MANIFEST_FAILURES),
            past_dedup_window: tt(PAST_DEDUP_WINDOW),
            messages_split: tt(MESSAGES_SPLIT),
            messages_uncovered: tt(MESSAGES_UNCOVERED),
            split_copies_dropped: tt(SPLIT_COPIES_DROPPED),
            split_parts_unrecorded: tt(SPLIT_PARTS_UNRECORDED),
        }
    }

    /// Counts `messages` pulled for the table, carrying `rows` rows.
    pub fn received(&self, messages: usize, rows: usize) {
        self.messages_received.increment(messages as u64);
        self.rows_received.increment(rows as u64);
    }

    pub fn retries(&self, reason: &str) -> &Counter {
        match reason {
            "unavailable" => &self.retries_unavailable,
            "denied" => &self.retries_denied,
            "unknown" => &self.retries_unknown,
            _ => &self.retries_backoff,
        }
    }
}

/// One ClickHouse server's handles (a replica of a target's shard).
#[derive(Clone)]
pub struct ReplicaMetrics {
    pub ok: Counter,
    pub rejected: Counter,
    pub unavailable: Counter,
    pub denied: Counter,
    pub unknown: Counter,
    pub duration: Histogram,
    pub breaker: Gauge,
}

impl ReplicaMetrics {
    pub fn new(target: &str, replica: &str) -> Self {
        let (t, r) = (target.to_owned(), replica.to_owned());
        let req = |outcome: &'static str| counter!(INSERT_REQUESTS, "target" => t.clone(), "replica" => r.clone(), "outcome" => outcome);
        Self {
            ok: req("ok"),
            rejected: req("rejected"),
            unavailable: req("unavailable"),
            denied: req("denied"),
            unknown: req("unknown"),
            duration: histogram!(INSERT_DURATION, "target" => t.clone(), "replica" => r.clone()),
            breaker: gauge!(BREAKER_STATE, "target" => t, "replica" => r),
        }
    }

    pub fn request(&self, outcome: Option<Class>, seconds: f64) {
        let c = match outcome {
            None => &self.ok,
            Some(Class::Rejected) => &self.rejected,
            Some(Class::Unavailable) => &self.unavailable,
            Some(Class::Denied) => &self.denied,
            Some(Class::Unknown) => &self.unknown,
        };
        c.increment(1);
        self.duration.record(seconds);
    }
}

/// Every `kind` of `sluice_actor_restarts_total`: the root's children (the consumer,
/// the targets) and a target's (its servers' pools, its tables).
pub const RESTART_KINDS: [&str; 4] = ["consumer", "target", "pool", "table"];

/// Registers at 0 every series whose labels are known before any traffic: the restarts
/// of each actor kind, each server's insert counters, latency and breaker, the stream's
/// lag, and every series of the tables configured by name. A counter that first
/// appears at 1 has no increase for Prometheus, so an `increase()` alert would miss the
/// first restart or park. Tables met later get theirs when they first appear (still
/// at 0, before their first row is counted).
pub fn register_known<'a>(
    replicas: impl IntoIterator<Item = (&'a str, &'a str)>,
    stream: &str,
    tables: impl IntoIterator<Item = &'a TableKey>,
) {
    // Touching a handle registers its series; adding 0 says so.
    for kind in RESTART_KINDS {
        restarts(kind).increment(0);
    }
    for (target, replica) in replicas {
        ReplicaMetrics::new(target, replica);
    }
    consumer_pending(stream).increment(0.0);
    for reason in StallReason::ALL {
        consumer_stalls(stream, reason).increment(0);
    }
    for table in tables {
        TableMetrics::new(table);
    }
}

pub fn restarts(kind: &'static str) -> Counter {
    counter!(ACTOR_RESTARTS, "kind" => kind)
}

pub fn consumer_pending(stream: &str) -> Gauge {
    gauge!(CONSUMER_PENDING, "stream" => stream.to_owned())
}

pub fn consumer_stalls(stream: &str, reason: StallReason) -> Counter {
    counter!(CONSUMER_STALLS, "stream" => stream.to_owned(), "reason" => reason.as_str())
}
