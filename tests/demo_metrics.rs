//! The simulated cluster records what it does in the same metrics the agent serves: every
//! VM the cloud created, for pending pods or as a disruption replacement, is a counted
//! launch, and the node, OOM, eviction and right-sizing metrics agree with the run's own summary.
//! The simulated cloud's record of the calls it received is the oracle for the cloud
//! metrics.

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
    // The cloud's own record of the calls it received, against the metered counters.
    let calls = &run.create_calls;
    assert_eq!(creates as usize, calls.len(), "create calls counted");
    assert_eq!(
        failed as usize,
        calls.iter().filter(|c| c.outcome.is_err()).count(),
        "failed creates counted"
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
    // Every eviction a drain made (disruption, spot reclaims, the DaemonSet pods of the
    // drained nodes), and every right-sizing eviction, as the cluster served them.
    let by_cause = &run.summary.evictions_by_cause;
    let cause = |c: &str| by_cause.get(c).copied().unwrap_or(0);
    assert!(cause("disruption") > 0, "{by_cause:?}");
    assert_eq!(
        total(&text, "tailor_evictions_total") as usize,
        cause("disruption") + cause("spot-reclaim") + cause("daemonset"),
        "{by_cause:?}"
    );
    assert_eq!(
        total(&text, "tailor_rightsizing_evictions_total") as usize,
        cause("rightsizing"),
        "{by_cause:?}"
    );
    assert_eq!(
        run.summary.pods_evicted,
        cause("disruption") + cause("rightsizing")
    );
    // Every in-place resize the cluster made was counted as applied (a resize the kubelet
    // deferred is counted when it is asked for).
    let applied = total(&text, "tailor_recommendations_applied_total") as usize;
    assert!(
        run.summary.resized_in_place > 0 && applied >= run.summary.resized_in_place,
        "{applied} counted, {} made",
        run.summary.resized_in_place
    );
}
