//! Integers out of range for their column, refused before ClickHouse stores another
//! number. ClickHouse's JSON input reads an integer too large for its column and keeps
//! its low bits without a word: `99999999999` into a `UInt32` is stored as
//! `1215752191`, `300` into an `Int8` as `44` (on 18.16 and on 26.9 alike; no input
//! setting of 26.9 refuses it, while `-1` into an unsigned column is refused, code 72).
//! Sluice keeps what it cannot store faithfully out: the table's integer columns (from
//! `system.columns`, refreshed with the table's engine) are checked in every row it
//! sends, and a request holding a row out of range is refused as ClickHouse refuses a
//! bad row (`Rejected`, code 321, `(at row N)`), so the batch is split and that row
//! parked with the reason, its neighbours inserted.
//!
//! Cheap on the rows that cannot be out of range: the table's columns are asked for
//! only when a request holds a run of 3 digits or more, and a row is parsed only when
//! it holds a run of digits as long as the shortest out-of-range number of its table's
//! columns (3 digits for an `Int8`, 10 for a 32-bit type, 19 or 20 for a 64-bit one).

use serde_json::Value;

/// VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE: what ClickHouse calls it where it does refuse.
pub const OUT_OF_RANGE: u32 = 321;

/// The columns `system.columns` of a table is read for.
pub const COLUMNS_SQL: &str = "SELECT name, type FROM system.columns";

/// One integer column: its name, its type as ClickHouse names it, its range.
#[derive(Clone, Debug, PartialEq, Eq)]
struct IntegerColumn {
    name: String,
    type_name: String,
    min: i128,
    max: i128,
}

/// A table's integer columns (8 to 64 bits, also `Nullable` or `LowCardinality`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IntegerColumns {
    columns: Vec<IntegerColumn>,
    /// The fewest digits a number out of range of any of them has.
    min_digits: usize,
}

// === impl IntegerColumns ===

impl IntegerColumns {
    /// From `system.columns`' `name\ttype` lines.
    pub fn from_tsv(text: &str) -> Self {
        let columns: Vec<IntegerColumn> = text
            .lines()
            .filter_map(|line| line.split_once('\t'))
            .filter_map(|(name, type_name)| {
                let (min, max) = range_of(type_name)?;
                Some(IntegerColumn {
                    name: name.to_owned(),
                    type_name: type_name.to_owned(),
                    min,
                    max,
                })
            })
            .collect();
        let min_digits = columns
            .iter()
            .map(|c| digits(c.max))
            .min()
            .unwrap_or(usize::MAX);
        Self {
            columns,
            min_digits,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
    }

    /// The first row of `body` (JSONEachRow) holding an integer out of range for its
    /// column: the reason, in ClickHouse's words for a bad row (`(at row N)`, 1-based).
    pub fn first_out_of_range(&self, body: &[u8]) -> Option<String> {
        if self.columns.is_empty() {
            return None;
        }
        body.split(|b| *b == b'\n')
            .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
            .enumerate()
            .find_map(|(index, line)| {
                let why = self.out_of_range(line)?;
                Some(format!(
                    "Code: {OUT_OF_RANGE}. {why}, which ClickHouse would store as another \
                     number without a word: refused by Sluice before sending (at row {})",
                    index + 1
                ))
            })
    }

    /// Why one row holds an integer out of range, if it does.
    fn out_of_range(&self, line: &[u8]) -> Option<String> {
        if longest_digit_run(line) < self.min_digits {
            return None;
        }
        // A row that is not a JSON object is ClickHouse's to judge.
        let row: serde_json::Map<String, Value> = serde_json::from_slice(line).ok()?;
        self.columns.iter().find_map(|column| {
            let value = row.get(&column.name)?;
            let (text, number) = match value {
                Value::Number(n) => (n.to_string(), integer_of(n)),
                Value::String(s) => (format!("{s:?}"), s.trim().parse::<i128>().ok()),
                _ => return None,
            };
            let out = match number {
                Some(n) => n < column.min || n > column.max,
                // Past ±2^64 as a float: out of range for any column here.
                None => value
                    .as_f64()
                    .is_some_and(|f| f.fract() == 0.0 && f.abs() >= 1.8e19),
            };
            out.then(|| {
                format!(
                    "The value {text} of column {} is out of range for {} ({}..{})",
                    column.name, column.type_name, column.min, column.max
                )
            })
        })
    }
}

/// The fewest digits of a number out of range of any column checked here (an `Int8`'s
/// ±128).
const FEWEST_DIGITS_OUT_OF_RANGE: usize = 3;

/// Whether any row of `body` could hold a number out of range for an integer column:
/// only then are the table's columns asked for (a byte scan; most small rows are not).
pub fn may_be_out_of_range(body: &[u8]) -> bool {
    longest_digit_run(body) >= FEWEST_DIGITS_OUT_OF_RANGE
}

/// An integral JSON number, whatever its size up to 64 bits.
fn integer_of(n: &serde_json::Number) -> Option<i128> {
    n.as_i64()
        .map(i128::from)
        .or_else(|| n.as_u64().map(i128::from))
}

/// The range of an integer type, through `Nullable(…)` and `LowCardinality(…)`.
fn range_of(type_name: &str) -> Option<(i128, i128)> {
    let mut inner = type_name.trim();
    for wrapper in ["LowCardinality(", "Nullable("] {
        if let Some(rest) = inner
            .strip_prefix(wrapper)
            .and_then(|r| r.strip_suffix(')'))
        {
            inner = rest.trim();
        }
    }
    let range = match inner {
        "UInt8" => (0, u8::MAX.into()),
        "UInt16" => (0, u16::MAX.into()),
        "UInt32" => (0, u32::MAX.into()),
        "UInt64" => (0, u64::MAX.into()),
        "Int8" => (i8::MIN.into(), i8::MAX.into()),
        "Int16" => (i16::MIN.into(), i16::MAX.into()),
        "Int32" => (i32::MIN.into(), i32::MAX.into()),
        "Int64" => (i64::MIN.into(), i64::MAX.into()),
        _ => return None,
    };
    Some(range)
}

fn digits(n: i128) -> usize {
    n.unsigned_abs().to_string().len()
}

fn longest_digit_run(line: &[u8]) -> usize {
    let (mut longest, mut run) = (0, 0);
    for b in line {
        if b.is_ascii_digit() {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    longest
}

#[cfg(test)]
mod tests {
    use super::*;

    fn columns() -> IntegerColumns {
        IntegerColumns::from_tsv(
            "id\tUInt64\nn\tUInt32\nsmall\tNullable(Int8)\nname\tString\nlc\tLowCardinality(Nullable(UInt16))\n",
        )
    }

    #[test]
    fn a_number_past_its_columns_range_is_named_with_its_row() {
        let body = b"{\"id\":1,\"n\":2}\n{\"id\":2,\"n\":99999999999}\n";
        let why = columns().first_out_of_range(body).unwrap_or_default();
        assert_eq!(
            why,
            "Code: 321. The value 99999999999 of column n is out of range for UInt32 \
             (0..4294967295), which ClickHouse would store as another number without a \
             word: refused by Sluice before sending (at row 2)"
        );
        for row in [
            "{\"small\":300}",
            "{\"small\":-129}",
            "{\"lc\":65536}",
            "{\"n\":\"4294967296\"}",
            "{\"id\":18446744073709551616}",
        ] {
            assert!(
                columns().first_out_of_range(row.as_bytes()).is_some(),
                "{row}"
            );
        }
    }

    #[test]
    fn numbers_in_range_and_other_values_pass() {
        for row in [
            "{\"id\":18446744073709551615,\"n\":4294967295,\"small\":-128}",
            "{\"name\":\"99999999999999999999\",\"n\":1}",
            "{\"n\":1.5,\"small\":null}",
            "not json 99999999999",
            "",
        ] {
            assert_eq!(columns().first_out_of_range(row.as_bytes()), None, "{row}");
        }
        assert!(IntegerColumns::from_tsv("s\tString\nf\tFloat64\n").is_empty());
        assert!(!may_be_out_of_range(b"{\"id\":12,\"n\":99}\n"));
        assert!(may_be_out_of_range(b"{\"id\":128}\n"));
    }
}
