//! What `sluice check-config` says of each ClickHouse target: its layout (shards of
//! replicas), its tables, whether each exists on every shard and whether its inserts
//! are exactly-once there and why, with the arithmetic of the window a redelivery
//! needs (docs/operations.md, "Delivery guarantees").

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use sluice_actors::Dedup;

use super::insert::HttpInserter;
use super::redelivery::Redelivery;
use super::shard::{mismatch, ShardReplicas};
use super::table_info::TableInfo;
use crate::config::{Config, TargetConfig};

/// How long one server may take to answer: `check-config` is run by hand and in
/// deploy scripts, and an unreachable ClickHouse is not a configuration error.
const ASK_WITHIN: Duration = Duration::from_secs(5);

/// What one shard said of its tables: through the first of its replicas that answered,
/// or every replica's reason.
type ShardAnswer = Result<Vec<(TableInfo, Dedup)>, String>;

/// Per target, its layout and how late a batch can come back, then its tables and
/// whether their inserts are exactly-once (on every shard); a target or shard that
/// cannot be asked says so (and why) instead.
pub fn exactly_once_report(config: &Config) -> String {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return format!("exactly-once: not asked (cannot start the runtime: {e})\n"),
    };
    let mut out = String::from(
        "exactly-once (ClickHouse deduplicates the table's inserts for longer than a \
         redelivery takes):\n",
    );
    for (name, target) in &config.targets {
        let redelivery = Redelivery::of(config, target);
        let _ = writeln!(
            out,
            "  {name}: a batch retried after a crash comes back up to {} later",
            redelivery.delay_arithmetic()
        );
        if !target.is_single() {
            let _ = writeln!(out, "    {}", target.layout());
        }
        let (servers, answers) = runtime.block_on(ask_every_shard(target, &redelivery));
        for line in servers {
            let _ = writeln!(out, "    server {line}");
        }
        out.push_str(&tables_report(target, &answers));
    }
    out
}

/// The lines of one target's tables, from what each shard answered.
fn tables_report(target: &TargetConfig, answers: &[ShardAnswer]) -> String {
    let mut out = String::new();
    let shards = answers.len();
    let silent: Vec<usize> = (0..shards).filter(|s| answers[*s].is_err()).collect();
    for s in &silent {
        if let Err(e) = &answers[*s] {
            let which = if shards == 1 {
                String::new()
            } else {
                format!("shard {}: ", s + 1)
            };
            let _ = writeln!(
                out,
                "    {which}not known (ClickHouse did not answer: {e}); Sluice asks again before each table's first insert"
            );
        }
    }
    if silent.len() == shards {
        return out;
    }
    // table -> what each shard that answered says of it (None: the shard lacks it).
    let mut tables: BTreeMap<&str, Vec<(usize, Option<&Dedup>)>> = BTreeMap::new();
    for (s, answer) in answers.iter().enumerate() {
        let Ok(list) = answer else { continue };
        for (info, _) in list {
            tables.entry(info.name.as_str()).or_default();
        }
        for (name, seen) in tables.iter_mut() {
            let dedup = list.iter().find(|(t, _)| t.name == *name).map(|(_, d)| d);
            seen.push((s, dedup));
        }
    }
    // A table first met on a later shard has no entry for the earlier ones: they lack it.
    for seen in tables.values_mut() {
        for (s, answer) in answers.iter().enumerate() {
            if answer.is_ok() && !seen.iter().any(|(i, _)| *i == s) {
                seen.push((s, None));
            }
        }
        seen.sort_by_key(|(s, _)| *s);
    }
    if tables.is_empty() {
        let _ = writeln!(out, "    no tables in database {}", target.database);
    }
    for (name, seen) in tables {
        let (mark, why) = table_verdict(&seen, shards, &silent);
        let _ = writeln!(out, "    {mark} {name}: {why}");
    }
    out
}

/// Whether one table is exactly-once on the target (on every shard), and why.
fn table_verdict(
    seen: &[(usize, Option<&Dedup>)],
    shards: usize,
    silent: &[usize],
) -> (&'static str, String) {
    if shards == 1 {
        return match seen.first().and_then(|(_, d)| *d) {
            Some(d) if d.exactly_once => ("yes", d.why.clone()),
            Some(d) => ("no ", d.why.clone()),
            None => ("no ", "the table does not exist".into()),
        };
    }
    let list = |shards: Vec<usize>| {
        shards
            .iter()
            .map(|s| (s + 1).to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let missing: Vec<usize> = seen
        .iter()
        .filter(|(_, d)| d.is_none())
        .map(|(s, _)| *s)
        .collect();
    if !missing.is_empty() {
        return (
            "no ",
            format!(
                "missing on shard {} of {shards} (Sluice writes each shard's local table: create it on every shard)",
                list(missing)
            ),
        );
    }
    let not_once: Vec<String> = seen
        .iter()
        .filter_map(|(s, d)| {
            d.filter(|d| !d.exactly_once)
                .map(|d| format!("shard {}: {}", s + 1, d.why))
        })
        .collect();
    if !not_once.is_empty() {
        return ("no ", not_once.join("; "));
    }
    let why = seen
        .iter()
        .find_map(|(_, d)| *d)
        .map(|d| d.why.clone())
        .unwrap_or_default();
    if silent.is_empty() {
        ("yes", format!("on every shard: {why}"))
    } else {
        (
            "yes",
            format!(
                "on every shard that answered ({} did not): {why}",
                list(silent.to_vec())
            ),
        )
    }
}

/// Every shard's tables, each through the first of its replicas that answers; and
/// each server that answered, named with its version and features.
async fn ask_every_shard(
    target: &TargetConfig,
    redelivery: &Redelivery,
) -> (Vec<String>, Vec<ShardAnswer>) {
    let names = target.replica_names();
    let mut answers = Vec::new();
    let mut servers = Vec::new();
    for (urls, names) in target.shards.iter().zip(names) {
        let mut errors = Vec::new();
        let mut answer = None;
        for (url, name) in urls.iter().zip(names.iter().cloned()) {
            match ask(target, url, &name, redelivery.clone()).await {
                Ok((server, tables)) => {
                    servers.push(format!("{name}: {server}"));
                    answer = Some(tables);
                    break;
                }
                Err(e) if urls.len() == 1 => errors.push(e),
                Err(e) => errors.push(format!("{name}: {e}")),
            }
        }
        let answer = match answer {
            Some(tables) if urls.len() > 1 => {
                Ok(with_replication_checked(target, answers.len(), urls, &names, tables).await)
            }
            Some(tables) => Ok(tables),
            None => Err(errors.join("; ")),
        };
        answers.push(answer);
    }
    (servers, answers)
}

/// A shard's tables (as one of its servers said) with each table its servers do not
/// replicate as one made not exactly-once, with why (see `shard.rs`).
async fn with_replication_checked(
    target: &TargetConfig,
    shard: usize,
    urls: &[String],
    names: &[String],
    tables: Vec<(TableInfo, Dedup)>,
) -> Vec<(TableInfo, Dedup)> {
    let Ok(replicas) = ShardReplicas::new(target, shard, urls, names) else {
        return tables;
    };
    let paths = tokio::time::timeout(ASK_WITHIN, replicas.paths())
        .await
        .unwrap_or_default();
    tables
        .into_iter()
        .map(
            |(info, dedup)| match mismatch(shard + 1, &info.name, &paths) {
                Some(why) => (
                    info,
                    Dedup {
                        exactly_once: false,
                        why,
                        window: dedup.window,
                    },
                ),
                None => (info, dedup),
            },
        )
        .collect()
}

/// One server's tables, and the line naming its version and features.
async fn ask(
    target: &TargetConfig,
    url: &str,
    name: &str,
    redelivery: Redelivery,
) -> Result<(String, Vec<(TableInfo, Dedup)>), String> {
    let inserter = HttpInserter::new(target, url, name, redelivery).map_err(|e| e.to_string())?;
    let tables = tokio::time::timeout(ASK_WITHIN, inserter.dedup_of_tables())
        .await
        .map_err(|_| format!("no answer within {ASK_WITHIN:?}"))??;
    let server = inserter
        .features()
        .await
        .map_err(|e| e.message.clone())?
        .describe();
    Ok((server, tables))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dedup(exactly_once: bool, why: &str) -> Dedup {
        Dedup {
            exactly_once,
            why: why.into(),
            window: None,
        }
    }

    fn table(name: &str) -> TableInfo {
        serde_json::from_value(serde_json::json!({"name": name, "engine": "ReplicatedMergeTree"}))
            .expect("a table info")
    }

    fn cluster() -> TargetConfig {
        let text =
            "[clickhouse.targets.main]\nshards = [\"http://a1:1,http://a2:1\", \"http://b1:1\"]\n";
        crate::config::Config::from_parts("t", text, &Default::default())
            .expect("config")
            .targets["main"]
            .clone()
    }

    #[test]
    fn a_table_is_exactly_once_on_a_cluster_only_on_every_shard() {
        let yes = dedup(true, "Replicated, window covers");
        let no = dedup(false, "MergeTree does not deduplicate");
        let answers = vec![
            Ok(vec![
                (table("events"), yes.clone()),
                (table("clicks"), yes.clone()),
                (table("views"), yes.clone()),
            ]),
            Ok(vec![(table("events"), yes.clone()), (table("views"), no)]),
        ];
        let report = tables_report(&cluster(), &answers);
        for line in [
            "yes events: on every shard: Replicated, window covers",
            "no  clicks: missing on shard 2 of 2",
            "no  views: shard 2: MergeTree does not deduplicate",
        ] {
            assert!(report.contains(line), "{line} in {report}");
        }
        let answers = vec![Ok(vec![(table("events"), yes)]), Err("refused".into())];
        let report = tables_report(&cluster(), &answers);
        for line in [
            "shard 2: not known (ClickHouse did not answer: refused)",
            "yes events: on every shard that answered (2 did not)",
        ] {
            assert!(report.contains(line), "{line} in {report}");
        }
    }
}
