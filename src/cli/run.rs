//! `sluice run`: load the configuration, start the runtime, run until told to stop.

use std::path::Path;
use std::process::ExitCode;

use crate::telemetry::logging;

pub fn run(path: Option<&Path>) -> ExitCode {
    let config = match super::load_config(path) {
        Ok(config) => config,
        Err(code) => return code,
    };
    logging::init(config.log.format, &config.log.level);
    let runtime = match super::service_runtime() {
        Ok(r) => r,
        Err(code) => return code,
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
