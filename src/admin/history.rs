//! The last ten minutes of each table's row rates (received, inserted, parked), kept in
//! the process for the admin page: a ring of samples of the row totals
//! (`telemetry::table_rows`) taken every [`PERIOD`]. No outside time-series store, and
//! bounded: [`SAMPLES`] samples of at most [`MAX_TABLES`] tables (about 3 KiB a table).
//!
//! [`History`] is plain data with the time passed in; [`spawn_sampler`] is the one loop
//! that feeds it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::time::{Instant, MissedTickBehavior};

use crate::telemetry::table_rows::{RowTotals, TableName, TableRows};

/// How often the totals are sampled: the plots' resolution.
pub const PERIOD: Duration = Duration::from_secs(5);
/// How far back the plots go.
pub const WINDOW: Duration = Duration::from_secs(600);
/// Samples kept: a window's worth of intervals needs one more sample than intervals.
pub const SAMPLES: usize = (WINDOW.as_secs() / PERIOD.as_secs()) as usize + 1;
/// Tables plotted at most; more are counted in `untracked_tables`, never kept.
pub const MAX_TABLES: usize = 500;
/// The span of the headline figure ("N rows/s").
const RECENT: Duration = Duration::from_secs(60);

/// The samples: when each was taken, and each table's totals at those times.
#[derive(Debug)]
pub struct History {
    capacity: usize,
    max_tables: usize,
    /// When each sample was taken, oldest first.
    times: VecDeque<Instant>,
    /// Each table's totals at the newest `len()` of `times` (a table first seen later
    /// has fewer samples: its ring is aligned with the end of `times`).
    tables: BTreeMap<TableName, VecDeque<RowTotals>>,
    /// Tables seen in the last sample but not kept, `max_tables` being kept already.
    untracked: usize,
}

/// Rows per second of one table over some span.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Rates {
    pub received: f64,
    pub inserted: f64,
    pub parked: f64,
}

/// One table's plot: a point per sample interval, oldest first, each the rate over
/// that interval. `ago_s[i]` is how long before the view the interval ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Series {
    pub ago_s: Vec<f64>,
    pub received: Vec<f64>,
    pub inserted: Vec<f64>,
    pub parked: Vec<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TableRates {
    pub tenant: String,
    pub table: String,
    /// Over the last minute (or the samples there are, when the table is newer);
    /// `None` until two samples were taken.
    pub last_minute: Option<Rates>,
    /// Rows counted since Sluice started.
    pub received_total: u64,
    pub inserted_total: u64,
    pub parked_total: u64,
    pub series: Series,
}

/// `GET /admin/rates`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RatesView {
    pub period_s: u64,
    pub window_s: u64,
    /// Tables not plotted because [`MAX_TABLES`] are.
    pub untracked_tables: usize,
    pub tables: Vec<TableRates>,
}

// === impl History ===

impl History {
    pub fn new(capacity: usize, max_tables: usize) -> Self {
        Self {
            capacity: capacity.max(2),
            max_tables,
            times: VecDeque::with_capacity(capacity),
            tables: BTreeMap::new(),
            untracked: 0,
        }
    }

    /// One sample: every table's totals at `at`. A kept table missing from `totals`
    /// keeps its last totals (counters never go away while the process runs).
    pub fn record(&mut self, at: Instant, totals: Vec<(TableName, RowTotals)>) {
        if self.times.len() == self.capacity {
            self.times.pop_front();
        }
        self.times.push_back(at);
        let mut fresh: BTreeMap<TableName, RowTotals> = totals.into_iter().collect();
        for (name, ring) in &mut self.tables {
            let now = fresh
                .remove(name)
                .or_else(|| ring.back().copied())
                .unwrap_or_default();
            if ring.len() == self.capacity {
                ring.pop_front();
            }
            ring.push_back(now);
        }
        self.untracked = 0;
        // A table new since the last sample had no rows then: its counters are
        // registered at 0 when it first appears, after that sample. Starting its ring
        // there counts the rows it got in between.
        let had_a_sample = self.times.len() > 1;
        for (name, now) in fresh {
            if self.tables.len() < self.max_tables {
                let mut ring = VecDeque::with_capacity(self.capacity);
                if had_a_sample {
                    ring.push_back(RowTotals::default());
                }
                ring.push_back(now);
                self.tables.insert(name, ring);
            } else {
                self.untracked += 1;
            }
        }
    }

    /// The rates as of `now`.
    pub fn view(&self, now: Instant) -> RatesView {
        let tables = self
            .tables
            .iter()
            .map(|(name, ring)| self.table_rates(name, ring, now))
            .collect();
        RatesView {
            period_s: PERIOD.as_secs(),
            window_s: WINDOW.as_secs(),
            untracked_tables: self.untracked,
            tables,
        }
    }

    fn table_rates(
        &self,
        name: &TableName,
        ring: &VecDeque<RowTotals>,
        now: Instant,
    ) -> TableRates {
        // The table's samples with their times: the newest `ring.len()` of `times`.
        let times = self.times.iter().skip(self.times.len() - ring.len());
        let samples: Vec<(Instant, RowTotals)> = times.copied().zip(ring.iter().copied()).collect();
        let mut series = Series::default();
        for pair in samples.windows(2) {
            let [(from, before), (to, after)] = pair else {
                continue;
            };
            let rates = rates_between(*before, *after, to.saturating_duration_since(*from));
            series
                .ago_s
                .push(now.saturating_duration_since(*to).as_secs_f64());
            series.received.push(rates.received);
            series.inserted.push(rates.inserted);
            series.parked.push(rates.parked);
        }
        let latest = samples.last().copied();
        let last_minute = latest.and_then(|(at, totals)| {
            // The newest sample at least a minute older than the latest, else the oldest.
            let (since, base) = samples
                .iter()
                .rev()
                .find(|(t, _)| at.saturating_duration_since(*t) >= RECENT)
                .or(samples.first())
                .copied()?;
            let span = at.saturating_duration_since(since);
            (!span.is_zero()).then(|| rates_between(base, totals, span))
        });
        let totals = latest.map(|(_, t)| t).unwrap_or_default();
        TableRates {
            tenant: name.tenant.clone(),
            table: name.table.clone(),
            last_minute,
            received_total: totals.received,
            inserted_total: totals.inserted,
            parked_total: totals.parked,
            series,
        }
    }
}

fn rates_between(before: RowTotals, after: RowTotals, span: Duration) -> Rates {
    let secs = span.as_secs_f64();
    if secs <= 0.0 {
        return Rates::default();
    }
    let per_s = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
    Rates {
        received: per_s(before.received, after.received),
        inserted: per_s(before.inserted, after.inserted),
        parked: per_s(before.parked, after.parked),
    }
}

/// The history the admin endpoint reads, fed by [`spawn_sampler`].
#[derive(Debug)]
pub struct SharedHistory {
    history: Mutex<History>,
}

impl SharedHistory {
    pub fn new(history: History) -> Arc<Self> {
        Arc::new(Self {
            history: Mutex::new(history),
        })
    }

    pub fn view(&self) -> RatesView {
        self.lock().view(Instant::now())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Samples `read` into `history` every [`PERIOD`] until the runtime stops; a tick the
/// runtime was too busy for is taken late (each sample carries its own time, so the
/// rates stay right), never twice at once.
pub fn spawn_sampler<F>(history: Arc<SharedHistory>, read: F) -> tokio::task::JoinHandle<()>
where
    F: Fn() -> Vec<(TableName, RowTotals)> + Send + 'static,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PERIOD);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let totals = read();
            history.lock().record(Instant::now(), totals);
        }
    })
}

/// The sampler of the process's row totals.
pub fn sample_table_rows(rows: Arc<TableRows>) -> Arc<SharedHistory> {
    let history = SharedHistory::new(History::new(SAMPLES, MAX_TABLES));
    spawn_sampler(history.clone(), move || rows.read());
    history
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    fn name(table: &str) -> TableName {
        TableName {
            tenant: "acme".into(),
            table: table.into(),
        }
    }

    fn totals(received: u64, inserted: u64, parked: u64) -> RowTotals {
        RowTotals {
            received,
            inserted,
            parked,
        }
    }

    /// The history of `acme.events` sampled every 5 s from 0 to `until` s, its totals
    /// at second `s` being `at_second(s)`; and the instant of second `s`.
    fn sampled_every_5s(
        until: u64,
        at_second: impl Fn(u64) -> RowTotals,
    ) -> (History, impl Fn(u64) -> Instant) {
        let start = Instant::now();
        let at = move |s: u64| start + Duration::from_secs(s);
        let mut h = History::new(SAMPLES, MAX_TABLES);
        for s in (0..=until).step_by(5) {
            h.record(at(s), vec![(name("events"), at_second(s))]);
        }
        (h, at)
    }

    #[test]
    fn rates_per_interval_and_over_the_last_minute() {
        // 100 rows/s received for 80 s, 90 inserted and 10 parked of them.
        let (h, at) = sampled_every_5s(80, |s| totals(100 * s, 90 * s, 10 * s));
        let view = h.view(at(82));
        let t = &view.tables[0];
        assert_eq!((t.tenant.as_str(), t.table.as_str()), ("acme", "events"));
        assert_eq!(
            t.last_minute,
            Some(Rates {
                received: 100.0,
                inserted: 90.0,
                parked: 10.0
            })
        );
        assert_eq!(t.series.received, vec![100.0; 16]);
        assert_eq!(t.series.parked, vec![10.0; 16]);
        // The newest interval ended 2 s before the view, the oldest 77 s.
        assert_eq!(t.series.ago_s.first(), Some(&77.0));
        assert_eq!(t.series.ago_s.last(), Some(&2.0));
        assert_eq!(
            (t.received_total, t.inserted_total, t.parked_total),
            (8000, 7200, 800)
        );
    }

    #[test]
    fn the_last_minute_is_the_last_minute_not_the_whole_window() {
        // 50 rows/s for 5 minutes, then nothing for a minute.
        let (h, at) = sampled_every_5s(360, |s| totals(50 * s.min(300), 0, 0));
        let t = &h.view(at(360)).tables[0];
        assert_eq!(t.last_minute.map(|r| r.received), Some(0.0));
        assert_eq!(t.series.received.first(), Some(&50.0));
        assert_eq!(t.series.received.last(), Some(&0.0));
    }

    #[test]
    fn bounded_in_samples_and_tables() {
        let start = Instant::now();
        let mut h = History::new(4, 2);
        for i in 0..10u64 {
            h.record(
                start + Duration::from_secs(i),
                vec![
                    (name("a"), totals(i, 0, 0)),
                    (name("b"), totals(2 * i, 0, 0)),
                    (name("c"), totals(0, 0, 0)),
                ],
            );
        }
        assert_eq!(h.times.len(), 4);
        assert!(h.tables.values().all(|ring| ring.len() == 4));
        let view = h.view(start + Duration::from_secs(9));
        assert_eq!(view.tables.len(), 2);
        assert_eq!(view.untracked_tables, 1);
        assert_eq!(view.tables[1].series.received, vec![2.0; 3]);
    }

    #[test]
    fn a_table_seen_later_counts_its_rows_from_the_sample_before_it() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut h = History::new(SAMPLES, MAX_TABLES);
        h.record(at(0), vec![(name("a"), totals(0, 0, 0))]);
        h.record(at(5), vec![(name("a"), totals(10, 0, 0))]);
        // `b` had no rows at the sample before it appeared: its 10 rows came since.
        h.record(
            at(10),
            vec![(name("a"), totals(20, 0, 0)), (name("b"), totals(10, 5, 0))],
        );
        let view = h.view(at(10));
        assert_eq!(view.tables[0].series.received, vec![2.0, 2.0]);
        assert_eq!(view.tables[1].series.received, vec![2.0]);
        assert_eq!(
            view.tables[1].last_minute,
            Some(Rates {
                received: 2.0,
                inserted: 1.0,
                parked: 0.0
            })
        );
        // A table left out of a sample keeps its totals: no rate drop to a negative.
        h.record(at(15), vec![(name("b"), totals(15, 10, 0))]);
        let view = h.view(at(15));
        assert_eq!(view.tables[0].series.received.last(), Some(&0.0));
        assert_eq!(view.tables[1].series.inserted, vec![1.0, 1.0]);
        // A table in the very first sample has nothing before it: no rate yet.
        let mut first = History::new(SAMPLES, MAX_TABLES);
        first.record(at(0), vec![(name("c"), totals(3, 0, 0))]);
        assert_eq!(first.view(at(0)).tables[0].last_minute, None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_sampler_takes_one_sample_per_period() {
        let history = SharedHistory::new(History::new(SAMPLES, MAX_TABLES));
        let counter = Arc::new(AtomicU64::new(0));
        let read = {
            let counter = counter.clone();
            move || {
                vec![(
                    name("events"),
                    totals(counter.load(Ordering::Relaxed), 0, 0),
                )]
            }
        };
        let sampler = spawn_sampler(history.clone(), read);
        // The first sample is taken at once; then 20 rows/s for 30 s.
        tokio::task::yield_now().await;
        for _ in 0..6 {
            counter.fetch_add(100, Ordering::Relaxed);
            tokio::time::advance(PERIOD).await;
            tokio::task::yield_now().await;
        }
        let view = history.view();
        sampler.abort();
        let t = &view.tables[0];
        assert_eq!(t.series.received, vec![20.0; 6]);
        assert_eq!(t.last_minute.map(|r| r.received), Some(20.0));
        assert_eq!(t.series.ago_s.last(), Some(&0.0));
    }
}
