//! The figures, the performance targets (docs/benchmark.md) with each ratio, as a table and
//! as JSON. With several runs, a phase's figure is the median over its least disturbed
//! runs: those during which other processes used at most 0.1 core more than in the
//! phase's quietest run (peak RSS: the maximum of every run). The machine is shared
//! (two cores, other builds and tests), and interference only ever slows a run down, so
//! one build starting during an outage run must not decide a ratio; every run stays in
//! the table.

use std::fmt::Write as _;

use serde_json::{json, Value};

/// One phase of one run.
#[derive(Clone, Debug, Default)]
pub struct Measured {
    pub phase: &'static str,
    pub run: usize,
    pub published: u64,
    pub bad_rows: u64,
    /// First delivery (or ClickHouse up, or first publish) to the last row counted.
    pub seconds: f64,
    pub rows_per_sec: f64,
    /// The slope from 10% to 90% of the rows counted: the rate without start-up and
    /// tail effects (the outage phase's drain rate, compared with the steady phase's).
    pub bulk_rows_per_sec: Option<f64>,
    /// The process under test's utime+stime over `seconds`, per row.
    pub cpu_us_per_row: Option<f64>,
    /// The kernel's part of it (stime): syscalls, wake-ups, socket copies.
    pub sys_us_per_row: Option<f64>,
    /// Its utime+stime over its whole life (start-up, outage included).
    pub cpu_total_seconds: Option<f64>,
    pub nats_us_per_row: Option<f64>,
    pub clickhouse_us_per_row: Option<f64>,
    pub bench_us_per_row: Option<f64>,
    /// The `api` phases' load generator (apart from Sluice's figure).
    pub loader_us_per_row: Option<f64>,
    /// Cores busy with processes outside the benchmark during the phase.
    pub others_cores: Option<f64>,
    pub peak_rss: Option<u64>,
    pub rss_during_outage: Option<u64>,
    pub startup_seconds: Option<f64>,
    pub publish_seconds: Option<f64>,
    pub outage_seconds: Option<f64>,
    /// ClickHouse up → first rows counted (the breaker's window and probe).
    pub recovery_seconds: Option<f64>,
    /// First rows counted after the outage → last row counted (the whole drain, its
    /// first batch excluded, its tail included).
    pub drain_rows_per_sec: Option<f64>,
    pub load_before: Option<[f64; 3]>,
    pub load_after: Option<[f64; 3]>,
    pub inserted_distinct: u64,
    pub duplicates: u64,
    pub lost: u64,
    /// (seconds since the phase's watch began, rows in ClickHouse), every ~200 ms.
    pub progress: Vec<(f64, u64)>,
    /// Sluice's CPU while idle after the drain, in % of one core (10 ms ticks).
    pub idle_cpu_percent: Option<f64>,
    /// Sluice's own metrics at the end of the phase (non-zero series only).
    pub sluice_counters: Vec<(String, f64)>,
    /// The `api` phases: rows the ingest API accepted (202), by the load generator's
    /// count of its answers.
    pub accepted: Option<u64>,
    /// The `api` phases: 503 answers the load generator had to resend after.
    pub load_unavailable: u64,
    /// Rows parked on the DLQ during the phase.
    pub parked: u64,
    /// How the phase differed from the run's settings, when it did.
    pub note: Option<String>,
}

impl Measured {
    /// The sum of Sluice's counters whose series starts with `prefix` and contains
    /// `label` (every series when `label` is empty).
    fn counter(&self, prefix: &str, label: &str) -> f64 {
        self.sluice_counters
            .iter()
            .filter(|(k, _)| k.starts_with(prefix) && k.contains(label))
            .map(|(_, v)| v)
            .sum::<f64>()
            + 0.0 // an empty sum is -0.0
    }

    /// Rows per message: what the ingest API published (`api` phases), or what the
    /// consumer pulled.
    fn rows_per_message(&self) -> Option<f64> {
        let per = |rows: f64, messages: f64| (messages > 0.0).then(|| rows / messages);
        per(
            self.counter("sluice_ingest_rows_total", ""),
            self.counter("sluice_ingest_messages_total", ""),
        )
        .or_else(|| {
            per(
                self.counter("sluice_rows_received_total", ""),
                self.counter("sluice_messages_received_total", ""),
            )
        })
    }

    /// `api` phases: every accepted row inserted or parked, none lost.
    fn accounted(&self) -> Option<bool> {
        let accepted = self.accepted?;
        Some(accepted == self.published && self.inserted_distinct + self.parked == accepted)
    }
}

/// Where and how the benchmark ran.
#[derive(Clone, Debug)]
pub struct Context {
    pub rows: u64,
    pub row_bytes: usize,
    pub pull_batch: usize,
    pub batch_rows: usize,
    pub max_ack_pending: i64,
    pub outage_secs: u64,
    pub bad_every: u64,
    /// Rows per message in `batched`, per request in the `api` phases, requests in
    /// flight from the load generator.
    pub message_rows: usize,
    pub request_rows: u64,
    pub load_concurrency: usize,
    pub sets: Vec<String>,
    pub nats_version: String,
    pub clickhouse_version: String,
    pub sluice_version: String,
    pub sluice_config: String,
    pub cpus: usize,
    pub kernel: String,
    pub load_at_end: Option<[f64; 3]>,
}

/// One target with its figure, its reference and the ratio.
#[derive(Clone, Debug)]
pub struct Target {
    pub name: String,
    pub figure: String,
    pub reference: String,
    /// figure ÷ reference (or ÷ the bound).
    pub ratio: Option<f64>,
    pub wanted: &'static str,
    pub met: Option<bool>,
}

pub struct Report {
    pub context: Context,
    pub runs: Vec<Measured>,
}

const MIB: f64 = 1024.0 * 1024.0;
/// Runs within this many cores of the quietest run's interference count as quiet.
const QUIET_MARGIN: f64 = 0.1;

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

fn rate(v: Option<f64>) -> String {
    v.map(|v| format!("{:.0}", v)).unwrap_or_else(|| "-".into())
}

/// One line per phase as it finishes (stderr).
pub fn one_line(m: &Measured) -> String {
    format!(
        "{} rows in {:.2} s = {:.0} rows/s (10→90%: {}), cpu {} µs/row ({} in the kernel; nats {} · clickhouse {}), peak RSS {} MiB, others {} cores{}{}; lost {}, duplicates {}",
        m.published,
        m.seconds,
        m.rows_per_sec,
        rate(m.bulk_rows_per_sec),
        opt(m.cpu_us_per_row, 2),
        opt(m.sys_us_per_row, 2),
        opt(m.nats_us_per_row, 2),
        opt(m.clickhouse_us_per_row, 2),
        opt(m.peak_rss.map(|b| b as f64 / MIB), 1),
        opt(m.others_cores, 2),
        m.startup_seconds
            .map(|s| format!(", ready after {s:.2} s"))
            .unwrap_or_default(),
        m.drain_rows_per_sec
            .map(|r| format!(
                ", drain {r:.0} rows/s after {} s of recovery",
                opt(m.recovery_seconds, 2)
            ))
            .unwrap_or_default(),
        m.lost,
        m.duplicates,
    )
}

impl Report {
    pub fn new(context: Context, runs: Vec<Measured>) -> Self {
        Self { context, runs }
    }

    fn of(&self, phase: &str) -> Vec<&Measured> {
        self.runs.iter().filter(|m| m.phase == phase).collect()
    }

    /// The phase's runs least disturbed by other processes (see the module doc).
    fn quiet(&self, phase: &str) -> Vec<&Measured> {
        let runs = self.of(phase);
        let others = |m: &Measured| m.others_cores.unwrap_or(0.0);
        let least = runs.iter().map(|m| others(m)).fold(f64::INFINITY, f64::min);
        runs.into_iter()
            .filter(|m| others(m) <= least + QUIET_MARGIN)
            .collect()
    }

    /// Which runs the targets' figures come from, per phase.
    pub fn runs_used(&self) -> Vec<(&'static str, Vec<usize>)> {
        let mut out: Vec<(&'static str, Vec<usize>)> = Vec::new();
        for m in &self.runs {
            if !out.iter().any(|(p, _)| *p == m.phase) {
                out.push((m.phase, self.quiet(m.phase).iter().map(|m| m.run).collect()));
            }
        }
        out
    }

    fn med(&self, phase: &str, f: impl Fn(&Measured) -> Option<f64>) -> Option<f64> {
        median(self.quiet(phase).into_iter().filter_map(f).collect())
    }

    pub fn lost_rows(&self) -> u64 {
        self.runs.iter().map(|m| m.lost).sum()
    }

    pub fn all_targets_met(&self) -> bool {
        self.targets().iter().all(|t| t.met != Some(false))
    }

    pub fn targets(&self) -> Vec<Target> {
        let reference = self.med("reference", |m| Some(m.rows_per_sec));
        let sluice = self.med("sluice", |m| Some(m.rows_per_sec));
        let ref_cpu = self.med("reference", |m| m.cpu_us_per_row);
        let cpu = self.med("sluice", |m| m.cpu_us_per_row);
        let bad = self.med("bad", |m| Some(m.rows_per_sec));
        let drain = self.med("outage", |m| m.bulk_rows_per_sec);
        let steady = self.med("sluice", |m| m.bulk_rows_per_sec);
        let ref_rss = self.of("reference").iter().filter_map(|m| m.peak_rss).max();
        let rss = self
            .runs
            .iter()
            .filter(|m| m.phase != "reference")
            .filter_map(|m| m.peak_rss)
            .max();
        let ratio = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
        let mut out = Vec::new();
        let r = ratio(sluice, reference);
        out.push(Target {
            name: "rows/s: sluice vs reference".into(),
            figure: rate(sluice),
            reference: rate(reference),
            ratio: r,
            wanted: ">= 0.95",
            met: r.map(|r| r >= 0.95),
        });
        out.push(Target {
            name: "CPU µs/row: sluice (bound 2.0)".into(),
            figure: opt(cpu, 2),
            reference: format!("2.00 (reference loop {})", opt(ref_cpu, 2)),
            ratio: cpu.map(|c| c / 2.0),
            wanted: "<= 1.00",
            met: cpu.map(|c| c <= 2.0),
        });
        out.push(Target {
            name: "peak RSS MiB: sluice (bound 150)".into(),
            figure: opt(rss.map(|b| b as f64 / MIB), 1),
            reference: format!(
                "150 (reference loop {})",
                opt(ref_rss.map(|b| b as f64 / MIB), 1)
            ),
            ratio: rss.map(|b| b as f64 / MIB / 150.0),
            wanted: "<= 1.00",
            met: rss.map(|b| (b as f64) <= 150.0 * MIB),
        });
        let r = ratio(bad, sluice);
        out.push(Target {
            name: "rows/s: 1 bad row per 10k vs clean".into(),
            figure: rate(bad),
            reference: rate(sluice),
            ratio: r,
            wanted: ">= 0.80",
            met: r.map(|r| r >= 0.80),
        });
        let r = ratio(drain, steady);
        out.push(Target {
            name: "rows/s 10→90%: drain after outage vs steady".into(),
            figure: rate(drain),
            reference: rate(steady),
            ratio: r,
            wanted: ">= 0.90",
            met: r.map(|r| r >= 0.90),
        });
        out.extend(self.many_rows_targets());
        out.extend(self.exactly_once_targets());
        out.extend(self.cluster_targets());
        out
    }

    /// Issue 22's targets, where the phase ran: a 2 × 2 cluster against one server
    /// (both exactly-once, on the same machine).
    fn cluster_targets(&self) -> Vec<Target> {
        if self.of("cluster").is_empty() || self.of("exactly-once").is_empty() {
            return Vec::new();
        }
        let ratio = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
        let rate_cluster = self.med("cluster", |m| Some(m.rows_per_sec));
        let rate_one = self.med("exactly-once", |m| Some(m.rows_per_sec));
        let cpu_cluster = self.med("cluster", |m| m.cpu_us_per_row);
        let cpu_one = self.med("exactly-once", |m| m.cpu_us_per_row);
        let r = ratio(cpu_cluster, cpu_one);
        vec![
            Target {
                name: "rows/s: 2x2 cluster vs one server (same machine)".into(),
                figure: rate(rate_cluster),
                reference: rate(rate_one),
                ratio: ratio(rate_cluster, rate_one),
                wanted: "(reported)",
                met: None,
            },
            Target {
                name: "Sluice CPU µs/row: 2x2 cluster vs one server".into(),
                figure: opt(cpu_cluster, 2),
                reference: opt(cpu_one, 2),
                ratio: r,
                wanted: "<= 1.10",
                met: r.map(|r| r <= 1.10),
            },
        ]
    }

    /// Issue 10's targets, where the phase ran: exactly-once against at-least-once.
    fn exactly_once_targets(&self) -> Vec<Target> {
        if self.of("exactly-once").is_empty() {
            return Vec::new();
        }
        let ratio = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
        let rate_eo = self.med("exactly-once", |m| Some(m.rows_per_sec));
        let rate_alo = self.med("sluice", |m| Some(m.rows_per_sec));
        let r = ratio(rate_eo, rate_alo);
        let cpu_eo = self.med("exactly-once", |m| m.cpu_us_per_row);
        let cpu_alo = self.med("sluice", |m| m.cpu_us_per_row);
        let extra = (|| Some(cpu_eo? - cpu_alo?))();
        vec![
            Target {
                name: "rows/s: exactly-once vs at-least-once".into(),
                figure: rate(rate_eo),
                reference: rate(rate_alo),
                ratio: r,
                wanted: ">= 0.90",
                met: r.map(|r| r >= 0.90),
            },
            Target {
                name: "CPU µs/row: exactly-once extra (bound 0.5)".into(),
                figure: opt(extra, 2),
                reference: format!("0.50 (at-least-once {})", opt(cpu_alo, 2)),
                ratio: extra.map(|e| e / 0.5),
                wanted: "<= 1.00",
                met: extra.map(|e| e <= 0.5),
            },
        ]
    }

    /// Issue 15's targets, where their phases ran: many rows per message against one.
    fn many_rows_targets(&self) -> Vec<Target> {
        let ratio = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
        let mut out = Vec::new();
        if !self.of("batched").is_empty() {
            let per = self
                .med("batched", Measured::rows_per_message)
                .map_or("many".to_string(), |r| format!("{r:.0}"));
            let nats = self.med("batched", |m| m.nats_us_per_row);
            let nats_one = self.med("sluice", |m| m.nats_us_per_row);
            let r = ratio(nats, nats_one);
            out.push(Target {
                name: format!("nats µs/row: {per}-row messages vs 1-row"),
                figure: opt(nats, 2),
                reference: opt(nats_one, 2),
                ratio: r,
                wanted: "<= 0.10",
                met: r.map(|r| r <= 0.10),
            });
            let rate_many = self.med("batched", |m| Some(m.rows_per_sec));
            let rate_one = self.med("sluice", |m| Some(m.rows_per_sec));
            let r = ratio(rate_many, rate_one);
            out.push(Target {
                name: format!("rows/s: {per}-row messages vs 1-row"),
                figure: rate(rate_many),
                reference: rate(rate_one),
                ratio: r,
                wanted: ">= 3.00",
                met: r.map(|r| r >= 3.0),
            });
            let cpu = self.med("batched", |m| m.cpu_us_per_row);
            let cpu_one = self.med("sluice", |m| m.cpu_us_per_row);
            let r = ratio(cpu, cpu_one);
            out.push(Target {
                name: format!("CPU µs/row: sluice, {per}-row vs 1-row"),
                figure: opt(cpu, 2),
                reference: opt(cpu_one, 2),
                ratio: r,
                wanted: "<= 1.00",
                met: r.map(|r| r <= 1.0),
            });
        }
        if !self.of("api").is_empty() {
            let nats = self.med("api", |m| m.nats_us_per_row);
            let nats_one = self.med("api-unbatched", |m| m.nats_us_per_row);
            let r = ratio(nats, nats_one);
            out.push(Target {
                name: "nats µs/row: API chunked vs 1 per message".into(),
                figure: opt(nats, 2),
                reference: opt(nats_one, 2),
                ratio: r,
                wanted: "<= 0.10",
                met: r.map(|r| r <= 0.10),
            });
        }
        let api_runs: Vec<&Measured> = self.runs.iter().filter(|m| m.accepted.is_some()).collect();
        if !api_runs.is_empty() {
            let accepted: u64 = api_runs.iter().filter_map(|m| m.accepted).sum();
            let settled: u64 = api_runs
                .iter()
                .map(|m| m.inserted_distinct + m.parked)
                .sum();
            out.push(Target {
                name: "rows: API inserted + parked vs accepted".into(),
                figure: settled.to_string(),
                reference: accepted.to_string(),
                ratio: (accepted > 0).then(|| settled as f64 / accepted as f64),
                wanted: "= 1.00",
                met: Some(api_runs.iter().all(|m| m.accounted() == Some(true))),
            });
        }
        out
    }

    pub fn table(&self) -> String {
        let c = &self.context;
        let mut s = String::new();
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "sluice-bench: {} rows x {} B, pull_batch {}, batch_rows {}, max_ack_pending {}, {} rows per message (batched), {} per request x {} at once (api){}",
            c.rows,
            c.row_bytes,
            c.pull_batch,
            c.batch_rows,
            c.max_ack_pending,
            c.message_rows,
            c.request_rows,
            c.load_concurrency,
            if c.sets.is_empty() {
                String::new()
            } else {
                format!(", {}", c.sets.join(" "))
            }
        );
        let _ = writeln!(
            s,
            "nats-server {} · ClickHouse {} · {} · {} CPUs · kernel {} · load at end {}",
            c.nats_version,
            c.clickhouse_version,
            c.sluice_version,
            c.cpus,
            c.kernel,
            load(c.load_at_end)
        );
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{:<10} {:>3} {:>8} {:>7} {:>8} {:>8} {:>7} {:>7} {:>7} {:>7} {:>6} {:>6} {:>6} {:>5} {:>4}",
            "phase",
            "run",
            "rows",
            "secs",
            "rows/s",
            "10→90%",
            "cpu/row",
            "nats",
            "ch",
            "RSS",
            "start",
            "others",
            "load1",
            "lost",
            "dup"
        );
        let _ = writeln!(
            s,
            "{:<10} {:>3} {:>8} {:>7} {:>8} {:>8} {:>7} {:>7} {:>7} {:>7} {:>6} {:>6} {:>6} {:>5} {:>4}",
            "", "", "", "", "", "rows/s", "µs", "µs/row", "µs/row", "MiB", "s", "cores", "", "", ""
        );
        for m in &self.runs {
            let _ = writeln!(
                s,
                "{:<10} {:>3} {:>8} {:>7.2} {:>8.0} {:>8} {:>7} {:>7} {:>7} {:>7} {:>6} {:>6} {:>6} {:>5} {:>4}",
                m.phase,
                m.run,
                m.published,
                m.seconds,
                m.rows_per_sec,
                rate(m.bulk_rows_per_sec),
                opt(m.cpu_us_per_row, 2),
                opt(m.nats_us_per_row, 2),
                opt(m.clickhouse_us_per_row, 2),
                opt(m.peak_rss.map(|b| b as f64 / MIB), 1),
                opt(m.startup_seconds, 2),
                opt(m.others_cores, 2),
                opt(m.load_before.map(|l| l[0]), 2),
                m.lost,
                m.duplicates
            );
            if let Some(d) = m.drain_rows_per_sec {
                let _ = writeln!(
                    s,
                    "{:<10}     outage {} s, ClickHouse up → first rows {} s, then {:.0} rows/s to the last row, RSS during outage {} MiB",
                    "",
                    opt(m.outage_seconds, 1),
                    opt(m.recovery_seconds, 2),
                    d,
                    opt(m.rss_during_outage.map(|b| b as f64 / MIB), 1)
                );
            }
            if !m.sluice_counters.is_empty() {
                let sum = |prefix: &str, label: &str| m.counter(prefix, label);
                let inserts = sum("sluice_insert_requests_total", "");
                let ok = sum("sluice_insert_requests_total", "outcome=\"ok\"");
                let batches = sum("sluice_batch_rows_count", "");
                let batch_rows = sum("sluice_batch_rows_sum", "");
                let handed_back = sum("sluice_retries_total", "");
                let _ = writeln!(
                    s,
                    "{:<10}     sluice: {inserts:.0} insert requests ({ok:.0} ok), {batches:.0} flushes of {:.0} rows on average, {handed_back:.0} rows handed back{}",
                    "",
                    if batches > 0.0 { batch_rows / batches } else { 0.0 },
                    m.idle_cpu_percent
                        .map(|p| format!("; idle afterwards: {p:.1}% of a core"))
                        .unwrap_or_default(),
                );
            }
            if let Some(note) = &m.note {
                let _ = writeln!(s, "{:<10}     {note}", "");
            }
            if let Some(per) = m.rows_per_message().filter(|r| *r > 1.0) {
                let _ = writeln!(s, "{:<10}     {per:.1} rows per message", "");
            }
            if let Some(accepted) = m.accepted {
                let _ = writeln!(
                    s,
                    "{:<10}     load generator: {accepted} rows accepted ({} inserted + {} parked), {} answers 503 resent, its CPU {} µs/row (not in cpu/row)",
                    "",
                    m.inserted_distinct,
                    m.parked,
                    m.load_unavailable,
                    opt(m.loader_us_per_row, 2)
                );
            }
            if m.phase == "live" {
                let _ = writeln!(
                    s,
                    "{:<10}     publishing took {} s (rows/s counted from the first publish)",
                    "",
                    opt(m.publish_seconds, 2)
                );
            }
            if m.bad_rows > 0 {
                let _ = writeln!(
                    s,
                    "{:<10}     {} bad rows parked, {} good rows inserted",
                    "", m.bad_rows, m.inserted_distinct
                );
            }
        }
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{:<44} {:>10} {:>28} {:>6} {:>8}  met",
            "target", "figure", "reference", "ratio", "wanted"
        );
        for t in self.targets() {
            let _ = writeln!(
                s,
                "{:<44} {:>10} {:>28} {:>6} {:>8}  {}",
                t.name,
                t.figure,
                t.reference,
                opt(t.ratio, 2),
                t.wanted,
                match t.met {
                    Some(true) => "yes",
                    Some(false) => "NO",
                    None => "-",
                }
            );
        }
        if self.runs.iter().any(|m| m.run > 1) {
            let used: Vec<String> = self
                .runs_used()
                .iter()
                .map(|(p, runs)| {
                    let runs: Vec<String> = runs.iter().map(|r| r.to_string()).collect();
                    format!("{p} {}", runs.join("+"))
                })
                .collect();
            let _ = writeln!(
                s,
                "figures: median of each phase's least disturbed runs ({}); peak RSS: every run",
                used.join(", ")
            );
        }
        let _ = writeln!(
            s,
            "\nrows/s: first delivery → last row counted in ClickHouse (outage: ClickHouse up → last row; \
             live: first publish → last row). 10→90%: the slope between 10% and 90% of the rows counted \
             (the rate without start-up, breaker probe and the tail's last partial batch). cpu: the \
             process's utime+stime over the first window ÷ rows. nats/ch: the servers' CPU per row. \
             others: cores used by processes outside the benchmark. api, api-unbatched: first \
             request → last row counted, publishing included (the load generator's CPU apart)."
        );
        s
    }

    pub fn json(&self) -> Value {
        let c = &self.context;
        let r3 = |v: Option<f64>| v.map(|v| (v * 1000.0).round() / 1000.0);
        let runs: Vec<Value> = self
            .runs
            .iter()
            .map(|m| {
                json!({
                    "phase": m.phase,
                    "run": m.run,
                    "rows": m.published,
                    "bad_rows": m.bad_rows,
                    "seconds": r3(Some(m.seconds)),
                    "rows_per_sec": r3(Some(m.rows_per_sec)),
                    "rows_per_sec_10_to_90": r3(m.bulk_rows_per_sec),
                    "cpu_us_per_row": r3(m.cpu_us_per_row),
                    "cpu_sys_us_per_row": r3(m.sys_us_per_row),
                    "cpu_total_seconds": r3(m.cpu_total_seconds),
                    "nats_cpu_us_per_row": r3(m.nats_us_per_row),
                    "clickhouse_cpu_us_per_row": r3(m.clickhouse_us_per_row),
                    "bench_cpu_us_per_row": r3(m.bench_us_per_row),
                    "load_generator_cpu_us_per_row": r3(m.loader_us_per_row),
                    "rows_per_message": r3(m.rows_per_message()),
                    "accepted": m.accepted,
                    "answers_503": m.accepted.map(|_| m.load_unavailable),
                    "parked": m.parked,
                    "note": m.note,
                    "other_processes_cores": r3(m.others_cores),
                    "peak_rss_bytes": m.peak_rss,
                    "rss_during_outage_bytes": m.rss_during_outage,
                    "startup_seconds": r3(m.startup_seconds),
                    "publish_seconds": r3(m.publish_seconds),
                    "outage_seconds": r3(m.outage_seconds),
                    "recovery_seconds": r3(m.recovery_seconds),
                    "drain_rows_per_sec": r3(m.drain_rows_per_sec),
                    "load_before": m.load_before,
                    "load_after": m.load_after,
                    "inserted_distinct": m.inserted_distinct,
                    "duplicates": m.duplicates,
                    "lost": m.lost,
                    "idle_cpu_percent": r3(m.idle_cpu_percent),
                    "progress": m.progress,
                    "sluice_metrics": m
                        .sluice_counters
                        .iter()
                        .map(|(k, v)| (k.clone(), json!(v)))
                        .collect::<serde_json::Map<String, Value>>(),
                })
            })
            .collect();
        let targets: Vec<Value> = self
            .targets()
            .iter()
            .map(|t| {
                json!({
                    "target": t.name,
                    "figure": t.figure,
                    "reference": t.reference,
                    "ratio": t.ratio.map(|v| (v * 1000.0).round() / 1000.0),
                    "wanted": t.wanted,
                    "met": t.met,
                })
            })
            .collect();
        json!({
            "settings": {
                "rows": c.rows,
                "row_bytes": c.row_bytes,
                "pull_batch": c.pull_batch,
                "batch_rows": c.batch_rows,
                "max_ack_pending": c.max_ack_pending,
                "outage_seconds": c.outage_secs,
                "bad_every": c.bad_every,
                "message_rows": c.message_rows,
                "request_rows": c.request_rows,
                "load_concurrency": c.load_concurrency,
                "sluice_overrides": c.sets,
                "sluice_config": c.sluice_config,
            },
            "versions": {
                "nats_server": c.nats_version,
                "clickhouse": c.clickhouse_version,
                "sluice": c.sluice_version,
            },
            "machine": {
                "cpus": c.cpus,
                "kernel": c.kernel,
                "load_at_end": c.load_at_end,
            },
            "runs": runs,
            "targets": targets,
            "target_figures_from_runs": self
                .runs_used()
                .iter()
                .map(|(p, r)| (p.to_string(), json!(r)))
                .collect::<serde_json::Map<String, Value>>(),
        })
    }
}

fn load(l: Option<[f64; 3]>) -> String {
    l.map(|l| format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2]))
        .unwrap_or_else(|| "-".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_disturbed_by_other_processes_does_not_decide() {
        let run = |phase: &'static str, run: usize, rate: f64, others: f64| Measured {
            phase,
            run,
            rows_per_sec: rate,
            bulk_rows_per_sec: Some(rate),
            others_cores: Some(others),
            ..Default::default()
        };
        let context = Context {
            rows: 1,
            row_bytes: 1,
            pull_batch: 1,
            batch_rows: 1,
            max_ack_pending: 1,
            outage_secs: 1,
            bad_every: 1,
            message_rows: 1,
            request_rows: 1,
            load_concurrency: 1,
            sets: vec![],
            nats_version: String::new(),
            clickhouse_version: String::new(),
            sluice_version: String::new(),
            sluice_config: String::new(),
            cpus: 2,
            kernel: String::new(),
            load_at_end: None,
        };
        let report = Report::new(
            context,
            vec![
                run("sluice", 1, 140.0, 0.0),
                run("outage", 1, 150.0, 0.02),
                run("sluice", 2, 160.0, 0.05),
                run("outage", 2, 90.0, 0.94),
            ],
        );
        assert_eq!(report.med("sluice", |m| Some(m.rows_per_sec)), Some(150.0));
        assert_eq!(report.med("outage", |m| Some(m.rows_per_sec)), Some(150.0));
        assert_eq!(
            report.runs_used(),
            vec![("sluice", vec![1, 2]), ("outage", vec![1])]
        );
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }
}
