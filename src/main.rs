//! The `tailor` binary: parses the command line and hands it to the library.

use std::io::Write;

use anyhow::Context;
use clap::Parser;
use tailor::cli::{self, Cli};
use tailor::telemetry::{Telemetry, TelemetrySettings};

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
    let result = cli::run(command, &mut out);
    out.flush().ok();
    telemetry.shutdown();
    result.map_err(anyhow::Error::from)
}
