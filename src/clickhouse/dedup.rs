//! Whether ClickHouse deduplicates a table's inserts — the ground exactly-once stands
//! on: a retry that carries the same rows as an insert ClickHouse already took counts
//! once only where the table keeps the hashes of the blocks it took.
//!
//! - `Replicated*MergeTree`: yes, for the last `replicated_deduplication_window` blocks
//!   (100 on 18.16, 1000 on current servers; a table may set its own, `0` turns it off),
//!   as long as the insert has `insert_deduplicate=1` — which Sluice sends with every
//!   insert of a recorded batch, so a profile that turned it off does not matter.
//! - `*MergeTree`: only with `non_replicated_deduplication_window` > 0 (21.x+, off by
//!   default).
//! - Anything else (`Distributed`, `Buffer`, `Null`, `Log`...): no.
//!
//! Measured on 18.16 (`harness/tests/replicated.rs`): the same rows inserted three times
//! count once in a `ReplicatedMergeTree`, in any order; `engine_full` carries the
//! table's `SETTINGS`; `system.merge_tree_settings` has no
//! `non_replicated_deduplication_window`.

use sluice_actors::Dedup;

use super::catalog::TableInfo;

/// `replicated_deduplication_window` of current servers (ClickHouse#57335; 100 before it, 18.16 too).
const CURRENT_WINDOW: u64 = 1000;

/// The server's defaults for the two windows (`system.merge_tree_settings`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DedupDefaults {
    /// `replicated_deduplication_window`, when the server reported it.
    pub replicated_window: Option<u64>,
    /// `non_replicated_deduplication_window`; `None`: the server has no such setting.
    pub non_replicated_window: Option<u64>,
}

/// What ClickHouse does with a repeated insert into this table.
pub fn dedup_of(table: &TableInfo, defaults: &DedupDefaults) -> Dedup {
    let engine = table.engine.as_str();
    if engine.starts_with("Replicated") && engine.ends_with("MergeTree") {
        let window = setting_in(&table.engine_full, "replicated_deduplication_window")
            .or(defaults.replicated_window);
        return match window {
            Some(0) => no(format!("{engine} with replicated_deduplication_window = 0")),
            Some(n) if n < CURRENT_WINDOW => yes(format!(
                "{engine}: the last {n} inserted blocks (small: a batch retried after more \
                 than {n} blocks, as isolating bad rows makes quickly, counts twice; current \
                 servers keep {CURRENT_WINDOW})"
            )),
            Some(n) => yes(format!("{engine}: the last {n} inserted blocks")),
            None => yes(engine.to_string()),
        };
    }
    if engine.ends_with("MergeTree") {
        let window = setting_in(&table.engine_full, "non_replicated_deduplication_window")
            .or(defaults.non_replicated_window);
        return match window {
            Some(n) if n > 0 => yes(format!(
                "{engine} with non_replicated_deduplication_window = {n}"
            )),
            _ => no(format!(
                "{engine} without non_replicated_deduplication_window (or a Replicated engine)"
            )),
        };
    }
    no(format!("{engine} does not deduplicate inserts"))
}

fn yes(why: String) -> Dedup {
    Dedup {
        exactly_once: true,
        why,
    }
}

fn no(why: String) -> Dedup {
    Dedup {
        exactly_once: false,
        why,
    }
}

/// `name = N` in an `engine_full`'s `SETTINGS` clause.
fn setting_in(engine_full: &str, name: &str) -> Option<u64> {
    let settings = &engine_full[engine_full.find("SETTINGS")? + "SETTINGS".len()..];
    settings.split(',').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key.trim() == name).then(|| value.trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(engine: &str, engine_full: &str) -> TableInfo {
        TableInfo {
            name: "events".into(),
            engine: engine.into(),
            engine_full: engine_full.into(),
        }
    }

    fn defaults_1816() -> DedupDefaults {
        DedupDefaults {
            replicated_window: Some(100),
            non_replicated_window: None,
        }
    }

    #[test]
    fn replicated_tables_deduplicate_unless_their_window_is_zero() {
        let d = dedup_of(
            &table(
                "ReplicatedMergeTree",
                "ReplicatedMergeTree('/clickhouse/tables/{shard}/default/e', '{replica}') ORDER BY id SETTINGS index_granularity = 8192",
            ),
            &defaults_1816(),
        );
        assert!(d.exactly_once, "{d:?}");
        assert!(d.why.contains("100"), "{}", d.why);
        let off = dedup_of(
            &table(
                "ReplicatedReplacingMergeTree",
                "ReplicatedReplacingMergeTree('/p', '{replica}') ORDER BY id SETTINGS replicated_deduplication_window = 0, index_granularity = 8192",
            ),
            &defaults_1816(),
        );
        assert!(!off.exactly_once, "{off:?}");
        let own = dedup_of(
            &table(
                "ReplicatedMergeTree",
                "ReplicatedMergeTree('/p', '{replica}') ORDER BY id SETTINGS index_granularity = 8192, replicated_deduplication_window = 10000",
            ),
            &defaults_1816(),
        );
        assert!(own.exactly_once && own.why.contains("10000"), "{own:?}");
    }

    #[test]
    fn a_plain_merge_tree_deduplicates_only_with_its_own_window() {
        let plain = table(
            "MergeTree",
            "MergeTree ORDER BY id SETTINGS index_granularity = 8192",
        );
        assert!(!dedup_of(&plain, &defaults_1816()).exactly_once);
        let current = DedupDefaults {
            replicated_window: Some(1000),
            non_replicated_window: Some(0),
        };
        assert!(!dedup_of(&plain, &current).exactly_once);
        let windowed = table(
            "MergeTree",
            "MergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 100, index_granularity = 8192",
        );
        assert!(dedup_of(&windowed, &current).exactly_once);
    }

    #[test]
    fn other_engines_do_not() {
        for engine in ["Distributed", "Buffer", "Null", "Log", "Memory", "View"] {
            let d = dedup_of(&table(engine, engine), &defaults_1816());
            assert!(!d.exactly_once, "{engine}");
            assert!(d.why.contains(engine));
        }
    }
}
