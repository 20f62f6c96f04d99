//! `sluice check-config`: validate without starting anything; then, unless `--offline`,
//! ask each ClickHouse target which of its tables are exactly-once — they deduplicate
//! inserts over a window that covers a redelivery (see docs/operations.md, "Delivery
//! guarantees").

use std::path::Path;
use std::process::ExitCode;

use crate::clickhouse::report::exactly_once_report;
use crate::config::Config;

pub fn run(path: Option<&Path>, offline: bool) -> ExitCode {
    let config = match Config::load(path) {
        Ok(config) => config,
        Err(error) => {
            eprint!("{error}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(why) = config.takes_no_row() {
        eprintln!("{why}");
        return ExitCode::FAILURE;
    }
    print!("{}", config.summary());
    if !offline {
        print!("{}", exactly_once_report(&config));
    }
    println!("ok");
    ExitCode::SUCCESS
}
