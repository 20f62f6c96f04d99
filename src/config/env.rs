//! Environment overrides: every key as `SLUICE_<SECTION>_<KEY>`, which is how a
//! container is configured.
//!
//! `SLUICE_NATS_URL` sets `[nats] url`; `SLUICE_CLICKHOUSE_TARGETS_MAIN_URL` sets
//! `[clickhouse.targets.main] url`; `SLUICE_TENANTS_ACME_TARGET` sets
//! `[tenants.acme] target`; `SLUICE_TABLES_ACME__EVENTS_BATCH_ROWS` sets
//! `[tables."acme.events"] batch_rows` (a double underscore stands for the dot).
//! Names of targets, tenants and tables are taken in lower case. Variables named by a
//! `*_env` key hold secrets and are never read as overrides.

use std::collections::{BTreeMap, BTreeSet};

use toml::{Table, Value};

/// What a value must be parsed as; everything not listed is a string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Str,
    Int,
    Float,
    Bool,
}

const NATS_KEYS: &[(&str, Kind)] = &[
    ("url", Kind::Str),
    ("stream", Kind::Str),
    ("subject_prefix", Kind::Str),
    ("consumer", Kind::Str),
    ("dlq_stream", Kind::Str),
    ("dlq_subject_prefix", Kind::Str),
    ("max_bytes", Kind::Str),
    ("dlq_max_bytes", Kind::Str),
    ("duplicate_window", Kind::Str),
    ("ack_wait", Kind::Str),
    ("max_ack_pending", Kind::Int),
    ("user", Kind::Str),
    ("password_env", Kind::Str),
    ("token_env", Kind::Str),
    ("creds_file", Kind::Str),
    ("replicas", Kind::Int),
    ("manifest_bucket", Kind::Str),
    ("manifest_max_bytes", Kind::Str),
];

const TARGET_KEYS: &[(&str, Kind)] = &[
    ("url", Kind::Str),
    ("user", Kind::Str),
    ("password_env", Kind::Str),
    ("database", Kind::Str),
    ("insert_timeout", Kind::Str),
    ("connect_timeout", Kind::Str),
    ("insert_concurrency", Kind::Int),
    ("pool_idle_timeout", Kind::Str),
];

const TENANT_KEYS: &[(&str, Kind)] = &[("target", Kind::Str), ("token_env", Kind::Str)];

const TABLE_KEYS: &[(&str, Kind)] = &[
    ("batch_rows", Kind::Int),
    ("batch_bytes", Kind::Str),
    ("batch_age", Kind::Str),
    ("dlq", Kind::Bool),
    ("skip_unknown_fields", Kind::Bool),
    ("missing_table_grace", Kind::Str),
];

/// Keys of `[ingest]` that `[tables."tenant.table"]` does not have.
const INGEST_ONLY_KEYS: &[(&str, Kind)] = &[("exactly_once", Kind::Bool)];

const PIPELINE_KEYS: &[(&str, Kind)] = &[
    ("pull_batch", Kind::Int),
    ("max_held_rows", Kind::Int),
    ("max_inflight_flushes", Kind::Int),
    ("idle_table_after", Kind::Str),
    ("shutdown_deadline", Kind::Str),
    ("backoff_initial", Kind::Str),
    ("backoff_max", Kind::Str),
];

const API_KEYS: &[(&str, Kind)] = &[
    ("listen", Kind::Str),
    ("auth", Kind::Str),
    ("max_request_bytes", Kind::Str),
    ("ingest_memory", Kind::Str),
    ("max_row_bytes", Kind::Str),
    ("chunk_rows", Kind::Int),
    ("chunk_bytes", Kind::Str),
    ("retry_after", Kind::Str),
    ("max_json_depth", Kind::Int),
    ("max_tables_per_tenant", Kind::Int),
    ("fd_reserve", Kind::Int),
    ("header_timeout", Kind::Str),
    ("body_timeout", Kind::Str),
    ("idle_timeout", Kind::Str),
    ("max_connections", Kind::Int),
];

const ADMIN_KEYS: &[(&str, Kind)] = &[
    ("listen", Kind::Str),
    ("token_env", Kind::Str),
    ("fault_injection", Kind::Bool),
    ("header_timeout", Kind::Str),
    ("body_timeout", Kind::Str),
    ("idle_timeout", Kind::Str),
    ("max_connections", Kind::Int),
];

const QUERY_KEYS: &[(&str, Kind)] = &[
    ("target", Kind::Str),
    ("user", Kind::Str),
    ("password_env", Kind::Str),
    ("default_timeout", Kind::Str),
    ("max_timeout", Kind::Str),
    ("server_margin", Kind::Str),
    ("kill_timeout", Kind::Str),
    ("max_result_rows", Kind::Int),
    ("max_result_bytes", Kind::Str),
    ("concurrency", Kind::Int),
    ("tenant_concurrency", Kind::Int),
    ("max_attempts", Kind::Int),
    ("backoff_base", Kind::Str),
    ("backoff_max", Kind::Str),
    ("retry_budget", Kind::Float),
    ("retry_refill_per_sec", Kind::Float),
];

const LOG_KEYS: &[(&str, Kind)] = &[("format", Kind::Str), ("level", Kind::Str)];

/// Fixed sections: `SLUICE_<SECTION>_<KEY>`.
const SECTIONS: &[(&str, &[(&str, Kind)])] = &[
    ("nats", NATS_KEYS),
    ("ingest", TABLE_KEYS),
    ("ingest", INGEST_ONLY_KEYS),
    ("pipeline", PIPELINE_KEYS),
    ("api", API_KEYS),
    ("admin", ADMIN_KEYS),
    ("query", QUERY_KEYS),
    ("log", LOG_KEYS),
];

/// Variables with the prefix that are not overrides: the config file's path, where
/// `sluice dlq` finds the admin endpoint and its token, and the server binaries
/// `sluice dev` and the test harness may be pointed at.
const NOT_OVERRIDES: &[&str] = &[
    "SLUICE_CONFIG",
    "SLUICE_ADMIN_URL",
    "SLUICE_ADMIN_TOKEN",
    "SLUICE_NATS_SERVER_BIN",
    "SLUICE_NATS_CURRENT_BIN",
    "SLUICE_CLICKHOUSE_SERVER_BIN",
];

/// One override found in the environment.
#[derive(Clone, Debug, PartialEq)]
pub struct Override {
    pub var: String,
    /// The key path in the config document, e.g. `["clickhouse", "targets", "main", "url"]`.
    pub path: Vec<String>,
    pub value: Value,
}

impl Override {
    #[cfg(test)]
    pub fn dotted(&self) -> String {
        self.path.join(".")
    }
}

/// The overrides among `vars`, and a warning for each `SLUICE_*` variable that is
/// neither an override nor a secret named by the configuration.
pub fn overrides(
    vars: &BTreeMap<String, String>,
    secrets: &BTreeSet<String>,
) -> (Vec<Override>, Vec<String>, Vec<String>) {
    let mut found = Vec::new();
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    for (var, raw) in vars {
        let Some(rest) = var.strip_prefix("SLUICE_") else {
            continue;
        };
        if secrets.contains(var)
            || NOT_OVERRIDES.contains(&var.as_str())
            || var.starts_with("SLUICE_TEST_")
        {
            continue;
        }
        let rest = rest.to_ascii_lowercase();
        match locate(&rest) {
            Some((path, kind)) => match typed(raw, kind) {
                Ok(value) => found.push(Override {
                    var: var.clone(),
                    path,
                    value,
                }),
                Err(expected) => errors.push(format!(
                    "{var}={raw:?}: `{}` expects {expected}",
                    path.join(".")
                )),
            },
            None => warnings.push(format!(
                "{var} is set but is no configuration key (see config.toml for the keys); ignored"
            )),
        }
    }
    (found, errors, warnings)
}

/// Apply overrides to a parsed document, creating tables as needed.
pub fn apply(doc: &mut Table, overrides: &[Override]) {
    for o in overrides {
        if let Some((last, parents)) = o.path.split_last() {
            let table = parents.iter().fold(&mut *doc, |table, part| {
                let entry = table
                    .entry(part.clone())
                    .or_insert_with(|| Value::Table(Table::new()));
                if !entry.is_table() {
                    *entry = Value::Table(Table::new());
                }
                match entry {
                    Value::Table(t) => t,
                    _ => unreachable!("just made a table"),
                }
            });
            table.insert(last.clone(), o.value.clone());
        }
    }
}

fn locate(rest: &str) -> Option<(Vec<String>, Kind)> {
    if let Some(tail) = rest.strip_prefix("clickhouse_targets_") {
        let (name, key, kind) = split_named(tail, TARGET_KEYS)?;
        return Some((
            vec!["clickhouse".into(), "targets".into(), name, key.into()],
            kind,
        ));
    }
    if let Some(tail) = rest.strip_prefix("tenants_") {
        let (name, key, kind) = split_named(tail, TENANT_KEYS)?;
        return Some((vec!["tenants".into(), name, key.into()], kind));
    }
    if let Some(tail) = rest.strip_prefix("tables_") {
        let (name, key, kind) = split_named(tail, TABLE_KEYS)?;
        let name = name.replacen("__", ".", 1);
        return Some((vec!["tables".into(), name, key.into()], kind));
    }
    for (section, keys) in SECTIONS {
        if let Some(key) = rest.strip_prefix(section).and_then(|r| r.strip_prefix('_')) {
            // A section may be listed more than once (`ingest`): look on.
            if let Some((_, kind)) = keys.iter().find(|(k, _)| *k == key) {
                return Some((vec![(*section).into(), key.into()], *kind));
            }
        }
    }
    None
}

/// `name_key` → (name, key) for a key of `keys`, the longest key that fits.
fn split_named<'k>(tail: &str, keys: &'k [(&'k str, Kind)]) -> Option<(String, &'k str, Kind)> {
    keys.iter()
        .filter_map(|(key, kind)| {
            let name = tail.strip_suffix(key)?.strip_suffix('_')?;
            (!name.is_empty()).then(|| (name.to_string(), *key, *kind))
        })
        .max_by_key(|(_, key, _)| key.len())
}

fn typed(raw: &str, kind: Kind) -> Result<Value, &'static str> {
    let trimmed = raw.trim();
    match kind {
        Kind::Str => Ok(Value::String(raw.to_string())),
        Kind::Int => trimmed
            .replace('_', "")
            .parse::<i64>()
            .map(Value::Integer)
            .map_err(|_| "an integer"),
        Kind::Float => trimmed
            .parse::<f64>()
            .map(Value::Float)
            .map_err(|_| "a number"),
        Kind::Bool => match trimmed.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(Value::Boolean(true)),
            "false" | "0" | "no" | "off" => Ok(Value::Boolean(false)),
            _ => Err("true or false"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn fixed_sections_and_named_tables() {
        let vars = env(&[
            ("SLUICE_NATS_URL", "nats://n:4222"),
            ("SLUICE_NATS_MAX_ACK_PENDING", "500"),
            ("SLUICE_CLICKHOUSE_TARGETS_MAIN_DB_URL", "http://ch:8123"),
            ("SLUICE_CLICKHOUSE_TARGETS_MAIN_DB_PASSWORD_ENV", "PW"),
            ("SLUICE_TENANTS_ACME_TARGET", "main_db"),
            ("SLUICE_TABLES_ACME__EVENTS_DLQ", "false"),
            ("SLUICE_INGEST_BATCH_ROWS", "1_000"),
            ("SLUICE_ADMIN_TOKEN", "secret"),
            ("SLUICE_WHATEVER", "x"),
            ("HOME", "/root"),
        ]);
        let secrets = BTreeSet::from(["SLUICE_ADMIN_TOKEN".to_string()]);
        let (found, errors, warnings) = overrides(&vars, &secrets);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("SLUICE_WHATEVER"));
        let paths: Vec<_> = found
            .iter()
            .map(|o| (o.dotted(), o.value.clone()))
            .collect();
        assert!(paths.contains(&("nats.url".into(), Value::String("nats://n:4222".into()))));
        assert!(paths.contains(&("nats.max_ack_pending".into(), Value::Integer(500))));
        assert!(paths.contains(&(
            "clickhouse.targets.main_db.url".into(),
            Value::String("http://ch:8123".into())
        )));
        assert!(paths.contains(&(
            "clickhouse.targets.main_db.password_env".into(),
            Value::String("PW".into())
        )));
        assert!(paths.contains(&(
            "tenants.acme.target".into(),
            Value::String("main_db".into())
        )));
        assert!(paths.contains(&("tables.acme.events.dlq".into(), Value::Boolean(false))));
        assert!(paths.contains(&("ingest.batch_rows".into(), Value::Integer(1000))));
    }

    #[test]
    fn bad_values_name_the_variable() {
        let vars = env(&[("SLUICE_INGEST_BATCH_ROWS", "many")]);
        let (_, errors, _) = overrides(&vars, &BTreeSet::new());
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].contains("SLUICE_INGEST_BATCH_ROWS"),
            "{}",
            errors[0]
        );
        assert!(errors[0].contains("integer"), "{}", errors[0]);
    }

    #[test]
    fn apply_creates_tables() {
        let mut doc: Table = toml::from_str("[nats]\nurl = \"a\"\n").expect("toml");
        let vars = env(&[
            ("SLUICE_NATS_URL", "b"),
            ("SLUICE_TENANTS_ACME_TARGET", "main"),
        ]);
        let (found, _, _) = overrides(&vars, &BTreeSet::new());
        apply(&mut doc, &found);
        assert_eq!(doc["nats"]["url"].as_str(), Some("b"));
        assert_eq!(doc["tenants"]["acme"]["target"].as_str(), Some("main"));
    }
}
