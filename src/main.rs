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
    // The standard OpenTelemetry variables: the collector, the push interval and the span
    // queue (milliseconds and spans, as the specification gives them).
    let variable = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let number = |name: &str| -> anyhow::Result<Option<u64>> {
        variable(name)
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .with_context(|| format!("{name}={v:?} is not a whole number"))
            })
            .transpose()
    };
    let (json_logs, otlp_endpoint) = match &command {
        cli::Command::Run(args) => (
            args.log_format == cli::run::LogFormat::Json,
            variable("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ),
        _ => (false, None),
    };
    let telemetry = Telemetry::init(&TelemetrySettings {
        log_filter: Some(log),
        json_logs,
        otlp_endpoint,
        otlp_interval: number("OTEL_METRIC_EXPORT_INTERVAL")?
            .filter(|ms| *ms > 0)
            .map(std::time::Duration::from_millis),
        span_queue: number("OTEL_BSP_MAX_QUEUE_SIZE")?
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n > 0),
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
