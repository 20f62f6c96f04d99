//! How long rows stopped flowing around a fault: a table's `count()` sampled in the
//! background while the feeds run, then read as the longest stretch without a new
//! row, and how soon after the fault ended rows came again.
//!
//! A scenario starts the watch ([`super::Scenario::watch_flow`]) once rows land, says
//! when its fault is over ([`super::Scenario::fault_over`]), and its line gets
//! `gap=` and `resumed_in=`; rows that come back later than [`RESUME_LIMIT`] after
//! the fault ended fail it. On a NATS cluster the scenario also says when every
//! stream and consumer had a leader again ([`super::Scenario::leaders_back`],
//! `leaders_back_in=`): the bound then runs from there, as no client can publish to
//! a stream without a leader (nats-server 2.9.10 beside two CPU hogs took 4 to 12 s
//! to elect leaders after a node thawed, and once rows came only 38 s after it, the
//! manifest bucket answering "no responders" until then).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::clickhouse::ClickHouseServer;

/// How often the table is counted.
const EVERY: Duration = Duration::from_millis(200);
/// Rows must flow again within this of the end of a fault.
pub const RESUME_LIMIT: Duration = Duration::from_secs(30);

/// What the watch saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flow {
    /// The longest stretch between two new rows while the table was filling.
    pub gap: Duration,
    /// From the end of the fault to the first new row after it (`None`: no row came
    /// after it, or the end was not marked).
    pub resumed_in: Option<Duration>,
    /// From the end of the fault to the moment every stream and consumer had a leader
    /// again (`None`: not watched, as on one server).
    pub leaders_back_in: Option<Duration>,
}

impl Flow {
    /// How long rows took to come again once NATS could take them: from the end of
    /// the fault, or from the leaders' return when that came later.
    pub fn resumed_after_nats(&self) -> Option<Duration> {
        self.resumed_in
            .map(|took| took.saturating_sub(self.leaders_back_in.unwrap_or_default()))
    }
}

/// A table's count, sampled every [`EVERY`] until dropped.
pub struct FlowWatch {
    table: String,
    samples: Arc<Mutex<Vec<(Instant, u64)>>>,
    fault_over: Option<Instant>,
    leaders_back: Option<Instant>,
    task: JoinHandle<()>,
}

// === impl FlowWatch ===

impl FlowWatch {
    /// Starts counting `table` on `clickhouse` (its HTTP interface, as the default user).
    pub fn start(clickhouse: &ClickHouseServer, table: &str) -> Result<Self> {
        let http = crate::http::loopback_client(Duration::from_secs(2))?;
        let url = format!("{}/", clickhouse.http_url());
        let sql = format!("SELECT count() FROM {table}");
        let samples = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let samples = samples.clone();
            async move {
                let mut tick = tokio::time::interval(EVERY);
                // Ends when the watch is dropped (the task is aborted).
                loop {
                    tick.tick().await;
                    if let Ok(count) = count(&http, &url, &sql).await {
                        lock(&samples).push((Instant::now(), count));
                    }
                }
            }
        });
        Ok(Self {
            table: table.to_owned(),
            samples,
            fault_over: None,
            leaders_back: None,
            task,
        })
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    /// The fault ended now.
    pub fn fault_over(&mut self) {
        self.fault_over = Some(Instant::now());
    }

    /// Every stream and consumer has a leader again, now.
    pub fn leaders_back(&mut self) {
        self.leaders_back = Some(Instant::now());
    }

    /// What the samples so far say.
    pub fn flow(&self) -> Flow {
        let mut flow = flow(&lock(&self.samples), self.fault_over);
        flow.leaders_back_in = self
            .fault_over
            .zip(self.leaders_back)
            .map(|(over, back)| back.saturating_duration_since(over));
        flow
    }
}

impl Drop for FlowWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

async fn count(http: &reqwest::Client, url: &str, sql: &str) -> Result<u64> {
    let text = http
        .post(url)
        .body(sql.to_owned())
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    text.trim().parse().context("count()")
}

/// The longest stretch between two increases, and the first increase after
/// `fault_over`.
fn flow(samples: &[(Instant, u64)], fault_over: Option<Instant>) -> Flow {
    let mut increases = Vec::new();
    for pair in samples.windows(2) {
        if pair[1].1 > pair[0].1 {
            increases.push(pair[1].0);
        }
    }
    let gap = increases
        .windows(2)
        .map(|w| w[1].saturating_duration_since(w[0]))
        .max()
        .unwrap_or_default();
    let resumed_in = fault_over.and_then(|over| {
        increases
            .iter()
            .find(|at| **at > over)
            .map(|at| at.saturating_duration_since(over))
    });
    Flow {
        gap,
        resumed_in,
        leaders_back_in: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gap_is_the_longest_stretch_without_a_new_row() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let samples = [
            (at(0), 0),
            (at(200), 100),
            (at(400), 200),
            // stopped: no new row for 3 s
            (at(1400), 200),
            (at(3400), 200),
            (at(3600), 300),
            (at(3800), 400),
            // every row in: the table stays full, which is not a gap
            (at(20_000), 400),
        ];
        let f = flow(&samples, Some(at(3000)));
        assert_eq!(f.gap, Duration::from_millis(3200));
        assert_eq!(f.resumed_in, Some(Duration::from_millis(600)));
        assert_eq!(flow(&samples, None).resumed_in, None);
        assert_eq!(flow(&samples, Some(at(5000))).resumed_in, None);
    }

    #[test]
    fn the_resume_bound_runs_from_the_leaders_return_when_it_came_later() {
        let slow_election = Flow {
            gap: Duration::from_secs(40),
            resumed_in: Some(Duration::from_secs(38)),
            leaders_back_in: Some(Duration::from_secs(36)),
        };
        assert_eq!(
            slow_election.resumed_after_nats(),
            Some(Duration::from_secs(2))
        );
        let leaders_at_once = Flow {
            leaders_back_in: Some(Duration::ZERO),
            ..slow_election
        };
        assert_eq!(
            leaders_at_once.resumed_after_nats(),
            Some(Duration::from_secs(38)),
            "NATS had leaders when the fault ended: Sluice took the 38 s"
        );
        let one_server = Flow {
            leaders_back_in: None,
            ..slow_election
        };
        assert_eq!(
            one_server.resumed_after_nats(),
            Some(Duration::from_secs(38))
        );
    }
}
