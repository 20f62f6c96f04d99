//! The file as written and the environment's overrides, as one document that knows
//! where each value came from: a line of the file or a `SLUICE_*` variable.
//!
//! Reading it into `FileConfig` reports every problem at once: a key serde refuses (an
//! unknown key, a wrong type, a size without a unit, an unknown choice) is noted with
//! its line and taken out, and the rest is read again, until what is left reads. The
//! keys taken out are then at their defaults, and `validate` leaves alone the problems
//! that involve them (they would only be echoes of the first).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use serde::Deserialize as _;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::env::Override;
use super::file::FileConfig;
use super::key::Key;

/// One problem with the configuration: the keys it is about (their lines are looked up
/// when it is shown) or, for a file that does not parse, the place itself.
#[derive(Clone, Debug)]
pub struct Problem {
    pub keys: Vec<Key>,
    /// A byte offset into the file, for problems no key names (a syntax error).
    pub offset: Option<usize>,
    pub text: String,
}

impl Problem {
    /// A problem about these keys.
    pub fn about(keys: &[&Key], text: impl Into<String>) -> Problem {
        Problem {
            keys: keys.iter().map(|k| (*k).clone()).collect(),
            offset: None,
            text: text.into(),
        }
    }

    /// A problem that names no key (it names what it is about in its text).
    pub fn general(text: impl Into<String>) -> Problem {
        Problem::about(&[], text)
    }
}

/// Where a value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The file's line (from 1).
    Line(usize),
    /// The environment variable that overrides it.
    Variable(String),
}

/// The document: the parsed file with the overrides applied.
pub struct Document<'t> {
    text: &'t str,
    root: Spanned<DeTable<'t>>,
    /// The variable of each override, by its place past the end of the text (values
    /// from the environment are given spans there, so a span says where a value came
    /// from).
    variables: Vec<String>,
    /// Problems found so far.
    pub problems: Vec<Problem>,
    /// The file has a syntax error: what was read of it may not be what was meant.
    pub broken: bool,
}

/// What reading the document gave.
pub struct Read {
    pub file: FileConfig,
    /// Keys whose values were refused (they are at their defaults).
    pub refused: Vec<Key>,
}

impl<'t> Document<'t> {
    /// Parse the file, noting each syntax error with its line (as much of the file as
    /// parses is kept).
    pub fn parse(text: &'t str) -> Document<'t> {
        let (root, errors) = DeTable::parse_recoverable(text);
        let problems: Vec<Problem> = errors
            .iter()
            .map(|e| Problem {
                keys: Vec::new(),
                offset: e.span().map(|s| s.start),
                text: format!("not TOML: {}", e.message().trim()),
            })
            .collect();
        Document {
            text,
            root,
            variables: Vec::new(),
            broken: !problems.is_empty(),
            problems,
        }
    }

    /// Every variable a `*_env` key names: they hold secrets, never overrides.
    pub fn secret_variables(&self) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        let mut tables = vec![self.root.get_ref()];
        // Bounded by the document: each table is visited once.
        while let Some(table) = tables.pop() {
            for (key, value) in table.iter() {
                match value.get_ref() {
                    DeValue::Table(inner) => tables.push(inner),
                    DeValue::String(var) if key.get_ref().ends_with("_env") => {
                        names.insert(var.to_string());
                    }
                    _ => {}
                }
            }
        }
        names
    }

    /// Apply the environment's overrides; `literals[i]` is the TOML text of
    /// `overrides[i]`'s value (kept by the caller, as the document borrows it).
    pub fn apply<'l>(self, overrides: &[Override], literals: &'l [String]) -> Document<'l>
    where
        't: 'l,
    {
        let mut doc: Document<'l> = self;
        for (o, literal) in overrides.iter().zip(literals) {
            let span = doc.next_variable_span(&o.var);
            let value = match DeValue::parse(literal) {
                Ok(v) => v.into_inner(),
                Err(e) => {
                    doc.problems.push(Problem::general(format!(
                        "{}: cannot be read as TOML: {}",
                        o.var,
                        e.message().trim()
                    )));
                    continue;
                }
            };
            let Some((last, parents)) = o.path.split_last() else {
                continue;
            };
            let mut table = doc.root.get_mut();
            for part in parents {
                let entry = table
                    .entry(Spanned::new(span.clone(), Cow::Owned(part.clone())))
                    .or_insert_with(|| Spanned::new(span.clone(), DeValue::Table(DeTable::new())));
                if !matches!(entry.get_ref(), DeValue::Table(_)) {
                    *entry = Spanned::new(span.clone(), DeValue::Table(DeTable::new()));
                }
                let DeValue::Table(inner) = entry.get_mut() else {
                    unreachable!("just made a table");
                };
                table = inner;
            }
            table.insert(
                Spanned::new(span.clone(), Cow::Owned(last.clone())),
                Spanned::new(span, value),
            );
        }
        doc
    }

    /// A span past the end of the text standing for the variable `var`.
    fn next_variable_span(&mut self, var: &str) -> Range<usize> {
        let at = self.text.len() + 1 + self.variables.len();
        self.variables.push(var.to_string());
        at..at + 1
    }

    /// Read the document into `FileConfig`: each key serde refuses is noted with where
    /// it came from and taken out, and the rest read again.
    pub fn read(&mut self) -> Option<Read> {
        let mut refused = Vec::new();
        // Each round takes one entry out, so there are at most as many as entries.
        for _ in 0..=MAX_ROUNDS {
            let error =
                match FileConfig::deserialize(toml::de::Deserializer::from(self.root.clone())) {
                    Ok(file) => return Some(Read { file, refused }),
                    Err(e) => e,
                };
            let found = error
                .span()
                .and_then(|span| locate(self.root.get_ref(), &span));
            let Some((path, table)) = found else {
                // Nothing to take out: the problem is reported, the file not used.
                self.problems.push(Problem {
                    keys: Vec::new(),
                    offset: error.span().map(|s| s.start),
                    text: error.message().trim().to_string(),
                });
                return None;
            };
            let key = Key::from_path(path, table);
            self.problems.push(Problem::about(
                &[&key],
                format!("{key}: {}", in_plain_words(error.message().trim())),
            ));
            remove(self.root.get_mut(), key.path());
            refused.push(key);
        }
        self.problems.push(Problem::general(format!(
            "more than {MAX_ROUNDS} problems: fix these first"
        )));
        None
    }

    /// Where each key and table of the document came from.
    pub fn origins(&self) -> Origins {
        let mut by_path = BTreeMap::new();
        let mut stack = vec![(Vec::new(), self.root.get_ref())];
        // Bounded by the document: each table is visited once.
        while let Some((path, table)) = stack.pop() {
            for (key, value) in table.iter() {
                let mut here: Vec<String> = path.clone();
                here.push(key.get_ref().to_string());
                match value.get_ref() {
                    DeValue::Table(inner) => {
                        by_path.insert(here.clone(), self.origin_of(key.span().start));
                        stack.push((here, inner));
                    }
                    _ => {
                        by_path.insert(here, self.origin_of(value.span().start));
                    }
                }
            }
        }
        Origins {
            by_path,
            text: self.text.to_string(),
            variables: self.variables.clone(),
        }
    }

    fn origin_of(&self, offset: usize) -> Origin {
        origin_of(self.text, &self.variables, offset)
    }
}

/// serde names the Rust type a value was expected as; an operator reads a number.
fn in_plain_words(message: &str) -> String {
    const TYPES: &[(&str, &str)] = &[
        ("usize", "a whole number"),
        ("u64", "a whole number"),
        ("u32", "a whole number"),
        ("i64", "a whole number"),
        ("f64", "a number"),
    ];
    for (rust, plain) in TYPES {
        if let Some(start) = message.strip_suffix(&format!("expected {rust}")) {
            return format!("{start}expected {plain}");
        }
    }
    message.to_string()
}

/// More rounds than any real file has keys: a stop for a file written to make many.
const MAX_ROUNDS: usize = 500;

fn origin_of(text: &str, variables: &[String], offset: usize) -> Origin {
    match offset.checked_sub(text.len() + 1) {
        Some(i) if i < variables.len() => Origin::Variable(variables[i].clone()),
        _ => Origin::Line(1 + text[..offset.min(text.len())].matches('\n').count()),
    }
}

/// The deepest entry whose key or value holds the start of `span`, and whether it is
/// a table.
fn locate(table: &DeTable<'_>, span: &Range<usize>) -> Option<(Vec<String>, bool)> {
    let holds = |r: Range<usize>| r.start == span.start || r.contains(&span.start);
    for (key, value) in table.iter() {
        if !(holds(key.span()) || holds(value.span())) {
            continue;
        }
        let name = key.get_ref().to_string();
        return match value.get_ref() {
            DeValue::Table(inner) => match locate(inner, span) {
                Some((mut path, is_table)) => {
                    path.insert(0, name);
                    Some((path, is_table))
                }
                None => Some((vec![name], true)),
            },
            _ => Some((vec![name], false)),
        };
    }
    // A value in a table whose header is elsewhere (dotted keys, a table defined in
    // parts): look inside every table.
    for (key, value) in table.iter() {
        if let DeValue::Table(inner) = value.get_ref() {
            if let Some((mut path, is_table)) = locate(inner, span) {
                path.insert(0, key.get_ref().to_string());
                return Some((path, is_table));
            }
        }
    }
    None
}

fn remove(table: &mut DeTable<'_>, path: &[String]) {
    match path {
        [] => {}
        [last] => {
            table.remove(last.as_str());
        }
        [first, rest @ ..] => {
            if let Some(DeValue::Table(inner)) = table.get_mut(first.as_str()).map(|v| v.get_mut())
            {
                remove(inner, rest);
            }
        }
    }
}

/// Where each key was set, to say it in a problem.
pub struct Origins {
    by_path: BTreeMap<Vec<String>, Origin>,
    text: String,
    variables: Vec<String>,
}

impl Origins {
    /// The problem with where its keys were set in front: `line 12: ...`,
    /// `lines 3, 12: ...`, `SLUICE_API_AUTH: ...`. Keys at their defaults have no place.
    pub fn show(&self, problem: &Problem) -> String {
        let mut lines = BTreeSet::new();
        let mut variables = BTreeSet::new();
        let mut note = |origin: Origin| match origin {
            Origin::Line(n) => {
                lines.insert(n);
            }
            Origin::Variable(v) => {
                variables.insert(v);
            }
        };
        if let Some(offset) = problem.offset {
            note(origin_of(&self.text, &self.variables, offset));
        }
        for key in &problem.keys {
            if let Some(origin) = self.by_path.get(key.path()) {
                note(origin.clone());
            }
        }
        let mut places: Vec<String> = Vec::new();
        match lines.len() {
            0 => {}
            1 => places.extend(lines.iter().map(|n| format!("line {n}"))),
            _ => places.push(format!(
                "lines {}",
                lines
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
        places.extend(variables);
        if places.is_empty() {
            problem.text.clone()
        } else {
            format!("{}: {}", places.join(", "), problem.text)
        }
    }

    /// The first line a problem is about, to list problems in the file's order.
    pub fn first_line(&self, problem: &Problem) -> Option<usize> {
        let from_offset = problem
            .offset
            .map(|o| origin_of(&self.text, &self.variables, o));
        from_offset
            .into_iter()
            .chain(
                problem
                    .keys
                    .iter()
                    .filter_map(|k| self.by_path.get(k.path()).cloned()),
            )
            .filter_map(|o| match o {
                Origin::Line(n) => Some(n),
                Origin::Variable(_) => None,
            })
            .min()
    }
}
