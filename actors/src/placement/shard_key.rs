//! Which shard a row goes to when its table names a `shard_key` column: a stable hash of
//! the column's value, modulo the target's shards. The same value always goes to the
//! same shard (a `ReplacingMergeTree` merges a key's rows only within a shard, a local
//! join finds them there), and the same message always makes the same parts: a message
//! split again after a crash publishes the very parts it published the first time.
//!
//! Pure: no I/O, no clock. The table sorts its messages by it
//! ([`crate::table::lanes`]); a message whose rows belong to several shards is split
//! into one message per shard ([`crate::ports::Delivery::split`]).
//!
//! The value is read from the row's JSON: a string by its content, `null` or a missing
//! column as the empty string, anything else (a number, an object) by its JSON text as
//! written (`42` and `42.0` are two keys). A line that is not a JSON object goes where
//! the empty string goes: ClickHouse judges it there. The hash is FNV-1a (64 bits),
//! fixed for good: changing it would move keys between shards. It is not ClickHouse's
//! `cityHash64`, so a `Distributed` table over the shards is for reads, not for inserts
//! that must land beside Sluice's (docs/clusters.md).

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::Hasher;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::value::RawValue;

use crate::rows::line_ranges;

/// A table's shard key: the column whose value places a row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardKey {
    column: Arc<str>,
}

/// Where a message's rows go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MessageShards {
    /// Every row to this shard: the message goes whole.
    One(usize),
    /// Rows for several shards: one part per shard (ascending), each its rows in the
    /// message's order, one per line.
    Many(Vec<(usize, Bytes)>),
}

impl ShardKey {
    pub fn new(column: impl Into<Arc<str>>) -> Self {
        Self {
            column: column.into(),
        }
    }

    pub fn column(&self) -> &str {
        &self.column
    }

    /// The shard of one row (a line of a message), of `shards`.
    pub fn shard_of_row(&self, row: &[u8], shards: usize) -> usize {
        if shards <= 1 {
            return 0;
        }
        let mut hasher = fnv::FnvHasher::default();
        match key_value(row, &self.column) {
            Some(value) => hasher.write(&value),
            None => hasher.write(b""),
        }
        // The remainder is below `shards`, a usize.
        (hasher.finish() % shards as u64) as usize
    }

    /// Where the rows of `payload` go, of `shards`.
    pub fn shards_of(&self, payload: &Bytes, shards: usize) -> MessageShards {
        if shards <= 1 {
            return MessageShards::One(0);
        }
        let placed: Vec<(usize, std::ops::Range<usize>)> = line_ranges(payload)
            .map(|r| (self.shard_of_row(&payload[r.clone()], shards), r))
            .collect();
        let first = placed.first().map_or(0, |(s, _)| *s);
        if placed.iter().all(|(s, _)| *s == first) {
            return MessageShards::One(first);
        }
        let mut parts: Vec<(usize, Vec<u8>)> = Vec::new();
        for (shard, range) in placed {
            let at = match parts.binary_search_by_key(&shard, |(s, _)| *s) {
                Ok(at) => at,
                Err(at) => {
                    parts.insert(at, (shard, Vec::new()));
                    at
                }
            };
            let part = &mut parts[at].1;
            part.extend_from_slice(&payload[range]);
            part.push(b'\n');
        }
        MessageShards::Many(
            parts
                .into_iter()
                .map(|(shard, rows)| (shard, Bytes::from(rows)))
                .collect(),
        )
    }
}

/// The bytes the key's value hashes by (see the module's doc); `None`: no value.
fn key_value(row: &[u8], column: &str) -> Option<Vec<u8>> {
    let fields: HashMap<Cow<'_, str>, &RawValue> = serde_json::from_slice(row).ok()?;
    let raw = fields.get(column)?.get();
    if raw.starts_with('"') {
        let text: String = serde_json::from_str(raw).ok()?;
        return Some(text.into_bytes());
    }
    if raw == "null" {
        return None;
    }
    Some(raw.as_bytes().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ShardKey {
        ShardKey::new("user")
    }

    #[test]
    fn the_hash_is_fixed_for_good() {
        // FNV-1a 64 of the value: these must never change (keys would move shards).
        let k = key();
        let of = |row: &str| k.shard_of_row(row.as_bytes(), 1000);
        assert_eq!(
            of(r#"{"user":"alice"}"#),
            (0x508b_2abb_65a0_3907_u64 % 1000) as usize
        );
        assert_eq!(
            of(r#"{"user":""}"#),
            (0xcbf2_9ce4_8422_2325_u64 % 1000) as usize
        );
    }

    #[test]
    fn a_value_places_its_rows_the_same_whatever_else_they_hold() {
        let k = key();
        for shards in 2..6 {
            let a = k.shard_of_row(br#"{"user":"alice","n":1}"#, shards);
            let b = k.shard_of_row(br#"{ "n": 2, "user": "alice", "x": [1,2] }"#, shards);
            let escaped = k.shard_of_row(br#"{"user":"\u0061lice"}"#, shards);
            assert_eq!((a, b, escaped), (a, a, a), "{shards} shards");
        }
    }

    #[test]
    fn null_missing_and_unreadable_rows_go_where_the_empty_string_goes() {
        let k = key();
        let empty = k.shard_of_row(br#"{"user":""}"#, 7);
        for row in [r#"{"user":null}"#, r#"{"n":1}"#, "not json", "[1,2]"] {
            assert_eq!(k.shard_of_row(row.as_bytes(), 7), empty, "{row}");
        }
    }

    #[test]
    fn numbers_are_keys_by_their_json_text() {
        let k = key();
        let shards = 1 << 20;
        assert_eq!(
            k.shard_of_row(br#"{"user":42}"#, shards),
            k.shard_of_row(br#"{"user":"42"}"#, shards),
            "42 and \"42\" hash the same bytes"
        );
        assert_ne!(
            k.shard_of_row(br#"{"user":42}"#, shards),
            k.shard_of_row(br#"{"user":42.0}"#, shards)
        );
    }

    #[test]
    fn one_shard_takes_every_row_whole() {
        let payload = Bytes::from_static(b"{\"user\":\"a\"}\n{\"user\":\"b\"}\n");
        assert_eq!(key().shards_of(&payload, 1), MessageShards::One(0));
    }

    #[test]
    fn a_message_is_split_into_parts_per_shard_in_its_own_order_and_again_the_same() {
        let k = key();
        let shards = 3;
        let rows: Vec<String> = (0..40)
            .map(|i| format!(r#"{{"user":"u{}","n":{i}}}"#, i % 9))
            .collect();
        let payload = Bytes::from(rows.join("\n"));
        let MessageShards::Many(parts) = k.shards_of(&payload, shards) else {
            panic!("40 rows of 9 users on 3 shards should span shards");
        };
        assert_eq!(
            parts,
            match k.shards_of(&payload, shards) {
                MessageShards::Many(again) => again,
                other => panic!("{other:?}"),
            }
        );
        let mut seen = Vec::new();
        for (shard, part) in &parts {
            let text = std::str::from_utf8(part).expect("utf-8");
            let lines: Vec<&str> = text.lines().collect();
            for line in &lines {
                assert_eq!(k.shard_of_row(line.as_bytes(), shards), *shard, "{line}");
            }
            let order: Vec<usize> = lines
                .iter()
                .map(|l| {
                    rows.iter()
                        .position(|r| r == l)
                        .expect("a row of the message")
                })
                .collect();
            assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
            seen.extend(order);
        }
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..40).collect::<Vec<_>>(),
            "every row in exactly one part"
        );
        assert!(parts.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn a_message_of_one_shard_goes_whole() {
        let k = key();
        let payload = Bytes::from_static(b"{\"user\":\"a\",\"n\":1}\n{\"user\":\"a\",\"n\":2}");
        let shard = k.shard_of_row(br#"{"user":"a"}"#, 4);
        assert_eq!(k.shards_of(&payload, 4), MessageShards::One(shard));
    }
}
