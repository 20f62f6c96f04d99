//! The settings an insert pins, whatever the user's profile or the server's defaults
//! say, each only where the server knows it (an unknown setting is refused with code
//! 115, see [`ServerFeatures`]).
//!
//! - `async_insert=0`: the server must not merge one batch with another's rows (26.3+
//!   turns it on by default), or one bad row fails a neighbour's batch and a batch's
//!   answer no longer says whether its rows are in.
//! - `date_time_input_format=best_effort`, `input_format_skip_unknown_fields` as the
//!   table asks (current servers default it to 1 and would drop an unknown field
//!   silently where Sluice parks the row).
//! - deduplication: a recorded batch (it has a token) is deduplicated, by its token
//!   where the server knows one, its retries reaching the views where the server can;
//!   any other batch is not, or two batches that happen to carry the same rows would
//!   count once in a table inserted at least once. On 26.2+ `deduplicate_insert`
//!   (default `enable`) overrides `insert_deduplicate`, so both are pinned.

use super::features::ServerFeatures;

/// `(setting, value)` for an insert on a server with `features`: of a recorded batch
/// when it has a `token`, skipping unknown fields or not as its table asks.
pub fn pinned_settings<'a>(
    features: &ServerFeatures,
    token: Option<&'a str>,
    skip_unknown_fields: bool,
) -> Vec<(&'static str, &'a str)> {
    let mut settings = Vec::new();
    if features.async_insert {
        settings.push(("async_insert", "0"));
    }
    if features.date_time_input_format {
        settings.push(("date_time_input_format", "best_effort"));
    }
    if features.skip_unknown_fields {
        let skip = if skip_unknown_fields { "1" } else { "0" };
        settings.push(("input_format_skip_unknown_fields", skip));
    }
    let recorded = token.is_some();
    if features.insert_deduplicate {
        settings.push(("insert_deduplicate", if recorded { "1" } else { "0" }));
    }
    if features.deduplicate_insert {
        let mode = if recorded { "enable" } else { "disable" };
        settings.push(("deduplicate_insert", mode));
    }
    if let Some(token) = token {
        if features.dedup.views_see_retries {
            settings.push(("deduplicate_blocks_in_dependent_materialized_views", "1"));
        }
        if features.insert_deduplication_token {
            settings.push(("insert_deduplication_token", token));
        }
    }
    settings
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clickhouse::dedup::ServerDedup;

    /// What 26.9 knows (chdb-core 26.9.0).
    fn current() -> ServerFeatures {
        ServerFeatures {
            version: "26.9.2.1".into(),
            async_insert: true,
            date_time_input_format: true,
            skip_unknown_fields: true,
            insert_deduplication_token: true,
            insert_deduplicate: true,
            deduplicate_insert: true,
            dedup: ServerDedup {
                views_see_retries: true,
                ..ServerDedup::default()
            },
        }
    }

    /// What 18.16 knows.
    fn old() -> ServerFeatures {
        ServerFeatures {
            version: "18.16.1".into(),
            date_time_input_format: true,
            skip_unknown_fields: true,
            insert_deduplicate: true,
            ..ServerFeatures::default()
        }
    }

    #[test]
    fn an_unrecorded_batch_turns_deduplication_off_by_both_settings_on_a_current_server() {
        let settings = pinned_settings(&current(), None, false);
        assert_eq!(
            settings,
            [
                ("async_insert", "0"),
                ("date_time_input_format", "best_effort"),
                ("input_format_skip_unknown_fields", "0"),
                ("insert_deduplicate", "0"),
                ("deduplicate_insert", "disable"),
            ]
        );
    }

    #[test]
    fn a_recorded_batch_turns_it_on_with_its_token() {
        let settings = pinned_settings(&current(), Some("sluice-1-7"), false);
        for pair in [
            ("async_insert", "0"),
            ("insert_deduplicate", "1"),
            ("deduplicate_insert", "enable"),
            ("deduplicate_blocks_in_dependent_materialized_views", "1"),
            ("insert_deduplication_token", "sluice-1-7"),
        ] {
            assert!(settings.contains(&pair), "{pair:?} not in {settings:?}");
        }
    }

    #[test]
    fn a_server_is_sent_only_the_settings_it_knows() {
        for token in [None, Some("sluice-1-7")] {
            let names: Vec<&str> = pinned_settings(&old(), token, false)
                .into_iter()
                .map(|(name, _)| name)
                .collect();
            assert_eq!(
                names,
                [
                    "date_time_input_format",
                    "input_format_skip_unknown_fields",
                    "insert_deduplicate"
                ]
            );
        }
    }
}
