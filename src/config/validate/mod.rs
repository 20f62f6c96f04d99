//! From the file's shape to the validated `Config`: every problem collected, each
//! naming the keys it is about (so that it can be shown with their lines). One file
//! per part of the configuration; what they share (`Check`) is here.

mod clickhouse;
mod compression;
mod listeners;
mod nats;
mod query;
mod tables;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::document::Problem;
use super::file::{FileConfig, TableFile};
use super::key::Key;
use super::log_filter::LogFilter;
use super::{Config, LogConfig, Secret};

/// Problems and warnings found along the way.
struct Check<'v> {
    vars: &'v BTreeMap<String, String>,
    problems: Vec<Problem>,
    warnings: Vec<String>,
}

impl Check<'_> {
    fn problem(&mut self, keys: &[&Key], text: impl Into<String>) {
        self.problems.push(Problem::about(keys, text));
    }

    fn warn(&mut self, w: impl Into<String>) {
        self.warnings.push(w.into());
    }

    /// The secret in the variable `key` names; a named variable that is not set is a
    /// problem (an empty value is allowed: an empty password is a choice).
    fn secret(&mut self, key: &Key, var: &Option<String>) -> Option<Secret> {
        let var = var.as_ref()?;
        match self.vars.get(var) {
            Some(value) => Some(Secret::new(value.clone())),
            None => {
                self.problem(
                    &[key],
                    format!("{key} = \"{var}\", but the environment variable {var} is not set"),
                );
                None
            }
        }
    }

    fn positive(&mut self, key: &Key, value: Duration) {
        if value.is_zero() {
            self.problem(&[key], format!("{key} must be longer than zero"));
        }
    }

    fn at_least(&mut self, key: &Key, value: usize, min: usize) {
        self.at_least_for(key, value, min, "");
    }

    /// `value` at least `min`; `why` says what the bound is for ("" for nothing).
    fn at_least_for<T: PartialOrd + std::fmt::Display>(
        &mut self,
        key: &Key,
        value: T,
        min: T,
        why: &str,
    ) {
        if value < min {
            self.problem(
                &[key],
                format!("{key} = {value}: must be at least {min}{}", because(why)),
            );
        }
    }

    /// `value` from 1 to `max`; `why` says what the bound is for ("" for nothing).
    fn one_to(&mut self, key: &Key, value: usize, max: usize, why: &str) {
        if !(1..=max).contains(&value) {
            let why = if why.is_empty() {
                String::new()
            } else {
                format!(" ({why})")
            };
            self.problem(&[key], format!("{key} = {value}: must be 1 to {max}{why}"));
        }
    }

    fn listen(&mut self, key: &Key, value: &str) -> SocketAddr {
        match value.parse::<SocketAddr>() {
            Ok(addr) => addr,
            Err(_) => {
                self.problem(
                    &[key],
                    format!(
                        "{key} = \"{value}\" is not an address like \"127.0.0.1:8080\" or \"[::]:8080\""
                    ),
                );
                SocketAddr::from(([127, 0, 0, 1], 0))
            }
        }
    }
}

/// A bound's reason as a problem ends with it: ` (why)`, or nothing.
fn because(why: &str) -> String {
    if why.is_empty() {
        String::new()
    } else {
        format!(" ({why})")
    }
}

/// Check the whole. `refused` are keys whose values could not be read (already
/// reported, now at their defaults): problems involving them are left out, as they
/// would be about the defaults rather than what was written.
pub(super) fn validate(
    source_name: &str,
    file: FileConfig,
    vars: &BTreeMap<String, String>,
    warnings: Vec<String>,
    refused: &[Key],
) -> Result<Config, Vec<Problem>> {
    let mut c = Check {
        vars,
        problems: Vec::new(),
        warnings,
    };

    let nats = nats::nats(&mut c, &file);
    let targets = clickhouse::targets(&mut c, &file);
    let tenants = clickhouse::tenants(&mut c, &file, &targets);
    let ingest_key = Key::table(["ingest"]);
    let ingest = tables::table_settings(&mut c, &ingest_key, &file.ingest, &TableFile::default());
    let tables = tables::tables(&mut c, &file, &tenants);
    let pipeline = tables::pipeline(&mut c, &file, &nats);
    let api = listeners::api(&mut c, &file, &tenants);
    let admin = listeners::admin(&mut c, &file);
    let query = query::query(&mut c, &file, &targets);
    let log = log(&mut c, &file);

    // Cross-section advice.
    let slowest_insert = targets
        .values()
        .map(|t| t.insert_timeout)
        .max()
        .unwrap_or_default();
    if nats.streams.ack_wait <= ingest.batch_age + slowest_insert {
        c.warn(format!(
            "[nats] ack_wait = {} is not longer than batch_age + insert_timeout ({}): a row could be redelivered while one slow insert still holds it (Sluice sends in-progress signals, but a longer ack_wait is safer)",
            humantime::format_duration(nats.streams.ack_wait),
            humantime::format_duration(ingest.batch_age + slowest_insert)
        ));
    }
    if (nats.streams.max_ack_pending as u64) < ingest.batch_rows as u64 {
        c.warn(format!(
            "[nats] max_ack_pending = {} is below [ingest] batch_rows = {}: batches will be flushed by age, never full",
            nats.streams.max_ack_pending, ingest.batch_rows
        ));
    }

    tables::chunk_advice(&mut c, &api, &nats, &ingest, &tables);
    tables::shard_key_advice(&mut c, &tables, &tenants, &targets);

    let mut problems = c.problems;
    problems.retain(|p| !p.keys.iter().any(|k| refused.iter().any(|r| r.contains(k))));
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Config {
        source_name: source_name.to_string(),
        nats,
        targets,
        tenants,
        ingest,
        exactly_once: file.ingest.exactly_once,
        tables,
        pipeline,
        api,
        admin,
        query,
        log,
        warnings: c.warnings,
    })
}

/// `[log]`, whose level was checked as it was read; `RUST_LOG`, which takes its place
/// when set, is checked by the same rule (a typo there silences the service as well).
fn log(c: &mut Check, file: &FileConfig) -> LogConfig {
    if let Some(rust_log) = c.vars.get("RUST_LOG").filter(|v| !v.trim().is_empty()) {
        if let Err(why) = LogFilter::parse(rust_log) {
            c.problem(
                &[],
                format!("RUST_LOG (set, it takes the place of [log] level): {why}"),
            );
        }
    }
    LogConfig {
        format: file.log.format,
        level: file.log.level.0.clone(),
    }
}

/// The names defined, for a message about one that is not.
fn names<'a>(keys: impl Iterator<Item = &'a String>) -> String {
    let list: Vec<_> = keys.map(String::as_str).collect();
    if list.is_empty() {
        "none".into()
    } else {
        list.join(", ")
    }
}
