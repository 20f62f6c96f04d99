//! The `tracing` subscriber: human lines by default, JSON for log pipelines.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Install the global subscriber. `RUST_LOG`, when set, wins over the configured level.
/// A second call (tests) is a no-op.
pub fn init(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder.with_target(false).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
    if installed.is_ok() && format == LogFormat::Json {
        log_panics_as_events();
    }
}

/// A panic inside an actor is caught and the actor respawned, so the process goes on;
/// the default hook would still print the panic (and a backtrace) as plain text into
/// the JSON stream. In JSON mode a panic is one ERROR event instead, with the message,
/// the location and, where `RUST_BACKTRACE` asks for one, the backtrace as fields.
fn log_panics_as_events() {
    std::panic::set_hook(Box::new(|info| {
        let payload = info.payload();
        let message = sluice_actors::restart::panic_message(payload)
            .unwrap_or_else(|| "(a non-string panic payload)".to_string());
        let location = info
            .location()
            .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()))
            .unwrap_or_default();
        let thread = std::thread::current();
        let thread = thread.name().unwrap_or("unnamed");
        let backtrace = std::backtrace::Backtrace::capture();
        if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
            tracing::error!(target: "panic", panic = %message, %location, thread, backtrace = %backtrace, "panicked");
        } else {
            tracing::error!(target: "panic", panic = %message, %location, thread, "panicked");
        }
    }));
}
