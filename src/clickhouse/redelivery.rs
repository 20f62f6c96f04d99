//! What a deduplication window must cover for a retried batch to be dropped: how late a
//! batch ClickHouse took can come back to it, and how many blocks the table can take
//! meanwhile, worked out from Sluice's own settings (docs/operations.md, "Delivery
//! guarantees", gives the same arithmetic).
//!
//! - **The delay.** A batch ClickHouse committed but whose answer never came (Sluice
//!   crashed, the connection dropped) comes back once its messages' lease runs out:
//!   `ack_wait` after their last delivery or in-progress signal. It is then gathered
//!   for up to `reform_wait`; when ClickHouse was failing meanwhile, the pool's next
//!   try is up to `backoff_max` away; and the retry itself may take `insert_timeout`
//!   before ClickHouse checks its hash. The delay is their sum.
//! - **The blocks in between.** While rows keep coming, one instance inserts a batch of
//!   the table at least every `batch_age` (more often when batches fill on
//!   `batch_rows` first), and isolating a bad row of one of them inserts up to
//!   ⌈log2(batch_rows)⌉ blocks more (the halves that go in).
//!
//! A window covers a redelivery when its seconds reach the delay and its blocks reach
//! those batches plus one isolation. That is a floor, for one instance writing one
//! partition per batch with no other writer: every instance, every partition a batch
//! spans, every isolated batch and every other writer adds its own blocks, so a window
//! below it cannot cover a redelivery, and one above it covers as many times that as
//! the room it leaves. The rows per second it covers in full batches are given too:
//! a busy table fills batches faster than `batch_age`.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use sluice_actors::{DedupWindow, PipelineSettings};

use crate::config::{Config, TargetConfig};

/// Sluice's settings that bound how late a batch comes back to one target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redelivery {
    pub ack_wait: Duration,
    pub reform_wait: Duration,
    /// The pool's backoff cap (`[pipeline] backoff_max`).
    pub backoff_max: Duration,
    /// The target's `insert_timeout`.
    pub insert_timeout: Duration,
    pub paces: Paces,
}

/// How often one instance forms a table's batches and how big they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    pub batch_age: Duration,
    pub batch_rows: usize,
}

/// The pace of every table written to one target: `[ingest]`, and the
/// `[tables."tenant.table"]` overrides of the tenants whose rows go there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paces {
    default: Pace,
    overrides: BTreeMap<(String, String), Pace>,
    /// The tenants routed to this target: a table listed without a tenant (`sluice
    /// check-config` lists a database) may be any of theirs.
    tenants: Vec<String>,
}

/// What a window must hold for one table: the redelivery's delay and the blocks one
/// instance inserts meanwhile, each with the settings it comes from (for the reason
/// and `check-config`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Need {
    pub delay: Duration,
    pub pace: Pace,
    /// One batch per `batch_age` over the delay.
    pub batches: u64,
    /// The blocks isolating one bad row inserts: ⌈log2(batch_rows)⌉.
    pub isolation: u64,
}

/// A window against a [`Need`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// Both the blocks and the seconds are enough.
    Covers {
        /// How many times the needed blocks the window holds (instances, partitions,
        /// other writers share it).
        room: u64,
        /// The rows per second the window covers over the delay in full batches.
        full_batch_rows_per_sec: u64,
    },
    /// The window may forget a block before its retry comes.
    Short {
        /// Fewer blocks than one instance may insert before the batch comes back.
        too_few_blocks: bool,
        /// The hashes are forgotten after this, sooner than the batch comes back.
        forgets_after: Option<Duration>,
    },
}

// === impl Redelivery ===

impl Redelivery {
    /// The settings `config` gives `target`'s tables.
    pub fn of(config: &Config, target: &TargetConfig) -> Self {
        let pace = |s: &crate::config::TableSettings| Pace {
            batch_age: s.batch_age,
            batch_rows: s.batch_rows,
        };
        let tenants: Vec<String> = config
            .tenants
            .values()
            .filter(|t| t.target.as_deref() == Some(target.name.as_str()))
            .map(|t| t.name.clone())
            .collect();
        let overrides = config
            .tables
            .iter()
            .filter(|((tenant, _), _)| tenants.contains(tenant))
            .map(|(key, s)| (key.clone(), pace(s)))
            .collect();
        Redelivery {
            ack_wait: config.nats.streams.ack_wait,
            // Not a `[pipeline]` key: the actors run with their default.
            reform_wait: PipelineSettings::default().reform_wait,
            backoff_max: config.pipeline.backoff_max,
            insert_timeout: target.insert_timeout,
            paces: Paces {
                default: pace(&config.ingest),
                overrides,
                tenants,
            },
        }
    }

    /// How long after its first insert a batch may be tried again.
    pub fn delay(&self) -> Duration {
        self.ack_wait + self.reform_wait + self.backoff_max + self.insert_timeout
    }

    /// The delay with its parts, e.g. `2m 1s (ack_wait 1m + reform_wait 1s + backoff_max
    /// 30s + insert_timeout 30s)`.
    pub fn delay_arithmetic(&self) -> String {
        format!(
            "{} (ack_wait {} + reform_wait {} + backoff_max {} + insert_timeout {})",
            human(self.delay()),
            human(self.ack_wait),
            human(self.reform_wait),
            human(self.backoff_max),
            human(self.insert_timeout)
        )
    }

    /// What a window must hold for `tenant`'s `table`.
    pub fn need(&self, tenant: &str, table: &str) -> Need {
        self.need_at(self.paces.of(tenant, table))
    }

    /// What a window must hold for `table` whichever tenant writes it: the pace that
    /// needs the most blocks.
    pub fn strictest_need(&self, table: &str) -> Need {
        self.paces
            .tenants
            .iter()
            .map(|tenant| self.need(tenant, table))
            .max_by_key(Need::blocks)
            // No tenant is routed here: `[ingest]`'s pace.
            .unwrap_or_else(|| self.need_at(self.paces.default))
    }

    fn need_at(&self, pace: Pace) -> Need {
        let delay = self.delay();
        Need {
            delay,
            pace,
            batches: batches_within(delay, pace.batch_age),
            isolation: isolation_blocks(pace.batch_rows),
        }
    }
}

// === impl Paces ===

impl Paces {
    /// Every table at one pace.
    pub fn uniform(pace: Pace) -> Self {
        Paces {
            default: pace,
            overrides: BTreeMap::new(),
            tenants: Vec::new(),
        }
    }

    pub fn of(&self, tenant: &str, table: &str) -> Pace {
        self.overrides
            .get(&(tenant.to_string(), table.to_string()))
            .copied()
            .unwrap_or(self.default)
    }
}

// === impl Need ===

impl Need {
    /// The blocks one instance may insert before the batch comes back.
    pub fn blocks(&self) -> u64 {
        self.batches + self.isolation
    }

    /// Whether `window` covers this need.
    pub fn covered_by(&self, window: DedupWindow) -> Coverage {
        let needed = self.blocks().max(1);
        let forgets_after = window.seconds.filter(|seconds| *seconds < self.delay);
        let too_few_blocks = window.blocks < needed;
        if too_few_blocks || forgets_after.is_some() {
            return Coverage::Short {
                too_few_blocks,
                forgets_after,
            };
        }
        let rows = window.blocks as f64 * self.pace.batch_rows as f64;
        Coverage::Covers {
            room: window.blocks / needed,
            full_batch_rows_per_sec: (rows / self.delay.as_secs_f64().max(1e-3)) as u64,
        }
    }
}

impl fmt::Display for Need {
    /// `135 blocks (121 batches in 2m 1s, one per batch_age 1s, + 14 isolating a bad
    /// row among batch_rows 10000)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} blocks ({} batches in {}, one per batch_age {}, + {} isolating a bad row among batch_rows {})",
            self.blocks(),
            self.batches,
            human(self.delay),
            human(self.pace.batch_age),
            self.isolation,
            self.pace.batch_rows
        )
    }
}

/// Batches formed one per `batch_age` over `delay`, rounded up.
fn batches_within(delay: Duration, batch_age: Duration) -> u64 {
    let age = batch_age.as_nanos().max(1);
    delay.as_nanos().div_ceil(age) as u64
}

/// The blocks bisection inserts while isolating one bad row among `rows`: one half
/// goes in at each of ⌈log2(rows)⌉ levels.
pub fn isolation_blocks(rows: usize) -> u64 {
    if rows <= 1 {
        0
    } else {
        u64::from(usize::BITS - (rows - 1).leading_zeros())
    }
}

/// A duration as the configuration writes it (`2m 1s`), to the millisecond.
pub fn human(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// Sluice's documented defaults (config.toml): ack_wait 60s, backoff_max 30s,
    /// insert_timeout 30s, batch_age 1s, batch_rows 10000.
    fn defaults() -> Redelivery {
        Redelivery {
            ack_wait: secs(60),
            reform_wait: secs(1),
            backoff_max: secs(30),
            insert_timeout: secs(30),
            paces: Paces::uniform(Pace {
                batch_age: secs(1),
                batch_rows: 10_000,
            }),
        }
    }

    fn window(blocks: u64, seconds: Option<u64>) -> DedupWindow {
        DedupWindow {
            blocks,
            seconds: seconds.map(secs),
        }
    }

    #[test]
    fn the_delay_adds_the_lease_the_gathering_the_backoff_and_the_retry() {
        let r = defaults();
        assert_eq!(r.delay(), secs(121));
        assert_eq!(
            r.delay_arithmetic(),
            "2m 1s (ack_wait 1m + reform_wait 1s + backoff_max 30s + insert_timeout 30s)"
        );
    }

    #[test]
    fn isolating_a_bad_row_inserts_one_half_per_level() {
        assert_eq!(isolation_blocks(0), 0);
        assert_eq!(isolation_blocks(1), 0);
        assert_eq!(isolation_blocks(2), 1);
        assert_eq!(isolation_blocks(3), 2);
        assert_eq!(isolation_blocks(1000), 10);
        assert_eq!(isolation_blocks(1024), 10);
        assert_eq!(isolation_blocks(1025), 11);
        assert_eq!(isolation_blocks(10_000), 14);
    }

    #[test]
    fn at_the_defaults_the_window_of_18_16_is_too_small_and_that_of_current_servers_is_not() {
        let need = defaults().need("acme", "events");
        assert_eq!(
            (need.batches, need.isolation, need.blocks()),
            (121, 14, 135)
        );
        assert_eq!(
            need.to_string(),
            "135 blocks (121 batches in 2m 1s, one per batch_age 1s, + 14 isolating a bad row among batch_rows 10000)"
        );
        let too_few_blocks = Coverage::Short {
            too_few_blocks: true,
            forgets_after: None,
        };
        // 18.16: 100 blocks, 7 days.
        assert_eq!(need.covered_by(window(100, Some(604_800))), too_few_blocks);
        assert_eq!(need.covered_by(window(134, None)), too_few_blocks);
        assert!(matches!(
            need.covered_by(window(135, None)),
            Coverage::Covers { room: 1, .. }
        ));
        // Current servers: 1000 blocks, one hour.
        assert_eq!(
            need.covered_by(window(1000, Some(3600))),
            Coverage::Covers {
                room: 7,
                full_batch_rows_per_sec: 82_644
            }
        );
    }

    #[test]
    fn a_window_shorter_in_time_than_the_delay_does_not_cover_it() {
        let need = defaults().need("acme", "events");
        assert_eq!(
            need.covered_by(window(100_000, Some(120))),
            Coverage::Short {
                too_few_blocks: false,
                forgets_after: Some(secs(120))
            }
        );
        assert_eq!(
            need.covered_by(window(5, Some(30))),
            Coverage::Short {
                too_few_blocks: true,
                forgets_after: Some(secs(30))
            }
        );
        assert!(matches!(
            need.covered_by(window(100_000, Some(121))),
            Coverage::Covers { .. }
        ));
    }

    #[test]
    fn the_chaos_suites_settings_need_120_blocks() {
        // tests/chaos.rs: ack_wait 5s, backoff_max 2s, insert_timeout 3s, batch_age
        // 100ms, batch_rows 1000: a twin at 100 blocks is not exactly-once, at 1000 it is.
        let r = Redelivery {
            ack_wait: secs(5),
            reform_wait: secs(1),
            backoff_max: secs(2),
            insert_timeout: secs(3),
            paces: Paces::uniform(Pace {
                batch_age: Duration::from_millis(100),
                batch_rows: 1000,
            }),
        };
        let need = r.need("acme", "events");
        assert_eq!(need.blocks(), 120);
        assert!(matches!(
            need.covered_by(window(100, Some(604_800))),
            Coverage::Short {
                too_few_blocks: true,
                ..
            }
        ));
        assert!(matches!(
            need.covered_by(window(1000, Some(604_800))),
            Coverage::Covers { room: 8, .. }
        ));
    }

    #[test]
    fn a_table_with_a_quicker_pace_needs_more_and_an_unknown_tenant_takes_the_strictest() {
        let config = crate::config::Config::from_parts(
            "test",
            r#"
[nats]
url = "nats://127.0.0.1:4222"
ack_wait = "60s"
[clickhouse.targets.main]
url = "http://127.0.0.1:8123"
insert_timeout = "30s"
[clickhouse.targets.other]
url = "http://127.0.0.1:8124"
insert_timeout = "10s"
[tenants.acme]
target = "main"
[tenants.globex]
target = "main"
[tenants.initech]
target = "other"
[tables."acme.events"]
batch_age = "100ms"
[tables."initech.events"]
batch_age = "10ms"
[api]
auth = "none"
"#,
            &BTreeMap::new(),
        )
        .expect("a valid config");
        let main = Redelivery::of(&config, &config.targets["main"]);
        assert_eq!(main.delay(), secs(121));
        assert_eq!(main.need("acme", "events").batches, 1210);
        assert_eq!(main.need("globex", "events").batches, 121);
        // check-config lists `events` without a tenant: acme's pace needs the most.
        // initech's override is another target's and does not count here.
        assert_eq!(main.strictest_need("events").batches, 1210);
        assert_eq!(main.strictest_need("clicks").batches, 121);
        let other = Redelivery::of(&config, &config.targets["other"]);
        assert_eq!(other.delay(), secs(101));
        assert_eq!(other.strictest_need("events").batches, 10_100);
    }
}
