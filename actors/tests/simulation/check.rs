//! What must hold once the world is healed and settled: every accepted row in
//! ClickHouse, once on a table reported exactly-once (unless its block came back after
//! the table's window forgot it: the precondition, not a hole), at least once
//! elsewhere; every rejected row parked and no row both parked and inserted; nothing
//! left unsettled in the stream; no record left in the bucket.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use crate::world::World;

/// How many problems a failure lists.
const SHOWN: usize = 8;

pub fn check(w: &World, settled: bool) -> Result<(), String> {
    let mut problems: Vec<String> = Vec::new();
    if !settled {
        problems.push(format!(
            "not settled in time: stream holds {:?}, bucket holds {} records",
            w.stream.left(),
            w.kv.records().len()
        ));
    }
    for m in w.kv.records() {
        problems.push(format!(
            "record {} left in the bucket ({:?})",
            m.id, m.state
        ));
    }
    let mut parked: BTreeSet<String> = BTreeSet::new();
    for (seq, line) in w.stream.parked() {
        let Some(p) = w.published.get(&seq) else {
            continue;
        };
        match line {
            Some(line) => parked.extend(p.rows.get(line as usize).map(|r| r.id.clone())),
            None => parked.extend(p.rows.iter().map(|r| r.id.clone())),
        }
    }
    let mut contents = BTreeMap::new();
    for p in w.published.values() {
        let (rows, excused) = contents
            .entry(p.table.clone())
            .or_insert_with(|| w.ch.contents(&p.table));
        let exactly_once = w.ch.kind(&p.table).exactly_once;
        for row in &p.rows {
            let n = rows.get(&row.id).copied().unwrap_or(0);
            let on_dlq = parked.contains(&row.id);
            let problem = if row.bad {
                match (n, on_dlq) {
                    (0, true) => None,
                    (0, false) => Some(format!("rejected row {} never parked", row.id)),
                    _ => Some(format!("rejected row {} inserted {n} times", row.id)),
                }
            } else if on_dlq {
                Some(format!("row {} parked, and inserted {n} times", row.id))
            } else if n == 0 {
                Some(format!("row {} of {} lost", row.id, p.table))
            } else if exactly_once && n > 1 && !excused.contains(&row.id) {
                Some(format!(
                    "row {} inserted {n} times into {}, reported exactly-once",
                    row.id, p.table
                ))
            } else {
                None
            };
            problems.extend(problem);
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    let mut out = format!("{} problems", problems.len());
    for p in problems.iter().take(SHOWN) {
        let _ = write!(out, "; {p}");
    }
    Err(out)
}
