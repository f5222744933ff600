//! Peak memory of `tailor simulate` on a large snapshot, as a program:
//! `cargo bench --bench snapshot_memory`.
//!
//! Writes a 20,000-pod cluster as one `kind: List` file the way `kubectl get
//! nodes,pods,deploy,rs -A -o yaml` writes it (about 51 MB: every pod with its status,
//! env, ports, tolerations and projected token volume; 5% of them pending), then runs the
//! release `tailor simulate` on it as a child process and reads the child's peak resident
//! memory from `wait4`. Printed beside it, measured in the same run:
//!
//! - the baseline: the same command on a 200-pod snapshot of the same shape (what the
//!   binary costs before the snapshot's size matters);
//! - the same 20,000 pods parsed as one whole YAML document (the file with a trailing
//!   empty document, which the loader does not cut into items): what reading the file
//!   whole would cost.
//!
//! The target for the 20,000-pod snapshot is 400 MiB. Without `--bench` (as `cargo test
//! --all-targets` runs it) it does a small smoke run with 500 pods.

use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Target peak resident memory of `simulate` on the 20,000-pod snapshot.
const TARGET_MIB: f64 = 400.0;

/// Pods per node the generator places (Standard_D8s_v5 nodes, about a third full).
const PODS_PER_NODE: usize = 30;

/// Every 20th pod is pending: what `simulate` plans.
const PENDING_EVERY: usize = 20;

/// Writes a snapshot of `pods` pods in one `kind: List`, deterministic for a given count.
fn write_snapshot(path: &Path, pods: usize) -> std::io::Result<u64> {
    let mut out = std::io::BufWriter::new(fs::File::create(path)?);
    let mut text = String::with_capacity(1 << 16);
    text.push_str("apiVersion: v1\nitems:\n");
    node_pool(&mut text);
    let nodes = pods.div_ceil(PODS_PER_NODE);
    for n in 0..nodes {
        node(&mut text, n);
        out.write_all(text.as_bytes())?;
        text.clear();
    }
    let mut pod_index = 0;
    let mut deployment = 0;
    while pod_index < pods {
        let replicas = (5 + deployment % 30).min(pods - pod_index);
        let workload = Workload::new(deployment, replicas);
        workload.write(&mut text);
        for replica in 0..replicas {
            workload.pod(&mut text, replica, pod_index);
            pod_index += 1;
            out.write_all(text.as_bytes())?;
            text.clear();
        }
        deployment += 1;
    }
    text.push_str("kind: List\nmetadata:\n  resourceVersion: \"\"\n");
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(fs::metadata(path)?.len())
}

fn node_pool(out: &mut String) {
    out.push_str(
        "- apiVersion: karpenter.sh/v1
  kind: NodePool
  metadata:
    name: default
  spec:
    template:
      spec:
        requirements:
        - key: karpenter.azure.com/sku-family
          operator: In
          values: [D, E, F]
        - key: karpenter.sh/capacity-type
          operator: In
          values: [on-demand]
        nodeClassRef:
          group: karpenter.azure.com
          kind: AKSNodeClass
          name: default
    limits:
      cpu: \"100000\"
    disruption:
      consolidationPolicy: WhenEmptyOrUnderutilized
      consolidateAfter: 1m
- apiVersion: karpenter.azure.com/v1beta1
  kind: AKSNodeClass
  metadata:
    name: default
  spec:
    imageFamily: AzureLinux
    osDiskSizeGB: 128
",
    );
}

fn node_name(n: usize) -> String {
    format!("aks-default-{n:05x}")
}

fn node(out: &mut String, n: usize) {
    let name = node_name(n);
    let zone = n % 3 + 1;
    let _ = write!(
        out,
        r#"- apiVersion: v1
  kind: Node
  metadata:
    annotations:
      node.alpha.kubernetes.io/ttl: "0"
      volumes.kubernetes.io/controller-managed-attach-detach: "true"
    creationTimestamp: "2026-11-20T08:00:00Z"
    labels:
      beta.kubernetes.io/arch: amd64
      beta.kubernetes.io/instance-type: Standard_D8s_v5
      beta.kubernetes.io/os: linux
      failure-domain.beta.kubernetes.io/region: eastus
      failure-domain.beta.kubernetes.io/zone: eastus-{zone}
      karpenter.azure.com/sku-family: D
      karpenter.sh/capacity-type: on-demand
      karpenter.sh/nodepool: default
      kubernetes.io/arch: amd64
      kubernetes.io/hostname: {name}
      kubernetes.io/os: linux
      node.kubernetes.io/instance-type: Standard_D8s_v5
      topology.kubernetes.io/region: eastus
      topology.kubernetes.io/zone: eastus-{zone}
    name: {name}
    resourceVersion: "{rv}"
    uid: 0b6f{n:08x}-1c2d-4e5f-8a9b-0c1d2e3f4a5b
  spec:
    providerID: azure:///subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/mc_rg_cluster_eastus/providers/Microsoft.Compute/virtualMachines/{name}
  status:
    addresses:
    - address: 10.224.{a}.{b}
      type: InternalIP
    - address: {name}
      type: Hostname
    allocatable:
      cpu: 7820m
      ephemeral-storage: "119716326407"
      memory: 28720352Ki
      pods: "110"
    capacity:
      cpu: "8"
      ephemeral-storage: 129886128Ki
      memory: 32863968Ki
      pods: "110"
    conditions:
    - lastHeartbeatTime: "2026-11-29T08:00:00Z"
      lastTransitionTime: "2026-11-20T08:00:00Z"
      message: kubelet has sufficient memory available
      reason: KubeletHasSufficientMemory
      status: "False"
      type: MemoryPressure
    - lastHeartbeatTime: "2026-11-29T08:00:00Z"
      lastTransitionTime: "2026-11-20T08:00:00Z"
      message: kubelet is posting ready status
      reason: KubeletReady
      status: "True"
      type: Ready
    nodeInfo:
      architecture: amd64
      containerRuntimeVersion: containerd://1.7.22-1
      kernelVersion: 5.15.0-1073-azure
      kubeProxyVersion: v1.31.2
      kubeletVersion: v1.31.2
      operatingSystem: linux
      osImage: Ubuntu 22.04.5 LTS
"#,
        rv = 1_000_000 + n,
        a = n / 250,
        b = n % 250 + 4,
    );
}

/// One Deployment with its ReplicaSet; its pods are written one by one.
struct Workload {
    name: String,
    namespace: String,
    hash: String,
    replicas: usize,
    cpu: &'static str,
    memory: &'static str,
}

impl Workload {
    fn new(index: usize, replicas: usize) -> Self {
        const CPU: [&str; 4] = ["50m", "100m", "150m", "200m"];
        const MEMORY: [&str; 4] = ["64Mi", "128Mi", "256Mi", "384Mi"];
        Workload {
            name: format!("svc-{index:04}"),
            namespace: format!("team-{:02}", index % 20),
            // Starts with a letter: an all-digit hash would read back as a YAML integer.
            hash: format!(
                "b{:09x}",
                (index as u64).wrapping_mul(0x9E37_79B9) & 0xf_ffff_ffff
            ),
            replicas,
            cpu: CPU[index % 4],
            memory: MEMORY[(index / 4) % 4],
        }
    }

    fn write(&self, out: &mut String) {
        let Workload {
            name,
            namespace,
            hash,
            replicas,
            cpu,
            memory,
        } = self;
        let template = format!(
            r#"      metadata:
        labels:
          app: {name}
          pod-template-hash: {hash}
      spec:
        containers:
        - image: registry.example.com/{name}:1.4.2
          name: app
          resources:
            requests: {{cpu: {cpu}, memory: {memory}}}
            limits: {{memory: {memory}}}
"#
        );
        let _ = write!(
            out,
            r#"- apiVersion: apps/v1
  kind: Deployment
  metadata:
    name: {name}
    namespace: {namespace}
    uid: d-{hash}
  spec:
    replicas: {replicas}
    selector:
      matchLabels:
        app: {name}
    template:
{template}- apiVersion: apps/v1
  kind: ReplicaSet
  metadata:
    name: {name}-{hash}
    namespace: {namespace}
    ownerReferences:
    - apiVersion: apps/v1
      blockOwnerDeletion: true
      controller: true
      kind: Deployment
      name: {name}
      uid: d-{hash}
    uid: rs-{hash}
  spec:
    replicas: {replicas}
    selector:
      matchLabels:
        app: {name}
        pod-template-hash: {hash}
    template:
{template}"#
        );
    }

    fn pod(&self, out: &mut String, replica: usize, index: usize) {
        let Workload {
            name,
            namespace,
            hash,
            cpu,
            memory,
            ..
        } = self;
        let pending = index % PENDING_EVERY == PENDING_EVERY - 1;
        let suffix = format!("{:05x}", index * 7919 % 0xfffff);
        let node = node_name(index / PODS_PER_NODE);
        let bound = if pending {
            String::new()
        } else {
            format!("    nodeName: {node}\n")
        };
        let status = if pending {
            r#"  status:
    conditions:
    - lastProbeTime: null
      lastTransitionTime: "2026-11-29T08:04:00Z"
      message: '0/667 nodes are available: 667 Insufficient cpu. preemption: 0/667 nodes are available: 667 No preemption victims found for incoming pod.'
      reason: Unschedulable
      status: "False"
      type: PodScheduled
    phase: Pending
    qosClass: Burstable
"#
            .to_string()
        } else {
            format!(
                r#"  status:
    conditions:
    - lastProbeTime: null
      lastTransitionTime: "2026-11-29T08:05:09Z"
      status: "True"
      type: Ready
    - lastProbeTime: null
      lastTransitionTime: "2026-11-29T08:05:00Z"
      status: "True"
      type: PodScheduled
    containerStatuses:
    - containerID: containerd://{suffix}3c5e1f0a9b8c7d6e5f4a3b2c1d0e9f8a
      image: registry.example.com/{name}:1.4.2
      imageID: registry.example.com/{name}@sha256:8f3c2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f
      lastState: {{}}
      name: app
      ready: true
      restartCount: 0
      started: true
      state:
        running:
          startedAt: "2026-11-29T08:05:04Z"
    hostIP: 10.224.0.{host}
    phase: Running
    podIP: 10.244.{a}.{b}
    qosClass: Burstable
    startTime: "2026-11-29T08:05:00Z"
"#,
                host = index / PODS_PER_NODE % 250 + 4,
                a = index / 250 % 250,
                b = index % 250 + 2,
            )
        };
        let _ = write!(
            out,
            r#"- apiVersion: v1
  kind: Pod
  metadata:
    annotations:
      prometheus.io/scrape: "true"
    creationTimestamp: "2026-11-29T08:05:00Z"
    generateName: {name}-{hash}-
    labels:
      app: {name}
      pod-template-hash: {hash}
      team: {namespace}
      version: v1.4.2
    name: {name}-{hash}-{suffix}
    namespace: {namespace}
    ownerReferences:
    - apiVersion: apps/v1
      blockOwnerDeletion: true
      controller: true
      kind: ReplicaSet
      name: {name}-{hash}
      uid: rs-{hash}
    resourceVersion: "{rv}"
    uid: 7c1e{index:08x}-5a6b-4c7d-8e9f-{replica:012x}
  spec:
    containers:
    - env:
      - name: LOG_LEVEL
        value: info
      image: registry.example.com/{name}:1.4.2
      imagePullPolicy: IfNotPresent
      name: app
      ports:
      - containerPort: 8080
        name: http
        protocol: TCP
      resources:
        limits:
          memory: {memory}
        requests:
          cpu: {cpu}
          memory: {memory}
      volumeMounts:
      - mountPath: /var/run/secrets/kubernetes.io/serviceaccount
        name: kube-api-access-{suffix}
        readOnly: true
    dnsPolicy: ClusterFirst
{bound}    priority: 0
    restartPolicy: Always
    schedulerName: default-scheduler
    serviceAccountName: default
    terminationGracePeriodSeconds: 30
    tolerations:
    - effect: NoExecute
      key: node.kubernetes.io/not-ready
      operator: Exists
      tolerationSeconds: 300
    - effect: NoExecute
      key: node.kubernetes.io/unreachable
      operator: Exists
      tolerationSeconds: 300
    volumes:
    - name: kube-api-access-{suffix}
      projected:
        defaultMode: 420
        sources:
        - serviceAccountToken:
            expirationSeconds: 3607
            path: token
        - configMap:
            items:
            - key: ca.crt
              path: ca.crt
            name: kube-root-ca.crt
{status}"#,
            rv = 2_000_000 + index,
        );
    }
}

#[path = "common/process.rs"]
mod process;

/// Peak resident memory (MiB) of `tailor simulate` on `snapshot`; its wall time printed.
fn simulate_peak_mib(tailor: &Path, snapshot: &Path, scratch: &Path) -> f64 {
    let run = process::simulate(tailor, snapshot, &[], scratch);
    println!(
        "tailor simulate on {}: {:.2} s",
        snapshot.file_name().unwrap_or_default().to_string_lossy(),
        run.seconds
    );
    run.peak_mib
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let pods = if full { 20_000 } else { 500 };
    let tailor = PathBuf::from(env!("CARGO_BIN_EXE_tailor"));
    let scratch = tempfile::tempdir().expect("temporary directory");

    let small = scratch.path().join("small.yaml");
    let small_bytes = write_snapshot(&small, 200).expect("write the baseline snapshot");
    let large = scratch.path().join("large.yaml");
    let large_bytes = write_snapshot(&large, pods).expect("write the snapshot");
    // The same objects with a trailing empty document: the loader parses such a file as
    // whole documents instead of item by item.
    let whole = scratch.path().join("whole.yaml");
    let mut text = fs::read(&large).expect("read the snapshot back");
    text.extend_from_slice(b"---\n");
    fs::write(&whole, text).expect("write the whole-document variant");

    let base = simulate_peak_mib(&tailor, &small, scratch.path());
    let peak = simulate_peak_mib(&tailor, &large, scratch.path());
    let whole_peak = simulate_peak_mib(&tailor, &whole, scratch.path());
    let mb = |b: u64| b as f64 / 1e6;
    println!(
        "== peak RSS of `tailor simulate` ({} build) ==",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "optimised"
        }
    );
    println!(
        "baseline, 200 pods ({:.1} MB file):            {base:7.1} MiB",
        mb(small_bytes)
    );
    println!(
        "{pods} pods ({:.1} MB file), read item by item: {peak:7.1} MiB  ({:.2}x baseline, {:.1}x file size)",
        mb(large_bytes),
        peak / base,
        peak * 1.048_576 / mb(large_bytes),
    );
    println!(
        "{pods} pods, read as one whole document:      {whole_peak:7.1} MiB  ({:.2}x baseline, {:.2}x the item-by-item peak)",
        whole_peak / base,
        whole_peak / peak,
    );
    if full {
        println!(
            "target: <= {TARGET_MIB:.0} MiB for 20,000 pods: {} ({:.2}x target)",
            if peak <= TARGET_MIB { "met" } else { "NOT MET" },
            peak / TARGET_MIB
        );
    }
}
