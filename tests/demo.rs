//! The embedded demo, shortened: the simulated cluster runs recommend-only,
//! consolidation-only and autonomous; autonomous must cost less than both with every pod
//! running (a saving made by leaving pods pending is no saving), within fixed bounds on
//! OOM kills, evictions and launches, and the HTML report must hold its charts.

#[path = "support/bin.rs"]
mod bin;

use bin::tailor;

#[test]
fn autonomous_costs_less_with_its_pods_running_and_the_report_has_its_charts() {
    let (stdout, stderr, html) = bin::two_day_demo();
    assert!(
        stderr.contains("virtual day 1.0 of 2 (50%): ")
            && stderr.contains("virtual day 2.0 of 2 (100%): ")
            && stderr.contains(" s left"),
        "progress is shown: {stderr}"
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON summary");
    let ro = &v["recommendOnly"]["summary"];
    let co = &v["consolidationOnly"]["summary"];
    let au = &v["autonomous"]["summary"];
    let f = |x: &serde_json::Value| x.as_f64().expect("a number");
    // Cheaper counts only with the pods running: pods left pending cost nothing. None is
    // pending at the end, and over the run they waited at most 20 pod-hours: about 300
    // pods for 48 hours are 14,400 pod-hours, so 20 is 0.14% of them, which cannot
    // explain a spend lower by a third (against recommend-only) or by a sixth (against
    // consolidation-only).
    for (name, run) in [
        ("recommendOnly", &v["recommendOnly"]),
        ("consolidationOnly", &v["consolidationOnly"]),
        ("autonomous", &v["autonomous"]),
    ] {
        let pending = f(&run["summary"]["pendingPodHours"]);
        assert!(pending <= 20.0, "{name}: {pending} pending pod-hours");
        let last = run["samples"]
            .as_array()
            .and_then(|s| s.last())
            .expect("samples");
        assert_eq!(f(&last["pending"]), 0.0, "{name}: pods pending at the end");
    }
    // Once right-sizing has its history, the saving is a third or more: on the second day
    // autonomous spends at most two thirds of what consolidation-only spends (on this seed
    // 160 USD against 363, 0.44x; a build whose autonomous run right-sizes nothing spends
    // 545 against 363).
    let day = |run: &str, d: usize| -> f64 {
        let samples = v[run]["samples"].as_array().expect("samples");
        assert_eq!(samples.len(), 48, "{run}: one sample an hour");
        samples[d * 24..(d + 1) * 24]
            .iter()
            .map(|s| f(&s["hourlyCost"]))
            .sum()
    };
    let (au2, co2) = (day("autonomous", 1), day("consolidationOnly", 1));
    assert!(
        au2 <= co2 * 2.0 / 3.0,
        "on the second day autonomous spends {au2:.0} USD against consolidation-only's {co2:.0}"
    );
    // Autonomous spends a third less than recommend-only, which changes nothing (on this
    // seed, 596 USD against 1,070 over the two days).
    assert!(
        f(&au["totalCost"]) <= f(&ro["totalCost"]) * 2.0 / 3.0,
        "autonomous spends a third less than recommend-only: {v}"
    );
    // ... and a sixth less than consolidation-only, though its first day costs more:
    // right-sizing starts after 12 hours of history, and until a day of the cycle is known
    // the capacity needed over the last hours is kept. On this seed 596 USD against 727
    // (a saving of 18%); over the week, the bench's target is 0.6 of consolidation-only
    // (`cargo bench --bench demo`).
    assert!(
        f(&au["totalCost"]) <= f(&co["totalCost"]) * 5.0 / 6.0,
        "autonomous spends a sixth less than consolidation-only over two days: {v}"
    );
    assert_eq!(
        v["consolidationOnly"]["mode"].as_str(),
        Some("consolidation-only")
    );
    // Every workload's per-pod requests end as they started (the totals differ with the
    // pods that happen to run at the end: jobs, replicas).
    let workloads = v["consolidationOnly"]["workloads"]
        .as_array()
        .expect("consolidation-only workloads");
    assert!(!workloads.is_empty());
    for w in workloads {
        assert_eq!(
            w["cpu"][0], w["cpu"][1],
            "consolidation-only keeps the CPU requests as deployed: {w}"
        );
        assert_eq!(
            w["memory"][0], w["memory"][1],
            "consolidation-only keeps the memory requests as deployed: {w}"
        );
    }
    let autonomous = v["autonomous"]["workloads"]
        .as_array()
        .expect("autonomous workloads");
    assert!(
        autonomous.iter().any(|w| w["cpu"][0] != w["cpu"][1]),
        "autonomous right-sizes some workload"
    );
    assert!(f(&co["decisions"]) > 0.0, "consolidation-only consolidates");
    assert!(f(&au["hourlyCostEnd"]) < f(&ro["hourlyCostEnd"]));
    assert!(
        f(&au["cpuRequestedEnd"]) < f(&ro["cpuRequestedEnd"]),
        "right-sizing applied"
    );
    assert!(f(&au["recommendations"]) > 0.0 && f(&au["decisions"]) > 0.0);
    // Realised consolidation savings add up. A run's consolidation never realises more
    // than recommend-only spent in all, and nothing is realised where nothing was carried
    // out. (Consolidation-only may realise more than its difference from recommend-only:
    // it packs greedily, so what it would have spent without consolidation is more than
    // recommend-only's cost-aware cluster spends. Autonomous also right-sizes, which may
    // raise requests.)
    for (name, run) in [("consolidationOnly", co), ("autonomous", au)] {
        let realised = f(&run["consolidationRealisedSavings"]);
        assert!(realised > 0.0, "{name}: {run}");
        assert!(
            realised < f(&ro["totalCost"]),
            "{name} realised {realised} vs recommend-only's spend {}",
            f(&ro["totalCost"])
        );
    }
    assert_eq!(f(&ro["consolidationRealisedSavings"]), 0.0);
    assert_eq!(
        f(&ro["podsEvicted"]),
        0.0,
        "recommend-only disrupts nothing"
    );
    // Fixed bounds: the week's targets (at most 4 OOM kills, 350 evictions, 60 launches
    // after the bring-up) at the same rate over this run's two days, in whole events. Not
    // figures the program reports about itself.
    let days = 2.0;
    let at_week_rate = |week: f64| (week * days / 7.0).ceil();
    assert!(
        f(&au["oomKills"]) <= at_week_rate(4.0),
        "OOM kills {} (recommend-only {})",
        au["oomKills"],
        ro["oomKills"]
    );
    assert!(f(&au["podsEvicted"]) <= at_week_rate(350.0), "{au}");
    // Launches too (on this seed 16 in the two days, 31 over the week).
    assert!(f(&au["launches"]) <= at_week_rate(60.0), "{au}");
    assert_eq!(
        v["recommendOnly"]["samples"].as_array().map(Vec::len),
        Some(48)
    );

    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(!html.contains("<script"), "self-contained");
    for chart in [
        "Cost ($/hour)",
        "Nodes by type",
        "CPU (cores): requested vs used",
        "Memory (GiB): requested vs used",
        "Recommendations applied",
        "Pending pods and OOM kills",
        "Pods evicted",
        "consolidation-only",
    ] {
        assert!(html.contains(chart), "chart {chart:?} missing");
    }
    assert_eq!(html.matches("<svg").count(), 7);
    // Per workload: requests before and after, why, and OOM kills and evictions.
    assert!(
        html.contains("<h2>Workloads (autonomous)</h2>"),
        "per-workload table"
    );
    let workloads = v["autonomous"]["workloads"].as_array().expect("workloads");
    assert_eq!(workloads.len(), f(&v["workloads"]) as usize);
    let kills: f64 = workloads.iter().map(|w| f(&w["oomKills"])).sum();
    assert_eq!(kills, f(&au["oomKills"]), "per-workload OOM kills add up");
    let evictions: f64 = workloads.iter().map(|w| f(&w["evictions"])).sum();
    assert_eq!(
        evictions,
        f(&au["podsEvicted"]),
        "per-workload evictions add up"
    );
    for w in workloads {
        let name = w["workload"].as_str().expect("name");
        assert!(
            html.contains(&format!("<td>{name}</td>")),
            "{name} in the table"
        );
    }
}

#[test]
fn a_bad_demo_flag_is_refused_naming_it() {
    let (ok, stdout, stderr) = tailor(&["demo", "--days", "0"]);
    assert!(!ok);
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("--days") && stderr.contains('0'),
        "{stderr}"
    );
}

/// Provisioning buys ahead of the daily ramp. The mid-size scenario's Deployments alone,
/// at their requests as deployed (right-sizing off, so the requests keep the cycle's
/// level), over four days: consolidation removes in the evening what the next morning
/// needs, and with the headroom lead the morning's new replicas find their nodes already
/// there. Only the lead differs between the two runs.
#[test]
fn headroom_buys_the_morning_ramp_before_its_pods_arrive() {
    use tailor::provisioning::Mode;
    use tailor::sim::scenario::{Kind, Scenario};
    use tailor::sim::world::RunSettings;

    let mut scenario = Scenario::mid_size(1, 4);
    scenario
        .workloads
        .retain(|w| matches!(w.kind, Kind::Deployment | Kind::DaemonSet));
    let mut without = RunSettings::for_mode(Mode::Autonomous);
    without.rightsizing = false;
    without.headroom_lead = 0;
    let with = RunSettings {
        headroom_lead: tailor::provisioning::headroom::DEFAULT_LEAD,
        ..without.clone()
    };
    let run_with = |settings: &RunSettings| {
        let r = simulate(&scenario, settings);
        let by_cause = &r.summary.pending_pod_hours_by_cause;
        // The causes add up to the whole.
        let sum: f64 = by_cause.values().sum();
        assert!(
            (sum - r.summary.pending_pod_hours).abs() < 1e-9,
            "{by_cause:?}"
        );
        (by_cause.get("scale-up").copied().unwrap_or(0.0), r.summary)
    };
    let ((before, a), (after, b)) = (run_with(&without), run_with(&with));
    eprintln!("scale-up pending pod-hours: {before:.2} without headroom, {after:.2} with");
    eprintln!("launches: {} without, {} with", a.launches, b.launches);
    // Without the lead every morning's replicas wait for nodes.
    assert!(
        before > 0.5,
        "scale-up pending pod-hours without headroom: {before}"
    );
    assert!(
        after < before * 0.6,
        "scale-up pending pod-hours: {after} with headroom, {before} without"
    );
    // Bought at once for the horizon's growth, not a node more every hour of the ramp.
    assert!(
        b.launches <= a.launches,
        "launches: {} with headroom, {} without",
        b.launches,
        a.launches
    );
}

/// The demo runs the agent's provisioning controller on the one virtual clock: a pod that
/// fits a node is bound at once (the simulated kube-scheduler), and one that needs a new
/// node is planned when its batch closes (the idle window after the scheduler gave up on
/// it) and runs when its VM is up and the agent has registered and initialized the node:
/// exactly that, not rounded up to a step of the simulation.
#[test]
fn pending_pods_are_planned_when_their_batch_closes() {
    use tailor::cloud::sim::SimSettings;
    use tailor::provisioning::{DEFAULT_IDLE_WINDOW, Mode};
    use tailor::sim::scenario::Scenario;
    use tailor::sim::world::RunSettings;

    let mut settings = RunSettings::for_mode(Mode::Autonomous);
    settings.rightsizing = false;
    let r = simulate(&Scenario::mid_size(3, 1), &settings);
    let s = &r.summary;
    let idle = DEFAULT_IDLE_WINDOW.as_secs_f64();
    let boot = SimSettings::default().launch_latency.as_secs_f64();
    eprintln!(
        "provisioning p50 {} s, p99 {} s, {} launches",
        s.provisioning_p50_seconds, s.provisioning_p99_seconds, s.launches
    );
    assert!(s.launches > 0, "nothing was launched: {s:?}");
    // Most pods land on nodes with room, at once.
    assert_eq!(s.provisioning_p50_seconds, 0.0, "{s:?}");
    // The slowest waited for their batch, then for a VM to boot (nothing ran short of
    // capacity on this day).
    assert_eq!(s.provisioning_p99_seconds, idle + boot, "{s:?}");
}

/// One run of the simulated cluster with the built-in catalog, without metrics.
fn simulate(
    scenario: &tailor::sim::scenario::Scenario,
    settings: &tailor::sim::world::RunSettings,
) -> tailor::sim::world::RunResult {
    use tailor::catalog::{Catalog, CatalogOptions};
    let types = Catalog::builtin()
        .and_then(|c| c.instance_types(&CatalogOptions::for_region(&scenario.region)))
        .expect("the built-in catalog");
    tailor::sim::world::run(scenario, settings, types, None, &mut |_| {})
}
