//! `sluice check-config`: validate without starting anything; then, unless `--offline`,
//! ask each ClickHouse target which of its tables deduplicate inserts — the tables
//! whose rows land exactly once (see docs/operations.md, "Delivery guarantees").

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use crate::clickhouse::insert::HttpInserter;
use crate::config::{Config, TargetConfig};

/// How long one target may take to answer: `check-config` is run by hand and in
/// deploy scripts, and an unreachable ClickHouse is not a configuration error.
const ASK_WITHIN: Duration = Duration::from_secs(5);

pub fn run(path: Option<&Path>, offline: bool) -> ExitCode {
    let config = match Config::load(path) {
        Ok(config) => config,
        Err(error) => {
            eprint!("{error}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", config.summary());
    if !offline {
        print!("{}", exactly_once_report(&config));
    }
    println!("ok");
    ExitCode::SUCCESS
}

/// Per target, its tables and whether their inserts are exactly-once; a target that
/// cannot be asked says so (and why) instead.
fn exactly_once_report(config: &Config) -> String {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return format!("exactly-once: not asked (cannot start the runtime: {e})\n"),
    };
    let mut out = String::from("exactly-once (ClickHouse deduplicates inserts):\n");
    for (name, target) in &config.targets {
        let answer = runtime.block_on(ask(target));
        match answer {
            Ok(tables) if tables.is_empty() => {
                let _ = writeln!(out, "  {name}: no tables in database {}", target.database);
            }
            Ok(tables) => {
                let _ = writeln!(out, "  {name}:");
                for (table, exactly_once, why) in tables {
                    let mark = if exactly_once { "yes" } else { "no " };
                    let _ = writeln!(out, "    {mark} {table}: {why}");
                }
            }
            Err(e) => {
                let _ = writeln!(
                    out,
                    "  {name}: not known (ClickHouse did not answer: {e}); Sluice asks again before each table's first insert"
                );
            }
        }
    }
    out
}

async fn ask(target: &TargetConfig) -> Result<Vec<(String, bool, String)>, String> {
    let inserter = HttpInserter::new(target).map_err(|e| e.to_string())?;
    let tables = tokio::time::timeout(ASK_WITHIN, inserter.dedup_of_tables())
        .await
        .map_err(|_| format!("no answer within {ASK_WITHIN:?}"))??;
    Ok(tables
        .into_iter()
        .map(|(t, d)| (t.name, d.exactly_once, d.why))
        .collect())
}
