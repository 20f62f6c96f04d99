//! The `sluice` binary as an operator runs it: `classify` and `check-config`, their
//! output and exit codes (0 ok, 1 a bad configuration, 2 an argument that says nothing).
//!
//! Every run starts from an empty environment, so a `SLUICE_*` variable of the machine
//! running the tests cannot change what is checked.

mod query_common;

use std::path::Path;
use std::process::{Command, Output};

use anyhow::{ensure, Context, Result};
use query_common::Gateway;
use serde_json::json;
use sluice_harness::{FaultProxy, Respond};

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn sluice(args: &[&str], env: &[(&str, &str)]) -> Result<Run> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    command.args(args).env_clear();
    for (k, v) in env {
        command.env(k, v);
    }
    let Output {
        status,
        stdout,
        stderr,
    } = command
        .output()
        .with_context(|| format!("running sluice {args:?}"))?;
    Ok(Run {
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    })
}

/// `sluice classify <what>`, which must succeed; returns its `key: value` lines.
fn classify(what: &str) -> Result<Vec<(String, String)>> {
    let run = sluice(&["classify", what], &[])?;
    assert_eq!(
        run.code,
        Some(0),
        "sluice classify {what:?}: {}{}",
        run.stdout,
        run.stderr
    );
    Ok(run
        .stdout
        .lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

fn field<'a>(lines: &'a [(String, String)], key: &str) -> &'a str {
    lines
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or("(missing)")
}

#[test]
fn classify_252_is_unavailable_table_scoped_and_splittable() -> Result<()> {
    let out = classify("252")?;
    assert_eq!(field(&out, "class"), "Unavailable");
    assert_eq!(field(&out, "code"), "252");
    assert_eq!(field(&out, "flags"), "table-scoped, splittable");
    let ingest = field(&out, "ingest");
    assert!(ingest.contains("split"), "{ingest}");
    assert!(ingest.contains("back off this table alone"), "{ingest}");
    assert!(ingest.contains("never park"), "{ingest}");
    Ok(())
}

#[test]
fn classify_60_waits_for_the_table_then_parks_it_whole() -> Result<()> {
    let out = classify("60")?;
    assert_eq!(field(&out, "class"), "Rejected");
    assert_eq!(field(&out, "flags"), "missing-table");
    // A missing table is waited for, then parked whole: never bisected row by row.
    let ingest = field(&out, "ingest");
    assert!(ingest.contains("missing_table_grace"), "{out:?}");
    assert!(ingest.contains("without bisection"), "{out:?}");
    assert!(field(&out, "query").starts_with("404"), "{out:?}");
    Ok(())
}

#[test]
fn classify_error_text_516_is_denied() -> Result<()> {
    let out = classify("Code: 516. DB::Exception: x")?;
    assert_eq!(field(&out, "class"), "Denied");
    assert_eq!(field(&out, "code"), "516");
    assert!(field(&out, "ingest").contains("never park"), "{out:?}");
    assert!(field(&out, "query").starts_with("403"), "{out:?}");

    // 18.16's wording, and the text given unquoted as several arguments.
    let run = sluice(
        &[
            "classify",
            "Code:",
            "193,",
            "e.displayText()",
            "=",
            "DB::Exception:",
            "Wrong",
            "password",
        ],
        &[],
    )?;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.contains("class: Denied"), "{}", run.stdout);
    Ok(())
}

#[test]
fn classify_status_503_is_unavailable() -> Result<()> {
    let out = classify("status:503")?;
    assert_eq!(field(&out, "class"), "Unavailable");
    assert_eq!(field(&out, "code"), "(none)");
    assert!(
        field(&out, "ingest").contains("back off the whole pool"),
        "{out:?}"
    );
    let out = classify("status:401")?;
    assert_eq!(field(&out, "class"), "Denied");
    let out = classify("status:500")?;
    assert_eq!(field(&out, "class"), "Unknown");
    Ok(())
}

/// The `query:` line of `sluice classify` is what the gateway does: the status it
/// answers and whether it retries, checked against the gateway itself with a proxy
/// answering each code as ClickHouse 18.16 would. 164 is the case that once disagreed:
/// Unavailable to the classifier, a refused write (403, never retried) to the gateway.
#[tokio::test]
async fn classify_says_what_the_gateway_answers() -> Result<()> {
    // Nothing behind the proxy: it answers every request itself.
    let proxy = FaultProxy::start("127.0.0.1:9".parse()?).await?;
    let gw = Gateway::start(&query_common::config(
        &proxy.url(),
        "max_attempts = 3\nretry_budget = 100.0",
    ))
    .await?;
    for code in [164u32, 159, 60, 62, 193, 745] {
        let out = classify(&code.to_string())?;
        let line = field(&out, "query");
        let said_status: u16 = line
            .split_whitespace()
            .next()
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("{code}: no status in {line:?}"))?;
        let said_retried = !line.contains("never retried");

        proxy
            .set_mode(Respond::clickhouse_old(code, "as ClickHouse says it"))
            .await?;
        let before = proxy.requests_seen();
        let r = gw.query("acme", json!({"sql": "SELECT 1"})).await?;
        let attempts = proxy.requests_seen() - before;
        ensure!(
            r.status == said_status,
            "{code}: classify says {line:?}, the gateway answered {} {}",
            r.status,
            r.body
        );
        ensure!(
            (attempts > 1) == said_retried && r.body["retryable"] == said_retried,
            "{code}: classify says {line:?}, the gateway sent {attempts} requests and answered {}",
            r.body
        );
    }
    Ok(())
}

#[test]
fn classify_an_unlisted_code_is_rejected() -> Result<()> {
    let out = classify("12345")?;
    assert_eq!(field(&out, "class"), "Rejected");
    assert_eq!(field(&out, "code"), "12345");
    Ok(())
}

#[test]
fn classify_garbage_exits_2_and_says_what_it_wants() -> Result<()> {
    for garbage in ["garbage", "", "status:abc"] {
        let run = sluice(&["classify", garbage], &[])?;
        assert_eq!(
            run.code,
            Some(2),
            "{garbage:?}: {}{}",
            run.stdout,
            run.stderr
        );
        assert!(run.stdout.is_empty(), "{garbage:?}: {}", run.stdout);
        assert!(
            run.stderr.contains(&format!("cannot classify {garbage:?}")),
            "{}",
            run.stderr
        );
        assert!(
            run.stderr.contains("status:NNN") && run.stderr.contains("Code: NNN"),
            "says what it takes: {}",
            run.stderr
        );
    }
    Ok(())
}

/// `text` written to a `config.toml` in a temp dir (kept while the dir lives), and its path.
fn config_file(text: &str) -> Result<(tempfile::TempDir, String)> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("config.toml");
    std::fs::write(&path, text)?;
    let path = path.display().to_string();
    Ok((dir, path))
}

fn example_config() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config.toml")
        .display()
        .to_string()
}

#[test]
fn check_config_accepts_the_example_with_a_summary() -> Result<()> {
    let config = example_config();
    let run = sluice(&["check-config", "--config", &config], &[])?;
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    for expected in [
        "nats: seeds nats://127.0.0.1:4222 replicas 1 stream INGEST",
        "targets:",
        "main: http://127.0.0.1:8123 user default database default",
        "tenants:",
        "acme: target main",
        "tables:",
        "(default): batch_rows 10000 batch_bytes 8MiB batch_age 1s dlq on",
        "acme.events: batch_rows 500",
        "api: 127.0.0.1:8080",
        "admin: 127.0.0.1:9090",
    ] {
        assert!(
            run.stdout.contains(expected),
            "missing {expected:?} in:\n{}",
            run.stdout
        );
    }
    assert_eq!(run.stdout.lines().last(), Some("ok"));

    // An override from the environment shows in the summary: a cluster's seeds, each
    // one, and the replicas its streams get.
    let run = sluice(
        &["check-config", "--config", &config],
        &[
            (
                "SLUICE_NATS_URL",
                "nats://10.0.0.7:4222, nats://10.0.0.8:4222,nats://10.0.0.9:4222",
            ),
            ("SLUICE_NATS_REPLICAS", "3"),
        ],
    )?;
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains(
            "nats: seeds nats://10.0.0.7:4222, nats://10.0.0.8:4222, nats://10.0.0.9:4222 replicas 3 stream"
        ),
        "{}",
        run.stdout
    );
    Ok(())
}

/// A seed list with a server that is not one is refused, naming that server and its
/// place in the list (the others are fine).
#[test]
fn check_config_names_a_bad_seed_in_the_nats_url_list() -> Result<()> {
    let (_dir, path) = config_file(
        "[nats]\nurl = \"nats://127.0.0.1:4222,nats://127.0.0.1:42x22,nats://127.0.0.1:4224\"\n",
    )?;
    let run = sluice(&["check-config", "--config", &path, "--offline"], &[])?;
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr
            .contains("\"nats://127.0.0.1:42x22\" (server 2 of 3) is not a NATS server URL"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("line 2"), "{}", run.stderr);
    Ok(())
}

/// docs/operations.md, "ClickHouse clusters": `check-config` shows the layout it
/// understood, and asks every shard (here none answers: each shard says so, and no
/// table is called exactly-once).
#[test]
fn check_config_shows_a_clusters_layout_and_asks_each_shard() -> Result<()> {
    let (_dir, path) = config_file(
        r#"
[clickhouse.targets.main]
shards = ["http://127.0.0.1:1,http://127.0.0.1:2", "http://127.0.0.1:3,http://127.0.0.1:4"]
connect_timeout = "200ms"
[tenants.acme]
target = "main"
[api]
auth = "none"
"#,
    )?;
    let run = sluice(&["check-config", "--config", &path], &[])?;
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    let layout = "main: 2 shards x 2 replicas (shard 1: http://127.0.0.1:1, http://127.0.0.1:2; shard 2: http://127.0.0.1:3, http://127.0.0.1:4)";
    assert!(run.stdout.contains(layout), "{}", run.stdout);
    for shard in ["shard 1: not known", "shard 2: not known"] {
        assert!(run.stdout.contains(shard), "{shard} in:\n{}", run.stdout);
    }
    assert!(
        run.stdout.contains("127.0.0.1:3:"),
        "each replica's reason: {}",
        run.stdout
    );
    Ok(())
}

#[test]
fn check_config_names_an_unknown_key_and_its_line() -> Result<()> {
    let (_dir, path) = config_file("[nats]\nurl = \"nats://127.0.0.1:4222\"\n\n[clickhouse.targets.main]\nurl = \"http://127.0.0.1:8123\"\nbatch_size = 5\n")?;
    let run = sluice(&["check-config", "--config", &path], &[])?;
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("batch_size"), "{}", run.stderr);
    assert!(run.stderr.contains("line 6"), "{}", run.stderr);
    assert!(!run.stdout.contains("ok"), "{}", run.stdout);
    Ok(())
}

/// README.md: `check-config` lists "every problem with its line". A file with problems
/// of every kind (one that does not parse as TOML aside) gets them all in one run: a
/// bad duration, an unknown key, a wrong type, an unknown choice, a log level that is
/// none, and problems of the whole (a row limit above the request limit, a table of a
/// tenant no one defined), each with its line.
#[test]
fn check_config_reports_every_problem_of_a_file_in_one_run_each_with_its_line() -> Result<()> {
    let (_dir, path) = config_file(
        r#"[nats]
url = "nats://127.0.0.1:4222"
ack_wait = "60"
max_byte = "1GiB"

[api]
auth = "tokn"
max_json_depth = "deep"
max_request_bytes = "256KiB"
max_row_bytes = "1MiB"

[log]
level = "eror"

[tables."globex.events"]
batch_rows = 500
"#,
    )?;
    let run = sluice(&["check-config", "--config", &path, "--offline"], &[])?;
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    let problems: Vec<&str> = run
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix("  - "))
        .collect();
    for (start, says) in [
        ("line 3: [nats] ack_wait:", "needs a unit"),
        ("line 4: [nats] max_byte:", "unknown field `max_byte`"),
        (
            "line 7: [api] auth:",
            "unknown variant `tokn`, expected `token` or `none`",
        ),
        ("line 8: [api] max_json_depth:", "expected a whole number"),
        (
            "lines 9, 10: [api] max_row_bytes = 1MiB",
            "above max_request_bytes = 256KiB",
        ),
        ("line 13: [log] level:", "`eror` is not a level"),
        (
            "line 15: [tables.\"globex.events\"]:",
            "tenant \"globex\" is not defined",
        ),
    ] {
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with(start) && p.contains(says)),
            "no problem starting {start:?} and saying {says:?}:\n{}",
            run.stderr
        );
    }
    assert_eq!(problems.len(), 7, "{}", run.stderr);
    assert!(
        run.stderr.starts_with(&format!("{path}: 7 problems")),
        "{}",
        run.stderr
    );
    assert!(!run.stdout.contains("ok"), "{}", run.stdout);
    Ok(())
}

/// issue 37.11: a configuration that can take no row (no tenant, no ClickHouse target,
/// or no tenant with a target: every row parked) is refused by `check-config` and by
/// `run`, each saying what is missing.
#[test]
fn a_configuration_that_can_take_no_row_is_refused_by_check_config_and_run() -> Result<()> {
    let loopback = [
        ("SLUICE_API_LISTEN", "127.0.0.1:0"),
        ("SLUICE_ADMIN_LISTEN", "127.0.0.1:0"),
        ("SLUICE_NATS_URL", "nats://127.0.0.1:9"),
        ("SLUICE_API_AUTH", "none"),
    ];
    let target = "[clickhouse.targets.main]\nurl = \"http://127.0.0.1:8123\"\n";
    for (text, missing) in [
        (String::new(), "no ClickHouse target and no tenant"),
        (target.to_string(), "no tenant"),
        ("[tenants.acme]\n".to_string(), "no ClickHouse target"),
        (
            format!("{target}[tenants.acme]\n"),
            "no tenant has a target",
        ),
    ] {
        let (_dir, path) = config_file(&text)?;
        for command in [&["check-config", "--offline"][..], &["run"]] {
            let args: Vec<&str> = command
                .iter()
                .chain(["--config", path.as_str()].iter())
                .copied()
                .collect();
            let run = sluice_bounded(&args, &loopback)?;
            assert_eq!(
                run.code,
                Some(1),
                "{args:?} with {text:?}: {}{}",
                run.stdout,
                run.stderr
            );
            assert!(
                run.stderr.contains("can take no row") && run.stderr.contains(missing),
                "{args:?} with {text:?}: {}",
                run.stderr
            );
        }
    }
    Ok(())
}

/// A log level that is none (`eror`, `loud`) would be a `tracing` filter for a module
/// of that name, which silences the service; an unknown choice of `auth` or `format`
/// means nothing. `check-config` and `run` refuse each, naming the key (with its line,
/// or the variable that set it) and what it takes.
#[test]
fn unknown_levels_and_choices_are_refused_by_check_config_and_run() -> Result<()> {
    const LEVELS: &str = "trace, debug, info, warn, error or off";
    let (_dir, path) = config_file("[log]\nlevel = \"eror\"\n")?;
    let loopback = [
        ("SLUICE_API_LISTEN", "127.0.0.1:0"),
        ("SLUICE_ADMIN_LISTEN", "127.0.0.1:0"),
        // Nothing listens on port 9: were it to start, it would retry and say so.
        ("SLUICE_NATS_URL", "nats://127.0.0.1:9"),
    ];
    let with = |var: &'static str, value: &'static str| {
        let mut env = loopback.to_vec();
        env.push((var, value));
        env
    };
    let file = ["--config", path.as_str()];
    for command in [&["check-config", "--offline"][..], &["run"]] {
        for (config, env, names, accepted) in [
            (&file[..], loopback.to_vec(), "line 2: [log] level:", LEVELS),
            (
                &[],
                with("SLUICE_LOG_LEVEL", "loud"),
                "SLUICE_LOG_LEVEL: [log] level:",
                LEVELS,
            ),
            (
                &[],
                with("SLUICE_LOG_FORMAT", "yaml"),
                "SLUICE_LOG_FORMAT: [log] format:",
                "expected `text` or `json`",
            ),
            (
                &[],
                with("SLUICE_API_AUTH", "tokn"),
                "SLUICE_API_AUTH: [api] auth:",
                "expected `token` or `none`",
            ),
        ] {
            let args: Vec<&str> = command.iter().chain(config).copied().collect();
            let run = sluice_bounded(&args, &env)?;
            assert_eq!(
                run.code,
                Some(1),
                "{args:?} {env:?}: {}{}",
                run.stdout,
                run.stderr
            );
            assert!(
                run.stderr.contains(names) && run.stderr.contains(accepted),
                "{args:?} {env:?}: {}",
                run.stderr
            );
        }
    }
    Ok(())
}

/// `sluice` with `args`, ended by its PID after 10 s if it is still running (a `run`
/// that took a configuration it should have refused); its code is then `None`.
fn sluice_bounded(args: &[&str], env: &[(&str, &str)]) -> Result<Run> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("starting sluice {args:?}"))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if std::time::Instant::now() >= deadline {
            child.kill()?;
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let Output { stdout, stderr, .. } = child.wait_with_output()?;
    Ok(Run {
        code: status.and_then(|s| s.code()),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    })
}

#[test]
fn check_config_validates_a_configuration_from_the_environment_alone() -> Result<()> {
    let env = [
        ("SLUICE_NATS_URL", "nats://127.0.0.1:4222"),
        (
            "SLUICE_CLICKHOUSE_TARGETS_MAIN_URL",
            "http://127.0.0.1:8123",
        ),
        (
            "SLUICE_CLICKHOUSE_TARGETS_MAIN_PASSWORD_ENV",
            "SLUICE_CH_MAIN_PASSWORD",
        ),
        ("SLUICE_CH_MAIN_PASSWORD", "hunter2"),
        ("SLUICE_TENANTS_DEMO_TARGET", "main"),
        ("SLUICE_TABLES_DEMO__EVENTS_BATCH_ROWS", "250"),
        ("SLUICE_API_AUTH", "none"),
    ];
    let run = sluice(&["check-config"], &env)?;
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    for expected in [
        "configuration: environment (no config file)",
        "main: http://127.0.0.1:8123",
        "password from env",
        "demo: target main",
        "demo.events: batch_rows 250",
    ] {
        assert!(
            run.stdout.contains(expected),
            "missing {expected:?} in:\n{}",
            run.stdout
        );
    }
    assert!(
        !run.stdout.contains("hunter2") && !run.stderr.contains("hunter2"),
        "a secret was printed"
    );

    // A bad value is named by its variable.
    let mut bad = env.to_vec();
    bad.push(("SLUICE_INGEST_BATCH_ROWS", "many"));
    let run = sluice(&["check-config"], &bad)?;
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("SLUICE_INGEST_BATCH_ROWS"),
        "{}",
        run.stderr
    );
    Ok(())
}

/// A NATS URL with a password in it: `check-config` refuses it, names the keys to use
/// instead, and never prints the password, whether it came from the file or from
/// `SLUICE_NATS_URL`.
#[test]
fn check_config_refuses_credentials_in_the_nats_url_without_printing_them() -> Result<()> {
    let (_dir, path) = config_file("[nats]\nurl = \"nats://alice:hunter2@127.0.0.1:4222\"\n")?;
    let from_file = sluice(&["check-config", "--config", &path], &[])?;
    let from_env = sluice(
        &["check-config"],
        &[(
            "SLUICE_NATS_URL",
            "nats://127.0.0.1:4222,nats://hunter2@127.0.0.1:4223",
        )],
    )?;
    for run in [from_file, from_env] {
        assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
        assert!(
            run.stderr.contains("[nats] url") && run.stderr.contains("carries credentials"),
            "{}",
            run.stderr
        );
        assert!(
            run.stderr.contains("password_env") && run.stderr.contains("token_env"),
            "{}",
            run.stderr
        );
        assert!(
            !run.stdout.contains("hunter2") && !run.stderr.contains("hunter2"),
            "the password was printed:\n{}{}",
            run.stdout,
            run.stderr
        );
    }
    Ok(())
}

/// `sluice run` with a password in the NATS URL stops before connecting or logging
/// anything, and nothing it wrote carries the password. (Before the URL was checked it
/// started, logged the URL and retried the connection forever: the run is bounded and
/// ended by its PID if it is still going.)
#[test]
fn run_refuses_credentials_in_the_nats_url_and_never_logs_them() -> Result<()> {
    let run = sluice_bounded(
        &["run"],
        &[
            // Nothing listens on port 9; the listeners take free ports.
            ("SLUICE_NATS_URL", "nats://alice:hunter2@127.0.0.1:9"),
            ("SLUICE_API_LISTEN", "127.0.0.1:0"),
            ("SLUICE_ADMIN_LISTEN", "127.0.0.1:0"),
        ],
    )?;
    assert!(
        !run.stdout.contains("hunter2") && !run.stderr.contains("hunter2"),
        "the password was logged:\n{}{}",
        run.stdout,
        run.stderr
    );
    assert_eq!(
        run.code,
        Some(1),
        "still running after 10 s, or an unexpected exit:\n{}{}",
        run.stdout,
        run.stderr
    );
    ensure!(run.stderr.contains("carries credentials"), "{}", run.stderr);
    Ok(())
}

/// The original brief's example configuration: no `[api] auth`, so the API wants bearer tokens,
/// and no tenant has one.
const BRIEF_EXAMPLE: &str = r#"
[nats]
url = "nats://127.0.0.1:4222"
stream = "INGEST"
subject_prefix = "ingest"
dlq_stream = "DLQ"
max_bytes = "1GiB"
ack_wait = "60s"
max_ack_pending = 20000

[clickhouse.targets.main]
url = "http://127.0.0.1:8123"
user = "default"
password_env = "SLUICE_CH_MAIN_PASSWORD"
database = "default"
insert_timeout = "30s"

[tenants.acme]
target = "main"

[ingest]
batch_rows = 10000
batch_bytes = "8MiB"
batch_age = "1s"
dlq = true

[tables."acme.events"]
batch_rows = 500

[api]
listen = "127.0.0.1:8080"

[admin]
listen = "127.0.0.1:9090"
token_env = "SLUICE_ADMIN_TOKEN"
"#;

#[test]
fn check_config_refuses_an_api_without_tokens_in_one_line_that_names_the_fix() -> Result<()> {
    let (_dir, path) = config_file(BRIEF_EXAMPLE)?;
    let env = [
        ("SLUICE_CH_MAIN_PASSWORD", "hunter2"),
        ("SLUICE_ADMIN_TOKEN", "admin-secret"),
    ];
    let run = sluice(&["check-config", "--config", &path], &env)?;
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    let problems: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.starts_with("  - "))
        .collect();
    assert_eq!(problems.len(), 1, "one problem: {}", run.stderr);
    let line = problems[0];
    for needed in [
        "[api] auth is \"token\" (the default)",
        "no tenant has a token",
        "token_env",
        "[tenants.<name>]",
        "auth = \"none\"",
    ] {
        assert!(line.contains(needed), "{needed:?} in: {line}");
    }
    assert!(!run.stdout.contains("ok"), "{}", run.stdout);
    Ok(())
}

/// The configuration README.md's "Run it" shows, copied as it is, with its variables
/// set: accepted, with tenant tokens.
#[test]
fn check_config_accepts_the_readme_first_run_configuration() -> Result<()> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))?;
    let run_it = readme
        .split("## Run it")
        .nth(1)
        .context("README.md has a \"Run it\" section")?;
    let toml = run_it
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .context("\"Run it\" shows a configuration in a ```toml block")?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("sluice.toml");
    std::fs::write(&path, toml)?;
    let path = path.display().to_string();
    // The variables its `export` line sets, each holding a secret.
    let export = run_it
        .lines()
        .find_map(|l| l.strip_prefix("export "))
        .context("\"Run it\" exports the secrets' variables")?;
    let secrets = ["hunter2", "acme-secret", "admin-secret"];
    let names: Vec<&str> = export
        .split_whitespace()
        .filter_map(|word| word.split_once('=').map(|(name, _)| name))
        .collect();
    ensure!(names.len() == secrets.len(), "{export}");
    let env: Vec<(&str, &str)> = names.iter().copied().zip(secrets).collect();
    let run = sluice(&["check-config", "--config", &path], &env)?;
    assert_eq!(run.code, Some(0), "{}{}\n{toml}", run.stdout, run.stderr);
    // A secret's variable is no configuration key: nothing to warn about.
    assert!(
        !run.stdout.contains("no configuration key")
            && !run.stderr.contains("no configuration key"),
        "{}{}",
        run.stdout,
        run.stderr
    );
    for expected in ["acme: target main token set", "(auth token)", "(token set)"] {
        assert!(
            run.stdout.contains(expected),
            "missing {expected:?} in:\n{}",
            run.stdout
        );
    }
    for secret in secrets {
        assert!(
            !run.stdout.contains(secret) && !run.stderr.contains(secret),
            "a secret was printed"
        );
    }
    Ok(())
}
