//! The Dockerfile's stages, read as a builder reads them. CI builds the image from a
//! binary built on the host (stage `runtime-prebuilt`, scripts/image) because no
//! registry is in reach; the users' path (`docker build .`, stage `runtime`, the
//! whole build in the rust image) cannot run here, so these tests hold it to the same
//! runtime and to the committed lock file.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::repo_root;

/// One stage: its `FROM` and its instructions (continuation lines joined).
#[derive(Debug)]
pub struct Stage {
    pub from: String,
    pub instructions: Vec<(String, String)>,
}

/// The global `ARG`s (before the first `FROM`) and the stages by name (or index).
#[derive(Debug)]
pub struct Dockerfile {
    pub args: BTreeMap<String, String>,
    pub stages: Vec<(String, Stage)>,
}

// === impl Dockerfile ===

impl Dockerfile {
    pub fn read() -> Result<Dockerfile> {
        let path = repo_root().join("Dockerfile");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text)
    }

    fn parse(text: &str) -> Result<Dockerfile> {
        let mut d = Dockerfile {
            args: BTreeMap::new(),
            stages: vec![],
        };
        let mut current = String::new();
        for raw in text.lines() {
            let line = raw.trim();
            if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
                continue;
            }
            if let Some(part) = line.strip_suffix('\\') {
                current.push_str(part);
                current.push(' ');
                continue;
            }
            current.push_str(line);
            let full = std::mem::take(&mut current);
            let (instruction, rest) = full.split_once(char::is_whitespace).unwrap_or((&full, ""));
            let (instruction, rest) = (instruction.to_ascii_uppercase(), rest.trim().to_owned());
            match (instruction.as_str(), d.stages.last_mut()) {
                ("FROM", _) => {
                    let words: Vec<&str> = rest.split_whitespace().collect();
                    let name = match words.as_slice() {
                        [_, as_, name] if as_.eq_ignore_ascii_case("as") => name.to_string(),
                        [_] => d.stages.len().to_string(),
                        _ => bail!("FROM {rest}: not `FROM image [AS name]`"),
                    };
                    let stage = Stage {
                        from: words[0].to_owned(),
                        instructions: vec![],
                    };
                    d.stages.push((name, stage));
                }
                ("ARG", None) => {
                    let (k, v) = rest.split_once('=').unwrap_or((&rest, ""));
                    d.args.insert(k.to_owned(), v.to_owned());
                }
                (_, Some((_, stage))) => stage.instructions.push((instruction, rest)),
                (_, None) => bail!("{instruction} before the first FROM"),
            }
        }
        Ok(d)
    }

    pub fn stage(&self, name: &str) -> Result<&Stage> {
        self.stages
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s)
            .with_context(|| format!("the Dockerfile has no stage {name}"))
    }

    /// The stage a build without `--target` makes: the last.
    pub fn default_target(&self) -> Result<&str> {
        self.stages
            .last()
            .map(|(n, _)| n.as_str())
            .context("the Dockerfile has no stage")
    }
}

// === impl Stage ===

impl Stage {
    /// The arguments of every instruction of this kind.
    pub fn all(&self, instruction: &str) -> Vec<&str> {
        self.instructions
            .iter()
            .filter(|(i, _)| i == instruction)
            .map(|(_, rest)| rest.as_str())
            .collect()
    }

    /// The variables its `ENV` instructions set (`ENV A=1 B=2`).
    pub fn env(&self) -> BTreeMap<String, String> {
        self.all("ENV")
            .iter()
            .flat_map(|rest| rest.split_whitespace())
            .filter_map(|pair| pair.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }
}

/// The binary's file name, as cargo names it.
fn binary_name() -> Result<String> {
    Path::new(crate::SLUICE)
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .context("the binary's name")
}

#[test]
fn the_default_target_builds_from_source_with_the_lock_file() -> Result<()> {
    let d = Dockerfile::read()?;
    let target = d.stage(d.default_target()?)?;
    assert_eq!(d.default_target()?, "runtime");
    assert_eq!(target.from, "runtime-base");
    let copy = target.all("COPY");
    let [copy] = copy.as_slice() else {
        bail!("stage runtime: one COPY expected, {copy:?}");
    };
    let (from, _) = copy
        .strip_prefix("--from=")
        .and_then(|c| c.split_once(' '))
        .with_context(|| format!("COPY {copy}: not from a stage"))?;
    let build = d.stage(from)?;
    assert!(build.from.starts_with("rust:"), "{}", build.from);
    let name = binary_name()?;
    let cargo = build.all("RUN");
    assert!(
        cargo.iter().any(|r| r.contains(&format!(
            "cargo build --profile image --locked --bin {name}"
        ))),
        "the build stage must build the image profile from the lock file: {cargo:?}"
    );
    Ok(())
}

#[test]
fn the_runtime_is_slim_debian_unprivileged_and_the_binary_its_entrypoint() -> Result<()> {
    let d = Dockerfile::read()?;
    let base = d.stage("runtime-base")?;
    assert_eq!(base.from, "${BASE_IMAGE}");
    assert_eq!(
        d.args.get("BASE_IMAGE").map(String::as_str),
        Some("debian:bookworm-slim")
    );
    assert_eq!(base.all("USER"), ["10001:10001"]);
    assert_eq!(base.all("STOPSIGNAL"), ["SIGTERM"]);
    assert_eq!(base.all("ENTRYPOINT"), [r#"["sluice"]"#]);
    // Both runtimes are the base plus one binary.
    for stage in ["runtime", "runtime-prebuilt"] {
        let s = d.stage(stage)?;
        assert_eq!(s.from, "runtime-base", "{stage}");
        assert_eq!(s.instructions.len(), 1, "{stage}: {:?}", s.instructions);
        assert!(
            s.all("COPY")
                .iter()
                .all(|c| c.ends_with(" /usr/local/bin/sluice")),
            "{stage}"
        );
    }
    Ok(())
}

#[test]
fn the_prebuilt_target_takes_the_binary_scripts_image_builds() -> Result<()> {
    let d = Dockerfile::read()?;
    let name = binary_name()?;
    let source = format!("target/image/{name}");
    assert_eq!(
        d.stage("runtime-prebuilt")?.all("COPY"),
        [format!("{source} /usr/local/bin/sluice")]
    );
    let script = std::fs::read_to_string(repo_root().join("scripts/image"))?;
    assert!(script.contains("--target runtime-prebuilt"));
    assert!(script.contains("cargo build --profile image --locked -p sluice --bin sluice"));
    // The build context leaves target/ out, but for that binary.
    let ignore = std::fs::read_to_string(repo_root().join(".dockerignore"))?;
    let lines: Vec<&str> = ignore.lines().map(str::trim).collect();
    assert!(lines.contains(&"target"), "{ignore}");
    assert!(lines.contains(&format!("!{source}").as_str()), "{ignore}");
    Ok(())
}
