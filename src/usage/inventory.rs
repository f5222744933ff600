//! What Prometheus remembers of a cluster over a window, for the cost report: each
//! container's requests and usage per step (kube-state-metrics and cadvisor), the workload
//! each pod belonged to, and each node's instance type and NodePool. Pods and nodes long
//! gone are included: the history is the inventory.
//!
//! Series read (kube-state-metrics 2.x names; node labels need its
//! `--metric-labels-allowlist=nodes=[...]`):
//! - `kube_pod_container_resource_requests` and `..._limits` (`resource` cpu/memory,
//!   `node`),
//! - `kube_pod_owner`, `kube_replicaset_owner`, `kube_job_owner`,
//! - `kube_node_labels` (`label_node_kubernetes_io_instance_type`,
//!   `label_tailor_sh_nodepool` else `label_karpenter_sh_nodepool` else
//!   `label_kubernetes_azure_com_agentpool`, `label_tailor_sh_capacity_type` else
//!   `label_karpenter_sh_capacity_type`),
//! - cadvisor's `container_cpu_usage_seconds_total` and `container_memory_working_set_bytes`
//!   under the configured label names.

use std::collections::BTreeMap;

use super::prometheus::{Labels, PrometheusSource};
use super::{ContainerKey, UsageError};

/// One sample of one container per evaluation step: the value at the step's end time
/// stands for the `step` seconds before it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerSamples {
    /// Namespace per row.
    pub namespace: Vec<String>,
    /// Pod per row.
    pub pod: Vec<String>,
    /// Container per row.
    pub container: Vec<String>,
    /// Evaluation time per row, unix seconds.
    pub time: Vec<i64>,
    /// Value per row.
    pub value: Vec<f64>,
}

impl ContainerSamples {
    fn push(&mut self, key: &ContainerKey, time: i64, value: f64) {
        self.namespace.push(key.namespace.clone());
        self.pod.push(key.pod.clone());
        self.container.push(key.container.clone());
        self.time.push(time);
        self.value.push(value);
    }

    /// Rows.
    pub fn len(&self) -> usize {
        self.time.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.time.is_empty()
    }
}

/// Requests per container and step, with the node the pod ran on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestSamples {
    /// Namespace per row.
    pub namespace: Vec<String>,
    /// Pod per row.
    pub pod: Vec<String>,
    /// Container per row.
    pub container: Vec<String>,
    /// Node per row.
    pub node: Vec<String>,
    /// Evaluation time per row, unix seconds.
    pub time: Vec<i64>,
    /// Requested cores per row (0 when not set).
    pub cpu_cores: Vec<f64>,
    /// Requested bytes per row (0 when not set).
    pub memory_bytes: Vec<f64>,
}

impl RequestSamples {
    /// Rows.
    pub fn len(&self) -> usize {
        self.time.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.time.is_empty()
    }
}

/// Requests and limits of a container, cores and bytes (`None`: not set).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Resources {
    /// CPU request, cores.
    pub cpu_request: Option<f64>,
    /// Memory request, bytes.
    pub memory_request: Option<f64>,
    /// CPU limit, cores.
    pub cpu_limit: Option<f64>,
    /// Memory limit, bytes.
    pub memory_limit: Option<f64>,
    /// Unix second of the newest request sample.
    pub at: i64,
}

/// A node's facts from its labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// ARM size (`node.kubernetes.io/instance-type`), empty when not exported.
    pub instance_type: String,
    /// NodePool (Tailor's, Karpenter's, or the AKS agent pool), empty when none.
    pub node_pool: String,
    /// `spot` or `on-demand`.
    pub capacity_type: String,
}

/// The top owner of a pod: (kind, name).
pub type Owner = (String, String);

/// Everything the cost report reads.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    /// Requests per container and step.
    pub requests: RequestSamples,
    /// CPU cores used per container and step (rate over the step).
    pub cpu_used: ContainerSamples,
    /// Memory working set per container and step (mean over the step), bytes.
    pub memory_used: ContainerSamples,
    /// The top owner of each pod, by (namespace, pod); bare pods are absent.
    pub owners: BTreeMap<(String, String), Owner>,
    /// The newest requests and limits of each container.
    pub latest: BTreeMap<ContainerKey, Resources>,
    /// Node facts by node name.
    pub nodes: BTreeMap<String, NodeFacts>,
    /// Queries issued.
    pub queries: usize,
}

/// What to read.
#[derive(Debug, Clone, PartialEq)]
pub struct InventoryQuery {
    /// Namespaces; empty: all.
    pub namespaces: Vec<String>,
    /// First evaluation, unix seconds (the window's start plus one step).
    pub start: i64,
    /// Last evaluation, unix seconds.
    pub end: i64,
    /// Seconds between evaluations; each value covers the step before it.
    pub step: i64,
}

fn escape_regex(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push_str("\\\\");
        }
        if c == '"' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn label<'a>(labels: &'a Labels, name: &str) -> &'a str {
    labels.get(name).map_or("", String::as_str)
}

fn first_label<'a>(labels: &'a Labels, names: &[&str]) -> &'a str {
    names
        .iter()
        .map(|n| label(labels, n))
        .find(|v| !v.is_empty())
        .unwrap_or("")
}

/// Reads the inventory of the window from Prometheus. Nothing is returned on a failed
/// query: no report rests on part of the data.
pub async fn read(source: &PrometheusSource, q: &InventoryQuery) -> Result<Inventory, UsageError> {
    let names = source.labels().clone();
    let ns_filter = |label: &str| {
        if q.namespaces.is_empty() {
            String::new()
        } else {
            let alternatives: Vec<String> = q.namespaces.iter().map(|n| escape_regex(n)).collect();
            format!(",{label}=~\"{}\"", alternatives.join("|"))
        }
    };
    let ksm_ns = ns_filter("namespace");
    let cad_ns = ns_filter(&names.namespace);
    let window = q.end - q.start + q.step;
    let step = q.step;
    let mut inv = Inventory::default();

    // Requests: the value at each step, by container and node.
    let requests = source
        .query_range(
            &format!(
                "max by (namespace, pod, container, node, resource) \
                 (kube_pod_container_resource_requests{{resource=~\"cpu|memory\"{ksm_ns}}})"
            ),
            q.start,
            q.end,
            step,
        )
        .await?;
    let mut rows: BTreeMap<(ContainerKey, String, i64), (f64, f64)> = BTreeMap::new();
    for (labels, samples) in &requests {
        let key = ContainerKey {
            namespace: label(labels, "namespace").to_string(),
            pod: label(labels, "pod").to_string(),
            container: label(labels, "container").to_string(),
        };
        let node = label(labels, "node").to_string();
        let cpu = label(labels, "resource") == "cpu";
        for (t, v) in samples {
            let row = rows.entry((key.clone(), node.clone(), *t)).or_default();
            if cpu {
                row.0 = *v;
            } else {
                row.1 = *v;
            }
            let latest = inv.latest.entry(key.clone()).or_default();
            latest.at = latest.at.max(*t);
            if cpu {
                latest.cpu_request = Some(*v);
            } else {
                latest.memory_request = Some(*v);
            }
        }
    }
    for ((key, node, t), (cpu, memory)) in rows {
        let r = &mut inv.requests;
        r.namespace.push(key.namespace);
        r.pod.push(key.pod);
        r.container.push(key.container);
        r.node.push(node);
        r.time.push(t);
        r.cpu_cores.push(cpu);
        r.memory_bytes.push(memory);
    }

    // Limits: only the newest matter (they keep their ratio to the requests).
    let limits = source
        .query_instant(
            &format!(
                "max by (namespace, pod, container, resource) (last_over_time(\
                 kube_pod_container_resource_limits{{resource=~\"cpu|memory\"{ksm_ns}}}[{window}s]))"
            ),
            q.end,
        )
        .await?;
    for (labels, v) in &limits {
        let key = ContainerKey {
            namespace: label(labels, "namespace").to_string(),
            pod: label(labels, "pod").to_string(),
            container: label(labels, "container").to_string(),
        };
        if let Some(latest) = inv.latest.get_mut(&key) {
            if label(labels, "resource") == "cpu" {
                latest.cpu_limit = Some(*v);
            } else {
                latest.memory_limit = Some(*v);
            }
        }
    }

    // Usage over each step, summed over cadvisor's duplicate series of a container.
    let by = format!("{}, {}, {}", names.namespace, names.pod, names.container);
    let containers = format!(
        "{}!=\"\",{}!=\"POD\"{cad_ns}",
        names.container, names.container
    );
    let usage_key = |labels: &Labels| ContainerKey {
        namespace: label(labels, &names.namespace).to_string(),
        pod: label(labels, &names.pod).to_string(),
        container: label(labels, &names.container).to_string(),
    };
    for (samples, promql) in [
        (
            &mut inv.cpu_used,
            format!(
                "sum by ({by}) (rate(container_cpu_usage_seconds_total{{{containers}}}[{step}s]))"
            ),
        ),
        (
            &mut inv.memory_used,
            format!(
                "sum by ({by}) (avg_over_time(container_memory_working_set_bytes{{{containers}}}[{step}s]))"
            ),
        ),
    ] {
        for (labels, points) in source.query_range(&promql, q.start, q.end, step).await? {
            let key = usage_key(&labels);
            for (t, v) in points {
                samples.push(&key, t, v);
            }
        }
    }

    // Owners over the whole window: pods, their ReplicaSets and Jobs.
    let over_window = |metric: &str| {
        format!(
            "max_over_time({metric}{{{}}}[{window}s])",
            &ksm_ns.trim_start_matches(',')
        )
    };
    let pod_owners = source
        .query_instant(&over_window("kube_pod_owner"), q.end)
        .await?;
    let rs_owners = source
        .query_instant(&over_window("kube_replicaset_owner"), q.end)
        .await?;
    let job_owners = source
        .query_instant(&over_window("kube_job_owner"), q.end)
        .await?;
    let mut parent: BTreeMap<(String, String, String), Owner> = BTreeMap::new();
    for (labels, _) in &rs_owners {
        let kind = label(labels, "owner_kind");
        if kind == "Deployment" {
            parent.insert(
                (
                    label(labels, "namespace").to_string(),
                    "ReplicaSet".to_string(),
                    label(labels, "replicaset").to_string(),
                ),
                (kind.to_string(), label(labels, "owner_name").to_string()),
            );
        }
    }
    for (labels, _) in &job_owners {
        let kind = label(labels, "owner_kind");
        if kind == "CronJob" {
            parent.insert(
                (
                    label(labels, "namespace").to_string(),
                    "Job".to_string(),
                    label(labels, "job_name").to_string(),
                ),
                (kind.to_string(), label(labels, "owner_name").to_string()),
            );
        }
    }
    for (labels, _) in &pod_owners {
        let kind = label(labels, "owner_kind");
        let name = label(labels, "owner_name");
        // kube-state-metrics writes `<none>` for a pod without an owner.
        if kind.is_empty() || kind == "<none>" || name.is_empty() || name == "<none>" {
            continue;
        }
        let ns = label(labels, "namespace").to_string();
        let owner = parent
            .get(&(ns.clone(), kind.to_string(), name.to_string()))
            .cloned()
            .unwrap_or_else(|| (kind.to_string(), name.to_string()));
        inv.owners
            .insert((ns, label(labels, "pod").to_string()), owner);
    }

    // Nodes: size, pool and capacity type from their labels.
    let nodes = source
        .query_instant(
            &format!("max_over_time(kube_node_labels[{window}s])"),
            q.end,
        )
        .await?;
    for (labels, _) in &nodes {
        let node = label(labels, "node");
        if node.is_empty() {
            continue;
        }
        let facts = NodeFacts {
            instance_type: first_label(
                labels,
                &[
                    "label_node_kubernetes_io_instance_type",
                    "label_beta_kubernetes_io_instance_type",
                ],
            )
            .to_string(),
            node_pool: first_label(
                labels,
                &[
                    "label_tailor_sh_nodepool",
                    "label_karpenter_sh_nodepool",
                    "label_kubernetes_azure_com_agentpool",
                ],
            )
            .to_string(),
            capacity_type: match first_label(
                labels,
                &[
                    "label_tailor_sh_capacity_type",
                    "label_karpenter_sh_capacity_type",
                    "label_kubernetes_azure_com_scalesetpriority",
                ],
            ) {
                "spot" => "spot".to_string(),
                _ => "on-demand".to_string(),
            },
        };
        // A node relabelled in the window keeps the facts it had last seen with a size.
        let entry = inv.nodes.entry(node.to_string()).or_default();
        if entry.instance_type.is_empty() || !facts.instance_type.is_empty() {
            *entry = facts;
        }
    }
    inv.queries = 8;
    Ok(inv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_names_are_escaped_for_a_regex_matcher() {
        assert_eq!(escape_regex("a.b"), "a\\\\.b");
        assert_eq!(escape_regex("x\"y"), "x\\\"y");
    }
}
