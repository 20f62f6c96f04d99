//! The ports the actors speak through, and the types that cross them: an [`Inserter`]
//! (ClickHouse), a [`Delivery`] (one JetStream message, carrying one row or many) and
//! the [`Source`] of deliveries. The batch ledger's own port, the manifest store, is
//! in `crate::ledger::store`.
//!
//! Every decision the actors make (buffer, flush, bisect, park, back off) is taken
//! against these traits, never against ClickHouse or JetStream directly, so each
//! decision is unit-testable with a scripted `Inserter` and a recording `Delivery`.
//! The real implementations live in the `sluice` crate: the ClickHouse HTTP client
//! (`src/clickhouse/`) and the JetStream message (`src/nats/`).

mod clickhouse;
mod delivery;
mod source;

use std::fmt;
use std::sync::Arc;

use serde::Serialize;

pub use clickhouse::*;
pub use delivery::*;
pub use source::*;

/// One ingest table as Sluice routes it: the tenant (which picks the ClickHouse
/// target) and the table name inside that target's database. Both are validated
/// identifiers before a `TableKey` is made; cloning is cheap.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct TableKey {
    pub tenant: Arc<str>,
    pub table: Arc<str>,
}

impl TableKey {
    pub fn new(tenant: &str, table: &str) -> Self {
        Self {
            tenant: Arc::from(tenant),
            table: Arc::from(table),
        }
    }
}

impl fmt::Display for TableKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.tenant, self.table)
    }
}
