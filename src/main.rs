use std::process::ExitCode;

fn main() -> ExitCode {
    sluice::cli::main()
}
