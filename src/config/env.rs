//! Environment overrides: every key as `SLUICE_<SECTION>_<KEY>`, which is how a
//! container is configured.
//!
//! `SLUICE_NATS_URL` sets `[nats] url`; `SLUICE_CLICKHOUSE_TARGETS_MAIN_URL` sets
//! `[clickhouse.targets.main] url`; `SLUICE_TENANTS_ACME_TARGET` sets
//! `[tenants.acme] target`; `SLUICE_TABLES_ACME__EVENTS_BATCH_ROWS` sets
//! `[tables."acme.events"] batch_rows` (a double underscore stands for the dot).
//! Names of targets, tenants and tables are taken in lower case. A list (`[clickhouse.
//! targets.main] shards`) is written with `;` between its items:
//! `SLUICE_CLICKHOUSE_TARGETS_MAIN_SHARDS="http://a1:8123,http://a2:8123;http://b1:8123"`.
//! Variables named by a `*_env` key (in the file, or set from the environment) hold
//! secrets: never read as overrides, never warned about.

use std::collections::{BTreeMap, BTreeSet};

use toml::Value;

use super::key::Key;
use super::schema::{self, Segment, ValueKind};

/// What a value must be parsed as; everything else is a string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Str,
    Int,
    Float,
    Bool,
    /// Items separated by `;`.
    List,
}

impl From<ValueKind> for Kind {
    fn from(kind: ValueKind) -> Kind {
        match kind {
            ValueKind::Integer => Kind::Int,
            ValueKind::Float => Kind::Float,
            ValueKind::Bool => Kind::Bool,
            ValueKind::List => Kind::List,
            ValueKind::Text | ValueKind::WithUnit | ValueKind::Choice(_) => Kind::Str,
        }
    }
}

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

/// The overrides among `vars`; for each override whose value is not of its key's type,
/// the key and why; and a warning for each `SLUICE_*` variable that is neither an
/// override nor a secret named by the configuration.
pub fn overrides(
    vars: &BTreeMap<String, String>,
    secrets: &BTreeSet<String>,
) -> (Vec<Override>, Vec<(Key, String)>, Vec<String>) {
    let mut found = Vec::new();
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let secrets = with_secrets_named_here(vars, secrets);
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
                Err(expected) => {
                    let key = Key::from_path(path, false);
                    let text = format!("{var}={raw:?}: {key} expects {expected}");
                    errors.push((key, text));
                }
            },
            None => warnings.push(format!(
                "{var} is set but is no configuration key (see config.toml for the keys); ignored"
            )),
        }
    }
    (found, errors, warnings)
}

/// `secrets` (the variables the file's `*_env` keys name), and the variables the
/// environment's own `*_env` overrides name (`SLUICE_TENANTS_ACME_TOKEN_ENV=ACME_TOKEN`):
/// they hold secrets too, never overrides, whatever their names spell.
fn with_secrets_named_here(
    vars: &BTreeMap<String, String>,
    secrets: &BTreeSet<String>,
) -> BTreeSet<String> {
    let mut all = secrets.clone();
    for (var, named) in vars {
        let Some(rest) = var.strip_prefix("SLUICE_") else {
            continue;
        };
        let names_a_secret = locate(&rest.to_ascii_lowercase())
            .is_some_and(|(path, _)| path.last().is_some_and(|key| key.ends_with("_env")));
        if names_a_secret && !secrets.contains(var) {
            all.insert(named.trim().to_string());
        }
    }
    all
}

/// The key `rest` (a variable's name after `SLUICE_`, in lower case) sets: every key
/// of the schema, a chosen name (`[tenants.<name>]`) matching any non-empty run of the
/// name; where more than one key fits, the longest fixed part wins
/// (`..._MAIN_DB_PASSWORD_ENV` is `password_env` of target `main_db`).
fn locate(rest: &str) -> Option<(Vec<String>, Kind)> {
    schema::keys()
        .iter()
        .filter_map(|spec| {
            let path = match_path(&spec.path, rest)?;
            let fixed: usize = spec
                .path
                .iter()
                .map(|s| match s {
                    Segment::Key(k) => k.len(),
                    Segment::Name => 0,
                })
                .sum();
            Some((path, Kind::from(spec.kind), fixed))
        })
        .max_by_key(|(_, _, fixed)| *fixed)
        .map(|(path, kind, _)| (path, kind))
}

/// The path `rest` spells with these segments (joined by `_`), if it does. Only one
/// chosen name per path is supported (the schema has no more).
fn match_path(segments: &[Segment], rest: &str) -> Option<Vec<String>> {
    let at = segments.iter().position(|s| *s == Segment::Name);
    let fixed = |segs: &[Segment]| -> Vec<&'static str> {
        segs.iter()
            .filter_map(|s| match s {
                Segment::Key(k) => Some(*k),
                Segment::Name => None,
            })
            .collect()
    };
    match at {
        None => {
            let keys = fixed(segments);
            (keys.join("_") == rest).then(|| keys.iter().map(|k| k.to_string()).collect())
        }
        Some(at) => {
            let (before, after) = (fixed(&segments[..at]), fixed(&segments[at + 1..]));
            let mut name = rest;
            if !before.is_empty() {
                name = name.strip_prefix(&before.join("_"))?.strip_prefix('_')?;
            }
            if !after.is_empty() {
                name = name.strip_suffix(&after.join("_"))?.strip_suffix('_')?;
            }
            if name.is_empty() {
                return None;
            }
            // `[tables."tenant.table"]`: a double underscore stands for the dot.
            let name = if before == ["tables"] {
                name.replacen("__", ".", 1)
            } else {
                name.to_string()
            };
            let mut path: Vec<String> = before.iter().map(|k| k.to_string()).collect();
            path.push(name);
            path.extend(after.iter().map(|k| k.to_string()));
            Some(path)
        }
    }
}

fn typed(raw: &str, kind: Kind) -> Result<Value, &'static str> {
    let trimmed = raw.trim();
    match kind {
        Kind::Str => Ok(Value::String(raw.to_string())),
        Kind::List => Ok(Value::Array(
            raw.split(';')
                .map(str::trim)
                .filter(|item| !item.is_empty())
                .map(|item| Value::String(item.to_string()))
                .collect(),
        )),
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
    fn every_key_of_the_schema_can_be_set() {
        // Keys added to file.rs are overridable without a list to update here.
        let (found, errors, warnings) = overrides(
            &env(&[
                ("SLUICE_API_RETRY_AFTER", "9s"),
                ("SLUICE_ADMIN_FAULT_INJECTION", "true"),
                ("SLUICE_QUERY_SERVER_MARGIN", "1s"),
                ("SLUICE_TABLES_ACME__EVENTS_MISSING_TABLE_GRACE", "1m"),
                ("SLUICE_INGEST_EXACTLY_ONCE", "off"),
                (
                    "SLUICE_CLICKHOUSE_TARGETS_MAIN_SHARDS",
                    "http://a1:8123,http://a2:8123; http://b1:8123 ;",
                ),
            ]),
            &BTreeSet::new(),
        );
        assert!(
            errors.is_empty() && warnings.is_empty(),
            "{errors:?} {warnings:?}"
        );
        let paths: Vec<_> = found.iter().map(Override::dotted).collect();
        for want in [
            "api.retry_after",
            "admin.fault_injection",
            "query.server_margin",
            "tables.acme.events.missing_table_grace",
            "ingest.exactly_once",
            "clickhouse.targets.main.shards",
        ] {
            assert!(paths.iter().any(|p| p == want), "{want} not in {paths:?}");
        }
        // A list: `;` between the shards, each shard's replicas as in config.toml.
        let shards = found
            .iter()
            .find(|o| o.dotted() == "clickhouse.targets.main.shards")
            .map(|o| o.value.clone());
        assert_eq!(
            shards,
            Some(Value::Array(vec![
                Value::String("http://a1:8123,http://a2:8123".into()),
                Value::String("http://b1:8123".into()),
            ]))
        );
        // [ingest]'s own key has no per-table override.
        let (_, _, warnings) = overrides(
            &env(&[("SLUICE_TABLES_ACME__EVENTS_EXACTLY_ONCE", "true")]),
            &BTreeSet::new(),
        );
        assert_eq!(warnings.len(), 1, "{warnings:?}");
    }

    /// issue 37.13: a variable that a `*_env` key set from the environment names holds a
    /// secret: it is never flagged as "no configuration key", and never read as an
    /// override even when its name spells one.
    #[test]
    fn a_secret_named_from_the_environment_is_neither_flagged_nor_an_override() {
        let vars = env(&[
            ("SLUICE_TENANTS_ACME_TOKEN_ENV", "SLUICE_TOKEN_ACME"),
            ("SLUICE_TOKEN_ACME", "tok-1"),
            (
                "SLUICE_CLICKHOUSE_TARGETS_MAIN_PASSWORD_ENV",
                "SLUICE_QUERY_USER",
            ),
            ("SLUICE_QUERY_USER", "hunter2"),
        ]);
        let (found, errors, warnings) = overrides(&vars, &BTreeSet::new());
        assert!(errors.is_empty(), "{errors:?}");
        assert!(warnings.is_empty(), "{warnings:?}");
        let paths: Vec<_> = found.iter().map(Override::dotted).collect();
        assert_eq!(
            paths,
            vec![
                "clickhouse.targets.main.password_env",
                "tenants.acme.token_env"
            ],
            "a secret read as an override"
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        let vars = env(&[("SLUICE_INGEST_BATCH_ROWS", "many")]);
        let (_, errors, _) = overrides(&vars, &BTreeSet::new());
        assert_eq!(errors.len(), 1);
        let (key, text) = &errors[0];
        assert_eq!(key.to_string(), "[ingest] batch_rows");
        assert!(text.contains("SLUICE_INGEST_BATCH_ROWS"), "{text}");
        assert!(text.contains("integer"), "{text}");
    }
}
