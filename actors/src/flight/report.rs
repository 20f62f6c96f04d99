//! A flight's verdict to its table (or, when the table is gone, to the pool of its
//! replica, or the target, or the root), and what becomes of its pending rows.

use super::{FlightCtx, FlightLinks};
use crate::protocol::FlightReport;
use crate::protocol::{FlightRequest, TableReport, VerdictReport};
use crate::protocol::{FlightVerdict, PendingRows, PoolVerdict, Tickets, Verdict};
use ractor::{MessagingErr, RpcReplyPort};
use std::time::Duration;

/// Send the verdict to the table (or, when it is gone, the pool's part to the pool);
/// when rows are pending, wait to hear what becomes of them.
pub(super) async fn report<I>(
    ctx: &FlightCtx<I>,
    links: &FlightLinks,
    tickets: Tickets,
    verdict: Verdict,
    has_pending: bool,
) -> PendingRows {
    let settings = &ctx.common.settings;
    // Unfinished at the shutdown deadline: back at once, another instance may take them.
    // A batch the ledger did not let go: the flight knows its own delay.
    let decided_here = matches!(verdict, Verdict::Unfinished | Verdict::Unsent(_));
    // Nobody answered: back with the first step of the breaker that would have decided.
    let fallback = PendingRows::HandBack(match &verdict {
        Verdict::TableOutage(_) | Verdict::MissingTable(_) => settings.table_backoff.initial,
        Verdict::Unfinished | Verdict::Unsent(_) => Duration::ZERO,
        _ => settings.pool_backoff.initial,
    });
    let wants_answer = has_pending && !decided_here;
    let (reply, answer) = if wants_answer {
        let (tx, rx) = ractor::concurrency::oneshot();
        (Some(RpcReplyPort::from(tx)), Some(rx))
    } else {
        (None, None)
    };
    let message = FlightReport::Verdict(FlightVerdict {
        tickets,
        verdict,
        reply,
    });
    if let Err(MessagingErr::SendErr(FlightReport::Verdict(v))) = links.table.send_message(message)
    {
        // The table is gone: its backoff's memory went with it, but the replica's
        // breaker must still hear what the server answered.
        let pool_verdict = v.for_pool();
        let reply = match pool_verdict {
            PoolVerdict::Outage(..) => v.reply,
            _ => None,
        };
        orphan_report(
            links,
            VerdictReport {
                key: ctx.key.clone(),
                replica: tickets.replica,
                verdict: pool_verdict,
                reply,
            },
        );
    }
    let Some(answer) = answer else {
        return fallback;
    };
    match tokio::time::timeout(settings.call_timeout, answer).await {
        Ok(Ok(pending)) => pending,
        _ => fallback,
    }
}

/// A verdict whose table is gone: to the replica's pool, or (restarting) the target,
/// or (the target restarting too) the root, which each hand it on to the successor.
pub(super) fn orphan_report(links: &FlightLinks, report: VerdictReport) {
    let report = match &links.pool {
        Some(pool) => match pool.send_message(FlightRequest::Verdict(Box::new(report))) {
            Ok(()) => return,
            Err(MessagingErr::SendErr(FlightRequest::Verdict(report))) => *report,
            Err(_) => return,
        },
        None => report,
    };
    if let Err(MessagingErr::SendErr(report)) =
        links.target.send_message(TableReport::Verdict(report))
    {
        let _ = links.root.send_message(report);
    }
}
