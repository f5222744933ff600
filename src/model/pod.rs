//! What a pod asks of a node, computed the way kube-scheduler does.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::requirements::{NodeRequirements, Requirement, RequirementError, Requirements};
use super::resources::{ResourceError, Resources};

/// What is wrong with a pod field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldProblem {
    /// A resource list does not parse.
    #[error(transparent)]
    Resource(#[from] ResourceError),
    /// A node selector or affinity expression is invalid.
    #[error(transparent)]
    Requirement(#[from] RequirementError),
}

/// A pod field that failed to parse, with its path
/// (`spec.containers[1].resources.requests`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {source}")]
pub struct FieldError {
    /// Dotted path to the offending field.
    pub field: String,
    /// What is wrong with it.
    #[source]
    pub source: FieldProblem,
}

impl FieldError {
    fn new(field: impl Into<String>, source: impl Into<FieldProblem>) -> Self {
        FieldError {
            field: field.into(),
            source: source.into(),
        }
    }
}

/// Parses a Kubernetes `name → Quantity` map, naming `field` on error.
pub fn parse_quantities(
    map: Option<&BTreeMap<String, Quantity>>,
    field: &str,
) -> Result<Resources, FieldError> {
    match map {
        None => Ok(Resources::zero()),
        Some(m) => Resources::parse(m.iter().map(|(k, v)| (k.as_str(), v.0.as_str())))
            .map_err(|source| FieldError::new(field, source)),
    }
}

fn container_requests(c: &Container, path: &str) -> Result<Resources, FieldError> {
    let resources: Option<&ResourceRequirements> = c.resources.as_ref();
    let requests = parse_quantities(
        resources.and_then(|r| r.requests.as_ref()),
        &format!("{path}.resources.requests"),
    )?;
    let limits = parse_quantities(
        resources.and_then(|r| r.limits.as_ref()),
        &format!("{path}.resources.limits"),
    )?;
    // As the API server defaults it: a limit without a request makes the request equal
    // to the limit.
    let mut effective = requests.clone();
    for d in limits.dimensions() {
        if requests.get(&d) == 0 {
            effective.set(&d, limits.get(&d));
        }
    }
    Ok(effective)
}

fn add(a: &Resources, b: &Resources, field: &str) -> Result<Resources, FieldError> {
    a.checked_add(b)
        .map_err(|source| FieldError::new(field, source))
}

/// The resources a pod needs on a node: the larger of its app containers' sum (plus
/// native sidecars) and each init container's need while it runs (plus the sidecars
/// started before it), plus the pod overhead and one pod slot. This mirrors
/// kube-scheduler's `computePodResourceRequest` with sidecar containers enabled.
pub fn pod_requests(spec: &PodSpec) -> Result<Resources, FieldError> {
    let mut sidecars = Resources::zero();
    let mut init_peak = Resources::zero();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let path = format!("spec.initContainers[{i}]");
        let req = container_requests(c, &path)?;
        if c.restart_policy.as_deref() == Some("Always") {
            // A native sidecar keeps running alongside later init containers and the app.
            sidecars = add(&sidecars, &req, &path)?;
            init_peak = init_peak.max(&sidecars);
        } else {
            init_peak = init_peak.max(&add(&req, &sidecars, &path)?);
        }
    }
    let mut app = Resources::zero();
    for (i, c) in spec.containers.iter().enumerate() {
        let path = format!("spec.containers[{i}]");
        app = add(&app, &container_requests(c, &path)?, &path)?;
    }
    let running = add(&app, &sidecars, "spec.initContainers")?;
    let mut total = running.max(&init_peak);
    let overhead = parse_quantities(spec.overhead.as_ref(), "spec.overhead")?;
    total = add(&total, &overhead, "spec.overhead")?;
    total.pods = 1;
    Ok(total)
}

/// Where a pod may run: its node selector ANDed with one of its required node-affinity
/// terms.
pub fn node_requirements(spec: &PodSpec) -> Result<NodeRequirements, FieldError> {
    let selector = spec
        .node_selector
        .as_ref()
        .map(Requirements::from_node_selector)
        .unwrap_or_default();
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    let mut terms = Vec::new();
    for (i, term) in required
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let field = format!(
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]"
        );
        let empty = term.match_expressions.as_ref().is_none_or(Vec::is_empty)
            && term.match_fields.as_ref().is_none_or(Vec::is_empty);
        terms.push(if empty {
            // An empty term matches no node (the API's rule), not every node.
            Requirements::new().with(Requirement::one_of(
                EMPTY_TERM_KEY,
                std::iter::empty::<&str>(),
            ))
        } else {
            Requirements::from_node_selector_term(term).map_err(|e| FieldError::new(field, e))?
        });
    }
    Ok(NodeRequirements::new(selector, terms))
}

/// The key of the requirement an empty required node-affinity term stands for: no node
/// has a value in an empty set of it, so the term matches none.
pub const EMPTY_TERM_KEY: &str = "tailor.sh/empty-node-selector-term";

/// The pod's preferred node-affinity terms with their weights (1-100), heaviest first,
/// for the scheduler to honour while it can and relax one at a time when it cannot.
pub fn preferred_node_terms(spec: &PodSpec) -> Result<Vec<(i32, Requirements)>, FieldError> {
    let preferred = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        });
    let mut out = Vec::new();
    for (i, p) in preferred
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let field = format!(
            "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[{i}].preference"
        );
        out.push((
            p.weight,
            Requirements::from_node_selector_term(&p.preference)
                .map_err(|e| FieldError::new(field, e))?,
        ));
    }
    // Stable: equal weights keep their written order.
    out.sort_by_key(|p| std::cmp::Reverse(p.0));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(name: &str, cpu: &str, memory: &str) -> Container {
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements {
                requests: Some(
                    [("cpu", cpu), ("memory", memory)]
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn app_containers_add_and_init_containers_take_the_max() {
        let spec = PodSpec {
            containers: vec![
                container("a", "200m", "256Mi"),
                container("b", "300m", "256Mi"),
            ],
            init_containers: Some(vec![container("init", "1", "64Mi")]),
            ..Default::default()
        };
        let r = pod_requests(&spec).expect("valid pod");
        assert_eq!((r.cpu, r.memory, r.pods), (1000, 512 << 20, 1));
    }

    #[test]
    fn native_sidecars_add_to_the_running_pod() {
        let mut sidecar = container("proxy", "100m", "128Mi");
        sidecar.restart_policy = Some("Always".into());
        let spec = PodSpec {
            containers: vec![container("app", "500m", "512Mi")],
            init_containers: Some(vec![sidecar, container("migrate", "1", "128Mi")]),
            ..Default::default()
        };
        let r = pod_requests(&spec).expect("valid pod");
        // Init peak: migrate (1 core) + proxy (100m); running: app + proxy = 600m.
        assert_eq!(r.cpu, 1100);
        assert_eq!(r.memory, 640 << 20);
    }

    #[test]
    fn limits_without_requests_become_requests_and_overhead_is_added() {
        let mut c = container("a", "100m", "64Mi");
        let res = c.resources.as_mut().expect("set above");
        res.requests = None;
        res.limits = Some(BTreeMap::from([("cpu".to_string(), Quantity("2".into()))]));
        let spec = PodSpec {
            containers: vec![c],
            overhead: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity("100Mi".into()),
            )])),
            ..Default::default()
        };
        let r = pod_requests(&spec).expect("valid pod");
        assert_eq!((r.cpu, r.memory), (2000, 100 << 20));
    }

    #[test]
    fn node_selector_and_required_affinity_terms_combine() {
        let yaml = "nodeSelector: {kubernetes.io/os: linux}\n\
                    affinity:\n  nodeAffinity:\n    requiredDuringSchedulingIgnoredDuringExecution:\n      \
                    nodeSelectorTerms:\n      - matchExpressions: [{key: kubernetes.io/arch, operator: In, values: [arm64]}]\n      \
                    - matchExpressions: [{key: karpenter.sh/capacity-type, operator: In, values: [spot]}]\n    \
                    preferredDuringSchedulingIgnoredDuringExecution:\n    \
                    - {weight: 10, preference: {matchExpressions: [{key: topology.kubernetes.io/zone, operator: In, values: [eastus-1]}]}}\n    \
                    - {weight: 50, preference: {matchExpressions: [{key: tailor.sh/sku-family, operator: In, values: [E]}]}}\n\
                    containers: []\n";
        let spec: PodSpec = serde_yaml::from_str(yaml).expect("valid spec");
        let reqs = node_requirements(&spec).expect("valid");
        assert_eq!(reqs.alternatives().len(), 2);
        assert!(
            reqs.alternatives()
                .iter()
                .all(|a| a.get("kubernetes.io/os").is_some())
        );
        assert!(
            reqs.alternatives()[1]
                .get("tailor.sh/capacity-type")
                .is_some()
        );
        let preferred = preferred_node_terms(&spec).expect("valid");
        assert_eq!(
            preferred.iter().map(|p| p.0).collect::<Vec<_>>(),
            vec![50, 10]
        );
    }

    #[test]
    fn an_empty_required_term_matches_no_node_and_leaves_the_other_terms() {
        let parse = |terms: &str| {
            let yaml = format!(
                "affinity:\n  nodeAffinity:\n    requiredDuringSchedulingIgnoredDuringExecution:\n      nodeSelectorTerms: {terms}\ncontainers: []\n"
            );
            let spec: PodSpec = serde_yaml::from_str(&yaml).expect("valid spec");
            node_requirements(&spec).expect("valid")
        };
        let node = |arch: &str| {
            BTreeMap::from([
                ("kubernetes.io/arch".to_string(), arch.to_string()),
                ("kubernetes.io/hostname".to_string(), "n1".to_string()),
            ])
        };
        let pool = Requirements::new().with(Requirement::one_of(
            "kubernetes.io/arch",
            ["amd64", "arm64"],
        ));
        let empty = parse("[{}]");
        assert!(!empty.admits_labels(&node("amd64")));
        assert!(empty.matches_labels(&node("amd64")).is_err());
        assert!(empty.compatible(&pool).is_err());
        assert!(!parse("[{matchExpressions: [], matchFields: []}]").admits_labels(&node("arm64")));
        // ORed with a real term, only that term counts.
        let one = parse(
            "[{}, {matchExpressions: [{key: kubernetes.io/arch, operator: In, values: [arm64]}]}]",
        );
        assert!(one.admits_labels(&node("arm64")));
        assert!(!one.admits_labels(&node("amd64")));
        assert!(one.compatible(&pool).is_ok());
    }

    #[test]
    fn an_invalid_affinity_operator_names_the_term() {
        let yaml = "affinity:\n  nodeAffinity:\n    requiredDuringSchedulingIgnoredDuringExecution:\n      \
                    nodeSelectorTerms:\n      - matchExpressions: [{key: a, operator: Near, values: [b]}]\ncontainers: []\n";
        let spec: PodSpec = serde_yaml::from_str(yaml).expect("valid spec");
        let err = node_requirements(&spec).expect_err("bad operator");
        assert!(err.field.ends_with("nodeSelectorTerms[0]"), "{}", err.field);
        assert!(err.to_string().contains("\"Near\""));
    }

    #[test]
    fn a_bad_quantity_names_the_container_field() {
        let spec = PodSpec {
            containers: vec![
                container("a", "100m", "64Mi"),
                container("b", "lots", "1Gi"),
            ],
            ..Default::default()
        };
        let err = pod_requests(&spec).expect_err("bad cpu");
        assert_eq!(err.field, "spec.containers[1].resources.requests");
        assert!(err.to_string().contains("\"lots\""));
    }
}
