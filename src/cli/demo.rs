//! `tailor demo`: the whole loop on a simulated AKS cluster, no cluster needed. The same
//! scenario runs three times — recommend-only, consolidation-only (what users run today:
//! Karpenter-style packing and consolidation, requests as deployed) and autonomous — and
//! the summary compares them; a self-contained HTML report shows cost, nodes, requests
//! against usage and the recommendations applied over time.

use std::fmt::Write as _;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

use super::{CliError, Result};
use crate::catalog::{Catalog, CatalogOptions};
use crate::model::quantity::{display_bytes, display_cores};
use crate::provisioning::Mode;
use crate::report::Table;
use crate::report::svg::{Chart, Series, escape, line_chart};
use crate::sim::scenario::Scenario;
use crate::sim::world::{self, RunResult, RunSettings};

/// Arguments of `tailor demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Days of virtual time.
    #[arg(long, env = "TAILOR_DEMO_DAYS", default_value_t = 7)]
    pub days: u32,

    /// Seed of the scenario (workloads, usage, requests).
    #[arg(long, env = "TAILOR_DEMO_SEED", default_value_t = 7)]
    pub seed: u64,

    /// Where to write the HTML report.
    #[arg(long, env = "TAILOR_DEMO_REPORT", default_value = "tailor-demo.html")]
    pub report: PathBuf,

    /// After the run, keep serving `/metrics` (and `/healthz`) on this address until
    /// interrupted, so Prometheus and Grafana can look at it.
    #[arg(long, env = "TAILOR_DEMO_SERVE")]
    pub serve: Option<SocketAddr>,

    /// Output format of the summary.
    #[command(flatten)]
    pub output: super::OutputArgs,
}

/// The three runs and the comparison.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DemoReport {
    /// The scenario's name.
    pub scenario: String,
    /// Workloads in the scenario.
    pub workloads: usize,
    /// The recommend-only run.
    pub recommend_only: RunResult,
    /// The consolidation-only run: Karpenter-style packing and consolidation, requests as
    /// deployed.
    pub consolidation_only: RunResult,
    /// The autonomous run.
    pub autonomous: RunResult,
}

fn days_hours(t: f64) -> String {
    jiff::Timestamp::from_second(t as i64).map_or_else(
        |_| format!("{t:.0}"),
        |ts| ts.strftime("%m-%d %H:%M UTC").to_string(),
    )
}

/// The summary for a terminal.
pub fn table(r: &DemoReport) -> String {
    let (a, c, b) = (
        &r.recommend_only.summary,
        &r.consolidation_only.summary,
        &r.autonomous.summary,
    );
    let mut t = Table::new(["", "RECOMMEND-ONLY", "CONSOLIDATION-ONLY", "AUTONOMOUS"])
        .align_right(&[1, 2, 3]);
    // One row: a figure of each run.
    let row = |t: &mut Table, k: &str, f: &dyn Fn(&world::RunSummary) -> String| {
        t.row([k.to_string(), f(a), f(c), f(b)])
    };
    row(&mut t, "nodes (start -> end)", &|s| {
        format!("{} -> {}", s.nodes_start, s.nodes_end)
    });
    row(&mut t, "$/hour (start -> end)", &|s| {
        format!("{:.2} -> {:.2}", s.hourly_cost_start, s.hourly_cost_end)
    });
    row(&mut t, "total spent ($)", &|s| {
        format!("{:.0}", s.total_cost)
    });
    row(&mut t, "requested CPU at end (cores)", &|s| {
        format!("{:.1}", s.cpu_requested_end)
    });
    row(&mut t, "requested memory at end (GiB)", &|s| {
        format!("{:.1}", s.memory_requested_end)
    });
    row(&mut t, "requests worth ($/hour, at end)", &|s| {
        format!("{:.2}", s.requests_value_per_hour)
    });
    t.row([
        "right-sizing recommendations".to_string(),
        format!("{} reported", a.recommendations),
        format!("{} reported", c.recommendations),
        format!("{} applied", b.recommendations),
    ]);
    t.row([
        "consolidation decisions".to_string(),
        format!("{} pending", a.decisions),
        format!("{} carried out", c.decisions),
        format!("{} carried out", b.decisions),
    ]);
    t.row([
        "consolidation saving ($)".to_string(),
        format!("{:.2}/hour available", a.consolidation_savings_per_hour),
        format!("{:.0} realised", c.consolidation_realised_savings),
        format!("{:.0} realised", b.consolidation_realised_savings),
    ]);
    row(&mut t, "pods evicted", &|s| s.pods_evicted.to_string());
    row(&mut t, "OOM kills", &|s| s.oom_kills.to_string());
    row(&mut t, "provisioning p50 / p99 (s)", &|s| {
        format!(
            "{:.0} / {:.0}",
            s.provisioning_p50_seconds, s.provisioning_p99_seconds
        )
    });
    row(&mut t, "spot interruptions", &|s| {
        s.spot_interruptions.to_string()
    });
    row(&mut t, "pending pod-hours", &|s| {
        format!("{:.1}", s.pending_pod_hours)
    });
    row(&mut t, "  by cause", &|s| {
        let causes: Vec<String> = s
            .pending_pod_hours_by_cause
            .iter()
            .map(|(cause, hours)| format!("{cause} {hours:.1}"))
            .collect();
        if causes.is_empty() {
            "-".to_string()
        } else {
            causes.join(", ")
        }
    });
    row(&mut t, "nodes launched", &|s| s.launches.to_string());
    let mut out = format!("{} ({} workloads)\n\n", r.scenario, r.workloads);
    out.push_str(&t.render());
    let share = |x: f64, of: f64| if of > 0.0 { x / of * 100.0 } else { 0.0 };
    let _ = writeln!(
        out,
        "\nautonomous spent ${:.0} ({:.0}%) less than recommend-only and ${:.0} ({:.0}%) less than \
         consolidation-only, ending at ${:.2}/hour instead of ${:.2} and ${:.2}.\n\
         right-sizing: requests worth ${:.2}/hour less at the end; consolidation: {} decisions realised ${:.0} \
         (a saving counts until provisioning buys the capacity again).\n\
         autonomous: {} pods evicted, {} OOM kills, {:.1} pending pod-hours, {} nodes launched \
         (consolidation-only: {} evicted, {} OOM kills, {:.1} pending pod-hours, {} launched).",
        a.total_cost - b.total_cost,
        share(a.total_cost - b.total_cost, a.total_cost),
        c.total_cost - b.total_cost,
        share(c.total_cost - b.total_cost, c.total_cost),
        b.hourly_cost_end,
        a.hourly_cost_end,
        c.hourly_cost_end,
        a.requests_value_per_hour - b.requests_value_per_hour,
        b.decisions,
        b.consolidation_realised_savings,
        b.pods_evicted,
        b.oom_kills,
        b.pending_pod_hours,
        b.launches,
        c.pods_evicted,
        c.oom_kills,
        c.pending_pod_hours,
        c.launches,
    );
    out
}

/// The self-contained HTML report.
pub fn html(r: &DemoReport) -> String {
    let points = |run: &RunResult, f: fn(&world::Sample) -> f64| -> Vec<(f64, f64)> {
        run.samples.iter().map(|s| (s.t as f64, f(s))).collect()
    };
    // Usage starts when the first pods run, not at zero before the first node is up.
    let used = |run: &RunResult, f: fn(&world::Sample) -> f64| -> Vec<(f64, f64)> {
        points(run, f)
            .into_iter()
            .skip_while(|p| p.1 <= 0.0)
            .collect()
    };
    let (ro, co, au) = (&r.recommend_only, &r.consolidation_only, &r.autonomous);
    let money = |v: f64| format!("${v:.1}");
    let one = |v: f64| format!("{v:.0}");
    let cost = line_chart(
        &Chart {
            title: "Cost ($/hour)",
            y_format: money,
            x_format: days_hours,
            size: (900, 260),
        },
        &[
            Series {
                label: "recommend-only",
                color: "#888",
                points: points(ro, |s| s.hourly_cost),
                dashed: true,
            },
            Series {
                label: "consolidation-only",
                color: "#ff7f0e",
                points: points(co, |s| s.hourly_cost),
                dashed: true,
            },
            Series {
                label: "autonomous",
                color: "#1f77b4",
                points: points(au, |s| s.hourly_cost),
                dashed: false,
            },
        ],
    );
    let cpu = line_chart(
        &Chart {
            title: "CPU (cores): requested vs used",
            y_format: one,
            x_format: days_hours,
            size: (900, 260),
        },
        &[
            Series {
                label: "requested, recommend-only",
                color: "#888",
                points: points(ro, |s| s.cpu_requested),
                dashed: true,
            },
            Series {
                label: "requested, autonomous",
                color: "#1f77b4",
                points: points(au, |s| s.cpu_requested),
                dashed: false,
            },
            Series {
                label: "used",
                color: "#2ca02c",
                points: used(au, |s| s.cpu_used),
                dashed: false,
            },
        ],
    );
    let memory = line_chart(
        &Chart {
            title: "Memory (GiB): requested vs used",
            y_format: one,
            x_format: days_hours,
            size: (900, 260),
        },
        &[
            Series {
                label: "requested, recommend-only",
                color: "#888",
                points: points(ro, |s| s.memory_requested),
                dashed: true,
            },
            Series {
                label: "requested, autonomous",
                color: "#1f77b4",
                points: points(au, |s| s.memory_requested),
                dashed: false,
            },
            Series {
                label: "used",
                color: "#2ca02c",
                points: used(au, |s| s.memory_used),
                dashed: false,
            },
        ],
    );
    let applied = line_chart(
        &Chart {
            title: "Recommendations applied (autonomous, cumulative)",
            y_format: one,
            x_format: days_hours,
            size: (900, 220),
        },
        &[Series {
            label: "applied",
            color: "#9467bd",
            points: points(au, |s| s.recommendations_applied as f64),
            dashed: false,
        }],
    );
    // Pending pods and OOM kills count in tens, evictions in hundreds: on one axis the
    // first two would lie flat on zero, so evictions get their own chart.
    let disruption = line_chart(
        &Chart {
            title: "Pending pods and OOM kills (autonomous; OOM kills cumulative)",
            y_format: one,
            x_format: days_hours,
            size: (900, 240),
        },
        &[
            Series {
                label: "pending pods",
                color: "#ff7f0e",
                points: points(au, |s| s.pending as f64),
                dashed: false,
            },
            Series {
                label: "OOM kills",
                color: "#d62728",
                points: points(au, |s| s.oom_kills as f64),
                dashed: false,
            },
        ],
    );
    let evictions = line_chart(
        &Chart {
            title: "Pods evicted (cumulative)",
            y_format: one,
            x_format: days_hours,
            size: (900, 220),
        },
        &[
            Series {
                label: "consolidation-only",
                color: "#ff7f0e",
                points: points(co, |s| s.evicted as f64),
                dashed: true,
            },
            Series {
                label: "autonomous",
                color: "#1f77b4",
                points: points(au, |s| s.evicted as f64),
                dashed: false,
            },
        ],
    );
    // Nodes by type: the sizes that were ever in use, one line each.
    // Ten distinct colours; a second round of sizes is drawn dashed, so no two lines look
    // alike.
    const COLORS: [&str; 10] = [
        "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
        "#bcbd22", "#17becf",
    ];
    let mut types: Vec<String> = au
        .samples
        .iter()
        .flat_map(|s| s.nodes_by_type.keys().cloned())
        .collect();
    types.sort();
    types.dedup();
    let series: Vec<Series<'_>> = types
        .iter()
        .enumerate()
        .map(|(i, ty)| Series {
            label: ty,
            color: COLORS[i % COLORS.len()],
            points: au
                .samples
                .iter()
                .map(|s| {
                    (
                        s.t as f64,
                        s.nodes_by_type.get(ty).copied().unwrap_or(0) as f64,
                    )
                })
                .collect(),
            dashed: i >= COLORS.len(),
        })
        .collect();
    let nodes = line_chart(
        &Chart {
            title: "Nodes by type (autonomous)",
            y_format: one,
            x_format: days_hours,
            size: (900, 260),
        },
        &series,
    );
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Tailor demo</title>\
         <style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:960px}}pre{{background:#f6f6f6;padding:1em;white-space:pre-wrap}}td:first-child{{white-space:nowrap}}h2{{margin-top:1.5em}}</style></head><body>\
         <h1>Tailor demo: {}</h1><pre>{}</pre>\
         <h2>Cost over time</h2>{cost}<h2>Nodes by type</h2>{nodes}<h2>Requested vs used CPU</h2>{cpu}\
         <h2>Requested vs used memory</h2>{memory}<h2>Recommendations applied</h2>{applied}\
         <h2>Pending pods, evictions and OOM kills</h2>{disruption}{evictions}{}</body></html>\n",
        escape(&r.scenario),
        escape(&table(r)),
        workload_table(au),
    );
    out
}

/// The autonomous run per workload: requests before and after, why, and what it
/// suffered (OOM kills and evictions are highlighted).
fn workload_table(run: &RunResult) -> String {
    if run.workloads.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "<h2>Workloads (autonomous)</h2><table style=\"border-collapse:collapse\" border=\"1\" \
         cellpadding=\"4\"><tr><th>Workload</th><th>Kind</th><th>CPU request</th>\
         <th>Memory request</th><th>OOM kills</th><th>Evictions</th><th>Why</th></tr>",
    );
    for w in &run.workloads {
        let hurt = w.oom_kills > 0 || w.evictions > 0;
        let _ = write!(
            out,
            "<tr{}><td>{}</td><td>{}</td><td>{} &rarr; {}</td><td>{} &rarr; {}</td>\
             <td>{}</td><td>{}</td><td>{}</td></tr>",
            if hurt {
                " style=\"background:#fff3e0\""
            } else {
                ""
            },
            escape(&w.workload),
            escape(&w.kind),
            escape(&display_cores(w.cpu.0)),
            escape(&display_cores(w.cpu.1)),
            escape(&display_bytes(w.memory.0)),
            escape(&display_bytes(w.memory.1)),
            w.oom_kills,
            w.evictions,
            if w.reasons.is_empty() && (w.cpu.0 != w.cpu.1 || w.memory.0 != w.memory.1) {
                "sized from its usage history; no bound, step limit or OOM bump applied".to_string()
            } else {
                escape(&w.reasons.join("; "))
            }
        );
    }
    out.push_str("</table>");
    out
}

/// Runs `tailor demo`.
pub fn run(args: DemoArgs, out: &mut dyn Write) -> Result<()> {
    if args.days == 0 || args.days > 60 {
        return Err(CliError::InvalidFlag {
            flag: "--days",
            reason: format!("{} is outside 1..=60", args.days),
        });
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let scenario = Scenario::mid_size(args.seed, args.days);
    let options = CatalogOptions::for_region(&scenario.region);
    let types = Catalog::builtin()?.instance_types(&options)?;
    let metrics = crate::telemetry::Metrics::new(&opentelemetry::global::meter("tailor-demo"));
    super::run::record_catalog(&metrics, &types);
    let ready = crate::server::Readiness::default();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // Bound before the run: an address in use is reported now, not after a week of
    // simulation.
    let listener = match args.serve {
        Some(addr) => Some(
            runtime
                .block_on(tokio::net::TcpListener::bind(addr))
                .map_err(|e| CliError::InvalidFlag {
                    flag: "--serve",
                    reason: format!("cannot listen on {addr}: {e}"),
                })?,
        ),
        None => None,
    };
    // /metrics is up from the start, so Prometheus can watch the autonomous run live.
    let server = listener.map(|listener| {
        if let Ok(bound) = listener.local_addr() {
            eprintln!("serving /metrics on http://{bound}/metrics");
        }
        let (metrics, ready) = (metrics.clone(), ready.clone());
        runtime.spawn(crate::server::serve_on(
            listener,
            metrics,
            ready,
            async move {
                let _ = stopped.await;
            },
        ))
    });
    ready.set(true);
    // Each run has a runtime of its own with a virtual clock, on a thread of its own: the
    // three are independent (each its own cluster, cloud and agent), so they share the
    // machine's cores. The metrics server goes on serving from this runtime meanwhile.
    let settings = [
        RunSettings::for_mode(Mode::RecommendOnly),
        RunSettings::consolidation_only(),
        RunSettings::for_mode(Mode::Autonomous),
    ];
    let progress = Progress::new(settings.len(), args.days);
    let mut runs: Vec<RunResult> = std::thread::scope(|scope| {
        let handles: Vec<_> = settings
            .iter()
            .enumerate()
            .map(|(i, settings)| {
                let (scenario, types, progress) = (&scenario, types.clone(), &progress);
                // /metrics shows the autonomous run.
                let recorded = (settings.name() == "autonomous").then_some(&metrics);
                scope.spawn(move || {
                    world::run(scenario, settings, types, recorded, &mut |share| {
                        progress.report(i, share)
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .zip(&settings)
            .map(|(h, settings)| h.join().unwrap_or_else(|_| empty_run(settings.name())))
            .collect()
    });
    let autonomous = runs.pop().unwrap_or_else(|| empty_run("autonomous"));
    let consolidation_only = runs
        .pop()
        .unwrap_or_else(|| empty_run("consolidation-only"));
    let recommend_only = runs.pop().unwrap_or_else(|| empty_run("recommend-only"));
    let report = DemoReport {
        scenario: scenario.name.clone(),
        workloads: scenario.workloads.len(),
        recommend_only,
        consolidation_only,
        autonomous,
    };
    std::fs::write(&args.report, html(&report))
        .map_err(|e| CliError::Input(format!("writing report {}: {e}", args.report.display())))?;
    eprintln!("report written to {}", args.report.display());
    let text =
        crate::report::render(args.output.output, &report, table).map_err(CliError::Encode)?;
    out.write_all(text.as_bytes())?;
    out.flush()?;
    if let Some(server) = server {
        if server.is_finished() {
            // It could not bind (or stopped): say why instead of waiting for nothing.
            return match runtime.block_on(server) {
                Ok(Err(e)) => Err(e.into()),
                Err(e) => Err(CliError::Input(format!("metrics server: {e}"))),
                Ok(Ok(())) => Ok(()),
            };
        }
        eprintln!("the run is over; /metrics stays up until interrupted (Ctrl-C)");
        runtime.block_on(async {
            let _ = tokio::signal::ctrl_c().await;
        });
        let _ = stop.send(());
        match runtime.block_on(server) {
            Ok(Err(e)) => return Err(e.into()),
            Err(e) => return Err(CliError::Input(format!("metrics server: {e}"))),
            Ok(Ok(())) => {}
        }
    } else {
        drop(stop);
    }
    Ok(())
}

/// The demo's progress line: the virtual day the runs have reached, the wall time so far,
/// and what is left at the pace so far. Each run reports its share done; a line is
/// printed whenever the slowest run passes another tenth.
struct Progress {
    shares: std::sync::Mutex<(Vec<f64>, i64)>,
    days: u32,
    started: std::time::Instant,
}

impl Progress {
    fn new(runs: usize, days: u32) -> Self {
        Progress {
            shares: std::sync::Mutex::new((vec![0.0; runs], -1)),
            days,
            started: std::time::Instant::now(),
        }
    }

    fn report(&self, run: usize, share: f64) {
        let mut guard = self
            .shares
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (shares, shown) = &mut *guard;
        if let Some(s) = shares.get_mut(run) {
            *s = share.clamp(0.0, 1.0);
        }
        let slowest = shares.iter().copied().fold(1.0, f64::min);
        let tenth = (slowest * 10.0).floor() as i64;
        if tenth == *shown {
            return;
        }
        *shown = tenth;
        let elapsed = self.started.elapsed().as_secs_f64();
        eprintln!("{}", progress_line(slowest, self.days, elapsed));
    }
}

/// One progress line: `share` of `days` virtual days done after `elapsed` wall seconds.
fn progress_line(share: f64, days: u32, elapsed: f64) -> String {
    let left = if share > 0.0 {
        format!("about {:.0} s left", elapsed * (1.0 - share) / share)
    } else {
        "estimating what is left".to_string()
    };
    format!(
        "virtual day {:.1} of {days} ({:.0}%): {:.0} s so far, {left}",
        share * f64::from(days),
        share * 100.0,
        elapsed
    )
}

fn empty_run(mode: &str) -> RunResult {
    RunResult {
        mode: mode.to_string(),
        samples: Vec::new(),
        workloads: Vec::new(),
        summary: Default::default(),
        create_calls: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_progress_line_shows_the_virtual_day_the_wall_time_and_what_is_left() {
        for (share, days, elapsed, line) in [
            (
                0.5,
                7,
                20.0,
                "virtual day 3.5 of 7 (50%): 20 s so far, about 20 s left",
            ),
            (
                0.25,
                2,
                30.0,
                "virtual day 0.5 of 2 (25%): 30 s so far, about 90 s left",
            ),
            (
                0.0,
                7,
                0.2,
                "virtual day 0.0 of 7 (0%): 0 s so far, estimating what is left",
            ),
            (
                1.0,
                7,
                42.0,
                "virtual day 7.0 of 7 (100%): 42 s so far, about 0 s left",
            ),
        ] {
            assert_eq!(progress_line(share, days, elapsed), line);
        }
    }

    #[test]
    fn progress_follows_the_slowest_run_a_tenth_at_a_time() {
        let p = Progress::new(3, 7);
        p.report(0, 0.55);
        p.report(1, 0.31);
        // The slowest run is still at 0: nothing past the first line.
        assert_eq!(p.shares.lock().expect("lock").1, 0);
        p.report(2, 0.35);
        assert_eq!(p.shares.lock().expect("lock").1, 3);
        p.report(1, 1.0);
        p.report(2, 1.0);
        assert_eq!(p.shares.lock().expect("lock").1, 5);
    }

    fn run(mode: &str, used: &[f64]) -> RunResult {
        RunResult {
            mode: mode.to_string(),
            samples: used
                .iter()
                .enumerate()
                .map(|(i, u)| world::Sample {
                    t: 1_796_083_200 + 3600 * i as i64,
                    hourly_cost: 10.0,
                    cpu_requested: 20.0,
                    cpu_used: *u,
                    memory_requested: 40.0,
                    memory_used: *u,
                    ..Default::default()
                })
                .collect(),
            workloads: Vec::new(),
            summary: Default::default(),
            create_calls: Vec::new(),
        }
    }

    #[test]
    fn the_report_labels_time_in_utc_and_starts_usage_when_pods_first_run() {
        let report = DemoReport {
            scenario: "test".to_string(),
            workloads: 1,
            recommend_only: run("recommend-only", &[0.0, 0.0, 5.0, 6.0]),
            consolidation_only: run("consolidation-only", &[0.0, 0.0, 5.0, 6.0]),
            autonomous: run("autonomous", &[0.0, 0.0, 5.0, 6.0]),
        };
        let page = html(&report);
        assert!(page.contains("12-01 00:00 UTC"), "axes say their time zone");
        // The green "used" line has two points (hours 2 and 3), not four from zero.
        let mut used_lines = 0;
        for path in page.split("<path d=\"").skip(1) {
            let (d, rest) = path.split_once('"').expect("path");
            if rest.starts_with(" fill=\"none\" stroke=\"#2ca02c\"") {
                used_lines += 1;
                assert_eq!(d.matches(" L").count(), 1, "{d}");
            }
        }
        assert_eq!(used_lines, 2, "CPU and memory each draw their usage");
    }
}
