//! Applying right-sized requests to running pods, pure: which pods to resize in place and
//! to what. The right-sizing controller carries the plan out through the pod `resize`
//! subresource (`controllers::writes`), so no container restarts where its resize policy
//! allows it.
//!
//! A pod is resized only when it runs, is not terminating, and a managed request differs
//! from the target by at least the policy's hysteresis (`minChangeFraction`); requests the
//! recommendation leaves as they are (an HPA scales on them, or the policy does not manage
//! them) are not touched. Limits follow the recommendation (its limit policy).
//!
//! The maximum step (`maxStepFraction`) is applied here, against each pod's own requests:
//! a change moves a pod at most that far, and the next round moves it further. The
//! recommendation reported keeps the whole target.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::model::quantity::{format_milli, format_value, parse_milli, parse_value};
use crate::rightsizing::recommender::next_step;
use crate::rightsizing::{ContainerRecommendation, Requests};

/// How far one round of actuation may move a pod.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rules {
    /// Changes smaller than this fraction of the current request are not made.
    pub min_change: f64,
    /// Largest change per round, as a fraction of the current request (0: no limit).
    pub max_step: f64,
}

/// New resources for one container of a pod.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerResize {
    /// The container.
    pub name: String,
    /// Requests to set (`cpu`, `memory`).
    pub requests: BTreeMap<String, Quantity>,
    /// Limits to set; an absent one is left as it is.
    pub limits: BTreeMap<String, Quantity>,
}

/// One pod to resize in place.
#[derive(Debug, Clone, PartialEq)]
pub struct Resize {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// The containers whose resources change.
    pub containers: Vec<ContainerResize>,
}

/// Whether `new` differs from `old` by at least `min_change` of `old` (any change when
/// `old` is unset or zero); equal values never differ.
fn differs(old: Option<i64>, new: Option<i64>, min_change: f64) -> bool {
    match (old, new) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(o), Some(n)) if n == o => false,
        (Some(o), Some(n)) if o <= 0 => n != o,
        (Some(o), Some(n)) => ((n - o) as f64 / o as f64).abs() >= min_change,
    }
}

fn quantity(v: Option<&Quantity>, cpu: bool) -> Option<i64> {
    v.and_then(|q| {
        if cpu {
            parse_milli(&q.0).ok()
        } else {
            parse_value(&q.0).ok()
        }
    })
}

/// The requests and limits that bring container `c` to `target` (recommended requests and
/// limits), leaving a request alone when it moves less than `min_change` of its current
/// value (0: any difference); `None` when nothing changes. A limit is set only where the
/// container has one, to the recommendation's limit (its limit policy, e.g. keeping the
/// limit/request ratio). Used for running pods (in-place resize) and for new pods (the
/// admission webhook), so both apply the same values.
pub fn container_resize(
    c: &Container,
    target: &Requests,
    min_change: f64,
) -> Option<ContainerResize> {
    let res = c.resources.as_ref();
    let requests = res.and_then(|r| r.requests.as_ref());
    let limits = res.and_then(|r| r.limits.as_ref());
    let cpu = quantity(requests.and_then(|m| m.get("cpu")), true);
    let memory = quantity(requests.and_then(|m| m.get("memory")), false);
    let cpu_changes = differs(cpu, target.cpu, min_change);
    let memory_changes = differs(memory, target.memory, min_change);
    if !cpu_changes && !memory_changes {
        return None;
    }
    let mut r = ContainerResize {
        name: c.name.clone(),
        requests: BTreeMap::new(),
        limits: BTreeMap::new(),
    };
    if let (true, Some(v)) = (cpu_changes, target.cpu) {
        r.requests
            .insert("cpu".to_string(), Quantity(format_milli(v)));
        if let Some(l) = target.cpu_limit
            && limits.is_some_and(|m| m.contains_key("cpu"))
        {
            r.limits
                .insert("cpu".to_string(), Quantity(format_milli(l)));
        }
    }
    if let (true, Some(v)) = (memory_changes, target.memory) {
        r.requests
            .insert("memory".to_string(), Quantity(format_value(v)));
        if let Some(l) = target.memory_limit
            && limits.is_some_and(|m| m.contains_key("memory"))
        {
            r.limits
                .insert("memory".to_string(), Quantity(format_value(l)));
        }
    }
    Some(r)
}

/// `pod` as it will be once `containers` are applied to it: what the provisioner plans with
/// for a pending pod it resizes before buying its node. Containers not named are unchanged.
pub fn with_resources(pod: &Pod, containers: &[ContainerResize]) -> Pod {
    let mut pod = pod.clone();
    if let Some(spec) = pod.spec.as_mut() {
        let all = spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten());
        for c in all {
            let Some(change) = containers.iter().find(|r| r.name == c.name) else {
                continue;
            };
            let resources = c.resources.get_or_insert_with(Default::default);
            for (list, values) in [
                (&mut resources.requests, &change.requests),
                (&mut resources.limits, &change.limits),
            ] {
                if values.is_empty() {
                    continue;
                }
                let list = list.get_or_insert_with(BTreeMap::new);
                for (k, v) in values {
                    list.insert(k.clone(), v.clone());
                }
            }
        }
    }
    pod
}

/// The in-place resizes that move `pods` towards `targets` (the recommendation per
/// container name), at most `rules.max_step` per round, skipping changes below
/// `rules.min_change`.
pub fn resizes<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    targets: &BTreeMap<String, ContainerRecommendation>,
    rules: Rules,
) -> Vec<Resize> {
    let min_change = rules.min_change;
    let mut out = Vec::new();
    for pod in pods {
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        if !running || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(spec) = &pod.spec else { continue };
        let containers: Vec<ContainerResize> = spec
            .containers
            .iter()
            .filter_map(|c| {
                let recommendation = targets.get(&c.name)?;
                let res = c.resources.as_ref();
                let requests = res.and_then(|r| r.requests.as_ref());
                let limits = res.and_then(|r| r.limits.as_ref());
                let current = Requests {
                    cpu: quantity(requests.and_then(|m| m.get("cpu")), true),
                    memory: quantity(requests.and_then(|m| m.get("memory")), false),
                    cpu_limit: quantity(limits.and_then(|m| m.get("cpu")), true),
                    memory_limit: quantity(limits.and_then(|m| m.get("memory")), false),
                };
                let target = next_step(current, recommendation, rules.max_step);
                container_resize(c, &target, min_change)
            })
            .collect();
        if !containers.is_empty() {
            out.push(Resize {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                pod: pod.metadata.name.clone().unwrap_or_default(),
                containers,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(phase: &str, cpu: &str, memory: &str) -> Pod {
        serde_yaml::from_str(&format!(
            "metadata: {{name: web-1, namespace: shop}}\nspec:\n  containers:\n  - name: app\n    resources: {{requests: {{cpu: '{cpu}', memory: {memory}}}, limits: {{memory: {memory}}}}}\nstatus: {{phase: {phase}}}\n"
        ))
        .expect("pod")
    }

    #[test]
    fn a_pod_with_resources_applied_carries_the_new_values_and_keeps_the_rest() {
        let before = pod("Pending", "1", "1Gi");
        let change = ContainerResize {
            name: "app".to_string(),
            requests: BTreeMap::from([("cpu".to_string(), Quantity("250m".to_string()))]),
            limits: BTreeMap::from([("memory".to_string(), Quantity("512Mi".to_string()))]),
        };
        let after = with_resources(&before, std::slice::from_ref(&change));
        let r = after.spec.as_ref().unwrap().containers[0]
            .resources
            .clone()
            .unwrap();
        let requests = r.requests.unwrap();
        assert_eq!(requests["cpu"].0, "250m");
        assert_eq!(
            requests["memory"].0, "1Gi",
            "memory request not named: kept"
        );
        assert_eq!(r.limits.unwrap()["memory"].0, "512Mi");
        // Another container's change leaves this pod as it was.
        let other = ContainerResize {
            name: "sidecar".to_string(),
            ..change
        };
        assert_eq!(with_resources(&before, &[other]), before);
    }

    fn target(cpu: i64, memory: i64) -> BTreeMap<String, ContainerRecommendation> {
        let requests = Requests {
            cpu: Some(cpu),
            memory: Some(memory),
            cpu_limit: None,
            memory_limit: Some(memory),
        };
        BTreeMap::from([(
            "app".to_string(),
            ContainerRecommendation {
                current: requests,
                recommended: requests,
                lower: (None, None),
                upper: (None, None),
                confidence: 1.0,
                actionable: true,
                reasons: Vec::new(),
                hourly_cost_delta: 0.0,
                memory_urgent: false,
            },
        )])
    }

    const FREE: Rules = Rules {
        min_change: 0.1,
        max_step: 0.0,
    };

    #[test]
    fn a_running_pod_far_from_its_target_is_resized_with_its_limit() {
        let p = pod("Running", "1", "1Gi");
        let plan = resizes([&p], &target(400, 512 << 20), FREE);
        assert_eq!(plan.len(), 1);
        let c = &plan[0].containers[0];
        assert_eq!(c.requests["cpu"].0, "400m");
        assert_eq!(c.requests["memory"].0, "512Mi");
        assert_eq!(c.limits["memory"].0, "512Mi");
        assert!(!c.limits.contains_key("cpu"), "no cpu limit was set");
    }

    #[test]
    fn changes_within_the_hysteresis_and_pods_not_running_are_left_alone() {
        let p = pod("Running", "1", "1Gi");
        assert!(resizes([&p], &target(950, 1 << 30), FREE).is_empty());
        let pending = pod("Pending", "1", "1Gi");
        assert!(resizes([&pending], &target(400, 512 << 20), FREE).is_empty());
        // Only the resource that moves enough is set.
        let plan = resizes([&p], &target(400, 1 << 30), FREE);
        assert!(!plan[0].containers[0].requests.contains_key("memory"));
    }

    #[test]
    fn a_resize_moves_at_most_the_maximum_step_while_the_target_stays_whole() {
        let p = pod("Running", "1", "1Gi");
        let targets = target(200, 128 << 20);
        let stepped = Rules {
            min_change: 0.1,
            max_step: 0.5,
        };
        let plan = resizes([&p], &targets, stepped);
        let c = &plan[0].containers[0];
        assert_eq!(c.requests["cpu"].0, "500m");
        assert_eq!(c.requests["memory"].0, "512Mi");
        assert_eq!(c.limits["memory"].0, "512Mi");
        // The recommendation handed in is untouched: the next round moves further.
        assert_eq!(targets["app"].recommended.cpu, Some(200));
        let resized = pod("Running", "500m", "512Mi");
        let plan = resizes([&resized], &targets, stepped);
        assert_eq!(plan[0].containers[0].requests["cpu"].0, "250m");
        assert_eq!(plan[0].containers[0].requests["memory"].0, "256Mi");
    }
}
