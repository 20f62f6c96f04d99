//! The container image, checked as far as a machine without a Docker engine can: the
//! Dockerfile's commands and variables must be ones the binary really takes, and the
//! binary must run from environment variables alone, as the image runs it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::json;
use sluice_harness::{ProcessSpec, Stack, StackOptions, TENANT};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// The instructions of a Dockerfile that matter here, continuation lines joined.
struct Dockerfile {
    from: Vec<String>,
    env: BTreeMap<String, String>,
    expose: Vec<u16>,
    user: Option<String>,
    stopsignal: Option<String>,
    healthcheck: Vec<String>,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    runs: Vec<String>,
}

fn dockerfile() -> Result<Dockerfile> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Dockerfile");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut lines = Vec::new();
    let mut current = String::new();
    for raw in text.lines() {
        let line = raw.trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(line);
                lines.push(std::mem::take(&mut current));
            }
        }
    }
    let mut d = Dockerfile {
        from: vec![],
        env: BTreeMap::new(),
        expose: vec![],
        user: None,
        stopsignal: None,
        healthcheck: vec![],
        entrypoint: vec![],
        cmd: vec![],
        runs: vec![],
    };
    for line in lines {
        let (instruction, rest) = line
            .split_once(char::is_whitespace)
            .unwrap_or((line.as_str(), ""));
        let rest = rest.trim();
        match instruction.to_ascii_uppercase().as_str() {
            "FROM" => d.from.push(rest.to_string()),
            "ENV" => {
                for pair in rest.split_whitespace() {
                    if let Some((k, v)) = pair.split_once('=') {
                        d.env.insert(k.to_string(), v.to_string());
                    }
                }
            }
            "EXPOSE" => {
                for port in rest.split_whitespace() {
                    d.expose.push(
                        port.trim_end_matches("/tcp")
                            .parse()
                            .context("EXPOSE port")?,
                    );
                }
            }
            "USER" => d.user = Some(rest.to_string()),
            "STOPSIGNAL" => d.stopsignal = Some(rest.to_string()),
            "HEALTHCHECK" => {
                let json = rest.split_once("CMD").map(|(_, c)| c.trim()).unwrap_or("");
                d.healthcheck =
                    serde_json::from_str(json).context("HEALTHCHECK CMD must be a JSON array")?;
            }
            "ENTRYPOINT" => {
                d.entrypoint =
                    serde_json::from_str(rest).context("ENTRYPOINT must be a JSON array")?
            }
            "CMD" => d.cmd = serde_json::from_str(rest).context("CMD must be a JSON array")?,
            "RUN" => d.runs.push(rest.to_string()),
            _ => {}
        }
    }
    Ok(d)
}

/// Run the binary with exactly these environment variables (plus PATH) and arguments.
fn sluice(args: &[&str], env: &BTreeMap<String, String>) -> Result<std::process::Output> {
    let mut command = Command::new(SLUICE);
    command.args(args).env_clear();
    if let Ok(path) = std::env::var("PATH") {
        command.env("PATH", path);
    }
    command.envs(env);
    command
        .output()
        .with_context(|| format!("running sluice {args:?}"))
}

#[test]
fn the_image_is_built_from_official_images_and_runs_unprivileged() -> Result<()> {
    let d = dockerfile()?;
    assert!(
        d.from.first().is_some_and(|f| f.starts_with("rust:")),
        "build stage: {:?}",
        d.from
    );
    assert!(
        d.from
            .last()
            .is_some_and(|f| f.starts_with("debian:") && f.contains("slim")),
        "runtime stage: {:?}",
        d.from
    );
    let user = d.user.context("the image sets no USER")?;
    assert!(
        !user.starts_with("0") && !user.starts_with("root"),
        "USER {user}"
    );
    assert_eq!(d.stopsignal.as_deref(), Some("SIGTERM"));
    let build = d
        .runs
        .iter()
        .find(|r| r.contains("cargo build"))
        .context("no cargo build in the Dockerfile")?;
    let binary = PathBuf::from(SLUICE);
    let name = binary
        .file_name()
        .and_then(|n| n.to_str())
        .context("binary name")?;
    assert!(build.contains(&format!("--bin {name}")), "{build}");
    assert!(
        build.contains("--locked"),
        "the image must build from the committed lock file"
    );
    Ok(())
}

#[test]
fn the_commands_of_the_image_are_real_subcommands() -> Result<()> {
    let d = dockerfile()?;
    assert_eq!(d.entrypoint.first().map(String::as_str), Some("sluice"));
    let mut run: Vec<&str> = d.entrypoint[1..]
        .iter()
        .chain(&d.cmd)
        .map(String::as_str)
        .collect();
    run.push("--help");
    let out = sluice(&run, &BTreeMap::new())?;
    assert!(
        out.status.success(),
        "sluice {run:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(d.healthcheck.first().map(String::as_str), Some("sluice"));
    let mut check: Vec<&str> = d.healthcheck[1..].iter().map(String::as_str).collect();
    check.push("--help");
    let out = sluice(&check, &BTreeMap::new())?;
    assert!(
        out.status.success(),
        "sluice {check:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn the_variables_of_the_image_are_configuration_keys() -> Result<()> {
    let d = dockerfile()?;
    let sluice_env: BTreeMap<String, String> = d
        .env
        .iter()
        .filter(|(k, _)| k.starts_with("SLUICE_"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert!(
        !sluice_env.is_empty(),
        "the image sets no SLUICE_* variable"
    );
    let out = sluice(&["check-config"], &sluice_env)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(!stdout.contains("is no configuration key"), "{stdout}");
    // The ports the image exposes are the ones it listens on.
    for (var, port) in [
        ("SLUICE_API_LISTEN", d.expose.first()),
        ("SLUICE_ADMIN_LISTEN", d.expose.get(1)),
    ] {
        let listen = d.env.get(var).with_context(|| format!("{var} not set"))?;
        let port = port.with_context(|| format!("no EXPOSE for {var}"))?;
        assert!(
            listen.ends_with(&format!(":{port}")),
            "{var}={listen} but EXPOSE {port}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_runs_from_the_environment_alone() -> Result<()> {
    let d = dockerfile()?;
    let stack = Stack::start(StackOptions::default()).await?;
    stack
        .clickhouse
        .exec("CREATE TABLE events (id UInt64) ENGINE = MergeTree ORDER BY id")
        .await?;
    let api = sluice_harness::free_port()?;
    let admin = sluice_harness::free_port()?;
    // The image's own variables, with the addresses of this machine's servers.
    let mut env: BTreeMap<String, String> = d.env.clone();
    env.insert("SLUICE_API_LISTEN".into(), format!("127.0.0.1:{api}"));
    env.insert("SLUICE_ADMIN_LISTEN".into(), format!("127.0.0.1:{admin}"));
    env.insert("SLUICE_NATS_URL".into(), stack.nats.url());
    env.insert(
        "SLUICE_CLICKHOUSE_TARGETS_MAIN_URL".into(),
        stack.clickhouse.http_url(),
    );
    env.insert(
        format!("SLUICE_TENANTS_{}_TARGET", TENANT.to_uppercase()),
        "main".into(),
    );
    env.insert("SLUICE_API_AUTH".into(), "none".into());
    env.insert("SLUICE_INGEST_BATCH_AGE".into(), "200ms".into());
    let mut spec = ProcessSpec::new(SLUICE)
        .arg("run")
        .env_remove("SLUICE_CONFIG");
    for (k, v) in &env {
        spec = spec.env(k, v);
    }
    let process = sluice_harness::SluiceProcess::start_spec(spec)?;
    let http = sluice_harness::loopback_client(Duration::from_secs(5))?;
    let ready = format!("http://127.0.0.1:{admin}/readyz");
    let waited = sluice_harness::wait_until(
        "readyz 200",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            let http = http.clone();
            let ready = ready.clone();
            async move { matches!(http.get(&ready).send().await, Ok(r) if r.status().is_success()) }
        },
    )
    .await;
    if let Err(e) = waited {
        bail!("{e:#}\n{}", process.log_tail(30));
    }
    let reply = http
        .post(format!("http://127.0.0.1:{api}/v1/ingest/events"))
        .header("X-Tenant", TENANT)
        .header("Content-Type", "application/json")
        .body(json!({"id": 7}).to_string())
        .send()
        .await?;
    assert_eq!(reply.status().as_u16(), 202);
    stack
        .wait_for_count("events", 1, Duration::from_secs(20))
        .await?;
    // The image's HEALTHCHECK, with the same environment.
    let check: Vec<String> = d.healthcheck[1..].to_vec();
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = check.iter().map(String::as_str).collect();
        sluice(&args, &env)
    })
    .await??;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // JSON logs, as the image sets them.
    let stderr = process.dir().join("logs").join("sluice.stderr.log");
    let logs = std::fs::read_to_string(&stderr)
        .with_context(|| format!("reading {}", stderr.display()))?;
    // (The harness marks each start of a process in its log with a `=== ... ===` line.)
    let lines: Vec<&str> = logs
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("==="))
        .collect();
    assert!(!lines.is_empty(), "no log lines");
    for line in lines {
        serde_json::from_str::<serde_json::Value>(line)
            .with_context(|| format!("not a JSON log line: {line}"))?;
    }
    Ok(())
}
