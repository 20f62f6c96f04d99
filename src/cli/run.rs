//! `sluice run`: load the configuration, start the runtime, run until told to stop.

use std::path::Path;
use std::process::ExitCode;

use crate::config::Config;
use crate::telemetry::logging;

pub fn run(path: Option<&Path>) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprint!("{e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(why) = config.takes_no_row() {
        eprintln!("{why}");
        return ExitCode::FAILURE;
    }
    logging::init(config.log.format, &config.log.level);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async {
        match crate::server::run(config).await {
            Ok(code) => code,
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "sluice cannot start");
                ExitCode::FAILURE
            }
        }
    });
    // Flights that outlived the deadline were handed back; don't wait on stragglers.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}
