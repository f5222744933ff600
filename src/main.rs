//! The `tailor` binary: parses the command line and hands it to the library.

use std::io::Write;

use anyhow::Context;
use clap::Parser;
use tailor::cli::{self, Cli};
use tailor::telemetry::{Telemetry, TelemetrySettings};

fn main() -> anyhow::Result<()> {
    let Cli { log, command } = Cli::parse();
    let telemetry = Telemetry::init(&TelemetrySettings {
        log_filter: Some(log),
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
