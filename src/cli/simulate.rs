//! `tailor simulate`: what Tailor would do with a cluster snapshot's pending pods — where
//! they land, which nodes it would buy, and what that costs.

use std::io::Write;

use clap::Args;

use super::{CatalogSourceArgs, CliError, OutputArgs, Result, SnapshotArgs};
use crate::disruption;
use crate::model::quantity::{display_bytes, display_cores, parse_milli, parse_value};
use crate::report::Table;
use crate::scheduling::{self, Input, Options, Plan};
use crate::state::Snapshot;

/// Arguments of `tailor simulate`.
#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// The cluster snapshot.
    #[command(flatten)]
    pub snapshot: SnapshotArgs,

    /// Where sizes and prices come from.
    #[command(flatten)]
    pub source: CatalogSourceArgs,

    /// Pack like Karpenter (grow each node while anything fits) instead of Tailor's
    /// cost-aware packing; for comparison.
    #[arg(long, env = "TAILOR_GREEDY")]
    pub greedy: bool,

    /// Evaluate the existing nodes for disruption (expiration, empty, drift, multi- and
    /// single-node consolidation) and print the decisions that would be taken now, with
    /// their savings and the pods they move. Changes nothing.
    #[arg(long, env = "TAILOR_DISRUPTION")]
    pub disruption: bool,

    /// Evaluation time for `--disruption` (RFC 3339); default: now.
    #[arg(long, env = "TAILOR_NOW")]
    pub now: Option<String>,

    /// A consolidation must save at least this share of the replaced nodes' price.
    #[arg(long, env = "TAILOR_MIN_SAVINGS_FRACTION", default_value_t = 0.05)]
    pub min_savings_fraction: f64,

    /// ... and at least this many USD per hour.
    #[arg(long, env = "TAILOR_MIN_SAVINGS_PER_HOUR", default_value_t = 0.01)]
    pub min_savings_per_hour: f64,

    /// ... plus this many USD per hour for every pod it evicts.
    #[arg(long, env = "TAILOR_MIN_SAVINGS_PER_EVICTION", default_value_t = crate::disruption::DEFAULT_MIN_SAVINGS_PER_EVICTION)]
    pub min_savings_per_eviction: f64,

    /// Allow replacing a spot node by a cheaper spot node (when enough cheaper spot sizes
    /// fit, see `--spot-to-spot-min-alternatives`).
    #[arg(long, env = "TAILOR_SPOT_TO_SPOT")]
    pub spot_to_spot: bool,

    /// Cheaper spot sizes that must fit before a spot node is replaced by spot.
    #[arg(
        long,
        env = "TAILOR_SPOT_TO_SPOT_MIN_ALTERNATIVES",
        default_value_t = 15
    )]
    pub spot_to_spot_min_alternatives: usize,

    /// Output format.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Loads the snapshot and catalog and evaluates the existing nodes for disruption.
pub fn disruption(args: &SimulateArgs) -> Result<(disruption::Report, Vec<String>)> {
    let now = super::now_flag(args.now.as_deref())?;
    if !(0.0..1.0).contains(&args.min_savings_fraction) {
        return Err(CliError::InvalidFlag {
            flag: "--min-savings-fraction",
            reason: format!("{} is outside 0..1", args.min_savings_fraction),
        });
    }
    if !args.min_savings_per_hour.is_finite() || args.min_savings_per_hour < 0.0 {
        return Err(CliError::InvalidFlag {
            flag: "--min-savings-per-hour",
            reason: format!("{} is not a non-negative number", args.min_savings_per_hour),
        });
    }
    if !args.min_savings_per_eviction.is_finite() || args.min_savings_per_eviction < 0.0 {
        return Err(CliError::InvalidFlag {
            flag: "--min-savings-per-eviction",
            reason: format!(
                "{} is not a non-negative number",
                args.min_savings_per_eviction
            ),
        });
    }
    let snapshot =
        Snapshot::load(&args.snapshot.paths).map_err(|e| CliError::Input(e.to_string()))?;
    let (catalog, options) = args.source.clone().load()?;
    catalog.instance_types(&options)?;
    let types_for = |settings: &crate::model::NodeSettings| {
        let mut o = options.clone();
        o.node = crate::model::NodeSettings {
            overhead_model: settings.overhead_model,
            max_pods: settings.max_pods,
            os_disk_gib: settings.os_disk_gib,
            ..o.node
        };
        catalog
            .planning_types(&o, &Default::default())
            .map_err(|e| e.to_string())
    };
    let cluster = disruption::Cluster::from_snapshot(&snapshot, &types_for, now)
        .map_err(|e| CliError::Input(e.to_string()))?;
    let settings = disruption::Settings {
        min_savings_fraction: args.min_savings_fraction,
        min_savings_per_hour: args.min_savings_per_hour,
        min_savings_per_eviction: args.min_savings_per_eviction,
        spot_to_spot: args.spot_to_spot,
        spot_to_spot_min_alternatives: args.spot_to_spot_min_alternatives,
        ..disruption::Settings::default()
    };
    Ok((disruption::evaluate(&cluster, &settings), snapshot.warnings))
}

/// Renders disruption decisions for a terminal.
pub fn disruption_table(report: &disruption::Report) -> String {
    let mut out = String::new();
    if !report.decisions.is_empty() {
        let mut t = Table::new([
            "METHOD",
            "NODES",
            "REPLACEMENTS",
            "SAVES $/HOUR",
            "PODS MOVED",
            "REASON",
        ])
        .align_right(&[3, 4]);
        for d in &report.decisions {
            let method = serde_json::to_value(d.method)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            t.row([
                method,
                d.nodes.join(","),
                d.replacements
                    .iter()
                    .map(|r| {
                        format!(
                            "{} {} {} ${:.4}",
                            r.instance_type, r.zone, r.capacity_type, r.price_per_hour
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
                format!("{:.4}", d.savings_per_hour),
                d.pods_moved.len().to_string(),
                d.reason.clone(),
            ]);
        }
        out.push_str(&t.render());
        out.push('\n');
    }
    if !report.blocked.is_empty() {
        let mut t = Table::new(["LEFT ALONE", "WHY"]);
        for b in &report.blocked {
            t.row([b.node.clone(), b.reason.clone()]);
        }
        out.push_str(&t.render());
        out.push('\n');
    }
    let s = &report.summary;
    out.push_str(&format!(
        "{} decision(s): {} -> {} nodes, ${:.4} -> ${:.4}/hour (${:.2}/month saved), {} pod(s) evicted.\n",
        report.decisions.len(),
        s.nodes_before,
        s.nodes_after,
        s.hourly_cost_before,
        s.hourly_cost_after,
        (s.hourly_cost_before - s.hourly_cost_after) * 730.0,
        s.evictions
    ));
    out
}

/// Loads the snapshot and catalog and plans.
pub fn plan(args: &SimulateArgs) -> Result<(Plan, Vec<String>)> {
    let mut snapshot =
        Snapshot::load(&args.snapshot.paths).map_err(|e| CliError::Input(e.to_string()))?;
    let (catalog, options) = args.source.clone().load()?;
    // Fail early on a bad region or discount, with the catalog's own message.
    catalog.instance_types(&options)?;
    let types_for = |settings: &crate::model::NodeSettings| {
        let mut o = options.clone();
        o.node = crate::model::NodeSettings {
            overhead_model: settings.overhead_model,
            max_pods: settings.max_pods,
            os_disk_gib: settings.os_disk_gib,
            ..o.node
        };
        catalog
            .planning_types(&o, &Default::default())
            .map_err(|e| e.to_string())
    };
    // The scheduler needs only its input: the snapshot's pods (most of a large cluster's
    // memory) are freed as they are read into it, and the input is freed on another core
    // after the plan (100,000 pods took a quarter of a second to free).
    let input = Input::from_snapshot_taking_pods(&mut snapshot, &types_for)
        .map_err(|e| CliError::Input(e.to_string()))?;
    let plan = scheduling::schedule(
        &input,
        &Options {
            cost_aware: !args.greedy,
            ..Options::default()
        },
    );
    std::thread::spawn(move || drop(input));
    Ok((plan, snapshot.warnings))
}

fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

fn cores(q: &str) -> String {
    parse_milli(q).map_or_else(|_| q.to_string(), display_cores)
}

fn bytes(q: &str) -> String {
    parse_value(q).map_or_else(|_| q.to_string(), display_bytes)
}

/// Renders a plan for a terminal.
pub fn table(plan: &Plan) -> String {
    let mut out = String::new();
    if !plan.node_claims.is_empty() {
        let mut t = Table::new([
            "NODECLAIM",
            "NODEPOOL",
            "INSTANCE TYPE",
            "ZONE",
            "CAPACITY",
            "$/HOUR",
            "PODS",
            "CPU REQ/ALLOC",
            "MEMORY REQ/ALLOC",
            "CPU%",
            "MEM%",
        ])
        .align_right(&[5, 6, 7, 8, 9, 10]);
        for c in &plan.node_claims {
            let price = if c.price_is_estimate {
                format!("{:.4}*", c.price_per_hour)
            } else {
                format!("{:.4}", c.price_per_hour)
            };
            t.row([
                c.name.clone(),
                c.node_pool.clone(),
                c.instance_type.clone(),
                c.zone.clone(),
                c.capacity_type.to_string(),
                price,
                c.pods.len().to_string(),
                format!("{}/{}", cores(&c.requests.cpu), cores(&c.allocatable.cpu)),
                format!(
                    "{}/{}",
                    bytes(&c.requests.memory),
                    bytes(&c.allocatable.memory)
                ),
                pct(c.cpu_utilisation),
                pct(c.memory_utilisation),
            ]);
        }
        out.push_str(&t.render());
        if plan.node_claims.iter().any(|c| c.price_is_estimate) {
            out.push_str("* spot price estimated from the on-demand price\n");
        }
        out.push('\n');
    }
    if !plan.existing_nodes.is_empty() {
        let mut t = Table::new(["EXISTING NODE", "NEW PODS"]).align_right(&[1]);
        for e in &plan.existing_nodes {
            t.row([e.node.clone(), e.pods.len().to_string()]);
        }
        out.push_str(&t.render());
        out.push('\n');
    }
    if !plan.unschedulable.is_empty() {
        let mut t = Table::new(["UNSCHEDULABLE POD", "REASON"]);
        for u in &plan.unschedulable {
            t.row([u.pod.clone(), u.reason.clone()]);
        }
        out.push_str(&t.render());
        out.push('\n');
    }
    let s = &plan.summary;
    out.push_str(&format!(
        "{} pending pods: {} on existing nodes, {} on {} new nodes (${:.4}/hour, ${:.2}/month), {} unschedulable.\n",
        s.pods,
        s.scheduled_on_existing,
        s.scheduled_on_new,
        s.new_nodes,
        s.hourly_cost,
        s.hourly_cost * 730.0,
        s.unschedulable
    ));
    out
}

/// Runs `tailor simulate`.
pub fn run(args: SimulateArgs, out: &mut dyn Write) -> Result<()> {
    if args.disruption {
        let (report, warnings) = disruption(&args)?;
        for w in &warnings {
            tracing::warn!("{w}");
        }
        let text = crate::report::render(args.output.output, &report, disruption_table)
            .map_err(CliError::Encode)?;
        out.write_all(text.as_bytes())?;
        return Ok(());
    }
    let (plan, warnings) = plan(&args)?;
    for w in &warnings {
        tracing::warn!("{w}");
    }
    let text = crate::report::render(args.output.output, &plan, table).map_err(CliError::Encode)?;
    out.write_all(text.as_bytes())?;
    Ok(())
}
