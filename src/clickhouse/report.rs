//! What `sluice check-config` says of each ClickHouse target: its tables, whether their
//! inserts are exactly-once and why, with the arithmetic of the window a redelivery
//! needs (docs/operations.md, "Delivery guarantees").

use std::fmt::Write as _;
use std::time::Duration;

use sluice_actors::Dedup;

use super::insert::HttpInserter;
use super::redelivery::Redelivery;
use super::table_info::TableInfo;
use crate::config::{Config, TargetConfig};

/// How long one target may take to answer: `check-config` is run by hand and in
/// deploy scripts, and an unreachable ClickHouse is not a configuration error.
const ASK_WITHIN: Duration = Duration::from_secs(5);

/// Per target, how late a batch can come back, then its tables and whether their
/// inserts are exactly-once; a target that cannot be asked says so (and why) instead.
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
        match runtime.block_on(ask(target, redelivery)) {
            Ok(tables) if tables.is_empty() => {
                let _ = writeln!(out, "    no tables in database {}", target.database);
            }
            Ok(tables) => {
                for (table, dedup) in tables {
                    let mark = if dedup.exactly_once { "yes" } else { "no " };
                    let _ = writeln!(out, "    {mark} {}: {}", table.name, dedup.why);
                }
            }
            Err(e) => {
                let _ = writeln!(
                    out,
                    "    not known (ClickHouse did not answer: {e}); Sluice asks again before each table's first insert"
                );
            }
        }
    }
    out
}

async fn ask(
    target: &TargetConfig,
    redelivery: Redelivery,
) -> Result<Vec<(TableInfo, Dedup)>, String> {
    let inserter = HttpInserter::new(target, redelivery).map_err(|e| e.to_string())?;
    tokio::time::timeout(ASK_WITHIN, inserter.dedup_of_tables())
        .await
        .map_err(|_| format!("no answer within {ASK_WITHIN:?}"))?
}
