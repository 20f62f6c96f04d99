//! `sluice check-config`: validate without starting anything.

use std::path::Path;
use std::process::ExitCode;

use crate::config::Config;

pub fn run(path: Option<&Path>) -> ExitCode {
    match Config::load(path) {
        Ok(config) => {
            print!("{}", config.summary());
            println!("ok");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprint!("{error}");
            ExitCode::FAILURE
        }
    }
}
