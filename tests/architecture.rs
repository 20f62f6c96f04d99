//! The tree reads as its architecture (docs/architecture.md, "Floors"): these tests read
//! the source of both crates and check what a reviewer would otherwise check by hand.
//!
//! - the actors crate's modules sit on floors, and no module imports one above its own;
//! - in both crates, no folder's children import each other in a circle;
//! - no production file is over 600 lines, no function over 100 (the OpenAPI
//!   documents' literals aside);
//! - no lock or atomic decides anything in the actors crate outside `observe` and
//!   `metrics` (the card: the actors are message-driven and lock-free).
//!
//! An import is any path through `crate::`, `super::` or `self::` (in `use` lines and in
//! code), with `use` trees expanded; code under `#[cfg(test)]` and the fakes of
//! `testkit` do not count.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The actors crate's floors, lowest first. A module may import its own floor's
/// neighbours only where no circle forms (checked apart), and any floor below.
const ACTOR_FLOORS: &[&[&str]] = &[
    &["ports"],
    &["backoff", "metrics", "rows", "messaging", "clock"],
    &["breaker"],
    &["observe"],
    &["placement"],
    &["settings", "restart", "lifecycle"],
    &["batch"],
    &["ledger"],
    &["context", "protocol"],
    &["settle"],
    &["flight"],
    &["routing"],
    &["table", "pool", "consumer"],
    &["targets"],
    &["supervisor"],
    &["pipeline"],
    &["lib"],
];

/// Modules outside the architecture: test fakes.
const NOT_ARCHITECTURE: &[&str] = &["testkit"];

const MAX_LINES: usize = 600;
const MAX_FN_LINES: usize = 100;

/// Where the actors crate may hold a lock or an atomic: what observers read without
/// blocking an actor, and the metrics.
const MAY_LOCK: &[&str] = &["observe", "metrics"];

/// One source file: its module path inside its crate and its production text.
struct Source {
    file: PathBuf,
    module: Vec<String>,
    code: String,
    /// Its lines, comments counted, test items not.
    lines: usize,
}

#[test]
fn no_actor_module_imports_a_floor_above_its_own() {
    let floor_of = |m: &str| ACTOR_FLOORS.iter().position(|f| f.contains(&m));
    let mut wrong = Vec::new();
    for (from, to) in edges_at(&sources("actors/src"), &[]) {
        let (Some(a), Some(b)) = (floor_of(&from), floor_of(&to)) else {
            if !NOT_ARCHITECTURE.contains(&from.as_str())
                && !NOT_ARCHITECTURE.contains(&to.as_str())
            {
                wrong.push(format!("{from} -> {to}: a module on no floor (add it to ACTOR_FLOORS and docs/architecture.md)"));
            }
            continue;
        };
        if b > a {
            wrong.push(format!("{from} (floor {a}) imports {to} (floor {b})"));
        }
    }
    assert!(
        wrong.is_empty(),
        "imports up a floor:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_folder_imports_in_a_circle() {
    let mut circles = Vec::new();
    for root in ["actors/src", "src"] {
        let sources = sources(root);
        let folders: BTreeSet<Vec<String>> = sources
            .iter()
            .flat_map(|s| (0..s.module.len()).map(|n| s.module[..n].to_vec()))
            .collect();
        for folder in folders {
            let edges = edges_at(&sources, &folder);
            if let Some(circle) = a_circle(&edges) {
                circles.push(format!("{root}/{}: {}", folder.join("/"), circle.join(" ")));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn no_production_file_is_over_600_lines() {
    let mut long = Vec::new();
    for root in ["actors/src", "src"] {
        for s in sources(root) {
            if NOT_ARCHITECTURE.contains(&s.module[0].as_str()) {
                continue;
            }
            if s.lines > MAX_LINES {
                long.push(format!("{}: {} lines", s.file.display(), s.lines));
            }
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} production lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn no_function_is_over_100_lines() {
    let mut long = Vec::new();
    for root in ["actors/src", "src"] {
        for s in sources(root) {
            if NOT_ARCHITECTURE.contains(&s.module[0].as_str()) {
                continue;
            }
            // The OpenAPI documents are JSON literals written as code.
            if s.file.ends_with("openapi.rs") {
                continue;
            }
            for (name, lines) in functions(&s.code) {
                if lines > MAX_FN_LINES {
                    long.push(format!("{}: fn {name}: {lines} lines", s.file.display()));
                }
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn no_actor_holds_a_lock_or_an_atomic() {
    let mut found = Vec::new();
    for s in sources("actors/src") {
        let top = s.module[0].as_str();
        if MAY_LOCK.contains(&top) || NOT_ARCHITECTURE.contains(&top) {
            continue;
        }
        for (n, line) in s.code.lines().enumerate() {
            if ["Mutex", "RwLock", "Atomic"]
                .iter()
                .any(|w| line.contains(w))
            {
                found.push(format!(
                    "{} (line {} of its code): {}",
                    s.file.display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "locks or atomics outside observe/ and metrics:\n{}",
        found.join("\n")
    );
}

/// Each function's name and its length in lines, signature to closing brace.
fn functions(code: &str) -> Vec<(String, usize)> {
    let b = code.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while let Some(at) = find(b, i, b"fn ") {
        i = at + 3;
        if at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_') {
            continue;
        }
        let name: String = code[i..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // Its body: the first `{` before a `;` (a declaration in a trait has none).
        let Some(open) = (i..b.len()).find(|&n| b[n] == b'{' || b[n] == b';') else {
            break;
        };
        if b[open] == b';' || name.is_empty() {
            continue;
        }
        let close = skip_item(b, open);
        let lines = code[at..close].lines().count();
        found.push((name, lines));
        // Functions inside it are inside its count; go on after it.
        i = close;
    }
    found
}

/// The checker itself: an import it must see, and a circle it must find.
#[test]
fn the_reader_sees_trees_supers_and_circles() {
    let code = strip("use crate::{a::{b, c::D}, e}; // crate::z\nfn f() { super::super::g::h(); }\n#[cfg(test)]\nmod tests { use crate::t; }");
    let found = paths_in(&code, &["x".into(), "y".into(), "w".into()]);
    let heads: BTreeSet<String> = found.iter().map(|p| p.join("::")).collect();
    assert!(
        heads.contains("a::b") && heads.contains("a::c::D") && heads.contains("e"),
        "{heads:?}"
    );
    assert!(heads.contains("x::g::h"), "{heads:?}");
    assert!(
        !heads
            .iter()
            .any(|h| h.starts_with('z') || h.starts_with('t')),
        "{heads:?}"
    );
    let edges: BTreeSet<(String, String)> = [("a", "b"), ("b", "c"), ("c", "a")]
        .iter()
        .map(|(x, y)| (x.to_string(), y.to_string()))
        .collect();
    assert!(a_circle(&edges).is_some());
}

/// Edges between the children of `folder`: child `a` has code that names child `b`.
fn edges_at(sources: &[Source], folder: &[String]) -> BTreeSet<(String, String)> {
    let depth = folder.len();
    let mut edges = BTreeSet::new();
    for s in sources {
        if s.module.len() <= depth || s.module[..depth] != *folder {
            continue;
        }
        let from = &s.module[depth];
        for path in paths_in(&s.code, &s.module) {
            if path.len() > depth && path[..depth] == *folder && path[depth] != *from {
                edges.insert((from.clone(), path[depth].clone()));
            }
        }
    }
    edges
}

/// The modules that import each other in a circle, one group per circle (the graph's
/// strongly connected components of more than one module), if any.
fn a_circle(edges: &BTreeSet<(String, String)>) -> Option<Vec<String>> {
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (a, b) in edges {
        next.entry(a).or_default().insert(b);
    }
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from];
        while let Some(n) = todo.pop() {
            for m in next.get(n).into_iter().flatten() {
                if seen.insert(*m) {
                    todo.push(m);
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&str, BTreeSet<&str>> = next.keys().map(|n| (*n, reach(n))).collect();
    let mut groups: BTreeSet<Vec<String>> = BTreeSet::new();
    for (n, r) in &reached {
        let group: Vec<String> = r
            .iter()
            .filter(|m| reached.get(*m).is_some_and(|back| back.contains(n)))
            .map(|m| m.to_string())
            .collect();
        if group.len() > 1 {
            groups.insert(group);
        }
    }
    (!groups.is_empty()).then(|| {
        groups
            .into_iter()
            .map(|g| format!("{{{}}}", g.join(", ")))
            .collect()
    })
}

/// Every `.rs` file under `root`, with its module path and production code.
fn sources(root: &str) -> Vec<Source> {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join(root);
    let mut files = Vec::new();
    let mut dirs = vec![base.clone()];
    while let Some(dir) = dirs.pop() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let read = |file: &PathBuf| {
        std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
    };
    let all: Vec<(PathBuf, Vec<String>, String)> = files
        .into_iter()
        .map(|file| {
            let rel = file.strip_prefix(&base).expect("under its root");
            let mut module: Vec<String> = rel
                .iter()
                .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            let own = module.last().is_some_and(|m| m == "mod" || m == "lib");
            if own {
                module.pop();
            }
            let text = read(&file);
            (file, module, text)
        })
        .collect();
    // Files that are test modules: declared `#[cfg(test)] mod name;` by their parent.
    let mut tests: Vec<Vec<String>> = Vec::new();
    for (file, module, text) in &all {
        let folder: Vec<String> = if file.ends_with("mod.rs") || file.ends_with("lib.rs") {
            module.clone()
        } else {
            module[..module.len().saturating_sub(1)].to_vec()
        };
        let mut rest = text.as_str();
        while let Some(at) = rest.find("#[cfg(test)]") {
            rest = &rest[at + "#[cfg(test)]".len()..];
            let item = rest.trim_start();
            if let Some(name) = item
                .strip_prefix("mod ")
                .and_then(|m| m.split_once(';'))
                .map(|(n, _)| n.trim())
            {
                let mut path = folder.clone();
                path.push(name.to_string());
                tests.push(path);
            }
        }
    }
    all.into_iter()
        .filter(|(_, module, _)| !tests.iter().any(|t| module.starts_with(t)))
        .map(|(file, mut module, text)| {
            if module.is_empty() {
                module.push("lib".into());
            }
            let lines = filter(&text, true).lines().count();
            Source {
                code: strip(&text),
                file,
                module,
                lines,
            }
        })
        .collect()
}

/// The text without comments, string literals and the `#[cfg(test)]` items.
fn strip(text: &str) -> String {
    filter(text, false)
}

/// The text without the `#[cfg(test)]` items; without comments and string literals
/// too unless `comments`.
fn filter(text: &str, comments: bool) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        let after_word = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if !comments && rest.starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if !comments && rest.starts_with(b"/*") {
            let end = find(b, i, b"*/").map_or(b.len(), |n| n + 2);
            out.extend(newlines(&b[i..end]));
            i = end;
        } else if !comments && b[i] == b'"' && !(i > 0 && b[i - 1] == b'\'') {
            let end = string_end(b, i).min(b.len());
            out.extend_from_slice(b"\"\"");
            out.extend(newlines(&b[i..end]));
            i = end;
        } else if !comments
            && !after_word
            && (rest.starts_with(b"r\"") || rest.starts_with(b"r#\"") || rest.starts_with(b"r##\""))
        {
            let hashes = rest[1..].iter().take_while(|c| **c == b'#').count();
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            let end = find(b, i + 2 + hashes, &close).map_or(b.len(), |n| n + close.len());
            out.extend_from_slice(b"\"\"");
            out.extend(newlines(&b[i..end]));
            i = end;
        } else if let Some(end) = (!comments).then(|| char_literal_end(b, i)).flatten() {
            // `'{'`, `b'"'`: a character, not a brace or a quote to match.
            out.extend_from_slice(b"'_'");
            i = end;
        } else if rest.starts_with(b"#[cfg(test)]") {
            i = skip_item(b, i + "#[cfg(test)]".len());
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Just past the character literal opening at `at`, if one does (not a lifetime).
fn char_literal_end(b: &[u8], at: usize) -> Option<usize> {
    if b[at] != b'\'' {
        return None;
    }
    let first = *b.get(at + 1)?;
    let len = if first == b'\\' {
        // An escape: `'\n'`, `'\''`, `'\u{..}'`.
        2 + b[at + 3..].iter().take(8).position(|c| *c == b'\'')?
    } else {
        // One character, of one to four bytes.
        match first {
            0..=0x7f => 1,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            _ => 4,
        }
    };
    (b.get(at + 1 + len) == Some(&b'\'')).then_some(at + 2 + len)
}

/// The line breaks in `b` (a skipped literal keeps its lines).
fn newlines(b: &[u8]) -> impl Iterator<Item = u8> + '_ {
    b.iter().copied().filter(|c| *c == b'\n')
}

/// Where `needle` starts in `b` at or after `from`.
fn find(b: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    (from..b.len().saturating_sub(needle.len() - 1)).find(|&n| b[n..].starts_with(needle))
}

/// Just past the string literal opening at `at`.
fn string_end(b: &[u8], at: usize) -> usize {
    let mut i = at + 1;
    while i < b.len() && b[i] != b'"' {
        i += if b[i] == b'\\' { 2 } else { 1 };
    }
    i + 1
}

/// The end of the item that starts at `from`: its `;`, or its braces closed.
fn skip_item(b: &[u8], from: usize) -> usize {
    let mut i = from;
    let mut depth = 0usize;
    while i < b.len() {
        match b[i] {
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            b';' if depth == 0 => return i + 1,
            b'"' => i = string_end(b, i) - 1,
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// Every path named through `crate::`, `super::` or `self::` in `code` (module path
/// `module`), as a path from the crate's root.
fn paths_in(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let b = code.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let at_word =
            i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b'$');
        if !at_word {
            i += 1;
            continue;
        }
        // The module the path starts from; a file's own module for `self`, its parent's
        // for `super` (a `mod.rs` is its folder's module).
        let mut base: Option<Vec<String>> = None;
        let mut j = i;
        if b[i..].starts_with(b"crate::") {
            base = Some(Vec::new());
            j += "crate::".len();
        } else if b[i..].starts_with(b"super::") || b[i..].starts_with(b"self::") {
            let mut m = if module == ["lib"] {
                Vec::new()
            } else {
                module.to_vec()
            };
            while b[j..].starts_with(b"super::") || b[j..].starts_with(b"self::") {
                if b[j..].starts_with(b"super::") {
                    m.pop();
                    j += "super::".len();
                } else {
                    j += "self::".len();
                }
            }
            base = Some(m);
        }
        match base {
            Some(base) => {
                let (paths, end) = tree(code, j);
                for p in paths {
                    let mut full = base.clone();
                    full.extend(p);
                    found.push(full);
                }
                i = end.max(i + 1);
            }
            None => i += 1,
        }
    }
    found
}

/// The paths of a use tree (or a plain path) starting at `at`, and where it ends.
fn tree(code: &str, at: usize) -> (Vec<Vec<String>>, usize) {
    let b = code.as_bytes();
    let mut i = at;
    let mut prefix = Vec::new();
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i < b.len() && b[i] == b'{' {
            i += 1;
            let mut all = Vec::new();
            loop {
                while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b',') {
                    i += 1;
                }
                if i >= b.len() || b[i] == b'}' {
                    i += 1;
                    break;
                }
                let (inner, end) = tree(code, i);
                for p in inner {
                    let mut full = prefix.clone();
                    full.extend(p);
                    all.push(full);
                }
                if end <= i {
                    i += 1;
                } else {
                    i = end;
                }
                // Skip an `as name` and anything else up to the next item.
                while i < b.len() && b[i] != b',' && b[i] != b'}' && b[i] != b'{' {
                    i += 1;
                }
            }
            return (all, i);
        }
        let start = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        if i == start {
            return (vec![prefix], i);
        }
        let word = &code[start..i];
        if word != "self" {
            prefix.push(word.to_string());
        }
        if b[i..].starts_with(b"::") {
            i += 2;
        } else {
            return (vec![prefix], i);
        }
    }
}
