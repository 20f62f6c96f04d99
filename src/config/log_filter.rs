//! `[log] level` (and `RUST_LOG`, which takes its place when set): a `tracing` filter,
//! checked more strictly than `tracing` does.
//!
//! Why stricter: a filter directive that is one word and not a level is a *target*
//! (`eror` enables every level of a module called `eror`), so a typo in the level is
//! a valid filter that turns off every other log line, and a service that says nothing
//! about a wrong password. Here each directive is a level, or `target=level`.

use std::fmt;

use serde::{Deserialize, Deserializer};

/// The levels a directive may name, from the most to the least said.
pub const LEVELS: &[&str] = &["trace", "debug", "info", "warn", "error", "off"];

/// A checked filter, as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogFilter(pub String);

impl LogFilter {
    /// The filter, or why it is refused (a sentence that lists what is accepted).
    pub fn parse(text: &str) -> Result<LogFilter, String> {
        let directives: Vec<&str> = text
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .collect();
        if directives.is_empty() {
            return Err(format!("{text:?} names no level: {}", ACCEPTED));
        }
        for directive in directives {
            let level = match directive.rsplit_once('=') {
                Some((target, level)) if !target.trim().is_empty() => level.trim(),
                Some(_) => {
                    return Err(format!(
                        "{text:?}: `{directive}` names no target before `=`; {ACCEPTED}"
                    ))
                }
                None => directive,
            };
            if !is_level(level) {
                return Err(format!(
                    "{text:?}: `{level}` is not a level; {ACCEPTED} (a word alone that is no level would be taken for a module name and turn off every other log line)"
                ));
            }
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(text) {
            return Err(format!("{text:?} is not a filter ({e}); {ACCEPTED}"));
        }
        Ok(LogFilter(text.to_string()))
    }
}

/// What every refusal says is accepted.
const ACCEPTED: &str = "write a level (trace, debug, info, warn, error or off), or levels by module as `module=level`, e.g. \"info\" or \"info,sluice_actors=debug\"";

fn is_level(word: &str) -> bool {
    LEVELS.iter().any(|l| l.eq_ignore_ascii_case(word))
}

impl fmt::Display for LogFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for LogFilter {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        LogFilter::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_module_levels_are_taken() {
        for ok in [
            "info",
            "ERROR",
            " warn ",
            "info,sluice_actors=debug",
            "warn,sluice::nats=trace,",
            "off",
            "sluice[flush{table=events}]=debug",
        ] {
            assert!(
                LogFilter::parse(ok).is_ok(),
                "{ok}: {:?}",
                LogFilter::parse(ok)
            );
        }
    }

    #[test]
    fn a_word_that_is_no_level_is_refused_with_what_is_accepted() {
        for (bad, named) in [
            ("eror", "`eror` is not a level"),
            ("loud", "`loud` is not a level"),
            ("info,sluice_actors", "`sluice_actors` is not a level"),
            ("sluice=verbose", "`verbose` is not a level"),
            ("=debug", "names no target"),
            ("", "names no level"),
            (" , ", "names no level"),
        ] {
            let e = LogFilter::parse(bad).expect_err(bad);
            assert!(e.contains(named), "{bad}: {e}");
            assert!(
                e.contains("trace, debug, info, warn, error or off"),
                "{bad}: {e}"
            );
        }
    }
}
