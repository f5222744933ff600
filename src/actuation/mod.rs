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
//! A pod the node cannot resize falls back to eviction under the rules of [`eviction`].
//!
//! The maximum step (`maxStepFraction`) is applied here, against each pod's own requests:
//! a change moves a pod at most that far, and the next round moves it further. The
//! recommendation reported keeps the whole target.

pub mod eviction;

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

/// The workload kinds whose pod template `RollingRestart` patches (their controllers roll
/// the pods when the template changes), with their API version.
pub fn rollable(kind: &str) -> Option<&'static str> {
    match kind {
        "Deployment" | "StatefulSet" | "DaemonSet" => Some("apps/v1"),
        _ => None,
    }
}

/// `RollingRestart`: the server-side-apply body that moves a workload's pod template
/// towards `targets`, or `None` when no container moves by the hysteresis. The body holds
/// only the resource fields: for every container with a target, its `cpu` and `memory`
/// requests and the limits it has, changed or not, so the set of fields Tailor owns stays
/// the same from one apply to the next (a field left out of an apply would be removed).
/// `None` too for a kind without a pod template controller ([`rollable`]).
pub fn template_apply(
    kind: &str,
    namespace: &str,
    name: &str,
    template: &k8s_openapi::api::core::v1::PodSpec,
    targets: &BTreeMap<String, ContainerRecommendation>,
    rules: Rules,
) -> Option<serde_json::Value> {
    let api_version = rollable(kind)?;
    let mut changed = false;
    let mut containers = Vec::new();
    for c in &template.containers {
        let Some(recommendation) = targets.get(&c.name) else {
            continue;
        };
        let current = crate::rightsizing::service::current_requests(c);
        let target = next_step(current, recommendation, rules.max_step);
        let resize = container_resize(c, &target, rules.min_change);
        changed |= resize.is_some();
        let resize = resize.unwrap_or(ContainerResize {
            name: c.name.clone(),
            requests: BTreeMap::new(),
            limits: BTreeMap::new(),
        });
        let res = c.resources.as_ref();
        let mut requests = res.and_then(|r| r.requests.clone()).unwrap_or_default();
        let mut limits = res.and_then(|r| r.limits.clone()).unwrap_or_default();
        requests.retain(|k, _| k == "cpu" || k == "memory");
        limits.retain(|k, _| k == "cpu" || k == "memory");
        requests.extend(resize.requests);
        limits.extend(resize.limits);
        let mut resources = serde_json::Map::new();
        if !requests.is_empty() {
            resources.insert("requests".to_string(), serde_json::json!(requests));
        }
        if !limits.is_empty() {
            resources.insert("limits".to_string(), serde_json::json!(limits));
        }
        containers.push(serde_json::json!({"name": c.name, "resources": resources}));
    }
    changed.then(|| {
        serde_json::json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"template": {"spec": {"containers": containers}}},
        })
    })
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
                cpu_target_cores: None,
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

    fn template(cpu: &str, memory: &str) -> k8s_openapi::api::core::v1::PodSpec {
        serde_yaml::from_str(&format!(
            "containers:\n- name: app\n  image: registry.example/web:1\n  resources: {{requests: {{cpu: '{cpu}', memory: {memory}}}, limits: {{memory: {memory}}}}}\n- name: sidecar\n  image: registry.example/proxy:1\n"
        ))
        .expect("pod spec")
    }

    #[test]
    fn a_rolling_restart_applies_only_the_resource_fields_of_the_template() {
        let body = template_apply(
            "Deployment",
            "shop",
            "web",
            &template("1", "1Gi"),
            &target(400, 512 << 20),
            FREE,
        )
        .expect("a change");
        assert_eq!(
            body,
            serde_json::json!({
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "shop"},
                "spec": {"template": {"spec": {"containers": [{
                    "name": "app",
                    "resources": {
                        "requests": {"cpu": "400m", "memory": "512Mi"},
                        "limits": {"memory": "512Mi"}
                    }
                }]}}}
            })
        );
    }

    #[test]
    fn a_rolling_restart_keeps_the_fields_it_owns_when_only_one_request_moves() {
        // Memory is within the hysteresis: it is applied at its current value, not dropped.
        let body = template_apply(
            "StatefulSet",
            "shop",
            "db",
            &template("1", "1Gi"),
            &target(400, 1 << 30),
            FREE,
        )
        .expect("a change");
        let resources = &body["spec"]["template"]["spec"]["containers"][0]["resources"];
        assert_eq!(resources["requests"]["cpu"], "400m");
        assert_eq!(resources["requests"]["memory"], "1Gi");
        assert_eq!(resources["limits"]["memory"], "1Gi");
    }

    #[test]
    fn a_template_at_its_target_or_of_a_kind_without_rollout_is_not_patched() {
        assert!(
            template_apply(
                "Deployment",
                "shop",
                "web",
                &template("1", "1Gi"),
                &target(950, 1 << 30),
                FREE
            )
            .is_none()
        );
        assert!(
            template_apply(
                "Job",
                "shop",
                "once",
                &template("1", "1Gi"),
                &target(400, 512 << 20),
                FREE
            )
            .is_none()
        );
    }
}
