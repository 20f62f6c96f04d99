//! The guarded query gateway: `POST /v1/query`.
//!
//! Why it exists (seed 001): a client gives up on a slow query and retries, while the
//! abandoned query keeps burning ClickHouse threads; each retry adds another, until the
//! server falls over. The gateway treats timeout, cancellation and retry as one
//! protocol:
//!
//! - every query has a generated `query_id` (header `X-Sluice-Query-Id`, logs);
//! - ClickHouse's `max_execution_time` sits below the client deadline, so the server
//!   normally stops first (code 159 → 504, never retried);
//! - past the deadline Sluice sends `KILL QUERY` on its own connection and confirms the
//!   query gone before answering 504 (`gateway.rs`, `kill.rs`);
//! - only Unavailable failures are retried, with full-jitter backoff, under a global
//!   token-bucket budget; an empty bucket answers 503 at once (`retry_budget.rs`,
//!   `backoff.rs`);
//! - the query workload has its own ClickHouse user, its own concurrency limit and a
//!   per-tenant one; over a limit → 429, no queue (`limits.rs`);
//! - the target's servers (a cluster's, any shard) are taken in turn; a query that
//!   could not reach one (it did not start) goes to the next at once (`servers.rs`),
//!   and a kill goes to the server that ran the query;
//! - statements are checked before sending (one read statement; no `SETTINGS`, no
//!   table function or server table outside small allow-lists: `sql/`) and run with
//!   `readonly=2`; failures map through the shared classifier (`errors.rs`).
//!
//! # Mounting
//!
//! `api::routes` mounts [`route`] beside the ingest route, on a state that holds a
//! [`QueryState`]; [`router`] is the route alone with its state.
//!
//! With no `[query]` section the route still exists and answers 404 with a body that
//! says the gateway is off: 404 rather than 503 because nothing will change until the
//! configuration does, and a 503 would invite retries.

mod errors;
mod gateway;
mod handler;
mod id;
mod kill;
mod limits;
pub mod metrics;
mod pacing;
mod request;
mod response;
mod retry_budget;
mod servers;
mod sql;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, FromRef};
use axum::routing::{post, MethodRouter};
use axum::Router;

pub use errors::{map_clickhouse, query_action, QueryError, StoppedBy};
pub use gateway::{server_limit_for, Gateway};
pub use id::QueryId;
pub use limits::{Admission, Limits, Refused};
pub use pacing::RetryPacing;
pub use request::{Format, ValidQuery};
pub use response::{PREFIX_WINDOW, RESULT_CAP_HEADER};
pub use retry_budget::RetryBudget;
pub use sql::{check_read_only, SqlError, READ_KEYWORDS};

use crate::config::Config;
use crate::http::tenant::TenantResolver;

/// The header every answer carries the query's id in.
pub const QUERY_ID_HEADER: &str = "x-sluice-query-id";

/// The header a successful answer carries the number of attempts it took in (errors
/// carry `attempts` in their body).
pub const ATTEMPTS_HEADER: &str = "x-sluice-attempts";

/// The largest request body accepted (the SQL and its parameters).
pub const MAX_REQUEST_BYTES: usize = 1 << 20;

/// What the query route needs; cheap to clone.
#[derive(Clone, Debug)]
pub struct QueryState {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    tenants: TenantResolver,
    gateway: Option<Gateway>,
}

impl QueryState {
    /// Build from the configuration: the gateway is on when `[query]` is present.
    /// Fails only if an HTTP client cannot be built.
    pub fn new(config: Arc<Config>) -> anyhow::Result<Self> {
        let gateway = match &config.query {
            Some(q) => Some(Gateway::new(q, config.api.retry_after)?),
            None => None,
        };
        Ok(QueryState {
            inner: Arc::new(Inner {
                tenants: TenantResolver::new(config),
                gateway,
            }),
        })
    }

    /// The gateway, `None` when it is off.
    pub fn gateway(&self) -> Option<&Gateway> {
        self.inner.gateway.as_ref()
    }

    pub fn tenants(&self) -> &TenantResolver {
        &self.inner.tenants
    }
}

/// The `/v1/query` route, with its state applied (the API listener mounts [`route`]).
pub fn router(state: QueryState) -> Router {
    Router::new().route("/v1/query", route()).with_state(state)
}

/// `POST /v1/query` on a router whose state holds a [`QueryState`].
pub fn route<S>() -> MethodRouter<S>
where
    QueryState: FromRef<S>,
    S: Clone + Send + Sync + 'static,
{
    post(handler::query).layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
}
