//! Subjects to tables to targets: `<prefix>.<tenant>.<table>` with identifier tokens
//! ([`TENANT_NAME_RULE`], [`TABLE_NAME_RULE`]), or the same in a partition of the queue,
//! `<prefix>_part.<n>.<tenant>.<table>` ([`partition_prefix`]); either may end in one
//! more token of the publisher's choosing (a key that spreads a table's rows over the
//! partitions: it names no table and is ignored here). A tenant with no ClickHouse
//! target, or a subject that does not parse, is parked with a clear error.
//!
//! The name rules here are the only ones: the ingest API, the admin endpoint and the
//! configuration check names with [`is_tenant`] and [`is_table`] too, so a name one
//! of them takes is a name every other takes.
//!
//! Neutral ground between the consumer, which routes, and the targets, which receive
//! [`Routed`]: neither module knows the other's messages.

use std::collections::HashMap;
use std::sync::Arc;

use crate::ledger::LedgerChange;
use crate::metrics::TableMetrics;
use crate::ports::TableKey;
use crate::settings::TableSettingsResolver;
use crate::settle::ParkReason;

/// What the consumer hands a target for its tables.
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
    /// A table of target number `target`.
    Table {
        key: TableKey,
        target: usize,
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

/// The longest tenant or table name taken: names are spliced into subjects, SQL,
/// URLs and metric labels, and no real one comes near it.
pub const MAX_NAME_LEN: usize = 128;

/// [`is_tenant`] as messages and docs state it.
pub const TENANT_NAME_RULE: &str = "[A-Za-z_][A-Za-z0-9_-]*, at most 128 characters";

/// [`is_table`] as messages and docs state it.
pub const TABLE_NAME_RULE: &str = "[A-Za-z_][A-Za-z0-9_]*, at most 128 characters";

/// A tenant name: an identifier that may also carry `-`.
pub fn is_tenant(s: &str) -> bool {
    is_identifier(s, b"_-")
}

/// A table name (also a ClickHouse target or database name): an identifier.
pub fn is_table(s: &str) -> bool {
    is_identifier(s, b"_")
}

/// A letter or `_`, then letters, digits and `extra`; at most [`MAX_NAME_LEN`] bytes.
fn is_identifier(s: &str, extra: &[u8]) -> bool {
    let mut b = s.bytes();
    s.len() <= MAX_NAME_LEN
        && matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || extra.contains(&c))
}

/// The suffix of the subject prefix a partition's subjects start with: a token of its
/// own, so that the server's subject mapping (which turns `<prefix>.<tenant>.<table>`
/// into a partition's subject) never maps a partition's subject again, and so that
/// the unpartitioned stream's `<prefix>.>` and a partition's subjects never overlap.
pub const PARTITION_SUFFIX: &str = "_part";

/// The subjects of partition `partition` start with this: `<prefix>_part.<partition>`.
pub fn partition_prefix(prefix: &str, partition: usize) -> String {
    format!("{prefix}{PARTITION_SUFFIX}.{partition}")
}

/// The `mappings` block of a nats-server configuration that sends what publishers
/// publish on `<prefix>.<tenant>.<table>` (by the table) and `<prefix>.<tenant>.<table>.<key>`
/// (by the table and the key: how one table spreads over every partition) to one of
/// `partitions` partitions, deterministically (the server's `partition` function, a
/// hash of the tokens named; nats-server 2.9 has it). The server maps a subject once,
/// so the partition's own subjects (`<prefix>_part.<n>...`) pass through as they are.
pub fn server_mapping(prefix: &str, partitions: usize) -> String {
    let to = |tokens: &str, wildcards: &str| {
        format!("{prefix}{PARTITION_SUFFIX}.{{{{partition({partitions},{tokens})}}}}.{wildcards}")
    };
    format!(
        "mappings = {{\n  \"{prefix}.*.*\": \"{}\"\n  \"{prefix}.*.*.*\": \"{}\"\n}}\n",
        to("1,2", "{{wildcard(1)}}.{{wildcard(2)}}"),
        to("1,2,3", "{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}"),
    )
}

/// `(tenant, table)` of a subject, or `None` when it is not
/// `<prefix>.<tenant>.<table>[.<key>]` or `<prefix>_part.<n>.<tenant>.<table>[.<key>]`.
pub fn parse_subject<'a>(prefix: &str, subject: &'a str) -> Option<(&'a str, &'a str)> {
    let after = subject.strip_prefix(prefix)?;
    let rest = match after.strip_prefix('.') {
        Some(rest) => rest,
        None => {
            let numbered = after.strip_prefix(PARTITION_SUFFIX)?.strip_prefix('.')?;
            let (n, rest) = numbered.split_once('.')?;
            if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            rest
        }
    };
    let (tenant, rest) = rest.split_once('.')?;
    let table = match rest.split_once('.') {
        None => rest,
        Some((table, key)) if is_key_token(key) => table,
        Some(_) => return None,
    };
    (is_tenant(tenant) && is_table(table)).then_some((tenant, table))
}

/// The token a publisher may add after the table: any one NATS token (no dots, no
/// wildcards, no spaces), at most [`MAX_NAME_LEN`] bytes.
fn is_key_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'.' | b'*' | b'>'))
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

    pub fn target_of_tenant(&self, tenant: &str) -> Option<usize> {
        self.tenants.get(tenant).copied()
    }

    pub fn target_index(&self, target: &str) -> Option<usize> {
        self.targets.iter().position(|t| &**t == target)
    }

    pub fn route(&self, subject: &str, tables: &TableSettingsResolver) -> Route {
        match parse_subject(&self.prefix, subject) {
            Some((tenant, table)) => {
                let key = TableKey::new(tenant, table);
                let metrics = TableMetrics::new(&key);
                match self.tenants.get(tenant) {
                    Some(&target) => Route::Table {
                        key,
                        target,
                        metrics,
                    },
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
                         {TENANT_NAME_RULE} and table {TABLE_NAME_RULE}",
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
        let eleventh = format!("{}.acme.events.k", partition_prefix("ingest", 11));
        for (subject, parsed) in [
            ("ingest.acme.events", ("acme", "events")),
            ("ingest.a-b_1.t_2", ("a-b_1", "t_2")),
            // A publisher's spreading key after the table, and a partition's subjects.
            ("ingest.acme.events.user-42", ("acme", "events")),
            ("ingest_part.2.acme.events", ("acme", "events")),
            (eleventh.as_str(), ("acme", "events")),
        ] {
            assert_eq!(parse_subject("ingest", subject), Some(parsed), "{subject}");
        }
        for bad in [
            "ingest.acme",
            "ingest.acme.events.x.y",
            "ingest_part.acme.events",
            "ingest_part.x1.acme.events",
            "ingest_part..acme.events",
            "ingest_partx.1.acme.events",
            "ingest_part.1.acme",
            "other.acme.events",
            "ingestx.acme.events",
            "ingest.1acme.events",
            "ingest.acme.ev-ents",
            "ingest..events",
            "ingest.acme.",
            "ingest.ac me.events",
            format!("ingest.acme.{}", "t".repeat(MAX_NAME_LEN + 1)).as_str(),
            format!("ingest.{}.events", "a".repeat(MAX_NAME_LEN + 1)).as_str(),
        ] {
            assert_eq!(parse_subject("ingest", bad), None, "{bad}");
        }
        let longest = "t".repeat(MAX_NAME_LEN);
        assert!(parse_subject("ingest", &format!("ingest.acme.{longest}")).is_some());
    }

    #[test]
    fn the_server_mapping_partitions_by_the_table_and_by_the_key() {
        assert_eq!(
            server_mapping("ingest", 3),
            "mappings = {\n  \"ingest.*.*\": \"ingest_part.{{partition(3,1,2)}}.{{wildcard(1)}}.{{wildcard(2)}}\"\n  \"ingest.*.*.*\": \"ingest_part.{{partition(3,1,2,3)}}.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}\"\n}\n"
        );
    }

    #[test]
    fn the_rules_as_stated_say_the_cap() {
        for rule in [TENANT_NAME_RULE, TABLE_NAME_RULE] {
            assert!(
                rule.ends_with(&format!("at most {MAX_NAME_LEN} characters")),
                "{rule}"
            );
        }
    }
}
