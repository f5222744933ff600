//! The `tailor` binary: parses the command line and hands it to the library.

use std::io::Write;

use anyhow::Context;
use clap::Parser;
use tailor::cli::{self, Cli};
use tailor::telemetry::{Telemetry, TelemetrySettings};

/// mimalloc instead of the system allocator: the agent's watches allocate and free many
/// small objects on several threads, and glibc's per-thread arenas keep the freed memory
/// (the agent held 2-6x its live heap as resident memory with them).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let Cli { log, command } = Cli::parse();
    // The agent logs in the format it is told and pushes OTLP when a collector is set.
    let (json_logs, otlp_endpoint) = match &command {
        cli::Command::Run(args) => (
            args.log_format == cli::run::LogFormat::Json,
            std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
                .ok()
                .filter(|e| !e.is_empty()),
        ),
        _ => (false, None),
    };
    let telemetry = Telemetry::init(&TelemetrySettings {
        log_filter: Some(log),
        json_logs,
        otlp_endpoint,
        ..TelemetrySettings::default()
    })
    .context("setting up logging")?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result = cli::run(command, &mut out).and_then(|()| out.flush().map_err(Into::into));
    telemetry.shutdown();
    match result {
        // The reader closed the pipe (`tailor crds | head -1`): it has what it wanted, so
        // stop quietly and successfully, as Unix tools do.
        Err(cli::CliError::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.map_err(anyhow::Error::from),
    }
}
