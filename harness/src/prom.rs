//! Reading Prometheus text (what `GET /metrics` answers) the way a scraper does:
//! samples with their labels and values, so tests assert on names, label sets and
//! values instead of on substrings.

use std::collections::{BTreeMap, BTreeSet};

/// One sample line: `name{labels} value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed `/metrics` page.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub samples: Vec<Sample>,
    /// `# TYPE` lines: family name → `counter`, `gauge`, `histogram`, `summary`...
    pub types: BTreeMap<String, String>,
}

/// The suffixes a histogram or summary family's samples carry.
const FAMILY_SUFFIXES: &[&str] = &["_bucket", "_sum", "_count"];

// === impl Metrics ===

impl Metrics {
    /// Parses Prometheus text exposition format (version 0.0.4). Lines it cannot read
    /// are an error naming the line: a page a scraper would choke on is a bug.
    pub fn parse(text: &str) -> anyhow::Result<Metrics> {
        let mut out = Metrics::default();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix('#') {
                let mut words = rest.split_whitespace();
                if words.next() == Some("TYPE") {
                    if let (Some(name), Some(kind)) = (words.next(), words.next()) {
                        out.types.insert(name.to_string(), kind.to_string());
                    }
                }
                continue;
            }
            let sample = parse_sample(line)
                .ok_or_else(|| anyhow::anyhow!("line {}: not a sample: {line}", n + 1))?;
            out.samples.push(sample);
        }
        Ok(out)
    }

    /// The samples of a family: `name` itself and, for histograms and summaries,
    /// `name_bucket`, `name_sum` and `name_count`.
    pub fn family(&self, name: &str) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| {
                s.name == name
                    || FAMILY_SUFFIXES
                        .iter()
                        .any(|suffix| s.name.strip_suffix(suffix) == Some(name))
            })
            .collect()
    }

    /// The label names each sample of a family carries, without the histogram's `le`
    /// and the summary's `quantile`: one set per distinct shape seen.
    pub fn label_sets(&self, name: &str) -> BTreeSet<BTreeSet<String>> {
        self.family(name)
            .into_iter()
            .map(|s| {
                s.labels
                    .keys()
                    .filter(|k| *k != "le" && *k != "quantile")
                    .cloned()
                    .collect()
            })
            .collect()
    }

    /// The value of the sample named exactly `name` whose labels include `labels`
    /// (summed when several match, e.g. across tenants); `None` when none matches.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let matching: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
            .collect();
        if matching.is_empty() {
            None
        } else {
            Some(matching.iter().sum())
        }
    }
}

fn parse_sample(line: &str) -> Option<Sample> {
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => return None,
    };
    let (labels, rest) = if let Some(body) = rest.strip_prefix('{') {
        parse_labels(body)?
    } else {
        (BTreeMap::new(), rest)
    };
    // A value, optionally followed by a timestamp.
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse().ok()?,
    };
    if name.is_empty() {
        return None;
    }
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// `k="v",k2="v2"} rest` → the labels and `rest`.
fn parse_labels(mut s: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    loop {
        s = s.trim_start_matches([' ', ',']);
        if let Some(rest) = s.strip_prefix('}') {
            return Some((labels, rest));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim().to_string();
        let mut chars = s[eq + 1..].char_indices();
        if chars.next()?.1 != '"' {
            return None;
        }
        let mut value = String::new();
        let mut end = None;
        let mut escaped = false;
        for (i, c) in chars {
            if escaped {
                value.push(match c {
                    'n' => '\n',
                    other => other,
                });
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                end = Some(eq + 1 + i + 1);
                break;
            } else {
                value.push(c);
            }
        }
        labels.insert(key, value);
        s = &s[end?..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_counters_gauges_and_histograms() {
        let text = r#"
# HELP sluice_rows_inserted_total Rows inserted.
# TYPE sluice_rows_inserted_total counter
sluice_rows_inserted_total{tenant="acme",table="events"} 3
sluice_rows_inserted_total{tenant="b",table="events"} 4
# TYPE sluice_breaker_state gauge
sluice_breaker_state{target="main"} 0
# TYPE sluice_insert_duration_seconds histogram
sluice_insert_duration_seconds_bucket{target="main",le="0.005"} 1
sluice_insert_duration_seconds_bucket{target="main",le="+Inf"} 2
sluice_insert_duration_seconds_sum{target="main"} 0.25
sluice_insert_duration_seconds_count{target="main"} 2
sluice_query_retries_total 0
weird{msg="a \"quoted\", value"} 1 1700000000
"#;
        let m = Metrics::parse(text).expect("parses");
        assert_eq!(
            m.value("sluice_rows_inserted_total", &[("table", "events")]),
            Some(7.0)
        );
        assert_eq!(
            m.value("sluice_rows_inserted_total", &[("tenant", "acme")]),
            Some(3.0)
        );
        assert_eq!(
            m.value("sluice_rows_inserted_total", &[("tenant", "x")]),
            None
        );
        assert_eq!(m.family("sluice_insert_duration_seconds").len(), 4);
        let sets = m.label_sets("sluice_insert_duration_seconds");
        assert_eq!(sets.len(), 1);
        assert!(sets.iter().all(|s| s.iter().eq(["target"].iter())));
        assert_eq!(m.value("sluice_query_retries_total", &[]), Some(0.0));
        assert_eq!(
            m.samples.last().map(|s| s.labels["msg"].as_str()),
            Some("a \"quoted\", value")
        );
        assert_eq!(m.types["sluice_breaker_state"], "gauge");
        assert!(Metrics::parse("garbage line").is_err());
    }
}
