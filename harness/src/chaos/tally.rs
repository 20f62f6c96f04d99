//! The reckoning at the end of a scenario: what was published, what ClickHouse holds,
//! what the DLQ holds, and what is nowhere.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::Write as _;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::feed::Published;
use super::flow::{Flow, RESUME_LIMIT};
use super::observe::{JetStreamView, ParkedRow};
use crate::clickhouse::ClickHouseServer;

/// Appends every scenario's line to this file when set (the test command prints the
/// collected lines in its summary).
pub const REPORT_ENV: &str = "SLUICE_TEST_CHAOS_REPORT";

/// How many ids an error message lists.
const SHOWN_IDS: usize = 20;

/// The counts of one scenario, over all its tables.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub scenario: String,
    /// Rows accepted by the ingest API or JetStream (good and bad).
    pub published: u64,
    /// Published good rows found in ClickHouse (each counted once).
    pub inserted_distinct: u64,
    /// Rows in ClickHouse beyond the first copy of each id.
    pub duplicates: u64,
    /// Rows on the DLQ for the scenario's tables.
    pub parked: u64,
    /// Published rows neither in ClickHouse nor on the DLQ.
    pub lost: u64,
    /// Bad rows published (they belong on the DLQ).
    pub bad_published: u64,
    /// Good rows found on the DLQ: never acceptable.
    pub good_parked: Vec<u64>,
    /// Bad rows found in ClickHouse (the schema should make that impossible).
    pub bad_inserted: Vec<u64>,
    pub lost_ids: Vec<u64>,
    /// Ids in ClickHouse more than once (the first few: where to look in the logs).
    pub duplicate_ids: Vec<u64>,
    /// Rows on the DLQ more than once (a park repeated after its ack was lost must be
    /// stored once: the DLQ's duplicate window).
    pub parked_twice: u64,
    /// Ids whose publishing was never confirmed (left out of every count).
    pub unconfirmed: u64,
    /// The last refusal a feed with unconfirmed rows saw.
    pub feed_failure: Option<String>,
    /// Why the pipeline never went quiet, when it did not.
    pub not_quiet: Option<String>,
    /// The parked rows, for scenario-specific checks (headers).
    pub parked_rows: Vec<ParkedRow>,
    /// How long the healed pipeline took to go quiet (from the end of publishing).
    pub settled_in: Option<Duration>,
    /// Messages left in the ingest stream although the consumer acked everything (see
    /// `Backlog::stranded`): reported, not failed, as their rows are accounted for.
    pub stranded: u64,
    /// Messages the stream still kept after the wait for their removal: the backlog
    /// as JetStream showed it. A failure, printed after the counts (which say whether
    /// their rows are in ClickHouse: acked and kept, or never delivered).
    pub stranded_left: Option<String>,
    /// The same counts for the scenario's `ReplicatedMergeTree` twins, where
    /// exactly-once holds: no duplicate may be there.
    pub replicated: Option<Box<Tally>>,
    /// How rows flowed around the fault, when the scenario watched.
    pub flow: Option<Flow>,
    /// Every table counted deduplicates inserts (a cluster's Replicated tables): a
    /// duplicate fails the scenario.
    pub exactly_once: bool,
    /// Of `duplicate_ids`, those a feed published again after a lost ack (the producer's
    /// resend; see `Progress::resent`). One extra copy of each is JetStream's, not
    /// Sluice's: a nats-server of the stream restarted, and a work queue's consumed
    /// messages took their ids out of its duplicate check with them, so the resend was
    /// stored as a second message (docs/operations.md, "Delivery guarantees"). Sluice
    /// inserted each stored message once; a duplicate past these fails the scenario.
    pub duplicates_resent: usize,
    /// What else the scenario's line says (`key=value` each), e.g. rows that kept
    /// landing during the fault.
    pub notes: Vec<String>,
}

// === impl Tally ===

impl Tally {
    /// Counts `published` against ClickHouse and the DLQ. Several feeds may share a
    /// table (give them disjoint ids); each table is counted once.
    pub async fn count(
        scenario: &str,
        clickhouse: &ClickHouseServer,
        jet: &JetStreamView,
        published: &[Published],
    ) -> Result<Self> {
        Self::count_through(scenario, clickhouse, jet, published, &|t| t.to_owned()).await
    }

    /// [`Tally::count`], reading each table's rows in ClickHouse through `read(table)`
    /// (a cluster's: the `Distributed` table over the shards' local tables).
    pub async fn count_through(
        scenario: &str,
        clickhouse: &ClickHouseServer,
        jet: &JetStreamView,
        published: &[Published],
        read: &(dyn Fn(&str) -> String + Sync),
    ) -> Result<Self> {
        let mut tally = Tally {
            scenario: scenario.to_owned(),
            ..Default::default()
        };
        let mut tables: Vec<&str> = published.iter().map(|p| p.table.as_str()).collect();
        tables.sort_unstable();
        tables.dedup();
        for table in tables {
            let feeds: Vec<&Published> = published.iter().filter(|p| p.table == table).collect();
            let is_bad = |id: u64| feeds.iter().any(|p| p.rows.is_bad(id));
            let stored = ids_in(clickhouse, &read(table)).await?;
            let parked = jet
                .parked(table)
                .await
                .with_context(|| format!("reading the DLQ of {table}"))?;
            let parked_ids: BTreeSet<u64> = parked.iter().filter_map(|r| r.id).collect();
            tally.parked_twice +=
                (parked.iter().filter(|r| r.id.is_some()).count() - parked_ids.len()) as u64;
            tally.parked += parked.len() as u64;
            // What a user would check: count() against uniqExact(id).
            let (total, distinct) = counts(clickhouse, &read(table)).await?;
            tally.duplicates += total.saturating_sub(distinct);
            tally.duplicate_ids.extend(
                stored
                    .iter()
                    .filter(|(_, copies)| **copies > 1)
                    .map(|(id, _)| *id)
                    .take(SHOWN_IDS),
            );
            tally.duplicates_resent += stored
                .iter()
                .filter(|(id, copies)| **copies > 1 && feeds.iter().any(|p| p.resent.contains(id)))
                .count();
            tally
                .bad_inserted
                .extend(stored.keys().copied().filter(|id| is_bad(*id)));
            for p in &feeds {
                tally.published += p.accepted.len() as u64;
                tally.unconfirmed += p.unconfirmed.len() as u64;
                if !p.unconfirmed.is_empty() {
                    tally.feed_failure = p.last_failure.clone();
                }
                for id in &p.accepted {
                    if is_bad(*id) {
                        tally.bad_published += 1;
                    } else if stored.contains_key(id) {
                        tally.inserted_distinct += 1;
                    }
                    if !stored.contains_key(id) && !parked_ids.contains(id) {
                        tally.lost += 1;
                        tally.lost_ids.push(*id);
                    }
                }
            }
            for row in &parked {
                match row.id {
                    Some(id) if is_bad(id) => {}
                    Some(id) => tally.good_parked.push(id),
                    // Not a row of ours: treat it as good (it should not be there).
                    None => tally.good_parked.push(u64::MAX),
                }
            }
            tally.parked_rows.extend(parked);
        }
        Ok(tally)
    }

    /// The one line a scenario prints.
    /// Duplicates not explained by a feed's resend that JetStream stored twice (see
    /// `duplicates_resent`): one extra copy per resent id at most.
    fn duplicates_of_sluice(&self) -> u64 {
        self.duplicates
            .saturating_sub(self.duplicates_resent as u64)
    }

    pub fn line(&self) -> String {
        let mut line = format!(
            "chaos: {} published={} inserted_distinct={} duplicates={} parked={} lost={}",
            self.scenario,
            self.published,
            self.inserted_distinct,
            self.duplicates,
            self.parked,
            self.lost
        );
        if !self.good_parked.is_empty() {
            line.push_str(&format!(" GOOD_PARKED={}", self.good_parked.len()));
        }
        if !self.bad_inserted.is_empty() {
            line.push_str(&format!(" BAD_INSERTED={}", self.bad_inserted.len()));
        }
        if self.parked_twice > 0 {
            line.push_str(&format!(" PARKED_TWICE={}", self.parked_twice));
        }
        if self.unconfirmed > 0 {
            line.push_str(&format!(" unconfirmed={}", self.unconfirmed));
        }
        if self.not_quiet.is_some() {
            line.push_str(" NOT_QUIESCENT");
        }
        if self.stranded > 0 {
            line.push_str(&format!(" stranded_in_stream={}", self.stranded));
        }
        if self.stranded_left.is_some() {
            line.push_str(" STRANDED_LEFT");
        }
        if let Some(twin) = &self.replicated {
            line.push_str(&format!(
                " | replicated: inserted_distinct={} duplicates={} parked={} lost={}",
                twin.inserted_distinct, twin.duplicates, twin.parked, twin.lost
            ));
            if twin.duplicates_resent > 0 {
                line.push_str(&format!(
                    " resent_stored_twice_by_jetstream={}",
                    twin.duplicates_resent
                ));
            }
        }
        for note in &self.notes {
            line.push(' ');
            line.push_str(note);
        }
        if let Some(took) = self.settled_in {
            line.push_str(&format!(" settled_in={:.1}s", took.as_secs_f64()));
        }
        if let Some(flow) = &self.flow {
            line.push_str(&format!(" gap={:.1}s", flow.gap.as_secs_f64()));
            match flow.resumed_in {
                Some(took) => line.push_str(&format!(" resumed_in={:.1}s", took.as_secs_f64())),
                None => line.push_str(" resumed_in=-"),
            }
            if let Some(back) = flow.leaders_back_in {
                line.push_str(&format!(" leaders_back_in={:.1}s", back.as_secs_f64()));
            }
        }
        line
    }

    /// Prints the line (and appends it to `$SLUICE_TEST_CHAOS_REPORT` when set).
    pub fn print(&self) {
        let line = self.line();
        println!("{line}");
        if let Some(path) = std::env::var_os(REPORT_ENV).filter(|p| !p.is_empty()) {
            let appended = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .and_then(|mut f| writeln!(f, "{line}"));
            if let Err(e) = appended {
                eprintln!("cannot append to {REPORT_ENV}={path:?}: {e}");
            }
        }
    }

    /// Fails if a row was lost, a good row parked, a bad row inserted, a publish left
    /// unconfirmed, or the pipeline never went quiet.
    pub fn check(&self) -> Result<()> {
        let mut problems = Vec::new();
        if self.lost > 0 {
            problems.push(format!(
                "{} rows lost (ids {})",
                self.lost,
                shown(&self.lost_ids)
            ));
        }
        if !self.good_parked.is_empty() {
            problems.push(format!(
                "{} good rows parked (ids {})",
                self.good_parked.len(),
                shown(&self.good_parked)
            ));
        }
        if !self.bad_inserted.is_empty() {
            problems.push(format!(
                "{} bad rows in ClickHouse (ids {})",
                self.bad_inserted.len(),
                shown(&self.bad_inserted)
            ));
        }
        if self.parked_twice > 0 {
            problems.push(format!("{} rows parked twice", self.parked_twice));
        }
        if self.unconfirmed > 0 {
            problems.push(format!(
                "{} rows were never accepted before the feed's deadline (last refusal: {})",
                self.unconfirmed,
                self.feed_failure.as_deref().unwrap_or("none")
            ));
        }
        if let Some(why) = &self.not_quiet {
            problems.push(format!("the pipeline never went quiet: {why}"));
        }
        if let Some(left) = &self.stranded_left {
            problems.push(left.clone());
        }
        if self.exactly_once && self.duplicates_of_sluice() > 0 {
            problems.push(format!(
                "{} duplicates where every table deduplicates inserts (ids {}; {} of them \
                 stored twice by JetStream after the feed's resend)",
                self.duplicates,
                shown(&self.duplicate_ids),
                self.duplicates_resent
            ));
        }
        if let Some(flow) = self.flow {
            let took = flow.resumed_after_nats().unwrap_or_default();
            if took > RESUME_LIMIT {
                let leaders = flow
                    .leaders_back_in
                    .map(|back| format!(", {back:.1?} of it spent by NATS electing leaders"))
                    .unwrap_or_default();
                problems.push(format!(
                    "rows flowed again only {:.1?} after the fault ended{leaders} (the bound is {RESUME_LIMIT:?} from the end of the fault or of the elections)",
                    flow.resumed_in.unwrap_or_default()
                ));
            }
        }
        if let Some(twin) = &self.replicated {
            if twin.duplicates_of_sluice() > 0 {
                problems.push(format!(
                    "{} duplicates in the Replicated twins, where inserts are exactly-once \
                     (ids {:?}; {} of the duplicated ids were published again by the feed \
                     after their ack was lost)",
                    twin.duplicates,
                    &twin.duplicate_ids[..twin.duplicate_ids.len().min(SHOWN_IDS)],
                    twin.duplicates_resent
                ));
            }
            if let Err(e) = twin.check() {
                problems.push(format!("in the Replicated twins: {e:#}"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            bail!("{}: {}", self.line(), problems.join("; "))
        }
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line())
    }
}

fn shown(ids: &[u64]) -> String {
    let mut text = ids
        .iter()
        .take(SHOWN_IDS)
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    if ids.len() > SHOWN_IDS {
        text.push_str(",…");
    }
    text
}

/// Every id in `table` with its number of copies.
pub async fn ids_in(clickhouse: &ClickHouseServer, table: &str) -> Result<BTreeMap<u64, u64>> {
    let text = clickhouse
        .exec(&format!(
            "SELECT id, count() FROM {table} GROUP BY id FORMAT TabSeparated"
        ))
        .await?;
    let mut ids = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (id, copies) = line
            .split_once('\t')
            .with_context(|| format!("unexpected line from ClickHouse: {line:?}"))?;
        ids.insert(
            id.parse().with_context(|| format!("bad id {id:?}"))?,
            copies
                .parse()
                .with_context(|| format!("bad count {copies:?}"))?,
        );
    }
    Ok(ids)
}

/// `count()` and `uniqExact(id)` of `table`: what a user would check.
pub async fn counts(clickhouse: &ClickHouseServer, table: &str) -> Result<(u64, u64)> {
    let text = clickhouse
        .exec(&format!(
            "SELECT count(), uniqExact(id) FROM {table} FORMAT TabSeparated"
        ))
        .await?;
    let (total, distinct) = text
        .trim()
        .split_once('\t')
        .with_context(|| format!("unexpected answer from ClickHouse: {text:?}"))?;
    Ok((
        total.parse().context("count()")?,
        distinct.parse().context("uniqExact(id)")?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_twin(duplicates: u64, duplicates_resent: usize) -> Tally {
        Tally {
            scenario: "s".into(),
            replicated: Some(Box::new(Tally {
                scenario: "s".into(),
                duplicates,
                duplicates_resent,
                ..Tally::default()
            })),
            ..Tally::default()
        }
    }

    #[test]
    fn a_duplicate_in_a_twin_fails_unless_a_resend_stored_twice_explains_it() {
        assert!(with_twin(0, 0).check().is_ok());
        // One 100-row message the feed published again after its ack was lost, stored
        // twice by JetStream: Sluice inserted each stored message once.
        assert!(with_twin(100, 100).check().is_ok());
        assert!(with_twin(100, 100)
            .line()
            .contains("resent_stored_twice_by_jetstream=100"));
        // One copy more than the resends explain is Sluice's.
        assert!(with_twin(101, 100).check().is_err());
        assert!(with_twin(1, 0).check().is_err());
    }
}
