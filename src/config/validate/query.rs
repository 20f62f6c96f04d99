//! `[query]`: the gateway's target, user, timeouts, concurrency and retries.

use std::collections::BTreeMap;

use super::{names, Check, Key};
use crate::config::file::FileConfig;
use crate::config::{QueryConfig, TargetConfig};

pub(super) fn query(
    c: &mut Check,
    file: &FileConfig,
    targets: &BTreeMap<String, TargetConfig>,
) -> Option<QueryConfig> {
    let q = &file.query;
    let section = Key::table(["query"]);
    let k = |name: &str| section.key(name);
    let target_name = q.target.as_ref()?;
    let Some(target) = targets.get(target_name) else {
        c.problem(
            &[&k("target")],
            format!(
                "[query] target = \"{target_name}\", which is not defined under [clickhouse.targets] (defined: {})",
                names(targets.keys())
            ),
        );
        return None;
    };
    let (user, password) = match &q.user {
        Some(user) => (user.clone(), c.secret(&k("password_env"), &q.password_env)),
        None => {
            c.warn(format!(
                "[query] has no user of its own: queries run as the ingest user \"{}\" (a separate read-only user keeps the two workloads apart)",
                target.user
            ));
            (target.user.clone(), target.password.clone())
        }
    };
    c.positive(&k("default_timeout"), q.default_timeout.get());
    if q.default_timeout > q.max_timeout {
        c.problem(
            &[&k("default_timeout"), &k("max_timeout")],
            "[query] default_timeout must not exceed max_timeout",
        );
    }
    if q.server_margin.get() >= q.default_timeout.get() {
        c.problem(
            &[&k("server_margin"), &k("default_timeout")],
            "[query] server_margin must be shorter than default_timeout, so ClickHouse stops the query before the client gives up",
        );
    }
    c.positive(&k("kill_timeout"), q.kill_timeout.get());
    c.at_least(&k("concurrency"), q.concurrency, 1);
    c.at_least(&k("tenant_concurrency"), q.tenant_concurrency, 1);
    if q.max_attempts == 0 {
        c.problem(
            &[&k("max_attempts")],
            "[query] max_attempts must be at least 1",
        );
    }
    if !(q.retry_budget >= 0.0 && q.retry_refill_per_sec >= 0.0) {
        c.problem(
            &[&k("retry_budget"), &k("retry_refill_per_sec")],
            "[query] retry_budget and retry_refill_per_sec must not be negative",
        );
    }
    if q.backoff_max < q.backoff_base {
        c.problem(
            &[&k("backoff_max"), &k("backoff_base")],
            "[query] backoff_max must be at least backoff_base",
        );
    }
    Some(QueryConfig {
        target: target_name.clone(),
        servers: target
            .replica_names()
            .into_iter()
            .flatten()
            .zip(target.urls().map(str::to_owned))
            .collect(),
        database: target.database.clone(),
        user,
        password,
        connect_timeout: target.connect_timeout,
        default_timeout: q.default_timeout.get(),
        max_timeout: q.max_timeout.get(),
        server_margin: q.server_margin.get(),
        kill_timeout: q.kill_timeout.get(),
        max_result_rows: q.max_result_rows,
        max_result_bytes: q.max_result_bytes.bytes(),
        concurrency: q.concurrency,
        tenant_concurrency: q.tenant_concurrency,
        max_attempts: q.max_attempts,
        backoff_base: q.backoff_base.get(),
        backoff_max: q.backoff_max.get(),
        retry_budget: q.retry_budget,
        retry_refill_per_sec: q.retry_refill_per_sec,
    })
}
