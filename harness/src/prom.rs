//! Reading Prometheus text (what `GET /metrics` answers) the way a scraper does:
//! samples with their labels and values, so tests assert on names, label sets and
//! values instead of on substrings; the metric names a PromQL expression uses; and
//! Prometheus's own checker, `promtool` (Debian's package `prometheus`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context as _, Result};

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

    /// The family (a `# TYPE` name with samples on the page) a sample name belongs to:
    /// the name itself, or for `x_bucket` a histogram `x`, for `x_sum` and `x_count` a
    /// histogram or summary `x`. A counter that happens to end in `_count` is its own
    /// family, never taken for part of another.
    pub fn family_of(&self, name: &str) -> Option<&str> {
        let has_samples = |family: &str| !self.family(family).is_empty();
        if let Some((family, _)) = self.types.get_key_value(name) {
            return has_samples(family).then_some(family.as_str());
        }
        for suffix in FAMILY_SUFFIXES {
            let Some(base) = name.strip_suffix(suffix) else {
                continue;
            };
            let Some((family, kind)) = self.types.get_key_value(base) else {
                continue;
            };
            let fits = match *suffix {
                "_bucket" => kind == "histogram",
                _ => kind == "histogram" || kind == "summary",
            };
            if fits && has_samples(family) {
                return Some(family.as_str());
            }
        }
        None
    }
}

/// PromQL words that are never metric names: aggregations, functions (a name before
/// `(` is one anyway; these are listed for `sum by (x) (...)`) and keywords; with
/// [`LABEL_LISTS`], the modifiers.
const PROMQL_WORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "start",
    "end",
];

/// Words followed by a parenthesised list of label names, not of expressions.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The metric names a PromQL expression (or a Grafana query, with its `$variables` and
/// `label_values(metric, label)`) selects: every bare identifier that is not a function,
/// a keyword, a label list, a label matcher, a string, a range or a number.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    // Bounded: every step moves `i` forward by at least one.
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => i = skip_string(&chars, i),
            '{' => i = skip_group(&chars, i, '{', '}'),
            '[' => i = skip_group(&chars, i, '[', ']'),
            '#' => {
                i = chars[i..]
                    .iter()
                    .position(|c| *c == '\n')
                    .map_or(chars.len(), |n| i + n)
            }
            '$' => {
                i += 1;
                if chars.get(i) == Some(&'{') {
                    i = skip_group(&chars, i, '{', '}');
                } else {
                    i = skip_word(&chars, i);
                }
            }
            c if c.is_ascii_digit()
                || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                i = skip_word(&chars, i);
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let end = skip_word(&chars, i);
                let word: String = chars[i..end].iter().collect();
                let next = (end..chars.len()).find(|j| !chars[*j].is_whitespace());
                let call = next.is_some_and(|j| chars[j] == '(');
                i = end;
                if call && LABEL_LISTS.contains(&word.as_str()) {
                    i = next.map_or(end, |j| skip_group(&chars, j, '(', ')'));
                } else if call && word == "label_values" {
                    // Grafana: label_values(label) or label_values(metric, label).
                    let open = next.unwrap_or(end);
                    let close = skip_group(&chars, open, '(', ')');
                    let inner: String = chars[open + 1..close.saturating_sub(1).max(open + 1)]
                        .iter()
                        .collect();
                    if let Some((metric, _label)) = split_top_level_comma(&inner) {
                        names.extend(metric_names(metric));
                    }
                    i = close;
                } else if !call
                    && !PROMQL_WORDS.contains(&word.as_str())
                    && !LABEL_LISTS.contains(&word.as_str())
                {
                    names.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// The index after the identifier (or number, duration) starting at `i`.
fn skip_word(chars: &[char], i: usize) -> usize {
    let mut j = i;
    while j < chars.len()
        && (chars[j].is_ascii_alphanumeric() || matches!(chars[j], '_' | ':' | '.'))
    {
        j += 1;
    }
    j.max(i + 1).min(chars.len())
}

/// The index after the string starting at `i` (its quote), escapes included.
fn skip_string(chars: &[char], i: usize) -> usize {
    let quote = chars[i];
    let mut j = i + 1;
    while j < chars.len() {
        match chars[j] {
            '\\' if quote != '`' => j += 2,
            c if c == quote => return j + 1,
            _ => j += 1,
        }
    }
    chars.len()
}

/// The index after the group opened at `i`, nested groups and strings included.
fn skip_group(chars: &[char], i: usize, open: char, close: char) -> usize {
    let mut depth = 0usize;
    let mut j = i;
    while j < chars.len() {
        match chars[j] {
            '"' | '\'' | '`' => {
                j = skip_string(chars, j);
                continue;
            }
            c if c == open => depth += 1,
            c if c == close => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return j + 1;
                }
            }
            _ => {}
        }
        j += 1;
    }
    chars.len()
}

/// `a, b` → (`a`, `b`) at the first comma outside parentheses, braces and strings.
fn split_top_level_comma(text: &str) -> Option<(&str, &str)> {
    let mut depth = 0i32;
    let mut quote = None;
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'' | '`') => quote = Some(c),
            (None, '(' | '{' | '[') => depth += 1,
            (None, ')' | '}' | ']') => depth -= 1,
            (None, ',') if depth == 0 => return Some((&text[..i], &text[i + 1..])),
            _ => {}
        }
    }
    None
}

// === promtool ===

/// `promtool` on `PATH`, or an error naming the package that provides it.
pub fn promtool_binary() -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("promtool"))
        .find(|p| p.is_file())
        .context("promtool is not installed (none on PATH): run `apt-get install prometheus`")
}

/// `promtool check metrics` on a `/metrics` page: Ok when it finds nothing to say (no
/// parse error, no lint problem); otherwise an error with what it said.
pub fn promtool_check_metrics(promtool: &Path, text: &str) -> Result<()> {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {} check metrics", promtool.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(text.as_bytes())
            .context("writing the page to promtool")?;
    }
    let output = child.wait_with_output().context("waiting for promtool")?;
    promtool_verdict("check metrics", output)
}

/// `promtool check rules FILE`: Ok when the rules parse and pass its checks.
pub fn promtool_check_rules(promtool: &Path, file: &Path) -> Result<()> {
    let output = Command::new(promtool)
        .args(["check", "rules"])
        .arg(file)
        .output()
        .with_context(|| format!("running {} check rules", promtool.display()))?;
    if !String::from_utf8_lossy(&output.stdout).contains("SUCCESS") {
        bail!(
            "promtool check rules {} found no rules: {}",
            file.display(),
            String::from_utf8_lossy(&output.stdout)
        );
    }
    promtool_verdict("check rules", output)
}

fn promtool_verdict(what: &str, output: std::process::Output) -> Result<()> {
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let quiet = what != "check metrics" || said.trim().is_empty();
    if output.status.success() && quiet {
        Ok(())
    } else {
        bail!("promtool {what} ({}): {said}", output.status)
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

    #[test]
    fn a_family_is_found_by_its_sample_names_only_where_its_type_allows() {
        let text = "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 0\nh_sum 0\nh_count 0\n\
                    # TYPE c counter\nc 1\n# TYPE g_count gauge\ng_count 2\n\
                    # TYPE empty counter\n";
        let m = Metrics::parse(text).expect("parses");
        for (name, family) in [
            ("h", Some("h")),
            ("h_bucket", Some("h")),
            ("h_sum", Some("h")),
            ("h_count", Some("h")),
            ("c", Some("c")),
            ("c_count", None),
            ("c_bucket", None),
            ("g_count", Some("g_count")),
            ("g", None),
            ("empty", None),
            ("missing", None),
        ] {
            assert_eq!(m.family_of(name), family, "{name}");
        }
    }

    #[test]
    fn promtool_says_when_a_page_or_a_rule_is_wrong() -> Result<()> {
        let Some(promtool) = crate::available(
            "promtool_says_when_a_page_or_a_rule_is_wrong",
            promtool_binary(),
        )?
        else {
            return Ok(());
        };
        let good = "# HELP a_total Things.\n# TYPE a_total counter\na_total{k=\"v\"} 0\n";
        promtool_check_metrics(&promtool, good)?;
        let unlinted = "# TYPE a counter\na 1\n";
        let error = promtool_check_metrics(&promtool, unlinted)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("_total"), "{error}");
        assert!(promtool_check_metrics(&promtool, "garbage{\n").is_err());

        let dir = tempfile::tempdir()?;
        let rules = dir.path().join("rules.yaml");
        std::fs::write(
            &rules,
            "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: a_total > 0\n",
        )?;
        promtool_check_rules(&promtool, &rules)?;
        std::fs::write(
            &rules,
            "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: sum(a_total\n",
        )?;
        assert!(promtool_check_rules(&promtool, &rules).is_err());
        Ok(())
    }

    #[test]
    fn metric_names_are_read_out_of_promql() {
        let names = |expr: &str| -> Vec<String> { metric_names(expr).into_iter().collect() };
        assert_eq!(
            names(
                r#"sum by (tenant, table) (increase(sluice_rows_parked_total{reason!="x"}[10m])) > 0"#
            ),
            ["sluice_rows_parked_total"]
        );
        assert_eq!(
            names("histogram_quantile(0.99, sum by (target, le) (rate(sluice_insert_duration_seconds_bucket[5m]))) > 20"),
            ["sluice_insert_duration_seconds_bucket"]
        );
        assert_eq!(
            names("sum(rate(a_total[5m])) / ignoring(x) group_left(y) sum without (z) (b) and on() c offset 5m > bool 1e3"),
            ["a_total", "b", "c"]
        );
        assert_eq!(
            names(
                r#"max(sluice_breaker_state{target=~"$target"}) or vector(0) # a comment sluice_x"#
            ),
            ["sluice_breaker_state"]
        );
        assert_eq!(
            names("rate(sluice_rows_inserted_total{tenant=\"$tenant\"}[$__rate_interval]) * ${factor} + $other"),
            ["sluice_rows_inserted_total"]
        );
        assert_eq!(
            names("label_values(sluice_breaker_state, target)"),
            ["sluice_breaker_state"]
        );
        assert_eq!(names("label_values(target)"), Vec::<String>::new());
        assert_eq!(
            names("process_resident_memory_bytes"),
            ["process_resident_memory_bytes"]
        );
    }
}
