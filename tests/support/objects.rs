//! Objects the end-to-end and the simulated-cluster tests both create.

#![allow(dead_code)] // each test binary uses part of it

/// A pool that consolidates at once, one node at a time at most 100% of the pool.
pub const EAGER_POOL: &str = r#"
apiVersion: tailor.sh/v1alpha1
kind: AKSNodeClass
metadata: {name: default}
spec: {imageFamily: AzureLinux}
---
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata: {name: default}
spec:
  template:
    spec:
      requirements:
      - {key: tailor.sh/sku-family, operator: In, values: [D]}
      - {key: tailor.sh/capacity-type, operator: In, values: [on-demand]}
      - {key: kubernetes.io/arch, operator: In, values: [amd64]}
      nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}
  disruption:
    consolidationPolicy: WhenEmptyOrUnderutilized
    consolidateAfter: 0s
    budgets: [{nodes: "100%"}]
"#;

/// A Deployment labelled `app: NAME`, of `replicas` pods of one container requesting `cpu`
/// and `memory`, in `default`; `extra_spec` is appended to the pod spec (indented six spaces).
pub fn deployment(name: &str, replicas: i32, cpu: &str, memory: &str, extra_spec: &str) -> String {
    deployment_in("default", name, replicas, cpu, memory, extra_spec)
}

/// [`deployment`] in `namespace`.
pub fn deployment_in(
    namespace: &str,
    name: &str,
    replicas: i32,
    cpu: &str,
    memory: &str,
    extra_spec: &str,
) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {namespace}, labels: {{app: {name}}}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
      - name: app
        image: registry.example/{name}:1
        resources: {{requests: {{cpu: "{cpu}", memory: "{memory}"}}}}
{extra_spec}
"#
    )
}
