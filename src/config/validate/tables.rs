//! `[ingest]`, `[tables."tenant.table"]` and `[pipeline]`: how rows are batched and
//! held.

use std::collections::BTreeMap;

use super::{Check, Key};
use crate::config::file::{FileConfig, IngestFile, TableFile};
use crate::config::units::Size;
use crate::config::{
    is_table_name, is_tenant_name, ApiConfig, NatsConfig, PipelineConfig, TableSettings,
    TargetConfig, TenantConfig, TABLE_NAME_RULE, TENANT_NAME_RULE,
};

/// One table's settings: `over` where it says, `[ingest]` (`defaults`) elsewhere;
/// `section` is the table's own section, or `[ingest]` itself.
pub(super) fn table_settings(
    c: &mut Check,
    section: &Key,
    defaults: &IngestFile,
    over: &TableFile,
) -> TableSettings {
    let s = TableSettings {
        batch_rows: over.batch_rows.unwrap_or(defaults.batch_rows),
        batch_bytes: over.batch_bytes.unwrap_or(defaults.batch_bytes).as_usize(),
        batch_age: over.batch_age.unwrap_or(defaults.batch_age).get(),
        dlq: over.dlq.unwrap_or(defaults.dlq),
        skip_unknown_fields: over
            .skip_unknown_fields
            .unwrap_or(defaults.skip_unknown_fields),
        missing_table_grace: over
            .missing_table_grace
            .unwrap_or(defaults.missing_table_grace)
            .get(),
        shard_key: over.shard_key.clone(),
    };
    // Each value is checked where it is written: [ingest]'s once, a table's own ones.
    let own = |set: bool| set || section.path() == ["ingest"];
    let k = |name: &str| section.key(name);
    if own(over.batch_rows.is_some()) {
        c.at_least(&k("batch_rows"), s.batch_rows, 1);
    }
    if own(over.batch_bytes.is_some()) && s.batch_bytes < 1024 {
        let key = k("batch_bytes");
        c.problem(&[&key], format!("{key} must be at least 1KiB"));
    }
    if own(over.batch_age.is_some()) {
        c.positive(&k("batch_age"), s.batch_age);
    }
    if let Some(column) = &s.shard_key {
        let key = k("shard_key");
        if !is_column_name(column) {
            c.problem(
                &[&key],
                format!("{key} = {column:?} is not a column name: {COLUMN_NAME_RULE}"),
            );
        }
    }
    s
}

/// A `shard_key` on a table whose tenant's target has one shard places nothing: every
/// row goes to that shard. Said, since the key was written expecting otherwise (a
/// target configured with one shard for now, or the wrong tenant's table).
pub(super) fn shard_key_advice(
    c: &mut Check,
    tables: &BTreeMap<(String, String), TableSettings>,
    tenants: &BTreeMap<String, TenantConfig>,
    targets: &BTreeMap<String, TargetConfig>,
) {
    for ((tenant, table), s) in tables {
        let Some(column) = &s.shard_key else {
            continue;
        };
        let target = tenants
            .get(tenant)
            .and_then(|t| t.target.as_ref())
            .and_then(|name| targets.get(name));
        if let Some(target) = target.filter(|t| t.shards.len() == 1) {
            let section = format!("{tenant}.{table}");
            let key = Key::table(["tables", section.as_str()]).key("shard_key");
            c.warn(format!(
                "{key} = {column:?} places nothing: target \"{}\" has one shard, where every row of the table goes",
                target.name
            ));
        }
    }
}

/// What a `shard_key` may be: the name a row's JSON gives the column.
const COLUMN_NAME_RULE: &str = "1 to 256 characters, no control characters";

fn is_column_name(column: &str) -> bool {
    (1..=256).contains(&column.chars().count()) && !column.chars().any(char::is_control)
}

/// What the ingest API's chunks mean for the stream and the tables: a message is never
/// split across inserts, and a publish bigger than the stream's budget never fits.
pub(super) fn chunk_advice(
    c: &mut Check,
    api: &ApiConfig,
    nats: &NatsConfig,
    ingest: &TableSettings,
    tables: &BTreeMap<(String, String), TableSettings>,
) {
    if api.chunk_bytes as u64 > nats.streams.max_bytes / 4 {
        c.warn(format!(
            "[api] chunk_bytes = {} is more than a quarter of [nats] max_bytes = {}: a request's message that big is refused (503) long before the stream is full",
            Size(api.chunk_bytes as u64),
            Size(nats.streams.max_bytes)
        ));
    }
    let smallest = tables
        .iter()
        .map(|((tenant, table), s)| (format!("[tables.\"{tenant}.{table}\"]"), s.batch_rows))
        .chain([("[ingest]".to_string(), ingest.batch_rows)])
        .min_by_key(|(_, rows)| *rows);
    if let Some((key, rows)) = smallest.filter(|(_, rows)| *rows < api.chunk_rows) {
        c.warn(format!(
            "[api] chunk_rows = {} is above {key} batch_rows = {rows}: a message is never split across inserts, so that table's inserts will carry up to {} rows",
            api.chunk_rows, api.chunk_rows
        ));
    }
}

pub(super) fn pipeline(c: &mut Check, file: &FileConfig, nats: &NatsConfig) -> PipelineConfig {
    let p = &file.pipeline;
    let section = Key::table(["pipeline"]);
    let k = |name: &str| section.key(name);
    c.at_least(&k("pull_batch"), p.pull_batch, 1);
    let max_held_rows = p.max_held_rows.unwrap_or(
        usize::try_from(nats.streams.max_ack_pending)
            .unwrap_or(1)
            .max(1),
    );
    c.at_least(&k("max_held_rows"), max_held_rows, 1);
    if max_held_rows < file.ingest.batch_rows {
        c.warn(format!(
            "[pipeline] max_held_rows = {max_held_rows} is below [ingest] batch_rows = {}: batches will be flushed by age, never full",
            file.ingest.batch_rows
        ));
    }
    c.at_least(&k("max_inflight_flushes"), p.max_inflight_flushes, 1);
    c.positive(&k("idle_table_after"), p.idle_table_after.get());
    c.positive(&k("shutdown_deadline"), p.shutdown_deadline.get());
    c.positive(&k("backoff_initial"), p.backoff_initial.get());
    if p.backoff_max < p.backoff_initial {
        c.problem(
            &[&k("backoff_max"), &k("backoff_initial")],
            "[pipeline] backoff_max must be at least backoff_initial",
        );
    }
    PipelineConfig {
        pull_batch: p.pull_batch,
        max_held_rows,
        max_inflight_flushes: p.max_inflight_flushes,
        idle_table_after: p.idle_table_after.get(),
        shutdown_deadline: p.shutdown_deadline.get(),
        backoff_initial: p.backoff_initial.get(),
        backoff_max: p.backoff_max.get(),
    }
}

/// The `[tables."tenant.table"]` sections: each key a tenant's table, each section
/// `[ingest]` with its overrides.
pub(super) fn tables(
    c: &mut Check,
    file: &FileConfig,
    tenants: &BTreeMap<String, TenantConfig>,
) -> BTreeMap<(String, String), TableSettings> {
    let mut tables = BTreeMap::new();
    for (name, over) in &file.tables {
        let section = Key::table(["tables", name.as_str()]);
        let Some((tenant, table)) = name.split_once('.') else {
            c.problem(
                &[&section],
                format!(
                    "{section}: the key must be \"tenant.table\", like [tables.\"acme.events\"]"
                ),
            );
            continue;
        };
        if !is_tenant_name(tenant) || !is_table_name(table) {
            c.problem(
                &[&section],
                format!(
                    "{section}: \"{tenant}\" or \"{table}\" is not a valid name (tenant {TENANT_NAME_RULE}; table {TABLE_NAME_RULE})"
                ),
            );
            continue;
        }
        if !tenants.contains_key(tenant) {
            c.problem(
                &[&section],
                format!("{section}: tenant \"{tenant}\" is not defined under [tenants]"),
            );
        }
        let settings = table_settings(c, &section, &file.ingest, over);
        tables.insert((tenant.to_string(), table.to_string()), settings);
    }
    tables
}
