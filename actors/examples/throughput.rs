//! Throughput micro-check of the actor layer alone (not a timed test): pushes 1,000,000
//! fake rows through the whole tree (consumer → pool → tables → flush tasks) with an
//! instant fake inserter and a counting fake delivery, and prints rows/s, CPU µs per row
//! and heap allocations per row.
//!
//!     cargo run --release -p sluice-actors --example throughput [ROWS]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_actors::testkit::{FakeQueue, FakeSourceFactory, Journal, ScriptedInserter};
use sluice_actors::*;

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(l.size() as u64, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(n as u64, Ordering::Relaxed);
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// utime + stime of this process, from /proc (Linux), in seconds.
fn cpu_seconds() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().ok()? + f[12].parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn main() {
    let rows: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let queue = FakeQueue::new();
        let journal = Journal::counting();
        // Rows of ~110 bytes over 4 tables, in runs as a real stream interleaves them.
        let subjects: Vec<Arc<str>> = (0..4).map(|i| Arc::from(format!("ingest.acme.t{i}"))).collect();
        let payload = |i: usize| {
            format!("{{\"ts\":\"2026-11-30T12:00:00.000Z\",\"user\":{i},\"event\":\"click\",\"page\":\"/a/b/c\",\"ms\":{}}}", i % 977)
        };
        let deliveries: Vec<_> = (0..rows).map(|i| journal.delivery(&subjects[(i / 250) % 4], payload(i))).collect();
        queue.push(deliveries);
        let ins = ScriptedInserter::instant();
        let settings = PipelineSettings { pull_batch: 1000, ..Default::default() };
        let (a0, b0, c0) = (ALLOCS.load(Ordering::Relaxed), BYTES.load(Ordering::Relaxed), cpu_seconds());
        let t0 = Instant::now();
        let handle = start(PipelineConfig {
            source: FakeSourceFactory { queue: queue.clone() },
            targets: vec![Target::new("main", ins.clone())],
            tenants: [("acme".to_string(), "main".to_string())].into(),
            tables: TableSettingsResolver::new(TableSettings { batch_age: Duration::from_millis(200), ..Default::default() }),
            settings,
            manifests: None,
        })
        .await
        .unwrap();
        while journal.acked() < rows as u64 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let wall = t0.elapsed();
        let (a1, b1, c1) = (ALLOCS.load(Ordering::Relaxed), BYTES.load(Ordering::Relaxed), cpu_seconds());
        handle.shutdown().await;
        let n = rows as f64;
        println!("rows:                 {rows}");
        println!("inserts:              {} ({} rows each on average)", ins.request_count(), rows / ins.request_count().max(1));
        println!("wall:                 {:.3} s", wall.as_secs_f64());
        println!("rows/s:               {:.0}", n / wall.as_secs_f64());
        println!("wall µs per row:      {:.3}", wall.as_secs_f64() * 1e6 / n);
        if let (Some(c0), Some(c1)) = (c0, c1) {
            println!("cpu µs per row:       {:.3} (utime+stime, 10 ms ticks)", (c1 - c0) * 1e6 / n);
        }
        println!("allocations per row:  {:.3}", (a1 - a0) as f64 / n);
        println!("allocated B per row:  {:.1} (the body copy is ~{} B)", (b1 - b0) as f64 / n, payload(1).len() + 1);
    });
}
