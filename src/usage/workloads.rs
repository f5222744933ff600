//! Which workload a pod belongs to: its top owner (a Deployment rather than its
//! ReplicaSet, a CronJob rather than its Job), including pods that no longer exist and are
//! known only by name from the usage history.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::state::Snapshot;

/// A workload: its kind, namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct Workload {
    /// Namespace.
    pub namespace: String,
    /// Kind: Deployment, StatefulSet, DaemonSet, Job, CronJob, ReplicaSet or Pod.
    pub kind: String,
    /// Name.
    pub name: String,
}

/// The snapshot's workloads with their pod templates, and what each pod name maps to.
#[derive(Debug, Default)]
pub struct Workloads {
    /// Pod template spec per workload (current requests and limits come from here).
    pub templates: BTreeMap<Workload, PodSpec>,
    by_pod: BTreeMap<(String, String), Workload>,
    replica_sets: BTreeMap<(String, String), Workload>,
    jobs: BTreeMap<(String, String), Workload>,
    names: BTreeMap<(String, String), BTreeSet<Workload>>,
}

fn is_suffix(s: &str, len: std::ops::RangeInclusive<usize>) -> bool {
    len.contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
}

impl Workloads {
    fn add(&mut self, kind: &str, meta: &ObjectMeta, spec: Option<&PodSpec>) {
        let wl = Workload {
            namespace: meta
                .namespace
                .clone()
                .unwrap_or_else(|| "default".to_string()),
            kind: kind.to_string(),
            name: meta.name.clone().unwrap_or_default(),
        };
        if let Some(spec) = spec {
            self.templates.insert(wl.clone(), spec.clone());
        }
        self.names
            .entry((wl.namespace.clone(), wl.name.clone()))
            .or_default()
            .insert(wl);
    }

    /// Indexes a snapshot's workloads and pods.
    pub fn from_snapshot(s: &Snapshot) -> Self {
        let mut w = Workloads::default();
        let ns = |m: &ObjectMeta| m.namespace.clone().unwrap_or_else(|| "default".to_string());
        let name = |m: &ObjectMeta| m.name.clone().unwrap_or_default();
        for d in &s.deployments {
            w.add(
                "Deployment",
                &d.metadata,
                d.spec.as_ref().and_then(|s| s.template.spec.as_ref()),
            );
        }
        for d in &s.stateful_sets {
            w.add(
                "StatefulSet",
                &d.metadata,
                d.spec.as_ref().and_then(|s| s.template.spec.as_ref()),
            );
        }
        for d in &s.daemon_sets {
            w.add(
                "DaemonSet",
                &d.metadata,
                d.spec.as_ref().and_then(|s| s.template.spec.as_ref()),
            );
        }
        for j in &s.jobs {
            let owner = j
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.kind == "CronJob")
                .map(|o| Workload {
                    namespace: ns(&j.metadata),
                    kind: "CronJob".to_string(),
                    name: o.name.clone(),
                });
            let spec = j.spec.as_ref().and_then(|s| s.template.spec.as_ref());
            match owner {
                Some(cron) => {
                    if let Some(spec) = spec {
                        w.templates
                            .entry(cron.clone())
                            .or_insert_with(|| spec.clone());
                    }
                    w.jobs.insert((ns(&j.metadata), name(&j.metadata)), cron);
                }
                None => {
                    w.add("Job", &j.metadata, spec);
                    w.jobs.insert(
                        (ns(&j.metadata), name(&j.metadata)),
                        Workload {
                            namespace: ns(&j.metadata),
                            kind: "Job".to_string(),
                            name: name(&j.metadata),
                        },
                    );
                }
            }
        }
        for rs in &s.replica_sets {
            let owner = rs
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.kind == "Deployment")
                .map(|o| Workload {
                    namespace: ns(&rs.metadata),
                    kind: "Deployment".to_string(),
                    name: o.name.clone(),
                })
                .unwrap_or_else(|| Workload {
                    namespace: ns(&rs.metadata),
                    kind: "ReplicaSet".to_string(),
                    name: name(&rs.metadata),
                });
            if owner.kind == "ReplicaSet"
                && let Some(spec) = rs
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.as_ref())
                    .and_then(|t| t.spec.as_ref())
            {
                w.templates.insert(owner.clone(), spec.clone());
            }
            w.replica_sets
                .insert((ns(&rs.metadata), name(&rs.metadata)), owner);
        }
        for p in &s.pods {
            let key = (ns(&p.metadata), name(&p.metadata));
            let owner = p
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true))
                .or_else(|| p.metadata.owner_references.iter().flatten().next());
            let wl = match owner {
                Some(o) if o.kind == "ReplicaSet" => w
                    .replica_sets
                    .get(&(key.0.clone(), o.name.clone()))
                    .cloned(),
                Some(o) if o.kind == "Job" => w.jobs.get(&(key.0.clone(), o.name.clone())).cloned(),
                Some(o) => Some(Workload {
                    namespace: key.0.clone(),
                    kind: o.kind.clone(),
                    name: o.name.clone(),
                }),
                None => None,
            }
            .unwrap_or_else(|| Workload {
                namespace: key.0.clone(),
                kind: "Pod".to_string(),
                name: key.1.clone(),
            });
            if let Some(spec) = &p.spec {
                w.templates
                    .entry(wl.clone())
                    .or_insert_with(|| spec.clone());
            }
            w.by_pod.insert(key, wl);
        }
        w
    }

    /// The workload of a pod: from the snapshot when the pod is listed, else from its name
    /// as the controllers form it (`<deployment>-<hash>-<5 chars>`, `<statefulset>-<n>`,
    /// `<job>-<5 chars>`, `<daemonset>-<5 chars>`), matched against known workloads.
    pub fn of_pod(&self, namespace: &str, pod: &str) -> Option<Workload> {
        if let Some(w) = self.by_pod.get(&(namespace.to_string(), pod.to_string())) {
            return Some(w.clone());
        }
        let known = |name: &str| {
            self.names
                .get(&(namespace.to_string(), name.to_string()))
                .and_then(|set| set.iter().next().cloned())
        };
        let (head, tail) = pod.rsplit_once('-')?;
        // StatefulSet: <name>-<ordinal>.
        if tail.chars().all(|c| c.is_ascii_digit())
            && let Some(w) = known(head).filter(|w| w.kind == "StatefulSet")
        {
            return Some(w);
        }
        if is_suffix(tail, 5..=5) {
            // <replicaset>-<5>: a ReplicaSet we know, or <deployment>-<hash>.
            if let Some(w) = self
                .replica_sets
                .get(&(namespace.to_string(), head.to_string()))
            {
                return Some(w.clone());
            }
            if let Some(w) = self.jobs.get(&(namespace.to_string(), head.to_string())) {
                return Some(w.clone());
            }
            if let Some((deploy, hash)) = head.rsplit_once('-')
                && is_suffix(hash, 6..=10)
                && let Some(w) = known(deploy).filter(|w| w.kind == "Deployment")
            {
                return Some(w);
            }
            if let Some(w) = known(head).filter(|w| w.kind == "DaemonSet" || w.kind == "Job") {
                return Some(w);
            }
        }
        None
    }

    /// A container of a workload's template.
    pub fn container(&self, workload: &Workload, name: &str) -> Option<&Container> {
        self.templates
            .get(workload)?
            .containers
            .iter()
            .find(|c| c.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SNAPSHOT: &str = "
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: app, image: i}]}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: shop}
spec:
  replicas: 1
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec: {containers: [{name: postgres, image: i}]}
---
apiVersion: apps/v1
kind: ReplicaSet
metadata:
  name: web-5d8f7c9b4
  namespace: shop
  ownerReferences: [{apiVersion: apps/v1, kind: Deployment, name: web, uid: u, controller: true}]
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: app, image: i}]}
---
apiVersion: v1
kind: Pod
metadata:
  name: web-5d8f7c9b4-abcde
  namespace: shop
  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: web-5d8f7c9b4, uid: u, controller: true}]
spec: {containers: [{name: app, image: i}]}
---
apiVersion: v1
kind: Pod
metadata: {name: debug, namespace: shop}
spec: {containers: [{name: shell, image: i}]}
";

    fn workloads() -> Workloads {
        Workloads::from_snapshot(&Snapshot::from_yaml("w.yaml", SNAPSHOT).expect("parses"))
    }

    fn wl(kind: &str, name: &str) -> Option<Workload> {
        Some(Workload {
            namespace: "shop".into(),
            kind: kind.into(),
            name: name.into(),
        })
    }

    #[test]
    fn listed_pods_resolve_to_their_top_owner() {
        let w = workloads();
        assert_eq!(
            w.of_pod("shop", "web-5d8f7c9b4-abcde"),
            wl("Deployment", "web")
        );
        assert_eq!(w.of_pod("shop", "debug"), wl("Pod", "debug"));
        assert!(
            w.container(
                &Workload {
                    namespace: "shop".into(),
                    kind: "Deployment".into(),
                    name: "web".into()
                },
                "app"
            )
            .is_some()
        );
    }

    #[test]
    fn pods_gone_from_the_cluster_resolve_by_name() {
        let w = workloads();
        // An older ReplicaSet's pod: <deployment>-<hash>-<suffix>.
        assert_eq!(
            w.of_pod("shop", "web-7f9c8d6b5-xyz12"),
            wl("Deployment", "web")
        );
        assert_eq!(w.of_pod("shop", "db-3"), wl("StatefulSet", "db"));
        assert_eq!(w.of_pod("shop", "unknown-abc12"), None);
        assert_eq!(w.of_pod("other", "web-7f9c8d6b5-xyz12"), None);
    }
}
