//! The ingest contract, end to end through the actor tree, on fakes, time paused.

mod common;

use std::time::Duration;

use common::*;
use sluice_actors::testkit::{
    denied, lost, refused, rejected, status, timed_out, unavailable, Event,
};
use sluice_actors::*;

const SUBJ: &str = "ingest.acme.events";

fn no_parks(r: &Rig) {
    assert_eq!(
        r.journal.parked(),
        0,
        "nothing may be parked: {:?}",
        r.journal.parkings()
    );
}

#[tokio::test(start_paused = true)]
async fn availability_failures_in_eleven_shapes_never_park_and_nak_with_a_delay() {
    let shapes: Vec<(&str, ClickHouseError, usize, usize)> = vec![
        ("refused", refused("connection refused"), 5, 1),
        ("reset", lost("connection reset by peer"), 5, 1),
        ("timeout", timed_out("operation timed out"), 5, 1),
        ("503 no code", status(503, Class::Unavailable), 5, 1),
        ("159", unavailable(159), 5, 1),
        ("210", unavailable(210), 5, 1),
        ("241 one row", unavailable(241).splittable(), 1, 1),
        (
            "252 one row",
            unavailable(252).table_scoped().splittable(),
            1,
            1,
        ),
        ("319", unavailable(319), 5, 1),
        ("745", unavailable(745), 5, 1),
        ("999", unavailable(999), 5, 1),
        // A splittable code on a multi-row batch: the split's first row fails the same way.
        ("241 multi-row", unavailable(241).splittable(), 5, 2),
        (
            "252 multi-row",
            unavailable(252).table_scoped().splittable(),
            5,
            2,
        ),
    ];
    for (name, err, rows, requests) in shapes {
        let r = simple(rows).await;
        r.main().set_default(Some(err.clone()));
        r.push(SUBJ, rows, &[]);
        r.settled(rows as u64).await;
        no_parks(&r);
        assert_eq!(r.journal.naked(), rows as u64, "{name}");
        for (_, d) in r.journal.nak_delays() {
            assert!(
                d > Duration::ZERO && d <= Duration::from_secs(1),
                "{name}: delay {d:?}"
            );
        }
        assert_eq!(r.main().request_count(), requests, "{name}");
        // The right breaker opened: the table's own for a table-scoped code, else the pool's.
        let ok = r
            .until(Duration::from_secs(3), |r| {
                if err.table_scoped {
                    r.table_backoff("acme.events") == "open" && r.pool_state("main") == "closed"
                } else {
                    r.pool_state("main") == "open"
                }
            })
            .await;
        assert!(ok, "{name}: {}", r.handle.tree_json());
        r.handle.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_batch_refused_for_its_size_is_split_and_every_row_lands_with_no_backoff() {
    for (c, err) in [
        (252, unavailable(252).table_scoped().splittable()),
        (241, unavailable(241).splittable()),
    ] {
        let r = simple(40).await;
        // 252 as too many partitions / 241 memory: anything above 6 rows is refused.
        r.main()
            .rule(move |req| (req.rows > 6).then(|| Err(err.clone())));
        r.push(SUBJ, 40, &[]);
        r.settled(40).await;
        assert_eq!(r.journal.acked(), 40, "code {c}");
        assert_eq!(r.main().rows_inserted(), 40);
        no_parks(&r);
        assert!(
            r.until(Duration::from_secs(2), |r| r.table("acme.events").is_some())
                .await
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(r.pool_state("main"), "closed", "code {c}");
        assert_eq!(r.table_backoff("acme.events"), "closed", "code {c}");
        r.handle.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_cannot_parse_row_is_isolated_and_parked_with_its_reason() {
    for c in [27u32, 26, 6] {
        let r = simple(100).await;
        r.main().rule(move |req| {
            let body = String::from_utf8_lossy(&req.body);
            body.contains("bad").then(|| Err(rejected(c)))
        });
        let seqs = r.push(SUBJ, 100, &[37]);
        r.settled(100).await;
        assert_eq!(r.journal.acked(), 99);
        let parked = r.journal.parkings();
        assert_eq!(parked.len(), 1);
        let (seq, p) = &parked[0];
        assert_eq!(*seq, seqs[37]);
        assert_eq!(p.class, Class::Rejected);
        assert_eq!(p.code, Some(c));
        assert!(p.error.contains(&format!("Code: {c}")));
        assert_eq!(p.table, TableKey::new("acme", "events"));
        assert!(r.journal.not_settled_once().is_empty());
        assert!(r.main().request_count() <= 2 + 2 * 7);
        r.handle.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn an_outage_mid_isolation_retries_exactly_the_unsettled_rows() {
    let r = simple(8).await;
    r.main().script([
        Err(rejected(27)),             // whole batch
        Err(rejected(27)),             // [0,4)
        Ok(()),                        // [0,2)
        Ok(()),                        // [2,3)
        Err(rejected(27)),             // [3,4) alone: parked
        Err(lost("connection reset")), // [4,8): the server went away
    ]);
    let seqs = r.push(SUBJ, 8, &[]);
    r.settled(8).await;
    for s in &seqs[..3] {
        assert_eq!(r.journal.terminal(*s), vec![Event::Acked]);
    }
    assert!(matches!(
        r.journal.terminal(seqs[3])[..],
        [Event::Parked(_)]
    ));
    for s in &seqs[4..] {
        match r.journal.terminal(*s)[..] {
            [Event::Naked(d)] => assert!(d > Duration::ZERO && d <= Duration::from_secs(1)),
            ref other => panic!("row {s}: {other:?}"),
        }
    }
    assert!(r.journal.not_settled_once().is_empty());
    assert!(
        r.until(Duration::from_secs(2), |r| r.pool_state("main") == "open")
            .await
    );
    r.handle.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn tables_on_a_down_pool_back_off_together_one_probe_closes_it_another_pool_is_unaffected() {
    let r = rig(
        &["a", "b"],
        &[("t1", "a"), ("t2", "b")],
        tables(3),
        settings(),
    )
    .await;
    let a = r.ins["a"].clone();
    let b = r.ins["b"].clone();
    a.set_default(Some(refused("connection refused")));
    r.push("ingest.t1.events", 3, &[]);
    r.settled(3).await;
    assert_eq!(a.request_count(), 1);
    // Another table on the same pool: turned away with no request, nothing buffered.
    r.push("ingest.t1.clicks", 3, &[]);
    r.settled(6).await;
    assert_eq!(a.request_count(), 1, "no request while the window is open");
    // The other pool inserts as usual.
    r.push("ingest.t2.events", 3, &[]);
    r.settled(9).await;
    assert_eq!(b.request_count(), 1);
    assert_eq!(r.journal.acked(), 3);
    // Every row handed back with (at most) the window's delay.
    for (_, d) in r.journal.nak_delays() {
        assert!(d <= Duration::from_secs(1));
    }
    // ClickHouse comes back; the window ends; both tables' rows come back at once.
    a.set_default(None);
    a.set_latency(Duration::from_millis(200));
    tokio::time::sleep(Duration::from_secs(1)).await;
    r.push("ingest.t1.events", 3, &[]);
    r.push("ingest.t1.clicks", 3, &[]);
    r.settled(15).await;
    // Exactly one probe went; the other table's rows were handed back (≥ 0.5 s).
    assert_eq!(
        a.request_count(),
        2,
        "{:?}",
        a.requests()
            .iter()
            .map(|q| q.table.to_string())
            .collect::<Vec<_>>()
    );
    let last_naks: Vec<Duration> = r
        .journal
        .nak_delays()
        .iter()
        .rev()
        .take(3)
        .map(|(_, d)| *d)
        .collect();
    assert!(
        last_naks.iter().all(|d| *d >= Duration::from_millis(500)),
        "{last_naks:?}"
    );
    assert!(
        r.until(Duration::from_secs(3), |r| r.pool_state("a") == "closed")
            .await
    );
    // Closed: everything flows again.
    r.push("ingest.t1.clicks", 3, &[]);
    r.settled(18).await;
    assert_eq!(r.journal.acked(), 9);
    no_parks(&r);
    assert_eq!(r.pool_state("b"), "closed");
    r.handle.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn nothing_is_buffered_while_the_pool_backs_off_or_a_probe_is_out() {
    let r = simple(5).await;
    r.main().set_default(Some(unavailable(745)));
    r.push(SUBJ, 5, &[]);
    r.settled(5).await;
    let window = r.journal.nak_delays()[0].1;
    // Arrivals during the window: handed back with the remaining delay, never buffered.
    tokio::time::sleep(window / 4).await;
    r.push(SUBJ, 2, &[]);
    r.settled(7).await;
    let d = r.journal.nak_delays().last().unwrap().1;
    assert!(
        d <= window - window / 4 + Duration::from_millis(20) && d > Duration::ZERO,
        "{d:?} vs {window:?}"
    );
    assert_eq!(r.table("acme.events").unwrap()["state"]["buffered_rows"], 0);
    assert_eq!(r.main().request_count(), 1);
    // The window ends; a slow probe goes out; arrivals meanwhile come back with ≥ 0.5 s.
    r.main().set_default(None);
    r.main().set_latency(Duration::from_secs(5));
    tokio::time::sleep(window).await;
    r.push(SUBJ, 5, &[]); // the probe
    assert!(
        r.until(Duration::from_secs(1), |r| r.pool_state("main")
            == "probing")
            .await
    );
    r.push(SUBJ, 3, &[]);
    r.settled(10).await;
    for (_, d) in r.journal.nak_delays().iter().rev().take(3) {
        assert!(*d >= Duration::from_millis(500));
    }
    assert_eq!(r.table("acme.events").unwrap()["state"]["buffered_rows"], 0);
    r.settled(15).await;
    assert_eq!(r.journal.acked(), 5);
    assert_eq!(r.main().request_count(), 2);
    no_parks(&r);
    r.handle.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_read_only_table_backs_off_alone_and_a_neighbours_success_does_not_close_it() {
    let r = simple(2).await;
    r.main()
        .rule(|req| (&*req.table.table == "ro").then(|| Err(unavailable(242).table_scoped())));
    r.push("ingest.acme.ro", 2, &[]);
    r.settled(2).await;
    assert!(
        r.until(Duration::from_secs(2), |r| r.table_backoff("acme.ro")
            == "open")
            .await
    );
    // The neighbour inserts; the pool stays closed; the read-only table stays open.
    r.push("ingest.acme.ok", 2, &[]);
    r.settled(4).await;
    assert_eq!(r.journal.acked(), 2);
    assert_eq!(r.pool_state("main"), "closed");
    assert_eq!(r.table_backoff("acme.ro"), "open");
    // Its arrivals are handed back with no request.
    let before = r.main().request_count();
    r.push("ingest.acme.ro", 2, &[]);
    r.settled(6).await;
    assert_eq!(r.main().request_count(), before);
    no_parks(&r);
    r.handle.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn denied_and_unknown_back_off_the_pool_and_never_park() {
    for err in [
        denied(193),
        status(500, Class::Unknown),
        status(401, Class::Denied),
    ] {
        let r = simple(4).await;
        r.main().set_default(Some(err.clone()));
        r.push(SUBJ, 4, &[]);
        r.settled(4).await;
        no_parks(&r);
        assert_eq!(r.journal.naked(), 4);
        assert_eq!(r.main().request_count(), 1);
        assert!(
            r.until(Duration::from_secs(2), |r| r.pool_state("main") == "open")
                .await,
            "{err}"
        );
        r.handle.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn dlq_off_leaves_a_rejected_row_unacked_and_a_failing_dlq_is_counted() {
    let t = tables(4).with_override(
        "acme.nodlq",
        TableOverrides {
            dlq: Some(false),
            ..Default::default()
        },
    );
    let r = rig(&["main"], &[("acme", "main")], t, settings()).await;
    r.main().reject_containing("bad");
    let s = r.push("ingest.acme.nodlq", 4, &[1]);
    r.settled(4).await;
    assert_eq!(
        r.journal.terminal(s[1]),
        vec![Event::Naked(Duration::from_secs(30))]
    );
    no_parks(&r);
    // DLQ on, but the DLQ refuses: the row stays unacked (naked with the cap), counted.
    r.journal
        .dlq_fails
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let s = r.push(SUBJ, 4, &[2]);
    r.settled(8).await;
    assert_eq!(
        r.journal.terminal(s[2]),
        vec![Event::Naked(Duration::from_secs(30))]
    );
    assert_eq!(r.handle.stats().dlq_failures, 1);
    assert!(
        r.until(Duration::from_secs(2), |r| r
            .table("acme.events")
            .is_some_and(|t| t["state"]["dlq_failures"] == 1))
            .await
    );
    assert!(r.journal.not_settled_once().is_empty());
    r.handle.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_tenant_without_target_is_parked_whole_and_an_invalid_subject_too() {
    let t = tables(4).with_override(
        "ghost.nodlq",
        TableOverrides {
            dlq: Some(false),
            ..Default::default()
        },
    );
    let r = rig(&["main"], &[("acme", "main")], t, settings()).await;
    r.push("ingest.ghost.events", 3, &[]);
    r.settled(3).await;
    let parked = r.journal.parkings();
    assert_eq!(parked.len(), 3);
    assert!(parked
        .iter()
        .all(|(_, p)| p.error == "tenant ghost has no ClickHouse target"
            && p.table == TableKey::new("ghost", "events")));
    r.push("ingest.ghost.nodlq", 2, &[]);
    r.settled(5).await;
    assert_eq!(r.journal.parked(), 3);
    assert_eq!(r.journal.nak_delays().len(), 2);
    assert!(r
        .journal
        .nak_delays()
        .iter()
        .all(|(_, d)| *d == Duration::from_secs(30)));
    r.push("ingest.acme.bad-table", 1, &[]);
    r.push("elsewhere.acme.events", 1, &[]);
    r.settled(7).await;
    let parked = r.journal.parkings();
    assert_eq!(parked.len(), 5);
    for (_, p) in &parked[3..] {
        assert_eq!(p.table, TableKey::new("_invalid", "subject"));
        assert!(p.error.starts_with("invalid subject"), "{}", p.error);
    }
    assert_eq!(r.main().request_count(), 0);
    r.handle.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_undecodable_message_is_parked_whole_with_its_reason_and_the_rest_is_inserted() {
    let t = tables(2).with_override(
        "acme.nodlq",
        TableOverrides {
            dlq: Some(false),
            ..Default::default()
        },
    );
    let r = rig(&["main"], &[("acme", "main")], t, settings()).await;
    let subject: std::sync::Arc<str> = std::sync::Arc::from(SUBJ);
    let good = r.journal.delivery(&subject, "{\"n\":1}\n{\"n\":2}");
    let bad = r
        .journal
        .delivery(&subject, "\u{28}\u{b5}\n\n\n")
        .undecodable("the payload is not valid zstd: Unknown frame descriptor");
    let bad_seq = bad.seq;
    r.queue.push([good, bad]);
    r.settled(2).await;
    let parked = r.journal.parkings();
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert_eq!(parked[0].0, bad_seq);
    assert_eq!(parked[0].1.table, TableKey::new("acme", "events"));
    assert_eq!(
        parked[0].1.error,
        "the payload is not valid zstd: Unknown frame descriptor"
    );
    // The good message's two rows went in; the bad one was never sent.
    assert_eq!(r.main().rows_inserted(), 2);
    // Its table's DLQ off: left unacked (naked with the cap delay), not parked.
    let off: std::sync::Arc<str> = std::sync::Arc::from("ingest.acme.nodlq");
    r.queue.push([r
        .journal
        .delivery(&off, "x")
        .undecodable("unknown encoding")]);
    r.settled(3).await;
    assert_eq!(r.journal.parked(), 1);
    assert_eq!(r.journal.nak_delays().len(), 1);
    r.handle.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn flush_triggers_by_rows_bytes_and_age_with_per_table_overrides() {
    let t = TableSettingsResolver::new(TableSettings {
        batch_rows: 1000,
        batch_bytes: 1 << 20,
        batch_age: Duration::from_secs(2),
        ..Default::default()
    })
    .with_override(
        "acme.rows",
        TableOverrides {
            batch_rows: Some(5),
            ..Default::default()
        },
    )
    .with_override(
        "acme.bytes",
        TableOverrides {
            batch_bytes: Some(40),
            ..Default::default()
        },
    )
    .with_override(
        "acme.age",
        TableOverrides {
            batch_age: Some(Duration::from_millis(300)),
            ..Default::default()
        },
    );
    let r = rig(&["main"], &[("acme", "main")], t, settings()).await;
    let t0 = tokio::time::Instant::now();
    r.push("ingest.acme.rows", 5, &[]);
    r.settled(5).await;
    assert!(
        t0.elapsed() < Duration::from_millis(100),
        "rows trigger: {:?}",
        t0.elapsed()
    );
    let t0 = tokio::time::Instant::now();
    r.push("ingest.acme.bytes", 5, &[]); // 5 × 8 bytes = 40
    r.settled(10).await;
    assert!(t0.elapsed() < Duration::from_millis(100), "bytes trigger");
    let t0 = tokio::time::Instant::now();
    r.push("ingest.acme.age", 2, &[]);
    r.settled(12).await;
    let e = t0.elapsed();
    assert!(
        e >= Duration::from_millis(300) && e < Duration::from_millis(500),
        "age override: {e:?}"
    );
    let t0 = tokio::time::Instant::now();
    r.push("ingest.acme.other", 2, &[]);
    r.settled(14).await;
    let e = t0.elapsed();
    assert!(
        e >= Duration::from_secs(2) && e < Duration::from_millis(2200),
        "default age: {e:?}"
    );
    let bodies: Vec<String> = r
        .main()
        .requests()
        .iter()
        .map(|q| String::from_utf8_lossy(&q.body).into_owned())
        .collect();
    assert_eq!(
        bodies[0],
        "{\"n\":0}\n{\"n\":1}\n{\"n\":2}\n{\"n\":3}\n{\"n\":4}\n"
    );
    assert_eq!(r.journal.acked(), 14);
    r.handle.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn rows_held_past_half_the_ack_wait_get_progress() {
    let mut s = settings();
    s.ack_wait = Duration::from_secs(10);
    let r = rig(&["main"], &[("acme", "main")], tables(3), s).await;
    r.main().set_latency(Duration::from_secs(12));
    let seqs = r.push(SUBJ, 3, &[]);
    r.settled(3).await;
    for s in seqs {
        let ev: Vec<Event> = r
            .journal
            .events()
            .into_iter()
            .filter(|(q, _)| *q == s)
            .map(|(_, e)| e)
            .collect();
        assert_eq!(
            ev,
            vec![Event::Progress, Event::Progress, Event::Acked],
            "row {s}"
        );
    }
    r.handle.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn rows_buffered_past_half_the_ack_wait_get_progress_too() {
    let mut s = settings();
    s.ack_wait = Duration::from_secs(4);
    let t = tables(100).with_override(
        "acme.slow",
        TableOverrides {
            batch_age: Some(Duration::from_secs(5)),
            ..Default::default()
        },
    );
    let r = rig(&["main"], &[("acme", "main")], t, s).await;
    let seqs = r.push("ingest.acme.slow", 2, &[]);
    r.settled(2).await;
    for s in seqs {
        let ev: Vec<Event> = r
            .journal
            .events()
            .into_iter()
            .filter(|(q, _)| *q == s)
            .map(|(_, e)| e)
            .collect();
        assert!(
            ev.len() >= 2 && ev[0] == Event::Progress && *ev.last().unwrap() == Event::Acked,
            "row {s}: {ev:?}"
        );
    }
    r.handle.shutdown().await;
}

/// A pipeline whose ClickHouse says table `acme.late` does not exist (batches of 10),
/// with `grace` for it.
async fn missing_late_table(grace: Duration) -> Rig {
    let tables = tables(10).with_override(
        "acme.late",
        TableOverrides {
            missing_table_grace: Some(grace),
            ..Default::default()
        },
    );
    let r = rig(&["main"], &[("acme", "main")], tables, settings()).await;
    r.main()
        .rule(|req| (&*req.table.table == "late").then(|| Err(rejected(60).table_missing())));
    r
}

/// A table that does not exist (yet): its rows wait for it, table-scoped, for the
/// grace; none is parked meanwhile and nothing is bisected. Past the grace they are
/// parked in a few requests (one per batch), with the reason in the parking.
#[tokio::test(start_paused = true)]
async fn a_missing_table_is_waited_for_then_parked_whole_without_bisection() {
    let r = missing_late_table(Duration::from_secs(60)).await;
    let seqs = r.push("ingest.acme.late", 30, &[]);
    // Inside the grace: waiting, shown, nothing parked, the pool untouched.
    assert!(
        r.until(Duration::from_secs(5), |r| r.table_backoff("acme.late")
            == "open")
            .await,
        "{} {:?}",
        r.handle.tree_json(),
        r.journal.events()
    );
    assert!(r
        .table("acme.late")
        .is_some_and(|t| t["state"]["missing_table"]["grace_left_ms"]
            .as_u64()
            .is_some_and(|ms| ms > 0)));
    tokio::time::sleep(Duration::from_secs(50)).await;
    assert_eq!(r.journal.parked(), 0);
    assert_eq!(r.pool_state("main"), "closed");
    assert!(seqs
        .iter()
        .all(|s| matches!(r.journal.terminal(*s)[..], [Event::Naked(_)])));
    // Past the grace: the rows that come (again) are parked, each with the reason.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let mut late = r.push("ingest.acme.late", 10, &[]);
    assert!(
        r.until(Duration::from_secs(60), |r| r.journal.parked() == 10)
            .await,
        "{:?}",
        r.journal.events()
    );
    // That answer closed the table's wait: what comes next goes straight to the DLQ.
    late.extend(r.push("ingest.acme.late", 20, &[]));
    assert!(
        r.until(Duration::from_secs(120), |r| r.journal.parked() == 30)
            .await,
        "{:?}",
        r.journal.events()
    );
    for (seq, parking) in r.journal.parkings() {
        assert!(late.contains(&seq));
        assert_eq!(parking.code, Some(60));
        assert!(
            parking.error.contains("missing_table_grace"),
            "{}",
            parking.error
        );
    }
    // No bisection: every request carried a whole batch.
    let requests = r.main().requests();
    assert!(
        requests.iter().all(|q| q.rows == 10),
        "{:?}",
        requests.iter().map(|q| q.rows).collect::<Vec<_>>()
    );
    assert!(requests.len() <= 15, "{} requests", requests.len());
    assert!(r.journal.not_settled_once().is_empty());
}

/// The usual cause, a deploy race: the table appears within the grace, and its rows
/// land at once; none is parked.
#[tokio::test(start_paused = true)]
async fn a_table_created_within_the_grace_takes_its_rows() {
    let r = simple(10).await;
    r.main()
        .rule(|req| (&*req.table.table == "late").then(|| Err(rejected(60).table_missing())));
    r.push("ingest.acme.late", 20, &[]);
    assert!(
        r.until(Duration::from_secs(5), |r| r.table_backoff("acme.late")
            == "open")
            .await
    );
    // The migration runs; the rows come again once the table's wait is over.
    r.main().clear_rules();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let more = r.push("ingest.acme.late", 10, &[]);
    r.settled(30).await;
    assert!(
        r.until(Duration::from_secs(120), |r| r.journal.acked() == 10)
            .await,
        "{:?}",
        r.journal.events()
    );
    assert_eq!(r.journal.parked(), 0);
    assert!(more
        .iter()
        .all(|s| r.journal.terminal(*s).last() == Some(&Event::Acked)));
    assert!(r
        .table("acme.late")
        .is_some_and(|t| t["state"]["missing_table"].is_null()));
}

/// A table actor that restarts (a panic) while its table is missing keeps the wait it
/// had: the grace runs from ClickHouse's first "no such table", not from the restart,
/// so a table that keeps crashing cannot hold a producer's typo in the stream forever
/// (nor repeat the WARN at every restart).
#[tokio::test(start_paused = true)]
async fn a_missing_tables_grace_runs_on_through_a_table_restart() {
    let r = missing_late_table(Duration::from_secs(60)).await;
    r.push("ingest.acme.late", 10, &[]);
    assert!(
        r.until(Duration::from_secs(5), |r| r.table_backoff("acme.late")
            == "open")
            .await
    );
    tokio::time::sleep(Duration::from_secs(40)).await;
    r.handle
        .inject_panic(&TableKey::new("acme", "late"))
        .await
        .unwrap();
    assert!(
        r.until(Duration::from_secs(5), |r| r
            .table("acme.late")
            .is_some_and(|t| t["restarts"] == 1 && t["status"] == "running"))
            .await,
        "{}",
        r.handle.tree_json()
    );
    // The successor shows the wait it took over, with what is left of the grace.
    let grace_left = r
        .table("acme.late")
        .and_then(|t| t["state"]["missing_table"]["grace_left_ms"].as_u64());
    assert!(
        grace_left.is_some_and(|ms| ms <= 20_000),
        "grace left after the restart: {grace_left:?}"
    );
    // Past the first grace (35 s before a restarted one would end): parked.
    tokio::time::sleep(Duration::from_secs(25)).await;
    r.push("ingest.acme.late", 10, &[]);
    assert!(
        r.until(Duration::from_secs(30), |r| r.journal.parked() == 10)
            .await,
        "{:?}",
        r.journal.events()
    );
    r.handle.shutdown().await;
}

/// Ten rows `{"n":i}` on `SUBJ`, the fifth carrying "bomb" (what the crash rules key
/// on): their stream sequences.
fn push_with_a_bomb(r: &Rig) -> Vec<u64> {
    let subject: std::sync::Arc<str> = std::sync::Arc::from(SUBJ);
    (0..10)
        .map(|i| {
            let body = if i == 4 {
                "{\"n\":4,\"x\":[[[[\"bomb\"]]]]}".to_string()
            } else {
                format!("{{\"n\":{i}}}")
            };
            let d = r.journal.delivery(&subject, body);
            let seq = d.seq;
            r.queue.push([d]);
            seq
        })
        .collect()
}

/// A row ClickHouse crashes on (a nesting bomb published straight to JetStream): every
/// flight holding it loses the connection while ClickHouse took inserts a moment
/// before, again and again. After `poison_strikes` such losses its batch flies alone;
/// lost alone twice, it is isolated: the row that takes the server down on its own,
/// twice, is parked with the reason; its neighbours land.
#[tokio::test(start_paused = true)]
async fn a_row_that_crashes_clickhouse_is_isolated_and_parked_its_neighbours_land() {
    let mut s = settings();
    s.idle_probe_after = Duration::from_secs(1);
    let r = rig(&["main"], &[("acme", "main")], tables(10), s).await;
    r.main().rule(|req| {
        String::from_utf8_lossy(&req.body)
            .contains("bomb")
            .then(|| Err(lost("connection closed before message completed")))
    });
    let seqs = push_with_a_bomb(&r);
    let settled = |r: &Rig, n: usize| {
        seqs.iter()
            .filter(|s| r.journal.terminal(**s).len() >= n)
            .count()
            == seqs.len()
    };
    // Each cycle: the batch goes while ClickHouse takes inserts, ClickHouse goes down
    // on it, comes back (the pool's own probe closes the window), JetStream redelivers.
    // The fourth flight goes alone and is lost alone: one more strike, not a verdict (an
    // earlier attempt may have gone in before a crash, see `solo::Suspicion`).
    for cycle in 1..=4u64 {
        assert!(
            r.until(Duration::from_secs(30), |r| settled(r, cycle as usize))
                .await
        );
        assert_eq!(
            r.journal.parked(),
            0,
            "nothing parked before the batch lost its connection alone twice (cycle {cycle})"
        );
        assert!(
            r.until(Duration::from_secs(30), |r| r.pool_state("main")
                == "closed")
                .await
        );
        r.queue
            .push(seqs.iter().map(|s| r.journal.redeliver(*s, cycle + 1)));
    }
    assert!(
        r.until(Duration::from_secs(120), |r| r.journal.parked() == 1)
            .await,
        "{:?}",
        r.journal.events()
    );
    let parkings = r.journal.parkings();
    assert_eq!(parkings[0].0, seqs[4]);
    assert!(
        parkings[0].1.error.contains("dropped the connection"),
        "{}",
        parkings[0].1.error
    );
    assert!(
        r.until(Duration::from_secs(30), |r| r.main().rows_inserted() == 9)
            .await
    );
    for (i, s) in seqs.iter().enumerate() {
        if i != 4 {
            assert_eq!(
                r.journal.terminal(*s).last(),
                Some(&Event::Acked),
                "row {i}"
            );
        }
    }
}

/// Issue 20: a row that crashes ClickHouse takes down every insert in flight beside
/// it, and those may have gone in before the server died. A neighbour's batch lost
/// that way, on a table that deduplicates, collects the same strikes as the bomb's; were
/// it isolated after such a loss, its rows would go in again in parts whose blocks
/// ClickHouse does not know (rows twice). A suspect flies alone (`solo`): the twin's
/// rows are each in one block, sent whole, and only the bomb is parked.
#[tokio::test(start_paused = true)]
async fn a_suspect_flies_alone_so_a_neighbour_lost_beside_a_crash_is_never_split() {
    let mut s = settings();
    s.idle_probe_after = Duration::from_secs(1);
    let r = rig_with_store(&["main"], &[("acme", "main")], tables(10), s, true).await;
    r.main().set_dedup(true);
    r.main().set_latency(Duration::from_millis(100));
    r.main().crash_on("bomb");
    let mut seqs = push_with_a_bomb(&r);
    seqs.extend(r.push("ingest.acme.twin", 10, &[]));
    // Each cycle: both batches fly together, the bomb takes ClickHouse down with the
    // twin's insert in flight (which went in), the pool's own probe finds it back,
    // JetStream redelivers what was not acked.
    for cycle in 1..=6u64 {
        let open: Vec<u64> = seqs
            .iter()
            .copied()
            .filter(|s| r.journal.terminal(*s).last() != Some(&Event::Acked))
            .collect();
        if r.journal.parked() == 1 && open.is_empty() {
            break;
        }
        assert!(
            r.until(Duration::from_secs(120), |r| open.iter().all(|s| r
                .journal
                .terminal(*s)
                .len()
                >= cycle as usize))
                .await,
            "cycle {cycle}: {:?}",
            r.journal.events()
        );
        assert!(
            r.until(Duration::from_secs(30), |r| r.pool_state("main")
                == "closed")
                .await
        );
        r.queue.push(
            open.iter()
                .filter(|s| r.journal.terminal(**s).last() != Some(&Event::Acked))
                .map(|s| r.journal.redeliver(*s, cycle + 1)),
        );
    }
    assert!(
        r.until(Duration::from_secs(120), |r| r.journal.parked() == 1
            && seqs.iter().all(|s| !r.journal.terminal(*s).is_empty()
                && matches!(
                    r.journal.terminal(*s).last(),
                    Some(Event::Acked)
                )))
        .await,
        "{:?}",
        r.journal.events()
    );
    // What went into the twin: each distinct block once (ClickHouse deduplicates a
    // block sent again), each row in exactly one block.
    let mut blocks: Vec<Vec<String>> = r
        .main()
        .requests()
        .into_iter()
        .filter(|q| &*q.table.table == "twin" && (q.answer.is_ok() || q.committed_unanswered))
        .map(|q| q.lines())
        .collect();
    blocks.sort();
    blocks.dedup();
    let mut lines: Vec<String> = blocks.concat();
    let all = lines.len();
    lines.sort();
    lines.dedup();
    assert_eq!(
        (all, lines.len()),
        (10, 10),
        "the twin's rows went in as these blocks: {blocks:?}"
    );
    // Whenever the bomb went, it went alone once it was suspect: its parts did.
    for q in r.main().requests() {
        if q.rows < 10 && q.lines().iter().any(|l| l.contains("bomb")) {
            assert!(
                q.alone,
                "a part of the suspect batch flew beside another insert"
            );
        }
    }
}

/// A server in a crash loop that is not the rows' doing: it goes down on every big
/// insert (5 rows or more here: memory) and on every other small one, answering probes
/// in between. The batch collects strikes and is isolated, halves and quarters go down
/// too, but a row is parked for a lost connection only when it takes the server down
/// alone twice in a row: no good row is parked, and every row lands.
#[tokio::test(start_paused = true)]
async fn a_server_crashing_on_inserts_whatever_they_carry_parks_no_good_row() {
    let mut s = settings();
    s.idle_probe_after = Duration::from_secs(1);
    let r = rig(&["main"], &[("acme", "main")], tables(10), s).await;
    let small = std::sync::atomic::AtomicUsize::new(0);
    r.main().rule(move |req| {
        let down = req.rows >= 5
            || small
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                .is_multiple_of(2);
        down.then(|| Err(lost("connection closed before message completed")))
    });
    let seqs = r.push(SUBJ, 10, &[]);
    for round in 1..=12u64 {
        let acked = |r: &Rig| {
            seqs.iter()
                .filter(|s| r.journal.terminal(**s).last() == Some(&Event::Acked))
                .count()
        };
        // Every row is settled once more (acked, or handed back for JetStream).
        assert!(
            r.until(Duration::from_secs(60), |r| seqs.iter().all(|s| r
                .journal
                .terminal(*s)
                .len()
                >= round as usize
                || r.journal.terminal(*s).last() == Some(&Event::Acked)))
                .await,
            "round {round}: {:?}",
            r.journal.events()
        );
        if acked(&r) == seqs.len() {
            break;
        }
        assert!(
            r.until(Duration::from_secs(60), |r| r.pool_state("main")
                == "closed")
                .await
        );
        let again: Vec<_> = seqs
            .iter()
            .filter(|s| r.journal.terminal(**s).last() != Some(&Event::Acked))
            .map(|s| r.journal.redeliver(*s, round + 1))
            .collect();
        r.queue.push(again);
    }
    assert_eq!(r.journal.parked(), 0, "{:?}", r.journal.events());
    assert!(
        seqs.iter()
            .all(|s| r.journal.terminal(*s).last() == Some(&Event::Acked)),
        "{:?}",
        r.journal.events()
    );
    assert_eq!(r.main().rows_inserted(), 10);
}

/// The other side: ClickHouse really down for ten minutes (connections refused, probes
/// failing), the rows coming back again and again: nothing is parked; once it is back
/// every row lands.
#[tokio::test(start_paused = true)]
async fn a_long_real_outage_never_parks_a_good_row() {
    let mut s = settings();
    s.idle_probe_after = Duration::from_secs(1);
    let r = rig(&["main"], &[("acme", "main")], tables(10), s).await;
    r.main().set_default(Some(refused("connection refused")));
    r.main().set_probe(Some(refused("connection refused")));
    let seqs = r.push(SUBJ, 10, &[]);
    for round in 1..=20u64 {
        assert!(
            r.until(Duration::from_secs(60), |r| seqs.iter().all(|s| r
                .journal
                .terminal(*s)
                .len()
                >= round as usize))
                .await
        );
        tokio::time::sleep(Duration::from_secs(30)).await;
        r.queue
            .push(seqs.iter().map(|s| r.journal.redeliver(*s, round + 1)));
    }
    assert_eq!(r.journal.parked(), 0);
    // ClickHouse is back; the rows come once more and land.
    r.main().set_default(None);
    r.main().set_probe(None);
    assert!(
        r.until(Duration::from_secs(60), |r| r.pool_state("main")
            == "closed")
            .await
    );
    r.queue
        .push(seqs.iter().map(|s| r.journal.redeliver(*s, 22)));
    assert!(
        r.until(Duration::from_secs(120), |r| r.main().rows_inserted() == 10)
            .await
    );
    assert_eq!(r.journal.parked(), 0);
}

/// nats-server 2.9 can deliver a message again while a flight holds it (a copy handed
/// back to a dropped pull request comes again as new). The copy must not fly beside it:
/// into a table that records nothing that is a second insert, and a row ClickHouse
/// crashes on would crash it twice and be parked twice (issue 19's
/// `poison_row_crashes_clickhouse`). It goes back briefly instead, and the flight holding
/// the message settles it.
#[tokio::test(start_paused = true)]
async fn a_copy_of_a_message_in_flight_does_not_fly_beside_it() {
    let r = simple(10).await;
    r.main().set_latency(Duration::from_secs(2));
    let first = r.push(SUBJ, 10, &[]);
    assert!(
        r.until(Duration::from_secs(1), |r| r
            .table("acme.events")
            .is_some_and(|t| t["state"]["flights"] == 1))
            .await,
        "{}",
        r.handle.tree_json()
    );
    // The copy of the first message, and nine more: a batch of ten is due.
    r.queue.push([r.journal.redeliver(first[0], 1)]);
    let second = r.push(SUBJ, 9, &[]);
    r.settled(20).await;
    assert_eq!(
        r.main().rows_inserted(),
        19,
        "the copy was inserted beside its original"
    );
    let retry = settings().store_retry;
    assert_eq!(
        r.journal.terminal(first[0]),
        vec![Event::Naked(retry), Event::Acked]
    );
    assert!(first[1..]
        .iter()
        .chain(&second)
        .all(|s| r.journal.terminal(*s) == vec![Event::Acked]));
    no_parks(&r);
    r.handle.shutdown().await;
}

/// Each flight out shows, in its table's snapshot (`/admin/actors`), the step it is in
/// and for how long: a flight that does not end names the step that holds it.
#[tokio::test(start_paused = true)]
async fn a_flight_out_shows_its_step_and_for_how_long() {
    let r = simple(5).await;
    r.main().set_latency(Duration::from_secs(30));
    r.push(SUBJ, 5, &[]);
    let step = |r: &Rig| {
        r.table("acme.events")
            .map(|t| t["state"]["flights_out"].clone())
            .unwrap_or_default()
    };
    assert!(
        r.until(Duration::from_secs(10), |r| step(r)[0]["stage"]
            == "inserting")
            .await,
        "{:?}",
        step(&r)
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    let out = step(&r);
    assert!(
        out[0]["stage_ms"].as_u64().unwrap_or(0) >= 8_000,
        "10 s into its insert: {out:?}"
    );
    r.settled(5).await;
    assert!(
        r.until(Duration::from_secs(10), |r| step(r).is_null())
            .await,
        "no flight out once the rows are settled: {:?}",
        step(&r)
    );
}

/// The parts of messages split by shard, in a table inserted at least once: each is
/// judged by its split's record before it joins a batch. The copy the record counts
/// and one whose record is gone go in beside an ordinary message; a surplus copy is
/// acked without going in; one whose record cannot be read now goes back.
#[tokio::test(start_paused = true)]
async fn only_the_copies_of_parts_their_split_counts_go_in() {
    let r = simple(5).await;
    let seqs = r.push_parts(
        SUBJ,
        vec![
            None,
            Some(Ok(PartCopy::Counted)),
            Some(Ok(PartCopy::Surplus)),
            Some(Ok(PartCopy::Unrecorded)),
            Some(Err(SettleError("the split bucket is away".into()))),
        ],
    );
    r.settled(5).await;
    let bodies: Vec<String> = r
        .main()
        .requests()
        .iter()
        .map(|req| String::from_utf8_lossy(&req.body).into_owned())
        .collect();
    assert_eq!(bodies, ["{\"n\":0}\n{\"n\":1}\n{\"n\":3}\n"], "{bodies:?}");
    assert_eq!(
        r.journal.terminal(seqs[2]),
        [Event::Acked],
        "the surplus copy"
    );
    assert_eq!(
        r.journal.terminal(seqs[4]),
        [Event::Naked(Duration::from_secs(1))],
        "the copy not judged goes back for store_retry"
    );
    no_parks(&r);
    r.handle.shutdown().await;
}

/// A batch due by age while the table's flights are all out waits for one to land
/// (its end pumps the table again): the table does not wake itself meanwhile. It did:
/// its age timer, armed for a deadline already past, fired at once, again and again,
/// so the paused clock (which moves only when every task waits) never reached the
/// insert's answer. The rig runs on a thread of its own, watched with a real deadline.
#[test]
fn a_batch_due_by_age_while_the_flights_are_out_does_not_spin_the_table() {
    let (done, landed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let mut tables = tables(1_000);
            tables.defaults.batch_age = Duration::from_secs(1);
            let r = rig(
                &["main"],
                &[("acme", "main")],
                tables,
                PipelineSettings {
                    max_inflight_flushes: 1,
                    ..settings()
                },
            )
            .await;
            r.main().set_latency(Duration::from_secs(10));
            r.push(SUBJ, 3, &[]);
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            // Due by age at 2.5 s, while the first batch's insert runs until 11 s.
            r.push(SUBJ, 2, &[]);
            r.settled(5).await;
            assert_eq!(r.main().rows_inserted(), 5);
            r.handle.shutdown().await;
        });
        let _ = done.send(());
    });
    assert!(
        landed.recv_timeout(Duration::from_secs(60)).is_ok(),
        "the rows did not land within a minute of real time: the table spun on its age timer"
    );
}
