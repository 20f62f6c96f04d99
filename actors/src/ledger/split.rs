//! A recorded batch's isolation, as far as it went: what makes isolation resumable and
//! never undone.
//!
//! ClickHouse deduplicates a block it already took: the same rows (18.16: the same
//! bytes; current servers: the same `insert_deduplication_token`). A batch whose
//! isolation inserted its first half as a block of its own must never be sent whole
//! again: the whole batch is another block, and its first half would go in twice. So
//! before any range of a split is sent, the split is recorded; an attempt after an
//! outage, a crash or on another instance sends exactly the recorded untried ranges
//! again (a range already inserted is then deduplicated) and goes on splitting from
//! there.
//!
//! Every row of the batch (by its index in the batch's body) is in exactly one place:
//! an untried range, an inserted range, or rejected alone.

use std::sync::Arc;

use crate::batch::RowVerdict;
use crate::ports::{Class, ClickHouseError};

/// Rows `lo..hi` of a batch, by their index in its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowRange {
    pub lo: u32,
    pub hi: u32,
}

/// A row rejected alone during the isolation, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitRejection {
    pub row: u32,
    pub class: Class,
    pub code: Option<u32>,
    pub error: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    /// Ranges not judged yet, each to be sent as it is; in the order the isolation keeps
    /// them (it takes the last first).
    pub untried: Vec<RowRange>,
    /// Ranges ClickHouse took.
    pub inserted: Vec<RowRange>,
    pub rejected: Vec<SplitRejection>,
}

/// Why a recorded split does not fit the batch formed again (it cannot happen unless a
/// record was damaged: the batch's rows are a function of its messages).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the recorded split does not cover the batch's {rows} rows exactly once")]
pub struct SplitMismatch {
    pub rows: usize,
}

// === impl RowRange ===

impl RowRange {
    pub fn new(lo: usize, hi: usize) -> Self {
        Self {
            lo: lo as u32,
            hi: hi as u32,
        }
    }

    pub fn lo(self) -> usize {
        self.lo as usize
    }

    pub fn hi(self) -> usize {
        self.hi as usize
    }
}

// === impl Split ===

impl Split {
    /// The split as it stands: the judged rows' verdicts, and the ranges not judged yet
    /// (in the order the isolation keeps them). Every row that is not judged must be in
    /// exactly one of `untried`.
    pub fn of_progress(verdicts: &[RowVerdict], untried: Vec<RowRange>) -> Self {
        let mut split = Split {
            untried,
            ..Default::default()
        };
        let mut run: Option<usize> = None;
        for (i, v) in verdicts.iter().enumerate() {
            match v {
                RowVerdict::Inserted => {
                    run.get_or_insert(i);
                    continue;
                }
                RowVerdict::Rejected(e) => split.rejected.push(SplitRejection {
                    row: i as u32,
                    class: e.class,
                    code: e.code,
                    error: e.message.clone(),
                }),
                // Never in a flight's verdicts (only a settlement by record has it).
                RowVerdict::Pending | RowVerdict::AlreadyParked => {}
            }
            if let Some(lo) = run.take() {
                split.inserted.push(RowRange::new(lo, i));
            }
        }
        if let Some(lo) = run {
            split.inserted.push(RowRange::new(lo, verdicts.len()));
        }
        split
    }

    /// Whether the split puts every row of a batch of `rows` rows in exactly one place
    /// (an untried range, an inserted range, or rejected alone): only such a split may
    /// be recorded, or the batch could not be formed again from it.
    pub fn covers(&self, rows: usize) -> bool {
        self.verdicts(rows).is_ok()
    }

    /// Whether `lo..hi` is one of the recorded untried ranges (only those may be sent).
    pub fn may_send(&self, lo: usize, hi: usize) -> bool {
        self.untried.contains(&RowRange::new(lo, hi))
    }

    /// The verdicts the split recorded, for a batch of `rows` rows (untried rows
    /// pending), once it is checked to cover the batch exactly.
    pub fn verdicts(&self, rows: usize) -> Result<Vec<RowVerdict>, SplitMismatch> {
        let mismatch = SplitMismatch { rows };
        let mut verdicts: Vec<Option<RowVerdict>> = vec![None; rows];
        let mut mark = |lo: usize, hi: usize, v: &RowVerdict| -> Result<(), SplitMismatch> {
            if lo >= hi || hi > rows {
                return Err(mismatch.clone());
            }
            for slot in &mut verdicts[lo..hi] {
                if slot.replace(v.clone()).is_some() {
                    return Err(mismatch.clone());
                }
            }
            Ok(())
        };
        for r in &self.untried {
            mark(r.lo(), r.hi(), &RowVerdict::Pending)?;
        }
        for r in &self.inserted {
            mark(r.lo(), r.hi(), &RowVerdict::Inserted)?;
        }
        for r in &self.rejected {
            let reason = Arc::new(ClickHouseError {
                class: r.class,
                code: r.code,
                table_scoped: false,
                splittable: false,
                missing_table: false,
                status: None,
                no_answer: None,
                message: r.error.clone(),
            });
            let row = r.row as usize;
            mark(row, row + 1, &RowVerdict::Rejected(reason))?;
        }
        verdicts
            .into_iter()
            .map(|v| v.ok_or_else(|| mismatch.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected() -> RowVerdict {
        RowVerdict::Rejected(Arc::new(ClickHouseError {
            class: Class::Rejected,
            code: Some(27),
            table_scoped: false,
            splittable: false,
            missing_table: false,
            status: None,
            no_answer: None,
            message: "Cannot parse input".into(),
        }))
    }

    #[test]
    fn progress_without_its_untried_ranges_does_not_cover_the_batch() {
        // An isolation cancelled mid-range (the shutdown deadline) knows its judged
        // rows but not the ranges it held: that progress must not replace the split.
        let verdicts = vec![
            RowVerdict::Inserted,
            RowVerdict::Inserted,
            RowVerdict::Pending,
            RowVerdict::Pending,
        ];
        assert!(!Split::of_progress(&verdicts, Vec::new()).covers(4));
        assert!(Split::of_progress(&verdicts, vec![RowRange::new(2, 4)]).covers(4));
    }

    #[test]
    fn progress_is_recorded_as_ranges_and_read_back_as_the_same_verdicts() {
        use RowVerdict::{Inserted, Pending};
        let verdicts = vec![
            Inserted,
            Inserted,
            rejected(),
            Inserted,
            Pending,
            Pending,
            Pending,
            Inserted,
        ];
        let split = Split::of_progress(&verdicts, vec![RowRange::new(5, 7), RowRange::new(4, 5)]);
        assert_eq!(
            split.inserted,
            vec![
                RowRange::new(0, 2),
                RowRange::new(3, 4),
                RowRange::new(7, 8)
            ]
        );
        assert_eq!(split.rejected.len(), 1);
        assert_eq!(split.rejected[0].row, 2);
        assert_eq!(split.verdicts(8), Ok(verdicts));
        assert!(split.may_send(5, 7));
        assert!(!split.may_send(4, 7), "a range the split never recorded");
        assert!(!split.may_send(0, 8), "never the whole batch again");
    }

    #[test]
    fn a_split_that_does_not_cover_the_batch_exactly_is_refused() {
        let gap = Split {
            untried: vec![RowRange::new(0, 3)],
            ..Default::default()
        };
        assert_eq!(gap.verdicts(4), Err(SplitMismatch { rows: 4 }));
        let overlap = Split {
            untried: vec![RowRange::new(0, 3)],
            inserted: vec![RowRange::new(2, 4)],
            ..Default::default()
        };
        assert!(overlap.verdicts(4).is_err());
        let past = Split {
            untried: vec![RowRange::new(0, 5)],
            ..Default::default()
        };
        assert!(past.verdicts(4).is_err());
    }
}
