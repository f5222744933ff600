//! The simulated cluster records what it does in the same metrics the agent serves: every
//! VM the cloud created, for pending pods or as a disruption replacement, is a counted
//! launch, and the node, OOM, eviction and right-sizing metrics agree with the run's own summary.

use tailor::catalog::{Catalog, CatalogOptions};
use tailor::provisioning::Mode;
use tailor::sim::scenario::Scenario;
use tailor::sim::world::{self, RunSettings};
use tailor::telemetry::Metrics;

/// The sum of every series in the exposition starting with `prefix` (a family name, or a
/// name and the start of its labels).
fn total(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(prefix)
                .is_some_and(|rest| prefix.contains('{') || rest.starts_with(['{', ' ']))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[test]
fn every_launch_the_cloud_saw_is_counted_replacements_included() {
    let scenario = Scenario::mid_size(7, 2);
    let types = Catalog::builtin()
        .expect("catalog")
        .instance_types(&CatalogOptions::for_region(&scenario.region))
        .expect("types");
    let metrics = Metrics::new(&opentelemetry::global::meter("tailor-test"));
    let run = world::run(
        &scenario,
        &RunSettings::for_mode(Mode::Autonomous),
        types,
        Some(&metrics),
        &mut |_| {},
    );
    let text = metrics.render();
    let launched = total(&text, "tailor_nodeclaims_launched_total");
    let creates = total(&text, "tailor_cloud_requests_total{operation=\"create\"}");
    let failed = total(&text, "tailor_cloud_errors_total{operation=\"create\"");
    assert!(
        run.summary.decisions > 0,
        "the run disrupted nothing: {:?}",
        run.summary
    );
    // The counter counts the bring-up of the running cluster the week starts with too.
    assert!(run.summary.launches > 0 && run.summary.launches_before_start > 0);
    assert_eq!(
        launched as u64,
        run.summary.launches + run.summary.launches_before_start,
        "launch counter vs VMs the cloud created"
    );
    assert_eq!(
        creates - failed,
        launched,
        "every successful create is a launch"
    );
    // The node count is what the run's last sample says.
    let last = run.samples.last().expect("samples");
    assert!(total(&text, "tailor_node_hourly_cost_dollars") > 0.0);
    let nodes = total(&text, "tailor_nodes");
    assert_eq!(nodes as usize, last.nodes_by_type.values().sum::<usize>());
    assert_eq!(
        total(&text, "tailor_oom_kills_total") as u64,
        run.summary.oom_kills
    );
    assert_eq!(
        total(&text, "tailor_evictions_total") as usize,
        run.summary.pods_evicted
    );
    assert_eq!(
        total(&text, "tailor_recommendations_applied_total") as usize,
        run.summary.recommendations
    );
}
