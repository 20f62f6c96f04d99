//! Every repository path README.md and docs/*.md name in backticks exists, and every test
//! they name (`file::function`, as the failure matrix does) is in that file: a reader
//! who follows one finds it.
//!
//! What counts as a repository path (everything else in backticks is left alone: keys,
//! commands, routes, URLs, media types, placeholders, paths on another machine):
//! - a token whose first segment is an entry at the repository's root (`src/...`,
//!   `tests/...`, `config.toml`): it must exist as written;
//! - a file of this repository's own kind (`*.rs`) or a directory (`name/`) written
//!   relative to a path named earlier on the same line (`actors/src/breaker.rs`,
//!   `scoped_breaker.rs`): it must exist beside that path or above it; with no such path
//!   on the line, somewhere in the repository.
//!
//! A token with a glob, a placeholder or a space is not a path.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Directory names the docs give that are not the repository's: ClickHouse's data
/// directory's (`detached/`), cargo's output (`target/`).
const ELSEWHERE: &[&str] = &["detached/", "target/"];

/// The repository's files and directories (directories with a trailing `/`), relative
/// to its root; build output and git's own left out.
fn repository() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut dirs = vec![PathBuf::new()];
    // Bounded by the tree: each directory is listed once.
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(Path::new(ROOT).join(&dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if dir.as_os_str().is_empty() && (name == "target" || name == ".git") {
                continue;
            }
            let path = dir.join(&name);
            let text = path.to_string_lossy().into_owned();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                found.insert(format!("{text}/"));
                dirs.push(path);
            } else {
                found.insert(text);
            }
        }
    }
    found
}

/// The backticked spans of a document's prose (fenced code blocks left out).
fn spans(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut lines = Vec::new();
    let mut fenced = false;
    for (number, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let pieces: Vec<&str> = line.split('`').collect();
        // Odd pieces are inside backticks (a line with an unclosed one has none).
        let inside = pieces
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 2 == 1 && *i + 1 < pieces.len())
            .map(|(_, s)| s.to_string())
            .collect();
        lines.push((number + 1, inside));
    }
    lines
}

/// A token as a path and the item it names in the file (`file.rs::a::b` gives
/// `file.rs` and `b`), or `None` when it cannot be a path.
fn as_path(token: &str) -> Option<(String, Option<String>)> {
    let looks_like_code = token.contains(char::is_whitespace)
        || token.contains("://")
        || token.starts_with(['/', '-', '.', '~', '$', '@'])
        || token.contains(['<', '>', '{', '}', '*', '$', '=', '"', '(', ',', '[', '?']);
    if looks_like_code {
        return None;
    }
    let (path, item) = match token.split_once("::") {
        Some((path, rest)) => (path, rest.rsplit("::").next().map(str::to_string)),
        None => (token, None),
    };
    let path = path.split('#').next()?;
    // `file.rs:350`: a line of it.
    let path = match path.rsplit_once(':') {
        Some((file, line)) if line.bytes().all(|b| b.is_ascii_digit()) => file,
        _ => path,
    };
    (!path.is_empty()).then(|| (path.to_string(), item))
}

/// Whether `item` (a function or a module, `tests` or a test's name) is in `file` or in
/// the files of its module directory (`tests/chaos.rs` and `tests/chaos/`).
fn names_item(repo: &BTreeSet<String>, file: &str, item: &str) -> bool {
    let stem = file.trim_end_matches(".rs");
    repo.iter()
        .filter(|p| *p == file || (p.starts_with(&format!("{stem}/")) && p.ends_with(".rs")))
        .filter_map(|p| std::fs::read_to_string(Path::new(ROOT).join(p)).ok())
        .any(|text| {
            text.contains(&format!("fn {item}("))
                || text.contains(&format!("fn {item}<"))
                || text.contains(&format!("mod {item} "))
                || text.contains(&format!("mod {item};"))
        })
}

/// What is wrong with the paths of one document, a line each.
fn problems(repo: &BTreeSet<String>, document: &str) -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(ROOT).join(document)).unwrap_or_default();
    let top: BTreeSet<String> = repo
        .iter()
        .filter_map(|p| {
            let first = p.split('/').next()?;
            Some(if p.len() > first.len() {
                format!("{first}/")
            } else {
                first.to_string()
            })
        })
        .collect();
    let exists = |path: &str| {
        repo.contains(path) || repo.contains(&format!("{}/", path.trim_end_matches('/')))
    };
    let mut wrong = Vec::new();
    for (number, tokens) in spans(&text) {
        // The directories of the paths named so far on this line: what a relative name
        // after them is relative to.
        let mut bases: Vec<String> = Vec::new();
        for token in tokens {
            let Some((path, item)) = as_path(&token) else {
                continue;
            };
            let first = path.split('/').next().unwrap_or_default();
            let rooted = top.contains(first) || top.contains(&format!("{first}/"));
            let found = if rooted && path.contains('/') || top.contains(&path) {
                if !exists(&path) {
                    wrong.push(format!("{document}:{number}: `{token}`: no such path"));
                    continue;
                }
                Some(path.trim_end_matches('/').to_string())
            } else if path.ends_with(".rs") || (path.ends_with('/') && !path.contains('.')) {
                if ELSEWHERE.contains(&path.as_str()) {
                    continue;
                }
                let beside = bases.iter().rev().find_map(|base| {
                    let mut dir = Path::new(base);
                    // Bounded by the base's depth.
                    loop {
                        let candidate = dir.join(path.trim_end_matches('/'));
                        let candidate = candidate.to_string_lossy().into_owned();
                        if exists(&candidate) {
                            return Some(candidate);
                        }
                        dir = dir.parent()?;
                    }
                });
                let anywhere = || {
                    let suffix = format!("/{}", path.trim_end_matches('/'));
                    repo.iter()
                        .map(|p| p.trim_end_matches('/'))
                        .find(|p| p.ends_with(&suffix) || *p == path.trim_end_matches('/'))
                        .map(str::to_string)
                };
                match beside.or_else(|| bases.is_empty().then(anywhere).flatten()) {
                    Some(found) => Some(found),
                    None => {
                        wrong.push(format!(
                            "{document}:{number}: `{token}`: no such path{}",
                            bases
                                .last()
                                .map(|b| format!(" beside `{b}` or above it"))
                                .unwrap_or_default()
                        ));
                        continue;
                    }
                }
            } else {
                None
            };
            let Some(found) = found else {
                continue;
            };
            if let Some(item) = item.filter(|_| found.ends_with(".rs")) {
                if !names_item(repo, &found, &item) {
                    wrong.push(format!(
                        "{document}:{number}: `{token}`: {found} has no `{item}`"
                    ));
                }
            }
            let dir = if repo.contains(&format!("{found}/")) {
                found
            } else {
                Path::new(&found)
                    .parent()
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default()
            };
            if !dir.is_empty() {
                bases.push(dir);
            }
        }
    }
    wrong
}

#[test]
fn every_repository_path_the_docs_name_exists() {
    let repo = repository();
    let mut documents = vec!["README.md".to_string()];
    documents.extend(
        repo.iter()
            .filter(|p| p.starts_with("docs/") && p.ends_with(".md"))
            .cloned(),
    );
    let wrong: Vec<String> = documents.iter().flat_map(|d| problems(&repo, d)).collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn what_counts_as_a_path() {
    assert_eq!(
        as_path("tests/chaos.rs::nats::sluice_kill9"),
        Some(("tests/chaos.rs".into(), Some("sluice_kill9".into())))
    );
    assert_eq!(
        as_path("src/nats/dlq.rs:350"),
        Some(("src/nats/dlq.rs".into(), None))
    );
    for code in [
        "ingest.<tenant>.<table>",
        "/admin/dlq",
        "http://a:8123",
        "sluice dlq peek",
        "actors/src/{consumer,target}/",
    ] {
        assert_eq!(as_path(code), None, "{code}");
    }
}
