//! Crashes, reconnects, readiness, shutdown: the tree survives and loses nothing.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use sluice_actors::testkit::{refused, Event, FakeQueue, FakeSourceFactory, ScriptedInserter};
use sluice_actors::*;

const SUBJ: &str = "ingest.acme.events";

#[tokio::test(start_paused = true)]
async fn a_table_actor_panic_is_survived_and_its_rows_are_handed_back() {
    let r = simple(10).await;
    let held = r.push(SUBJ, 4, &[]);
    assert!(
        r.until(Duration::from_secs(2), |r| r
            .table("acme.events")
            .is_some_and(|t| t["state"]["buffered_rows"] == 4))
            .await
    );
    r.handle
        .inject_panic(&TableKey::new("acme", "events"))
        .await
        .unwrap();
    // Every buffered row is handed back (dropped unsettled → the adapter naks it).
    r.settled(4).await;
    for s in held {
        assert_eq!(r.journal.terminal(s), vec![Event::DroppedUnsettled]);
    }
    assert_eq!(r.journal.parked(), 0);
    assert!(
        r.until(Duration::from_secs(5), |r| r
            .table("acme.events")
            .is_some_and(|t| t["restarts"] == 1 && t["status"] == "running"))
            .await,
        "{}",
        r.handle.tree_json()
    );
    // Later rows flow normally.
    r.push(SUBJ, 10, &[]);
    r.settled(14).await;
    assert_eq!(r.journal.acked(), 10);
    assert!(r.journal.not_settled_once().is_empty());
    r.handle.shutdown().await;
}

/// Waits until the `kind` node named `main` was restarted once and runs again.
async fn restarted_once(r: &Rig, kind: &str) {
    assert!(
        r.until(Duration::from_secs(5), |r| r
            .node(kind, "main")
            .is_some_and(|p| p["restarts"] == 1 && p["status"] == "running"))
            .await,
        "{}",
        r.handle.tree_json()
    );
}

/// Three rows buffered in table `clicks` (under its batch size): their sequences.
async fn three_buffered_in_clicks(r: &Rig) -> Vec<u64> {
    let held = r.push("ingest.acme.clicks", 3, &[]);
    assert!(
        r.until(Duration::from_secs(1), |r| r
            .table("acme.clicks")
            .is_some_and(|t| t["state"]["buffered_rows"] == 3))
            .await
    );
    held
}

#[tokio::test(start_paused = true)]
async fn a_target_actor_panic_is_survived_and_a_flight_in_progress_still_settles_and_reports() {
    let r = simple(10).await;
    // One flight in the air (slow insert), and rows buffered in another table.
    r.main().set_latency(Duration::from_secs(2));
    let flying = r.push(SUBJ, 10, &[]);
    let held = three_buffered_in_clicks(&r).await;
    r.handle.inject_target_panic("main").await.unwrap();
    r.settled(13).await;
    for s in held {
        assert_eq!(r.journal.terminal(s), vec![Event::DroppedUnsettled]);
    }
    // The flight owned its rows: they were inserted and acked although its actors died.
    for s in flying {
        assert_eq!(r.journal.terminal(s), vec![Event::Acked]);
    }
    restarted_once(&r, "target").await;
    r.main().set_latency(Duration::ZERO);
    r.push(SUBJ, 10, &[]);
    r.settled(23).await;
    assert_eq!(r.journal.acked(), 20);
    assert_eq!(r.journal.parked(), 0);
    r.handle.shutdown().await;
}

/// A server's pool dies: its tables keep their rows (it supervises none), its target
/// respawns it and the rows keep landing.
#[tokio::test(start_paused = true)]
async fn a_pool_actor_panic_is_survived_and_its_tables_keep_their_rows() {
    let r = simple(10).await;
    let held = three_buffered_in_clicks(&r).await;
    r.handle.inject_pool_panic("main").await.unwrap();
    restarted_once(&r, "pool").await;
    assert!(held.iter().all(|s| r.journal.terminal(*s).is_empty()));
    r.push(SUBJ, 10, &[]);
    r.settled(10).await;
    assert_eq!(r.journal.acked(), 10);
    assert!(r
        .table("acme.clicks")
        .is_some_and(|t| t["restarts"] == 0 && t["state"]["buffered_rows"] == 3));
    r.handle.shutdown().await;
    assert!(held
        .iter()
        .all(|s| r.journal.terminal(*s) == vec![Event::Acked]));
}

/// A pool dies with a table's request for a flight in its mailbox (CI's `pool_panic`
/// chaos run: 4,000 rows stayed buffered with no flight for 90 s): the table does not
/// wait for that answer. Its batch goes back to JetStream while the pool restarts (as
/// any batch does then), and once JetStream redelivers it, it lands.
#[tokio::test(start_paused = true)]
async fn a_request_for_a_flight_lost_with_its_pool_is_not_waited_for() {
    let r = simple(10).await;
    r.handle
        .inject_pool_panic_on_next_flight_request("main")
        .await
        .unwrap();
    let rows = r.push(SUBJ, 10, &[]);
    r.settled(10).await;
    let restarting = settings().handback_while_restarting;
    for s in &rows {
        assert_eq!(r.journal.terminal(*s), vec![Event::Naked(restarting)]);
    }
    restarted_once(&r, "pool").await;
    // JetStream redelivers the batch to the table, which asks the new pool.
    r.queue
        .push(rows.iter().map(|s| r.journal.redeliver(*s, 2)));
    r.settled(20).await;
    assert_eq!(r.journal.acked(), 10);
    assert_eq!(r.main().rows_inserted(), 10);
    r.handle.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_flight_outliving_its_pool_still_opens_the_breaker() {
    let r = simple(5).await;
    r.main().set_latency(Duration::from_secs(2));
    r.main().set_default(Some(refused("connection refused")));
    r.push(SUBJ, 5, &[]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    r.handle.inject_pool_panic("main").await.unwrap();
    r.settled(5).await;
    assert!(
        r.until(Duration::from_secs(3), |r| r.pool_state("main") == "open")
            .await,
        "{}",
        r.handle.tree_json()
    );
    r.handle.shutdown().await;
}

/// A flight that panics (a bug in it) does not stop its table: the table hears it is
/// done, the rows it held go back (dropped, so naked) and, delivered again, land; the
/// table flies on. Without that, the table counted the flight out for ever and kept its
/// messages from flying again.
#[tokio::test(start_paused = true)]
async fn a_flight_that_panics_gives_its_rows_back_and_its_table_flies_on() {
    let r = simple(5).await;
    let first = std::sync::atomic::AtomicBool::new(true);
    r.main().rule(move |_| {
        assert!(
            !first.swap(false, Ordering::Relaxed),
            "injected: a bug in the first insert"
        );
        None
    });
    let seqs = r.push(SUBJ, 5, &[]);
    assert!(
        r.until(Duration::from_secs(10), |r| {
            seqs.iter()
                .all(|s| r.journal.terminal(*s) == vec![Event::DroppedUnsettled])
        })
        .await,
        "{:?}",
        r.journal.events()
    );
    assert!(
        r.until(Duration::from_secs(10), |r| r
            .table("acme.events")
            .is_some_and(|t| t["state"]["flights"] == 0
                && t["state"]["last_error"].as_str().is_some_and(
                    |e| e.contains("a flight panicked while inserting")
                )))
        .await,
        "{:?}",
        r.table("acme.events")
    );
    r.queue
        .push(seqs.iter().map(|s| r.journal.redeliver(*s, 2)));
    assert!(
        r.until(Duration::from_secs(30), |r| seqs.iter().all(|s| r
            .journal
            .terminal(*s)
            .last()
            == Some(&Event::Acked)))
            .await,
        "{:?}",
        r.journal.events()
    );
    assert_eq!(r.main().rows_inserted(), 5);
}

#[tokio::test(start_paused = true)]
async fn a_consumer_panic_is_survived() {
    let r = simple(5).await;
    r.handle.inject_consumer_panic().await.unwrap();
    assert!(
        r.until(Duration::from_secs(5), |r| r
            .node("consumer", "INGEST")
            .is_some_and(|c| c["restarts"] == 1)
            && r.handle.readiness().is_ok())
            .await
    );
    r.push(SUBJ, 5, &[]);
    r.settled(5).await;
    assert_eq!(r.journal.acked(), 5);
    r.handle.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_source_failure_reconnects_and_resumes() {
    let r = simple(5).await;
    r.queue.fail_pulls.store(1, Ordering::Relaxed);
    r.queue.fail_connects.store(2, Ordering::Relaxed);
    assert!(
        r.until(Duration::from_secs(1), |r| r.handle.readiness().is_err())
            .await
    );
    let c = r.node("consumer", "INGEST").unwrap();
    assert_eq!(c["state"]["connected"], false);
    assert!(c["state"]["last_error"]
        .as_str()
        .unwrap()
        .contains("scripted"));
    assert!(
        r.until(Duration::from_secs(10), |r| r.handle.readiness().is_ok())
            .await
    );
    assert_eq!(r.queue.connects.load(Ordering::Relaxed), 4);
    // The lag is polled every few seconds.
    r.queue.pending.store(42, Ordering::Relaxed);
    assert!(
        r.until(Duration::from_secs(10), |r| r
            .node("consumer", "INGEST")
            .is_some_and(|c| c["state"]["pending"] == 42))
            .await
    );
    r.push(SUBJ, 5, &[]);
    r.settled(5).await;
    assert_eq!(r.journal.acked(), 5);
    r.handle.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn readiness_waits_for_each_pools_first_probe_and_the_tree_shows_the_breaker() {
    let queue = FakeQueue::new();
    let ins = ScriptedInserter::new();
    ins.set_probe(Some(refused("connection refused")));
    let handle = start(PipelineConfig {
        source: FakeSourceFactory {
            queue: queue.clone(),
        },
        targets: vec![Target::new("main", ins.clone())],
        tenants: [("acme".to_string(), "main".to_string())].into(),
        tables: tables(2),
        settings: settings(),
        manifests: None,
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let reasons = handle.readiness().unwrap_err();
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(
        reasons[0].starts_with("target main: not probed yet"),
        "{reasons:?}"
    );
    assert!(ins.probe_count() >= 2, "the probe is retried");
    ins.set_probe(None);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while handle.readiness().is_err() {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The tree: breaker open while inserts fail, closed after.
    let journal = sluice_actors::testkit::Journal::new();
    ins.set_default(Some(refused("connection refused")));
    queue.push(journal.rows(SUBJ, 2));
    // root > target > pool: the server's breaker.
    let breaker = |h: &PipelineHandle<_>| {
        let tree = h.tree_json();
        let target = tree["children"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["kind"] == "target" && c["name"] == "main")
            .unwrap()
            .clone();
        target["children"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["kind"] == "pool")
            .unwrap()["state"]["breaker"]
            .clone()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while breaker(&handle)["state"] != "open" {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let b = breaker(&handle);
    assert!(b["window_remaining_ms"].as_u64().unwrap() <= 1000);
    assert!(b["window_until"].as_str().unwrap().ends_with('Z'));
    assert!(b["last_error"].as_str().unwrap().contains("refused"));
    ins.set_default(None);
    tokio::time::sleep(Duration::from_secs(1)).await;
    queue.push(journal.rows(SUBJ, 2));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while breaker(&handle)["state"] != "closed" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            handle.tree_json()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(journal.acked(), 2);
    handle.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_idle_pool_closes_its_breaker_by_probing_itself() {
    let mut s = settings();
    s.idle_probe_after = Duration::from_secs(1);
    let r = rig(&["main"], &[("acme", "main")], tables(2), s).await;
    r.main().set_default(Some(refused("refused")));
    r.push(SUBJ, 2, &[]);
    r.settled(2).await;
    assert!(
        r.until(Duration::from_secs(2), |r| r.pool_state("main") == "open")
            .await
    );
    r.main().set_default(None);
    assert!(
        r.until(Duration::from_secs(5), |r| r.pool_state("main") == "closed")
            .await
    );
    r.handle.shutdown().await;
}

/// No traffic at all, and ClickHouse goes down: the pool's idle probe (every
/// `idle_probe_every`) notices, so the admin page and the breaker gauge say so; when it
/// comes back, the next probe closes the window again.
#[tokio::test(start_paused = true)]
async fn a_target_that_goes_down_while_idle_shows_as_down() {
    let mut s = settings();
    s.idle_probe_every = Duration::from_secs(10);
    s.idle_probe_after = Duration::from_secs(1);
    let r = rig(&["main"], &[("acme", "main")], tables(2), s).await;
    let probes = r.main().probe_count();
    r.main().set_probe(Some(refused("connection refused")));
    assert!(
        r.until(Duration::from_secs(15), |r| r.pool_state("main") == "open")
            .await,
        "{}",
        r.handle.tree_json()
    );
    assert!(r.main().probe_count() > probes);
    assert_eq!(
        r.main().request_count(),
        0,
        "no insert was needed to find out"
    );
    r.main().set_probe(None);
    assert!(
        r.until(Duration::from_secs(10), |r| r.pool_state("main")
            == "closed")
            .await
    );
    // And while it answers, the idle probe is modest: about one per interval.
    let before = r.main().probe_count();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let spent = r.main().probe_count() - before;
    assert!((5..=7).contains(&spent), "{spent} probes in a quiet minute");
    r.handle.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_flushes_every_buffer_now() {
    let r = simple(1000).await;
    r.push(SUBJ, 7, &[]);
    r.push("ingest.acme.clicks", 5, &[]);
    assert!(
        r.until(Duration::from_secs(2), |r| r.handle.stats().received == 12)
            .await
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let summary = r.handle.shutdown().await;
    assert_eq!(summary.rows_flushed, 12);
    assert_eq!(summary.rows_handed_back, 0);
    assert!(!summary.deadline_hit);
    assert_eq!(r.journal.acked(), 12);
    assert!(r.journal.not_settled_once().is_empty());
}

#[tokio::test(start_paused = true)]
async fn shutdown_past_its_deadline_hands_back_what_is_still_in_flight() {
    let mut s = settings();
    s.shutdown_deadline = Duration::from_secs(3);
    let r = rig(&["main"], &[("acme", "main")], tables(1000), s).await;
    r.main().set_latency(Duration::from_secs(3600));
    r.push(SUBJ, 6, &[]);
    assert!(
        r.until(Duration::from_secs(2), |r| r.handle.stats().received == 6)
            .await
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let summary = r.handle.shutdown().await;
    assert!(summary.deadline_hit);
    assert_eq!(summary.rows_handed_back, 6);
    assert_eq!(r.journal.nak_delays().len(), 6);
    assert!(r.journal.nak_delays().iter().all(|(_, d)| d.is_zero()));
    assert!(r.journal.not_settled_once().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_core_actor_that_cannot_be_respawned_makes_the_pipeline_fatal() {
    let r = simple(5).await;
    assert!(r.handle.fatal_reason().is_none());
    r.handle.fail_spawns("target", 100);
    r.handle.inject_target_panic("main").await.unwrap();
    let why = tokio::time::timeout(Duration::from_secs(60), r.handle.fatal())
        .await
        .expect("fatal in time");
    assert!(why.contains("could not be spawned 5 times"), "{why}");
}

#[tokio::test(start_paused = true)]
async fn an_idle_table_is_reaped_and_comes_back_on_its_next_row() {
    let mut s = settings();
    s.idle_table_after = Duration::from_secs(5);
    let r = rig(&["main"], &[("acme", "main")], tables(2), s).await;
    r.push(SUBJ, 2, &[]);
    r.settled(2).await;
    assert!(r.table("acme.events").is_some());
    assert!(
        r.until(Duration::from_secs(10), |r| r
            .table("acme.events")
            .is_none())
            .await,
        "{}",
        r.handle.tree_json()
    );
    r.push(SUBJ, 2, &[]);
    r.settled(4).await;
    assert_eq!(r.journal.acked(), 4);
    assert!(r.table("acme.events").is_some_and(|t| t["restarts"] == 0));
    r.handle.shutdown().await;
}

/// Rows keep arriving while the table panics again and again: each crash is counted
/// once. A row routed to the dead table before its supervision event reached the pool
/// must not respawn it behind the pool's back (the restart then went uncounted, and
/// without its backoff).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_table_panic_is_counted_while_rows_keep_arriving() {
    let mut settings = settings();
    settings.restart.initial = Duration::from_millis(1);
    settings.restart.max = Duration::from_millis(2);
    let r = rig(&["main"], &[("acme", "main")], tables(1000), settings).await;
    let key = TableKey::new("acme", "events");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pusher = {
        let (queue, journal, stop) = (r.queue.clone(), r.journal.clone(), stop.clone());
        let subject: std::sync::Arc<str> = std::sync::Arc::from(SUBJ);
        tokio::spawn(async move {
            for i in 0..200_000u32 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                queue.push(vec![journal.delivery(&subject, format!("{{\"n\":{i}}}"))]);
                tokio::task::yield_now().await;
            }
        })
    };
    for k in 1..=40u64 {
        assert!(
            r.until(Duration::from_secs(5), |r| r
                .table("acme.events")
                .is_some_and(|t| t["status"] == "running"))
                .await,
            "{}",
            r.handle.tree_json()
        );
        // The table may be between a crash and its respawn: try again shortly.
        let mut injected = false;
        for _ in 0..500 {
            if r.handle.inject_panic(&key).await.is_ok() {
                injected = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert!(injected, "panic {k} could not be injected");
        assert!(
            r.until(Duration::from_secs(5), |r| r
                .table("acme.events")
                .is_some_and(|t| t["restarts"] == k))
                .await,
            "panic {k}: {}",
            r.handle.tree_json()
        );
    }
    stop.store(true, Ordering::Relaxed);
    pusher.await.unwrap();
    // Whichever way the crash was noticed, the tree shows its reason.
    assert!(
        r.until(Duration::from_secs(5), |r| r
            .table("acme.events")
            .is_some_and(|t| t["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("injected panic"))))
            .await,
        "{}",
        r.handle.tree_json()
    );
    r.handle.shutdown().await;
}
