//! Karpenter's scheduling benchmark mix, shared by the benches that plan it in process
//! (`scheduling`) and as a whole `tailor simulate` run over a snapshot file (`simulate`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, Pod, PodAffinity, PodAffinityTerm, PodAntiAffinity, PodSpec, PodStatus,
    ResourceRequirements, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

/// A small deterministic generator for the benchmark's pod mix (splitmix64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next() % items.len() as u64) as usize]
    }
}

pub fn selector(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(key.to_string(), value.to_string())])),
        ..Default::default()
    }
}

/// A pending pod in `default` with one container requesting `cpu` and `memory`.
pub fn pod(
    name: &str,
    cpu: &str,
    memory: &str,
    labels: BTreeMap<String, String>,
    affinity: Option<Affinity>,
    spread: Vec<TopologySpreadConstraint>,
) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some("default".to_string()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".to_string(),
                image: Some("registry.k8s.io/pause:3.10".to_string()),
                resources: Some(ResourceRequirements {
                    requests: Some(BTreeMap::from([
                        ("cpu".to_string(), Quantity(cpu.to_string())),
                        ("memory".to_string(), Quantity(memory.to_string())),
                    ])),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            affinity,
            topology_spread_constraints: (!spread.is_empty()).then_some(spread),
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Pending".to_string()),
            ..Default::default()
        }),
    }
}

/// Karpenter's benchmark mix: N/5 each of plain pods, zone spread, hostname spread, zone
/// pod affinity and hostname anti-affinity.
pub fn diverse_pods(n: usize, seed: u64) -> Vec<Pod> {
    let mut rng = Rng(seed);
    let cpus = ["100m", "250m", "500m", "1000m", "1500m"];
    let mems = ["100Mi", "256Mi", "512Mi", "1024Mi", "2048Mi", "4096Mi"];
    let values = ["a", "b", "c", "d", "e", "f", "g"];
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let cpu = *rng.pick(&cpus);
        let mem = *rng.pick(&mems);
        let v = (*rng.pick(&values)).to_string();
        let name = format!("p{i}");
        let spread = |key: &str, label: &str| TopologySpreadConstraint {
            max_skew: 1,
            topology_key: key.to_string(),
            when_unsatisfiable: "DoNotSchedule".to_string(),
            label_selector: Some(selector(label, &v)),
            ..Default::default()
        };
        let affinity_term = |key: &str, label: &str, value: &str| PodAffinityTerm {
            topology_key: key.to_string(),
            label_selector: Some(selector(label, value)),
            ..Default::default()
        };
        let (labels, affinity, spread) = match i % 5 {
            0 => (
                BTreeMap::from([("app".into(), "plain".into())]),
                None,
                vec![],
            ),
            1 => (
                BTreeMap::from([("zone-spread".into(), v.clone())]),
                None,
                vec![spread("topology.kubernetes.io/zone", "zone-spread")],
            ),
            2 => (
                BTreeMap::from([("host-spread".into(), v.clone())]),
                None,
                vec![spread("kubernetes.io/hostname", "host-spread")],
            ),
            3 => (
                BTreeMap::from([("affinity".into(), v.clone())]),
                Some(Affinity {
                    pod_affinity: Some(PodAffinity {
                        required_during_scheduling_ignored_during_execution: Some(vec![
                            affinity_term("topology.kubernetes.io/zone", "affinity", &v),
                        ]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                vec![],
            ),
            _ => (
                BTreeMap::from([("anti".into(), "yes".into())]),
                Some(Affinity {
                    pod_anti_affinity: Some(PodAntiAffinity {
                        required_during_scheduling_ignored_during_execution: Some(vec![
                            affinity_term("kubernetes.io/hostname", "anti", "yes"),
                        ]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                vec![],
            ),
        };
        out.push(pod(&name, cpu, mem, labels, affinity, spread));
    }
    out
}
