//! schemathesis (PyPI) against a running Sluice on real servers, on both documents,
//! with every check it has (no 5xx, every status, body, header and media type as
//! documented, invalid data refused, valid data taken, the token required, 405 for
//! other methods...), and then the reckoning: every row the ingest API stored during
//! the fuzzing is in ClickHouse or on the DLQ, less what a purge deleted.
//!
//! What schemathesis is told beside the documents is in `schemathesis.toml` (with the
//! reason for each setting) and `sluice_hooks.py` (the NDJSON and JSON text sequence
//! bodies). A failure prints schemathesis's report, with the `st replay` line of each
//! case; the seed is fixed (`SLUICE_TEST_SCHEMATHESIS_SEED` changes it).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use sluice_harness::{available, process::on_path, wait_for, Stack, TENANT};

use crate::*;

/// Where the hooks module and the configuration are.
const HERE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openapi");
/// Overrides the schemathesis binary (`st`).
const SCHEMATHESIS_BIN_ENV: &str = "SLUICE_SCHEMATHESIS_BIN";
const SEED_ENV: &str = "SLUICE_TEST_SCHEMATHESIS_SEED";
const DEFAULT_SEED: &str = "20231";
/// Cases per operation and phase: enough to walk every status, bounded in time.
const MAX_EXAMPLES: &str = "100";
/// The most one run may take.
const RUN_DEADLINE: Duration = Duration::from_secs(150);

/// `st`: from `SLUICE_SCHEMATHESIS_BIN`, the PATH, or Python's scripts directory (where
/// `pip install schemathesis` puts it).
fn schemathesis_binary() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(SCHEMATHESIS_BIN_ENV).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            bail!("{SCHEMATHESIS_BIN_ENV}={} is not a file", path.display())
        };
    }
    if let Some(path) = on_path("st") {
        return Ok(path);
    }
    let scripts = std::process::Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_path('scripts'))",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    match scripts.map(|dir| dir.join("st")).filter(|p| p.is_file()) {
        Some(path) => Ok(path),
        None => bail!(
            "schemathesis is not installed (no `st` on the PATH or in Python's scripts directory): run `python3 -m pip install schemathesis`"
        ),
    }
}

/// One schemathesis run on `base`'s document with `credential` (the header that names
/// the caller: `Authorization: Bearer ...`, or `X-Tenant: ...`); its HAR report (every
/// request and answer) when it finds nothing, else its output as the error.
async fn run_schemathesis(
    st: &Path,
    work: &Path,
    name: &str,
    base: &str,
    credential: &str,
) -> Result<Value> {
    let har = work.join(format!("{name}.har"));
    let seed = std::env::var(SEED_ENV).unwrap_or_else(|_| DEFAULT_SEED.to_string());
    let log = work.join(format!("{name}.log"));
    let output = std::fs::File::create(&log)?;
    let mut child = tokio::process::Command::new(st)
        .arg("--config-file")
        .arg(Path::new(HERE).join("schemathesis.toml"))
        .arg("--no-color")
        .arg("run")
        .arg(format!("{base}/openapi.json"))
        .args([
            "--max-examples",
            MAX_EXAMPLES,
            "--workers",
            "1",
            "--seed",
            &seed,
        ])
        .args(["--header", credential])
        .args(["--request-timeout", "30"])
        .args(["--report", "har", "--report-har-path"])
        .arg(&har)
        // Its caches and reports stay in the test's temp dir.
        .current_dir(work)
        .env("PYTHONPATH", HERE)
        .env("HOME", work)
        .stdin(Stdio::null())
        .stdout(output.try_clone()?)
        .stderr(output)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", st.display()))?;
    let status = tokio::time::timeout(RUN_DEADLINE, child.wait())
        .await
        .map_err(|_| anyhow!("schemathesis on the {name} listener ran over {RUN_DEADLINE:?}"))??;
    let report = std::fs::read_to_string(&log).unwrap_or_default();
    println!("schemathesis on the {name} listener (seed {seed}):\n{report}");
    if !status.success() {
        bail!(
            "schemathesis found problems on the {name} listener's document ({status}):\n{report}"
        );
    }
    let har =
        std::fs::read_to_string(&har).with_context(|| format!("reading {}", har.display()))?;
    serde_json::from_str(&har).context("the HAR report is not JSON")
}

/// What a run's answers say happened to rows: stored by the ingest API (accepted, less
/// the duplicates an earlier request stored), and deleted by a purge. An answer given
/// again under an `Idempotency-Key` (`Idempotent-Replayed`) stored nothing.
#[derive(Debug, Default)]
struct Reckoning {
    stored: u64,
    purged: u64,
    ingest_answers: u64,
    replayed_answers: u64,
}

fn replayed(entry: &Value) -> bool {
    entry["response"]["headers"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|h| {
            h["name"]
                .as_str()
                .is_some_and(|n| n.eq_ignore_ascii_case("idempotent-replayed"))
                && h["value"] == "true"
        })
}

fn reckon(har: &Value, into: &mut Reckoning) -> Result<()> {
    let entries = har["log"]["entries"].as_array().context("log.entries[]")?;
    for entry in entries {
        let method = entry["request"]["method"].as_str().unwrap_or_default();
        let url = entry["request"]["url"].as_str().unwrap_or_default();
        let status = entry["response"]["status"].as_u64().unwrap_or_default();
        let body: Value = entry["response"]["content"]["text"]
            .as_str()
            .and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or(Value::Null);
        if method == "POST" && url.contains("/v1/ingest/") {
            into.ingest_answers += 1;
            if replayed(entry) {
                into.replayed_answers += 1;
                continue;
            }
            let accepted = body["accepted"].as_u64().unwrap_or(0);
            let duplicates = body["duplicates"].as_u64().unwrap_or(0);
            into.stored += accepted.saturating_sub(duplicates);
        }
        if method == "DELETE" && url.contains("/admin/dlq/") && status == 200 {
            into.purged += body["purged"].as_u64().context("purged")?;
        }
    }
    Ok(())
}

/// Rows the ingest API stored, per `/metrics` (every request, not only those the
/// report shows).
async fn stored_per_metrics(stack: &Stack) -> Result<u64> {
    let metrics = stack.metrics_parsed().await?;
    Ok(metrics
        .family("sluice_ingest_rows_total")
        .iter()
        .map(|s| s.value as u64)
        .sum())
}

/// Rows in ClickHouse's `events` and on the DLQ, all tables.
async fn landed(stack: &Stack) -> Result<(u64, u64)> {
    let inserted = stack.count("events").await?;
    let (status, dlq) = stack.admin_get("/admin/dlq").await?;
    if status != 200 {
        bail!("/admin/dlq answered {status}: {dlq}");
    }
    Ok((inserted, dlq["total"].as_u64().context("total")?))
}

/// Fuzzes each of `listeners` (a name, its base URL, the header naming the caller) in
/// turn, then reckons: every row the ingest API stored is inserted or parked, less what
/// a purge deleted.
async fn fuzz_and_reckon(
    st: &Path,
    stack: &Stack,
    listeners: &[(&str, String, String)],
) -> Result<()> {
    let work = tempfile::Builder::new()
        .prefix("sluice-schemathesis-")
        .tempdir()?;
    let mut reckoning = Reckoning::default();
    for (listener, base, credential) in listeners {
        let har = run_schemathesis(st, work.path(), listener, base, credential).await?;
        reckon(&har, &mut reckoning)?;
    }
    println!("{reckoning:?}");
    assert!(
        reckoning.ingest_answers > 0 && reckoning.stored > 0,
        "the fuzzing stored no row: {reckoning:?}"
    );
    // The report saw every request that stored rows.
    assert_eq!(stored_per_metrics(stack).await?, reckoning.stored);

    // Every stored row is inserted or parked (with `TENANT` the only tenant, `events`
    // the only table its target has), but for those purged.
    let expected = reckoning.stored - reckoning.purged;
    let (inserted, parked) = wait_for(
        &format!("{expected} rows in ClickHouse and on the DLQ of {TENANT}"),
        DEADLINE,
        POLL,
        || async {
            let (inserted, parked) = landed(stack).await?;
            if inserted + parked == expected {
                Ok((inserted, parked))
            } else {
                bail!("{inserted} inserted + {parked} parked")
            }
        },
    )
    .await?;
    println!(
        "{inserted} inserted, {parked} parked, {} purged",
        reckoning.purged
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing_and_no_accepted_row_is_lost() -> Result<()> {
    let name = "schemathesis_finds_nothing_and_no_accepted_row_is_lost";
    let Some(st) = available(name, schemathesis_binary())? else {
        return Ok(());
    };
    let stack = production_like_stack().await?;
    // The API first (it stores rows), then the admin endpoint (it peeks at, replays
    // and may purge them).
    let listeners: Vec<(&str, String, String)> = listeners(&stack)
        .into_iter()
        .map(|(name, base, token)| (name, base, format!("Authorization: Bearer {token}")))
        .collect();
    fuzz_and_reckon(&st, &stack, &listeners).await
}

/// issue 38.6: the API of a deployment that takes the tenant from `X-Tenant` (`[api]
/// auth = "none"`, behind a proxy that authenticates) is fuzzed against the document it
/// serves: the document describes that configuration (it asked for a bearer token
/// that this API never wants).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing_on_an_api_that_takes_the_tenant_from_a_header() -> Result<()> {
    let name = "schemathesis_finds_nothing_on_an_api_that_takes_the_tenant_from_a_header";
    let Some(st) = available(name, schemathesis_binary())? else {
        return Ok(());
    };
    let stack = header_tenant_stack().await?;
    let api = ("api", stack.api_url(), format!("X-Tenant: {TENANT}"));
    fuzz_and_reckon(&st, &stack, &[api]).await
}
