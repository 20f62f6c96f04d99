//! `sluice dev`: local servers, a demo table and Sluice, in one command.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;

use crate::config::LogFormat;
use crate::dev::{self, DevOptions};
use crate::telemetry::logging;

pub fn run(options: DevOptions) -> ExitCode {
    logging::init(LogFormat::Text, "info");
    let runtime = match super::service_runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    let code = runtime.block_on(dev::run(options));
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}

/// `8080` means `127.0.0.1:8080`; a full address is taken as given. Port 0 is refused:
/// the URLs `sluice dev` prints must be the ones it listens on.
pub fn parse_listen(value: &str) -> Result<SocketAddr, String> {
    let addr = match value.trim().parse::<u16>() {
        Ok(port) => SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        Err(_) => value.trim().parse().map_err(|_| {
            format!("{value:?} is neither a port (8080) nor an address (127.0.0.1:8080)")
        })?,
    };
    if addr.port() == 0 {
        return Err("give a port other than 0".into());
    }
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_addresses() {
        assert_eq!(
            parse_listen("8080"),
            Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, 8080)))
        );
        assert_eq!(
            parse_listen("0.0.0.0:9"),
            Ok(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 9)))
        );
        assert!(parse_listen("localhost").is_err());
        assert!(parse_listen("0").is_err());
    }
}
