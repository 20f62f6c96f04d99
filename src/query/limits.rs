//! Isolation: how many queries run at once, in all and per tenant.
//!
//! The query workload class has its own semaphore, separate from the ingest path's
//! insert concurrency (and its own ClickHouse user), so a flood of slow queries can
//! fill only the query slots, never the insert ones. A per-tenant limit below that
//! keeps one tenant from taking every query slot.
//!
//! Over a limit the answer is an immediate 429, never a queue: a queue in front of an
//! overloaded ClickHouse only turns load into latency and timeouts, and clients that
//! time out retry. Permits are RAII guards; a streamed result holds its guards until
//! its last byte is relayed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug)]
pub struct Limits {
    global: Arc<Semaphore>,
    global_max: usize,
    tenant_max: usize,
    tenants: Arc<Mutex<HashMap<String, usize>>>,
}

/// Why a query was not admitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    Tenant { tenant: String, limit: usize },
    Global { limit: usize },
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Tenant { tenant, limit } => write!(
                f,
                "tenant {tenant:?} already has {limit} queries running ([query] tenant_concurrency); retry when one finishes"
            ),
            Refused::Global { limit } => write!(
                f,
                "the query gateway already runs {limit} queries ([query] concurrency); retry shortly"
            ),
        }
    }
}

/// Both slots of an admitted query; dropping it frees them.
#[derive(Debug)]
pub struct Admission {
    _global: OwnedSemaphorePermit,
    _tenant: TenantSlot,
}

#[derive(Debug)]
struct TenantSlot {
    tenant: String,
    tenants: Arc<Mutex<HashMap<String, usize>>>,
}

impl Drop for TenantSlot {
    fn drop(&mut self) {
        let mut map = lock(&self.tenants);
        if let Some(n) = map.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                // Keep the map as small as the set of tenants with queries in flight.
                map.remove(&self.tenant);
            }
        }
    }
}

impl Limits {
    pub fn new(global: usize, per_tenant: usize) -> Self {
        let global = global.max(1);
        Limits {
            global: Arc::new(Semaphore::new(global)),
            global_max: global,
            tenant_max: per_tenant.max(1),
            tenants: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Admit a query of `tenant` now, or refuse it: never waits.
    pub fn try_admit(&self, tenant: &str) -> Result<Admission, Refused> {
        // The tenant's slot first: a tenant over its own limit must not take (even
        // briefly) a global slot another tenant could use.
        let tenant_slot = {
            let mut map = lock(&self.tenants);
            let n = map.entry(tenant.to_string()).or_insert(0);
            if *n >= self.tenant_max {
                return Err(Refused::Tenant {
                    tenant: tenant.to_string(),
                    limit: self.tenant_max,
                });
            }
            *n += 1;
            TenantSlot {
                tenant: tenant.to_string(),
                tenants: self.tenants.clone(),
            }
        };
        // On refusal `tenant_slot` drops here and gives its slot back.
        let global = self
            .global
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refused::Global {
                limit: self.global_max,
            })?;
        Ok(Admission {
            _global: global,
            _tenant: tenant_slot,
        })
    }

    /// Queries in flight (for tests and the admin view).
    pub fn in_flight(&self) -> usize {
        self.global_max - self.global.available_permits()
    }
}

/// The counts stay meaningful after a panic elsewhere; keep serving.
fn lock(m: &Mutex<HashMap<String, usize>>) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_tenant_limit() {
        let l = Limits::new(10, 2);
        let a1 = l.try_admit("acme").expect("1");
        let _a2 = l.try_admit("acme").expect("2");
        assert_eq!(
            l.try_admit("acme").expect_err("3"),
            Refused::Tenant {
                tenant: "acme".into(),
                limit: 2
            }
        );
        let _g = l.try_admit("globex").expect("other tenant unaffected");
        drop(a1);
        let _a3 = l.try_admit("acme").expect("slot freed");
        assert_eq!(l.in_flight(), 3);
    }

    #[test]
    fn global_limit_and_no_leaked_tenant_slot() {
        let l = Limits::new(2, 2);
        let _a = l.try_admit("a").expect("1");
        let _b = l.try_admit("b").expect("2");
        let e = l.try_admit("c").expect_err("global full");
        assert_eq!(e, Refused::Global { limit: 2 });
        assert!(e.to_string().contains("concurrency"));
        // The refused tenant holds nothing.
        assert!(!lock(&l.tenants).contains_key("c"));
    }

    #[test]
    fn map_shrinks_when_idle() {
        let l = Limits::new(4, 4);
        {
            let _a = l.try_admit("a").expect("1");
            assert_eq!(lock(&l.tenants).get("a"), Some(&1));
        }
        assert!(lock(&l.tenants).is_empty());
        assert_eq!(l.in_flight(), 0);
    }
}
