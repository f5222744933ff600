//! `tailor simulate`: what Tailor would do with a cluster snapshot's pending pods — where
//! they land, which nodes it would buy, and what that costs.

use std::io::Write;

use clap::Args;

use super::{CatalogSourceArgs, CliError, OutputArgs, Result, SnapshotArgs};
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

    /// Output format.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Loads the snapshot and catalog and plans.
pub fn plan(args: &SimulateArgs) -> Result<(Plan, Vec<String>)> {
    let snapshot =
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
        catalog.instance_types(&o).map_err(|e| e.to_string())
    };
    let input =
        Input::from_snapshot(&snapshot, &types_for).map_err(|e| CliError::Input(e.to_string()))?;
    let plan = scheduling::schedule(
        &input,
        &Options {
            cost_aware: !args.greedy,
            ..Options::default()
        },
    );
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
    let (plan, warnings) = plan(&args)?;
    for w in &warnings {
        tracing::warn!("{w}");
    }
    let text = crate::report::render(args.output.output, &plan, table).map_err(CliError::Encode)?;
    out.write_all(text.as_bytes())?;
    Ok(())
}
