//! Scenarios for the simulated cluster: workloads with usage shapes, over-requested the
//! way real teams request, and the NodePool Tailor provisions from.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::traces::{self, Shape, Trace};

/// What kind of controller a workload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Replicas scale with traffic (the diurnal and weekly shapes).
    Deployment,
    /// A fixed set of replicas with stable names.
    StatefulSet,
    /// One pod per node.
    DaemonSet,
    /// Runs `replicas` pods for an hour every six hours.
    Job,
}

impl Kind {
    /// The Kubernetes kind.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Deployment => "Deployment",
            Kind::StatefulSet => "StatefulSet",
            Kind::DaemonSet => "DaemonSet",
            Kind::Job => "Job",
        }
    }
}

/// One workload of a scenario.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Controller kind.
    pub kind: Kind,
    /// Usage per pod over the whole scenario (cores and bytes, every `step`).
    pub trace: Trace,
    /// Replicas at average load (Deployments scale around it with the day).
    pub replicas: u32,
    /// CPU request, millicores, as the team set it.
    pub cpu_request: i64,
    /// Memory request, bytes, as the team set it.
    pub memory_request: i64,
    /// Memory limit, bytes (an OOM kill when usage passes it).
    pub memory_limit: i64,
}

/// A whole scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Name, for the report.
    pub name: String,
    /// Azure region.
    pub region: String,
    /// Unix seconds of the start.
    pub start: i64,
    /// Length in days.
    pub days: u32,
    /// Simulation step, seconds.
    pub step: i64,
    /// Workloads.
    pub workloads: Vec<Workload>,
    /// Seconds after the start when a capacity outage begins and ends.
    pub capacity_outage: (i64, i64),
    /// The VM size that has no on-demand capacity in any zone during the outage.
    pub capacity_outage_type: &'static str,
}

/// Days of usage the scenario's teams sized their requests from.
const SIZING_DAYS: u32 = 7;

/// Namespaces of the default scenario, by team.
const TEAMS: &[&str] = &["shop", "payments", "search", "data", "platform"];

impl Scenario {
    /// A mid-size AKS cluster in eastus: about 40 workloads and 300 pods, over `days`
    /// days (the default demo runs a week), deterministic for `seed`.
    pub fn mid_size(seed: u64, days: u32) -> Scenario {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let step = 300;
        let start = 1_796_083_200; // 2026-12-01T00:00:00Z
        let mut workloads = Vec::new();
        // (shape, kind, count, replicas range)
        let plan: &[(Shape, Kind, u32, (u32, u32))] = &[
            (Shape::Diurnal, Kind::Deployment, 14, (6, 14)),
            (Shape::Weekly, Kind::Deployment, 5, (5, 10)),
            (Shape::Spiky, Kind::Deployment, 5, (4, 10)),
            (Shape::Idle, Kind::Deployment, 6, (2, 5)),
            (Shape::Jvm, Kind::StatefulSet, 4, (3, 6)),
            (Shape::Leak, Kind::StatefulSet, 2, (2, 4)),
            (Shape::Batch, Kind::Job, 2, (6, 12)),
            (Shape::Idle, Kind::DaemonSet, 2, (1, 1)),
        ];
        let mut n = 0u64;
        for &(shape, kind, count, (lo, hi)) in plan {
            for _ in 0..count {
                n += 1;
                let namespace = if kind == Kind::DaemonSet {
                    "kube-system".to_string()
                } else {
                    TEAMS[(n as usize) % TEAMS.len()].to_string()
                };
                let name = format!("{}-{n}", shape.name());
                let trace_seed = seed.wrapping_mul(1000) + n;
                let trace = traces::generate(shape, trace_seed, start, days, step);
                let replicas = rng.random_range(lo..=hi);
                // Teams request 2-4x what they use at the 95th percentile, and set the
                // memory limit at the request. They sized from a fixed week of usage, so
                // the starting cluster is the same for a seed whatever `--days` is (a
                // trace is the same sample by sample for any length).
                let sizing = traces::generate(shape, trace_seed, start, SIZING_DAYS, step);
                let p95 = |v: &[f64]| {
                    let mut s = v.to_vec();
                    s.sort_by(f64::total_cmp);
                    s.get(s.len() * 95 / 100).copied().unwrap_or(0.0)
                };
                let cpu = p95(&sizing.cpu);
                let peak = sizing.memory.iter().copied().fold(0.0, f64::max);
                let over: f64 = rng.random_range(2.0..4.0);
                let cpu_request = ((cpu * over * 1000.0 / 50.0).ceil() * 50.0).max(50.0) as i64;
                let mem = peak * rng.random_range(1.5..2.5);
                let memory_request = ((mem / 67_108_864.0).ceil() * 67_108_864.0) as i64;
                let (cpu_request, memory_request) = if kind == Kind::DaemonSet {
                    (100, 128 * 1_048_576)
                } else {
                    (cpu_request, memory_request)
                };
                workloads.push(Workload {
                    namespace,
                    name,
                    kind,
                    trace,
                    replicas,
                    cpu_request,
                    memory_request,
                    memory_limit: memory_request,
                });
            }
        }
        Scenario {
            name: format!("mid-size AKS cluster in eastus ({days} days)"),
            region: "eastus".to_string(),
            start,
            days,
            step,
            capacity_outage: (30 * 3600, 42 * 3600),
            capacity_outage_type: "Standard_D16as_v6",
            workloads,
        }
    }

    /// Pods the workloads want at `t` (DaemonSets excluded: they follow the nodes).
    pub fn desired(&self, w: &Workload, t: i64) -> u32 {
        match w.kind {
            Kind::DaemonSet => 0,
            Kind::StatefulSet => w.replicas,
            Kind::Job => {
                // An hour of work every six hours.
                if (t - self.start).rem_euclid(6 * 3600) < 3600 {
                    w.replicas
                } else {
                    0
                }
            }
            Kind::Deployment => {
                // Replicas follow the day: 60%..140% of the average, hourly.
                let hour = ((t - self.start) / 3600) % 24;
                let load = (std::f64::consts::TAU * hour as f64 / 24.0).sin();
                ((f64::from(w.replicas) * (1.0 + 0.4 * load)).round() as u32).max(1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_starts_the_same_cluster_for_any_number_of_days() {
        let starting = |days| {
            Scenario::mid_size(7, days)
                .workloads
                .iter()
                .map(|w| (w.name.clone(), w.replicas, w.cpu_request, w.memory_request))
                .collect::<Vec<_>>()
        };
        let week = starting(7);
        assert_eq!(starting(1), week);
        assert_eq!(starting(2), week);
        assert_eq!(starting(14), week);
    }
}
