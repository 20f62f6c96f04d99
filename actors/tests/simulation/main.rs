//! The batch ledger searched, not shown by example: a deterministic simulation of
//! several Sluice instances (the real actor tree, `sluice_actors::start`) over faithful
//! fakes of JetStream, the manifest bucket and ClickHouse, with faults at random, all
//! of it driven by one seed on a paused clock (see docs/architecture.md, "The ledger
//! searched").
//!
//! `cargo test -p sluice-actors --test simulation` runs the CI budget of seeds;
//! `SIM_SEED=n` replays seed n exactly (and prints what it did); `SIM_SEEDS=n` soaks
//! seeds 0..n (`SIM_FIRST=k` starts at k); `SIM_THREADS` how many run at once.

mod check;
mod clickhouse;
mod coverage;
mod dice;
mod kv;
mod mark;
mod net;
mod plan;
mod store;
mod stream;
mod world;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use coverage::Coverage;

/// The seeds a CI run plays.
const CI_SEEDS: u64 = 1_000;
/// Fewer seeds than this (a replay, a quick try) are not held to the coverage.
const COVERAGE_FROM: u64 = 200;

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a number")),
    )
}

/// Play one seed on its own paused, single-threaded runtime.
fn play(seed: u64) -> (Result<(), String>, Arc<Coverage>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    let played = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(world::run(seed))
    }));
    drop(rt);
    played.unwrap_or_else(|panic| {
        let text = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        (
            Err(format!("the simulation panicked: {text}")),
            Arc::default(),
        )
    })
}

/// What a run of seeds found.
struct Outcome {
    coverage: Coverage,
    /// The failing seeds, lowest first, with what went wrong.
    failures: Vec<(u64, String)>,
    played: u64,
}

/// Play `seeds` on `threads` threads; a failure stops the seeds above it.
fn play_all(first: u64, count: u64, threads: usize) -> Outcome {
    let next = AtomicU64::new(first);
    let lowest_failure = AtomicU64::new(u64::MAX);
    let played = AtomicU64::new(0);
    let coverage = Coverage::default();
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= first + count || seed > lowest_failure.load(Ordering::Relaxed) {
                    return;
                }
                let (verdict, cov) = play(seed);
                played.fetch_add(1, Ordering::Relaxed);
                coverage.add(&cov);
                if let Err(e) = verdict {
                    lowest_failure.fetch_min(seed, Ordering::Relaxed);
                    failures
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((seed, e));
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap_or_else(|e| e.into_inner());
    failures.sort();
    Outcome {
        coverage,
        failures,
        played: played.into_inner(),
    }
}

#[test]
fn seeds_keep_every_row_once() {
    if let Some(seed) = env_u64("SIM_SEED") {
        let (verdict, cov) = play(seed);
        println!("seed {seed}: trace {:016x}\n{}", cov.digest(), cov.report());
        if let Err(e) = verdict {
            panic!("SIM_SEED={seed}: {e}");
        }
        return;
    }
    let first = env_u64("SIM_FIRST").unwrap_or(0);
    let count = env_u64("SIM_SEEDS").unwrap_or(CI_SEEDS);
    let threads = env_u64("SIM_THREADS").map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        |n| n.max(1) as usize,
    );
    let started = Instant::now();
    let out = play_all(first, count, threads);
    println!(
        "simulation: {} seeds ({first}..{}) in {:.1} s on {threads} threads\ncoverage (* must be reached):\n{}",
        out.played,
        first + count,
        started.elapsed().as_secs_f64(),
        out.coverage.report()
    );
    if let Some((seed, e)) = out.failures.first() {
        panic!("SIM_SEED={seed}: {e}");
    }
    let missing = out.coverage.missing();
    if count >= COVERAGE_FROM && !missing.is_empty() {
        panic!("{count} seeds never reached: {}", missing.join(", "));
    }
}

/// A seed replays exactly: the same trace of what the servers saw, twice.
#[test]
fn a_seed_replays_exactly() {
    for seed in [1, 2, 3] {
        let (_, a) = play(seed);
        let (_, b) = play(seed);
        assert_eq!(a.digest(), b.digest(), "seed {seed} played twice differs");
    }
}
