//! The rows: JSON objects of ten columns and about `row_bytes` bytes each, with unique
//! ids, made on the fly (a million rows are never held at once). A bad row carries its
//! id as a string, which ClickHouse rejects for a UInt64 column.

use std::fmt::Write as _;

/// The table every phase inserts into (one table per phase and repetition).
pub fn create_table_sql(table: &str) -> String {
    format!("CREATE TABLE {table} ({COLUMNS}) ENGINE = MergeTree ORDER BY id")
}

/// The columns of the rows [`RowGen`] makes (the `cluster` phase creates its tables
/// with them too).
pub const COLUMNS: &str = "id UInt64, ts DateTime, tenant String, user_id UInt32, \
                           event String, url String, country String, duration_ms UInt32, \
                           session String, note String";

const EVENTS: [&str; 6] = [
    "page_view",
    "click",
    "add_to_cart",
    "checkout",
    "search",
    "signup",
];
const COUNTRIES: [&str; 8] = ["DE", "FR", "US", "JP", "BR", "IN", "GB", "NL"];

/// Makes rows of a given size.
#[derive(Clone, Debug)]
pub struct RowGen {
    pub row_bytes: usize,
}

impl RowGen {
    pub fn new(row_bytes: usize) -> Self {
        Self { row_bytes }
    }

    /// Row `id`; `bad` makes ClickHouse reject it (the id is a string).
    pub fn row(&self, id: u64, bad: bool, out: &mut String) {
        out.clear();
        // A cheap scramble so columns vary without a random generator.
        let h = id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let user = (h >> 40) as u32 % 1_000_000;
        let secs = (h >> 20) % 86_400;
        let _ = write!(out, "{{\"id\":");
        if bad {
            let _ = write!(out, "\"bad-{id}\"");
        } else {
            let _ = write!(out, "{id}");
        }
        let _ = write!(
            out,
            ",\"ts\":\"2026-11-30 {:02}:{:02}:{:02}\",\"tenant\":\"acme\",\"user_id\":{user},\
             \"event\":\"{}\",\"url\":\"/catalog/item/{}\",\"country\":\"{}\",\
             \"duration_ms\":{},\"session\":\"{:016x}\",\"note\":\"",
            secs / 3600,
            (secs / 60) % 60,
            secs % 60,
            EVENTS[(h % EVENTS.len() as u64) as usize],
            h % 100_000,
            COUNTRIES[((h >> 8) % COUNTRIES.len() as u64) as usize],
            (h >> 12) % 60_000,
            h,
        );
        let closing = 2; // "}
        let pad = self.row_bytes.saturating_sub(out.len() + closing);
        for i in 0..pad {
            out.push(char::from(b'a' + ((id as usize + i) % 26) as u8));
        }
        out.push_str("\"}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_have_the_size_asked_and_parse() {
        let gen = RowGen::new(200);
        let mut s = String::new();
        for id in [0, 1, 999_999, 123_456_789] {
            gen.row(id, false, &mut s);
            assert_eq!(s.len(), 200, "{s}");
            let v: serde_json::Value = serde_json::from_str(&s).expect("valid JSON");
            assert_eq!(v["id"], id);
            assert_eq!(v.as_object().map(|o| o.len()), Some(10));
        }
        gen.row(7, true, &mut s);
        let v: serde_json::Value = serde_json::from_str(&s).expect("valid JSON");
        assert_eq!(v["id"], "bad-7");
    }
}
