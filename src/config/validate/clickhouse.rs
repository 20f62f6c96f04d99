//! `[clickhouse.targets.<name>]` and `[tenants.<name>]`: where rows go, and who sends them.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{names, Check, Key};
use crate::config::file::FileConfig;
use crate::config::{
    is_table_name, is_tenant_name, TargetConfig, TenantConfig, TABLE_NAME_RULE, TENANT_NAME_RULE,
};

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
        let url = k("url");
        match reqwest::Url::parse(&t.url) {
            Ok(parsed) if parsed.scheme() != "http" && parsed.scheme() != "https" => c.problem(
                &[&url],
                format!(
                    "{url} = \"{}\": the scheme must be http or https (ClickHouse's HTTP interface)",
                    t.url
                ),
            ),
            Ok(parsed) if !parsed.username().is_empty() || parsed.password().is_some() => c
                .problem(
                    &[&url],
                    format!(
                        "{url} carries credentials: put the user in `user` and the password in the variable named by `password_env`"
                    ),
                ),
            Ok(parsed) if parsed.host_str().is_none() => {
                c.problem(&[&url], format!("{url} = \"{}\" has no host", t.url))
            }
            Ok(_) => {}
            Err(e) => c.problem(&[&url], format!("{url} = \"{}\" is not a URL: {e}", t.url)),
        }
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
                url: t.url.trim_end_matches('/').to_string(),
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
