//! Test tables beside the plain ones: a Replicated twin of a table, so the same rows
//! can go into both and each be counted.
//!
//! On ClickHouse 18.16 only Replicated tables deduplicate inserts: a block of rows
//! inserted again (the same rows, in any order: the hash is taken after the block is
//! sorted) is dropped, within the last `replicated_deduplication_window` blocks of the
//! table. A plain MergeTree keeps every copy.
//!
//! The twins are made with the window of current servers (1000; 18.16 has 100): with a
//! bad row in every batch, isolation inserts a dozen blocks per batch, and 100 blocks
//! are passed within the `ack_wait` a redelivery waits (measured: `two_instances_sigstop`
//! counted one isolated batch twice with 100, never with 1000). A table left at the
//! server's default window ([`create_replicated_like_at_default_window`]) is what Sluice
//! must report as not exactly-once.
//!
//! The current engine (chdb behind the harness's front) cannot hold Replicated tables:
//! there a twin is a `MergeTree` with `non_replicated_deduplication_window` (the
//! same window), which deduplicates inserts the same way on one server, and a twin
//! "at the default window" gets 18.16's 100 blocks (the current default, 0, would not
//! deduplicate at all).

use anyhow::{bail, Context, Result};

use crate::clickhouse::{replicated_merge_tree, ClickHouseFlavor, ClickHouseServer};

/// The window of the twins: 18.16's 100 blocks are passed within a redelivery here.
pub const CURRENT_DEDUPLICATION_WINDOW: u32 = 1000;

/// A twin's window on the current engine when the test wants "the server's default":
/// 18.16's, too short for a redelivery, as there.
const SHORT_NON_REPLICATED_WINDOW: u32 = 100;

/// Creates `table` as a `ReplicatedMergeTree` with the columns, partition key and
/// sorting key of the existing table `like` (in the current database). The server
/// needs a ZooKeeper ([`crate::ClickHouseOptions::replicated`], or
/// [`crate::StackOptions::with_zookeeper`]).
pub async fn create_replicated_like(
    clickhouse: &ClickHouseServer,
    table: &str,
    like: &str,
) -> Result<()> {
    create_replicated(clickhouse, table, like, Some(CURRENT_DEDUPLICATION_WINDOW)).await
}

/// As [`create_replicated_like`], the table left at the server's own
/// `replicated_deduplication_window` (100 on 18.16).
pub async fn create_replicated_like_at_default_window(
    clickhouse: &ClickHouseServer,
    table: &str,
    like: &str,
) -> Result<()> {
    create_replicated(clickhouse, table, like, None).await
}

/// A Replicated copy of `like`, with `window` as its deduplication window, or the
/// server's default.
async fn create_replicated(
    clickhouse: &ClickHouseServer,
    table: &str,
    like: &str,
    window: Option<u32>,
) -> Result<()> {
    for name in [table, like] {
        check_identifier(name)?;
    }
    let current = clickhouse.flavor() == ClickHouseFlavor::Current;
    if clickhouse.replication().is_none() && !current {
        bail!(
            "cannot create the Replicated table {table}: this clickhouse-server has no \
             ZooKeeper (start it with ClickHouseOptions::replicated, or the stack with \
             StackOptions::with_zookeeper)"
        );
    }
    let answer = clickhouse
        .exec(&format!(
            "SELECT database, partition_key, sorting_key FROM system.tables \
             WHERE database = currentDatabase() AND name = '{like}' FORMAT TSV"
        ))
        .await?;
    let Some(line) = answer.lines().next() else {
        bail!("cannot copy {like} into {table}: there is no table {like} in the current database");
    };
    let mut fields = line.split('\t');
    let (Some(database), Some(partition_key), Some(sorting_key)) =
        (fields.next(), fields.next(), fields.next())
    else {
        bail!("system.tables answered {line:?} for {like}: expected three fields");
    };
    let partition_by = if partition_key.is_empty() {
        String::new()
    } else {
        format!(" PARTITION BY ({partition_key})")
    };
    let order_by = if sorting_key.is_empty() {
        "tuple()".to_owned()
    } else {
        format!("({sorting_key})")
    };
    let (engine, settings) = if current {
        let blocks = window.unwrap_or(SHORT_NON_REPLICATED_WINDOW);
        (
            "MergeTree".to_owned(),
            format!(" SETTINGS non_replicated_deduplication_window = {blocks}"),
        )
    } else {
        let settings = window
            .map(|blocks| format!(" SETTINGS replicated_deduplication_window = {blocks}"))
            .unwrap_or_default();
        (replicated_merge_tree(database, table), settings)
    };
    clickhouse
        .exec(&format!(
            "CREATE TABLE {table} AS {like} ENGINE = {engine}{partition_by} ORDER BY {order_by}{settings}"
        ))
        .await
        .with_context(|| format!("creating {table} as a Replicated copy of {like}"))?;
    Ok(())
}

/// A plain identifier (`[A-Za-z_][A-Za-z0-9_]*`): the names are spliced into SQL.
fn check_identifier(name: &str) -> Result<()> {
    let mut chars = name.chars();
    let valid = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        bail!("table name {name:?}: expected letters, digits and `_`, not starting with a digit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_identifiers_are_table_names() {
        for good in ["events", "_t", "events_replicated2"] {
            assert!(check_identifier(good).is_ok(), "{good}");
        }
        for bad in ["", "2events", "events; DROP TABLE x", "a.b", "é"] {
            assert!(check_identifier(bad).is_err(), "{bad:?}");
        }
    }
}
