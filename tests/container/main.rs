//! The container image for real: built by scripts/image, run by podman (runtime runc)
//! and driven by testcontainers over podman's Docker-compatible API, against the
//! harness's nats-server and clickhouse-server.
//!
//! - `image`: started from `SLUICE_*` variables alone, healthy, ready, rows land; uid
//!   10001 on a read-only root with no capabilities; a graceful stop drains; a kill -9
//!   loses nothing; a wrong password or an unreachable ClickHouse keeps it unready.
//! - `kube`: docs/deploy.md's Kubernetes example under `podman kube play`.
//! - `compose`: deploy/compose.yaml and deploy/compose.nats-cluster.yaml parse, their
//!   Sluice environments are valid, and the cluster file's nodes make one cluster.
//! - `dockerfile`: the users' build path (`docker build .`), which CI cannot pull for.
//!
//! Needs `SLUICE_TEST_IMAGE` and `DOCKER_HOST` (scripts/test sets both; see
//! docs/deploy.md "Testing the image"); without them the engine tests skip, unless
//! `SLUICE_TEST_REQUIRE_SERVERS=1`.

mod compose;
mod dockerfile;
mod engine;
mod image;
mod kube;
mod sluice;

use std::time::Duration;

/// The host's sluice binary (for `check-config` of files, no engine needed).
pub const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// How long rows, states and counts get to show up.
pub const DEADLINE: Duration = Duration::from_secs(60);
pub const POLL: Duration = Duration::from_millis(200);

pub const EVENTS: &str =
    "CREATE TABLE events (id UInt64, name String) ENGINE = MergeTree ORDER BY id";

/// `n` rows `{"id": first + i, "name": "row-<id>"}`.
pub fn rows(first: u64, n: u64) -> Vec<serde_json::Value> {
    (first..first + n)
        .map(|id| serde_json::json!({"id": id, "name": format!("row-{id}")}))
        .collect()
}

/// The repository's root.
pub fn repo_root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}
