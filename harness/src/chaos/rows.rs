//! Known rows: every row carries a unique id, and a bad row is known by its id.
//!
//! A good row is `{"id": N, "n": N % 100000, "s": "row-N..."}`; a bad one has
//! `"n": "not-a-number"`, which ClickHouse rejects (a parse error: class Rejected), so
//! a scenario can tell from the ids alone which rows belong on the DLQ.

use std::collections::BTreeSet;
use std::ops::Range;

/// The table every chaos scenario inserts into (ClickHouse 18.16 syntax).
pub fn create_table_sql(table: &str) -> String {
    format!("CREATE TABLE {table} (id UInt64, n UInt32, s String) ENGINE = MergeTree ORDER BY id")
}

/// A set of rows with unique ids, some of them bad.
#[derive(Clone, Debug)]
pub struct RowSet {
    ids: Vec<u64>,
    bad: BTreeSet<u64>,
    /// Extra bytes of padding in `s` (to fill a stream's byte budget quickly).
    pad: usize,
}

// === impl RowSet ===

impl RowSet {
    /// Good rows with the ids of `range`. Give each table of a scenario its own range.
    pub fn good(range: Range<u64>) -> Self {
        Self {
            ids: range.collect(),
            bad: BTreeSet::new(),
            pad: 0,
        }
    }

    /// Makes `count` rows bad, spread evenly through the set (none at the very start
    /// or end, so each one shares its batch with good rows).
    pub fn with_bad_spread(mut self, count: usize) -> Self {
        let n = self.ids.len();
        if count == 0 || n == 0 {
            return self;
        }
        let step = n / (count + 1);
        for k in 1..=count {
            if let Some(id) = self.ids.get((k * step.max(1)).min(n - 1)) {
                self.bad.insert(*id);
            }
        }
        self
    }

    /// Rows with the ids of `range`, every one bad (rows a scenario sends by hand).
    pub fn all_bad(range: Range<u64>) -> Self {
        let ids: Vec<u64> = range.collect();
        Self {
            bad: ids.iter().copied().collect(),
            ids,
            pad: 0,
        }
    }

    /// Pads every row to at least `bytes` bytes.
    pub fn padded(mut self, bytes: usize) -> Self {
        self.pad = bytes;
        self
    }

    pub fn ids(&self) -> &[u64] {
        &self.ids
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The ids of the bad rows.
    pub fn bad(&self) -> &BTreeSet<u64> {
        &self.bad
    }

    pub fn is_bad(&self, id: u64) -> bool {
        self.bad.contains(&id)
    }

    /// The JSON text of row `id`.
    pub fn row(&self, id: u64) -> String {
        let n = if self.is_bad(id) {
            "\"not-a-number\"".to_string()
        } else {
            (id % 100_000).to_string()
        };
        let mut s = format!("row-{id}");
        if s.len() < self.pad {
            s.push_str(&"x".repeat(self.pad - s.len()));
        }
        format!(r#"{{"id":{id},"n":{n},"s":"{s}"}}"#)
    }

    /// The rows of a slice of ids as NDJSON.
    pub fn ndjson(&self, ids: &[u64]) -> String {
        let mut body = String::new();
        for id in ids {
            body.push_str(&self.row(*id));
            body.push('\n');
        }
        body
    }
}

/// The id of a row as a scenario wrote it (`{"id": N, ...}`), from its JSON.
pub fn id_of(row: &serde_json::Value) -> Option<u64> {
    row.get("id").and_then(serde_json::Value::as_u64)
}

/// The id of a row that starts `{"id":N` (every row a scenario writes does), read
/// without parsing the rest: a nesting bomb is too deep for serde_json.
pub fn leading_id(payload: &str) -> Option<u64> {
    let rest = payload.trim_start().strip_prefix("{\"id\":")?;
    let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    rest[..digits].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_rows_are_spread_and_known_by_id() {
        let rows = RowSet::good(0..10_000).with_bad_spread(7);
        assert_eq!(rows.bad().len(), 7);
        assert!(!rows.is_bad(0) && !rows.is_bad(9_999));
        let bad = *rows.bad().iter().next().unwrap_or(&0);
        let value: serde_json::Value = serde_json::from_str(&rows.row(bad)).unwrap_or_default();
        assert_eq!(id_of(&value), Some(bad));
        assert_eq!(value["n"], "not-a-number");
        let good: serde_json::Value = serde_json::from_str(&rows.row(1)).unwrap_or_default();
        assert_eq!(good["n"], 1);
        assert!(RowSet::good(0..1).padded(300).row(0).len() > 300);
    }
}
