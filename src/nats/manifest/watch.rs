//! The watch that keeps the index current: opened on the bucket, followed, and opened
//! again (the index rebuilt) whenever it breaks or the client reconnects; writes the
//! bucket lost in a crash are written back from the index before it reports itself
//! caught up (see [`super::index`]).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use futures::StreamExt as _;
use tokio::time::Instant;

use super::bucket::{ensure_bucket, stream_name};
use super::codec::{decode, encode};
use super::index::Index;
use super::partitions::read_incarnation;
use super::ManifestSettings;

/// How often the watch checks for a reconnect and for a catch-up that takes too long.
const TICK: Duration = Duration::from_millis(250);
/// A watch that has not caught up in this long is given up and opened again.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(20);
/// Backoff between attempts to open a watch.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// How long opening the watch may take. nats-server places the watch's consumer
/// (ephemeral, one replica) on a random peer of the bucket's stream, and a peer killed
/// with -9 still counts as a place for it (2.9.10 and 2.15.1 had not marked it offline
/// a minute later): placed there, the consumer never answers, and the request waits
/// out its whole timeout (10 s: a Sluice started just after a seed's kill -9 was seen
/// not ready in 30 s, its watch's tries timing out one after another). One try in three lands there; a short bound and a new try (another draw)
/// get past it. After [`WATCH_OPEN_QUICK_TRIES`] timeouts in a row the bound doubles
/// with each, up to [`WATCH_OPEN_MAX`], for a cluster that is only slow.
const WATCH_OPEN_WITHIN: Duration = Duration::from_secs(3);
const WATCH_OPEN_QUICK_TRIES: u32 = 4;
const WATCH_OPEN_MAX: Duration = Duration::from_secs(12);

/// The bound on opening the watch after `timeouts` timeouts in a row.
fn watch_open_within(timeouts: u32) -> Duration {
    let doublings = timeouts.saturating_sub(WATCH_OPEN_QUICK_TRIES - 1).min(8);
    (WATCH_OPEN_WITHIN * 2u32.pow(doublings)).min(WATCH_OPEN_MAX)
}

/// Keep the index current for as long as the store lives: open a watch, follow it,
/// and open it again (rebuilding) whenever it breaks or the client reconnects.
pub async fn keep_watching(
    index: Arc<Index>,
    js: jetstream::Context,
    settings: Arc<ManifestSettings>,
    on_open: impl Fn(kv::Store) + Send + 'static,
) {
    let mut delay = RETRY_MIN;
    let mut open_timeouts = 0;
    loop {
        let opened = Instant::now();
        let why = watch_once(&index, &js, &settings, &on_open, &mut open_timeouts).await;
        index.not_caught_up();
        if opened.elapsed() > RETRY_MAX * 4 {
            delay = RETRY_MIN;
            tracing::info!(bucket = %settings.bucket, why = %why,
                "the manifest index's watch ended; opening it again and rebuilding the index");
        } else {
            tracing::debug!(bucket = %settings.bucket, why = %why, retry_in = ?delay,
                "the manifest index's watch could not be opened or did not last");
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(RETRY_MAX);
    }
}

/// One watch, from opening to its end; returns why it ended.
async fn watch_once(
    index: &Index,
    js: &jetstream::Context,
    settings: &ManifestSettings,
    on_open: &(impl Fn(kv::Store) + Send),
    open_timeouts: &mut u32,
) -> String {
    let opened = Instant::now();
    let client = js.client();
    let connects = client.statistics().connects.load(Ordering::Relaxed);
    let store = match ensure_bucket(js, settings).await {
        Ok(store) => store,
        Err(e) => return format!("{e:#}"),
    };
    on_open(store.clone());
    // The ingest stream may not exist yet (the source creates it): known later then.
    if let Ok(incarnation) = read_incarnation(js, settings, Duration::from_secs(5)).await {
        index.set_incarnation(incarnation);
    }
    // `watch_with_history`: the last value of every key, then every change
    // (async-nats's `watch_all` only delivers changes made after it opens).
    let open_within = watch_open_within(*open_timeouts);
    let mut watch = match tokio::time::timeout(open_within, store.watch_with_history(">")).await {
        Ok(Ok(watch)) => {
            *open_timeouts = 0;
            watch
        }
        Ok(Err(e)) => return format!("opening a watch of the manifest bucket: {e}"),
        Err(_) => {
            *open_timeouts += 1;
            return format!(
                "opening a watch of the manifest bucket: no answer within {open_within:?} (its consumer may be placed on a server that is down: trying again)"
            );
        }
    };
    // Everything written before this point is delivered by the watch, at or below
    // `upto` (a value may be replaced before it is delivered: then by a later one).
    let bucket = match js.get_stream(stream_name(&settings.bucket)).await {
        Ok(bucket) => bucket.cached_info().state.clone(),
        Err(e) => return format!("reading the manifest bucket: {e}"),
    };
    let upto = bucket.last_sequence;
    let behind = index.fell_behind(upto);
    if behind {
        tracing::warn!(bucket = %settings.bucket, last_sequence = upto,
            "the manifest bucket came back behind what this instance had seen (nats-server lost writes it had acknowledged, in a crash): the manifests it lost are written again from this instance's index");
    }
    let mut seen = HashSet::new();
    let mut caught_up = bucket.messages == 0;
    if caught_up {
        if let Err(why) = catch_up(index, &store, &mut seen, upto, connects, behind).await {
            return why;
        }
    }
    let mut tick = tokio::time::interval(TICK);
    loop {
        tokio::select! {
            entry = watch.next() => match entry {
                Some(Ok(entry)) => {
                    apply(index, &entry);
                    index.saw(entry.revision);
                    if !caught_up {
                        seen.insert(entry.key.clone());
                        if entry.delta == 0 || entry.revision >= upto {
                            caught_up = true;
                            if let Err(why) = catch_up(index, &store, &mut seen, upto, connects, behind).await {
                                return why;
                            }
                        }
                    }
                }
                Some(Err(e)) => return format!("the watch failed: {e}"),
                None => return "the watch ended".into(),
            },
            _ = tick.tick() => {
                if client.statistics().connects.load(Ordering::Relaxed) != connects {
                    return "the NATS client reconnected: changes may have been missed".into();
                }
                if !caught_up && opened.elapsed() > CATCH_UP_LIMIT {
                    return format!("the watch did not catch up within {CATCH_UP_LIMIT:?}");
                }
            }
        }
    }
}

/// The watch has delivered everything the bucket held at `upto`. A watch that opened
/// behind first writes again the manifests the bucket lost (see the module's doc).
async fn catch_up(
    index: &Index,
    store: &kv::Store,
    seen: &mut HashSet<String>,
    upto: u64,
    connects: u64,
    behind: bool,
) -> Result<(), String> {
    let restored = if behind {
        restore_lost(index, store, seen).await?
    } else {
        0
    };
    if restored > 0 {
        tracing::warn!(manifests = restored,
            "manifests the bucket had lost were written again: the batches they record are settled by them, not inserted anew");
    }
    index.caught_up(&std::mem::take(seen), upto, connects, restored > 0);
    Ok(())
}

/// Every manifest the index holds and the watch did not deliver: read directly; one
/// with neither a value nor a removal marker in the bucket is written again. Returns
/// how many were.
///
/// They are written in the order of their claims, each as a claim at its new revision:
/// the bucket numbers its writes again from below the loss, so a claim's old revision
/// means nothing beside the new ones, and among batches claiming one message the
/// earlier must stay earlier (written back in any order, a batch left behind unjudged
/// could pass for the first claim, and the batch that was sent would be withdrawn as
/// the loser: its rows inserted again as new ones). A record is only created, never
/// written over one another instance wrote back (or wrote anew) first.
async fn restore_lost(
    index: &Index,
    store: &kv::Store,
    seen: &mut HashSet<String>,
) -> Result<usize, String> {
    let mut restored = 0;
    for (key, manifest) in index.unseen(seen) {
        let entry = store
            .entry(key.clone())
            .await
            .map_err(|e| format!("reading manifest {key} to restore it: {e}"))?;
        if let Some(entry) = entry {
            // Removed, or written since: the bucket knows better.
            apply(index, &entry);
            seen.insert(key);
            continue;
        }
        let rebased = (*manifest).clone().claimed_as(0);
        match store.create(key.clone(), encode(&rebased)).await {
            Ok(revision) => {
                index.put(&key, revision, rebased);
                restored += 1;
            }
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                if let Some(entry) = store
                    .entry(key.clone())
                    .await
                    .map_err(|e| format!("reading manifest {key} to restore it: {e}"))?
                {
                    apply(index, &entry);
                }
            }
            Err(e) => return Err(format!("writing lost manifest {key} again: {e}")),
        }
        seen.insert(key);
    }
    Ok(restored)
}

/// One change of the bucket, into the index.
fn apply(index: &Index, entry: &kv::Entry) {
    let Some((incarnation, id)) = index.parse_key(&entry.key) else {
        return;
    };
    match entry.operation {
        // The echo of a value this instance recorded (or one seen already): the index
        // holds it, so its messages are not decoded again (that was a varint and a step
        // of the id's hash per message, twice per batch).
        kv::Operation::Put if index.holds_revision(&entry.key, entry.revision) => {}
        kv::Operation::Put => match decode(&entry.value, incarnation) {
            Ok(manifest) if manifest.id == id => index.put(&entry.key, entry.revision, manifest),
            Ok(manifest) => tracing::warn!(key = %entry.key, id = %manifest.id,
                "a manifest whose key does not match its messages is ignored"),
            Err(e) => tracing::warn!(key = %entry.key, error = %e,
                "a manifest that cannot be read is ignored (it expires with the bucket's max_age)"),
        },
        kv::Operation::Delete | kv::Operation::Purge => {
            index.remove(&entry.key, Some(entry.revision))
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_watch_gets_quick_tries_first_then_longer_ones() {
        let bounds: Vec<u64> = (0..8)
            .map(|t| super::watch_open_within(t).as_secs())
            .collect();
        assert_eq!(bounds, [3, 3, 3, 3, 6, 12, 12, 12]);
    }
}
