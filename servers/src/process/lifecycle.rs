//! The lifecycle every server handle offers (stop, kill, freeze, start again), kept in
//! one place: each handle has a `process: ManagedProcess` field and an
//! `async fn wait_ready(&mut self) -> Result<()>` of its own, and invokes
//! [`server_lifecycle!`] inside its `impl` block.

/// Inherent methods `stop`, `kill9`, `start_again`, `restart`, `sigstop`, `sigcont`,
/// `pid`, `is_running`, `log_tail` and `process_mut`, delegated to `self.process`.
macro_rules! server_lifecycle {
    () => {
        /// Graceful stop (SIGTERM, then SIGKILL after 10 s). Its data stays.
        pub async fn stop(&mut self) -> ::anyhow::Result<::std::process::ExitStatus> {
            self.process.stop($crate::process::DEFAULT_STOP_GRACE).await
        }

        /// SIGKILL: a crash. Its data stays as the crash left it.
        pub async fn kill9(&mut self) -> ::anyhow::Result<::std::process::ExitStatus> {
            self.process.kill9().await
        }

        /// Starts the stopped or killed server again on the same ports and data, and
        /// waits until it is ready.
        pub async fn start_again(&mut self) -> ::anyhow::Result<()> {
            self.process.start_again()?;
            self.wait_ready().await
        }

        /// Stops (gracefully) if running, then starts again on the same ports and data.
        pub async fn restart(&mut self) -> ::anyhow::Result<()> {
            self.stop().await?;
            self.start_again().await
        }

        /// Freezes the server: the kernel still accepts connections, nothing answers.
        pub async fn sigstop(&mut self) -> ::anyhow::Result<()> {
            self.process.sigstop().await
        }

        pub async fn sigcont(&mut self) -> ::anyhow::Result<()> {
            self.process.sigcont().await
        }

        pub fn pid(&self) -> Option<u32> {
            self.process.pid()
        }

        pub fn is_running(&mut self) -> bool {
            self.process.is_running()
        }

        /// The last `lines` lines of each of the server's logs.
        pub fn log_tail(&self, lines: usize) -> String {
            self.process.log_tail(lines)
        }

        /// The underlying child, for anything not wrapped here.
        pub fn process_mut(&mut self) -> &mut $crate::process::ManagedProcess {
            &mut self.process
        }
    };
}

pub(crate) use server_lifecycle;
