//! What `system.tables` says of one table: its engine (whether ClickHouse deduplicates
//! its inserts depends on it), its settings and its materialized views. Read by the
//! insert client (`insert.rs`) and the catalog (`catalog.rs`), judged by `dedup.rs`;
//! a module of its own so that none of those depends on another in a circle.

use serde::Deserialize;

/// What ClickHouse says of one table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct TableInfo {
    pub name: String,
    /// `MergeTree`, `ReplicatedReplacingMergeTree`, `Distributed`...: what the table
    /// does with a repeated insert depends on it.
    pub engine: String,
    /// The engine with its arguments and settings (`engine_full` of `system.tables`,
    /// present since before 18.16), e.g. a replicated table's ZooKeeper path and its
    /// own deduplication window.
    #[serde(default)]
    pub engine_full: String,
    /// The databases of [`Self::dependencies_table`], one each.
    #[serde(default)]
    pub dependencies_database: Vec<String>,
    /// The materialized views that select from this table (18.16 and later): an insert
    /// feeds them too, which matters to whether a retry may be dropped.
    #[serde(default)]
    pub dependencies_table: Vec<String>,
}

/// The columns of `system.tables` a [`TableInfo`] is read from.
pub const TABLE_INFO_COLUMNS: &str =
    "name, engine, engine_full, dependencies_database, dependencies_table";

impl TableInfo {
    /// The materialized views on this table, as `database.view`.
    pub fn views(&self) -> Vec<String> {
        self.dependencies_table
            .iter()
            .enumerate()
            .map(|(i, view)| match self.dependencies_database.get(i) {
                Some(database) => format!("{database}.{view}"),
                None => view.clone(),
            })
            .collect()
    }
}
