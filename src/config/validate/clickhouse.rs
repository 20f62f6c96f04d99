//! `[clickhouse.targets.<name>]` and `[tenants.<name>]`: where rows go, and who sends them.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{names, Check, Key};
use crate::config::file::{FileConfig, TargetFile};
use crate::config::{
    host_port, is_table_name, is_tenant_name, TargetConfig, TenantConfig, TABLE_NAME_RULE,
    TENANT_NAME_RULE,
};

/// The server a target without `url` or `shards` writes to.
const DEFAULT_URL: &str = "http://127.0.0.1:8123";

/// A target's shards, each its replicas' URLs: `url` (one shard, replicas
/// comma-separated, as `[nats] url` lists servers) or `shards` (one string per shard,
/// alike), never both; every URL checked, none twice.
fn servers(c: &mut Check, section: &Key, t: &TargetFile) -> Vec<Vec<String>> {
    let (url_key, shards_key) = (section.key("url"), section.key("shards"));
    let split = |list: &str| -> Vec<String> {
        list.split(',')
            .map(|u| u.trim().trim_end_matches('/').to_string())
            .filter(|u| !u.is_empty())
            .collect()
    };
    let (shards, key) = match (&t.url, &t.shards) {
        (Some(_), Some(_)) => {
            c.problem(
                &[&url_key, &shards_key],
                format!("{section}: set url (one shard, its replicas comma-separated) or shards (one string per shard), not both"),
            );
            return vec![vec![DEFAULT_URL.into()]];
        }
        (None, Some(shards)) if shards.is_empty() => {
            c.problem(
                &[&shards_key],
                format!("{shards_key} lists no shard: give one string per shard (its replicas comma-separated), or leave shards out and set url"),
            );
            return vec![vec![DEFAULT_URL.into()]];
        }
        (Some(url), None) => (vec![split(url)], &url_key),
        (None, Some(shards)) => (shards.iter().map(|s| split(s)).collect(), &shards_key),
        (None, None) => (vec![vec![DEFAULT_URL.to_string()]], &url_key),
    };
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (i, replicas) in shards.iter().enumerate() {
        if replicas.is_empty() {
            c.problem(&[key], format!("{key}: shard {} lists no server", i + 1));
        }
        for url in replicas {
            check_url(c, key, url);
            if let Some(first) = seen.insert(host_port(url), i + 1) {
                c.problem(
                    &[key],
                    format!(
                        "{key}: {} is listed twice (shard {first} and shard {}): each server is one replica of one shard",
                        host_port(url),
                        i + 1
                    ),
                );
            }
        }
    }
    shards
}

/// One server's URL: ClickHouse's HTTP interface, with a host, without credentials.
fn check_url(c: &mut Check, key: &Key, url: &str) {
    match reqwest::Url::parse(url) {
        Ok(parsed) if parsed.scheme() != "http" && parsed.scheme() != "https" => c.problem(
            &[key],
            format!(
                "{key}: \"{url}\": the scheme must be http or https (ClickHouse's HTTP interface)"
            ),
        ),
        Ok(parsed) if !parsed.username().is_empty() || parsed.password().is_some() => c
            .problem(
                &[key],
                format!(
                    "{key} carries credentials: put the user in `user` and the password in the variable named by `password_env`"
                ),
            ),
        Ok(parsed) if parsed.host_str().is_none() => {
            c.problem(&[key], format!("{key}: \"{url}\" has no host"))
        }
        Ok(_) => {}
        Err(e) => c.problem(&[key], format!("{key}: \"{url}\" is not a URL: {e}")),
    }
}

pub(super) fn targets(c: &mut Check, file: &FileConfig) -> BTreeMap<String, TargetConfig> {
    let mut out = BTreeMap::new();
    for (name, t) in &file.clickhouse.targets {
        let section = Key::table(["clickhouse", "targets", name.as_str()]);
        let k = |key: &str| section.key(key);
        if !is_table_name(name) {
            c.problem(
                &[&section],
                format!("{section}: \"{name}\" is not a valid target name ({TABLE_NAME_RULE})"),
            );
        }
        let shards = servers(c, &section, t);
        if !is_table_name(&t.database) {
            let key = k("database");
            c.problem(
                &[&key],
                format!(
                    "{key} = \"{}\" is not a valid name ({TABLE_NAME_RULE})",
                    t.database
                ),
            );
        }
        if t.user.trim().is_empty() {
            let key = k("user");
            c.problem(&[&key], format!("{key} is empty"));
        }
        c.positive(&k("insert_timeout"), t.insert_timeout.get());
        c.positive(&k("connect_timeout"), t.connect_timeout.get());
        c.at_least(&k("insert_concurrency"), t.insert_concurrency, 1);
        if t.pool_idle_timeout.get() >= Duration::from_secs(3) {
            c.warn(format!(
                "{} = {}: ClickHouse closes idle keep-alive connections after 3 s by default; keep this below the server's keep_alive_timeout",
                k("pool_idle_timeout"),
                t.pool_idle_timeout
            ));
        }
        let password = c.secret(&k("password_env"), &t.password_env);
        out.insert(
            name.clone(),
            TargetConfig {
                name: name.clone(),
                shards,
                user: t.user.clone(),
                password,
                database: t.database.clone(),
                insert_timeout: t.insert_timeout.get(),
                connect_timeout: t.connect_timeout.get(),
                insert_concurrency: t.insert_concurrency,
                pool_idle_timeout: t.pool_idle_timeout.get(),
            },
        );
    }
    out
}

pub(super) fn tenants(
    c: &mut Check,
    file: &FileConfig,
    targets: &BTreeMap<String, TargetConfig>,
) -> BTreeMap<String, TenantConfig> {
    let mut out = BTreeMap::new();
    for (name, t) in &file.tenants {
        let section = Key::table(["tenants", name.as_str()]);
        if !is_tenant_name(name) {
            c.problem(
                &[&section],
                format!("{section}: \"{name}\" is not a valid tenant name ({TENANT_NAME_RULE})"),
            );
        }
        let target_key = section.key("target");
        match &t.target {
            Some(target) if !targets.contains_key(target) => c.problem(
                &[&target_key],
                format!(
                    "{target_key} = \"{target}\", which is not defined under [clickhouse.targets] (defined: {})",
                    names(targets.keys())
                ),
            ),
            Some(_) => {}
            None => c.warn(format!(
                "{section} has no target: its rows are parked on the DLQ"
            )),
        }
        let token = c.secret(&section.key("token_env"), &t.token_env);
        out.insert(
            name.clone(),
            TenantConfig {
                name: name.clone(),
                target: t.target.clone(),
                token,
            },
        );
    }
    let tokens: Vec<_> = out
        .values()
        .filter_map(|t| Some((&t.name, t.token.as_ref()?)))
        .collect();
    let shared = tokens.iter().enumerate().find_map(|(i, (a, token))| {
        let (b, _) = tokens[i + 1..]
            .iter()
            .find(|(_, other)| other.expose() == token.expose())?;
        Some((*a, *b))
    });
    if let Some((a, b)) = shared {
        let (a, b) = (
            Key::table(["tenants", a.as_str()]).key("token_env"),
            Key::table(["tenants", b.as_str()]).key("token_env"),
        );
        c.problem(
            &[&a, &b],
            "two tenants share the same token: each tenant needs its own",
        );
    }
    out
}
