//! Which tables each tenant writes to, capped by `[api] max_tables_per_tenant`.
//!
//! Every table a tenant writes to costs an actor and a few metric series for as long as
//! the process runs; the catalog keeps out tables ClickHouse does not have, and this
//! cap bounds how many real ones one tenant can bring in.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

/// A tenant at its cap, asking for one table more.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("tenant {tenant} writes to {max} tables already, the most [api] max_tables_per_tenant allows; {table} would be one more (raise the limit, or write to a table already in use)")]
pub struct TooManyTables {
    pub tenant: String,
    pub table: String,
    pub max: usize,
}

/// The tables each tenant has written to since the process started.
pub struct TenantTables {
    max: usize,
    seen: Mutex<HashMap<String, HashSet<String>>>,
}

impl TenantTables {
    pub fn new(max: usize) -> Self {
        TenantTables {
            max,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Take `table` for `tenant`: a table already in use always is; a new one while
    /// the tenant is below the cap.
    pub fn admit(&self, tenant: &str, table: &str) -> Result<(), TooManyTables> {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let tables = seen.entry(tenant.to_string()).or_default();
        if tables.contains(table) {
            return Ok(());
        }
        if tables.len() >= self.max {
            return Err(TooManyTables {
                tenant: tenant.to_string(),
                table: table.to_string(),
                max: self.max,
            });
        }
        tables.insert(table.to_string());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tenant_has_its_own_cap() {
        let tables = TenantTables::new(2);
        assert_eq!(tables.admit("acme", "a"), Ok(()));
        assert_eq!(tables.admit("acme", "b"), Ok(()));
        let e = tables.admit("acme", "c").expect_err("over");
        assert_eq!(e.max, 2);
        assert!(e.to_string().contains("max_tables_per_tenant"), "{e}");
        // Tables in use still are; another tenant is not affected.
        assert_eq!(tables.admit("acme", "a"), Ok(()));
        assert_eq!(tables.admit("globex", "c"), Ok(()));
    }
}
