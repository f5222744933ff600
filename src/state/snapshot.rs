//! Loading a cluster snapshot from YAML.
//!
//! Accepts multi-document files and `kind: List` files (as `kubectl get ... -o yaml`
//! writes them), mixed freely. Every document is validated up front: a bad document is
//! an error naming the file, the document (and list item) index, the object's kind and
//! name, and the field, and nothing is loaded. Unknown kinds are skipped with a warning.
//! Workloads whose pods are not all listed are expanded into pending pods, so a scenario
//! can say "a Deployment of 500 replicas" without listing 500 pods; commands that do
//! not place pods (right-sizing) load without expanding.
//!
//! Input is bounded before it can exhaust memory: nesting deeper than
//! [`MAX_YAML_DEPTH`] is refused before parsing, and a snapshot holds at most
//! [`MAX_PODS_PER_SNAPSHOT`] pods, listed and expanded together.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStatus, Node, PersistentVolume, PersistentVolumeClaim, Pod, PodSpec,
    PodStatus, PodTemplateSpec,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::de::DeserializeOwned;

use crate::apis::labels;
use crate::apis::{AKSNodeClass, NodeClaim, NodePool, Recommendation, RightsizingPolicy};
use crate::model::pod::{node_requirements, parse_quantities, pod_requests, preferred_node_terms};

/// Most pods a snapshot may hold, listed and expanded from workloads together.
/// Kubernetes supports at most 150,000 pods per cluster; a workload asking for more
/// (`replicas: 2147483647`) is refused instead of expanded.
pub const MAX_PODS_PER_SNAPSHOT: usize = 150_000;

/// The fewest list items one core parses on its own: below this, handing items to another
/// core costs more than it saves.
const ITEMS_PER_RUN: usize = 256;

/// Deepest nesting of YAML collections accepted. Kubernetes objects nest about 15 levels
/// (a pod template's affinity terms in a `kind: List`); the YAML parser's own limit is 128
/// but it reaches it in quadratic time, so deeper documents are refused by a linear scan
/// first.
pub const MAX_YAML_DEPTH: usize = 100;

/// Whether loading adds pending pods for workload replicas that have no pod listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingPods {
    /// Add them (commands that place pods: `simulate`, disruption).
    Expand,
    /// Leave them out (right-sizing reads workload templates, not replicas).
    Skip,
}

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
    /// A document nests collections deeper than [`MAX_YAML_DEPTH`].
    #[error(
        "{file}: at line {line}: invalid YAML: collections nested {depth} deep, more than the \
         {MAX_YAML_DEPTH} levels accepted (Kubernetes objects nest far less)"
    )]
    TooDeep {
        /// The file name.
        file: String,
        /// 1-based line where the limit was crossed.
        line: usize,
        /// Nesting reached there.
        depth: usize,
    },
    /// A file or directory holds no object at all.
    #[error("{path}: {what}; a snapshot needs at least one Kubernetes object")]
    Empty {
        /// The file or directory.
        path: PathBuf,
        /// What was found instead.
        what: &'static str,
    },
    /// Workloads ask for more pods than a snapshot may hold.
    #[error(
        "{object}: field {field}: {replicas} replicas would bring the snapshot to more than \
         {limit} pods (Kubernetes supports at most 150,000 pods per cluster)"
    )]
    TooManyPods {
        /// `Kind namespace/name` of the workload that crossed the limit.
        object: String,
        /// The field that asks for the replicas.
        field: &'static str,
        /// Replicas it asks for.
        replicas: i64,
        /// [`MAX_PODS_PER_SNAPSHOT`].
        limit: usize,
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
    pub pods: Vec<std::sync::Arc<Pod>>,
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
    /// PersistentVolumeClaims: where a pod's volumes let it run.
    pub persistent_volume_claims: Vec<PersistentVolumeClaim>,
    /// PersistentVolumes.
    pub persistent_volumes: Vec<PersistentVolume>,
    /// StorageClasses.
    pub storage_classes: Vec<StorageClass>,
    /// Whether the claims, volumes and classes above are the cluster's: always in the
    /// agent; in a snapshot file, when it holds any of them. Without them a pod's volumes
    /// are not looked at (a snapshot of pods alone cannot say where their disks are).
    pub storage_read: bool,
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
    /// and `.yml` files in name order), expanding workloads into pending pods.
    pub fn load(paths: &[PathBuf]) -> Result<Self> {
        Self::load_with(paths, PendingPods::Expand)
    }

    /// Reads and merges snapshot files; `pending` says whether workloads are expanded
    /// into pending pods. A file without any document, or a directory without any YAML
    /// file, is an error: it is almost always a wrong path, not an empty cluster.
    pub fn load_with(paths: &[PathBuf], pending: PendingPods) -> Result<Self> {
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
                if found.is_empty() {
                    return Err(SnapshotError::Empty {
                        path: path.clone(),
                        what: "no .yaml or .yml file in this directory",
                    });
                }
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
            texts.push((path.clone(), text));
        }
        let mut snapshot = Snapshot::default();
        for (path, text) in &texts {
            let documents = snapshot.add_yaml(&path.display().to_string(), text)?;
            if documents == 0 {
                return Err(SnapshotError::Empty {
                    path: path.clone(),
                    what: "no YAML document in this file",
                });
            }
        }
        snapshot.finish(pending)?;
        Ok(snapshot)
    }

    /// Parses one YAML text. `file` names it in errors.
    pub fn from_yaml(file: &str, text: &str) -> Result<Self> {
        Self::from_yaml_files([(file, text)])
    }

    /// Parses one YAML text; `pending` says whether workloads are expanded into pending
    /// pods. `file` names it in errors.
    pub fn from_yaml_with(file: &str, text: &str, pending: PendingPods) -> Result<Self> {
        let mut snapshot = Snapshot::default();
        snapshot.add_yaml(file, text)?;
        snapshot.finish(pending)?;
        Ok(snapshot)
    }

    /// Parses several YAML texts into one snapshot; all or nothing.
    pub fn from_yaml_files<'a, I>(files: I) -> Result<Self>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let mut snapshot = Snapshot::default();
        for (file, text) in files {
            snapshot.add_yaml(file, text)?;
        }
        snapshot.finish(PendingPods::Expand)?;
        Ok(snapshot)
    }

    /// Adds the documents of one YAML text; returns how many were not empty.
    fn add_yaml(&mut self, file: &str, text: &str) -> Result<usize> {
        // Two read-only passes over the text, one per core.
        let (depth, list) = rayon::join(|| check_depth(text), || split_list(text));
        depth.map_err(|(line, depth)| SnapshotError::TooDeep {
            file: file.to_string(),
            line,
            depth,
        })?;
        if let Some(list) = list
            && let Some(added) = self.add_list_text(file, &list)
        {
            return added.map(|()| 1);
        }
        let mut documents = 0;
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
            documents += 1;
            self.add_document(Origin { file, index }, value)?;
        }
        Ok(documents)
    }

    /// Adds the items of a `kind: List` text cut by [`split_list`], parsing one item at a
    /// time. `None` when the cut pieces do not parse on their own (an alias to an anchor
    /// in another item, a quoted scalar running into the next item, a header that is not a
    /// list): the caller then parses the document whole, so the answer, or the parser's
    /// error, is the same as without the cut. Nothing is added unless every item is.
    fn add_list_text(&mut self, file: &str, list: &ListText<'_>) -> Option<Result<()>> {
        use rayon::prelude::*;
        let header: serde_yaml::Value = serde_yaml::from_str(&list.header).ok()?;
        let kind = header.get("kind")?.as_str()?;
        let items_empty =
            matches!(header.get("items"), Some(serde_yaml::Value::Sequence(s)) if s.is_empty());
        if !kind.ends_with("List") || !items_empty {
            return None;
        }
        let item_kind = list_item_kind(kind);
        // Items parse independently: runs of them go to every core, and their parts are
        // joined in order. The outcome is the sequential one: the first run that does not
        // read whole decides it, as its first item would have read one after the other.
        let run = ITEMS_PER_RUN.max(list.items.len().div_ceil(rayon::current_num_threads()));
        let parts: Vec<Option<Result<Snapshot>>> = list
            .items
            .par_chunks(run)
            .enumerate()
            .map(|(r, texts)| {
                let mut part = Snapshot::default();
                for (j, text) in texts.iter().enumerate() {
                    let serde_yaml::Value::Sequence(mut one) = serde_yaml::from_str(text).ok()?
                    else {
                        return None;
                    };
                    if one.len() != 1 {
                        return None;
                    }
                    let origin = Origin {
                        file,
                        index: format!("1 item {}", r * run + j + 1),
                    };
                    if let Err(e) = part.add_list_item(origin, item_kind, one.pop()?) {
                        return Some(Err(e));
                    }
                }
                Some(Ok(part))
            })
            .collect();
        let mut joined = Snapshot::default();
        for part in parts {
            match part? {
                Ok(part) => joined.append(part),
                Err(e) => return Some(Err(e)),
            }
        }
        self.append(joined);
        Some(Ok(()))
    }

    /// Moves every object and warning of `other` to the end of this snapshot's.
    fn append(&mut self, other: Snapshot) {
        let Snapshot {
            mut pods,
            mut nodes,
            mut daemon_sets,
            mut deployments,
            mut stateful_sets,
            mut replica_sets,
            mut jobs,
            mut pod_disruption_budgets,
            mut persistent_volume_claims,
            mut persistent_volumes,
            mut storage_classes,
            storage_read,
            mut horizontal_pod_autoscalers,
            mut node_pools,
            mut node_claims,
            mut node_classes,
            mut rightsizing_policies,
            mut recommendations,
            mut warnings,
        } = other;
        self.pods.append(&mut pods);
        self.nodes.append(&mut nodes);
        self.daemon_sets.append(&mut daemon_sets);
        self.deployments.append(&mut deployments);
        self.stateful_sets.append(&mut stateful_sets);
        self.replica_sets.append(&mut replica_sets);
        self.jobs.append(&mut jobs);
        self.pod_disruption_budgets
            .append(&mut pod_disruption_budgets);
        self.persistent_volume_claims
            .append(&mut persistent_volume_claims);
        self.persistent_volumes.append(&mut persistent_volumes);
        self.storage_classes.append(&mut storage_classes);
        self.storage_read |= storage_read;
        self.horizontal_pod_autoscalers
            .append(&mut horizontal_pod_autoscalers);
        self.node_pools.append(&mut node_pools);
        self.node_claims.append(&mut node_claims);
        self.node_classes.append(&mut node_classes);
        self.rightsizing_policies.append(&mut rightsizing_policies);
        self.recommendations.append(&mut recommendations);
        self.warnings.append(&mut warnings);
    }

    /// Adds one item of a list; typed lists (`PodList`) may omit the kind on items.
    fn add_list_item(
        &mut self,
        origin: Origin<'_>,
        item_kind: Option<&str>,
        mut item: serde_yaml::Value,
    ) -> Result<()> {
        if let (Some(k), serde_yaml::Value::Mapping(m)) = (item_kind, &mut item)
            && !m.contains_key("kind")
        {
            m.insert("kind".into(), k.into());
        }
        self.add_document(origin, item)
    }

    /// Expands workloads when asked and checks the snapshot's size.
    fn finish(&mut self, pending: PendingPods) -> Result<()> {
        if self.pods.len() > MAX_PODS_PER_SNAPSHOT {
            return Err(SnapshotError::TooManyPods {
                object: "the snapshot's listed Pods".to_string(),
                field: "items",
                replicas: self.pods.len() as i64,
                limit: MAX_PODS_PER_SNAPSHOT,
            });
        }
        match pending {
            PendingPods::Expand => self.expand_workloads(),
            PendingPods::Skip => Ok(()),
        }
    }

    /// Builds a snapshot from objects read elsewhere (e.g. listed from the API server),
    /// validated like file documents; `source` and each object's label name it in errors.
    pub fn from_objects(
        source: &str,
        objects: impl IntoIterator<Item = (String, serde_yaml::Value)>,
        pending: PendingPods,
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
        snapshot.finish(pending)?;
        Ok(snapshot)
    }

    fn add_document(&mut self, origin: Origin<'_>, mut value: serde_yaml::Value) -> Result<()> {
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
            // Taken, not cloned: a list of 20,000 pods is most of the snapshot's memory.
            let items = match value.get_mut("items").map(std::mem::take) {
                Some(serde_yaml::Value::Sequence(items)) => items,
                Some(serde_yaml::Value::Null) | None => Vec::new(),
                Some(_) => return Err(object_error(&origin, &kind, "items", "must be a list")),
            };
            drop(value);
            let item_kind = list_item_kind(&kind);
            for (j, item) in items.into_iter().enumerate() {
                let item_origin = Origin {
                    file: origin.file,
                    index: format!("{} item {}", origin.index, j + 1),
                };
                self.add_list_item(item_origin, item_kind, item)?;
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
                let mut pod: Pod = decode(o, obj, value)?;
                check_pod_spec(o, obj, "", pod.spec.as_ref())?;
                trim_pod(&mut pod);
                self.pods.push(std::sync::Arc::new(pod));
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
                let replicas = d.spec.as_ref().and_then(|s| s.replicas);
                check_non_negative(o, obj, "spec.replicas", replicas)?;
                self.deployments.push(d);
            }
            ("StatefulSet", false) => {
                let s: StatefulSet = decode(o, obj, value)?;
                check_template(o, obj, s.spec.as_ref().map(|s| &s.template))?;
                let replicas = s.spec.as_ref().and_then(|s| s.replicas);
                check_non_negative(o, obj, "spec.replicas", replicas)?;
                self.stateful_sets.push(s);
            }
            ("ReplicaSet", false) => {
                let rs: ReplicaSet = decode(o, obj, value)?;
                check_template(o, obj, rs.spec.as_ref().and_then(|s| s.template.as_ref()))?;
                let replicas = rs.spec.as_ref().and_then(|s| s.replicas);
                check_non_negative(o, obj, "spec.replicas", replicas)?;
                self.replica_sets.push(rs);
            }
            ("Job", false) => {
                let j: Job = decode(o, obj, value)?;
                check_template(o, obj, j.spec.as_ref().map(|s| &s.template))?;
                let spec = j.spec.as_ref();
                check_non_negative(o, obj, "spec.parallelism", spec.and_then(|s| s.parallelism))?;
                check_non_negative(o, obj, "spec.completions", spec.and_then(|s| s.completions))?;
                self.jobs.push(j);
            }
            ("PodDisruptionBudget", false) => {
                let pdb: PodDisruptionBudget = decode(o, obj, value)?;
                check_pdb(o, obj, &pdb)?;
                self.pod_disruption_budgets.push(pdb);
            }
            ("PersistentVolumeClaim", false) => {
                self.persistent_volume_claims.push(decode(o, obj, value)?);
                self.storage_read = true;
            }
            ("PersistentVolume", false) => {
                self.persistent_volumes.push(decode(o, obj, value)?);
                self.storage_read = true;
            }
            ("StorageClass", false) if api_version == "storage.k8s.io/v1" => {
                self.storage_classes.push(decode(o, obj, value)?);
                self.storage_read = true;
            }
            ("HorizontalPodAutoscaler", false) if api_version == "autoscaling/v2" => {
                self.horizontal_pod_autoscalers.push(decode(o, obj, value)?);
            }
            ("NodePool", true) => {
                let value = checked_tailor(o, obj, &kind, value)?;
                let np: NodePool = decode(o, obj, value)?;
                check_quantities(o, obj, "spec.limits", Some(&np.spec.limits))?;
                self.node_pools.push(np);
            }
            ("NodeClaim", true) => {
                let value = checked_tailor(o, obj, &kind, value)?;
                self.node_claims.push(decode(o, obj, value)?);
            }
            ("AKSNodeClass", true) => {
                let value = checked_tailor(o, obj, &kind, value)?;
                self.node_classes.push(decode(o, obj, value)?);
            }
            ("RightsizingPolicy", true) => {
                let value = checked_tailor(o, obj, &kind, value)?;
                self.rightsizing_policies.push(decode(o, obj, value)?);
            }
            ("Recommendation", true) => {
                let value = checked_tailor(o, obj, &kind, value)?;
                self.recommendations.push(decode(o, obj, value)?);
            }
            _ => self.warnings.push(format!(
                "{}: document {}: skipped {object} ({api_version}): not a kind Tailor reads",
                origin.file, origin.index
            )),
        }
        Ok(())
    }

    /// Adds pending pods for workload replicas that have no pod in the snapshot, up to
    /// [`MAX_PODS_PER_SNAPSHOT`] pods in all.
    fn expand_workloads(&mut self) -> Result<()> {
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

        // (kind, the field that asks, metadata, template, replicas)
        type Wanted = (&'static str, &'static str, ObjectMeta, PodTemplateSpec, i64);
        let mut wanted: Vec<Wanted> = Vec::new();
        for d in &self.deployments {
            if let Some(spec) = &d.spec {
                wanted.push((
                    "Deployment",
                    "spec.replicas",
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
                    "spec.replicas",
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
                    "spec.replicas",
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
                wanted.push((
                    "Job",
                    "spec.parallelism",
                    j.metadata.clone(),
                    spec.template.clone(),
                    remaining,
                ));
            }
        }
        for (kind, field, meta, template, replicas) in wanted {
            let key = (kind.to_string(), namespace(&meta), name(&meta));
            let have = listed.get(&key).copied().unwrap_or(0);
            let missing = replicas - have;
            if missing <= 0 {
                continue;
            }
            // Checked before any pod is built: the bound is what keeps a huge replica
            // count from exhausting memory.
            if self.pods.len() as i64 + missing > MAX_PODS_PER_SNAPSHOT as i64 {
                return Err(SnapshotError::TooManyPods {
                    object: format!("{kind} {}/{}", key.1, key.2),
                    field,
                    replicas,
                    limit: MAX_PODS_PER_SNAPSHOT,
                });
            }
            for i in have..replicas {
                self.pods
                    .push(std::sync::Arc::new(pending_pod(kind, &meta, &template, i)));
            }
            self.warnings.push(format!(
                "{kind} {}/{}: {missing} of {replicas} replica(s) have no pod in the snapshot; added as pending",
                key.1, key.2
            ));
        }
        Ok(())
    }
}

/// A count the API server requires to be at least zero (replicas, parallelism), with
/// its message.
fn check_non_negative(
    origin: &Origin<'_>,
    object: &str,
    field: &str,
    value: Option<i32>,
) -> Result<()> {
    match value {
        Some(v) if v < 0 => Err(object_error(
            origin,
            object,
            field,
            format!("Invalid value: {v}: must be greater than or equal to 0"),
        )),
        _ => Ok(()),
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
        Some(spec) => {
            pod_requests(spec)
                .map(|_| ())
                .and_then(|()| node_requirements(spec).map(|_| ()))
                .and_then(|()| preferred_node_terms(spec).map(|_| ()))
                .map_err(|e| {
                    object_error(origin, object, &format!("{prefix}{}", e.field), e.source)
                })?;
            check_ports(origin, object, &format!("{prefix}spec."), spec)
        }
    }
}

/// Checks the ports of every container as the API server does: a container port must be
/// 1-65535, a host port 0 (none) or 1-65535.
fn check_ports(origin: &Origin<'_>, object: &str, prefix: &str, spec: &PodSpec) -> Result<()> {
    let groups = [
        ("containers", Some(&spec.containers)),
        ("initContainers", spec.init_containers.as_ref()),
    ];
    for (list, containers) in groups {
        for (i, c) in containers.into_iter().flatten().enumerate() {
            for (j, port) in c.ports.iter().flatten().enumerate() {
                let values = [
                    ("containerPort", Some(port.container_port)),
                    ("hostPort", port.host_port.filter(|p| *p != 0)),
                ];
                for (field, value) in values {
                    if let Some(v) = value
                        && !(1..=65535).contains(&v)
                    {
                        return Err(object_error(
                            origin,
                            object,
                            &format!("{prefix}{list}[{i}].ports[{j}].{field}"),
                            format!("Invalid value: {v}: must be between 1 and 65535, inclusive"),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Checks a PodDisruptionBudget's `minAvailable` and `maxUnavailable` as the API server
/// does: a count of at least 0 or a percentage up to 100%, and not both.
fn check_pdb(origin: &Origin<'_>, object: &str, pdb: &PodDisruptionBudget) -> Result<()> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let Some(spec) = &pdb.spec else {
        return Ok(());
    };
    if spec.min_available.is_some() && spec.max_unavailable.is_some() {
        return Err(object_error(
            origin,
            object,
            "spec",
            "Invalid value: minAvailable and maxUnavailable cannot be both set",
        ));
    }
    for (field, value) in [
        ("spec.minAvailable", &spec.min_available),
        ("spec.maxUnavailable", &spec.max_unavailable),
    ] {
        let message = match value {
            Some(IntOrString::Int(v)) if *v < 0 => {
                format!("Invalid value: {v}: must be greater than or equal to 0")
            }
            Some(IntOrString::String(s)) => match s.strip_suffix('%').map(str::parse::<u32>) {
                Some(Ok(p)) if p <= 100 => continue,
                Some(Ok(_)) => format!("Invalid value: {s:?}: must not be greater than 100%"),
                _ => format!("Invalid value: {s:?}: must be an integer or percentage (e.g '5%')"),
            },
            _ => continue,
        };
        return Err(object_error(origin, object, field, message));
    }
    Ok(())
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

/// A Tailor object as the Tailor kind, checked against its CRD's schema as the API server
/// would check it on create.
fn checked_tailor(
    origin: &Origin<'_>,
    object: &str,
    kind: &str,
    value: serde_yaml::Value,
) -> Result<serde_yaml::Value> {
    let value = as_tailor(value);
    // A value that is not JSON-like (a non-string key) is left for decoding to refuse.
    if let Ok(json) = serde_json::to_value(&value) {
        crate::apis::schema::validate(kind, &json)
            .map_err(|v| object_error(origin, object, &v.field, v.message))?;
    }
    Ok(value)
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

/// Drops the parts of a validated pod that no decision reads: volumes, container
/// statuses, managed fields, and each container's environment, probes, mounts, hooks and
/// command line. A pod read from `kubectl get -o yaml` is mostly these, and a large
/// cluster's snapshot holds tens of thousands of pods (`Volume` alone is kilobytes per
/// entry in memory). Kept: metadata, scheduling fields, resources, ports, conditions.
fn trim_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    if let Some(spec) = pod.spec.as_mut() {
        crate::state::keep_claim_volumes(spec);
        let containers = spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten());
        for c in containers {
            c.env = None;
            c.env_from = None;
            c.liveness_probe = None;
            c.readiness_probe = None;
            c.startup_probe = None;
            c.volume_mounts = None;
            c.volume_devices = None;
            c.lifecycle = None;
            c.command = None;
            c.args = None;
        }
        spec.ephemeral_containers = None;
    }
    if let Some(status) = pod.status.as_mut() {
        // Of the containers' statuses only an OOM kill is read (right-sizing bumps the
        // container's memory): kept, with its name and termination, for those containers.
        let oom_killed = |s: Option<ContainerState>| {
            s.filter(|s| {
                s.terminated
                    .as_ref()
                    .is_some_and(|t| t.reason.as_deref() == Some("OOMKilled"))
            })
        };
        let kept: Vec<ContainerStatus> = status
            .container_statuses
            .take()
            .into_iter()
            .flatten()
            .filter_map(|c| {
                let last_state = oom_killed(c.last_state);
                let state = oom_killed(c.state);
                (last_state.is_some() || state.is_some()).then(|| ContainerStatus {
                    name: c.name,
                    last_state,
                    state,
                    restart_count: c.restart_count,
                    ..ContainerStatus::default()
                })
            })
            .collect();
        status.container_statuses = (!kept.is_empty()).then_some(kept);
        status.init_container_statuses = None;
        status.ephemeral_container_statuses = None;
    }
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
        self.pods.iter().map(|p| &**p).filter(|p| {
            let bound = p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !bound && !matches!(phase, Some("Succeeded" | "Failed"))
        })
    }

    /// Pods bound to `node`.
    pub fn pods_on<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a Pod> + 'a {
        self.pods
            .iter()
            .map(|p| &**p)
            .filter(move |p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
    }

    /// Loads a snapshot file at `path`, a convenience for one file.
    pub fn load_file(path: &Path) -> Result<Self> {
        Self::load(&[path.to_path_buf()])
    }
}

/// The kind of a typed list's items (`Pod` for `PodList`); none for `List`.
fn list_item_kind(list_kind: &str) -> Option<&str> {
    list_kind.strip_suffix("List").filter(|k| !k.is_empty())
}

/// A one-document list text, as `kubectl get -o yaml` writes it, cut into its header and
/// its items' texts.
///
/// The YAML parser holds every event of a document before it builds anything, so a
/// 20,000-pod list read whole costs more than ten times its size; read one item at a
/// time it costs its objects. The cut is made on lines only: a line at the sequence's
/// indentation that starts with `- ` begins an item, and YAML lets nothing inside an
/// item (block scalars, continued plain scalars) be that little indented, so each piece
/// is that item's text.
#[derive(Debug)]
struct ListText<'a> {
    /// The document with `items: []` in place of its items.
    header: String,
    /// Each item's lines, from its `- ` to the line before the next item's.
    items: Vec<&'a str>,
}

/// Cuts `text` as [`ListText`] describes, or `None` when it is not one document with a
/// block sequence under a top-level `items:` line (more documents, directives, tabs
/// before content, anything unusual): such texts are parsed whole.
fn split_list(text: &str) -> Option<ListText<'_>> {
    enum At {
        Header,
        ItemsKey,
        Items { indent: usize, start: usize },
        Trailer,
    }
    let mut at = At::Header;
    let mut header = String::new();
    let mut items = Vec::new();
    let mut content_seen = false;
    let mut started = false;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let body = line.trim_end_matches(['\n', '\r']);
        let rest = body.trim_start_matches(' ');
        let indent = body.len() - rest.len();
        let blank = rest.is_empty() || rest.starts_with('#');
        if rest.starts_with('\t') {
            return None;
        }
        if body.starts_with("---") || body.starts_with("...") || body.starts_with('%') {
            // Only one document start, before any content, keeps this one document.
            if content_seen || started || body.trim_end() != "---" {
                return None;
            }
            started = true;
            header.push_str(line);
            continue;
        }
        content_seen |= !blank;
        match at {
            At::Header => {
                if body.trim_end() == "items:" {
                    header.push_str("items: []\n");
                    at = At::ItemsKey;
                } else {
                    header.push_str(line);
                }
            }
            At::ItemsKey => {
                if blank {
                    continue;
                }
                if rest != "-" && !rest.starts_with("- ") {
                    return None;
                }
                at = At::Items { indent, start };
            }
            At::Items {
                indent: items_indent,
                start: item_start,
            } => {
                if blank || indent > items_indent {
                    continue;
                }
                if indent == items_indent && (rest == "-" || rest.starts_with("- ")) {
                    items.push(&text[item_start..start]);
                    at = At::Items {
                        indent: items_indent,
                        start,
                    };
                } else if indent == 0 && !rest.starts_with('-') {
                    // The next top-level key: the items end here.
                    items.push(&text[item_start..start]);
                    header.push_str(line);
                    at = At::Trailer;
                } else {
                    return None;
                }
            }
            At::Trailer => header.push_str(line),
        }
    }
    match at {
        At::Items { start, .. } => items.push(&text[start..]),
        At::Trailer => {}
        At::Header | At::ItemsKey => return None,
    }
    Some(ListText { header, items })
}

/// Scans a YAML text in one pass for collections nested deeper than [`MAX_YAML_DEPTH`]:
/// block nesting from indentation and `- `/`? ` markers, flow nesting from brackets
/// outside quoted scalars and comments. Flow nesting (`[[[[...`, the cheap way to nest
/// 100,000 levels in a small file) is counted exactly; block nesting is estimated from
/// indentation, which may count a sequence written at its key's indentation once for two
/// levels, but deep block nesting needs quadratically long lines, so the file size
/// bounds it. Returns the 1-based line and depth of the first line too deep.
fn check_depth(text: &str) -> std::result::Result<(), (usize, usize)> {
    // Indentation of the open block collections.
    let mut indents: Vec<usize> = Vec::new();
    // Depth of the block node a flow collection opened in, and open flow collections.
    let mut flow_base = 0;
    let mut flow = 0usize;
    // Inside a quoted scalar of a flow collection (it may span lines).
    let mut quote: Option<char> = None;
    // Lines more indented than this belong to a literal or folded block scalar.
    let mut block_scalar: Option<usize> = None;
    for (n, line) in text.lines().enumerate() {
        let too_deep = |depth: usize| {
            if depth > MAX_YAML_DEPTH {
                Err((n + 1, depth))
            } else {
                Ok(())
            }
        };
        let indent = line.len() - line.trim_start_matches([' ', '\t']).len();
        let mut rest = &line[indent..];
        if flow == 0 {
            if let Some(parent) = block_scalar {
                if rest.is_empty() || indent > parent {
                    continue;
                }
                block_scalar = None;
            }
            if rest.is_empty() || rest.starts_with('#') {
                continue;
            }
            if indent == 0 && (rest.starts_with("---") || rest.starts_with("...")) {
                indents.clear();
                rest = rest[3..].trim_start();
                if rest.is_empty() {
                    continue;
                }
            }
            while indents.last().is_some_and(|&i| i > indent) {
                indents.pop();
            }
            if indents.last() != Some(&indent) {
                indents.push(indent);
            }
            let mut markers = 0;
            loop {
                if rest.starts_with("- ") || rest.starts_with("? ") {
                    markers += 1;
                    rest = rest[2..].trim_start_matches([' ', '\t']);
                } else if rest == "-" || rest == "?" {
                    markers += 1;
                    rest = "";
                } else {
                    break;
                }
            }
            let depth = indents.len() + markers;
            too_deep(depth)?;
            // The node's value: the rest itself, or what follows `key: `.
            let value = if rest.starts_with(['[', '{']) {
                rest
            } else {
                rest.find(": ")
                    .map_or("", |i| rest[i + 2..].trim_start_matches([' ', '\t']))
            };
            if value.starts_with(['|', '>']) {
                block_scalar = Some(indent);
                continue;
            }
            if !value.starts_with(['[', '{']) {
                continue;
            }
            flow_base = depth;
            rest = value;
        }
        // Flow context: count brackets outside quoted scalars and comments.
        let mut previous = ' ';
        let mut chars = rest.chars().peekable();
        while let Some(c) = chars.next() {
            match quote {
                Some('"') => {
                    if c == '\\' {
                        chars.next();
                    } else if c == '"' {
                        quote = None;
                    }
                }
                Some(_) => {
                    if c == '\'' {
                        if chars.peek() == Some(&'\'') {
                            chars.next();
                        } else {
                            quote = None;
                        }
                    }
                }
                None => match c {
                    '"' | '\'' if matches!(previous, ' ' | '\t' | '[' | '{' | ',' | ':') => {
                        quote = Some(c);
                    }
                    '#' if matches!(previous, ' ' | '\t') => break,
                    '[' | '{' => {
                        flow += 1;
                        too_deep(flow_base + flow)?;
                    }
                    ']' | '}' => {
                        flow = flow.saturating_sub(1);
                        if flow == 0 {
                            break; // back to block context; the rest is the same node
                        }
                    }
                    _ => {}
                },
            }
            previous = c;
        }
    }
    Ok(())
}
