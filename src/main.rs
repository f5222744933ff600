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

/// mimalloc's `mi_option_purge_delay` (its position in `mi_option_e`, the same in mimalloc
/// 2 and 3; the Rust bindings do not name it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Returns freed pages to the system at once instead of after mimalloc's delay (1 s in
/// mimalloc 3, counted only when the freeing thread next allocates), in the long-running
/// agent only. Each pass of a controller builds and drops a model of the cluster on
/// whichever runtime thread it lands; with the delay, the pages one pass freed were still
/// resident while the next pass, on another thread, took new ones, and the agent's peak rose
/// by a pass's worth (`cargo bench --bench agent` compares both with 500 nodes and 5,000
/// pods; the price is CPU time spent returning pages, about 1.5 s over the agent's first
/// minute there). One-shot commands (`simulate`, `recommend`, the demo) exit soon and keep
/// mimalloc's default: `tailor simulate` of 20,000 pods faulted in 27,000 pages with no
/// delay against 2,000 with it, at the same peak (`cargo bench --bench simulate`).
/// `MIMALLOC_PURGE_DELAY` in the environment still wins.
fn release_freed_memory_promptly() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one of mimalloc's options; any value is valid and it may be set at
        // any time.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
    }
}

fn main() -> anyhow::Result<()> {
    let Cli { log, command } = Cli::try_parse().unwrap_or_else(|e| {
        #[cfg(not(feature = "report"))]
        if e.kind() == clap::error::ErrorKind::InvalidSubcommand
            && std::env::args().skip(1).any(|a| a == "report")
        {
            eprintln!(
                "error: this tailor was built without `tailor report` (cost allocation over a \
                 window, which needs polars); build it with `cargo build --release --features report`"
            );
            std::process::exit(2);
        }
        e.exit()
    });
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
    if matches!(command, cli::Command::Run(_)) {
        release_freed_memory_promptly();
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_delay_option_is_the_one_mimalloc_documents_and_is_set_to_zero() {
        // SAFETY: reads and sets mimalloc options; any value is valid.
        let before = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            // mimalloc 3's default `mi_option_purge_delay` is 1,000 ms: another option at
            // this position would read differently.
            assert_eq!(
                before, 1000,
                "option {MI_OPTION_PURGE_DELAY} is not the purge delay"
            );
            release_freed_memory_promptly();
            let after = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
            assert_eq!(after, 0);
        }
    }
}
