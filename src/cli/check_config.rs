//! `sluice check-config`: validate without starting anything; then, unless `--offline`,
//! ask NATS its version (a release Sluice warns against is named), and each ClickHouse
//! target its servers' versions and which of its tables are exactly-once — they
//! deduplicate inserts over a window that covers a redelivery (see docs/operations.md,
//! "Delivery guarantees" and "ClickHouse and NATS versions").

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use crate::clickhouse::report::exactly_once_report;
use crate::config::Config;
use crate::nats::version;

pub fn run(path: Option<&Path>, offline: bool) -> ExitCode {
    let config = match super::load_config(path) {
        Ok(config) => config,
        Err(code) => return code,
    };
    print!("{}", config.summary());
    if !offline {
        print!("{}", nats_report(&config));
        print!("{}", exactly_once_report(&config));
    }
    println!("ok");
    ExitCode::SUCCESS
}

/// How long NATS may take to answer: an unreachable server is not a configuration
/// error.
const NATS_WITHIN: Duration = Duration::from_secs(5);

/// `nats: nats-server 2.9.10: …`, and a `WARN` line for a release Sluice warns against.
fn nats_report(config: &Config) -> String {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return format!("nats: not asked (cannot start the runtime: {e})\n"),
    };
    let asked = runtime.block_on(async {
        let connect = crate::nats::connect(&config.nats, false);
        match tokio::time::timeout(NATS_WITHIN, connect).await {
            Ok(Ok(client)) => Ok(client.server_info().version),
            Ok(Err(e)) => Err(format!("{e:#}")),
            Err(_) => Err(format!("no answer within {NATS_WITHIN:?}")),
        }
    });
    match asked {
        Ok(version) => {
            let mut out = format!("nats: {}\n", version::describe(&version));
            if let Some(warning) = version::warning(&version) {
                out.push_str(&format!("WARN {warning}\n"));
            }
            out
        }
        Err(e) => format!(
            "nats: not known (NATS did not answer: {e}); Sluice names its version when it connects\n"
        ),
    }
}
