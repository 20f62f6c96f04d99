//! Subjects to tables to pools: `<prefix>.<tenant>.<table>` with identifier tokens
//! (tenant `[A-Za-z_][A-Za-z0-9_-]*`, table `[A-Za-z_][A-Za-z0-9_]*`). A tenant with no
//! ClickHouse target, or a subject that does not parse, is parked with a clear error.
//!
//! Neutral ground between the consumer, which routes, and the pools, which receive
//! [`Routed`]: neither module knows the other's messages.

use std::collections::HashMap;
use std::sync::Arc;

use crate::ledger::LedgerChange;
use crate::metrics::TableMetrics;
use crate::ports::TableKey;
use crate::settings::TableSettingsResolver;
use crate::settle::ParkReason;

/// What the consumer hands a pool for its tables.
pub enum Routed<D> {
    /// Messages pulled for one table (each carrying one row or many): one group per
    /// subject of a pulled batch.
    Messages { key: TableKey, messages: Vec<D> },
    /// Changes of one table's recorded batches, routed ahead of the messages pulled
    /// after them (a table without an actor drops them: it starts from the store's
    /// snapshot when it is spawned).
    Ledger {
        key: TableKey,
        changes: Vec<LedgerChange>,
    },
    /// Every table starts its ledger again from the store's snapshot.
    LedgerResync,
}

/// Where the rows of one subject go.
#[derive(Clone)]
pub enum Route {
    /// A table of pool number `pool`.
    Table {
        key: TableKey,
        pool: usize,
        metrics: TableMetrics,
    },
    /// Parked whole (or naked with the cap delay, when the table's DLQ is off).
    Park {
        key: TableKey,
        error: Arc<str>,
        dlq: bool,
        reason: ParkReason,
        metrics: TableMetrics,
    },
}

pub fn is_tenant(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
}

pub fn is_table(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// `(tenant, table)` of a subject, or `None` when it is not `<prefix>.<tenant>.<table>`.
pub fn parse_subject<'a>(prefix: &str, subject: &'a str) -> Option<(&'a str, &'a str)> {
    let rest = subject.strip_prefix(prefix)?.strip_prefix('.')?;
    let (tenant, table) = rest.split_once('.')?;
    (is_tenant(tenant) && is_table(table)).then_some((tenant, table))
}

/// The tenant → target map (targets by index, in configuration order).
pub struct Router {
    pub prefix: String,
    tenants: HashMap<String, usize>,
    pub targets: Vec<Arc<str>>,
}

impl Router {
    pub fn new(prefix: &str, targets: Vec<Arc<str>>, tenants: HashMap<String, usize>) -> Self {
        Self {
            prefix: prefix.to_owned(),
            tenants,
            targets,
        }
    }

    pub fn pool_of_tenant(&self, tenant: &str) -> Option<usize> {
        self.tenants.get(tenant).copied()
    }

    pub fn pool_index(&self, target: &str) -> Option<usize> {
        self.targets.iter().position(|t| &**t == target)
    }

    pub fn route(&self, subject: &str, tables: &TableSettingsResolver) -> Route {
        match parse_subject(&self.prefix, subject) {
            Some((tenant, table)) => {
                let key = TableKey::new(tenant, table);
                let metrics = TableMetrics::new(&key);
                match self.tenants.get(tenant) {
                    Some(&pool) => Route::Table { key, pool, metrics },
                    None => Route::Park {
                        error: Arc::from(format!("tenant {tenant} has no ClickHouse target")),
                        dlq: tables.resolve(&key).dlq,
                        reason: ParkReason::NoTarget,
                        key,
                        metrics,
                    },
                }
            }
            None => {
                let key = TableKey::new("_invalid", "subject");
                Route::Park {
                    error: Arc::from(format!(
                        "invalid subject {subject:?}: expected {}.<tenant>.<table> with tenant \
                         [A-Za-z_][A-Za-z0-9_-]* and table [A-Za-z_][A-Za-z0-9_]*",
                        self.prefix
                    )),
                    dlq: tables.resolve(&key).dlq,
                    reason: ParkReason::InvalidSubject,
                    metrics: TableMetrics::new(&key),
                    key,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_parse_only_with_identifier_tokens() {
        assert_eq!(
            parse_subject("ingest", "ingest.acme.events"),
            Some(("acme", "events"))
        );
        assert_eq!(
            parse_subject("ingest", "ingest.a-b_1.t_2"),
            Some(("a-b_1", "t_2"))
        );
        for bad in [
            "ingest.acme",
            "ingest.acme.events.x",
            "other.acme.events",
            "ingestx.acme.events",
            "ingest.1acme.events",
            "ingest.acme.ev-ents",
            "ingest..events",
            "ingest.acme.",
            "ingest.ac me.events",
        ] {
            assert_eq!(parse_subject("ingest", bad), None, "{bad}");
        }
    }
}
