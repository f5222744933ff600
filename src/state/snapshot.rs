//! Loading a cluster snapshot from YAML.
//!
//! Accepts multi-document files and `kind: List` files (as `kubectl get ... -o yaml`
//! writes them), mixed freely. Every document is validated up front: a bad document is
//! an error naming the file, the document (and list item) index, the object's kind and
//! name, and the field, and nothing is loaded. Unknown kinds are skipped with a warning.
//! Workloads whose pods are not all listed are expanded into pending pods, so a scenario
//! can say "a Deployment of 500 replicas" without listing 500 pods.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod, PodSpec, PodStatus, PodTemplateSpec};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::de::DeserializeOwned;

use crate::apis::labels;
use crate::apis::{AKSNodeClass, NodeClaim, NodePool, Recommendation, RightsizingPolicy};
use crate::model::pod::{node_requirements, parse_quantities, pod_requests, preferred_node_terms};

/// Why a snapshot could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// A snapshot file could not be read.
    #[error("reading snapshot {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A document is not valid YAML.
    #[error("{file}: document {index}: invalid YAML: {message}")]
    Yaml {
        /// The file name.
        file: String,
        /// 1-based document index.
        index: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A document is valid YAML but not a valid object of its kind.
    #[error("{file}: document {index} ({object}): field {field}: {message}")]
    Object {
        /// The file name.
        file: String,
        /// 1-based document index, with the list item for `kind: List` files.
        index: String,
        /// `Kind namespace/name` of the object.
        object: String,
        /// Dotted path of the offending field.
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// Result alias for snapshot loading.
pub type Result<T> = std::result::Result<T, SnapshotError>;

/// The Kubernetes and Tailor objects of one cluster at one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Pods: bound, pending, and pending ones expanded from workloads.
    pub pods: Vec<Pod>,
    /// Nodes.
    pub nodes: Vec<Node>,
    /// DaemonSets (their pods run on every eligible node, including new ones).
    pub daemon_sets: Vec<DaemonSet>,
    /// Deployments.
    pub deployments: Vec<Deployment>,
    /// StatefulSets.
    pub stateful_sets: Vec<StatefulSet>,
    /// ReplicaSets.
    pub replica_sets: Vec<ReplicaSet>,
    /// Jobs.
    pub jobs: Vec<Job>,
    /// PodDisruptionBudgets.
    pub pod_disruption_budgets: Vec<PodDisruptionBudget>,
    /// HorizontalPodAutoscalers (autoscaling/v2).
    pub horizontal_pod_autoscalers: Vec<HorizontalPodAutoscaler>,
    /// Tailor NodePools.
    pub node_pools: Vec<NodePool>,
    /// Tailor NodeClaims.
    pub node_claims: Vec<NodeClaim>,
    /// AKSNodeClasses.
    pub node_classes: Vec<AKSNodeClass>,
    /// RightsizingPolicies.
    pub rightsizing_policies: Vec<RightsizingPolicy>,
    /// Recommendations.
    pub recommendations: Vec<Recommendation>,
    /// What was skipped or assumed while loading, for the user to see.
    pub warnings: Vec<String>,
}

/// Where a document came from, for error messages.
#[derive(Clone)]
struct Origin<'a> {
    file: &'a str,
    index: String,
}

fn object_name(kind: &str, value: &serde_yaml::Value) -> String {
    let meta = value.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(|n| n.as_str())
        .unwrap_or("<unnamed>");
    match meta
        .and_then(|m| m.get("namespace"))
        .and_then(|n| n.as_str())
    {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

fn object_error(
    origin: &Origin<'_>,
    object: &str,
    field: &str,
    message: impl fmt::Display,
) -> SnapshotError {
    SnapshotError::Object {
        file: origin.file.to_string(),
        index: origin.index.clone(),
        object: object.to_string(),
        field: if field.is_empty() || field == "." {
            "(document)".to_string()
        } else {
            field.to_string()
        },
        message: message.to_string(),
    }
}

fn decode<T: DeserializeOwned>(
    origin: &Origin<'_>,
    object: &str,
    value: serde_yaml::Value,
) -> Result<T> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let field = e.path().to_string();
        object_error(origin, object, &field, e.into_inner())
    })
}

impl Snapshot {
    /// Reads and merges snapshot files (directories are read one level deep, `.yaml`
    /// and `.yml` files in name order).
    pub fn load(paths: &[PathBuf]) -> Result<Self> {
        let mut files = Vec::new();
        for path in paths {
            if path.is_dir() {
                let entries = std::fs::read_dir(path).map_err(|source| SnapshotError::Read {
                    path: path.clone(),
                    source,
                })?;
                let mut found: Vec<PathBuf> = entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                    .collect();
                found.sort();
                files.extend(found);
            } else {
                files.push(path.clone());
            }
        }
        let mut texts = Vec::with_capacity(files.len());
        for path in &files {
            let text = std::fs::read_to_string(path).map_err(|source| SnapshotError::Read {
                path: path.clone(),
                source,
            })?;
            texts.push((path.display().to_string(), text));
        }
        Self::from_yaml_files(texts.iter().map(|(f, t)| (f.as_str(), t.as_str())))
    }

    /// Parses one YAML text. `file` names it in errors.
    pub fn from_yaml(file: &str, text: &str) -> Result<Self> {
        Self::from_yaml_files([(file, text)])
    }

    /// Parses several YAML texts into one snapshot; all or nothing.
    pub fn from_yaml_files<'a, I>(files: I) -> Result<Self>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let mut snapshot = Snapshot::default();
        for (file, text) in files {
            for (i, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
                let index = (i + 1).to_string();
                let value: serde_yaml::Value =
                    serde::Deserialize::deserialize(document).map_err(|e| SnapshotError::Yaml {
                        file: file.to_string(),
                        index: index.clone(),
                        message: e.to_string(),
                    })?;
                if value.is_null() {
                    continue; // empty document, e.g. a trailing `---`
                }
                snapshot.add_document(Origin { file, index }, value)?;
            }
        }
        snapshot.expand_workloads();
        Ok(snapshot)
    }

    /// Builds a snapshot from objects read elsewhere (e.g. listed from the API server),
    /// validated like file documents; `source` and each object's label name it in errors.
    pub fn from_objects(
        source: &str,
        objects: impl IntoIterator<Item = (String, serde_yaml::Value)>,
    ) -> Result<Self> {
        let mut snapshot = Snapshot::default();
        for (index, value) in objects {
            snapshot.add_document(
                Origin {
                    file: source,
                    index,
                },
                value,
            )?;
        }
        snapshot.expand_workloads();
        Ok(snapshot)
    }

    fn add_document(&mut self, origin: Origin<'_>, value: serde_yaml::Value) -> Result<()> {
        let kind = value
            .get("kind")
            .and_then(|k| k.as_str())
            .ok_or_else(|| {
                object_error(
                    &origin,
                    "object without kind",
                    "kind",
                    "missing or not a string",
                )
            })?
            .to_string();
        if kind == "List" || (kind.ends_with("List") && value.get("items").is_some()) {
            let items = match value.get("items") {
                Some(serde_yaml::Value::Sequence(items)) => items.clone(),
                Some(serde_yaml::Value::Null) | None => Vec::new(),
                Some(_) => return Err(object_error(&origin, &kind, "items", "must be a list")),
            };
            let item_kind = kind
                .strip_suffix("List")
                .filter(|k| !k.is_empty())
                .map(str::to_string);
            for (j, mut item) in items.into_iter().enumerate() {
                // Typed lists (`PodList`) may omit kind on items.
                if let (Some(k), serde_yaml::Value::Mapping(m)) = (&item_kind, &mut item)
                    && !m.contains_key("kind")
                {
                    m.insert("kind".into(), k.clone().into());
                }
                let item_origin = Origin {
                    file: origin.file,
                    index: format!("{} item {}", origin.index, j + 1),
                };
                self.add_document(item_origin, item)?;
            }
            return Ok(());
        }
        let api_version = value
            .get("apiVersion")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        let object = object_name(&kind, &value);
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        let tailor_group = matches!(
            group,
            labels::GROUP | "karpenter.sh" | "karpenter.azure.com"
        );
        let o = &origin;
        let obj = object.as_str();
        match (kind.as_str(), tailor_group) {
            ("Pod", false) => {
                let pod: Pod = decode(o, obj, value)?;
                check_pod_spec(o, obj, "", pod.spec.as_ref())?;
                self.pods.push(pod);
            }
            ("Node", false) => {
                let node: Node = decode(o, obj, value)?;
                let status = node.status.as_ref();
                check_quantities(
                    o,
                    obj,
                    "status.capacity",
                    status.and_then(|s| s.capacity.as_ref()),
                )?;
                check_quantities(
                    o,
                    obj,
                    "status.allocatable",
                    status.and_then(|s| s.allocatable.as_ref()),
                )?;
                self.nodes.push(node);
            }
            ("DaemonSet", false) => {
                let ds: DaemonSet = decode(o, obj, value)?;
                check_template(o, obj, ds.spec.as_ref().map(|s| &s.template))?;
                self.daemon_sets.push(ds);
            }
            ("Deployment", false) => {
                let d: Deployment = decode(o, obj, value)?;
                check_template(o, obj, d.spec.as_ref().map(|s| &s.template))?;
                self.deployments.push(d);
            }
            ("StatefulSet", false) => {
                let s: StatefulSet = decode(o, obj, value)?;
                check_template(o, obj, s.spec.as_ref().map(|s| &s.template))?;
                self.stateful_sets.push(s);
            }
            ("ReplicaSet", false) => {
                let rs: ReplicaSet = decode(o, obj, value)?;
                check_template(o, obj, rs.spec.as_ref().and_then(|s| s.template.as_ref()))?;
                self.replica_sets.push(rs);
            }
            ("Job", false) => {
                let j: Job = decode(o, obj, value)?;
                check_template(o, obj, j.spec.as_ref().map(|s| &s.template))?;
                self.jobs.push(j);
            }
            ("PodDisruptionBudget", false) => {
                self.pod_disruption_budgets.push(decode(o, obj, value)?);
            }
            ("HorizontalPodAutoscaler", false) if api_version == "autoscaling/v2" => {
                self.horizontal_pod_autoscalers.push(decode(o, obj, value)?);
            }
            ("NodePool", true) => {
                let np: NodePool = decode(o, obj, as_tailor(value))?;
                check_quantities(o, obj, "spec.limits", Some(&np.spec.limits))?;
                self.node_pools.push(np);
            }
            ("NodeClaim", true) => self.node_claims.push(decode(o, obj, as_tailor(value))?),
            ("AKSNodeClass", true) => self.node_classes.push(decode(o, obj, as_tailor(value))?),
            ("RightsizingPolicy", true) => {
                self.rightsizing_policies
                    .push(decode(o, obj, as_tailor(value))?);
            }
            ("Recommendation", true) => {
                self.recommendations.push(decode(o, obj, as_tailor(value))?);
            }
            _ => self.warnings.push(format!(
                "{}: document {}: skipped {object} ({api_version}): not a kind Tailor reads",
                origin.file, origin.index
            )),
        }
        Ok(())
    }

    /// Adds pending pods for workload replicas that have no pod in the snapshot.
    fn expand_workloads(&mut self) {
        // Count listed pods per controlling owner (kind, namespace, name), resolving
        // ReplicaSets to their Deployment.
        let rs_owner: BTreeMap<(String, String), OwnerReference> = self
            .replica_sets
            .iter()
            .filter_map(|rs| {
                let owner = controller_of(&rs.metadata)?.clone();
                Some(((namespace(&rs.metadata), name(&rs.metadata)), owner))
            })
            .collect();
        let mut listed: BTreeMap<(String, String, String), i64> = BTreeMap::new();
        for p in &self.pods {
            if let Some(owner) = controller_of(&p.metadata) {
                let ns = namespace(&p.metadata);
                let top = match owner.kind.as_str() {
                    "ReplicaSet" => rs_owner
                        .get(&(ns.clone(), owner.name.clone()))
                        .filter(|o| o.kind == "Deployment")
                        .map_or(("ReplicaSet", owner.name.clone()), |o| {
                            ("Deployment", o.name.clone())
                        }),
                    other => (other, owner.name.clone()),
                };
                // Pods that already finished do not hold a replica's place.
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                if !matches!(phase, Some("Succeeded" | "Failed")) {
                    *listed.entry((top.0.to_string(), ns, top.1)).or_default() += 1;
                }
            }
        }
        let deployments_here: BTreeSet<(String, String)> = self
            .deployments
            .iter()
            .map(|d| (namespace(&d.metadata), name(&d.metadata)))
            .collect();

        let mut wanted: Vec<(&'static str, ObjectMeta, PodTemplateSpec, i64)> = Vec::new();
        for d in &self.deployments {
            if let Some(spec) = &d.spec {
                wanted.push((
                    "Deployment",
                    d.metadata.clone(),
                    spec.template.clone(),
                    i64::from(spec.replicas.unwrap_or(1)),
                ));
            }
        }
        for s in &self.stateful_sets {
            if let Some(spec) = &s.spec {
                wanted.push((
                    "StatefulSet",
                    s.metadata.clone(),
                    spec.template.clone(),
                    i64::from(spec.replicas.unwrap_or(1)),
                ));
            }
        }
        for rs in &self.replica_sets {
            let owned_by_listed_deployment = controller_of(&rs.metadata).is_some_and(|o| {
                o.kind == "Deployment"
                    && deployments_here.contains(&(namespace(&rs.metadata), o.name.clone()))
            });
            if owned_by_listed_deployment {
                continue; // the Deployment speaks for it
            }
            if let Some(spec) = &rs.spec
                && let Some(template) = &spec.template
            {
                wanted.push((
                    "ReplicaSet",
                    rs.metadata.clone(),
                    template.clone(),
                    i64::from(spec.replicas.unwrap_or(1)),
                ));
            }
        }
        for j in &self.jobs {
            if let Some(spec) = &j.spec {
                let parallelism = i64::from(spec.parallelism.unwrap_or(1));
                let succeeded = i64::from(j.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0));
                let remaining = spec.completions.map_or(parallelism, |c| {
                    (i64::from(c) - succeeded).clamp(0, parallelism)
                });
                wanted.push(("Job", j.metadata.clone(), spec.template.clone(), remaining));
            }
        }
        for (kind, meta, template, replicas) in wanted {
            let key = (kind.to_string(), namespace(&meta), name(&meta));
            let have = listed.get(&key).copied().unwrap_or(0);
            let missing = replicas - have;
            if missing <= 0 {
                continue;
            }
            for i in have..replicas {
                self.pods.push(pending_pod(kind, &meta, &template, i));
            }
            self.warnings.push(format!(
                "{kind} {}/{}: {missing} of {replicas} replica(s) have no pod in the snapshot; added as pending",
                key.1, key.2
            ));
        }
    }
}

fn check_quantities(
    origin: &Origin<'_>,
    object: &str,
    field: &str,
    map: Option<&BTreeMap<String, Quantity>>,
) -> Result<()> {
    parse_quantities(map, field)
        .map(|_| ())
        .map_err(|e| object_error(origin, object, &e.field, e.source))
}

/// Checks every resource quantity of a pod spec, so that a malformed value fails the
/// load instead of a later decision.
fn check_pod_spec(
    origin: &Origin<'_>,
    object: &str,
    prefix: &str,
    spec: Option<&PodSpec>,
) -> Result<()> {
    match spec {
        None => Ok(()),
        Some(spec) => pod_requests(spec)
            .map(|_| ())
            .and_then(|()| node_requirements(spec).map(|_| ()))
            .and_then(|()| preferred_node_terms(spec).map(|_| ()))
            .map_err(|e| object_error(origin, object, &format!("{prefix}{}", e.field), e.source)),
    }
}

fn check_template(
    origin: &Origin<'_>,
    object: &str,
    template: Option<&PodTemplateSpec>,
) -> Result<()> {
    check_pod_spec(
        origin,
        object,
        "spec.template.",
        template.and_then(|t| t.spec.as_ref()),
    )
}

/// Karpenter objects (`karpenter.sh/v1`, `karpenter.azure.com/v1beta1`) are read as the
/// Tailor kinds with the same layout.
fn as_tailor(mut value: serde_yaml::Value) -> serde_yaml::Value {
    if let serde_yaml::Value::Mapping(m) = &mut value {
        m.insert(
            "apiVersion".into(),
            format!("{}/{}", labels::GROUP, labels::VERSION).into(),
        );
    }
    value
}

fn namespace(meta: &ObjectMeta) -> String {
    meta.namespace
        .clone()
        .unwrap_or_else(|| "default".to_string())
}

fn name(meta: &ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    let owners = meta.owner_references.as_ref()?;
    owners
        .iter()
        .find(|o| o.controller == Some(true))
        .or_else(|| owners.first())
}

/// A pending pod standing for replica `ordinal` of a workload.
fn pending_pod(kind: &str, owner: &ObjectMeta, template: &PodTemplateSpec, ordinal: i64) -> Pod {
    let owner_name = name(owner);
    let pod_name = match kind {
        "StatefulSet" => format!("{owner_name}-{ordinal}"),
        _ => format!("{owner_name}-{ordinal:05}"),
    };
    let mut metadata = template.metadata.clone().unwrap_or_default();
    metadata.name = Some(pod_name);
    metadata.namespace = Some(namespace(owner));
    metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(
            labels::SYNTHESIZED_ANNOTATION.to_string(),
            "true".to_string(),
        );
    let api_version = if kind == "Job" { "batch/v1" } else { "apps/v1" };
    metadata.owner_references = Some(vec![OwnerReference {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        name: owner_name,
        uid: owner.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    Pod {
        metadata,
        spec: template.spec.clone(),
        status: Some(PodStatus {
            phase: Some("Pending".to_string()),
            ..Default::default()
        }),
    }
}

/// Helpers for reading pods out of a snapshot.
impl Snapshot {
    /// Pods not bound to a node and not finished: what the provisioner must place.
    pub fn pending_pods(&self) -> impl Iterator<Item = &Pod> {
        self.pods.iter().filter(|p| {
            let bound = p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !bound && !matches!(phase, Some("Succeeded" | "Failed"))
        })
    }

    /// Pods bound to `node`.
    pub fn pods_on<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a Pod> + 'a {
        self.pods
            .iter()
            .filter(move |p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
    }

    /// Loads a snapshot file at `path`, a convenience for one file.
    pub fn load_file(path: &Path) -> Result<Self> {
        Self::load(&[path.to_path_buf()])
    }
}
