//! Each table's row totals (received, inserted, parked) read off the metrics recorder,
//! for the admin page's rates and plots.
//!
//! A recorder in front of Prometheus's: every increment of `sluice_rows_received_total`,
//! `sluice_rows_inserted_total` or `sluice_rows_parked_total` (any `reason`) also goes
//! to the table's total here. One count with two readers, so the page's "rows/s" is
//! what `rate()` of the same series says in Prometheus, and the actors count nothing
//! twice. The counter handles are built once per table (`TableMetrics`), so the extra
//! cost is one relaxed atomic add per batch.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{
    Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

use super::metrics::{ROWS_INSERTED, ROWS_PARKED, ROWS_RECEIVED};

/// Which of a table's totals a counter feeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RowCount {
    Received,
    Inserted,
    Parked,
}

impl RowCount {
    fn of(name: &str) -> Option<Self> {
        match name {
            ROWS_RECEIVED => Some(RowCount::Received),
            ROWS_INSERTED => Some(RowCount::Inserted),
            ROWS_PARKED => Some(RowCount::Parked),
            _ => None,
        }
    }
}

/// A table as the row metrics label it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TableName {
    pub tenant: String,
    pub table: String,
}

/// A table's totals since the process started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowTotals {
    pub received: u64,
    pub inserted: u64,
    pub parked: u64,
}

#[derive(Debug, Default)]
struct Totals {
    received: AtomicU64,
    inserted: AtomicU64,
    parked: AtomicU64,
}

impl Totals {
    fn counter(&self, count: RowCount) -> &AtomicU64 {
        match count {
            RowCount::Received => &self.received,
            RowCount::Inserted => &self.inserted,
            RowCount::Parked => &self.parked,
        }
    }

    fn read(&self) -> RowTotals {
        RowTotals {
            received: self.received.load(Ordering::Relaxed),
            inserted: self.inserted.load(Ordering::Relaxed),
            parked: self.parked.load(Ordering::Relaxed),
        }
    }
}

/// Every table's totals. A table is here once one of its row series exists, which is
/// also when Prometheus starts keeping it: this holds no table the recorder does not.
#[derive(Debug, Default)]
pub struct TableRows {
    tables: Mutex<BTreeMap<TableName, Arc<Totals>>>,
}

impl TableRows {
    /// The totals of every table known so far, by name.
    pub fn read(&self) -> Vec<(TableName, RowTotals)> {
        let tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        tables
            .iter()
            .map(|(name, totals)| (name.clone(), totals.read()))
            .collect()
    }

    fn totals(&self, name: TableName) -> Arc<Totals> {
        let mut tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        tables.entry(name).or_default().clone()
    }
}

/// The recorder installed globally: `inner` (Prometheus's) for everything, and the row
/// counters of each table also into [`TableRows`].
pub struct TappedRecorder<R> {
    inner: R,
    rows: Arc<TableRows>,
}

impl<R> TappedRecorder<R> {
    pub fn new(inner: R, rows: Arc<TableRows>) -> Self {
        Self { inner, rows }
    }
}

impl<R: Recorder> Recorder for TappedRecorder<R> {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description)
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description)
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description)
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        let counter = self.inner.register_counter(key, metadata);
        let Some(count) = RowCount::of(key.name()) else {
            return counter;
        };
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_string())
        };
        let (Some(tenant), Some(table)) = (label("tenant"), label("table")) else {
            return counter;
        };
        let totals = self.rows.totals(TableName { tenant, table });
        Counter::from_arc(Arc::new(Tee {
            inner: counter,
            totals,
            count,
        }))
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.inner.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        self.inner.register_histogram(key, metadata)
    }
}

/// A row counter's handle: the Prometheus series and the table's total.
struct Tee {
    inner: Counter,
    totals: Arc<Totals>,
    count: RowCount,
}

impl CounterFn for Tee {
    fn increment(&self, value: u64) {
        self.inner.increment(value);
        if value > 0 {
            self.totals
                .counter(self.count)
                .fetch_add(value, Ordering::Relaxed);
        }
    }

    fn absolute(&self, value: u64) {
        self.inner.absolute(value);
        self.totals
            .counter(self.count)
            .fetch_max(value, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recorder behind the tap in the test: one shared count of every received row,
    /// whatever the labels (what Prometheus would sum).
    #[derive(Default)]
    struct Inner {
        received: Arc<AtomicU64>,
    }

    impl Recorder for Inner {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            if key.name() == ROWS_RECEIVED {
                Counter::from_arc(self.received.clone())
            } else {
                Counter::noop()
            }
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    #[test]
    fn row_counters_of_every_reason_add_up_per_table_and_still_reach_the_inner_recorder() {
        let inner = Inner::default();
        let in_prometheus = inner.received.clone();
        let rows = Arc::new(TableRows::default());
        let recorder = TappedRecorder::new(inner, rows.clone());
        metrics::with_local_recorder(&recorder, || {
            let tt = |name: &'static str, table: &'static str| metrics::counter!(name, "tenant" => "acme", "table" => table);
            tt(ROWS_RECEIVED, "events").increment(5);
            tt(ROWS_INSERTED, "events").increment(3);
            for reason in ["rejected", "missing_table"] {
                metrics::counter!(ROWS_PARKED, "tenant" => "acme", "table" => "events", "reason" => reason)
                    .increment(1);
            }
            // A second handle of the same series adds to the same total.
            tt(ROWS_RECEIVED, "events").increment(2);
            tt(ROWS_RECEIVED, "orders").increment(0);
            // Not a row counter, or without the table: not kept.
            metrics::counter!("sluice_ingest_rows_total", "tenant" => "acme", "table" => "x")
                .increment(9);
            metrics::counter!(ROWS_RECEIVED, "tenant" => "acme").increment(9);
        });
        let name = |table: &str| TableName {
            tenant: "acme".into(),
            table: table.into(),
        };
        assert_eq!(
            rows.read(),
            vec![
                (
                    name("events"),
                    RowTotals {
                        received: 7,
                        inserted: 3,
                        parked: 2
                    }
                ),
                (name("orders"), RowTotals::default()),
            ]
        );
        assert_eq!(in_prometheus.load(Ordering::Relaxed), 7 + 9);
    }
}
