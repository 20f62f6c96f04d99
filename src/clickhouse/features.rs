//! What one ClickHouse server knows, learnt before its first insert: its version, the
//! settings an insert pins where the server knows them (an old server answers an
//! unknown setting with code 115), and its deduplication windows.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::dedup::ServerDedup;

/// The settings an insert pins where the server knows them (an old server answers an
/// unknown setting with an error, code 115), learnt per server and kept in
/// [`KnownFeatures`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerFeatures {
    pub version: String,
    /// `async_insert` (21.11+): pinned to 0 so one bad row cannot fail a neighbour's
    /// batch merged by the server.
    pub async_insert: bool,
    pub date_time_input_format: bool,
    /// `input_format_skip_unknown_fields`: sent on every insert, 0 unless the table opts
    /// in, because current servers default it to 1 and would drop an unknown field
    /// silently where Sluice parks the row (code 117).
    pub skip_unknown_fields: bool,
    /// `insert_deduplication_token` (22.2+): sent with the inserts of a recorded batch
    /// (exactly-once); older servers deduplicate the identical block by its hash.
    pub insert_deduplication_token: bool,
    /// `insert_deduplicate` (every supported server): pinned to 1 for a recorded batch
    /// and to 0 for any other, so a table Sluice inserts at least once keeps two
    /// batches that happen to carry the same rows.
    pub insert_deduplicate: bool,
    /// `deduplicate_insert` (26.2+, default `enable`): overrides `insert_deduplicate`
    /// there, so it is pinned beside it: `enable` for a recorded batch, `disable` for
    /// any other (with `insert_deduplicate=0` alone, 26.x still drops a batch equal to
    /// an earlier one).
    pub deduplicate_insert: bool,
    /// The server's deduplication windows and what a dropped retry does to views, for
    /// telling which tables are exactly-once.
    pub dedup: ServerDedup,
}

/// What one server said of itself, and when. Asked again once older than the refresh
/// (with the tables' own, [`FEATURES_TTL`]), and at once after it is forgotten: after
/// an outage (the server may come back another: restarted with other settings,
/// downgraded, replaced behind the URL) or a setting refused as unknown.
#[derive(Debug, Default)]
pub struct KnownFeatures {
    known: Mutex<Option<(Arc<ServerFeatures>, Instant)>>,
}

/// How long what a server said of itself is trusted: the table refresh's period.
pub const FEATURES_TTL: Duration = Duration::from_secs(60);

// === impl KnownFeatures ===

impl KnownFeatures {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Arc<ServerFeatures>, Instant)>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the server said, unless it is older than [`FEATURES_TTL`] or forgotten.
    pub fn fresh(&self) -> Option<Arc<ServerFeatures>> {
        let known = self.lock();
        let (features, at) = known.as_ref()?;
        (at.elapsed() < FEATURES_TTL).then(|| features.clone())
    }

    /// Keeps what the server said now; returns it, and what it said before when that
    /// differs (to be logged).
    pub fn remember(
        &self,
        features: ServerFeatures,
    ) -> (Arc<ServerFeatures>, Option<Arc<ServerFeatures>>) {
        let features = Arc::new(features);
        let mut known = self.lock();
        let before = known
            .take()
            .map(|(before, _)| before)
            .filter(|before| **before != *features);
        *known = Some((features.clone(), Instant::now()));
        (features, before)
    }

    /// Asks again before the next insert.
    pub fn forget(&self) {
        if let Some((_, at)) = self.lock().as_mut() {
            // Kept for the comparison in `remember`, but no longer fresh.
            *at = Instant::now()
                .checked_sub(FEATURES_TTL)
                .unwrap_or_else(Instant::now);
        }
    }
}

// === impl ServerFeatures ===

impl ServerFeatures {
    /// One line for the startup log and `sluice check-config`: the version, which of the
    /// settings Sluice pins the server knows (and so is sent), and its windows.
    pub fn describe(&self) -> String {
        let mut out = format!("ClickHouse {}", self.version);
        let known: Vec<&str> = [
            (self.async_insert, "async_insert=0"),
            (self.insert_deduplicate, "insert_deduplicate"),
            (self.deduplicate_insert, "deduplicate_insert"),
            (
                self.insert_deduplication_token,
                "insert_deduplication_token",
            ),
            (
                self.dedup.views_see_retries,
                "deduplicate_blocks_in_dependent_materialized_views",
            ),
            (self.skip_unknown_fields, "input_format_skip_unknown_fields"),
            (self.date_time_input_format, "date_time_input_format"),
        ]
        .into_iter()
        .filter_map(|(known, name)| known.then_some(name))
        .collect();
        let _ = write!(out, "; pins {}", known.join(", "));
        let window = |value: Option<u64>| value.map_or("unknown".to_owned(), |v| v.to_string());
        let _ = write!(
            out,
            "; replicated_deduplication_window {} ({} s), non_replicated_deduplication_window {}",
            window(self.dedup.replicated_window),
            window(self.dedup.replicated_window_seconds),
            self.dedup
                .non_replicated_window
                .map_or("unknown to this server".to_owned(), |v| v.to_string()),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_the_version_the_pinned_settings_and_the_windows() {
        let features = ServerFeatures {
            version: "18.16.1".into(),
            date_time_input_format: true,
            skip_unknown_fields: true,
            insert_deduplicate: true,
            dedup: ServerDedup {
                replicated_window: Some(100),
                replicated_window_seconds: Some(604_800),
                ..ServerDedup::default()
            },
            ..ServerFeatures::default()
        };
        assert_eq!(
            features.describe(),
            "ClickHouse 18.16.1; pins insert_deduplicate, input_format_skip_unknown_fields, \
             date_time_input_format; replicated_deduplication_window 100 (604800 s), \
             non_replicated_deduplication_window unknown to this server"
        );
    }
}
