//! Whether a table is exactly-once — the ground it stands on: a retry that carries the
//! same rows as an insert ClickHouse already took counts once only where the table
//! keeps the hashes of the blocks it took, still keeps them when the retry comes, and
//! nothing else the insert feeds loses rows when a retry is dropped.
//!
//! - `Replicated*MergeTree`: keeps the hashes of its last `replicated_deduplication_window`
//!   blocks (100 on 18.16, 1,000 from late 2023 (ClickHouse#57335), 10,000 since 25.9;
//!   `0` turns it off), none
//!   older than `replicated_deduplication_window_seconds` (7 days until 25.9, one hour
//!   since 25.10), as long as the insert deduplicates: Sluice sends
//!   `insert_deduplicate=1` (and `deduplicate_insert='enable'` on 26.2+, where it
//!   overrides the other) with every insert of a recorded batch, so a profile that
//!   turned it off does not matter.
//! - `*MergeTree`: only with `non_replicated_deduplication_window` > 0 (21.x+, 0 by
//!   default to this day; blocks only, no limit in time).
//! - Anything else (`Distributed`, `Buffer`, `Null`, `Log`...): no.
//!
//! A window is then held against the redelivery it must cover ([`Need`]): one that
//! forgets a block before a crashed batch can come back is not exactly-once. And a
//! table with materialized views on a server that skips the views of a dropped retry
//! (18.16) is not either: a view that failed on the first try would never get those
//! rows, where inserting at least once gives every view every row.
//!
//! Measured on 18.16 (`harness/tests/replicated.rs`): the same rows inserted three times
//! count once in a `ReplicatedMergeTree`, in any order; `engine_full` carries the
//! table's `SETTINGS`; `system.merge_tree_settings` has
//! `replicated_deduplication_window_seconds` (604800) but no
//! `non_replicated_deduplication_window`; `system.tables` lists a table's materialized
//! views in `dependencies_database`/`dependencies_table`; a retry dropped as a duplicate
//! skips them.

use std::time::Duration;

use sluice_actors::{Dedup, DedupWindow};

use super::redelivery::{human, Coverage, Need};
use super::table_info::TableInfo;

/// What the server does with repeated inserts, whatever the table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerDedup {
    /// `replicated_deduplication_window`, when the server reported it.
    pub replicated_window: Option<u64>,
    /// `replicated_deduplication_window_seconds`, when the server reported it.
    pub replicated_window_seconds: Option<u64>,
    /// `non_replicated_deduplication_window`; `None`: the server has no such setting.
    pub non_replicated_window: Option<u64>,
    /// The server knows `deduplicate_blocks_in_dependent_materialized_views`, which Sluice
    /// sends with every recorded batch: a dropped retry still reaches the table's views.
    /// Without it (18.16), a retry dropped as a duplicate skips them.
    pub views_see_retries: bool,
}

/// The ClickHouse setting that sizes a window, for the advice in a reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WindowKind {
    Replicated,
    NonReplicated,
}

impl WindowKind {
    fn setting(self) -> &'static str {
        match self {
            WindowKind::Replicated => "replicated_deduplication_window",
            WindowKind::NonReplicated => "non_replicated_deduplication_window",
        }
    }
}

/// Whether `table` is exactly-once given the server's defaults and what a window must
/// cover for it.
pub fn dedup_of(table: &TableInfo, server: &ServerDedup, need: &Need) -> Dedup {
    let engine = table.engine.as_str();
    let (kind, window) = match window_of(table, server) {
        Ok(found) => found,
        Err(why) => {
            return Dedup {
                exactly_once: false,
                why,
                window: None,
            }
        }
    };
    let kept = kept(engine, kind, window);
    let verdict = |exactly_once: bool, why: String| Dedup {
        exactly_once,
        why,
        window: Some(window),
    };
    let (room, rows_per_sec) = match need.covered_by(window) {
        Coverage::Covers {
            room,
            full_batch_rows_per_sec,
        } => (room, full_batch_rows_per_sec),
        Coverage::Short {
            too_few_blocks,
            forgets_after,
        } => {
            return verdict(
                false,
                short(&kept, kind, need, too_few_blocks, forgets_after),
            )
        }
    };
    let covered = format!(
        "{kept}, and one instance may insert {need} before a batch retried after a crash \
         comes back: room for {room} times that (instances, partitions per batch and other \
         writers each add theirs), or {rows_per_sec} rows/s in full batches"
    );
    let views = table.views();
    if views.is_empty() {
        return verdict(true, covered);
    }
    let views = views.join(", ");
    if server.views_see_retries {
        return verdict(
            true,
            format!(
                "{covered}. Its materialized views ({views}) get a retried block again \
                 (Sluice sends deduplicate_blocks_in_dependent_materialized_views=1) and drop \
                 it only where their own table deduplicates; a view that throws on a row fails \
                 the insert after this table took it, so isolating that row inserts this \
                 table's rows again"
            ),
        );
    }
    verdict(
        false,
        format!(
            "{engine} has materialized views ({views}): this server skips a table's views \
             when it drops a retried block as a duplicate, so rows a view failed to take on \
             the first try would never reach it. Sluice inserts this table at least once, \
             so every view gets every row (some twice)"
        ),
    )
}

/// Why a window that may forget a block before its retry comes is not exactly-once,
/// and what to set.
fn short(
    kept: &str,
    kind: WindowKind,
    need: &Need,
    too_few_blocks: bool,
    forgets_after: Option<Duration>,
) -> String {
    let mut problems = Vec::new();
    let mut advice = Vec::new();
    if too_few_blocks {
        problems.push(format!(
            "one instance may insert {need} before a batch retried after a crash comes back"
        ));
        advice.push(format!(
            "{} to at least {} for each instance writing it",
            kind.setting(),
            need.blocks()
        ));
    }
    if let Some(seconds) = forgets_after {
        problems.push(format!(
            "it forgets a block after {}, before a batch retried after a crash may come back \
             ({})",
            human(seconds),
            human(need.delay)
        ));
        advice.push(format!(
            "replicated_deduplication_window_seconds to at least {}",
            need.delay.as_secs_f64().ceil() as u64
        ));
    }
    let how = match kind {
        WindowKind::Replicated => HOW_TO_SET_REPLICATED,
        WindowKind::NonReplicated => " (ALTER TABLE … MODIFY SETTING)",
    };
    format!(
        "{kept}, and {}: a retried batch could count twice, so Sluice inserts this table at \
         least once. Set {}{how}",
        problems.join(", and "),
        advice.join(" and ")
    )
}

/// The table's window, or why it has none.
fn window_of(table: &TableInfo, server: &ServerDedup) -> Result<(WindowKind, DedupWindow), String> {
    let engine = table.engine.as_str();
    let own = |name: &str| setting_in(&table.engine_full, name);
    if engine.starts_with("Replicated") && engine.ends_with("MergeTree") {
        let blocks = own("replicated_deduplication_window").or(server.replicated_window);
        let seconds =
            own("replicated_deduplication_window_seconds").or(server.replicated_window_seconds);
        return match blocks {
            None => Err(format!(
                "{engine}, but the server did not say its replicated_deduplication_window"
            )),
            Some(0) => Err(format!(
                "{engine} with replicated_deduplication_window = 0 does not deduplicate inserts"
            )),
            Some(blocks) => Ok((
                WindowKind::Replicated,
                DedupWindow {
                    blocks,
                    seconds: seconds.map(Duration::from_secs),
                },
            )),
        };
    }
    if engine.ends_with("MergeTree") {
        return match own("non_replicated_deduplication_window").or(server.non_replicated_window) {
            Some(blocks) if blocks > 0 => Ok((
                WindowKind::NonReplicated,
                DedupWindow {
                    blocks,
                    seconds: None,
                },
            )),
            _ => Err(format!(
                "{engine} without non_replicated_deduplication_window does not deduplicate \
                 inserts (a Replicated engine, or that setting, would)"
            )),
        };
    }
    Err(format!("{engine} does not deduplicate inserts"))
}

/// `ReplicatedMergeTree keeps the hashes of its last 10000 blocks for 1h`.
fn kept(engine: &str, kind: WindowKind, window: DedupWindow) -> String {
    let setting = kind.setting();
    match window.seconds {
        Some(seconds) => format!(
            "{engine} keeps the hashes of its last {} blocks ({setting}) for {}",
            window.blocks,
            human(seconds)
        ),
        None => format!(
            "{engine} keeps the hashes of its last {} blocks ({setting})",
            window.blocks
        ),
    }
}

/// Where a replicated window is set: `ALTER TABLE … MODIFY SETTING` came after 18.16.
const HOW_TO_SET_REPLICATED: &str = " (ALTER TABLE … MODIFY SETTING where the server has it; \
     on 18.16, the table's SETTINGS when it is created, or <merge_tree> in the server's config)";

/// `name = N` in an `engine_full`'s `SETTINGS` clause (the last part of it: a ZooKeeper
/// path before it may hold anything).
fn setting_in(engine_full: &str, name: &str) -> Option<u64> {
    let settings = &engine_full[engine_full.rfind(" SETTINGS ")? + " SETTINGS ".len()..];
    settings.split(',').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key.trim() == name).then(|| value.trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clickhouse::redelivery::{Pace, Paces, Redelivery};

    fn table(engine: &str, engine_full: &str) -> TableInfo {
        TableInfo {
            name: "events".into(),
            engine: engine.into(),
            engine_full: engine_full.into(),
            ..TableInfo::default()
        }
    }

    fn server_1816() -> ServerDedup {
        ServerDedup {
            replicated_window: Some(100),
            replicated_window_seconds: Some(604_800),
            non_replicated_window: None,
            views_see_retries: false,
        }
    }

    /// 26.9's defaults (chdb-core 26.9.0: `harness/tests/clickhouse_current.rs`).
    fn current_server() -> ServerDedup {
        ServerDedup {
            replicated_window: Some(10_000),
            replicated_window_seconds: Some(3600),
            non_replicated_window: Some(0),
            views_see_retries: true,
        }
    }

    /// Sluice's defaults: 135 blocks in 2m 1s.
    fn need() -> Need {
        Redelivery {
            ack_wait: Duration::from_secs(60),
            reform_wait: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
            insert_timeout: Duration::from_secs(30),
            paces: Paces::uniform(Pace {
                batch_age: Duration::from_secs(1),
                batch_rows: 10_000,
            }),
        }
        .need("acme", "events")
    }

    /// What Sluice makes of a `ReplicatedMergeTree` with `settings`, at its defaults.
    /// `verdict`'s reason says each of `parts`.
    fn says(verdict: &Dedup, parts: &[&str]) {
        for part in parts {
            assert!(
                verdict.why.contains(part),
                "{part:?} not in {}",
                verdict.why
            );
        }
    }

    fn replicated_with(settings: &str, server: &ServerDedup) -> Dedup {
        let full =
            format!("ReplicatedMergeTree('/p', '{{replica}}') ORDER BY id SETTINGS {settings}");
        dedup_of(&table("ReplicatedMergeTree", &full), server, &need())
    }

    const REPLICATED: &str = "ReplicatedMergeTree('/clickhouse/tables/{shard}/default/e', '{replica}') ORDER BY id SETTINGS index_granularity = 8192";

    #[test]
    fn a_replicated_table_at_the_window_of_18_16_is_not_exactly_once_and_the_reason_says_what_to_set(
    ) {
        let d = dedup_of(
            &table("ReplicatedMergeTree", REPLICATED),
            &server_1816(),
            &need(),
        );
        assert!(!d.exactly_once, "{d:?}");
        assert_eq!(
            d.window,
            Some(DedupWindow {
                blocks: 100,
                seconds: Some(Duration::from_secs(604_800))
            })
        );
        for part in [
            "keeps the hashes of its last 100 blocks (replicated_deduplication_window) for 7days, \
             and one instance may insert 135 blocks (121 batches in 2m 1s, one per batch_age 1s, \
             + 14 isolating a bad row among batch_rows 10000) before a batch retried after a \
             crash comes back",
            "Sluice inserts this table at least once",
            "Set replicated_deduplication_window to at least 135 for each instance",
            "<merge_tree>",
        ] {
            assert!(d.why.contains(part), "{part:?} not in {}", d.why);
        }
    }

    #[test]
    fn a_window_of_its_own_or_the_current_default_covers_a_redelivery() {
        let own = replicated_with(
            "index_granularity = 8192, replicated_deduplication_window = 10000",
            &server_1816(),
        );
        assert!(own.exactly_once, "{own:?}");
        assert_eq!(own.window.map(|w| w.blocks), Some(10_000));
        assert!(own.why.contains("room for 74 times that"), "{}", own.why);

        let current = dedup_of(
            &table("ReplicatedMergeTree", REPLICATED),
            &current_server(),
            &need(),
        );
        assert!(current.exactly_once, "{current:?}");
        says(
            &current,
            &[
                "last 10000 blocks (replicated_deduplication_window) for 1h",
                "room for 74 times",
            ],
        );
    }

    #[test]
    fn a_window_shorter_than_the_delay_is_not_exactly_once() {
        let short = replicated_with(
            "replicated_deduplication_window = 1000, replicated_deduplication_window_seconds = 60, index_granularity = 8192",
            &server_1816(),
        );
        assert!(!short.exactly_once, "{short:?}");
        assert_eq!(
            short.window.and_then(|w| w.seconds),
            Some(Duration::from_secs(60))
        );
        says(
            &short,
            &[
                "it forgets a block after 1m, before a batch retried after a crash may come back (2m 1s)",
                "Set replicated_deduplication_window_seconds to at least 121",
            ],
        );
        let both = replicated_with(
            "replicated_deduplication_window = 5, replicated_deduplication_window_seconds = 30",
            &server_1816(),
        );
        assert!(!both.exactly_once, "{both:?}");
        says(&both, &["Set replicated_deduplication_window to at least 135 for each instance writing it and replicated_deduplication_window_seconds to at least 121"]);
    }

    #[test]
    fn a_window_of_zero_turns_deduplication_off() {
        let off = dedup_of(
            &table(
                "ReplicatedReplacingMergeTree",
                "ReplicatedReplacingMergeTree('/p', '{replica}') ORDER BY id SETTINGS replicated_deduplication_window = 0, index_granularity = 8192",
            ),
            &current_server(),
            &need(),
        );
        assert!(!off.exactly_once && off.window.is_none(), "{off:?}");
        assert!(off.why.contains("= 0"), "{}", off.why);
    }

    #[test]
    fn a_plain_merge_tree_deduplicates_only_with_its_own_window() {
        let plain = table(
            "MergeTree",
            "MergeTree ORDER BY id SETTINGS index_granularity = 8192",
        );
        assert!(!dedup_of(&plain, &server_1816(), &need()).exactly_once);
        assert!(!dedup_of(&plain, &current_server(), &need()).exactly_once);
        let windowed = table(
            "MergeTree",
            "MergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 1000, index_granularity = 8192",
        );
        let d = dedup_of(&windowed, &current_server(), &need());
        assert!(d.exactly_once, "{d:?}");
        assert_eq!(
            d.window,
            Some(DedupWindow {
                blocks: 1000,
                seconds: None
            })
        );
        let small = table(
            "MergeTree",
            "MergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 100",
        );
        let d = dedup_of(&small, &current_server(), &need());
        assert!(!d.exactly_once, "{d:?}");
        assert!(
            d.why
                .contains("Set non_replicated_deduplication_window to at least 135"),
            "{}",
            d.why
        );
    }

    #[test]
    fn other_engines_do_not() {
        for engine in ["Distributed", "Buffer", "Null", "Log", "Memory", "View"] {
            let d = dedup_of(&table(engine, engine), &server_1816(), &need());
            assert!(!d.exactly_once && d.window.is_none(), "{engine}");
            assert!(d.why.contains(engine));
        }
    }

    #[test]
    fn materialized_views_make_a_table_at_least_once_where_a_dropped_retry_skips_them() {
        let mut with_views = table(
            "ReplicatedMergeTree",
            "ReplicatedMergeTree('/p', '{replica}') ORDER BY id SETTINGS replicated_deduplication_window = 1000",
        );
        with_views.dependencies_database = vec!["default".into(), "stats".into()];
        with_views.dependencies_table = vec!["per_minute".into(), "per_user".into()];

        let old = dedup_of(&with_views, &server_1816(), &need());
        assert!(!old.exactly_once, "{old:?}");
        assert!(
            old.why
                .contains("materialized views (default.per_minute, stats.per_user)")
                && old.why.contains("skips a table's views"),
            "{}",
            old.why
        );
        // The window is still given: the table deduplicates, Sluice just does not
        // count on it.
        assert_eq!(old.window.map(|w| w.blocks), Some(1000));

        let current = dedup_of(&with_views, &current_server(), &need());
        assert!(current.exactly_once, "{current:?}");
        assert!(
            current
                .why
                .contains("deduplicate_blocks_in_dependent_materialized_views=1")
                && current.why.contains("a view that throws on a row"),
            "{}",
            current.why
        );
    }

    #[test]
    fn settings_are_read_from_the_settings_clause_only() {
        let full = "ReplicatedMergeTree('/clickhouse/tables/SETTINGS replicated_deduplication_window = 5/p', '{replica}') ORDER BY id SETTINGS index_granularity = 8192, replicated_deduplication_window_seconds = 30";
        assert_eq!(setting_in(full, "replicated_deduplication_window"), None);
        assert_eq!(
            setting_in(full, "replicated_deduplication_window_seconds"),
            Some(30)
        );
        assert_eq!(
            setting_in("MergeTree ORDER BY id", "index_granularity"),
            None
        );
    }
}
