//! The admission decision, pure: a pod being created and a read-only view of the cluster
//! in, a JSON patch (or why there is none) out. No clock, no socket: the server around it
//! only decodes the review, calls [`decide`] and encodes the answer.
//!
//! A pod is patched only when all of these hold, and is allowed unchanged otherwise:
//! - its controlling owner leads to a workload (ReplicaSet → Deployment, StatefulSet,
//!   DaemonSet, Job → CronJob) that has a `Recommendation`;
//! - the policy that governs the workload now (the same rules as the controller: a policy
//!   of its namespace that selects it, else the cluster default, else the built-in defaults
//!   in the global mode) is usable and in `Auto` mode;
//! - the Recommendation is `Actionable` and not `Stale`.
//!
//! Every `update.mode` sets requests at creation: `OnCreate` applies through the webhook
//! only, `InPlace` relies on it for the pods that replace evicted ones (VPA's
//! InPlaceOrRecreate), and `RollingRestart` rolls pods whose template already carries the
//! values, so the patch agrees with it. Requests are set to the recommendation; limits, where
//! the container has them, to the recommendation's limits (its limit policy), exactly as an
//! in-place resize would ([`crate::actuation::container_resize`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::Value;

use crate::actuation::{ContainerResize, container_resize};
use crate::apis::recommendation::condition;
use crate::apis::{Mode, Recommendation, RightsizingPolicy};
use crate::controllers::rightsizing::recommendation_name;
use crate::model::quantity::{parse_milli, parse_value};
use crate::rightsizing::Requests;
use crate::rightsizing::service::{Governance, Policies};
use crate::usage::workloads::Workload;

/// What the decision reads from the cluster. The agent implements it over its reflector
/// stores; every lookup is by key, so a decision costs the same in a large cluster.
pub trait Objects {
    /// A ReplicaSet by namespace and name.
    fn replica_set(&self, namespace: &str, name: &str) -> Option<Arc<ReplicaSet>>;
    /// A Job by namespace and name.
    fn job(&self, namespace: &str, name: &str) -> Option<Arc<Job>>;
    /// Whether a Deployment of this name exists.
    fn has_deployment(&self, namespace: &str, name: &str) -> bool;
    /// The labels of a workload object, for policy selectors (empty when unknown).
    fn workload_labels(&self, workload: &Workload) -> BTreeMap<String, String>;
    /// A Recommendation by namespace and name.
    fn recommendation(&self, namespace: &str, name: &str) -> Option<Arc<Recommendation>>;
    /// The RightsizingPolicies that may govern a workload of `namespace`: those of the
    /// namespace and the cluster default (`default` in the agent's namespace).
    fn policies(&self, namespace: &str) -> Vec<RightsizingPolicy>;
}

/// What the webhook needs to know besides the cluster.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The mode of workloads no policy selects (`--mode`: autonomous is `Auto`).
    pub global_mode: Mode,
    /// The agent's namespace, home of the cluster-default policy.
    pub agent_namespace: String,
}

/// The answer for one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Set these requests and limits.
    Patch {
        /// The pod's workload.
        workload: Workload,
        /// JSON patch operations on the pod.
        patch: Patch,
        /// The containers whose resources change, with their new values.
        containers: Vec<ContainerResize>,
    },
    /// Allow as it is; why, for the debug log.
    Unchanged(String),
    /// Allow as it is because something it needs cannot be read: the object, the field and
    /// the value, for a warning.
    Invalid(String),
}

/// The workload a pod being created belongs to, from its controlling owner. `Err` says why
/// there is none (a bare pod, an owner kind that is not a workload).
pub fn workload_of(pod: &Pod, namespace: &str, objects: &dyn Objects) -> Result<Workload, String> {
    let owners = pod.metadata.owner_references.as_deref().unwrap_or_default();
    let Some(owner) = owners
        .iter()
        .find(|o| o.controller == Some(true))
        .or_else(|| owners.first())
    else {
        return Err("the pod has no owner: a bare pod has no workload recommendation".into());
    };
    let workload = |kind: &str, name: &str| Workload {
        namespace: namespace.to_string(),
        kind: kind.to_string(),
        name: name.to_string(),
    };
    match owner.kind.as_str() {
        "ReplicaSet" => {
            if let Some(rs) = objects.replica_set(namespace, &owner.name) {
                let deployment = rs
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .find(|o| o.kind == "Deployment");
                return Ok(match deployment {
                    Some(d) => workload("Deployment", &d.name),
                    None => workload("ReplicaSet", &owner.name),
                });
            }
            // The ReplicaSet was created moments ago and the store has not seen it yet:
            // a Deployment's ReplicaSet is `<deployment>-<pod-template-hash>`.
            let hash = pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("pod-template-hash"));
            if let Some(deployment) = hash
                .and_then(|h| owner.name.strip_suffix(h.as_str()))
                .and_then(|n| n.strip_suffix('-'))
                .filter(|d| objects.has_deployment(namespace, d))
            {
                return Ok(workload("Deployment", deployment));
            }
            Ok(workload("ReplicaSet", &owner.name))
        }
        "Job" => {
            let cron = objects.job(namespace, &owner.name).and_then(|j| {
                j.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .find(|o| o.kind == "CronJob")
                    .map(|o| o.name.clone())
            });
            Ok(match cron {
                Some(c) => workload("CronJob", &c),
                None => workload("Job", &owner.name),
            })
        }
        "StatefulSet" | "DaemonSet" => Ok(workload(&owner.kind, &owner.name)),
        other => Err(format!(
            "owner {other}/{} is not a workload Tailor right-sizes",
            owner.name
        )),
    }
}

fn condition_is(r: &Recommendation, type_: &str) -> bool {
    r.status
        .as_ref()
        .into_iter()
        .flat_map(|s| &s.conditions)
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// The recommended requests and limits per container, or the first quantity that cannot
/// be read, naming the Recommendation, the field and the value.
pub fn targets(r: &Recommendation) -> Result<BTreeMap<String, Requests>, String> {
    let name = format!(
        "recommendation {}/{}",
        r.metadata.namespace.as_deref().unwrap_or_default(),
        r.metadata.name.as_deref().unwrap_or_default()
    );
    let mut out = BTreeMap::new();
    let containers = r.status.as_ref().map(|s| s.containers.as_slice());
    for (i, c) in containers.unwrap_or_default().iter().enumerate() {
        let read = |list: &BTreeMap<String, Quantity>, what: &str, key: &str| {
            list.get(key)
                .map(|q| {
                    let parsed = if key == "cpu" {
                        parse_milli(&q.0)
                    } else {
                        parse_value(&q.0)
                    };
                    parsed.map_err(|e| {
                        format!(
                            "{name}: status.containers[{i}].recommended.{what}.{key}: {:?}: {e}",
                            q.0
                        )
                    })
                })
                .transpose()
        };
        let rec = &c.recommended;
        out.insert(
            c.name.clone(),
            Requests {
                cpu: read(&rec.requests, "requests", "cpu")?,
                memory: read(&rec.requests, "requests", "memory")?,
                cpu_limit: read(&rec.limits, "limits", "cpu")?,
                memory_limit: read(&rec.limits, "limits", "memory")?,
            },
        );
    }
    Ok(out)
}

/// Whether the container would end with a request above its limit (the API server would
/// then reject the pod): such a change is not made.
fn request_above_limit(c: &Container, change: &ContainerResize) -> bool {
    let res = c.resources.as_ref();
    ["cpu", "memory"].iter().any(|key| {
        let request = change
            .requests
            .get(*key)
            .or_else(|| res.and_then(|r| r.requests.as_ref()?.get(*key)));
        let limit = change
            .limits
            .get(*key)
            .or_else(|| res.and_then(|r| r.limits.as_ref()?.get(*key)));
        let parse = |q: &Quantity| {
            if *key == "cpu" {
                parse_milli(&q.0).ok()
            } else {
                parse_value(&q.0).ok()
            }
        };
        matches!((request.and_then(parse), limit.and_then(parse)), (Some(r), Some(l)) if r > l)
    })
}

fn add(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path, value })
}

fn quantities(list: &BTreeMap<String, Quantity>) -> Value {
    Value::Object(
        list.iter()
            .map(|(k, v)| (k.clone(), Value::String(v.0.clone())))
            .collect(),
    )
}

/// The operations that set `change` on container `index` of the pod's `field`
/// (`containers`, `initContainers`), creating `resources`, `requests` or `limits` where the
/// pod has none.
fn operations(
    c: &Container,
    (field, index): (&str, usize),
    change: &ContainerResize,
    ops: &mut Vec<PatchOperation>,
) {
    let index = index.to_string();
    let pointer = |tail: &[&str]| {
        PointerBuf::from_tokens(["spec", field, index.as_str()].iter().chain(tail).copied())
    };
    let Some(res) = &c.resources else {
        let mut value = serde_json::Map::new();
        value.insert("requests".into(), quantities(&change.requests));
        if !change.limits.is_empty() {
            value.insert("limits".into(), quantities(&change.limits));
        }
        ops.push(add(pointer(&["resources"]), Value::Object(value)));
        return;
    };
    for (list_field, list, present) in [
        ("requests", &change.requests, res.requests.is_some()),
        ("limits", &change.limits, res.limits.is_some()),
    ] {
        if list.is_empty() {
            continue;
        }
        if present {
            for (k, v) in list {
                ops.push(add(
                    pointer(&["resources", list_field, k]),
                    Value::String(v.0.clone()),
                ));
            }
        } else {
            ops.push(add(pointer(&["resources", list_field]), quantities(list)));
        }
    }
}

/// Decides what to do with `pod`, being created in `namespace`.
pub fn decide(pod: &Pod, namespace: &str, objects: &dyn Objects, settings: &Settings) -> Decision {
    decide_as(pod, namespace, objects, settings, true)
}

/// What [`decide`] would give `pod` if its workload were in `Auto` mode: the recommendation
/// applied whatever the governing mode, with every other condition the same (an actionable,
/// fresh recommendation; a usable policy). The provisioner prices the right-sized plan with
/// it for workloads in `Recommend` mode.
pub fn decide_if_auto(
    pod: &Pod,
    namespace: &str,
    objects: &dyn Objects,
    settings: &Settings,
) -> Decision {
    decide_as(pod, namespace, objects, settings, false)
}

fn decide_as(
    pod: &Pod,
    namespace: &str,
    objects: &dyn Objects,
    settings: &Settings,
    only_auto: bool,
) -> Decision {
    let workload = match workload_of(pod, namespace, objects) {
        Ok(w) => w,
        Err(why) => return Decision::Unchanged(why),
    };
    let w = format!("{}/{}/{}", workload.namespace, workload.kind, workload.name);
    let name = recommendation_name(&workload);
    let Some(recommendation) = objects.recommendation(namespace, &name).filter(|r| {
        r.spec.target_ref.kind == workload.kind && r.spec.target_ref.name == workload.name
    }) else {
        return Decision::Unchanged(format!("{w}: no recommendation {namespace}/{name} yet"));
    };
    let policies = Policies::new(
        &objects.policies(namespace),
        Some(&settings.agent_namespace),
        settings.global_mode,
    );
    match policies.govern(&workload, &objects.workload_labels(&workload)) {
        Governance::Held { source, error } => {
            return Decision::Unchanged(format!("{w}: held by policy {source}: {error}"));
        }
        Governance::Governed { policy, source } if only_auto && policy.mode != Mode::Auto => {
            let by = source.map_or_else(|| "--mode".to_string(), |s| format!("policy {s}"));
            return Decision::Unchanged(format!("{w}: mode {:?} (from {by})", policy.mode));
        }
        Governance::Governed { .. } => {}
    }
    if condition_is(&recommendation, condition::STALE) {
        return Decision::Unchanged(format!("{w}: recommendation {name} is Stale"));
    }
    if !condition_is(&recommendation, condition::ACTIONABLE) {
        return Decision::Unchanged(format!("{w}: recommendation {name} is not Actionable"));
    }
    let targets = match targets(&recommendation) {
        Ok(t) => t,
        Err(e) => return Decision::Invalid(e),
    };
    let Some(spec) = &pod.spec else {
        return Decision::Invalid(format!("pod of {w}: spec is missing"));
    };
    let mut ops = Vec::new();
    let mut containers = Vec::new();
    let lists = [
        ("containers", spec.containers.as_slice()),
        (
            "initContainers",
            spec.init_containers.as_deref().unwrap_or_default(),
        ),
    ];
    for (field, list) in lists {
        for (i, c) in list.iter().enumerate() {
            // Creation has no running container to disturb: any difference is applied.
            let Some(change) = targets
                .get(&c.name)
                .and_then(|t| container_resize(c, t, 0.0))
            else {
                continue;
            };
            if request_above_limit(c, &change) {
                tracing::warn!(workload = %w, container = %c.name, "the recommendation would put a request above the container's limit: left as it is");
                continue;
            }
            operations(c, (field, i), &change, &mut ops);
            containers.push(change);
        }
    }
    if ops.is_empty() {
        return Decision::Unchanged(format!("{w}: requests already match the recommendation"));
    }
    Decision::Patch {
        workload,
        patch: Patch(ops),
        containers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cluster as the decision sees it, in plain vectors.
    #[derive(Default)]
    struct Cluster {
        replica_sets: Vec<ReplicaSet>,
        jobs: Vec<Job>,
        deployments: Vec<(String, String, BTreeMap<String, String>)>,
        recommendations: Vec<Recommendation>,
        policies: Vec<RightsizingPolicy>,
    }

    fn named<'a, K: kube::Resource + 'a>(
        list: impl IntoIterator<Item = &'a K>,
        namespace: &str,
        name: &str,
    ) -> Option<&'a K> {
        list.into_iter().find(|o| {
            o.meta().namespace.as_deref() == Some(namespace)
                && o.meta().name.as_deref() == Some(name)
        })
    }

    impl Objects for Cluster {
        fn replica_set(&self, namespace: &str, name: &str) -> Option<Arc<ReplicaSet>> {
            named(&self.replica_sets, namespace, name)
                .cloned()
                .map(Arc::new)
        }
        fn job(&self, namespace: &str, name: &str) -> Option<Arc<Job>> {
            named(&self.jobs, namespace, name).cloned().map(Arc::new)
        }
        fn has_deployment(&self, namespace: &str, name: &str) -> bool {
            self.deployments
                .iter()
                .any(|(ns, n, _)| ns == namespace && n == name)
        }
        fn workload_labels(&self, w: &Workload) -> BTreeMap<String, String> {
            self.deployments
                .iter()
                .find(|(ns, n, _)| *ns == w.namespace && *n == w.name && w.kind == "Deployment")
                .map(|(_, _, l)| l.clone())
                .unwrap_or_default()
        }
        fn recommendation(&self, namespace: &str, name: &str) -> Option<Arc<Recommendation>> {
            named(&self.recommendations, namespace, name)
                .cloned()
                .map(Arc::new)
        }
        fn policies(&self, namespace: &str) -> Vec<RightsizingPolicy> {
            self.policies
                .iter()
                .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
                .cloned()
                .collect()
        }
    }

    fn yaml<T: serde::de::DeserializeOwned>(text: &str) -> T {
        serde_yaml::from_str(text).expect("fixture parses")
    }

    const POD: &str = r#"
metadata:
  generateName: web-7d9f8c6b5-
  namespace: shop
  labels: {app: web, pod-template-hash: 7d9f8c6b5}
  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: web-7d9f8c6b5, uid: u1, controller: true}]
spec:
  containers:
  - name: app
    image: web:1
    resources: {requests: {cpu: "1", memory: 1Gi}, limits: {memory: 2Gi}}
  - name: sidecar
    image: proxy:1
"#;

    fn replica_set() -> ReplicaSet {
        yaml(
            "metadata:\n  name: web-7d9f8c6b5\n  namespace: shop\n  ownerReferences: [{apiVersion: apps/v1, kind: Deployment, name: web, uid: u0, controller: true}]\n",
        )
    }

    fn recommendation(actionable: bool, stale: bool, memory: &str) -> Recommendation {
        yaml(&format!(
            r#"
apiVersion: tailor.sh/v1alpha1
kind: Recommendation
metadata: {{name: deployment-web, namespace: shop}}
spec:
  targetRef: {{apiVersion: apps/v1, kind: Deployment, name: web}}
status:
  containers:
  - name: app
    recommended:
      requests: {{cpu: 250m, memory: "{memory}"}}
      limits: {{memory: 1Gi}}
  - name: sidecar
    recommended:
      requests: {{cpu: 50m, memory: 64Mi}}
  conditions:
  - {{type: Actionable, status: "{}", reason: x, message: "", lastTransitionTime: "2026-01-01T00:00:00Z"}}
  - {{type: Stale, status: "{}", reason: x, message: "", lastTransitionTime: "2026-01-01T00:00:00Z"}}
"#,
            if actionable { "True" } else { "False" },
            if stale { "True" } else { "False" },
        ))
    }

    fn policy(mode: &str, update: &str) -> RightsizingPolicy {
        yaml(&format!(
            "apiVersion: tailor.sh/v1alpha1\nkind: RightsizingPolicy\nmetadata: {{name: web, namespace: shop}}\nspec:\n  mode: {mode}\n  update: {{mode: {update}}}\n  selector: {{matchLabels: {{tier: web}}}}\n"
        ))
    }

    fn cluster(policies: Vec<RightsizingPolicy>, rec: Recommendation) -> Cluster {
        Cluster {
            replica_sets: vec![replica_set()],
            deployments: vec![(
                "shop".into(),
                "web".into(),
                BTreeMap::from([("tier".into(), "web".into())]),
            )],
            recommendations: vec![rec],
            policies,
            ..Cluster::default()
        }
    }

    fn settings(global: Mode) -> Settings {
        Settings {
            global_mode: global,
            agent_namespace: "tailor".into(),
        }
    }

    /// The pod as the API server stores it after the patch.
    fn patched(pod: &Pod, decision: &Decision) -> Pod {
        let Decision::Patch { patch, .. } = decision else {
            panic!("expected a patch, got {decision:?}");
        };
        let mut doc = serde_json::to_value(pod).expect("pod serializes");
        json_patch::patch(&mut doc, patch).expect("the patch applies");
        serde_json::from_value(doc).expect("still a pod")
    }

    fn resources(pod: &Pod, i: usize) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
        let r = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers[i].resources.clone())
            .unwrap_or_default();
        let plain = |m: Option<BTreeMap<String, Quantity>>| {
            m.unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect()
        };
        (plain(r.requests), plain(r.limits))
    }

    #[test]
    fn an_auto_policy_sets_recommended_requests_and_scaled_limits_on_a_new_pod() {
        let pod: Pod = yaml(POD);
        for update in ["OnCreate", "InPlace", "RollingRestart"] {
            let c = cluster(
                vec![policy("Auto", update)],
                recommendation(true, false, "512Mi"),
            );
            let d = decide(&pod, "shop", &c, &settings(Mode::Recommend));
            let after = patched(&pod, &d);
            let (requests, limits) = resources(&after, 0);
            assert_eq!(requests["cpu"], "250m", "{update}");
            assert_eq!(requests["memory"], "512Mi");
            assert_eq!(
                limits["memory"], "1Gi",
                "the limit follows the recommendation's"
            );
            assert!(!limits.contains_key("cpu"), "no cpu limit is added");
            // A container without resources gets them.
            let (requests, limits) = resources(&after, 1);
            assert_eq!(requests["cpu"], "50m");
            assert!(limits.is_empty());
        }
    }

    #[test]
    fn the_global_mode_governs_workloads_no_policy_selects() {
        let pod: Pod = yaml(POD);
        let c = cluster(vec![], recommendation(true, false, "512Mi"));
        assert!(matches!(
            decide(&pod, "shop", &c, &settings(Mode::Auto)),
            Decision::Patch { .. }
        ));
        assert!(matches!(
            decide(&pod, "shop", &c, &settings(Mode::Recommend)),
            Decision::Unchanged(_)
        ));
        // A policy in Recommend mode wins over an autonomous agent.
        let c = cluster(
            vec![policy("Recommend", "OnCreate")],
            recommendation(true, false, "512Mi"),
        );
        let d = decide(&pod, "shop", &c, &settings(Mode::Auto));
        assert!(
            matches!(&d, Decision::Unchanged(why) if why.contains("Recommend")),
            "{d:?}"
        );
    }

    #[test]
    fn the_what_if_applies_the_recommendation_in_recommend_mode_but_keeps_every_other_check() {
        let pod: Pod = yaml(POD);
        let c = cluster(
            vec![policy("Recommend", "OnCreate")],
            recommendation(true, false, "512Mi"),
        );
        assert!(matches!(
            decide(&pod, "shop", &c, &settings(Mode::Auto)),
            Decision::Unchanged(_)
        ));
        let Decision::Patch { containers, .. } =
            decide_if_auto(&pod, "shop", &c, &settings(Mode::Recommend))
        else {
            panic!("the what-if applies a Recommend-mode recommendation");
        };
        assert_eq!(containers[0].requests["memory"].0, "512Mi");
        // Stale or not actionable: no what-if either.
        for (actionable, stale) in [(true, true), (false, false)] {
            let c = cluster(
                vec![policy("Recommend", "OnCreate")],
                recommendation(actionable, stale, "512Mi"),
            );
            assert!(matches!(
                decide_if_auto(&pod, "shop", &c, &settings(Mode::Recommend)),
                Decision::Unchanged(_)
            ));
        }
    }

    #[test]
    fn stale_or_not_actionable_recommendations_are_not_applied() {
        let pod: Pod = yaml(POD);
        for (actionable, stale) in [(true, true), (false, false)] {
            let c = cluster(
                vec![policy("Auto", "OnCreate")],
                recommendation(actionable, stale, "512Mi"),
            );
            let d = decide(&pod, "shop", &c, &settings(Mode::Auto));
            assert!(
                matches!(d, Decision::Unchanged(_)),
                "{actionable} {stale}: {d:?}"
            );
        }
    }

    #[test]
    fn pods_without_a_known_workload_or_recommendation_are_left_alone() {
        let mut pod: Pod = yaml(POD);
        let c = cluster(vec![], recommendation(true, false, "512Mi"));
        let mut bare = pod.clone();
        bare.metadata.owner_references = None;
        let d = decide(&bare, "shop", &c, &settings(Mode::Auto));
        assert!(
            matches!(&d, Decision::Unchanged(why) if why.contains("no owner")),
            "{d:?}"
        );
        if let Some(o) = pod.metadata.owner_references.as_mut() {
            o[0].kind = "Node".into();
        }
        let d = decide(&pod, "shop", &c, &settings(Mode::Auto));
        assert!(
            matches!(&d, Decision::Unchanged(why) if why.contains("Node/")),
            "{d:?}"
        );
        let pod: Pod = yaml(POD);
        let d = decide(&pod, "other", &c, &settings(Mode::Auto));
        assert!(
            matches!(&d, Decision::Unchanged(why) if why.contains("no recommendation")),
            "{d:?}"
        );
    }

    #[test]
    fn a_replica_set_the_stores_have_not_seen_is_traced_to_its_deployment_by_its_hash() {
        let pod: Pod = yaml(POD);
        let mut c = cluster(vec![], recommendation(true, false, "512Mi"));
        c.replica_sets.clear();
        let workload = workload_of(&pod, "shop", &c).expect("a workload");
        assert_eq!(
            (workload.kind.as_str(), workload.name.as_str()),
            ("Deployment", "web")
        );
        assert!(matches!(
            decide(&pod, "shop", &c, &settings(Mode::Auto)),
            Decision::Patch { .. }
        ));
    }

    #[test]
    fn an_unparsable_recommended_quantity_is_reported_with_its_field_and_value() {
        let pod: Pod = yaml(POD);
        let c = cluster(vec![], recommendation(true, false, "lots"));
        let d = decide(&pod, "shop", &c, &settings(Mode::Auto));
        let Decision::Invalid(why) = d else {
            panic!("expected Invalid, got {d:?}");
        };
        assert!(why.contains("shop/deployment-web"), "{why}");
        assert!(
            why.contains("status.containers[0].recommended.requests.memory"),
            "{why}"
        );
        assert!(why.contains("\"lots\""), "{why}");
    }

    #[test]
    fn a_request_that_would_exceed_the_containers_limit_is_not_set() {
        let pod: Pod =
            yaml(&POD.replace("limits: {memory: 2Gi}", "limits: {memory: 2Gi, cpu: 100m}"));
        // The recommendation has no cpu limit: 250m would exceed the pod's 100m limit.
        let c = cluster(vec![], recommendation(true, false, "512Mi"));
        let after = patched(&pod, &decide(&pod, "shop", &c, &settings(Mode::Auto)));
        let (requests, _) = resources(&after, 0);
        assert_eq!(requests["cpu"], "1", "the app container is left as it was");
        let (requests, _) = resources(&after, 1);
        assert_eq!(requests["cpu"], "50m", "the sidecar is still set");
    }

    #[test]
    fn a_pod_that_already_matches_gets_no_patch() {
        let pod: Pod = yaml(POD);
        let c = cluster(vec![], recommendation(true, false, "512Mi"));
        let after = patched(&pod, &decide(&pod, "shop", &c, &settings(Mode::Auto)));
        let d = decide(&after, "shop", &c, &settings(Mode::Auto));
        assert!(matches!(d, Decision::Unchanged(_)), "{d:?}");
    }

    #[test]
    fn every_review_is_allowed_and_bad_ones_are_counted_as_errors() {
        use crate::telemetry::names::WebhookOutcome;
        let c = cluster(vec![], recommendation(true, false, "512Mi"));
        let s = settings(Mode::Auto);
        let (review, outcome) =
            super::super::answer(br#"{"request": {"uid": "abc", "object": 7}}"#, &c, &s);
        let response = review.response.expect("a response");
        assert!(response.allowed);
        assert_eq!(response.uid, "abc");
        assert_eq!(outcome, WebhookOutcome::Error);
        let pod: serde_json::Value = serde_json::to_value(yaml::<Pod>(POD)).expect("json");
        let body = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "shop", "operation": "CREATE", "name": "",
                "userInfo": {}, "object": pod, "dryRun": false,
            }
        });
        let (review, outcome) = super::super::answer(body.to_string().as_bytes(), &c, &s);
        let response = review.response.expect("a response");
        assert!(response.allowed && response.patch.is_some());
        assert_eq!(
            (response.uid.as_str(), outcome),
            ("u-1", WebhookOutcome::Patched)
        );
    }
}
